"""Baselines the paper positions CGP against, on [0, 1]^d, maximising, with an ask/tell interface
(DIRECT is driven by scipy, so it is a function that records its evaluations).

- HOO (Bubeck, Munos, Stoltz & Szepesvari 2011), own code: binary tree of cells split at the midpoint
  of the longest side; the smoothness term nu_1 rho^h is replaced by its Lipschitz value L * diam(cell).
- Zooming (Kleinberg, Slivkins & Upfal 2008), own code: arms activated while some pool point is not
  covered by a confidence ball L d(x, v) <= r(v); play argmax mu + 2 r.
- DIRECT: ``scipy.optimize.direct`` on the noisy function.
- GP-UCB (Srinivas et al. 2010): Matern-5/2 GP, hyperparameters by scikit-learn, exact rank-one updates between.
- Random search.

Every optimiser knows sigma and (where it uses one) the same L as CGP, so the comparison is like for like.
The recommendation rules (``recommend``) are the project's choices [reconstructed].
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from scipy.linalg import solve_triangular
from scipy.optimize import direct, minimize

from tasks.certificate_pruning.method import (
    DistanceColumns,
    SampleStore,
    pairwise_distances,
    sobol_pool,
    ucb_beta_sqrt,
)


class RandomSearch:
    """Uniform random queries; recommends the best noisy observation."""

    def __init__(self, dim: int, seed: int):
        self.dim = dim
        self.rng = np.random.default_rng(seed)
        self.samples = SampleStore(dim)

    def ask(self) -> np.ndarray:
        return self.rng.random(self.dim)

    def tell(self, x: np.ndarray, y: float) -> None:
        self.samples.add(np.asarray(x, dtype=float), float(y))

    def recommend(self) -> np.ndarray:
        return self.samples.points[int(np.argmax(self.samples.means))].copy()


class HOO:
    """Hierarchical Optimistic Optimisation with the exploration bonus sigma sqrt(2 log n / T_node)."""

    def __init__(self, dim: int, lipschitz: float, noise_sd: float, seed: int):
        self.dim = dim
        self.lipschitz = lipschitz
        self.noise_sd = noise_sd
        self.rng = np.random.default_rng(seed)
        self.low: list[np.ndarray] = []
        self.high: list[np.ndarray] = []
        self.children: list[list[int]] = []  # [left, right], -1 when not in the tree
        self.counts: list[int] = []
        self.sums: list[float] = []
        self.n = 0
        self._pending: list[int] = []  # the path of the last ask, updated by tell

    def _add_node(self, low: np.ndarray, high: np.ndarray) -> int:
        self.low.append(low)
        self.high.append(high)
        self.children.append([-1, -1])
        self.counts.append(0)
        self.sums.append(0.0)
        return len(self.low) - 1

    def _child_cell(self, node: int, side: int) -> tuple[np.ndarray, np.ndarray]:
        low, high = self.low[node].copy(), self.high[node].copy()
        axis = int(np.argmax(high - low))
        mid = 0.5 * (low[axis] + high[axis])
        if side == 0:
            high[axis] = mid
        else:
            low[axis] = mid
        return low, high

    def _b_values(self) -> np.ndarray:
        """B(node) = min(U(node), max(B(children))), children after parents in creation order."""
        counts = np.asarray(self.counts, dtype=float)
        means = np.asarray(self.sums) / np.maximum(counts, 1)
        diam = np.linalg.norm(np.asarray(self.high) - np.asarray(self.low), axis=1)
        with np.errstate(divide="ignore"):
            bonus = self.noise_sd * np.sqrt(2.0 * math.log(max(self.n, 2)) / counts)
        upper = np.where(counts > 0, means + bonus + self.lipschitz * diam, np.inf)
        b = upper.copy()
        for node in range(len(b) - 1, -1, -1):
            kids = [b[c] if c >= 0 else np.inf for c in self.children[node]]
            b[node] = min(upper[node], max(kids))
        return b

    def ask(self) -> np.ndarray:
        if not self.low:
            root = self._add_node(np.zeros(self.dim), np.ones(self.dim))
            self._pending = [root]
            return 0.5 * (self.low[root] + self.high[root])
        b = self._b_values()
        node, path = 0, [0]
        while True:
            kids = self.children[node]
            scores = [b[c] if c >= 0 else np.inf for c in kids]
            side = int(self.rng.integers(2)) if scores[0] == scores[1] else int(np.argmax(scores))
            if kids[side] < 0:
                kids[side] = self._add_node(*self._child_cell(node, side))
                path.append(kids[side])
                break
            node = kids[side]
            path.append(node)
        self._pending = path
        leaf = path[-1]
        return 0.5 * (self.low[leaf] + self.high[leaf])

    def tell(self, x: np.ndarray, y: float) -> None:
        for node in self._pending:
            self.counts[node] += 1
            self.sums[node] += float(y)
        self.n += 1

    def recommend(self) -> np.ndarray:
        """Centre of the cell with the best lower confidence bound of its mean."""
        counts = np.asarray(self.counts, dtype=float)
        played = counts > 0
        means = np.asarray(self.sums) / np.maximum(counts, 1)
        lower = np.where(played, means - self.noise_sd * np.sqrt(2 * math.log(max(self.n, 2)) / np.maximum(counts, 1)),
                         -np.inf)
        node = int(np.argmax(lower))
        return 0.5 * (self.low[node] + self.high[node])


class Zooming:
    """Zooming algorithm: confidence radius r(v) = sigma sqrt(2 log(4 T^2 / delta) / (n_v + 1)); a pool
    point x is covered by arm v when L d(x, v) <= r(v)."""

    def __init__(self, dim: int, lipschitz: float, noise_sd: float, horizon: int, seed: int,
                 pool_size: int = 2048, delta: float = 0.05):
        self.dim = dim
        self.lipschitz = lipschitz
        self.log_term = 2.0 * math.log(4.0 * horizon**2 / delta)
        self.noise_sd = noise_sd
        self.pool = sobol_pool(dim, pool_size, seed + 7)
        self.samples = SampleStore(dim)
        self._distances = DistanceColumns(self.pool)

    def radii(self) -> np.ndarray:
        return self.noise_sd * np.sqrt(self.log_term / (self.samples.counts + 1.0))

    def ask(self) -> np.ndarray:
        if self.samples.size == 0:
            return self.pool[0].copy()
        covered = np.any(self.lipschitz * self._distances.matrix <= self.radii()[None, :], axis=1)
        if not covered.all():  # activation rule: the first uncovered pool point (Sobol order)
            return self.pool[int(np.argmin(covered))].copy()
        index = self.samples.means + 2.0 * self.radii()
        return self.samples.points[int(np.argmax(index))].copy()

    def tell(self, x: np.ndarray, y: float) -> None:
        _, new = self.samples.add(np.asarray(x, dtype=float), float(y))
        if new:
            self._distances.append(np.asarray(x, dtype=float))

    def recommend(self) -> np.ndarray:
        return self.samples.points[int(np.argmax(self.samples.means - self.radii()))].copy()


def matern52(a: np.ndarray, b: np.ndarray, amplitude: float, length_scale: np.ndarray) -> np.ndarray:
    """Matern-5/2 ARD kernel amplitude * (1 + sqrt5 r + 5 r^2 / 3) exp(-sqrt5 r), r = |(a - b) / l|."""
    r = pairwise_distances(a / length_scale, b / length_scale)
    return amplitude * (1.0 + SQRT5 * r + 5.0 * r**2 / 3.0) * np.exp(-SQRT5 * r)


SQRT5 = math.sqrt(5.0)


def capped_lbfgs(max_iterations: int) -> Callable:
    """scikit-learn GP optimiser: L-BFGS-B on the log marginal likelihood with an iteration cap (the
    default runs to convergence, which costs seconds per fit for 10 length scales)."""

    def optimizer(objective: Callable, initial_theta: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, float]:
        result = minimize(objective, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds,
                          options={"maxiter": max_iterations})
        return result.x, float(result.fun)

    return optimizer


class GPUCB:
    """GP-UCB over a random subset of a Sobol pool; Matern-5/2 ARD kernel, known noise sigma.

    Hyperparameters (amplitude, length scales) are fitted by scikit-learn's marginal-likelihood
    optimiser (on at most ``fit_points`` random observations, ``fit_iterations`` L-BFGS steps) whenever
    the number of observations has grown by ``refit_growth`` since the last fit;
    in between, the posterior is updated exactly with a rank-one extension of the Cholesky factor
    (O(n^2) per step instead of a full refit), which is what keeps GP-UCB inside the cpu budget."""

    def __init__(self, dim: int, noise_sd: float, seed: int, pool_size: int = 2048, candidates: int = 512,
                 refit_growth: float = 2.0, initial_points: int = 5, delta: float = 0.05, fit_iterations: int = 20,
                 fit_points: int = 64):
        if refit_growth <= 1:
            raise ValueError(f"refit_growth: must be > 1, got {refit_growth}")
        self.dim = dim
        self.noise_sd = noise_sd
        self.rng = np.random.default_rng(seed)
        self.pool = sobol_pool(dim, pool_size, seed + 11)
        self.candidates = min(candidates, pool_size)
        self.refit_growth = refit_growth
        self.fit_iterations = fit_iterations
        self.fit_points = fit_points
        self.initial_points = initial_points
        self.delta = delta
        self.x: list[np.ndarray] = []
        self.y: list[float] = []
        self.refits = 0
        self._fitted_n = 0  # observations at the last hyperparameter fit
        self._chol: np.ndarray | None = None  # Cholesky factor of K + noise I over the first _chol_n rows
        self._chol_n = 0

    # -- hyperparameters and the Cholesky factor ----------------------------------------------------
    def _refit_hyperparameters(self) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern

        x, y = np.asarray(self.x), np.asarray(self.y)
        self.y_mean, self.y_std = float(y.mean()), max(float(y.std()), 1e-9)
        self.noise_var = (self.noise_sd / self.y_std) ** 2 + 1e-8  # in normalised-y units
        kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(np.full(self.dim, 0.2), (1e-3, 1e2), nu=2.5)
        gp = GaussianProcessRegressor(kernel, alpha=self.noise_var, normalize_y=False,
                                      optimizer=capped_lbfgs(self.fit_iterations))
        subset = (self.rng.choice(len(x), self.fit_points, replace=False) if len(x) > self.fit_points
                  else np.arange(len(x)))  # hyperparameters from a subset; the posterior uses every point
        gp.fit(x[subset], (y[subset] - self.y_mean) / self.y_std)
        self.amplitude = float(gp.kernel_.k1.constant_value)
        self.length_scale = np.atleast_1d(gp.kernel_.k2.length_scale).astype(float)
        self._fitted_n = len(y)
        self.refits += 1
        gram = matern52(x, x, self.amplitude, self.length_scale) + self.noise_var * np.eye(len(x))
        self._chol, self._chol_n = np.linalg.cholesky(gram), len(x)

    def _sync(self) -> None:
        """Bring the factor up to date: refit on growth, otherwise extend it row by row."""
        n = len(self.y)
        if self._chol is None or n >= self.refit_growth * self._fitted_n:
            self._refit_hyperparameters()
            return
        for i in range(self._chol_n, n):
            xi = self.x[i][None]
            k = matern52(np.asarray(self.x[:i]), xi, self.amplitude, self.length_scale)[:, 0]
            row = solve_triangular(self._chol, k, lower=True)
            diag = math.sqrt(max(self.amplitude + self.noise_var - row @ row, 1e-12))
            grown = np.zeros((i + 1, i + 1))
            grown[:i, :i], grown[i, :i], grown[i, i] = self._chol, row, diag
            self._chol = grown
        self._chol_n = n

    def posterior(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and standard deviation in normalised-y units."""
        self._sync()
        x = np.asarray(self.x)
        cross = matern52(x, points, self.amplitude, self.length_scale)
        solved = solve_triangular(self._chol, np.column_stack([cross, (np.asarray(self.y) - self.y_mean)
                                                               / self.y_std]), lower=True)
        v, w = solved[:, :-1], solved[:, -1]
        variance = np.maximum(self.amplitude - np.sum(v**2, axis=0), 1e-12)
        return v.T @ w, np.sqrt(variance)

    # -- ask / tell -----------------------------------------------------------------------------------
    def ask(self) -> np.ndarray:
        t = len(self.y)
        if t < self.initial_points:
            return self.pool[t].copy()
        idx = self.rng.choice(len(self.pool), self.candidates, replace=False)
        mean, sd = self.posterior(self.pool[idx])
        return self.pool[idx[int(np.argmax(mean + ucb_beta_sqrt(len(self.pool), t, self.delta) * sd))]].copy()

    def tell(self, x: np.ndarray, y: float) -> None:
        self.x.append(np.asarray(x, dtype=float))
        self.y.append(float(y))

    def recommend(self) -> np.ndarray:
        """The observed point with the largest posterior mean."""
        x = np.asarray(self.x)
        if len(self.y) < self.initial_points:
            return x[int(np.argmax(self.y))].copy()
        mean, _ = self.posterior(x)
        return x[int(np.argmax(mean))].copy()


def run_direct(noisy: Callable[[np.ndarray], float], dim: int, budget: int) -> list[np.ndarray]:
    """DIRECT (scipy, locally biased) maximising ``noisy``; returns the recommendation after every
    evaluation (the best noisy observation so far, what DIRECT itself reports), padded to ``budget``."""
    best = {"y": -np.inf, "x": None}
    history: list[np.ndarray] = []

    class _BudgetSpent(Exception):
        pass

    def negated(x: np.ndarray) -> float:
        if len(history) >= budget:
            raise _BudgetSpent
        y = noisy(np.asarray(x, dtype=float))
        if y > best["y"]:
            best["y"], best["x"] = y, np.array(x, dtype=float)
        history.append(best["x"].copy())
        return -y

    try:
        direct(negated, [(0.0, 1.0)] * dim, maxfun=budget, maxiter=100_000, vol_tol=0.0, len_tol=0.0)
    except _BudgetSpent:
        pass
    while len(history) < budget:  # DIRECT may stop early (e.g. f_min reached): keep its last answer
        history.append(history[-1].copy())
    return history
