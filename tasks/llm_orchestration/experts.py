"""The modality experts of the cpu profile, each trained alone on unimodal labels, and the text they emit.

- vision: the CNN encoder of ``tasks.common.tiny_vlm`` (4 x 4 patches, pooled to one token per 8 x 8 cell), heads
  for shape (or empty) and colour; emits ``"image objects: red circle; blue square"`` (cells in row order);
- video: the same frame encoder on the first and last frames; shape and colour from the first frame's tokens
  (max-pooled), direction from the token-wise difference last - first; emits ``"video motion: red circle moving left"``;
- ASR: magnitude spectrum of each 60 ms frame -> MLP -> word; emits the transcript.

The joint baseline (baselines.py) starts from these trained experts' encoders (frozen) and trains only its fusion
transformer on paired answers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from tasks.common.seeding import torch_init_seed
from tasks.common.tiny_vlm import CNNEncoder, TinyVLMConfig
from tasks.llm_orchestration.method import COLOURS, DIRECTIONS, SHAPES
from tasks.llm_orchestration.world import CELL, EMPTY, IMAGE_SIZE, WORD_SAMPLES

SHAPE_OR_EMPTY = (EMPTY, *SHAPES)
SPECTRUM_BINS = WORD_SAMPLES // 2 + 1


def vision_encoder(width: int) -> CNNEncoder:
    return CNNEncoder(TinyVLMConfig(vocab_size=2, image_size=IMAGE_SIZE, channels=3, patch_size=4,
                                    encoder_kind="cnn", encoder_width=width, encoder_depth=2))


def cell_tokens(encoder: CNNEncoder, images: torch.Tensor) -> torch.Tensor:
    """(B, 4, D): the encoder's 4 x 4 token grid average-pooled over each 8 x 8 cell, cells in row order."""
    tokens = encoder(images)[0]
    b, n, d = tokens.shape
    side = IMAGE_SIZE // 4
    grid = tokens.transpose(1, 2).reshape(b, d, side, side)
    pooled = torch.nn.functional.avg_pool2d(grid, CELL // 4)
    return pooled.flatten(2).transpose(1, 2)


def video_tokens(encoder: CNNEncoder, videos: torch.Tensor) -> torch.Tensor:
    """(B, 32, D): the frame encoder's 16 tokens of the first frame, then the 16 token-wise differences between
    the last and the first frame (what moved where). Only the first and last frames are encoded."""
    ends = torch.stack([videos[:, 0], videos[:, -1]], dim=1)
    tokens = encoder(ends.flatten(0, 1))[0].unflatten(0, (videos.shape[0], 2))
    return torch.cat([tokens[:, 0], tokens[:, 1] - tokens[:, 0]], dim=1)


def motion_tokens(encoder: CNNEncoder, videos: torch.Tensor) -> torch.Tensor:
    """(B, 17, D): what the video expert's heads read: the appearance token (the first frame's 16 tokens
    max-pooled; the sprite covers a few of them), then the 16 last-minus-first difference tokens (what moved)."""
    tokens = video_tokens(encoder, videos)
    return torch.cat([tokens[:, :16].amax(dim=1, keepdim=True), tokens[:, 16:]], dim=1)


class AudioFrameEncoder(nn.Module):
    """Spectrum of one word frame -> ``width`` features."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(SPECTRUM_BINS, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, spectra: torch.Tensor) -> torch.Tensor:
        return self.net(spectra)


class VisionExpert(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.encoder = vision_encoder(width)
        self.shape_head = nn.Linear(width, len(SHAPE_OR_EMPTY))
        self.colour_head = nn.Linear(width, len(COLOURS))

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = cell_tokens(self.encoder, images)  # (B, 4, D): one token per cell
        return self.shape_head(tokens), self.colour_head(tokens)


class VideoExpert(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.encoder = vision_encoder(width)
        self.direction = nn.Linear(16 * width, len(DIRECTIONS))
        self.colour = nn.Linear(width, len(COLOURS))

    def forward(self, videos: torch.Tensor) -> dict[str, torch.Tensor]:
        tokens = motion_tokens(self.encoder, videos)
        return {"colour": self.colour(tokens[:, 0]), "direction": self.direction(tokens[:, 1:].flatten(1))}


class ASRExpert(nn.Module):
    def __init__(self, width: int, vocab_size: int) -> None:
        super().__init__()
        self.frame = AudioFrameEncoder(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, spectra: torch.Tensor) -> torch.Tensor:
        return self.head(torch.nn.functional.gelu(self.frame(spectra)))


def build_expert(kind: str, width: int, seed: int, vocab_size: int = 0) -> nn.Module:
    with torch_init_seed(seed):
        if kind == "vision":
            return VisionExpert(width)
        if kind == "video":
            return VideoExpert(width)
        if kind == "asr":
            return ASRExpert(width, vocab_size)
    raise ValueError(f"unknown expert {kind!r}")


# --- labels ----------------------------------------------------------------------------------------------


def cell_labels(cells: list[str]) -> tuple[list[int], list[int]]:
    """Per cell: shape index (0 = empty) and colour index (0 for an empty cell; its loss is masked)."""
    shapes, colours = [], []
    for cell in cells:
        if cell == EMPTY:
            shapes.append(0)
            colours.append(0)
        else:
            colour, shape = cell.split()
            shapes.append(SHAPE_OR_EMPTY.index(shape))
            colours.append(COLOURS.index(colour))
    return shapes, colours


def vision_loss(model: VisionExpert, images: torch.Tensor, shapes: torch.Tensor, colours: torch.Tensor
                ) -> torch.Tensor:
    shape_logits, colour_logits = model(images)
    occupied = shapes > 0
    loss = nn.functional.cross_entropy(shape_logits.flatten(0, 1), shapes.flatten())
    if bool(occupied.any()):
        loss = loss + nn.functional.cross_entropy(colour_logits[occupied], colours[occupied])
    return loss


def video_loss(model: VideoExpert, videos: torch.Tensor, labels: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(videos)
    return sum(nn.functional.cross_entropy(logits[k], labels[k]) for k in logits)


def asr_loss(model: ASRExpert, spectra: torch.Tensor, word_ids: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(spectra), word_ids)


def fit(model: nn.Module, loss_of_batch: Callable[[torch.Tensor], torch.Tensor], n: int, epochs: int,
        batch_size: int, lr: float, seed: int, after_epoch: Callable[[int], None] | None = None) -> list[float]:
    """Adam over ``epochs`` shuffled passes of ``n`` examples; ``loss_of_batch(indices)``; per-epoch mean loss.
    ``after_epoch(e)`` runs after pass e (1-based), e.g. to keep an early snapshot of the same run."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    curve = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        total = 0.0
        for start in range(0, n, batch_size):
            loss = loss_of_batch(order[start:start + batch_size])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * min(batch_size, n - start)
        curve.append(total / n)
        if after_epoch is not None:
            after_epoch(len(curve))
    model.eval()
    return curve


# --- text the experts emit -----------------------------------------------------------------------------


@torch.no_grad()
def describe_images(model: VisionExpert, images: torch.Tensor) -> list[str]:
    """``"image objects: red circle; blue square"`` per image, cells in row order (empty cells omitted)."""
    shape_logits, colour_logits = model(images)
    shapes, colours = shape_logits.argmax(-1).tolist(), colour_logits.argmax(-1).tolist()
    out = []
    for row_shapes, row_colours in zip(shapes, colours, strict=True):
        parts = [f"{COLOURS[c]} {SHAPE_OR_EMPTY[s]}" for s, c in zip(row_shapes, row_colours, strict=True) if s > 0]
        out.append("image objects: " + "; ".join(parts))
    return out


@torch.no_grad()
def describe_videos(model: VideoExpert, videos: torch.Tensor) -> list[str]:
    logits = model(videos)
    d, c = (logits[k].argmax(-1).tolist() for k in ("direction", "colour"))
    return [f"video motion: {COLOURS[ci]} object moving {DIRECTIONS[di]}" for di, ci in zip(d, c, strict=True)]


@torch.no_grad()
def transcribe(model: ASRExpert, spectra: torch.Tensor, vocab: list[str]) -> str:
    return " ".join(vocab[i] for i in model(spectra).argmax(-1).tolist())


def scene_text(cells: list[str]) -> str:
    """The exact description a perfect vision expert would emit."""
    return "image objects: " + "; ".join(c for c in cells if c != EMPTY)


def motion_text(colour: str, direction: str) -> str:
    return f"video motion: {colour} object moving {direction}"


def as_tensor(arrays: list[np.ndarray]) -> torch.Tensor:
    return torch.from_numpy(np.stack(arrays))
