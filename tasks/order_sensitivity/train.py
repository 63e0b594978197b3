"""Training step of order_sensitivity: the tiny GPT-2 (``model.py``) learns the label token of the procedural
evidence/claim items, one checkpoint per seed (``models/order_sensitivity/seed<N>/chunk_gpt2.safetensors``).
The paper profile scores a pretrained hub model and trains nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch.nn import functional as F

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.schedules import warmup_cosine
from tasks.order_sensitivity import data
from tasks.order_sensitivity.config import OrderSensitivityConfig, TinyModelConfig
from tasks.order_sensitivity.model import build_model, label_logit_gap, save_model


@dataclass(frozen=True)
class TrainingPool:
    """Training sequences grouped by chunk count (a batch never mixes lengths: no padding)."""

    ids: dict[int, torch.Tensor]
    targets: dict[int, torch.Tensor]


def training_pool(frame: pl.DataFrame, vocab: data.Vocabulary) -> TrainingPool:
    ids, targets = {}, {}
    for (n,), group in frame.group_by(["n_chunks"], maintain_order=True):
        items = data.item_arrays(group, vocab)
        chunks = data.mask_all_values(items, vocab, where=items.masked)
        ids[int(n)] = torch.as_tensor(data.render_ids(chunks, items.claim_tokens))
        targets[int(n)] = torch.tensor(items.target, dtype=torch.float32)
    return TrainingPool(ids, targets)


def curriculum_batch(pool: TrainingPool, cfg: TinyModelConfig, step: int, rng: np.random.Generator
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch of a single chunk count. Curriculum: the largest chunk count grows linearly over the first
    ``curriculum_fraction`` of training; short items teach the value comparison before attention must find
    the relevant chunk."""
    counts = sorted(pool.ids)
    ramp = max(1, int(cfg.curriculum_fraction * cfg.steps))
    cap = counts[0] + (counts[-1] - counts[0]) * min(1.0, (step + 1) / ramp)
    allowed = [c for c in counts if c <= cap]
    n = allowed[int(rng.integers(len(allowed)))]
    index = torch.as_tensor(rng.integers(len(pool.targets[n]), size=cfg.batch_size))
    return pool.ids[n][index], pool.targets[n][index]


def train_model(model: torch.nn.Module, pool: TrainingPool, cfg: TinyModelConfig, seed: int,
                progress: Progress = no_progress) -> list[float]:
    """AdamW on the label token's binary cross-entropy, warm-up then cosine decay
    (``tasks.common.schedules.warmup_cosine``, 5% warm-up), gradients clipped at norm 1. Returns the loss
    per step; batches are drawn from ``numpy`` generator (seed, 4242)."""
    rng = np.random.default_rng([seed, 4_242])
    optimiser = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    schedule = warmup_cosine(optimiser, cfg.steps)
    every = max(1, cfg.steps // 10)
    model.train()
    losses = []
    for step in range(cfg.steps):
        ids, targets = curriculum_batch(pool, cfg, step, rng)
        loss = F.binary_cross_entropy_with_logits(label_logit_gap(model, ids), targets)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if (step + 1) % every == 0:
            progress((step + 1) / cfg.steps, f"step {step + 1}/{cfg.steps}, loss {np.mean(losses[-every:]):.3f}")
    model.eval()
    return losses


def train(cfg: OrderSensitivityConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    """Train the seed's tiny GPT-2 on its training split and write it to ``model_dir`` (the seed's folder).

    The items are read and validated against the config first, so stale or missing data fail with the key
    named before any compute. The model is small enough that it trains on CPU whatever ``device`` is
    (``evaluate`` scores on ``device``)."""
    result = SeedResult(seed)
    if cfg.hub is not None:  # paper profile: a pretrained hub model, nothing to train
        return result
    frame = data.read_procedural(cfg.data, Path(data_dir), seed)
    pool = training_pool(frame.filter(pl.col("split") == "train"), data.vocabulary(cfg.data))
    model = build_model(cfg.model, cfg.data, seed)
    with result.stage("train"):
        losses = train_model(model, pool, cfg.model, seed, progress)
    save_model(model, model_dir)
    progress(1.0, f"trained {cfg.model.steps} steps, final loss {losses[-1]:.3f}")
    return result.add(train_loss_final=float(np.mean(losses[-max(1, len(losses) // 20):])),
                      curves={"train_loss": losses})
