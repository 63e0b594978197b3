"""Teachers and baselines of radio1d.

Teachers (toy stand-ins for the foundation models of the C-RADIOv4 recipe, trained from scratch on different
objectives, then frozen):
- ``SummaryTeacher`` (SigLIP2's role: a global summary): a CNN trained for multi-label digit presence; its
  features are global-average-pooled, hence blind to where a digit is.
- ``DenseTeacher`` (DINOv3's role: dense features): a CNN trained to name the digit (or 'empty') in each
  quadrant; its feature map is 8x8 and keeps layout.

Baselines of the student:
- fixed-k students: ``method.Radio1D`` trained with the ``fixed`` sampler (k = 16 is B1 of the design,
  truncated at test time; smaller fixed k are per-k specialists, the strongest baseline at their own k);
- ``PlainViT`` (B2): a 2D ViT distilled with the same losses on its cls and patch tokens; k tokens at test time
  are the 8x8 grid average-pooled to k cells.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tasks.common.tiny_vlm import _ViTBlock as ViTBlock
from tasks.common.tiny_vlm import sincos_2d
from tasks.radio1d.method import mlp_adaptor

POOL_SHAPES = {1: (1, 1), 2: (1, 2), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8)}


class SummaryTeacher(nn.Module):
    """CNN -> global average pool -> MLP layer -> ``dim`` features -> presence logits (10)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        # receptive field 10 pixels: one unit sees a whole 8x8 digit, so the pooled features can name it
        self.body = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.GELU(), nn.Conv2d(16, 32, 3, stride=2, padding=1),
                                  nn.GELU(), nn.Conv2d(32, dim, 3, padding=1), nn.GELU())
        self.pooled_mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU())
        self.head = nn.Linear(dim, 10)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """Penultimate features: an MLP layer after the global average pool (a non-linear scene summary)."""
        return self.pooled_mlp(self.body(images).mean(dim=(2, 3)))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


class DenseTeacher(nn.Module):
    """CNN at stride 2 -> ``(B, 64, dim)`` map on the 8x8 grid -> per-quadrant digit-or-empty logits (4 x 11)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, dim, 4, stride=2, padding=1), nn.GELU(),
                                  nn.Conv2d(dim, dim, 3, padding=1), nn.GELU())
        self.head = nn.Linear(dim, 11)

    def feature_map(self, images: torch.Tensor) -> torch.Tensor:
        return self.body(images)

    def features(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 64, dim)`` row-major over the 8x8 grid."""
        return self.feature_map(images).flatten(2).transpose(1, 2)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 4, 11)``: quadrant q = 2 * row + col, from its 4x4 cell of the map."""
        pooled = F.adaptive_avg_pool2d(self.feature_map(images), 2)  # (B, dim, 2, 2)
        return self.head(pooled.flatten(2).transpose(1, 2))


class PlainViT(nn.Module):
    """B2: a 2D ViT (cls + 8x8 patch tokens) distilled on its cls (summary) and patch tokens (dense)."""

    def __init__(self, image_size: int, patch_size: int, width: int, heads: int, depth: int, summary_dim: int,
                 dense_dim: int) -> None:
        super().__init__()
        self.grid = image_size // patch_size
        self.patchify = nn.Conv2d(1, width, patch_size, stride=patch_size)
        self.position = nn.Parameter(sincos_2d(self.grid, width)[None])
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, width))
        self.blocks = nn.ModuleList(ViTBlock(width, heads, 0.0) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.adaptor_summary = mlp_adaptor(width, summary_dim)
        self.adaptor_dense = mlp_adaptor(width, dense_dim)

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cls ``(B, C)`` and patch tokens ``(B, grid^2, C)`` after the final norm."""
        x = self.patchify(images).flatten(2).transpose(1, 2) + self.position
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        for block in self.blocks:
            x = block(x)
        x = self.norm(x)
        return x[:, 0], x[:, 1:]

    def pooled_tokens(self, images: torch.Tensor, k: int) -> torch.Tensor:
        """The patch grid average-pooled to k cells ``(B, k, C)`` (row-major): B2's k-token representation."""
        return pool_grid(self.encode(images)[1], self.grid, k)

    def reconstruct(self, images: torch.Tensor, k: int) -> torch.Tensor:
        """Dense prediction from k pooled tokens: each cell's token copied over its grid cells, then the adaptor."""
        pooled = self.pooled_tokens(images, k)
        rows, cols = POOL_SHAPES[k]
        grid = pooled.transpose(1, 2).reshape(len(pooled), -1, rows, cols)
        up = F.interpolate(grid, size=(self.grid, self.grid), mode="nearest").flatten(2).transpose(1, 2)
        return self.adaptor_dense(up)

    def forward(self, images: torch.Tensor, num_tokens: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        cls, tokens = self.encode(images)
        return self.adaptor_summary(cls), self.adaptor_dense(tokens)


def pool_grid(tokens: torch.Tensor, grid: int, k: int) -> torch.Tensor:
    """``(B, grid^2, C)`` -> ``(B, k, C)``: average over the ``POOL_SHAPES[k]`` cells of the grid, row-major."""
    if k not in POOL_SHAPES:
        raise ValueError(f"k = {k} has no pooling shape; choose one of {sorted(POOL_SHAPES)}")
    rows, cols = POOL_SHAPES[k]
    grid_map = tokens.transpose(1, 2).reshape(len(tokens), -1, grid, grid)
    return F.adaptive_avg_pool2d(grid_map, (rows, cols)).flatten(2).transpose(1, 2)
