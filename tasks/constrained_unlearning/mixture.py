"""Isotropic Gaussian mixtures: the toy "pretrained distribution" q and the forget distribution q_u.

Densities, samples, and the density of the DDPM-noised mixture x_t = sqrt(abar) x_0 + sqrt(1 - abar) e,
which is again a Gaussian mixture (means scaled by sqrt(abar), variance abar sigma^2 + 1 - abar). Both
numpy (grids, importance weights) and torch (score targets in training) entry points are given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class GaussianMixture:
    """sum_k weights[k] N(means[k], sigma^2 I) in dimension ``means.shape[1]``."""

    means: np.ndarray  # (K, d)
    weights: np.ndarray  # (K,), sums to 1
    sigma: float

    def __post_init__(self) -> None:
        if self.means.ndim != 2 or self.weights.shape != (self.means.shape[0],):
            raise ValueError(f"means must be (K, d) and weights (K,), got {self.means.shape}, {self.weights.shape}")
        if self.sigma <= 0 or np.any(self.weights < 0) or not math.isclose(float(self.weights.sum()), 1.0,
                                                                           rel_tol=1e-9):
            raise ValueError("sigma must be > 0 and weights a probability vector")

    @property
    def dim(self) -> int:
        return int(self.means.shape[1])

    def component_log_densities(self, x: np.ndarray) -> np.ndarray:
        """(n, K): log N(x; means[k], sigma^2 I) for every point and component."""
        sq = ((x[:, None, :] - self.means[None, :, :]) ** 2).sum(-1)
        return -sq / (2 * self.sigma**2) - self.dim * math.log(self.sigma * math.sqrt(2 * math.pi))

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """log q(x) for points x of shape (n, d), computed stably (no underflow far from the modes)."""
        with np.errstate(divide="ignore"):
            terms = self.component_log_densities(x) + np.log(self.weights)[None, :]
        peak = terms.max(axis=1, keepdims=True)
        return (peak + np.log(np.exp(terms - peak).sum(axis=1, keepdims=True)))[:, 0]

    def density(self, x: np.ndarray) -> np.ndarray:
        return np.exp(self.log_density(x))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        components = rng.choice(len(self.weights), size=n, p=self.weights)
        return self.means[components] + self.sigma * rng.standard_normal((n, self.dim))

    def noised_score_torch(self, x_t: torch.Tensor, alpha_bar: torch.Tensor) -> torch.Tensor:
        """grad_x log q_t(x_t) of the noised mixture; ``alpha_bar`` has one entry per row of ``x_t``."""
        means = torch.as_tensor(self.means, dtype=x_t.dtype)
        weights = torch.as_tensor(self.weights, dtype=x_t.dtype)
        scale = alpha_bar.sqrt()[:, None, None]
        var = (alpha_bar * self.sigma**2 + 1 - alpha_bar)[:, None]  # (n, 1)
        diff = x_t[:, None, :] - scale * means[None]  # (n, K, d)
        logits = -(diff**2).sum(-1) / (2 * var) + torch.log(weights.clamp_min(1e-300))[None]
        responsibilities = torch.softmax(logits, dim=1)  # (n, K); the shared normaliser cancels
        return -(responsibilities[:, :, None] * diff).sum(1) / var


def single_gaussian(mean: np.ndarray, sigma: float) -> GaussianMixture:
    return GaussianMixture(np.asarray(mean, dtype=np.float64)[None, :], np.ones(1), sigma)
