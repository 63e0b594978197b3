"""Constrained unlearning in diffusion models: KL and likelihood constraints, solved primal-dual.

Khalafi, Ribeiro, Ding, "Unlearning in Diffusion Models: A Unified Framework with KL Divergence and
Likelihood Constraints", ICML 2026 (arXiv 2605.30825). Pure library: numpy, scipy, torch; no pipeline
or tracking imports.

q is the pretrained distribution, q_u the distribution to unlearn, lambda >= 0 the dual variable.

* RU (reverse KL, concept unlearning):  min_p KL(p||q)  s.t. KL(p||q_u) >= b.
  Lagrangian minimiser  p* ∝ (q / q_u^lambda)^(1 / (1 - lambda)), lambda < 1 (:func:`ru_target`).
  Score form: grad log p* = grad log q - eta (grad log q_u - grad log q), eta = lambda / (1 - lambda), which is
  ESD's negative-guidance target (ESD's eta = 2 <=> lambda = 2/3) (:func:`eta_from_lambda`, :func:`ru_score`).
* FU (forward KL, data unlearning):  min_p KL(q||p)  s.t. KL(q_u||p) >= b.
  p* ∝ (q - lambda q_u)_+ (:func:`fu_target`); with q = (1 - w) q_r + w q_u and lambda = w, p* = q_r.
* LU (likelihood, the paper's new formulation):  min_p KL(p||q)  s.t. E_p[q_u(x)] <= eps.
  p* ∝ q exp(-lambda q_u) (:func:`lu_target`).
* Primal-dual: a primal step on the Lagrangian at the current lambda, then projected dual ascent
  lambda <- [lambda + eta_lambda g]_+ on the violation g = b - KL(p||q_u) (RU), b - KL(q_u||p) (FU),
  E_p[q_u] - eps (LU) (:func:`primal_dual_grid` on a density grid, :func:`primal_dual_unlearn` on a DDPM).

The closed-form targets are the project's derivation from the stated problems (verified numerically by the
tests); "forget mass", "retained-region KL" and the 1-D reference problem are the project's definitions (README,
"What is measured").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import brentq
from scipy.spatial import cKDTree
from scipy.special import digamma

FORMULATIONS = ("ru", "fu", "lu")
# Upper end of lambda searched for each formulation: RU needs lambda < 1, FU lambda below the
# forget component's weight (above it the target stops changing), LU is unbounded.
LAMBDA_SEARCH_MAX = {"ru": 1.0 - 1e-9, "fu": 1.0, "lu": 1e4}

# ------------------------------------------------------------------------------------------------
# ESD correspondence (RU, score form)
# ------------------------------------------------------------------------------------------------


def eta_from_lambda(lam: float) -> float:
    """Guidance scale of the RU optimum: eta = lambda / (1 - lambda), defined for 0 <= lambda < 1."""
    if not 0.0 <= lam < 1.0:
        raise ValueError(f"lambda must be in [0, 1) for RU, got {lam}")
    return lam / (1.0 - lam)


def lambda_from_eta(eta: float) -> float:
    """Inverse of :func:`eta_from_lambda`: lambda = eta / (1 + eta)."""
    if eta < 0:
        raise ValueError(f"eta must be >= 0, got {eta}")
    return eta / (1.0 + eta)


def ru_score(grad_log_q: np.ndarray, grad_log_qu: np.ndarray, lam: float) -> np.ndarray:
    """Score of the RU optimum, grad log q - eta (grad log q_u - grad log q) (single constraint)."""
    eta = eta_from_lambda(lam)
    return grad_log_q - eta * (grad_log_qu - grad_log_q)


# ------------------------------------------------------------------------------------------------
# Densities on a regular grid
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grid:
    """Cell centres of a regular grid on [low, high]^dim; ``cell`` is the measure of one cell."""

    points: np.ndarray  # (n, dim)
    cell: float
    shape: tuple[int, ...]

    @classmethod
    def regular(cls, low: float, high: float, size: int, dim: int) -> Grid:
        if size < 2 or high <= low or dim < 1:
            raise ValueError(f"grid needs size >= 2, high > low, dim >= 1 (got {size}, {low}, {high}, {dim})")
        axis = np.linspace(low, high, size)
        step = axis[1] - axis[0]
        mesh = np.meshgrid(*([axis] * dim), indexing="ij")
        return cls(np.stack([m.ravel() for m in mesh], axis=1), float(step**dim), (size,) * dim)

    def ball(self, centre: np.ndarray, radius: float) -> np.ndarray:
        """Boolean mask of the cells whose centre is strictly inside the ball."""
        return np.linalg.norm(self.points - np.asarray(centre)[None, :], axis=1) < radius


def normalise(density: np.ndarray, cell: float) -> np.ndarray:
    """Scale a non-negative array so that sum(density) * cell = 1."""
    total = float(density.sum()) * cell
    if not total > 0 or not math.isfinite(total):
        raise ValueError(f"cannot normalise a density of total mass {total}")
    return density / total


def normalise_log(log_density: np.ndarray, cell: float) -> np.ndarray:
    """Density exp(log_density) normalised on the grid, computed without overflow."""
    shifted = np.exp(log_density - np.max(log_density))
    return normalise(shifted, cell)


def mass(p: np.ndarray, mask: np.ndarray, cell: float) -> float:
    """Probability of the region ``mask`` under the grid density p."""
    return float(p[mask].sum() * cell)


def expectation(p: np.ndarray, values: np.ndarray, cell: float) -> float:
    return float((p * values).sum() * cell)


def kl_density(p: np.ndarray, log_ref: np.ndarray, cell: float) -> float:
    """KL(p || r) = sum p (log p - log r) cell with 0 log 0 = 0; ``log_ref`` is log r (may be -inf)."""
    support = p > 0
    with np.errstate(divide="ignore"):
        terms = p[support] * (np.log(p[support]) - log_ref[support])
    return float(terms.sum() * cell)


def tv_distance(p: np.ndarray, r: np.ndarray, cell: float) -> float:
    return float(0.5 * np.abs(p - r).sum() * cell)


def retained_kl(p: np.ndarray, q: np.ndarray, forget_mask: np.ndarray, cell: float) -> float:
    """KL(p_R || q_R): p and q renormalised on the complement R of the forget region."""
    keep = ~forget_mask
    p_r, q_r = normalise(p[keep], cell), normalise(q[keep], cell)
    with np.errstate(divide="ignore"):
        return kl_density(p_r, np.log(q_r), cell)


# ------------------------------------------------------------------------------------------------
# Closed-form Lagrangian minimisers (the "targets")
# ------------------------------------------------------------------------------------------------


def _constraints(log_qu: np.ndarray, lam: float | Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(k, n) log q_u^i and (k,) lambda_i; a single constraint may be passed unstacked."""
    log_qu = np.atleast_2d(log_qu)
    lam = np.atleast_1d(np.asarray(lam, dtype=np.float64))
    if lam.shape != (log_qu.shape[0],):
        raise ValueError(f"need one lambda per constraint: {lam.shape[0]} lambdas, {log_qu.shape[0]} constraints")
    if np.any(lam < 0):
        raise ValueError(f"dual variables must be >= 0, got {lam.tolist()}")
    return log_qu, lam


def ru_log_target(log_q: np.ndarray, log_qu: np.ndarray, lam: float | Sequence[float]) -> np.ndarray:
    """Unnormalised log p*_RU = (log q - sum_i lambda_i log q_u^i) / (1 - sum_i lambda_i)."""
    log_qu, lam = _constraints(log_qu, lam)
    total = float(lam.sum())
    if total >= 1.0:
        raise ValueError(f"RU needs sum(lambda) < 1 (the Lagrangian is unbounded below otherwise), got {total}")
    return (log_q - lam @ log_qu) / (1.0 - total)


def fu_unnormalised(q: np.ndarray, qu: np.ndarray, lam: float | Sequence[float]) -> np.ndarray:
    """(q - sum_i lambda_i q_u^i)_+ (FU optimum before normalisation)."""
    qu = np.atleast_2d(qu)
    lam = np.atleast_1d(np.asarray(lam, dtype=np.float64))
    if lam.shape != (qu.shape[0],) or np.any(lam < 0):
        raise ValueError(f"need one non-negative lambda per constraint, got {lam.tolist()}")
    return np.clip(q - lam @ qu, 0.0, None)


def lu_log_target(log_q: np.ndarray, qu: np.ndarray, lam: float | Sequence[float]) -> np.ndarray:
    """Unnormalised log p*_LU = log q - sum_i lambda_i q_u^i(x)."""
    qu = np.atleast_2d(qu)
    lam = np.atleast_1d(np.asarray(lam, dtype=np.float64))
    if lam.shape != (qu.shape[0],) or np.any(lam < 0):
        raise ValueError(f"need one non-negative lambda per constraint, got {lam.tolist()}")
    return log_q - lam @ qu


@dataclass(frozen=True)
class GridProblem:
    """q and one forget distribution q_u as log densities on a grid, plus the forget region."""

    log_q: np.ndarray
    log_qu: np.ndarray
    cell: float
    forget_mask: np.ndarray

    @property
    def q(self) -> np.ndarray:
        return np.exp(self.log_q)

    @property
    def qu(self) -> np.ndarray:
        return np.exp(self.log_qu)


def ru_target(problem: GridProblem, lam: float) -> np.ndarray:
    return normalise_log(ru_log_target(problem.log_q, problem.log_qu, lam), problem.cell)


def fu_target(problem: GridProblem, lam: float) -> np.ndarray:
    return normalise(fu_unnormalised(problem.q, problem.qu, lam), problem.cell)


def lu_target(problem: GridProblem, lam: float) -> np.ndarray:
    return normalise_log(lu_log_target(problem.log_q, problem.qu, lam), problem.cell)


TARGETS: dict[str, Callable[[GridProblem, float], np.ndarray]] = {"ru": ru_target, "fu": fu_target,
                                                                   "lu": lu_target}


def target(formulation: str, problem: GridProblem, lam: float) -> np.ndarray:
    """Normalised Lagrangian minimiser p*_lambda of one formulation on the grid."""
    if formulation not in TARGETS:
        raise ValueError(f"formulation must be one of {FORMULATIONS}, got {formulation!r}")
    return TARGETS[formulation](problem, lam)


def constraint_value(formulation: str, p: np.ndarray, problem: GridProblem) -> float:
    """KL(p||q_u) (RU), KL(q_u||p) (FU) or E_p[q_u(x)] (LU) on the grid."""
    if formulation == "ru":
        return kl_density(p, problem.log_qu, problem.cell)
    if formulation == "fu":
        with np.errstate(divide="ignore"):
            return kl_density(problem.qu, np.log(p), problem.cell)
    if formulation == "lu":
        return expectation(p, problem.qu, problem.cell)
    raise ValueError(f"formulation must be one of {FORMULATIONS}, got {formulation!r}")


def violation(formulation: str, value: float, bound: float) -> float:
    """g >= 0 means the constraint is violated: b - KL for RU/FU (KL must reach b), value - eps for LU."""
    return value - bound if formulation == "lu" else bound - value


def lambda_for_forget_mass(formulation: str, problem: GridProblem, forget_mass: float) -> float:
    """The lambda* whose closed-form target puts exactly ``forget_mass`` on the forget region (bisection)."""
    start = mass(normalise(problem.q, problem.cell), problem.forget_mask, problem.cell)
    if not 0 < forget_mass < start:
        raise ValueError(f"target forget mass must be in (0, {start:.4f}) (the mass under q), got {forget_mass}")

    def gap(lam: float) -> float:
        return mass(target(formulation, problem, lam), problem.forget_mask, problem.cell) - forget_mass

    high = LAMBDA_SEARCH_MAX[formulation]
    if formulation == "fu":  # beyond the first lambda that empties a cell the gap is flat; bracket first
        high = float(np.min(problem.q[problem.qu > 0] / problem.qu[problem.qu > 0]))
    if gap(high) > 0:
        raise ValueError(f"{formulation}: no lambda <= {high:g} reaches forget mass {forget_mass}")
    return float(brentq(gap, 0.0, high, xtol=1e-14, rtol=1e-12, maxiter=500))


def requested_mass_reference(problem: GridProblem, forget_mass: float) -> np.ndarray:
    """q with its forget-region mass scaled to ``forget_mass`` (and the rest scaled up to 1 - forget_mass).

    The user's request ("keep ``forget_mass`` of the concept") turned into a distribution without solving the
    problem: the threshold of each formulation is this reference's constraint value
    (:func:`bound_for_forget_mass`), so the constrained optimum's forget mass is an outcome, not an input."""
    q = normalise(problem.q, problem.cell)
    start = mass(q, problem.forget_mask, problem.cell)
    if not 0 < forget_mass < start:
        raise ValueError(f"requested forget mass must be in (0, {start:.4f}) (the mass under q), got {forget_mass}")
    scale = np.where(problem.forget_mask, forget_mass / start, (1.0 - forget_mass) / (1.0 - start))
    return q * scale


def bound_for_forget_mass(formulation: str, problem: GridProblem, forget_mass: float) -> float:
    """Threshold b (RU, FU) or eps (LU) from the requested forget mass: the constraint's value at
    :func:`requested_mass_reference`, never at the constrained optimum."""
    return constraint_value(formulation, requested_mass_reference(problem, forget_mass), problem)


def lambda_for_bound(formulation: str, problem: GridProblem, bound: float) -> float:
    """The lambda whose closed-form Lagrangian minimiser meets the constraint with equality (bisection): the
    optimal dual variable of the constrained problem with threshold ``bound`` (KKT: active constraint)."""

    def gap(lam: float) -> float:
        return violation(formulation, constraint_value(formulation, target(formulation, problem, lam), problem),
                         bound)

    high = LAMBDA_SEARCH_MAX[formulation]
    if formulation == "fu":
        high = float(np.min(problem.q[problem.qu > 0] / problem.qu[problem.qu > 0]))
    if formulation == "ru":
        high = 0.999
    if gap(0.0) <= 0:
        raise ValueError(f"{formulation}: the constraint (bound {bound:g}) already holds at lambda = 0")
    if gap(high) > 0:
        raise ValueError(f"{formulation}: no lambda <= {high:g} meets the bound {bound:g}")
    return float(brentq(gap, 0.0, high, xtol=1e-14, rtol=1e-12, maxiter=500))


def normalised_dual_lr(dual_step: float, start_violation: float) -> float:
    """Learning rate of :func:`projected_dual_ascent` for one dual step rule shared by every formulation.

    The constraint is measured in units of its violation at the start, g~ = g / |g_0|, and its multiplier
    nu = lambda |g_0| (then nu g~ = lambda g: the same Lagrangian) is updated by nu <- [nu + dual_step g~]_+.
    In lambda that is lambda <- [lambda + dual_step g / g_0^2]_+. nu is in the objective's units (nats), so
    one ``dual_step`` serves RU, FU and LU, whose lambdas differ by orders of magnitude."""
    if dual_step <= 0 or not start_violation:
        raise ValueError(f"need dual_step > 0 and a non-zero start violation (got {dual_step}, {start_violation})")
    return dual_step / start_violation**2


# ------------------------------------------------------------------------------------------------
# Primal-dual on a density grid (exact; Stage A)
# ------------------------------------------------------------------------------------------------


def projected_dual_ascent(lam: float, g: float, lr: float) -> float:
    """lambda <- [lambda + lr g]_+ : gradient ascent on the dual function, projected on lambda >= 0."""
    return max(0.0, lam + lr * g)


DualUpdate = Callable[[float, float, float], float]


def primal_step(formulation: str, p: np.ndarray, lam: float, problem: GridProblem, step: float) -> np.ndarray:
    """One primal step on the Lagrangian L(p, lambda) at fixed lambda.

    RU and LU: mirror descent (exponentiated gradient) on the simplex, log p <- log p - step * dL/dp,
    with dL/dp = (1 - lambda) log p - log q + lambda log q_u (RU) and log p - log q + lambda q_u (LU), up to
    constants removed by normalisation. FU: an averaged step p <- (1 - step) p + step p_BR towards the
    Lagrangian's minimiser (q - lambda q_u)_+ (for -sum (q - lambda q_u) log p this is the EM step; the
    exponentiated gradient of the forward KL is ill-conditioned where p is small).
    """
    if formulation == "fu":
        return (1.0 - step) * p + step * fu_target(problem, lam)
    with np.errstate(divide="ignore"):
        log_p = np.log(p)
    if formulation == "ru":
        grad = (1.0 - lam) * log_p - problem.log_q + lam * problem.log_qu
    elif formulation == "lu":
        grad = log_p - problem.log_q + lam * problem.qu
    else:
        raise ValueError(f"formulation must be one of {FORMULATIONS}, got {formulation!r}")
    return normalise_log(log_p - step * grad, problem.cell)


@dataclass
class PrimalDualResult:
    p: np.ndarray
    lam: float
    lambdas: list[float] = field(default_factory=list)
    slacks: list[float] = field(default_factory=list)

    @property
    def slack(self) -> float:
        return self.slacks[-1]


def primal_dual_grid(formulation: str, problem: GridProblem, bound: float, iterations: int, step: float,
                     dual_lr: float, lam0: float = 0.0, lam_max: float | None = None,
                     dual_update: DualUpdate = projected_dual_ascent) -> PrimalDualResult:
    """Alternate a primal step (:func:`primal_step`) and a dual update on the grid, starting from p = q.

    ``lam_max`` caps lambda (RU's Lagrangian is unbounded below at lambda >= 1). ``dual_update`` is the
    dual rule (projected ascent by default; tests pass a wrong-sign rule as a negative control).
    """
    if iterations < 1 or not 0 < step <= 1 or dual_lr <= 0:
        raise ValueError(f"need iterations >= 1, 0 < step <= 1, dual_lr > 0 (got {iterations}, {step}, {dual_lr})")
    cap = lam_max if lam_max is not None else (0.99 if formulation == "ru" else math.inf)
    p = normalise(problem.q, problem.cell)
    lam = lam0
    result = PrimalDualResult(p, lam)
    for _ in range(iterations):
        p = primal_step(formulation, p, lam, problem, step)
        g = violation(formulation, constraint_value(formulation, p, problem), bound)
        lam = min(cap, dual_update(lam, g, dual_lr))
        result.lambdas.append(lam)
        result.slacks.append(g)
    result.p, result.lam = p, lam
    return result


# ------------------------------------------------------------------------------------------------
# Sample-based pieces for a generative model (Stage B)
# ------------------------------------------------------------------------------------------------


def log_target_unnormalised(formulation: str, log_q: np.ndarray, log_qu: np.ndarray, lam: float) -> np.ndarray:
    """log p*_lambda(x) up to a constant at arbitrary points, from log q and log q_u there."""
    if formulation == "ru":
        return ru_log_target(log_q, log_qu, lam)
    if formulation == "fu":
        with np.errstate(divide="ignore"):
            return np.log(fu_unnormalised(np.exp(log_q), np.exp(log_qu), lam))
    if formulation == "lu":
        return lu_log_target(log_q, np.exp(log_qu), lam)
    raise ValueError(f"formulation must be one of {FORMULATIONS}, got {formulation!r}")


def importance_weights(formulation: str, log_q: np.ndarray, log_qu: np.ndarray, lam: float) -> np.ndarray:
    """Self-normalised weights w_i ∝ p*_lambda(x_i) / q(x_i) for samples x_i ~ q (mean 1 over the batch).

    Training a denoiser on q's samples with these weights is denoising score matching on p*_lambda: the
    project's toy shortcut (README, Fidelity checklist), valid only because q and q_u have known densities.
    """
    log_w = log_target_unnormalised(formulation, log_q, log_qu, lam) - log_q
    finite = np.isfinite(log_w)
    if not finite.any():
        raise ValueError("every importance weight is zero: lambda empties the support of the target")
    w = np.zeros_like(log_w)
    w[finite] = np.exp(log_w[finite] - log_w[finite].max())
    return w * (len(w) / w.sum())


def knn_entropy(samples: np.ndarray, k: int = 5) -> float:
    """Kozachenko-Leonenko entropy estimate H(p) = psi(n) - psi(k) + log V_d + d mean log r_k (nats)."""
    n, d = samples.shape
    if n <= k:
        raise ValueError(f"need more than k={k} samples, got {n}")
    radius = cKDTree(samples).query(samples, k=k + 1)[0][:, k]
    log_unit_ball = (d / 2) * math.log(math.pi) - math.lgamma(d / 2 + 1)
    return float(digamma(n) - digamma(k) + log_unit_ball + d * np.mean(np.log(np.maximum(radius, 1e-300))))


def knn_kl(p_samples: np.ndarray, q_samples: np.ndarray, k: int = 5) -> float:
    """k-NN estimate of KL(P||Q) from samples (Wang, Kulkarni, Verdu 2009):
    (d/n) sum_i log(nu_k(i) / rho_k(i)) + log(m / (n - 1))."""
    n, d = p_samples.shape
    m = q_samples.shape[0]
    rho = cKDTree(p_samples).query(p_samples, k=k + 1)[0][:, k]
    nu = cKDTree(q_samples).query(p_samples, k=k)[0]
    nu = nu[:, k - 1] if nu.ndim == 2 else nu
    ratio = np.log(np.maximum(nu, 1e-300)) - np.log(np.maximum(rho, 1e-300))
    return float(d * ratio.mean() + math.log(m / (n - 1)))


def sample_constraint_value(formulation: str, model_samples: np.ndarray, log_qu_at: Callable[[np.ndarray],
                            np.ndarray], qu_samples: np.ndarray, k: int = 5) -> float:
    """The constraint of one formulation estimated from the model's samples (the dual step of Stage B).

    RU: KL(p||q_u) = -H(p) - E_p[log q_u] (k-NN entropy); FU: KL(q_u||p) by the k-NN two-sample
    estimator; LU: E_p[q_u(x)], a plain Monte Carlo mean. The k-NN estimators are the project's choice:
    the paper's models have no tractable density either, and its code estimates the LU term only.
    """
    if formulation == "ru":
        return -knn_entropy(model_samples, k) - float(np.mean(log_qu_at(model_samples)))
    if formulation == "fu":
        return knn_kl(qu_samples, model_samples, k)
    if formulation == "lu":
        return float(np.mean(np.exp(log_qu_at(model_samples))))
    raise ValueError(f"formulation must be one of {FORMULATIONS}, got {formulation!r}")



@dataclass
class UnlearnResult:
    """Final dual variable, its trajectory, the violation seen at each dual step, the primal losses."""

    lam: float
    lambdas: list[float] = field(default_factory=list)
    slacks: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)


PrimalLoss = Callable[[torch.Generator], torch.Tensor]


def primal_dual_loop(formulation: str, model: torch.nn.Module, schedule, primal_loss: Callable[[float], PrimalLoss],
                     bound: float, constraint_fn: Callable[[np.ndarray], float], *, dual_updates: int,
                     steps_per_dual: int, lr: float, dual_lr: float, dual_samples: int, generator: torch.Generator,
                     lam0: float = 0.0, lam_max: float | None = None, dual_update: DualUpdate = projected_dual_ascent,
                     progress: Callable[[float], None] | None = None) -> UnlearnResult:
    """Primal-dual unlearning of a DDPM with any primal loss (Stage B, README "What is measured").

    Each round: draw ``dual_samples`` from the current model, estimate the constraint with ``constraint_fn``
    and take the dual step; then ``steps_per_dual`` Adam steps on ``primal_loss(lambda)``, a loss whose
    minimiser is the Lagrangian's minimiser at that lambda."""
    from tasks.constrained_unlearning import diffusion

    cap = lam_max if lam_max is not None else (0.99 if formulation == "ru" else math.inf)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    result = UnlearnResult(lam0)
    lam = lam0
    for round_index in range(dual_updates):
        samples = diffusion.sample(model, schedule, dual_samples, generator).numpy().astype(np.float64)
        g = violation(formulation, constraint_fn(samples), bound)
        lam = min(cap, dual_update(lam, g, dual_lr))
        result.slacks.append(g)
        result.lambdas.append(lam)
        loss_fn = primal_loss(lam)
        for _ in range(steps_per_dual):
            loss = loss_fn(generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            result.losses.append(float(loss.detach()))
        if progress is not None:
            progress((round_index + 1) / dual_updates)
    result.lam = lam
    return result


def importance_weighted_loss(model: torch.nn.Module, schedule, pool: torch.Tensor, weights: torch.Tensor,
                             batch_size: int) -> PrimalLoss:
    """DSM on pool batches weighted by ``weights`` (the analytic reference: weights p*_lambda / q)."""
    from tasks.constrained_unlearning import diffusion

    def loss(generator: torch.Generator) -> torch.Tensor:
        index = torch.randint(0, pool.shape[0], (batch_size,), generator=generator)
        return diffusion.dsm_loss(model, pool[index], schedule, generator, weights[index])

    return loss


def primal_dual_unlearn(formulation: str, model: torch.nn.Module, schedule, pool: torch.Tensor,
                        log_q_pool: np.ndarray, log_qu_pool: np.ndarray, bound: float,
                        constraint_fn: Callable[[np.ndarray], float], *, dual_updates: int, steps_per_dual: int,
                        batch_size: int, lr: float, dual_lr: float, dual_samples: int,
                        generator: torch.Generator, lam0: float = 0.0, lam_max: float | None = None,
                        dual_update: DualUpdate = projected_dual_ascent,
                        progress: Callable[[float], None] | None = None) -> UnlearnResult:
    """Primal-dual with the analytic primal step (the reference of Stage B; Stage C on training atoms): denoising
    score matching on the pool of q-samples weighted by p*_lambda / q (:func:`importance_weights`), whose
    minimiser is p*_lambda. It evaluates the densities of q and q_u: a toy shortcut."""

    def primal_loss(lam: float) -> PrimalLoss:
        weights = torch.as_tensor(importance_weights(formulation, log_q_pool, log_qu_pool, lam), dtype=torch.float32)
        return importance_weighted_loss(model, schedule, pool, weights, batch_size)

    return primal_dual_loop(formulation, model, schedule, primal_loss, bound, constraint_fn,
                            dual_updates=dual_updates, steps_per_dual=steps_per_dual, lr=lr, dual_lr=dual_lr,
                            dual_samples=dual_samples, generator=generator, lam0=lam0, lam_max=lam_max,
                            dual_update=dual_update, progress=progress)


# ------------------------------------------------------------------------------------------------
# Density-free primal losses (Stage B): never evaluate the density of q (p0) or of p*_lambda
# ------------------------------------------------------------------------------------------------


def ru_composed_epsilon(eps_q: torch.Tensor, eps_u: torch.Tensor, lam: float) -> torch.Tensor:
    """Noise prediction of the RU optimum by score composition: eps* = eps_q - eta (eps_u - eps_q),
    eta = lambda / (1 - lambda) (the score form of p*_RU with score = -eps / sigma_t; ESD's target)."""
    return eps_q - eta_from_lambda(lam) * (eps_u - eps_q)


def ru_composition_loss(model: torch.nn.Module, frozen_q: torch.nn.Module, frozen_u: torch.nn.Module, schedule,
                        pool: torch.Tensor, lam: float, batch_size: int) -> PrimalLoss:
    """RU primal loss without densities: regress eps_theta(x_t, t) on :func:`ru_composed_epsilon` of the frozen
    pretrained network (q's score) and a frozen network of q_u (the concept's score, trained on q_u's samples),
    at x_t noised from q's training samples. Composing noised scores is exact at t = 0 and the usual guidance
    approximation at t > 0 (as in ESD)."""
    from tasks.constrained_unlearning import diffusion

    def loss(generator: torch.Generator) -> torch.Tensor:
        x0 = pool[torch.randint(0, pool.shape[0], (batch_size,), generator=generator)]
        x_t, t, _ = diffusion.noise_batch(x0, schedule, generator)
        with torch.no_grad():
            target_eps = ru_composed_epsilon(frozen_q(x_t, t), frozen_u(x_t, t), lam)
        return ((model(x_t, t) - target_eps) ** 2).sum(dim=1).mean()

    return loss


def fu_difference_loss(model: torch.nn.Module, schedule, pool: torch.Tensor, forget_samples: torch.Tensor,
                       lam: float, batch_size: int) -> PrimalLoss:
    """FU primal loss without densities: DSM_q - lambda DSM_{q_u}, q's term on its training samples and q_u's on
    samples of the forget distribution. Its minimiser is the denoiser of (q - lambda q_u) (normalised), i.e.
    p*_FU where q - lambda q_u >= 0; the loss is unbounded below where lambda q_u exceeds q."""
    from tasks.constrained_unlearning import diffusion

    def loss(generator: torch.Generator) -> torch.Tensor:
        x_q = pool[torch.randint(0, pool.shape[0], (batch_size,), generator=generator)]
        x_u = forget_samples[torch.randint(0, forget_samples.shape[0], (batch_size,), generator=generator)]
        return (diffusion.dsm_loss(model, x_q, schedule, generator)
                - lam * diffusion.dsm_loss(model, x_u, schedule, generator))

    return loss


def lu_likelihood_weights(qu_at_pool: np.ndarray, lam: float) -> np.ndarray:
    """Self-normalised weights exp(-lambda q_u(x_i)) (mean 1) for q's training samples x_i: the LU Lagrangian
    KL(p||q) + lambda E_p[q_u] has minimiser q exp(-lambda q_u) / Z, so these are p*/q computed from the
    likelihood q_u alone (the constraint's own function), never from q's or p*'s density."""
    if lam < 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    log_w = -lam * np.asarray(qu_at_pool, dtype=np.float64)
    w = np.exp(log_w - log_w.max())
    return w * (len(w) / w.sum())


def noised_score_epsilon(noised_score: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], schedule
                         ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The noise prediction of a distribution whose noised score is known: eps(x_t, t) = -sqrt(1 - abar_t)
    grad log q_t(x_t) (the DDPM identity eps = -sigma_t score). RU composes q's network with this for q_u's own
    score, the q_u that the dual step's constraint KL(p||q_u) measures (q_u is neither p0 nor p*)."""
    abars = schedule.alpha_bars

    def epsilon(x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        abar = abars[t]
        return -(1 - abar).sqrt()[:, None] * noised_score(x_t, abar)

    return epsilon


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor | float) -> torch.Tensor:
    """log N(x; mean, var I) per row: -||x - mean||^2 / (2 var) - (d / 2) log(2 pi var)."""
    var = torch.as_tensor(var, dtype=x.dtype)
    return -((x - mean) ** 2).sum(dim=1) / (2 * var) - 0.5 * x.shape[1] * torch.log(2 * math.pi * var)


def gaussian_step_kl(mean_p: torch.Tensor, mean_r: torch.Tensor, var: torch.Tensor | float) -> torch.Tensor:
    """KL(N(mean_p, var I) || N(mean_r, var I)) per row: ||mean_p - mean_r||^2 / (2 var) (one denoising step of
    the model against the frozen model; equal variances)."""
    return ((mean_p - mean_r) ** 2).sum(dim=1) / (2 * torch.as_tensor(var, dtype=mean_p.dtype))


def lu_reinforce_surrogate(log_probs: torch.Tensor, step_kls: torch.Tensor, likelihoods: torch.Tensor,
                           lam: float) -> torch.Tensor:
    """Surrogate of the on-policy LU Lagrangian lambda E_p[q_u(x_0)] + KL(p || p_0) over n trajectories:
    mean_i [lambda (q_u(x_0^i) - mean_j q_u(x_0^j)) log p_theta(tau_i) + KL_i]. Its gradient is REINFORCE on the
    likelihood reward q_u(x_0) (mean baseline; the reward is detached) plus the pathwise gradient of the
    trajectory KL to the frozen model (the paper's official LU recipe: REINFORCE through trajectory
    log-probabilities plus a trajectory KL). ``log_probs``, ``step_kls``: per trajectory, summed over steps."""
    if lam < 0:
        raise ValueError(f"lambda must be >= 0, got {lam}")
    advantage = lam * (likelihoods - likelihoods.mean()).detach()
    return (advantage * log_probs + step_kls).mean()


def lu_reinforce_loss(model: torch.nn.Module, frozen: torch.nn.Module, schedule,
                      likelihood: Callable[[torch.Tensor], torch.Tensor], lam: float, n_trajectories: int,
                      grad_steps: int) -> PrimalLoss:
    """LU's on-policy primal loss (the paper's likelihood objective, no density of q or p* anywhere): draw
    ``n_trajectories`` ancestral chains from the CURRENT model, score each end point by the likelihood
    q_u(x_0) (the constraint's own function), and return :func:`lu_reinforce_surrogate` over ``grad_steps``
    denoising steps drawn without replacement (scaled by T / grad_steps: an unbiased estimate of the sum over
    all T steps). The KL term's gradient is taken at the visited states without the score-function part of
    their dependence on theta (as in the official recipe and DPOK), so its fixed point approximates p*_lambda
    = q exp(-lambda q_u) / Z rather than equalling it."""
    from tasks.constrained_unlearning import diffusion

    timesteps = schedule.timesteps
    if not 1 <= grad_steps <= timesteps:
        raise ValueError(f"grad_steps must be in [1, {timesteps}], got {grad_steps}")

    def loss(generator: torch.Generator) -> torch.Tensor:
        states = diffusion.sample_trajectory(model, schedule, n_trajectories, generator)
        with torch.no_grad():
            rewards = likelihood(states[0])
        steps = torch.randperm(timesteps, generator=generator)[:grad_steps].tolist()
        log_probs = torch.zeros(n_trajectories)
        step_kls = torch.zeros(n_trajectories)
        for step in steps:
            var = schedule.betas[step]
            mean = diffusion.denoising_mean(model, schedule, states[step + 1], step)
            with torch.no_grad():
                frozen_mean = diffusion.denoising_mean(frozen, schedule, states[step + 1], step)
            log_probs = log_probs + gaussian_log_prob(states[step], mean, var)
            step_kls = step_kls + gaussian_step_kl(mean, frozen_mean, var)
        scale = timesteps / grad_steps
        return lu_reinforce_surrogate(scale * log_probs, scale * step_kls, rewards, lam)

    return loss


# ------------------------------------------------------------------------------------------------
# Sample-based metrics (Stage B)
# ------------------------------------------------------------------------------------------------


def ball_fraction(samples: np.ndarray, centre: np.ndarray, radius: float) -> float:
    """Fraction of samples strictly inside the ball (forget mass, close-mode mass)."""
    return float(np.mean(np.linalg.norm(samples - np.asarray(centre)[None, :], axis=1) < radius))


def histogram_retained_kl(samples: np.ndarray, reference: np.ndarray, forget_centre: np.ndarray, radius: float,
                          bins: int, half_width: float, pseudo_count: float = 0.5) -> float:
    """KL(p_R || q_R) between 2-D histograms of two sample sets outside the forget ball(s).

    ``forget_centre`` is one centre (d,) or several (k, d); R is the complement of the union of their balls.

    Points outside the box [-half_width, half_width]^2 (or not finite: a diverged model) share one overflow bin,
    so mass pushed away counts. The reference histogram gets ``pseudo_count`` per bin so that the KL stays
    finite; the estimate has a positive floor from sampling noise, which evaluate.py reports."""
    edges = np.linspace(-half_width, half_width, bins + 1)

    def histogram(points: np.ndarray) -> np.ndarray:
        finite = np.all(np.isfinite(points), axis=1)
        points = points[finite]
        centres = np.atleast_2d(np.asarray(forget_centre, dtype=np.float64))
        distance = np.linalg.norm(points[:, None, :] - centres[None, :, :], axis=2).min(axis=1)
        kept = points[distance >= radius]
        inside = np.histogram2d(kept[:, 0], kept[:, 1], bins=[edges, edges])[0].ravel()
        return np.append(inside, len(kept) - inside.sum() + np.sum(~finite))

    p = histogram(samples)
    r = histogram(reference) + pseudo_count
    if p.sum() == 0:
        raise ValueError("every sample falls in the forget region: the retained-region KL is undefined")
    p, r = p / p.sum(), r / r.sum()
    support = p > 0
    return float(np.sum(p[support] * np.log(p[support] / r[support])))


# ------------------------------------------------------------------------------------------------
# Data unlearning (FU) with duplicated forget points (Stage C)
# ------------------------------------------------------------------------------------------------


def empirical_log_masses(is_forget: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log q, log q_u) at the atoms of an empirical training set: q is uniform over all N training points
    (duplicates count as separate atoms), q_u uniform over the M forget copies (log q_u = -inf elsewhere).

    Fed to :func:`importance_weights` ("fu"), these give (q - lambda q_u)_+ / q: weight 1 on retained points and
    (1 - lambda / w)_+ on forget copies, w = M / N the forget share. So FU's primal loss on the training set is
    DSM_q - lambda DSM_{q_u}, and lambda >= w is training on the retained points only (the FU identity on atoms).
    """
    is_forget = np.asarray(is_forget, dtype=bool)
    n, m = is_forget.size, int(is_forget.sum())
    if n == 0 or m == 0:
        raise ValueError(f"need a non-empty training set with at least one forget copy (got N={n}, M={m})")
    log_q = np.full(n, -math.log(n))
    log_qu = np.full(n, -math.inf)
    log_qu[is_forget] = -math.log(m)
    return log_q, log_qu


def near_fraction(samples: np.ndarray, points: np.ndarray, radius: float) -> float:
    """Memorisation proxy (stand-in for the paper's max SSCD similarity): the fraction of generated samples that
    lie strictly within ``radius`` of at least one of ``points`` (nearest-neighbour distance < radius).

    Compared between the forget points and held-out points of the same density under q, it separates a
    model that reproduces the forget points from one that only models their neighbourhood's density.
    Non-finite samples (a diverged model) count as not near."""
    if radius <= 0:
        raise ValueError(f"radius must be > 0, got {radius}")
    samples = np.asarray(samples, dtype=np.float64)
    finite = np.all(np.isfinite(samples), axis=1)
    if samples.shape[0] == 0:
        raise ValueError("no samples")
    distance = np.full(samples.shape[0], np.inf)
    distance[finite] = cKDTree(np.atleast_2d(points)).query(samples[finite], k=1)[0]
    return float(np.mean(distance < radius))


def memorisation_ratio(forget_fraction: float, heldout_fraction: float, n_samples: int) -> float:
    """forget / held-out near-fraction; the held-out fraction is floored at one sample (1 / n) so a model that
    puts no sample near the held-out points gives a finite (large) ratio instead of a division by zero."""
    return forget_fraction / max(heldout_fraction, 1.0 / n_samples)
