"""Baselines MiVE is compared with (abstract): decoupled encoders with cross-attention fusion.

Variant E ("decoupled"): the instruction through its own text encoder (the T5 stand-in: learned word embeddings
+ position, trained with the DiT, never aligned to the image) and the reference through its own image encoder (the
SigLIP stand-in: a small CNN on 4x4 patches), the two token sets concatenated and fed to a cross-attention DiT.
The other baselines are settings of ``method.EditDiT``: last-layer-only / first-layer-only conditioning (one
selected layer) and first+last through cross-attention (``attention="cross"``).
"""

from __future__ import annotations

import torch
from torch import nn


class DecoupledEncoder(nn.Module):
    """Separate text and image encoders; output ``(B, L + N_patches, width)`` condition tokens."""

    def __init__(self, vocab_size: int, max_words: int, image_size: int, patch: int, width: int) -> None:
        super().__init__()
        self.words = nn.Embedding(vocab_size, width)
        self.word_position = nn.Parameter(torch.randn(1, max_words, width) * 0.02)
        self.text_mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))
        self.image = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.GELU(),
                                   nn.Conv2d(width, width, patch, stride=patch))
        grid = image_size // patch
        self.patch_position = nn.Parameter(torch.randn(1, grid * grid, width) * 0.02)

    def forward(self, reference: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """``reference`` ``(B, H, W, 3)`` in [0, 1], ``ids`` ``(B, L)``."""
        text = self.text_mlp(self.words(ids) + self.word_position[:, : ids.shape[1]])
        patches = self.image(reference.permute(0, 3, 1, 2)).flatten(2).transpose(1, 2) + self.patch_position
        return torch.cat([patches, text], dim=1)
