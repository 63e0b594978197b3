"""Certificate-Guided Pruning (CGP) for noisy Lipschitz maximisation on the unit cube.

Shihab, Akter & Sharma, *Certificate-Guided Pruning for Stochastic Lipschitz Optimization*, ICML 2026
(arXiv 2601.20231). The paper's method section was not available: every formula below is
**[reconstructed]** from the abstract (README.md, "Fidelity checklist" and "Method summary"). The
docstrings number the pieces of the reconstruction as items: 1 confidence radius, 2 envelopes, 3 monotone
active set, 4 gap, recommendation and stopping rule, 5 query rule, 7 CGP-Adaptive, 8 CGP-TR, 9 CGP-Hybrid.

All optimisers work on [0, 1]^d with the Euclidean metric and **maximise**; ``maximize``/``minimize``
map a box onto the cube. The library is pure numpy/scipy (scikit-learn only for CGP-Hybrid's GP).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy.stats import qmc

# ------------------------------------------------------------------------------------------------
# Formulas (items 1, 2, 4, 7)
# ------------------------------------------------------------------------------------------------


def confidence_radius(counts: np.ndarray, n_distinct: int, noise_sd: float, delta: float) -> np.ndarray:
    """Item 1, anytime radius c_i = sigma * sqrt(2 log(4 m_t n_i^2 / delta) / n_i).

    ``m_t`` (distinct points) and ``n_i^2`` inside the log pay for a union bound over points and over
    time, so the bound |mu_hat_i - f(x_i)| <= c_i holds for all i and t with probability >= 1 - delta.
    """
    counts = np.asarray(counts, dtype=float)
    if np.any(counts < 1):
        raise ValueError("confidence_radius: every count must be >= 1")
    return noise_sd * np.sqrt(2.0 * np.log(4.0 * n_distinct * counts**2 / delta) / counts)


def pairwise_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distances, shape (len(a), len(b))."""
    diff = np.asarray(a, dtype=float)[:, None, :] - np.asarray(b, dtype=float)[None, :, :]
    return np.sqrt(np.einsum("ijk,ijk->ij", diff, diff))


def upper_envelope(distances: np.ndarray, optimistic_values: np.ndarray, lipschitz: float) -> np.ndarray:
    """Item 2, U_t(x) = min_i [mu_hat_i + c_i + L d(x, x_i)] from the (points, samples) distance matrix.

    ``optimistic_values`` is mu_hat + c. With no samples U is +inf everywhere (nothing is certified)."""
    if distances.shape[1] == 0:
        return np.full(distances.shape[0], np.inf)
    return np.min(optimistic_values[None, :] + lipschitz * distances, axis=1)


def lower_certificate(means: np.ndarray, radii: np.ndarray) -> float:
    """Item 2, l_t = max_i (mu_hat_i - c_i): on the good event f* >= f(x_i) >= l_t."""
    return float(np.max(means - radii)) if len(means) else -np.inf


def empirical_slope(points: np.ndarray, means: np.ndarray, radii: np.ndarray) -> float:
    """Item 7, max_{i != j} (|mu_hat_i - mu_hat_j| - c_i - c_j)_+ / d(x_i, x_j).

    On the good event the numerator is <= |f(x_i) - f(x_j)|, so the slope never exceeds the true L."""
    if len(points) < 2:
        return 0.0
    dist = pairwise_distances(points, points)
    excess = np.abs(means[:, None] - means[None, :]) - radii[:, None] - radii[None, :]
    np.fill_diagonal(dist, np.inf)
    return float(np.max(np.maximum(excess, 0.0) / dist))


def sobol_pool(dim: int, size: int, seed: int) -> np.ndarray:
    """A scrambled Sobol pool of ``size`` (a power of two, for balance) points in [0, 1]^d."""
    if size < 1 or size & (size - 1):
        raise ValueError(f"pool size must be a power of two, got {size}")
    return qmc.Sobol(dim, scramble=True, seed=seed).random_base2(int(math.log2(size)))


def grid_pool(dim: int, per_axis: int) -> np.ndarray:
    """The centres of a regular grid of ``per_axis``^d cells on [0, 1]^d (row-major): a pool whose
    covering radius is known exactly (``grid_covering_radius``), unlike a Sobol pool's."""
    if per_axis < 1:
        raise ValueError(f"per_axis must be >= 1, got {per_axis}")
    axis = (np.arange(per_axis) + 0.5) / per_axis
    return np.stack(np.meshgrid(*([axis] * dim), indexing="ij"), axis=-1).reshape(-1, dim)


def grid_covering_radius(dim: int, per_axis: int) -> float:
    """Exact covering radius of ``grid_pool``: half the diagonal of a cell, sqrt(d) / (2 per_axis)."""
    return math.sqrt(dim) / (2.0 * per_axis)


def covering_radius_estimate(pool: np.ndarray, n_probes: int, seed: int) -> float:
    """h: the largest distance from a uniform probe to its nearest pool point (a Monte-Carlo lower
    estimate of the pool's covering radius; used to report eps_t + L h, item 4)."""
    probes = np.random.default_rng(seed).random((n_probes, pool.shape[1]))
    return float(max(np.min(pairwise_distances(chunk, pool), axis=1).max()
                     for chunk in np.array_split(probes, max(1, n_probes // 256))))


# ------------------------------------------------------------------------------------------------
# Shared bookkeeping of repeated noisy samples
# ------------------------------------------------------------------------------------------------


class SampleStore:
    """Distinct sampled points with their counts and running sums; exact re-queries are merged."""

    def __init__(self, dim: int, capacity: int = 64):
        self.dim = dim
        self._points = np.empty((capacity, dim))
        self._counts = np.zeros(capacity)
        self._sums = np.zeros(capacity)
        self._index: dict[bytes, int] = {}
        self.size = 0
        self.total = 0

    def add(self, x: np.ndarray, y: float) -> tuple[int, bool]:
        """Record y at x; returns (index, is_new_point)."""
        key = np.asarray(x, dtype=float).tobytes()
        i = self._index.get(key)
        new = i is None
        if new:
            if self.size == len(self._counts):
                self._grow()
            i = self.size
            self._points[i] = x
            self._index[key] = i
            self.size += 1
        self._counts[i] += 1
        self._sums[i] += y
        self.total += 1
        return i, new

    def _grow(self) -> None:
        capacity = 2 * len(self._counts)
        self._points = np.vstack([self._points, np.empty((capacity - len(self._points), self.dim))])
        self._counts = np.concatenate([self._counts, np.zeros(capacity - len(self._counts))])
        self._sums = np.concatenate([self._sums, np.zeros(capacity - len(self._sums))])

    @property
    def points(self) -> np.ndarray:
        return self._points[: self.size]

    @property
    def counts(self) -> np.ndarray:
        return self._counts[: self.size]

    @property
    def means(self) -> np.ndarray:
        return self._sums[: self.size] / self._counts[: self.size]


class DistanceColumns:
    """Distances from a fixed set of query points to a growing list of samples, one column per sample
    (appending costs O(queries); recomputing from scratch every step would cost O(queries x samples))."""

    def __init__(self, queries: np.ndarray, capacity: int = 64):
        self.queries = queries
        self._dist = np.empty((len(queries), capacity))
        self.size = 0

    def append(self, x: np.ndarray) -> None:
        if self.size == self._dist.shape[1]:
            self._dist = np.hstack([self._dist, np.empty_like(self._dist)])
        self._dist[:, self.size] = np.sqrt(((self.queries - x) ** 2).sum(axis=1))
        self.size += 1

    @property
    def matrix(self) -> np.ndarray:
        return self._dist[:, : self.size]


# ------------------------------------------------------------------------------------------------
# CGP (items 1-5)
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CGPSettings:
    """Knobs of CGP. ``radius_scale = 0`` is the zero-radius negative control (c_i = 0)."""

    lipschitz: float
    noise_sd: float
    delta: float = 0.05
    pool_size: int = 2048
    perturb_centres: int = 8
    perturb_per_centre: int = 8
    perturb_scale: float = 0.05
    radius_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.lipschitz > 0:
            raise ValueError(f"lipschitz: must be > 0, got {self.lipschitz}")
        if self.noise_sd < 0 or not 0 < self.delta < 1:
            raise ValueError(f"noise_sd must be >= 0 and delta in (0, 1), got {self.noise_sd}, {self.delta}")


class CertificateGuidedPruning:
    """CGP with an explicit active set over a Sobol pool (items 1-5), ask/tell interface.

    After every ``tell``: radii (item 1), envelopes (item 2), the monotone active set
    A_t = {x : U_t(x) >= l_t} intersected with A_{t-1} (item 3), the gap eps_t (item 4). ``ask`` returns
    the optimistic point argmax_{x in A_t} U_t(x) among the active pool and Gaussian perturbations of
    the top-U active points (item 5); an already-sampled maximiser is re-sampled.
    """

    def __init__(self, dim: int, settings: CGPSettings, seed: int, pool: np.ndarray | None = None,
                 covering_radius: float | None = None):
        if covering_radius is not None and not covering_radius > 0:
            raise ValueError(f"covering_radius must be > 0, got {covering_radius}")
        self.dim = dim
        self.settings = settings
        # h, an upper bound on the pool's covering radius (exact for ``grid_pool``); None for a Sobol pool.
        # With it, candidates come from the near set at scale h (``_near_set_candidates``).
        self.covering_radius = covering_radius
        self.lipschitz = settings.lipschitz
        self.rng = np.random.default_rng(seed)
        if pool is not None and (pool.ndim != 2 or pool.shape[1] != dim):
            raise ValueError(f"pool must have shape (n, {dim}), got {pool.shape}")
        # The default pool is a Sobol pool of settings.pool_size; a given pool (e.g. ``grid_pool``) replaces it.
        self.pool = sobol_pool(dim, settings.pool_size, seed) if pool is None else np.asarray(pool, dtype=float)
        self.active = np.ones(len(self.pool), dtype=bool)
        self.samples = SampleStore(dim)
        self._pool_distances = DistanceColumns(self.pool)
        self._pool_upper = np.full(len(self.pool), np.inf)

    # -- state ------------------------------------------------------------------------------------
    @property
    def radii(self) -> np.ndarray:
        if self.samples.size == 0:
            return np.empty(0)
        s = self.settings
        return s.radius_scale * confidence_radius(self.samples.counts, self.samples.size, s.noise_sd, s.delta)

    def upper(self, x: np.ndarray) -> np.ndarray:
        """U_t at arbitrary points (n, d)."""
        x = np.atleast_2d(np.asarray(x, dtype=float))
        return upper_envelope(pairwise_distances(x, self.samples.points), self.samples.means + self.radii,
                              self.lipschitz)

    @property
    def lower(self) -> float:
        return lower_certificate(self.samples.means, self.radii)

    @property
    def active_fraction(self) -> float:
        """Vol(A_t) estimated as the active fraction of the pool (item 4)."""
        return float(self.active.mean())

    @property
    def unintersected_fraction(self) -> float:
        """Pool fraction of {x : U_t(x) >= l_t} without the intersection with A_{t-1} (a diagnostic: unlike
        Vol(A_t) it can rise when a noisy sample lifts U_t or lowers l_t)."""
        return float(np.mean(self._pool_upper >= self.lower))

    @property
    def gap(self) -> float:
        """eps_t = max_{x in A_t} U_t(x) - l_t over the active pool (item 4); +inf (no certificate) when
        no sample has been taken or the active pool is empty.

        An empty active *pool* does not mean an empty active *set*: on a steep function the region
        {U_t >= l_t} around x* can be narrower than the pool's spacing, so every pool point is pruned
        while x* (on the good event) is not. The pool then says nothing about max_{A_t} U_t, and a gap
        of 0 there was a false certificate (issue 18): the true regret of x_hat_t stayed positive while
        ``should_stop`` fired. ``covered_gap`` is the bound that stays valid in that case."""
        if self.samples.size == 0 or not self.active.any():
            return math.inf
        return float(max(0.0, self._pool_upper[self.active].max() - self.lower))

    def covered_gap(self, covering_radius: float) -> float:
        """eps_t^+ = max {U_t(p) : p in pool, U_t(p) >= l_t - L h} + L h - l_t, an upper bound on
        max_{x in A_t} U_t(x) - l_t over the *continuous* active set, valid whenever ``covering_radius``
        h is at least the pool's covering radius (every x of the cube within h of a pool point;
        ``grid_covering_radius`` gives it exactly for a grid pool). [reconstructed: the project's
        correction of item 4's pool estimate.]

        Why it is valid: U_t is L-Lipschitz (a minimum of L-Lipschitz cones), so for x in A_t and its
        nearest pool point p, U_t(p) >= U_t(x) - L h >= l_t - L h (p is in the maximised set) and
        U_t(x) <= U_t(p) + L h. The set is never empty on the good event (x* in A_t), and it uses the
        un-intersected envelope, a superset of the monotone A_t, so it is conservative. +inf with no
        sample; 0 is never returned unless L h = 0 and U_t = l_t on the set."""
        if covering_radius < 0:
            raise ValueError(f"covering_radius must be >= 0, got {covering_radius}")
        if self.samples.size == 0:
            return math.inf
        slack = self.lipschitz * covering_radius
        lower = self.lower
        near = self._pool_upper >= lower - slack
        if not near.any():  # impossible on the good event: no certificate rather than a false one
            return math.inf
        return float(max(0.0, self._pool_upper[near].max() + slack - lower))

    def near_fraction(self, covering_radius: float) -> float:
        """|N_t| / |pool| for the near set N_t = {p : U_t(p) >= l_t - L h}. Every x with U_t(x) >= l_t has its
        nearest pool point in N_t (``covered_gap``), so for a grid pool (equal cells of volume 1/|pool|,
        h = ``grid_covering_radius``) it is an upper bound on Vol({x : U_t(x) >= l_t}) >= Vol(A_t), where the
        active pool fraction (``active_fraction``) can read 0 while A_t is not empty."""
        if covering_radius < 0:
            raise ValueError(f"covering_radius must be >= 0, got {covering_radius}")
        if self.samples.size == 0:
            return 1.0
        return float(np.mean(self._pool_upper >= self.lower - self.lipschitz * covering_radius))

    def recommend(self) -> np.ndarray:
        """x_hat_t = argmax_i (mu_hat_i - c_i): f* - f(x_hat) <= eps_t on the good event (item 4)."""
        if self.samples.size == 0:
            return self.pool[0].copy()
        return self.samples.points[int(np.argmax(self.samples.means - self.radii))].copy()

    def should_stop(self, target_gap: float) -> bool:
        """Stopping rule of item 4: eps_t <= target. Never with an empty active pool (``gap`` is +inf
        there: the pool cannot certify a region it no longer represents)."""
        return self.samples.size > 0 and bool(self.active.any()) and self.gap <= target_gap

    # -- ask / tell ---------------------------------------------------------------------------------
    def ask(self) -> np.ndarray:
        if self.samples.size == 0:
            return self.pool[0].copy()
        candidates, values = self._candidates()
        return candidates[int(np.argmax(values))].copy()

    def _candidates(self) -> tuple[np.ndarray, np.ndarray]:
        """Active pool points and perturbations of the top-U active points, with their U (item 5).

        With a known covering radius, or once the active pool is empty, the candidates come from the near
        set instead (``_near_set_candidates``): the old fallback (the pool point nearest x_hat, perturbed
        at ``perturb_scale``) queried a certified-suboptimal point (U_t < l_t) almost every step."""
        active_idx = np.flatnonzero(self.active)
        if active_idx.size == 0 or self.covering_radius is not None:
            return self._near_set_candidates(active_idx)
        pool_points, pool_values = self.pool[active_idx], self._pool_upper[active_idx]
        s = self.settings
        if s.perturb_centres == 0 or s.perturb_per_centre == 0:
            return pool_points, pool_values
        top = np.argsort(-pool_values, kind="stable")[: s.perturb_centres]
        noise = self.rng.normal(0.0, s.perturb_scale, size=(len(top), s.perturb_per_centre, self.dim))
        perturbed = np.clip(pool_points[top][:, None, :] + noise, 0.0, 1.0).reshape(-1, self.dim)
        perturbed_values = self.upper(perturbed)
        keep = perturbed_values >= self.lower  # only points that are not certified suboptimal now
        return (np.vstack([pool_points, perturbed[keep]]),
                np.concatenate([pool_values, perturbed_values[keep]]))

    def candidate_scale(self) -> float:
        """h for the near set: the given covering radius, else the covering radius of a grid with as many
        points as the pool (a scale for proposing candidates only, never used in a certificate)."""
        if self.covering_radius is not None:
            return self.covering_radius
        return grid_covering_radius(self.dim, 1) * len(self.pool) ** (-1.0 / self.dim)

    def _near_set_candidates(self, active_idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Item 5 where the pool is sparse: the active pool points, x_hat_t, the top-U points of the near
        set N_t = {p in pool : U_t(p) >= l_t - L h} (it contains the pool point nearest any x of the
        continuous A_t, see ``covered_gap``) and Gaussian perturbations of x_hat_t and those points at
        scale h; only candidates with U_t >= l_t are kept. x_hat_t has U_t(x_hat_t) >= l_t on the good
        event, so the kept set is non-empty there; off it, the argmax of U_t is returned unfiltered."""
        s = self.settings
        h = self.candidate_scale()
        lower = self.lower
        near_idx = np.flatnonzero(self._pool_upper >= lower - self.lipschitz * h)
        top = near_idx[np.argsort(-self._pool_upper[near_idx], kind="stable")[: max(1, s.perturb_centres)]]
        centres = np.vstack([self.pool[top], self.recommend()[None, :]])
        noise = self.rng.normal(0.0, h, size=(len(centres), max(1, s.perturb_per_centre), self.dim))
        perturbed = np.clip(centres[:, None, :] + noise, 0.0, 1.0).reshape(-1, self.dim)
        points = np.vstack([self.pool[active_idx], centres, perturbed])
        values = np.concatenate([self._pool_upper[active_idx], self.upper(np.vstack([centres, perturbed]))])
        keep = values >= lower
        return (points[keep], values[keep]) if keep.any() else (points, values)

    def tell(self, x: np.ndarray, y: float) -> None:
        x = np.asarray(x, dtype=float)
        _, new = self.samples.add(x, float(y))
        if new:
            self._pool_distances.append(x)
        self._prune()

    def _prune(self) -> None:
        """Item 3: A_t = {U_t >= l_t} intersected with A_{t-1} (monotone)."""
        self._pool_upper = upper_envelope(self._pool_distances.matrix, self.samples.means + self.radii,
                                          self.lipschitz)
        self.active &= self._pool_upper >= self.lower


SLOPE_RTOL = 1e-9


class AdaptiveCGP(CertificateGuidedPruning):
    """CGP-Adaptive (item 7): L_hat starts at ``initial_lipschitz`` and doubles whenever the empirical
    slope exceeds it. Pruning done with a too-small L_hat is not valid, so a doubling resets the active
    set to the whole pool; the guarantee is only "eventual" (after the last doubling)."""

    def __init__(self, dim: int, settings: CGPSettings, seed: int, initial_lipschitz: float):
        super().__init__(dim, settings, seed)
        if not initial_lipschitz > 0:
            raise ValueError(f"initial_lipschitz: must be > 0, got {initial_lipschitz}")
        self.lipschitz = float(initial_lipschitz)
        self.doublings = 0
        self.doubling_steps: list[int] = []

    def tell(self, x: np.ndarray, y: float) -> None:
        x = np.asarray(x, dtype=float)
        _, new = self.samples.add(x, float(y))
        if new:
            self._pool_distances.append(x)
        slope = empirical_slope(self.samples.points, self.samples.means, self.radii)
        doubled = False
        # A relative tolerance: a slope equal to L_hat in exact arithmetic must not trigger a doubling
        # through rounding (the noise-free tent has slope exactly 2 between points on one side).
        while slope > self.lipschitz * (1.0 + SLOPE_RTOL):
            self.lipschitz *= 2.0
            self.doublings += 1
            doubled = True
        if doubled:
            self.doubling_steps.append(self.samples.total)
            self.active[:] = True
        self._prune()


class HybridCGP(CertificateGuidedPruning):
    """CGP-Hybrid (item 9) [reconstructed]: CGP until local smoothness is detected around the incumbent
    (a quadratic least-squares fit to the samples within ``local_radius`` has residual RMS below
    ``residual_tol``); from then on GP-UCB restricted to the active pool A_t. Certificates (and so the
    active set and eps_t) keep being updated exactly as in CGP."""

    def __init__(self, dim: int, settings: CGPSettings, seed: int, local_radius: float = 0.2,
                 residual_tol: float | None = None, check_every: int = 10, gp_refit_every: int = 20,
                 gp_candidates: int = 512):
        super().__init__(dim, settings, seed)
        self.local_radius = local_radius
        self.residual_tol = 2.0 * settings.noise_sd if residual_tol is None else residual_tol
        self.check_every = check_every
        self.gp_refit_every = gp_refit_every
        self.gp_candidates = gp_candidates
        self.switched_at: int | None = None
        self._gp = None

    def tell(self, x: np.ndarray, y: float) -> None:
        super().tell(x, y)
        t = self.samples.total
        if self.switched_at is None and t % self.check_every == 0 and self._locally_smooth():
            self.switched_at = t

    def _locally_smooth(self) -> bool:
        centre = self.recommend()
        near = np.sum((self.samples.points - centre) ** 2, axis=1) <= self.local_radius**2
        residual = quadratic_fit_residual(self.samples.points[near], self.samples.means[near])
        return residual is not None and residual <= self.residual_tol

    def ask(self) -> np.ndarray:
        if self.switched_at is None:
            return super().ask()
        active_idx = np.flatnonzero(self.active)
        if active_idx.size == 0:
            return super().ask()
        if active_idx.size > self.gp_candidates:
            active_idx = self.rng.choice(active_idx, self.gp_candidates, replace=False)
        ucb = self._gp_ucb(self.pool[active_idx])
        return self.pool[active_idx[int(np.argmax(ucb))]].copy()

    def _gp_ucb(self, candidates: np.ndarray) -> np.ndarray:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern

        means = self.samples.means
        scale = max(float(means.std()), 1e-9)
        alpha = (self.settings.noise_sd / scale) ** 2 / self.samples.counts + 1e-8
        refit = self._gp is None or self.samples.total % self.gp_refit_every == 0
        kernel = (ConstantKernel() * Matern(length_scale=np.full(self.dim, 0.2), nu=2.5) if self._gp is None
                  else self._gp.kernel_)
        self._gp = GaussianProcessRegressor(kernel, alpha=alpha, normalize_y=True,
                                            optimizer="fmin_l_bfgs_b" if refit else None)
        self._gp.fit(self.samples.points, means)
        mu, sd = self._gp.predict(candidates, return_std=True)
        return mu + ucb_beta_sqrt(len(self.pool), self.samples.total, self.settings.delta) * sd


def quadratic_fit_residual(points: np.ndarray, values: np.ndarray) -> float | None:
    """RMS residual of a full quadratic least-squares fit; None if there are too few points to judge
    (at least twice the number of quadratic coefficients)."""
    n, dim = points.shape
    features = quadratic_features(points)
    if n < 2 * features.shape[1]:
        return None
    coef, *_ = np.linalg.lstsq(features, values, rcond=None)
    return float(np.sqrt(np.mean((features @ coef - values) ** 2)))


def quadratic_features(points: np.ndarray) -> np.ndarray:
    """[1, x_k, x_k x_l (k <= l)]."""
    n, dim = points.shape
    iu = np.triu_indices(dim)
    cross = (points[:, :, None] * points[:, None, :])[:, iu[0], iu[1]]
    return np.hstack([np.ones((n, 1)), points, cross])


def ucb_beta_sqrt(n_candidates: int, t: int, delta: float) -> float:
    """sqrt(beta_t), beta_t = 2 log(|D| t^2 pi^2 / (6 delta)) (Srinivas et al. 2010, finite domain)."""
    return math.sqrt(2.0 * math.log(n_candidates * max(t, 1) ** 2 * math.pi**2 / (6.0 * delta)))


# ------------------------------------------------------------------------------------------------
# CGP-TR (item 8) [reconstructed]
# ------------------------------------------------------------------------------------------------


@dataclass
class TrustRegionState:
    """TuRBO-style box around the incumbent: side doubles after ``success_tol`` successes, halves after
    ``failure_tol`` failures, restarts at the initial side when it falls below ``min_side``."""

    side: float = 0.8
    max_side: float = 1.6
    min_side: float = 0.5**7
    success_tol: int = 3
    failure_tol: int = 5
    successes: int = 0
    failures: int = 0
    restarts: int = 0
    initial_side: float = field(default=0.8)

    def update(self, improved: bool) -> None:
        if improved:
            self.successes, self.failures = self.successes + 1, 0
        else:
            self.successes, self.failures = 0, self.failures + 1
        if self.successes >= self.success_tol:
            self.side, self.successes = min(2.0 * self.side, self.max_side), 0
        elif self.failures >= self.failure_tol:
            self.side, self.failures = self.side / 2.0, 0
        if self.side < self.min_side:
            self.side, self.restarts = self.initial_side, self.restarts + 1


class TrustRegionCGP:
    """CGP-TR: certificates inside a trust region (item 8). Each ask draws a local Sobol set inside the
    box around the incumbent x_hat, keeps the points with U_t >= l_t (the local active set, whose
    fraction is the *local* volume reported in high d) and queries the one with the largest U_t.

    The local Lipschitz constant is min(L, max(L_floor, safety * empirical slope of the samples inside
    the box)): a heuristic certificate, valid only when the local slope estimate is (the reviewers'
    point on high-dimensional certificates)."""

    def __init__(self, dim: int, settings: CGPSettings, seed: int, local_points: int = 256,
                 lipschitz_floor: float = 0.1, slope_safety: float = 2.0, state: TrustRegionState | None = None):
        self.dim = dim
        self.settings = settings
        self.seed = seed
        self.rng = np.random.default_rng(seed)
        self.local_points = local_points
        self.lipschitz_floor = lipschitz_floor
        self.slope_safety = slope_safety
        self.state = state or TrustRegionState()
        self.samples = SampleStore(dim)
        self.local_active_fraction = 1.0
        self.local_lipschitz = settings.lipschitz
        self._best = -np.inf
        self._draws = 0

    @property
    def radii(self) -> np.ndarray:
        s = self.settings
        if self.samples.size == 0:
            return np.empty(0)
        return s.radius_scale * confidence_radius(self.samples.counts, self.samples.size, s.noise_sd, s.delta)

    @property
    def lower(self) -> float:
        return lower_certificate(self.samples.means, self.radii)

    def recommend(self) -> np.ndarray:
        if self.samples.size == 0:
            return np.full(self.dim, 0.5)
        return self.samples.points[int(np.argmax(self.samples.means - self.radii))].copy()

    def box(self) -> tuple[np.ndarray, np.ndarray]:
        centre = self.recommend()
        half = self.state.side / 2.0
        return np.clip(centre - half, 0.0, 1.0), np.clip(centre + half, 0.0, 1.0)

    def ask(self) -> np.ndarray:
        if self.samples.size == 0:
            return np.full(self.dim, 0.5)
        low, high = self.box()
        unit = qmc.Sobol(self.dim, scramble=True, seed=self.seed * 100_003 + self._draws).random(self.local_points)
        self._draws += 1
        local = low + unit * (high - low)
        points, means, radii = self.samples.points, self.samples.means, self.radii
        inside = np.all((points >= low) & (points <= high), axis=1)
        slope = empirical_slope(points[inside], means[inside], radii[inside])
        self.local_lipschitz = min(self.settings.lipschitz, max(self.lipschitz_floor, self.slope_safety * slope))
        values = upper_envelope(pairwise_distances(local, points), means + radii, self.local_lipschitz)
        active = values >= self.lower
        self.local_active_fraction = float(active.mean())
        if not active.any():
            return local[int(np.argmax(values))]
        idx = np.flatnonzero(active)
        return local[idx[int(np.argmax(values[idx]))]]

    def tell(self, x: np.ndarray, y: float) -> None:
        improved = y > self._best + 1e-3 * max(1.0, abs(self._best)) if np.isfinite(self._best) else True
        self._best = max(self._best, float(y))
        self.samples.add(np.asarray(x, dtype=float), float(y))
        self.state.update(improved)


# ------------------------------------------------------------------------------------------------
# Convenience drivers
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OptimizationResult:
    x: np.ndarray
    lower_certificate: float
    gap: float
    evaluations: int
    stopped_early: bool


def maximize(objective: Callable[[np.ndarray], float], bounds: Sequence[tuple[float, float]], budget: int,
             lipschitz: float, noise_sd: float, seed: int = 0, target_gap: float | None = None,
             **settings: float) -> OptimizationResult:
    """Maximise a noisy L-Lipschitz ``objective`` on a box with CGP, at most ``budget`` evaluations.

    ``lipschitz`` is in the box's coordinates; on the unit cube it becomes L * (longest side), a valid
    constant because |x - y| <= longest side * |u - v| for the cube coordinates u, v. The pool is a grid
    of about ``pool_size`` points (``grid_pool``, exact covering radius h), and both the stopping rule and
    the returned ``gap`` are the covering-corrected eps_t^+ (``covered_gap``): on the good event
    f* - f(x) <= gap. The pool gap eps_t is not used: on a sparse pool it undershoots (issue 18)."""
    low, high = (np.asarray(b, dtype=float) for b in zip(*bounds))
    if np.any(high <= low):
        raise ValueError("bounds: every upper bound must exceed its lower bound")
    cube_l = float(lipschitz * np.max(high - low))
    cgp_settings = CGPSettings(cube_l, noise_sd, **settings)
    dim = len(low)
    per_axis = max(2, int(math.floor(cgp_settings.pool_size ** (1.0 / dim) + 1e-9)))
    cover = grid_covering_radius(dim, per_axis)
    optimizer = CertificateGuidedPruning(dim, cgp_settings, seed, pool=grid_pool(dim, per_axis),
                                         covering_radius=cover)
    stopped = False
    for _ in range(budget):
        u = optimizer.ask()
        optimizer.tell(u, float(objective(low + u * (high - low))))
        if target_gap is not None and optimizer.covered_gap(cover) <= target_gap:
            stopped = True
            break
    return OptimizationResult(low + optimizer.recommend() * (high - low), optimizer.lower,
                              optimizer.covered_gap(cover), optimizer.samples.total, stopped)


def minimize(objective: Callable[[np.ndarray], float], bounds: Sequence[tuple[float, float]], budget: int,
             lipschitz: float, noise_sd: float, seed: int = 0, target_gap: float | None = None,
             **settings: float) -> OptimizationResult:
    """``maximize`` of -objective. The returned ``lower_certificate`` and ``gap`` are for -f: on the good
    event -lower_certificate is an upper bound on f(x) and f(x) - f_min <= gap, with gap = eps_t^+ (the
    covering-corrected gap, ``covered_gap``), not the pool gap."""
    return maximize(lambda x: -objective(x), bounds, budget, lipschitz, noise_sd, seed, target_gap, **settings)
