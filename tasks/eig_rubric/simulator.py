"""The simulated evaluation world of the cpu profile **[reconstructed test bed]** (no LLM runs offline here).

Items carry latent attributes z ~ N(0, I_D). The human score weighs ``n_relevant`` of the D dimensions:
s_h = the K-level quantile bin of w_h . z + N(0, human_noise_sd^2), w_h >= 0 with unit norm on the relevant
dimensions and 0 elsewhere. The question pool asks ``questions_per_dim`` yes/no questions per dimension, each with
a threshold tau_j and an answer noise sigma_j drawn from small grids, so the pool holds near-duplicates and
questions about irrelevant dimensions on purpose. The evaluator answers a_j = 1[z_{d_j} + eps > tau_j],
eps ~ N(0, sigma_j^2), fresh at every judging (the sampling temperature of an LLM judge).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.eig_rubric.config import WorldConfig


@dataclass(frozen=True)
class QuestionPool:
    """Question j asks whether attribute ``dims[j]`` exceeds ``thresholds[j]``; its answers carry noise
    ``noise_sd[j]``."""

    dims: np.ndarray
    thresholds: np.ndarray
    noise_sd: np.ndarray

    def __post_init__(self) -> None:
        if not (self.dims.shape == self.thresholds.shape == self.noise_sd.shape) or self.dims.ndim != 1:
            raise ValueError("a question pool needs equal-length 1-d dims, thresholds and noise_sd")

    @property
    def size(self) -> int:
        return int(self.dims.shape[0])

    def subset(self, indices: np.ndarray | list[int] | tuple[int, ...]) -> QuestionPool:
        idx = np.asarray(indices, dtype=np.int64)
        return QuestionPool(self.dims[idx], self.thresholds[idx], self.noise_sd[idx])


def make_pool(world: WorldConfig, rng: np.random.Generator) -> QuestionPool:
    """``questions_per_dim`` questions per dimension, tau and sigma drawn uniformly from their grids."""
    total = world.n_dims * world.questions_per_dim
    dims = np.repeat(np.arange(world.n_dims), world.questions_per_dim)
    thresholds = rng.choice(np.asarray(world.thresholds, dtype=np.float64), size=total)
    noise_sd = rng.choice(np.asarray(world.noise_levels, dtype=np.float64), size=total)
    return QuestionPool(dims, thresholds, noise_sd)


def human_weights(world: WorldConfig, rng: np.random.Generator) -> np.ndarray:
    """w_h: |N(0, 1)| weights on ``n_relevant`` random dimensions, unit norm; 0 on the others."""
    relevant = rng.choice(world.n_dims, size=world.n_relevant, replace=False)
    weights = np.zeros(world.n_dims)
    weights[relevant] = np.abs(rng.standard_normal(world.n_relevant)) + 0.1  # no dimension weighs ~0
    return weights / np.linalg.norm(weights)


def quantile_levels(raw: np.ndarray, n_levels: int) -> np.ndarray:
    """Level floor(rank * K / n) of each value (rank 0 = smallest; ties broken by position): K equal bins."""
    raw = np.asarray(raw)
    ranks = np.empty(raw.shape[0], dtype=np.int64)
    ranks[np.argsort(raw, kind="stable")] = np.arange(raw.shape[0])
    return (ranks * n_levels) // raw.shape[0]


def calibrated_levels(raw: np.ndarray, n_calibration: int, n_levels: int) -> np.ndarray:
    """K levels of every item from cut-points fitted on the calibration items [0, n_calibration) only: the
    (g / K)-quantiles g = 1..K-1 of their raw scores (linear interpolation); level = number of cut-points <= raw.
    The calibration items fall in K equal bins; the evaluation items' raw scores never move a cut-point."""
    raw = np.asarray(raw, dtype=np.float64)
    cuts = np.quantile(raw[:n_calibration], np.arange(1, n_levels) / n_levels)
    return np.searchsorted(cuts, raw, side="right").astype(np.int64)


def make_items(world: WorldConfig, weights: np.ndarray, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """z (n, D), the human raw score w_h . z + noise, and its K levels (cut-points from the calibration items)."""
    z = rng.standard_normal((world.n_items, world.n_dims))
    raw = z @ weights + world.human_noise_sd * rng.standard_normal(world.n_items)
    return z, raw, calibrated_levels(raw, world.n_calibration, world.n_levels)


def answer(z: np.ndarray, pool: QuestionPool, rng: np.random.Generator) -> np.ndarray:
    """One judging's answers (n, Q): a_j = 1[z_{d_j} + eps > tau_j], eps ~ N(0, sigma_j^2) drawn afresh."""
    noise = rng.standard_normal((z.shape[0], pool.size)) * pool.noise_sd[None, :]
    return (z[:, pool.dims] + noise > pool.thresholds[None, :]).astype(np.int8)
