"""Baselines the ISR gate is compared with (README, "Method summary"; claim C7).

- the ungated model: answers every item with its single fixed (identity) order label;
- a confidence-threshold gate: abstains on the least confident items, at the same abstention rate as the
  ISR gate, so the two are compared at equal coverage.
"""

from __future__ import annotations

import numpy as np


def abstain_lowest(score: np.ndarray, abstention: float) -> np.ndarray:
    """Answer mask that abstains on the round(abstention * N) items with the lowest score (stable ties)."""
    if not 0.0 <= abstention <= 1.0:
        raise ValueError(f"abstention must lie in [0, 1], got {abstention}")
    score = np.asarray(score, dtype=float)
    n_abstain = int(round(abstention * score.size))
    answer = np.ones(score.size, dtype=bool)
    answer[np.argsort(score, kind="stable")[:n_abstain]] = False
    return answer


def confidence_gate(q_mixture: np.ndarray, abstention: float) -> np.ndarray:
    """Confidence max(q, 1 - q) of the mixture's label; abstain on the least confident fraction."""
    q = np.asarray(q_mixture, dtype=float)
    return abstain_lowest(np.maximum(q, 1.0 - q), abstention)


def ungated(n_items: int) -> np.ndarray:
    """The ungated model answers everything."""
    return np.ones(n_items, dtype=bool)
