"""Interacting self-consuming generators with Bradley-Terry human curation (pure library).

Everything here is the project's **reconstruction** (README, "Fidelity checklist" and "Method") of
the model family behind Wei, Zhang & Zhang, "When and How Human Curation Backfires"
(ICML 2026), built on Ferbach et al. (NeurIPS 2024). No official code exists.

Model family (README, "Method"):

- N generators; generator i is the conditional Gaussian ``y | x ~ N(theta_i^T phi(x), v_i)`` with
  features normalised so that ``E[phi phi^T] = I``. The unconditional 1-D case is ``phi(x) = 1``
  (``d = 1``, ``theta_i = m_i``); the conditional task uses ``phi(x) = x``, ``x ~ N(0, I_d)``.
- Human reward of model i: ``r_i(x, y) = -(y - a_i^T phi(x))^2 / 2`` (``a_i = mu_i`` in 1-D).
- Curation (Bradley-Terry over K candidates): keep candidate k with probability
  ``softmax_k(beta_i r_i(y_k))``; as K -> infinity this is the tilt ``C_i(p) ∝ p e^{beta_i r_i}``.
- Round update: model i refits by maximum likelihood on
  ``D_i = lambda_i p_data + sum_j W_ij C_j(p_j)``, ``W >= 0`` with rows summing to ``1 - lambda_i``.
- Alignment ``A_i = E_{p_i}[r_i]``; influence ``I_ij = dA_i* / dbeta_j`` at the fixed point.

State arrays: ``theta`` has shape (N, d), ``v`` shape (N,). Everything is float64 numpy; the
neural refit (``fit_neural_conditional``) is the only torch code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

ROW_SUM_TOL = 1e-9


# ------------------------------------------------------------------------------------------------
# The loop specification
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoopSpec:
    """One configuration of the multi-model loop (README, "Method": round update).

    ``mixing[i, j]`` is the share of model i's training data that is model j's curated output;
    ``real_share[i]`` (lambda_i) the share of real data; each row of ``mixing`` sums to
    ``1 - real_share[i]``. ``targets[i]`` is a_i (shape (N, d)); real data is
    ``y | x ~ N(real_theta^T phi(x), real_var)``.
    """

    name: str
    mixing: np.ndarray
    real_share: np.ndarray
    beta: np.ndarray
    targets: np.ndarray
    real_theta: np.ndarray = field(default_factory=lambda: np.zeros(1))
    real_var: float = 1.0

    def __post_init__(self) -> None:
        mixing = np.atleast_2d(np.asarray(self.mixing, dtype=float))
        n_models = mixing.shape[0]
        real_share = np.broadcast_to(np.asarray(self.real_share, dtype=float), (n_models,)).copy()
        beta = np.asarray(self.beta, dtype=float).reshape(n_models)
        targets = np.asarray(self.targets, dtype=float).reshape(n_models, -1)
        real_theta = np.asarray(self.real_theta, dtype=float).reshape(-1)
        if real_theta.size == 1 and targets.shape[1] > 1:
            real_theta = np.full(targets.shape[1], float(real_theta[0]))
        for name, value in (("mixing", mixing), ("real_share", real_share), ("beta", beta),
                            ("targets", targets), ("real_theta", real_theta)):
            object.__setattr__(self, name, value)
        self.validate()

    @property
    def n_models(self) -> int:
        return self.mixing.shape[0]

    @property
    def dim(self) -> int:
        return self.targets.shape[1]

    def validate(self) -> None:
        """W square and non-negative, lambda in [0, 1], rows of W sum to 1 - lambda, beta >= 0."""
        n = self.n_models
        if self.mixing.shape != (n, n):
            raise ValueError(f"{self.name}: mixing must be square, got shape {self.mixing.shape}")
        if np.any(self.mixing < 0):
            raise ValueError(f"{self.name}: mixing must be non-negative, got {self.mixing.tolist()}")
        if np.any(self.real_share < 0) or np.any(self.real_share > 1):
            raise ValueError(f"{self.name}: real_share must be in [0, 1], got {self.real_share.tolist()}")
        rows = self.mixing.sum(axis=1)
        if not np.allclose(rows, 1.0 - self.real_share, atol=ROW_SUM_TOL, rtol=0):
            raise ValueError(f"{self.name}: rows of mixing must sum to 1 - real_share "
                             f"({(1 - self.real_share).tolist()}), got {rows.tolist()}")
        if np.any(self.beta < 0):
            raise ValueError(f"{self.name}: beta must be >= 0, got {self.beta.tolist()}")
        if self.real_theta.shape != (self.dim,):
            raise ValueError(f"{self.name}: real_theta must have {self.dim} entries, got {self.real_theta.shape}")
        if self.real_var <= 0:
            raise ValueError(f"{self.name}: real_var must be > 0, got {self.real_var}")

    def with_beta(self, beta: np.ndarray) -> LoopSpec:
        return LoopSpec(self.name, self.mixing, self.real_share, np.asarray(beta, dtype=float), self.targets,
                        self.real_theta, self.real_var)

    def with_dim(self, dim: int) -> LoopSpec:
        """The conditional version: targets a_i = mu_i e_1 in R^dim, real data theta_0 = mu_0 e_1."""
        targets = np.zeros((self.n_models, dim))
        targets[:, 0] = self.targets[:, 0]
        real_theta = np.zeros(dim)
        real_theta[0] = self.real_theta[0]
        return LoopSpec(self.name, self.mixing, self.real_share, self.beta, targets, real_theta, self.real_var)


def isolated_spec(name: str, real_share: float, beta: float, target: float) -> LoopSpec:
    """Ferbach's single self-consuming loop: W = diag(1 - lambda)."""
    return LoopSpec(name, np.array([[1.0 - real_share]]), np.array([real_share]), np.array([beta]),
                    np.array([[target]]))


def symmetric_coupling(real_share: float, coupling: float) -> np.ndarray:
    """Two models that train on a share ``coupling`` of each other's output: W_12 = W_21 = coupling."""
    if not 0 <= coupling <= 1 - real_share:
        raise ValueError(f"coupling must be in [0, 1 - real_share] = [0, {1 - real_share:g}], got {coupling}")
    own = 1.0 - real_share - coupling
    return np.array([[own, coupling], [coupling, own]])


def canonical_specs() -> dict[str, LoopSpec]:
    """The project's canonical configurations (README, "What is measured"; their analytic reference values
    are checked in tests/unit/test_multi_model_curation_method.py).

    ``cross_invert`` uses the ``dampen`` W and lambda (an assumption of the reconstruction). The beta
    stored here is the high-curation end; the experiments vary beta_1.
    """
    coupled = np.array([[0.1, 0.7], [0.7, 0.1]])
    self_invert_w = np.array([[0.05, 0.48], [0.15, 0.38]])
    return {
        "isolated": isolated_spec("isolated", 0.2, 5.0, 2.0),
        "dampen": LoopSpec("dampen", coupled, np.array([0.2, 0.2]), np.array([5.0, 0.0]), np.array([[2.0], [2.0]])),
        "cross_invert": LoopSpec("cross_invert", coupled, np.array([0.2, 0.2]), np.array([5.0, 1.0]),
                                 np.array([[1.0], [-1.0]])),
        "self_invert": LoopSpec("self_invert", self_invert_w, np.array([0.47, 0.47]), np.array([4.0, 0.68]),
                                np.array([[-3.36], [2.6]])),
        "self_invert_isolated": isolated_spec("self_invert_isolated", 0.47, 4.0, -3.36),
        "divergent": LoopSpec("divergent", np.array([[0.0, 1.0], [1.0, 0.0]]), np.array([0.0, 0.0]),
                              np.array([5.0, 5.0]), np.array([[1.0], [-1.0]])),
    }


# ------------------------------------------------------------------------------------------------
# Closed form (K -> infinity) recursion
# ------------------------------------------------------------------------------------------------

def gaussian_tilt(theta: np.ndarray, v: np.ndarray, beta: np.ndarray, targets: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Tilt of N(theta^T phi, v) by exp(beta r), r = -(y - a^T phi)^2 / 2 (README, "Method": K -> inf tilt).

    Per input the product of two Gaussians in y: ``v_bar = 1 / (1/v + beta)`` and
    ``theta_bar = v_bar (theta / v + beta a)``. Returns (theta_bar (N, d), v_bar (N,)).
    """
    v_bar = 1.0 / (1.0 / v + beta)
    theta_bar = v_bar[:, None] * (theta / v[:, None] + beta[:, None] * targets)
    return theta_bar, v_bar


def moment_refit(spec: LoopSpec, theta_bar: np.ndarray, v_bar: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Maximum-likelihood refit of model i on D_i = lambda_i p_data + sum_j W_ij C_j(p_j).

    Least squares on a mixture whose sources share the input law (E[phi phi^T] = I) gives the
    mixture of coefficients; the residual variance is the mixture of variances plus the spread of
    the sources' means around the refit (1-D: v' = lambda(s0^2 + mu0^2) + sum_j W_ij(v_j + m_j^2) - m'^2).
    """
    lam = spec.real_share
    theta_new = lam[:, None] * spec.real_theta[None, :] + spec.mixing @ theta_bar
    real_spread = np.sum((spec.real_theta[None, :] - theta_new) ** 2, axis=1)
    # spread[i, j] = |theta_bar_j - theta_new_i|^2
    spread = np.sum((theta_bar[None, :, :] - theta_new[:, None, :]) ** 2, axis=2)
    v_new = lam * (spec.real_var + real_spread) + np.sum(spec.mixing * (v_bar[None, :] + spread), axis=1)
    return theta_new, v_new


def analytic_step(spec: LoopSpec, theta: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One round F of the K -> infinity recursion: curate every model by its tilt, then refit."""
    theta_bar, v_bar = gaussian_tilt(theta, v, spec.beta, spec.targets)
    return moment_refit(spec, theta_bar, v_bar)


def alignment(theta: np.ndarray, v: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """A_i = E_{p_i}[r_i] = -(|theta_i - a_i|^2 + v_i) / 2 (README, "Method"; E[phi phi^T] = I)."""
    return -(np.sum((theta - targets) ** 2, axis=-1) + v) / 2.0


def real_data_state(spec: LoopSpec) -> tuple[np.ndarray, np.ndarray]:
    """Every model starts at the real-data distribution (the pre-trained state of the loop)."""
    return np.tile(spec.real_theta, (spec.n_models, 1)), np.full(spec.n_models, spec.real_var)


@dataclass(frozen=True)
class Trajectory:
    theta: np.ndarray  # (rounds + 1, N, d)
    v: np.ndarray  # (rounds + 1, N)
    alignment: np.ndarray  # (rounds + 1, N)


def iterate_analytic(spec: LoopSpec, rounds: int, start: tuple[np.ndarray, np.ndarray] | None = None
                     ) -> Trajectory:
    """``rounds`` rounds of F from ``start`` (default: the real-data state)."""
    theta, v = start if start is not None else real_data_state(spec)
    thetas, vs = [theta], [v]
    for _ in range(rounds):
        theta, v = analytic_step(spec, theta, v)
        thetas.append(theta)
        vs.append(v)
    theta_arr, v_arr = np.stack(thetas), np.stack(vs)
    return Trajectory(theta_arr, v_arr, alignment(theta_arr, v_arr, spec.targets[None]))


def _pack(theta: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.concatenate([theta.ravel(), v])


def _unpack(state: np.ndarray, n_models: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    return state[: n_models * dim].reshape(n_models, dim), state[n_models * dim:]


def jacobian_fd(spec: LoopSpec, theta: np.ndarray, v: np.ndarray, step: float = 1e-6) -> np.ndarray:
    """Central finite-difference Jacobian of F at (theta, v) over the packed state (theta, v)."""
    state = _pack(theta, v)
    size = state.size
    jac = np.zeros((size, size))
    for k in range(size):
        bump = np.zeros(size)
        bump[k] = step
        plus = _pack(*analytic_step(spec, *_unpack(state + bump, spec.n_models, spec.dim)))
        minus = _pack(*analytic_step(spec, *_unpack(state - bump, spec.n_models, spec.dim)))
        jac[:, k] = (plus - minus) / (2 * step)
    return jac


def spectral_radius(matrix: np.ndarray) -> float:
    return float(np.max(np.abs(np.linalg.eigvals(matrix))))


@dataclass(frozen=True)
class FixedPoint:
    """Result of iterating F (README, "Method": stable point)."""

    theta: np.ndarray
    v: np.ndarray
    alignment: np.ndarray
    radius: float  # spectral radius of the finite-difference Jacobian at the end point
    rounds: int  # rounds actually run
    diverged: bool  # flagged by ``divergence_flag``
    variance_trend: float  # v_min(last round) - v_min(round before): < 0 means still falling


def divergence_flag(radius: float, v_last: np.ndarray, v_before: np.ndarray, radius_max: float = 0.999,
                    collapse_var: float = 1e-2, blowup_var: float = 1e6) -> bool:
    """Acceptance check (a)4: non-convergent when the Jacobian radius is >= ``radius_max``, or a
    variance is below ``collapse_var`` and still decreasing (mass collapse), or above ``blowup_var``."""
    collapsing = bool(np.any((v_last < collapse_var) & (v_last < v_before)))
    return bool(radius >= radius_max or collapsing or np.any(v_last > blowup_var) or not np.all(np.isfinite(v_last)))


def collapse_margin(v_last: np.ndarray, v_before: np.ndarray, collapse_var: float = 1e-2) -> float:
    """How far a loop is inside the collapse criterion of :func:`divergence_flag` (claim C1d):
    min over models of max(v_last / ``collapse_var``, v_last / v_before). For positive variances it is
    below 1 exactly when some model's variance is below ``collapse_var`` and still falling, so a margin
    < 1 is that criterion, and its distance from 1 says by how much it holds."""
    v_last, v_before = np.asarray(v_last, dtype=float), np.asarray(v_before, dtype=float)
    return float(np.min(np.maximum(v_last / collapse_var, v_last / v_before)))


def fixed_point(spec: LoopSpec, max_rounds: int = 2000, tol: float = 0.0, jacobian_step: float = 1e-6
                ) -> FixedPoint:
    """Iterate F from the real-data state for ``max_rounds`` rounds (or until the state moves less
    than ``tol``), then measure the Jacobian radius and the divergence flag at the end point."""
    theta, v = real_data_state(spec)
    before = v
    rounds_run = 0
    while rounds_run < max_rounds:
        before = v
        new_theta, v = analytic_step(spec, theta, v)
        rounds_run += 1
        moved = max(np.max(np.abs(new_theta - theta)), np.max(np.abs(v - before)))
        theta = new_theta
        if moved < tol:
            break
    radius = spectral_radius(jacobian_fd(spec, theta, v, jacobian_step)) if np.all(v > 0) else float("inf")
    return FixedPoint(theta, v, alignment(theta, v, spec.targets), radius, rounds_run,
                      divergence_flag(radius, v, before), float(np.min(v) - np.min(before)))


def influence_matrix(spec: LoopSpec, step: float = 1e-3, max_rounds: int = 2000, tol: float = 1e-13
                     ) -> np.ndarray:
    """I_ij = dA_i* / dbeta_j by central differences of the fixed point (README, "Method": influence).

    Diagonal: self-influence; off-diagonal: cross-influence. A one-sided step is used where
    beta_j - step would be negative.
    """
    n = spec.n_models
    influence = np.zeros((n, n))
    for j in range(n):
        low = spec.beta.copy()
        high = spec.beta.copy()
        high[j] += step
        low[j] = max(0.0, low[j] - step)
        a_high = fixed_point(spec.with_beta(high), max_rounds, tol).alignment
        a_low = fixed_point(spec.with_beta(low), max_rounds, tol).alignment
        influence[:, j] = (a_high - a_low) / (high[j] - low[j])
    return influence


def chord_effect(spec: LoopSpec, model: int, beta_low: float, beta_high: float, max_rounds: int = 2000,
                 tol: float = 1e-13) -> np.ndarray:
    """(A*(beta_model = high) - A*(beta_model = low)) / (high - low) for every model: the finite
    (large-step) derivative that the sampled experiment can estimate (acceptance check (b)3)."""
    return (_alignment_at(spec, model, beta_high, max_rounds, tol)
            - _alignment_at(spec, model, beta_low, max_rounds, tol)) / (beta_high - beta_low)


def _alignment_at(spec: LoopSpec, model: int, beta: float, max_rounds: int, tol: float) -> np.ndarray:
    betas = spec.beta.copy()
    betas[model] = beta
    return fixed_point(spec.with_beta(betas), max_rounds, tol).alignment


# ------------------------------------------------------------------------------------------------
# Finite-K Bradley-Terry curation and the sample-based loop
# ------------------------------------------------------------------------------------------------

def bradley_terry_pick(rewards: np.ndarray, beta: float, rng: np.random.Generator) -> np.ndarray:
    """Index of the kept candidate per row: P(k) = softmax_k(beta r_k) (Ferbach et al., eq. BT).

    Sampled by the Gumbel-max trick: argmax_k(beta r_k + G_k), G_k ~ Gumbel(0, 1) i.i.d., drawn as
    G = -log E with E ~ Exp(1) in float32 (half the cost of float64 Gumbel draws; this is the hot loop).
    """
    exponential = rng.standard_exponential(rewards.shape, dtype=np.float32)
    # float32 draws can be exactly 0; log(0) = -inf would force that candidate.
    log_exponential = np.log(np.maximum(exponential, np.finfo(np.float32).tiny))
    return np.argmax(beta * rewards - log_exponential, axis=1)


def curate_gaussian(mean: np.ndarray, var: float, beta: float, target: np.ndarray, n_candidates: int,
                    rng: np.random.Generator) -> np.ndarray:
    """One Bradley-Terry curation step per row: K candidates y_k ~ N(mean, var) (``mean`` and
    ``target`` are per-row, shape (n,)), reward -(y - target)^2 / 2; returns the kept y (n,)."""
    if beta == 0.0:  # a uniform choice among i.i.d. candidates is one plain draw
        return mean + np.sqrt(var) * rng.standard_normal(mean.shape[0])
    # Candidates relative to the reward's centre, in float32 (the K x n draws dominate the run time).
    offset = (mean - target).astype(np.float32)
    noise = rng.standard_normal((mean.shape[0], n_candidates), dtype=np.float32)
    relative = offset[:, None] + np.float32(np.sqrt(var)) * noise
    picked = bradley_terry_pick(-0.5 * relative**2, beta, rng)
    return target + relative[np.arange(mean.shape[0]), picked].astype(np.float64)


@dataclass(frozen=True)
class RealData:
    """A finite real data set: features phi (n, d) and responses y (n,); subsampled every round."""

    phi: np.ndarray
    y: np.ndarray


def unconditional_real_data(size: int, mean: float, var: float, rng: np.random.Generator) -> RealData:
    return RealData(np.ones((size, 1)), mean + np.sqrt(var) * rng.standard_normal(size))


def conditional_real_data(size: int, theta: np.ndarray, var: float, rng: np.random.Generator) -> RealData:
    phi = rng.standard_normal((size, theta.size))
    return RealData(phi, phi @ theta + np.sqrt(var) * rng.standard_normal(size))


def draw_features(dim: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """phi(x) for fresh prompts: the constant 1 in the unconditional case, x ~ N(0, I) otherwise."""
    return np.ones((size, 1)) if dim == 1 else rng.standard_normal((size, dim))


Refit = Callable[[int, np.ndarray, np.ndarray], tuple[np.ndarray, float]]


def least_squares_refit(_model: int, phi: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Gaussian MLE of y | phi ~ N(theta^T phi, v): least squares and the mean squared residual."""
    theta, *_ = np.linalg.lstsq(phi, y, rcond=None)
    residual = y - phi @ theta
    return theta, float(np.mean(residual**2))


def training_mixture(spec: LoopSpec, model: int, pools: list[tuple[np.ndarray, np.ndarray]], real: RealData,
                     n_samples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """D_i: round(lambda_i n) real pairs and round(W_ij n) of model j's curated pairs, each drawn
    without replacement from its pool (every generator publishes n curated pairs per round)."""
    parts_phi, parts_y = [], []
    n_real = int(round(spec.real_share[model] * n_samples))
    if n_real:
        idx = rng.choice(real.y.size, size=n_real, replace=False)
        parts_phi.append(real.phi[idx])
        parts_y.append(real.y[idx])
    for source, (phi, y) in enumerate(pools):
        count = int(round(spec.mixing[model, source] * n_samples))
        if count:
            idx = rng.choice(y.size, size=min(count, y.size), replace=False)
            parts_phi.append(phi[idx])
            parts_y.append(y[idx])
    return np.concatenate(parts_phi), np.concatenate(parts_y)


def curated_pools(spec: LoopSpec, theta: np.ndarray, v: np.ndarray, n_candidates: int, n_samples: int,
                  rng: np.random.Generator, generate: Callable[[int, np.ndarray], np.ndarray] | None = None
                  ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every generator's curated output of one round: n prompts, K candidates each, one kept."""
    pools = []
    for j in range(spec.n_models):
        if spec.mixing[:, j].sum() == 0:
            pools.append((np.zeros((0, spec.dim)), np.zeros(0)))  # nobody trains on model j
            continue
        phi = draw_features(spec.dim, n_samples, rng)
        mean = phi @ theta[j] if generate is None else generate(j, phi)
        kept = curate_gaussian(mean, float(v[j]), float(spec.beta[j]), phi @ spec.targets[j], n_candidates, rng)
        pools.append((phi, kept))
    return pools


def iterate_sampled(spec: LoopSpec, rounds: int, n_candidates: int, n_samples: int, real: RealData,
                    rng: np.random.Generator, refit: Refit = least_squares_refit) -> Trajectory:
    """The sample-based loop: finite-K Bradley-Terry curation, n curated samples per model per round,
    MLE refit of each model on its mixture. Starts at the real-data state of ``spec``."""
    theta, v = real_data_state(spec)
    thetas, vs = [theta], [v]
    for _ in range(rounds):
        pools = curated_pools(spec, theta, v, n_candidates, n_samples, rng)
        fits = [refit(i, *training_mixture(spec, i, pools, real, n_samples, rng)) for i in range(spec.n_models)]
        theta = np.stack([f[0] for f in fits])
        v = np.array([f[1] for f in fits])
        thetas.append(theta)
        vs.append(v)
    theta_arr, v_arr = np.stack(thetas), np.stack(vs)
    return Trajectory(theta_arr, v_arr, alignment(theta_arr, v_arr, spec.targets[None]))


def stationary_alignment(trajectory: Trajectory, burn_in: int) -> np.ndarray:
    """A_i at the (noisy) fixed point: the mean of A_i(t) over the rounds after ``burn_in``."""
    return trajectory.alignment[burn_in + 1:].mean(axis=0)


def curated_moments(mean: float, var: float, beta: float, target: float, n_candidates: int, draws: int,
                    rng: np.random.Generator, chunk: int = 50_000) -> tuple[float, float]:
    """Mean and variance of one finite-K curation step from N(mean, var) (acceptance check (a)5)."""
    kept = []
    for start in range(0, draws, chunk):
        size = min(chunk, draws - start)
        kept.append(curate_gaussian(np.full(size, mean), var, beta, np.full(size, target), n_candidates, rng))
    values = np.concatenate(kept)
    return float(values.mean()), float(values.var())


# ------------------------------------------------------------------------------------------------
# Neural refit (README, "Method": neural variant) on the conditional task
# ------------------------------------------------------------------------------------------------

class NeuralGaussian:
    """y | x ~ N(f(x), exp(log_var)): a 2-layer tanh MLP mean and one learned log-variance.

    The output layer starts at zero and the log-variance at log(real_var), so a fresh model is the
    real-data state of a loop whose real coefficients are zero (f = 0). Refits warm-start from the
    previous round's weights, as retraining a deployed generator would.
    """

    def __init__(self, dim: int, hidden: int, real_var: float, seed: int) -> None:
        import torch

        from tasks.common.seeding import torch_init_seed

        with torch_init_seed(seed):
            self.net = torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.Tanh(),
                                           torch.nn.Linear(hidden, hidden), torch.nn.Tanh(),
                                           torch.nn.Linear(hidden, 1))
        torch.nn.init.zeros_(self.net[-1].weight)
        torch.nn.init.zeros_(self.net[-1].bias)
        self.log_var = torch.nn.Parameter(torch.tensor(float(np.log(real_var))))

    def parameters(self) -> list:
        return [*self.net.parameters(), self.log_var]

    def mean(self, phi: np.ndarray) -> np.ndarray:
        import torch

        with torch.no_grad():
            return self.net(torch.from_numpy(phi).float()).squeeze(-1).double().numpy()

    @property
    def variance(self) -> float:
        return float(np.exp(self.log_var.detach().item()))

    def fit(self, phi: np.ndarray, y: np.ndarray, steps: int, lr: float) -> float:
        """Full-batch Adam on the Gaussian negative log-likelihood; returns the final NLL."""
        import torch

        # float32: about twice as fast as float64 on CPU, and the loop's noise is far above its error.
        inputs, targets = torch.from_numpy(phi).float(), torch.from_numpy(y).float()
        optimizer = torch.optim.Adam(self.parameters(), lr=lr)
        loss = torch.tensor(float("nan"))
        for _ in range(steps):
            residual = targets - self.net(inputs).squeeze(-1)
            loss = 0.5 * (self.log_var + residual.pow(2).mean() * torch.exp(-self.log_var))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return float(loss.detach())

    def alignment(self, phi_eval: np.ndarray, target: np.ndarray) -> float:
        """A = -(E_x (f(x) - a^T x)^2 + v) / 2 on a fixed evaluation sample of inputs."""
        return -(float(np.mean((self.mean(phi_eval) - phi_eval @ target) ** 2)) + self.variance) / 2.0


def iterate_neural(spec: LoopSpec, rounds: int, n_candidates: int, n_samples: int, real: RealData,
                   rng: np.random.Generator, hidden: int, steps: int, lr: float, seed: int, eval_size: int = 4096,
                   progress: Callable[[int], None] | None = None) -> tuple[np.ndarray, list[NeuralGaussian]]:
    """The sample-based loop of ``iterate_sampled`` with neural generators on the conditional task.

    Returns the alignment trajectory (rounds + 1, N) and the final models.
    """
    if np.any(spec.real_theta != 0):
        raise ValueError("iterate_neural: the neural generators start at f = 0, so real_theta must be 0")
    models = [NeuralGaussian(spec.dim, hidden, spec.real_var, seed * 100 + i) for i in range(spec.n_models)]
    phi_eval = draw_features(spec.dim, eval_size, rng)

    def current_alignment() -> np.ndarray:
        return np.array([mdl.alignment(phi_eval, spec.targets[i]) for i, mdl in enumerate(models)])

    history = [current_alignment()]
    for round_index in range(rounds):
        v = np.array([mdl.variance for mdl in models])
        pools = curated_pools(spec, np.zeros((spec.n_models, spec.dim)), v, n_candidates, n_samples, rng,
                              generate=lambda j, phi: models[j].mean(phi))
        for i, mdl in enumerate(models):
            mdl.fit(*training_mixture(spec, i, pools, real, n_samples, rng), steps=steps, lr=lr)
        history.append(current_alignment())
        if progress is not None:
            progress(round_index + 1)
    return np.stack(history), models


# ------------------------------------------------------------------------------------------------
# Configurations drawn from a fixed prior, and the K -> infinity recursion over a batch of them
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigPrior:
    """The distribution of two-model 1-D configurations of the survey (README, "Design of the survey";
    fixed before the run). Per configuration, independently:

    - lambda_i ~ U[real_share_low, real_share_high] per model;
    - (W_i1, W_i2) = (1 - lambda_i)(u_i, 1 - u_i), u_i ~ U[0, 1] (a flat Dirichlet split of the synthetic share);
    - mu_i ~ U[-target_range, target_range] per model (real data N(0, 1));
    - beta_2 ~ U[0, beta2_high];
    - beta_1 low ~ U[0, beta1_low_high], beta_1 high = beta_1 low + beta1_step.
    """

    real_share_low: float = 0.05
    real_share_high: float = 0.6
    target_range: float = 4.0
    beta2_high: float = 2.0
    beta1_low_high: float = 1.0
    beta1_step: float = 3.0


@dataclass(frozen=True)
class ConfigBatch:
    """B two-model configurations: mixing (B, 2, 2), real_share (B, 2), targets (B, 2), beta2 (B,), and the
    two ends of the beta_1 range, beta1_low (B,) and beta1_high (B,)."""

    mixing: np.ndarray
    real_share: np.ndarray
    targets: np.ndarray
    beta2: np.ndarray
    beta1_low: np.ndarray
    beta1_high: np.ndarray

    def __len__(self) -> int:
        return self.targets.shape[0]

    def spec(self, index: int, beta1: float) -> LoopSpec:
        """Configuration ``index`` as a :class:`LoopSpec` with beta_1 = ``beta1``."""
        return LoopSpec(f"prior_{index}", self.mixing[index], self.real_share[index],
                        np.array([beta1, self.beta2[index]]), self.targets[index][:, None])


def draw_configs(prior: ConfigPrior, size: int, rng: np.random.Generator) -> ConfigBatch:
    """``size`` independent configurations from ``prior`` (one fixed order of draws, so a seed fixes them)."""
    real_share = rng.uniform(prior.real_share_low, prior.real_share_high, size=(size, 2))
    split = rng.uniform(0.0, 1.0, size=(size, 2))
    mixing = (1.0 - real_share)[:, :, None] * np.stack([split, 1.0 - split], axis=2)
    targets = rng.uniform(-prior.target_range, prior.target_range, size=(size, 2))
    beta2 = rng.uniform(0.0, prior.beta2_high, size=size)
    beta1_low = rng.uniform(0.0, prior.beta1_low_high, size=size)
    return ConfigBatch(mixing, real_share, targets, beta2, beta1_low, beta1_low + prior.beta1_step)


def batched_fixed_alignment(mixing: np.ndarray, real_share: np.ndarray, beta: np.ndarray, targets: np.ndarray,
                            rounds: int, real_mean: float = 0.0, real_var: float = 1.0
                            ) -> tuple[np.ndarray, np.ndarray]:
    """The 1-D K -> infinity recursion (``analytic_step``) run for ``rounds`` rounds on a batch of B
    configurations at once, from the real-data state: mixing (B, N, N), real_share/beta/targets (B, N).

    Per round: tilt v_bar = 1/(1/v + beta), m_bar = v_bar(m/v + beta mu); refit m' = lambda mu_0 + W m_bar,
    v' = lambda(s0^2 + mu_0^2) + W(v_bar + m_bar^2) - m'^2 (README, "Method"). Returns (A (B, N), the
    largest change of the state over the last round (B,)), the latter to tell converged configurations."""
    mean = np.full(real_share.shape, real_mean)
    var = np.full(real_share.shape, real_var)
    moved = np.full(real_share.shape[0], np.inf)
    for _ in range(rounds):
        tilted_var = 1.0 / (1.0 / var + beta)
        tilted_mean = tilted_var * (mean / var + beta * targets)
        new_mean = real_share * real_mean + np.einsum("bij,bj->bi", mixing, tilted_mean)
        second = real_share * (real_var + real_mean**2) + np.einsum("bij,bj->bi", mixing, tilted_var + tilted_mean**2)
        new_var = second - new_mean**2
        moved = np.maximum(np.abs(new_mean - mean), np.abs(new_var - var)).max(axis=1)
        mean, var = new_mean, new_var
    return -((mean - targets) ** 2 + var) / 2.0, moved


def survey_chords(batch: ConfigBatch, rounds: int) -> dict[str, np.ndarray]:
    """K -> infinity chords of every configuration of ``batch``: ΔA_i/Δbeta_1 of both coupled models
    (``dA1``, ``dA2``, shape (B,)), the chord of model 1's isolated counterpart (W = [[1 - lambda_1]], same
    lambda_1 and mu_1; ``isolated_dA``), and the largest last-round state change of any of the runs
    (``moved``: a configuration not at its fixed point after ``rounds`` rounds is not counted)."""
    step = batch.beta1_high - batch.beta1_low
    ends, moved = [], []
    for beta1 in (batch.beta1_low, batch.beta1_high):
        beta = np.stack([beta1, batch.beta2], axis=1)
        coupled, coupled_moved = batched_fixed_alignment(batch.mixing, batch.real_share, beta, batch.targets, rounds)
        alone, alone_moved = batched_fixed_alignment((1.0 - batch.real_share[:, :1])[:, :, None],
                                                     batch.real_share[:, :1], beta1[:, None], batch.targets[:, :1],
                                                     rounds)
        ends.append((coupled, alone[:, 0]))
        moved += [coupled_moved, alone_moved]
    (low, alone_low), (high, alone_high) = ends
    return {"dA1": (high[:, 0] - low[:, 0]) / step, "dA2": (high[:, 1] - low[:, 1]) / step,
            "isolated_dA": (alone_high - alone_low) / step, "moved": np.max(moved, axis=0)}


def self_inverts(coupled_dA1: np.ndarray, isolated_dA: np.ndarray) -> np.ndarray:
    """Self-inversion (claim C4f's event): curating model 1 harder lowers its own alignment in the coupled
    loop (ΔA_1 < 0) although the same curation improves it when it is alone (isolated ΔA > 0)."""
    return (np.asarray(coupled_dA1) < 0) & (np.asarray(isolated_dA) > 0)


# ------------------------------------------------------------------------------------------------
# Gaussian-mixture generators (1-D), refit by EM: a model class that can represent a multimodal mix
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Mixture1D:
    """A 1-D Gaussian mixture: weights (G,), means (G,), variances (G,)."""

    weights: np.ndarray
    means: np.ndarray
    variances: np.ndarray

    def sample(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Draws of the given shape: a component by its weight, then its Gaussian."""
        cumulative = np.cumsum(self.weights)
        component = np.minimum(np.searchsorted(cumulative / cumulative[-1], rng.random(shape), side="right"),
                               self.weights.size - 1)
        return self.means[component] + np.sqrt(self.variances[component]) * rng.standard_normal(shape)

    def alignment(self, target: float) -> float:
        """A = E_p[-(y - mu)^2 / 2] = -sum_g w_g((m_g - mu)^2 + v_g) / 2."""
        return float(-np.sum(self.weights * ((self.means - target) ** 2 + self.variances)) / 2.0)


def _component_log_density(y: np.ndarray, mixture: Mixture1D) -> np.ndarray:
    """log(w_g N(y_n; m_g, v_g)), shape (n, G)."""
    return (-0.5 * (y[:, None] - mixture.means) ** 2 / mixture.variances
            - 0.5 * np.log(2 * np.pi * mixture.variances) + np.log(np.maximum(mixture.weights, 1e-300)))


def mixture_log_likelihood(y: np.ndarray, mixture: Mixture1D) -> float:
    """Mean log-density of ``y`` under ``mixture`` (log-sum-exp over components)."""
    log_density = _component_log_density(np.asarray(y, dtype=float), mixture)
    top = log_density.max(axis=1)
    return float(np.mean(top + np.log(np.exp(log_density - top[:, None]).sum(axis=1))))


def fit_mixture_em(y: np.ndarray, components: int, iterations: int, start: Mixture1D | None = None,
                   var_floor: float = 1e-4) -> Mixture1D:
    """Maximum likelihood of a ``components``-Gaussian mixture on ``y`` by EM (Dempster et al. 1977).

    Start: ``start`` when it has ``components`` components (a warm start from the previous round, as
    retraining a deployed generator would), otherwise means at the quantiles (g + 1/2)/G of ``y``, every
    variance var(y), equal weights. Then ``iterations`` E/M steps: responsibilities
    r_ng ∝ w_g N(y_n; m_g, v_g); w_g = mean_n r_ng, m_g = sum_n r_ng y_n / sum_n r_ng,
    v_g = sum_n r_ng (y_n - m_g)^2 / sum_n r_ng (floored at ``var_floor``). With one component this is the
    Gaussian MLE (mean, mean squared deviation)."""
    y = np.asarray(y, dtype=float)
    if start is not None and start.weights.size == components:
        weights, means, variances = start.weights, start.means, start.variances
    else:
        means = np.quantile(y, (np.arange(components) + 0.5) / components)
        variances = np.full(components, max(float(y.var()), var_floor))
        weights = np.full(components, 1.0 / components)
    for _ in range(iterations):
        log_density = _component_log_density(y, Mixture1D(weights, means, variances))
        log_density -= log_density.max(axis=1, keepdims=True)
        resp = np.exp(log_density)
        resp /= resp.sum(axis=1, keepdims=True)
        mass = resp.sum(axis=0)
        keep = mass > 1e-9 * y.size
        weights = mass / y.size
        means = np.where(keep, (resp * y[:, None]).sum(axis=0) / np.maximum(mass, 1e-300), means)
        spread = (resp * (y[:, None] - means) ** 2).sum(axis=0) / np.maximum(mass, 1e-300)
        variances = np.where(keep, np.maximum(spread, var_floor), variances)
    return Mixture1D(weights, means, variances)


def curate_mixture(mixture: Mixture1D, beta: float, target: float, n_candidates: int, n_samples: int,
                   rng: np.random.Generator) -> np.ndarray:
    """One Bradley-Terry curation step from a mixture generator: K candidates per prompt, keep one with
    probability softmax_k(beta r(y_k)), r = -(y - mu)^2 / 2 (``bradley_terry_pick``)."""
    if beta == 0.0:
        return mixture.sample((n_samples,), rng)
    candidates = mixture.sample((n_samples, n_candidates), rng)
    picked = bradley_terry_pick(-0.5 * (candidates - target) ** 2, beta, rng)
    return candidates[np.arange(n_samples), picked]


@dataclass(frozen=True)
class MixtureTrajectory:
    """The mixture loop: A_i(t) per round (rounds + 1, N), and per model (N,) the mean log-likelihood gain
    of the last round's fitted mixture over the single-Gaussian MLE on the same training data (how much
    of the training mix a single Gaussian misses), the mean log-likelihood change one more EM step would make
    on that data (``em_step_gain``: how far the last refit is from an EM fixed point), and the size of that
    data (``fit_size``, for the BIC penalty)."""

    alignment: np.ndarray
    loglik_gain: np.ndarray
    em_step_gain: np.ndarray
    fit_size: int


def em_step_gain(y: np.ndarray, mixture: Mixture1D) -> float:
    """How far a fit is from an EM fixed point: the mean log-likelihood change on ``y`` of one more E/M step
    from ``mixture`` (>= 0 by EM's monotonicity, Dempster et al. 1977 Theorem 1; 0 at a fixed point)."""
    return mixture_log_likelihood(y, fit_mixture_em(y, mixture.weights.size, 1, start=mixture)) - \
        mixture_log_likelihood(y, mixture)


def bic_penalty_per_sample(components: int, n: int) -> float:
    """BIC's penalty (Schwarz 1978) of a ``components``-Gaussian 1-D mixture over one Gaussian, per sample:
    (extra free parameters) ln n / (2 n), with 3 G - 1 parameters (G - 1 weights, G means, G variances)
    against 2, i.e. 3 (G - 1) ln n / (2 n). A mean log-likelihood gain above it is not explained by the
    extra parameters alone."""
    if components < 1 or n < 2:
        raise ValueError(f"bic_penalty_per_sample: components >= 1 and n >= 2 needed, got {components}, {n}")
    return 3 * (components - 1) * float(np.log(n)) / (2 * n)


def iterate_mixture(spec: LoopSpec, rounds: int, n_candidates: int, n_samples: int, real: RealData,
                    rng: np.random.Generator, components: int, em_iterations: int) -> MixtureTrajectory:
    """The sample-based loop of ``iterate_sampled`` (1-D) with Gaussian-mixture generators refit by EM on
    their training mixture D_i (``training_mixture``), warm-started from the previous round's fit; every
    model starts at the real data N(mu_0, s0^2) (one component, so the first refit starts at quantiles)."""
    if spec.dim != 1:
        raise ValueError(f"iterate_mixture: 1-D configurations only, got dim {spec.dim}")
    start = Mixture1D(np.ones(1), spec.real_theta.copy(), np.array([spec.real_var]))
    models = [start] * spec.n_models
    targets = spec.targets[:, 0]
    history = [[m.alignment(t) for m, t in zip(models, targets)]]
    gains = np.zeros(spec.n_models)
    ones = np.ones((n_samples, 1))
    for _ in range(rounds):
        pools = []
        for j in range(spec.n_models):
            if spec.mixing[:, j].sum() == 0:
                pools.append((np.zeros((0, 1)), np.zeros(0)))
                continue
            pools.append((ones, curate_mixture(models[j], float(spec.beta[j]), float(targets[j]), n_candidates,
                                               n_samples, rng)))
        data = [training_mixture(spec, i, pools, real, n_samples, rng)[1] for i in range(spec.n_models)]
        models = [fit_mixture_em(y, components, em_iterations, start=model) for y, model in zip(data, models)]
        history.append([m.alignment(t) for m, t in zip(models, targets)])
    em_gains = np.zeros(spec.n_models)
    fit_size = 0
    if rounds:
        gains = np.array([mixture_log_likelihood(y, model) - mixture_log_likelihood(y, fit_mixture_em(y, 1, 1))
                          for y, model in zip(data, models)])
        em_gains = np.array([em_step_gain(y, model) for y, model in zip(data, models)])
        fit_size = int(data[0].size)
    return MixtureTrajectory(np.array(history), gains, em_gains, fit_size)
