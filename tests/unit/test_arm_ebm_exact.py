"""arm_ebm method: exact values on non-degenerate inputs found missing by `make mutation SLUG=arm_ebm`,
each with a negative control that monkeypatches a broken variant into `method`."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.arm_ebm import method

# Two rows, two positions, three tokens; zeros in the laws (0 log 0 = 0) and unequal entropies.
TARGETS = np.array([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],
                    [[1.0, 0.0, 0.0], [0.0, 0.25, 0.75]]])


def entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def target_entropy_check() -> bool:
    want = (entropy([0.5, 0.5]) + entropy([0.2, 0.3, 0.5]) + 0.0 + entropy([0.25, 0.75])) / 2
    got = method.mean_target_entropy(TARGETS)
    return math.isfinite(got) and abs(got - want) < 1e-12


def test_mean_target_entropy_exact_with_zero_probabilities():
    assert target_entropy_check()


def test_negative_control_entropy_without_the_zero_convention_fails(monkeypatch):
    def naive(targets):
        with np.errstate(divide="ignore", invalid="ignore"):
            return float((-targets * np.log(targets)).sum(axis=(1, 2)).mean())

    monkeypatch.setattr(method, "mean_target_entropy", naive)
    assert not target_entropy_check()


def test_population_cross_entropy_exact_and_weighted():
    logits = torch.tensor([[[0.2, -0.1, 0.5, 9.0], [1.0, 0.0, -1.0, 9.0]],
                           [[0.3, 0.3, 0.0, 9.0], [-0.5, 0.4, 0.1, 9.0]]], dtype=torch.float64)
    targets = torch.tensor(TARGETS)
    rows = []
    for i in range(2):
        total = 0.0
        for t in range(2):
            z = logits[i, t, :3].tolist()
            log_norm = math.log(sum(math.exp(v) for v in z))
            total -= sum(p * (v - log_norm) for p, v in zip(TARGETS[i, t], z))
        rows.append(total)
    got = method.population_cross_entropy(logits, targets, vocab_size=3)
    assert float(got) == pytest.approx(sum(rows) / 2, abs=1e-12)  # the padded 4th logit is cut away
    weighted = method.population_cross_entropy(logits, targets, 3, torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert float(weighted) == pytest.approx(0.25 * rows[0] + 0.75 * rows[1], abs=1e-12)
