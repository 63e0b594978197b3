"""Learning-rate schedules shared by every paper's training loops."""

from __future__ import annotations

import math

import torch


def warmup_cosine_factor(step: int, total_steps: int, warmup_steps: int) -> float:
    """Multiplier of the base learning rate at ``step`` (0-based): linear warm-up over
    ``warmup_steps`` ((step + 1) / warmup), times a cosine decay 0.5 (1 + cos(pi step / total))
    from 1 at step 0 towards 0 at ``total_steps`` (Loshchilov & Hutter 2017, SGDR, without restarts)."""
    warm = min(1.0, (step + 1) / max(1, warmup_steps))
    return warm * 0.5 * (1.0 + math.cos(math.pi * step / max(1, total_steps)))


def warmup_cosine(optimizer: torch.optim.Optimizer, total_steps: int, warmup_steps: int | None = None
                  ) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` with ``warmup_cosine_factor``; the warm-up defaults to 5% of the steps (at least 1)."""
    warmup = max(1, total_steps // 20) if warmup_steps is None else warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: warmup_cosine_factor(s, total_steps, warmup))
