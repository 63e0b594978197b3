"""token_merging's training schedule: the warm-up length rule (unset = the committed runs' total // 20) and the
clear error on a bad ``train.warmup_fraction``."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from tasks.token_merging import method, train
from tasks.token_merging.config import TrainConfig


def test_warmup_steps_default_is_the_committed_rule():
    assert train.warmup_steps(300, None) == 15
    assert train.warmup_steps(19, None) == 1  # never zero
    assert train.warmup_steps(899, None) == 44


def test_warmup_steps_fraction():
    assert train.warmup_steps(300, 0.1) == 30
    assert train.warmup_steps(899, 0.2) == 180  # 179.8 rounds up
    assert train.warmup_steps(4, 0.1) == 1


def test_lr_factor_peaks_at_the_end_of_warmup():
    total, warmup = 300, train.warmup_steps(300, 0.1)
    assert train.lr_factor(0, total, warmup) == pytest.approx(1 / 30)
    assert train.lr_factor(29, total, warmup) == pytest.approx(0.5 * (1 + math.cos(math.pi * 29 / 300)))
    assert train.lr_factor(28, total, warmup) == pytest.approx(29 / 30)


def _warmups_seen_by_train_vit(monkeypatch) -> list[int]:
    """Trains a 2-block ViT for 4 steps with warmup_fraction 0.5 and returns the warm-up lengths it used."""
    seen: list[int] = []
    real = train.lr_factor
    monkeypatch.setattr(train, "lr_factor",
                        lambda step, total, warmup: seen.append(warmup) or real(step, total, warmup))
    model = method.MergeViT(method.ViTShape(image_size=4, patch_size=2, channels=1, dim=8, depth=2, heads=1,
                                            mlp_dim=8, n_classes=10))
    cfg = TrainConfig(epochs=1, batch_size=2, lr=1e-3, warmup_fraction=0.5, max_shift=0)
    train.train_vit(model, cfg, torch.zeros(8, 1, 4, 4), torch.arange(8) % 10, seed=0)
    return seen


def test_train_vit_uses_the_configured_warmup(monkeypatch):
    assert set(_warmups_seen_by_train_vit(monkeypatch)) == {2}  # 4 steps * 0.5


def test_negative_control_warmup_rule_ignoring_the_fraction_is_caught(monkeypatch):
    monkeypatch.setattr(train, "warmup_steps", lambda total, fraction: max(1, total // 20))
    assert set(_warmups_seen_by_train_vit(monkeypatch)) != {2}


@pytest.mark.parametrize("bad", [0.0, 0.7, -0.1])
def test_bad_warmup_fraction_names_the_key(bad):
    with pytest.raises(ValidationError, match="warmup_fraction"):
        TrainConfig(epochs=1, batch_size=2, lr=1e-3, warmup_fraction=bad)
