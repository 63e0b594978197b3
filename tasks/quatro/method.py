"""QUATRO: query-adaptive trust-region policy optimisation, as a pure library (no Prefect, MLflow or files).

Lee et al. 2026, "QUATRO: Query-Adaptive Trust Region Policy Optimization for LLM Fine-tuning" (arXiv 2602.04620).
**Reconstructed**: the paper's method section was not available; the objective below is rebuilt from its abstract
(per-query KL trust regions solved by Lagrangian duality, per-prompt dual variables, a stabilising log-ratio term)
together with TRPO (Schulman et al. 2015), REPS (Peters et al. 2010) and MPO-style duals. Equation labels (R1)...
are this file's own.

For one query x with G responses y_i ~ pi_old and advantages A_i, and the ratio rho = pi_theta / pi_old:

- (R1) trust-region problem: max_pi E_{y~pi}[A] s.t. KL(pi(.|x) || pi_old(.|x)) <= delta.
- (R2) identity: KL(pi_theta || pi_old) = E_{pi_old}[rho log rho] (``expected_rho_log_rho``).
- (R3) Lagrangian: L_x(theta, lambda_x) = E_{pi_old}[rho A] - lambda_x (E_{pi_old}[rho log rho] - delta); the
  -lambda_x rho log rho term is the stabiliser. Per sample dL/drho = A - lambda_x (1 + log rho): never masked, zero at
  rho_stat = exp(A / lambda_x - 1) (``objective_grad_wrt_ratio``, ``stationary_ratio``).
- (R4) dual (REPS on the group's empirical distribution): g(lambda) = lambda delta + lambda log((1/G) sum_i
  exp(A_i / lambda)); g'(lambda) = delta - KL(w_lambda || uniform) with w_lambda = softmax(A / lambda), so the
  minimiser solves KL(w || uniform) = delta (``dual_value``, ``solve_dual_bisection``). Alternative:
  dual ascent lambda <- max(lambda + eta (KL - delta), floor) (``dual_ascent_step``).
- (R5) feasibility: KL(w_lambda || uniform) -> log(G / n_max) as lambda -> 0 (n_max samples share the largest A);
  when delta >= log(G / n_max) no lambda reaches delta and lambda takes its floor. Groups with A constant are
  skipped (lambda = 0, zero loss contribution).
- (R6) LLM loss, lambda detached: sequence level L = -(1/N) sum_i [rho_i A_i - lambda_x(i) rho_i log rho_i] with the
  whole-response ratio rho_i = prod_t r_it; token level L = -(1/sum_i |y_i|) sum_{i,t} [rho_it A_i - lambda_x(i)
  rho_it log rho_it] (``quatro_loss``).

The GRPO, GSPO and unclipped importance-weighted REINFORCE losses, group advantages, rollouts and the lagged
behaviour policy are in ``tasks/common/rl.py``; this module adds only what QUATRO needs.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from tasks.common import rl

Level = Literal["sequence", "token"]
Stabiliser = Literal["rho_log_rho", "generalised"]
DualMode = Literal["bisection", "ascent"]


# ---------------------------------------------------------------------------------------------------------------
# (R2) the KL identity and (R3) the per-sample objective
# ---------------------------------------------------------------------------------------------------------------

def categorical_kl(p: Tensor, q: Tensor) -> Tensor:
    """KL(p || q) = sum_k p_k log(p_k / q_k) over the last axis (0 log 0 = 0)."""
    terms = torch.where(p > 0, p * (torch.log(p) - torch.log(q)), torch.zeros_like(p))
    return terms.sum(dim=-1)


def expected_rho_log_rho(p_new: Tensor, p_old: Tensor) -> Tensor:
    """(R2) E_{p_old}[rho log rho] with rho = p_new / p_old, over the last axis; equals KL(p_new || p_old)."""
    rho = p_new / p_old
    return (p_old * torch.where(rho > 0, rho * torch.log(rho), torch.zeros_like(rho))).sum(dim=-1)


def per_sample_objective(ratio: Tensor, advantages: Tensor, lam: Tensor | float) -> Tensor:
    """(R3) rho A - lambda rho log rho, the per-sample Lagrangian term (the constant lambda delta dropped)."""
    return ratio * advantages - lam * ratio * torch.log(ratio)


def objective_grad_wrt_ratio(ratio: Tensor, advantages: Tensor, lam: Tensor | float) -> Tensor:
    """(R3) d/drho [rho A - lambda rho log rho] = A - lambda (1 + log rho), in closed form."""
    return advantages - lam * (1 + torch.log(ratio))


def stationary_ratio(advantages: Tensor, lam: Tensor | float) -> Tensor:
    """(R3) rho_stat = exp(A / lambda - 1), where the per-sample gradient vanishes."""
    return torch.exp(advantages / lam - 1)


# ---------------------------------------------------------------------------------------------------------------
# (R4, R5) the per-query dual
# ---------------------------------------------------------------------------------------------------------------

def tilted_weights(advantages: Tensor, lam: float | Tensor) -> Tensor:
    """w = softmax(A / lambda) over the last axis: the optimum pi* ∝ pi_old exp(A / lambda) on the group (R4)."""
    return torch.softmax(advantages / lam, dim=-1)


def tilted_kl(advantages: Tensor, lam: float | Tensor) -> Tensor:
    """KL(pi* || pi_old) on the group's empirical distribution: KL(w || uniform) = sum_i w_i log(G w_i)."""
    log_w = torch.log_softmax(advantages / lam, dim=-1)
    return (log_w.exp() * (log_w + math.log(advantages.shape[-1]))).sum(dim=-1)


def dual_value(lam: float, advantages: Tensor, delta: float) -> Tensor:
    """(R4) g(lambda) = lambda delta + lambda log((1/G) sum_i exp(A_i / lambda)), in the stable logsumexp form."""
    scaled = advantages / lam
    return lam * delta + lam * (torch.logsumexp(scaled, dim=-1) - math.log(advantages.shape[-1]))


def kl_limit_as_lambda_to_zero(advantages: Tensor) -> float:
    """(R5) log(G / n_max): the largest KL(w_lambda || uniform) any lambda reaches (n_max = count at max A)."""
    n_max = int((advantages == advantages.max()).sum())
    return math.log(advantages.shape[-1] / n_max)


def is_degenerate(advantages: Tensor) -> bool:
    """(R5) A constant over the group (all correct or all wrong): no signal, the group is skipped."""
    return bool((advantages == advantages[0]).all())


def solve_dual_bisection(advantages: Tensor, delta: float, *, lam_min: float = 1e-3, lam_max: float = 1e3,
                         iters: int = 100) -> float:
    """(R4) lambda* = argmin_{lambda > 0} g(lambda), by bisection on log lambda of g'(lambda) = delta - KL(w || u).

    KL(w_lambda || uniform) falls monotonically in lambda, so the root is bracketed by [lam_min, lam_max]. (R5):
    a degenerate group returns 0 (skipped); when delta >= log(G / n_max) or KL(lam_min) <= delta the constraint
    cannot bind above the floor and lam_min is returned; when KL(lam_max) > delta, lam_max. ``advantages`` (G,).
    """
    if delta <= 0 or not 0 < lam_min < lam_max:
        raise ValueError(f"need delta > 0 and 0 < lam_min < lam_max, got {delta}, {lam_min}, {lam_max}")
    adv = advantages.detach().to(torch.float64).reshape(-1)
    if is_degenerate(adv):
        return 0.0
    if delta >= kl_limit_as_lambda_to_zero(adv) or float(tilted_kl(adv, lam_min)) <= delta:
        return lam_min
    if float(tilted_kl(adv, lam_max)) > delta:
        return lam_max
    low, high = math.log(lam_min), math.log(lam_max)
    for _ in range(iters):
        mid = 0.5 * (low + high)
        if float(tilted_kl(adv, math.exp(mid))) > delta:
            low = mid  # lambda too small: the tilted distribution is too far from pi_old
        else:
            high = mid
    return math.exp(0.5 * (low + high))


def dual_ascent_step(lam: float, kl: float, delta: float, step_size: float, floor: float = 1e-3) -> float:
    """(R4, alternative) lambda <- max(lambda + eta (KL - delta), floor): raise lambda when the step overshoots."""
    return max(lam + step_size * (kl - delta), floor)


def group_duals(advantages: Tensor, group_size: int, delta: float, *, lam_min: float = 1e-3,
                lam_max: float = 1e3, iters: int = 60) -> Tensor:
    """(R4) lambda* of every group of G contiguous rows, (num_groups,) float64; 0 for skipped groups (R5).

    The bisection of ``solve_dual_bisection`` run on all groups at once (one tensor operation per iteration): the
    same floor / ceiling / degenerate rules, ``iters`` halvings of [log lam_min, log lam_max].
    """
    if group_size < 2 or advantages.numel() % group_size:
        raise ValueError(f"{advantages.numel()} advantages do not form groups of size {group_size} >= 2")
    if delta <= 0 or not 0 < lam_min < lam_max:
        raise ValueError(f"need delta > 0 and 0 < lam_min < lam_max, got {delta}, {lam_min}, {lam_max}")
    adv = advantages.detach().to(torch.float64).reshape(-1, group_size)
    degenerate = (adv == adv[:, :1]).all(dim=1)
    n_max = (adv == adv.max(dim=1, keepdim=True).values).sum(dim=1)
    kl_limit = torch.log(group_size / n_max.to(torch.float64))
    at_floor = (delta >= kl_limit) | (tilted_kl(adv, lam_min) <= delta)
    at_ceiling = ~at_floor & (tilted_kl(adv, lam_max) > delta)
    low = torch.full((adv.shape[0],), math.log(lam_min), dtype=torch.float64)
    high = torch.full_like(low, math.log(lam_max))
    for _ in range(iters):
        mid = 0.5 * (low + high)
        too_far = tilted_kl(adv, torch.exp(mid).unsqueeze(1)) > delta  # lambda too small: too far from pi_old
        low, high = torch.where(too_far, mid, low), torch.where(too_far, high, mid)
    lam = torch.exp(0.5 * (low + high))
    lam = torch.where(at_ceiling, torch.full_like(lam, lam_max), lam)
    lam = torch.where(at_floor, torch.full_like(lam, lam_min), lam)
    return torch.where(degenerate, torch.zeros_like(lam), lam)


def per_row(group_values: Tensor, group_size: int) -> Tensor:
    """Broadcast one value per group to the G rows of the group, (num_groups * G,)."""
    return group_values.repeat_interleave(group_size)


# ---------------------------------------------------------------------------------------------------------------
# (R6) the loss on a causal LM's log-probs
# ---------------------------------------------------------------------------------------------------------------

def sequence_log_ratios(new_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log rho_i = sum_t (logp_new_it - logp_old_it) over the valid tokens: the whole-response ratio, (N,).

    Not length-normalised (unlike GSPO's): the trust region (R1) is a KL between distributions over responses.
    """
    mask = mask.bool()
    return torch.where(mask, new_logprobs - old_logprobs.detach(), 0.0).sum(dim=1)


def per_query_kl(seq_log_ratios: Tensor, group_size: int) -> Tensor:
    """(R2) the group estimate of KL(pi_theta(.|x) || pi_old(.|x)): (1/G) sum_i rho_i log rho_i, (num_groups,).

    Unbiased only for a theta chosen independently of the G samples; after training on them it misses the mass moved
    onto unsampled responses and can be negative. A diagnostic: the claims use ``exact_response_kl``.
    """
    log_rho = seq_log_ratios.detach().reshape(-1, group_size)
    return (torch.exp(log_rho) * log_rho).mean(dim=1)


def exact_response_kl(new_logprobs: Tensor, behaviour_logprobs: Tensor) -> Tensor:
    """(R1) the exact KL(pi_theta(.|x) || pi_b(.|x)) = sum_y pi_theta(y) (log pi_theta(y) - log pi_b(y)).

    Inputs (B, R): the log-probability of every one of the R responses of an enumerable response space under each
    policy (rows are complete distributions). Unlike ``per_query_kl`` it sees mass moved onto unsampled responses,
    and it is never negative. Returns (B,) float64.
    """
    new = new_logprobs.detach().to(torch.float64)
    old = behaviour_logprobs.detach().to(torch.float64)
    if new.shape != old.shape or new.dim() != 2:
        raise ValueError(f"need two (B, R) log-probability tables of one shape, got {tuple(new.shape)}, "
                         f"{tuple(old.shape)}")
    for name, table in (("new", new), ("behaviour", old)):
        mass = torch.logsumexp(table, dim=1).exp()
        if not bool(torch.allclose(mass, torch.ones_like(mass), atol=1e-3)):
            raise ValueError(f"{name} rows are not complete distributions (total mass {mass.tolist()})")
    return (new.exp() * (new - old)).sum(dim=1)


def outside_clip_fraction(log_ratios: Tensor, mask: Tensor, eps_low: float = 0.2, eps_high: float = 0.2) -> float:
    """Fraction of valid entries whose ratio lies outside [1 - eps_low, 1 + eps_high] (either side, any advantage)."""
    mask = mask.bool()
    ratio = torch.exp(log_ratios.detach())
    outside = (ratio < 1 - eps_low) | (ratio > 1 + eps_high)
    return float((outside & mask).sum() / mask.sum().clamp_min(1))


def stabiliser_term(log_rho: Tensor, stabiliser: Stabiliser = "rho_log_rho") -> Tensor:
    """(R3) the penalty f(rho) whose E_{pi_old} is KL(pi_theta || pi_old): rho log rho, or rho log rho - rho + 1.

    Both have the same expectation under pi_old (E[rho] = 1), but per sample d/drho is 1 + log rho for the first (it
    pushes every sampled response down at rho = 1, moving mass to unsampled ones) and log rho for the second
    ("generalised", the KL between unnormalised measures; >= 0 per sample, stationary point exp(A / lambda)).
    """
    rho = torch.exp(log_rho)
    if stabiliser == "rho_log_rho":
        return rho * log_rho
    if stabiliser == "generalised":
        return rho * log_rho - rho + 1
    raise ValueError(f"stabiliser must be 'rho_log_rho' or 'generalised', got {stabiliser!r}")


def quatro_loss(new_logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, lambdas: Tensor, *,
                level: Level = "sequence", stabiliser: Stabiliser = "rho_log_rho",
                max_log_ratio: float | None = None) -> tuple[Tensor, dict[str, float]]:
    """(R6) L = -agg [rho A - lambda_x f(rho)], lambda_x per row (detached), A per row (N,), f = ``stabiliser_term``.

    ``level="sequence"``: rho_i = exp(sum_t log r_it), mean over the N rows. ``level="token"``: rho_it = r_it, sum over
    valid tokens / their count (``tasks.common.rl`` "token" aggregation). ``max_log_ratio`` optionally clamps log rho
    (a numerical safety bound: the gradient is zero beyond it). Rows of skipped groups (A = 0, lambda = 0) contribute
    zero. Stats: the mean lambda over rows with lambda > 0, the mean sequence-level rho log rho and the fraction of
    valid tokens outside [0.8, 1.2].
    """
    mask = mask.bool()
    adv = advantages.detach().to(new_logprobs.dtype)
    lam = lambdas.detach().to(new_logprobs.dtype)
    if adv.dim() != 1 or lam.shape != adv.shape:
        raise ValueError("quatro_loss takes one advantage and one lambda per sequence, shapes (N,)")
    token_log_ratio = torch.where(mask, new_logprobs - old_logprobs.detach(), 0.0)
    if level == "sequence":
        log_rho = token_log_ratio.sum(dim=1)
        if max_log_ratio is not None:
            log_rho = log_rho.clamp(-max_log_ratio, max_log_ratio)
        loss = -(torch.exp(log_rho) * adv - lam * stabiliser_term(log_rho, stabiliser)).mean()
    elif level == "token":
        log_rho = token_log_ratio if max_log_ratio is None else token_log_ratio.clamp(-max_log_ratio, max_log_ratio)
        per_token = torch.exp(log_rho) * adv.unsqueeze(1) - lam.unsqueeze(1) * stabiliser_term(log_rho, stabiliser)
        loss = -rl._aggregate(per_token, mask, "token")
    else:
        raise ValueError(f"level must be 'sequence' or 'token', got {level!r}")
    seq = token_log_ratio.detach().sum(dim=1)
    active = lam > 0
    stats = {"lambda_mean": float(lam[active].mean()) if bool(active.any()) else 0.0,
             "rho_log_rho": float((torch.exp(seq) * seq).mean()),
             "outside_clip_fraction": outside_clip_fraction(token_log_ratio, mask)}
    return loss, stats


# ---------------------------------------------------------------------------------------------------------------
# Evaluation metrics (the paper reports Pass@k and the Unique Correct Count)
# ---------------------------------------------------------------------------------------------------------------

def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 - C(n - c, k) / C(n, k) (Chen et al. 2021, eq. 1)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def unique_correct_count(responses: list[tuple[int, ...]], correct: list[bool]) -> int:
    """Number of distinct responses among the correct ones (the paper's Unique Correct Count, per prompt)."""
    if len(responses) != len(correct):
        raise ValueError("responses and correct must have the same length")
    return len({r for r, ok in zip(responses, correct, strict=True) if ok})


def mean_token_entropy(logits: Tensor, mask: Tensor) -> float:
    """Mean over valid positions of H(softmax(logits)) = -sum_v p_v log p_v, in nats; logits (N, T, V), mask (N, T)."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    entropy = -(logp.exp() * logp).sum(dim=-1)
    mask = mask.bool()
    return float(entropy[mask].sum() / mask.sum().clamp_min(1))
