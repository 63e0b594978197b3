"""Order sensitivity and information budgeting for evidence-grounded binary adjudication (pure library).

Chlon, Karim, Chlon, Awada, "Predictable Compression Failures: Order Sensitivity and Information Budgeting
for Evidence-Grounded Binary Adjudication" (ICML 2026, arXiv 2509.11208). Section references are to the
preprint shipped in the official repository (leochlon/hallbayes, ``arxivPreprint.pdf``).

Everything here works on label-token probabilities of *any* model: ``q`` is always the probability of the
label "1" renormalised over the two labels, q = P("1") / (P("1") + P("0")). All logarithms are natural
(nats). No torch, no Prefect, no MLflow.

Pieces:

- dispersion across permutations: E|R_pi| and E_pair (Section 3), the permutation-mixture Jensen gap;
- the QMV bound (Theorem 1): general TV form 1/4 sum_i TV_i and the (alpha, C_tot) closed forms, the
  first-order positional model (Theorem 2) with its adjacent-transposition increments, and the official
  code's ``(L C / 8)(H_n - 1.5)``;
- EDFL (Theorem 5): Delta_bar = E_k KL(P || S_k) >= KL(Ber(p) || Ber(q_bar)), with equality at the
  exponential tilt;
- the planners of Algorithm 1: B2T, p_max / RoH, the clipped information budget Delta_bar, ISR and the
  answer/abstain gate (answer iff ISR >= 1);
- the exponentiated-gradient mixture over permutations (the near-optimality claim of the uniform mixture).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

ClipMode = Literal["symmetric", "one_sided"]
# Probabilities are kept this far from 0 and 1 before any log: a saturated float32 softmax must not
# turn a KL or a lift into inf.
PROB_FLOOR = 1e-12


def _clip_prob(q: np.ndarray | float) -> np.ndarray:
    return np.clip(np.asarray(q, dtype=float), PROB_FLOOR, 1.0 - PROB_FLOOR)


def _xlogy_ratio(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """p log(p / q) with the convention 0 log 0 = 0."""
    p = np.asarray(p, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - np.log(q)), 0.0)
    return out


# ------------------------------------------------------------------------------------------------
# Bernoulli and categorical KL
# ------------------------------------------------------------------------------------------------

def bernoulli_kl(p: np.ndarray | float, q: np.ndarray | float) -> np.ndarray:
    """KL(Ber(p) || Ber(q)) in nats; p in [0, 1] (0 log 0 = 0), q clipped to (0, 1)."""
    p = np.asarray(p, dtype=float)
    q = _clip_prob(q)
    if np.any((p < -1e-9) | (p > 1 + 1e-9)):
        raise ValueError("bernoulli_kl: p must lie in [0, 1]")
    p = np.clip(p, 0.0, 1.0)  # a sum of probabilities may exceed 1 by rounding
    return _xlogy_ratio(p, q) + _xlogy_ratio(1.0 - p, 1.0 - q)


def categorical_kl(p: np.ndarray, s: np.ndarray) -> np.ndarray:
    """KL(P || S) over the last axis (rows are distributions)."""
    p, s = np.asarray(p, dtype=float), np.asarray(s, dtype=float)
    return _xlogy_ratio(p, np.maximum(s, 1e-300)).sum(axis=-1)


def binary_entropy(eps: np.ndarray | float) -> np.ndarray:
    """h_b(eps) in nats (the EDFL corollary's penalty term)."""
    eps = np.asarray(eps, dtype=float)
    return -_xlogy_ratio(eps, 1.0) - _xlogy_ratio(1.0 - eps, 1.0)


# ------------------------------------------------------------------------------------------------
# Planners of Algorithm 1 (Section 5): B2T, p_max / RoH, Delta_bar, ISR, the gate
# ------------------------------------------------------------------------------------------------

def bits_to_trust(q_lo: np.ndarray | float, h_star: float) -> np.ndarray:
    """B2T = KL(Ber(1 - h*) || Ber(q_lo)): the information needed to lift the worst prior to 1 - h*.

    The argument order matters (the KL is asymmetric): the target rate 1 - h* is the first argument.
    """
    if not 0.0 < h_star < 1.0:
        raise ValueError(f"h_star must lie in (0, 1), got {h_star}")
    return bernoulli_kl(1.0 - h_star, q_lo)


def p_max(delta: np.ndarray | float, q_bar: np.ndarray | float, iterations: int = 200) -> np.ndarray:
    """p_max = sup{p >= q_bar : KL(Ber(p) || Ber(q_bar)) <= Delta} (EDFL inverted, Section 5).

    KL(Ber(p) || Ber(q_bar)) increases in p on [q_bar, 1], so the supremum is found by bisection; when
    even p = 1 fits in the budget (KL(Ber(1) || Ber(q_bar)) = -log q_bar <= Delta) it is 1.
    """
    delta = np.maximum(np.asarray(delta, dtype=float), 0.0)
    q_bar = _clip_prob(q_bar)
    delta, q_bar = np.broadcast_arrays(delta, q_bar)
    low, high = q_bar.copy(), np.ones_like(q_bar)
    for _ in range(iterations):
        mid = 0.5 * (low + high)
        fits = bernoulli_kl(mid, q_bar) <= delta
        low = np.where(fits, mid, low)
        high = np.where(fits, high, mid)
    reaches_one = bernoulli_kl(1.0, q_bar) <= delta
    return np.where(reaches_one, 1.0, low)


def risk_of_hallucination(delta: np.ndarray | float, q_bar: np.ndarray | float) -> np.ndarray:
    """RoH = 1 - p_max(Delta_bar, q_bar)."""
    return 1.0 - p_max(delta, q_bar)


def clip_lift(u: np.ndarray, clip: float, mode: ClipMode) -> np.ndarray:
    """Clip per-skeleton lifts u_k: the paper's symmetric [-B, B], or the official code's one-sided [0, B]."""
    if clip <= 0:
        raise ValueError(f"clip B must be > 0, got {clip}")
    if mode == "symmetric":
        return np.clip(u, -clip, clip)
    if mode == "one_sided":
        return np.clip(u, 0.0, clip)
    raise ValueError(f"clip mode must be 'symmetric' or 'one_sided', got {mode!r}")


def information_budget(log_posterior: np.ndarray, log_priors: np.ndarray, clip: float, mode: ClipMode
                       ) -> np.ndarray:
    """Delta_bar = mean_k clip(log P(y) - log S_k(y), B) over the last axis (Algorithm 1, step 2)."""
    return clip_lift(np.asarray(log_posterior) - np.asarray(log_priors), clip, mode).mean(axis=-1)


def information_sufficiency_ratio(delta_bar: np.ndarray, b2t: np.ndarray) -> np.ndarray:
    """ISR = Delta_bar / B2T (Section 5).

    B2T = 0 means the prior already sits at the target 1 - h* (no information is needed). The ratio is then
    given the value that keeps "ISR >= 1" equal to the sufficiency condition "Delta_bar >= B2T" that the
    ratio expresses when B2T > 0: +inf if Delta_bar > 0, 1 if Delta_bar = 0 (a zero budget suffices for a
    zero need: the gate answers, as the official toolkit's ``isr`` does), -inf if Delta_bar < 0 (the
    toolkit returns 1 there but its decision also asks Delta_bar >= B2T, so it abstains, as here).
    """
    delta_bar, b2t = np.broadcast_arrays(np.asarray(delta_bar, dtype=float), np.asarray(b2t, dtype=float))
    at_zero_need = np.where(delta_bar > 0, np.inf, np.where(delta_bar < 0, -np.inf, 1.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(b2t > 0, delta_bar / np.where(b2t > 0, b2t, 1.0), at_zero_need)
    return ratio


def answer_gate(isr: np.ndarray, delta_bar: np.ndarray | None = None, b2t: np.ndarray | None = None,
                margin: float = 0.0) -> np.ndarray:
    """Answer iff ISR >= 1 (Section 5; with :func:`information_sufficiency_ratio`'s B2T = 0 convention this is
    Delta_bar >= B2T for every B2T >= 0); the official code's option additionally asks Delta_bar >= B2T + margin."""
    answer = np.asarray(isr) >= 1.0
    if margin > 0:
        if delta_bar is None or b2t is None:
            raise ValueError("a margin needs delta_bar and b2t")
        answer &= np.asarray(delta_bar) >= np.asarray(b2t) + margin
    return answer


def label_probability(q_one: np.ndarray, label: np.ndarray) -> np.ndarray:
    """P(label) from q = P("1"): q where label is 1, 1 - q where it is 0 (label broadcast over the last axis)."""
    q_one = np.asarray(q_one, dtype=float)
    label = np.asarray(label)
    if label.ndim < q_one.ndim:
        label = label.reshape(label.shape + (1,) * (q_one.ndim - label.ndim))
    return np.where(label == 1, q_one, 1.0 - q_one)


def paired_label_probabilities(q_full: np.ndarray, q_skeleton: np.ndarray, decision: np.ndarray
                               ) -> tuple[np.ndarray, np.ndarray]:
    """(P_k(y), S_k(y)) for k = 1..K: skeleton k is paired with the full prompt in the *same* order k
    [project choice], both read at the label y = ``decision``; clipped away from 0 and 1 for the logs."""
    k = q_skeleton.shape[1]
    return (_clip_prob(label_probability(q_full[:, :k], decision)),
            _clip_prob(label_probability(q_skeleton, decision)))


@dataclass(frozen=True)
class GatePlan:
    """Per-item outputs of Algorithm 1 (arrays of length n_items)."""

    decision: np.ndarray      # the label the mixture would answer (1 iff q_bar >= 0.5)
    delta_bar: np.ndarray     # information budget, nats
    q_lo: np.ndarray          # min_k S_k(y)
    q_prior: np.ndarray       # mean_k S_k(y)
    b2t: np.ndarray
    isr: np.ndarray
    answer: np.ndarray        # bool: ISR >= 1
    roh: np.ndarray           # 1 - p_max(Delta_bar, q_prior)


def plan_answers(q_full: np.ndarray, q_skeleton: np.ndarray, h_star: float, clip: float, mode: ClipMode,
                 margin: float = 0.0) -> GatePlan:
    """Algorithm 1 on label probabilities.

    ``q_full`` (items, m): q of the full prompt under m permutations; its mean decides the label y.
    ``q_skeleton`` (items, k <= m): q of the skeleton (evidence masked) of the *first k* permutations.
    The lift u_k = log P_k(y) - log S_k(y) pairs each skeleton with the full prompt in the same order
    [project choice], so a skeleton equal to its prompt gives u_k = 0 exactly (acceptance check (a)7).
    """
    q_full, q_skeleton = np.asarray(q_full, dtype=float), np.asarray(q_skeleton, dtype=float)
    if q_full.ndim != 2 or q_skeleton.ndim != 2 or q_skeleton.shape[0] != q_full.shape[0]:
        raise ValueError("q_full and q_skeleton must be (items, m) and (items, k) arrays")
    k = q_skeleton.shape[1]
    if not 1 <= k <= q_full.shape[1]:
        raise ValueError(f"need 1 <= skeletons ({k}) <= permutations ({q_full.shape[1]})")
    decision = (q_full.mean(axis=1) >= 0.5).astype(int)
    posterior, priors = paired_label_probabilities(q_full, q_skeleton, decision)
    delta_bar = information_budget(np.log(posterior), np.log(priors), clip, mode)
    q_lo, q_prior = priors.min(axis=1), priors.mean(axis=1)
    b2t = bits_to_trust(q_lo, h_star)
    isr = information_sufficiency_ratio(delta_bar, b2t)
    answer = answer_gate(isr, delta_bar, b2t, margin)
    return GatePlan(decision, delta_bar, q_lo, q_prior, b2t, isr, answer, risk_of_hallucination(delta_bar, q_prior))


# ------------------------------------------------------------------------------------------------
# Dispersion across permutations and the Jensen gap (Section 3)
# ------------------------------------------------------------------------------------------------

def mean_abs_residual(q: np.ndarray) -> np.ndarray:
    """E|R_pi| = mean_k |q_k - q_bar| per item (rows: items, columns: permutations)."""
    q = np.atleast_2d(np.asarray(q, dtype=float))
    return np.abs(q - q.mean(axis=1, keepdims=True)).mean(axis=1)


def mean_pair_difference(q: np.ndarray) -> np.ndarray:
    """E_pair = E|q_pi - q_pi'| for two independent uniform permutations, estimated over ordered pairs
    k != k' of the m sampled permutations (unbiased for i.i.d. permutations)."""
    q = np.atleast_2d(np.asarray(q, dtype=float))
    m = q.shape[1]
    if m < 2:
        raise ValueError("E_pair needs at least two permutations")
    diffs = np.abs(q[:, :, None] - q[:, None, :]).sum(axis=(1, 2))
    return diffs / (m * (m - 1))


def jensen_gap(p_gold: np.ndarray) -> np.ndarray:
    """J = E_k[-log S_k(Y)] - (-log E_k S_k(Y)) >= 0 per item: the log-loss gain of the uniform mixture."""
    p = _clip_prob(np.atleast_2d(p_gold))
    return -np.log(p).mean(axis=1) + np.log(p.mean(axis=1))


@dataclass(frozen=True)
class LogFit:
    intercept: float
    slope: float
    r2: float


def least_squares_fit(x: np.ndarray, y: np.ndarray) -> LogFit:
    """Ordinary least squares y = a + b x with R^2."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("a fit needs at least two distinct x values")
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    total = np.sum((y - y.mean()) ** 2)
    r2 = 1.0 - float(np.sum(residual**2) / total) if total > 0 else 1.0
    return LogFit(float(intercept), float(slope), r2)


def fit_log_growth(n: Sequence[float], dispersion: Sequence[float]) -> LogFit:
    """E|R|(n) = a + b ln n (the paper's dispersion law, C1)."""
    return least_squares_fit(np.log(np.asarray(n, dtype=float)), np.asarray(dispersion, dtype=float))


def bootstrap_log_slope(per_n_values: Sequence[np.ndarray], n: Sequence[float], resamples: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Bootstrap slopes b of a + b ln n: items are resampled with replacement within each n."""
    log_n = np.log(np.asarray(n, dtype=float))
    slopes = np.empty(resamples)
    for r in range(resamples):
        means = [values[rng.integers(0, len(values), len(values))].mean() for values in per_n_values]
        slopes[r] = np.polyfit(log_n, means, 1)[0]
    return slopes


# ------------------------------------------------------------------------------------------------
# QMV (Theorem 1) and the first-order positional model (Theorem 2)
# ------------------------------------------------------------------------------------------------

def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=float)))


def first_order_logits(weights: np.ndarray, phi: np.ndarray, ranks: np.ndarray, offset: float = 0.0) -> np.ndarray:
    """Theorem 2's model: logit q_pi = a + sum_i w_i phi(rank_i).

    ``ranks`` (perms, n) holds the 1-based rank of chunk i under each permutation; ``phi`` holds
    phi(1), ..., phi(n).
    """
    return offset + (np.asarray(weights)[None, :] * np.asarray(phi)[np.asarray(ranks) - 1]).sum(axis=1)


def harmonic_phi(n: int, scale: float) -> np.ndarray:
    """phi(r) = C ln r, r = 1..n: |phi(r+1) - phi(r)| = C ln(1 + 1/r) <= C / r (the harmonic regime)."""
    return scale * np.log(np.arange(1, n + 1, dtype=float))


def first_order_increments(weights: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """Delta_{i,t} = max_{j != i} |w_i - w_j| |phi(t+1) - phi(t)|, shape (n, n-1) [derived].

    Moving chunk i from rank t to t+1 swaps it with the chunk j at t+1; the logit changes by
    (w_i - w_j)(phi(t+1) - phi(t)), and the sup is over which chunk j sits there.
    """
    w = np.asarray(weights, dtype=float)
    gaps = np.abs(w[:, None] - w[None, :])
    np.fill_diagonal(gaps, -np.inf)
    step = np.abs(np.diff(np.asarray(phi, dtype=float)))
    return gaps.max(axis=1)[:, None] * step[None, :]


def qmv_bound(increments: np.ndarray) -> float:
    """Theorem 1: E|R| <= E_pair <= (1/4) sum_i TV_i, TV_i = sum_t Delta_{i,t}; 1/4 is sigmoid's Lipschitz constant."""
    return 0.25 * float(np.sum(increments))


def qmv_regular_decay_bound(c_total: float, n: int, alpha: float) -> float:
    """Closed forms of Theorem 1 under (alpha, C_tot)-regular decay Delta_{i,t} <= C_i t^-alpha.

    alpha < 1: (C/4)(n-1)^(1-alpha)/(1-alpha); alpha = 1: (C/4) H_{n-1} = O(log n);
    alpha > 1: (C/4) sum_t t^-alpha <= (C/4) zeta(alpha) = O(1) (the finite sum is returned).
    """
    if n < 2:
        return 0.0
    if alpha < 1:
        return 0.25 * c_total * (n - 1) ** (1 - alpha) / (1 - alpha)
    return 0.25 * c_total * float(np.sum(np.arange(1, n, dtype=float) ** -alpha))


def harmonic_number(n: int) -> float:
    """H_n = sum_{t=1}^{n} 1/t (H_0 = 0)."""
    return float(np.sum(1.0 / np.arange(1, n + 1)))


def official_martingale_bound(n: int, lipschitz: float = 1.0, c: float = 1.0) -> float:
    """The official code's first-order dispersion bound (L C / 8)(H_n - 1.5)."""
    return lipschitz * c / 8.0 * (harmonic_number(n) - 1.5)


def random_ranks(n: int, n_perms: int, rng: np.random.Generator) -> np.ndarray:
    """(n_perms, n) 1-based ranks of chunks 0..n-1 under uniform random permutations."""
    return np.argsort(rng.random((n_perms, n)), axis=1) + 1


def first_order_dispersion_mc(weights: np.ndarray, phi: np.ndarray, n_perms: int, rng: np.random.Generator,
                              offset: float = 0.0) -> tuple[float, float]:
    """Monte Carlo E|R| and E_pair of the first-order model (pairs: two independent permutation draws)."""
    n = len(weights)
    q = sigmoid(first_order_logits(weights, phi, random_ranks(n, n_perms, rng), offset))
    q_other = sigmoid(first_order_logits(weights, phi, random_ranks(n, n_perms, rng), offset))
    return float(np.abs(q - q.mean()).mean()), float(np.abs(q - q_other).mean())


def key_chunk_dispersion(n: int, scale: float = -0.5) -> float:
    """Exact E|R| when one key chunk (w = 1, others 0) carries phi(r) = scale ln r, logits centred to mean 0
    over its n equally likely ranks (acceptance check (a)5; the key-chunk form of Theorem 2)."""
    logits = harmonic_phi(n, scale)
    q = sigmoid(logits - logits.mean())
    return float(np.abs(q - q.mean()).mean())


# ------------------------------------------------------------------------------------------------
# EDFL (Theorem 5)
# ------------------------------------------------------------------------------------------------

def expected_divergence(posterior: np.ndarray, priors: np.ndarray) -> float:
    """Theorem 5's Delta_bar = E_k KL(P || S_k): the mean over the m priors (rows of ``priors``)."""
    return float(categorical_kl(np.asarray(posterior, float)[None, :], np.atleast_2d(priors)).mean())


def edfl_slack(posterior: np.ndarray, priors: np.ndarray, event: np.ndarray) -> float:
    """Delta_bar - KL(Ber(p) || Ber(q_bar)) with Delta_bar = mean_k KL(P || S_k), p = P(A), q_bar = mean_k S_k(A).

    Theorem 5 says this is >= 0 (data processing for each k, then convexity of KL in its second argument).
    """
    posterior, priors, event = np.asarray(posterior, float), np.atleast_2d(priors), np.asarray(event, bool)
    delta_bar = expected_divergence(posterior, priors)
    p, q_bar = posterior[event].sum(), priors[:, event].sum(axis=1).mean()
    return delta_bar - float(bernoulli_kl(min(p, 1.0), q_bar))


def exponential_tilt(prior: np.ndarray, event: np.ndarray, lam: float) -> np.ndarray:
    """P*(y) proportional to S(y) exp(lam 1[y in A]): the posterior at which EDFL is an equality (m = 1)."""
    weights = np.asarray(prior, float) * np.exp(lam * np.asarray(event, float))
    return weights / weights.sum()


# ------------------------------------------------------------------------------------------------
# Near-optimality of the uniform mixture (C4): exponentiated gradient over convex mixtures
# ------------------------------------------------------------------------------------------------

def mixture_log_loss(p_gold: np.ndarray, weights: np.ndarray) -> float:
    """Mean over items of -log sum_k w_k S_k(Y)."""
    return float(-np.log(_clip_prob(np.asarray(p_gold) @ np.asarray(weights))).mean())


def exponentiated_gradient_mixture(p_gold: np.ndarray, steps: int, lr: float) -> np.ndarray:
    """Weights on the simplex minimising :func:`mixture_log_loss` by exponentiated gradient from uniform."""
    p = _clip_prob(np.asarray(p_gold, dtype=float))
    m = p.shape[1]
    weights = np.full(m, 1.0 / m)
    for _ in range(steps):
        gradient = -(p / (p @ weights)[:, None]).mean(axis=0)
        weights = weights * np.exp(-lr * (gradient - gradient.min()))
        weights /= weights.sum()
    return weights


def uniform_mixture_gap(p_gold: np.ndarray, steps: int = 200, lr: float = 0.5) -> float:
    """Log loss of the uniform mixture minus that of the EG mixture (>= 0 up to optimisation error), nats."""
    p = np.asarray(p_gold, dtype=float)
    uniform = np.full(p.shape[1], 1.0 / p.shape[1])
    return mixture_log_loss(p, uniform) - mixture_log_loss(p, exponentiated_gradient_mixture(p, steps, lr))
