"""Training step of token_merging: the small digits ViT trained from scratch per seed (smoke / cpu), saved
as ``vit.safetensors`` in ``models/token_merging/seed<N>/``. Merging is training-free, so the paper
profile (a pretrained hub checkpoint, ``hub.py``) trains nothing and writes nothing."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
from torch.nn import functional as F

from tasks.common.io import save_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.token_merging import data, method
from tasks.token_merging.config import TokenMergingConfig, TrainConfig
from tasks.token_merging.model import CHECKPOINT, build_vit


def lr_factor(step: int, total: int, warmup: int) -> float:
    """min(linear warm-up, cosine decay): not ``tasks.common.schedules.warmup_cosine``, which multiplies the
    two; kept so that the trained weights (and every metric) stay those of the committed runs."""
    return min((step + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, step / total))))


def warmup_steps(total: int, fraction: float | None) -> int:
    """Length of the linear warm-up: ``fraction`` of the ``total`` optimiser steps (rounded, at least 1); unset,
    ``total // 20``, the rule of the committed runs (so their weights stay bit-identical)."""
    return max(1, total // 20 if fraction is None else round(total * fraction))


EpochImages = Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]


def train_vit(model: method.MergeViT, train: TrainConfig, images: torch.Tensor, labels: torch.Tensor, seed: int,
              progress: Progress = no_progress, compose: EpochImages | None = None) -> list[float]:
    """AdamW with a linear warm-up and cosine decay, +-shift augmentation; returns the per-epoch mean loss.
    ``compose`` (scenes) draws a fresh training set at the start of every epoch from the seed's generator
    (``images`` / ``labels`` then only give the size); without it the generator's draws are unchanged."""
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    total = train.epochs * math.ceil(len(labels) / train.batch_size)
    warmup = warmup_steps(total, train.warmup_fraction)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: lr_factor(step, total, warmup))
    model.train()
    losses = []
    for epoch in range(train.epochs):
        if compose is not None:
            images, labels = compose(generator)
        order = torch.randperm(len(labels), generator=generator)
        epoch_loss = 0.0
        for start in range(0, len(labels), train.batch_size):
            batch = order[start:start + train.batch_size]
            inputs = data.random_shift(images[batch], train.max_shift, generator)
            logits = model.forward_fused(inputs) if train.fused_attention else model(inputs)
            loss = F.cross_entropy(logits, labels[batch])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            epoch_loss += float(loss.detach()) * len(batch)
        losses.append(epoch_loss / len(labels))
        progress((epoch + 1) / train.epochs, f"seed {seed}: epoch {epoch + 1}/{train.epochs}, loss {losses[-1]:.3f}")
    model.eval()
    return losses


def train(cfg: TokenMergingConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    """Digits: reads and checks the data first (bad data fails before any compute), trains on the CPU
    (``device`` is used by the paper profile's evaluation only) and saves the checkpoint; returns the
    per-epoch training loss. Paper profile: nothing to train."""
    result = SeedResult(seed)
    if cfg.hub is not None:
        return result
    images, labels = data.read_digits_tensors(cfg.data, data_dir)["train"]
    compose = None
    if cfg.data.texture is not None:
        texture = cfg.data.texture
        glyphs, digit_labels = data.digits_tensors(data.read_digits(cfg.data, data_dir)["train"],
                                                   cfg.data.image_size // texture.cell)
        compose = partial(data.texture_digits, glyphs, digit_labels, texture, shift=texture.max_shift)
    elif cfg.data.scene is not None:
        glyphs, digit_labels = data.digits_tensors(data.read_digits(cfg.data, data_dir)["train"], 8)
        compose = partial(data.compose_scenes, glyphs, digit_labels, cfg.data.scene, cfg.data.image_size)
    model = build_vit(cfg.vit, cfg.data, seed)
    with result.stage("train"):
        losses = train_vit(model, cfg.train, images, labels, seed, progress, compose)
    save_state_dict(model, Path(model_dir) / CHECKPOINT)
    return result.add(curves={"train_loss": losses})
