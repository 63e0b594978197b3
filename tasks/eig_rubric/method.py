"""EIG-selected rubrics as a pure library (no Prefect, no MLflow, no file layout). **[reconstructed]**

"Beyond Drift: Stabilizing Subjective LLM Evaluation with Information-Theoretic Rubrics" (ICML 2026; OpenReview
OzzbZvFr1c) states the method only in its abstract: generate a pool of evaluation questions, select a subset by
expected information gain (EIG), score a sample from the answers to the selected questions. Everything below is
reconstructed from that abstract and the prior work it names (Lindley 1956; Hu et al. 2024, "Uncertainty of
Thoughts"; Hashemi et al. 2024, LLM-Rubric):

- latent quality S in {0, ..., K-1} with prior p(s); binary answer A_j to question j with likelihood
  theta[j, s] = p(A_j = 1 | s); answers are independent given S (naive Bayes);
- EIG(j | Q) = I(S; A_j | A_Q) = H(S | A_Q) - H(S | A_Q, A_j), the expectation running over the answers A_Q
  (non-adaptive: the rubric is frozen before any sample is scored). H(S | A_Q) is exact, by enumerating the 2^|Q|
  answer patterns;
- greedy selection: add the question of largest conditional EIG until k questions or a gain below epsilon;
- scoring: p(s | a) proportional to p(s) prod_j theta[j, s]^a_j (1 - theta[j, s])^(1 - a_j); score = E[s | a];
- likelihoods, variant A: Laplace-smoothed frequencies on a labelled calibration set,
  theta[j, s] = (n_yes(j, s) + 1) / (n(s) + 2); variant B (label-free): the evaluator's own probability of "yes"
  under a hypothetical score s (``likelihoods_from_evaluator``).

Consistency and alignment metrics (the paper's metrics are not known; these are the standard ones it names in the
abstract's terms): Krippendorff's alpha (nominal, ordinal, interval), the one-way intraclass correlation ICC(1,1)
over re-judgings of the same item, and Spearman's rank correlation.

Entropies are in nats.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.stats import rankdata

# 2^MAX_ENUMERATED_QUESTIONS answer patterns are enumerated exactly; beyond that the cost doubles per question.
MAX_ENUMERATED_QUESTIONS = 16
AlphaMetric = Literal["nominal", "ordinal", "interval"]


def _as_likelihoods(theta: np.ndarray, name: str = "theta") -> np.ndarray:
    """A (questions, K) float array of probabilities in [0, 1]."""
    theta = np.asarray(theta, dtype=np.float64)
    if theta.ndim != 2:
        raise ValueError(f"{name} must be (questions, levels), got shape {theta.shape}")
    if np.any(~np.isfinite(theta)) or np.any(theta < 0) or np.any(theta > 1):
        raise ValueError(f"{name} must hold probabilities in [0, 1]")
    return theta


def _as_prior(prior: np.ndarray, n_levels: int) -> np.ndarray:
    prior = np.asarray(prior, dtype=np.float64)
    if prior.shape != (n_levels,):
        raise ValueError(f"prior must have shape ({n_levels},), got {prior.shape}")
    if np.any(prior < 0) or not np.isclose(prior.sum(), 1.0, atol=1e-9):
        raise ValueError("prior must be a probability vector (non-negative, summing to 1)")
    return prior


def entropy(p: np.ndarray) -> float:
    """H(p) = -sum_i p_i ln p_i over the entries of p, with 0 ln 0 = 0 (nats)."""
    p = np.asarray(p, dtype=np.float64).ravel()
    positive = p[p > 0]
    return float(-np.sum(positive * np.log(positive)))


def answer_patterns(n_questions: int) -> np.ndarray:
    """All 2^m binary answer patterns of m questions, (2^m, m) int8; row r holds the bits of r (question 0 first)."""
    if not 0 <= n_questions <= MAX_ENUMERATED_QUESTIONS:
        raise ValueError(f"exact enumeration needs 0 <= questions <= {MAX_ENUMERATED_QUESTIONS}, got {n_questions}")
    rows = np.arange(2**n_questions)[:, None]
    return ((rows >> np.arange(n_questions)[None, :]) & 1).astype(np.int8)


def log_likelihood(answers: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """log p(a | s) = sum_j [a_j ln theta[j, s] + (1 - a_j) ln(1 - theta[j, s])], (n, K) for answers (n, m).

    An answer that a likelihood of exactly 0 rules out gives -inf (never NaN: 0 * ln 0 is not formed)."""
    answers = np.atleast_2d(np.asarray(answers))
    if answers.shape[1] != theta.shape[0]:
        raise ValueError(f"answers have {answers.shape[1]} questions, theta has {theta.shape[0]}")
    with np.errstate(divide="ignore"):
        log_yes, log_no = np.log(theta), np.log1p(-theta)
    yes = answers.astype(bool)[:, :, None]
    return np.where(yes, log_yes[None], log_no[None]).sum(axis=1)


def joint_answer_level(theta: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """p(a, s) = p(s) prod_j p(a_j | s) for every answer pattern a of ``answer_patterns`` (rows) and level s."""
    theta = _as_likelihoods(theta)
    prior = _as_prior(prior, theta.shape[1])
    return prior[None, :] * np.exp(log_likelihood(answer_patterns(theta.shape[0]), theta))


def conditional_entropy(theta: np.ndarray, prior: np.ndarray) -> float:
    """H(S | A_Q) = H(S, A_Q) - H(A_Q), exact over the 2^|Q| answer patterns; H(S) when Q is empty."""
    joint = joint_answer_level(theta, prior)
    return entropy(joint) - entropy(joint.sum(axis=1))


def expected_information_gain(candidate: np.ndarray, selected: np.ndarray, prior: np.ndarray) -> float:
    """EIG(j | Q) = I(S; A_j | A_Q) = H(S | A_Q) - H(S | A_Q, A_j) for a candidate row theta[j] (K,) given the
    selected rows (m, K); ``selected`` may be empty (m = 0), which gives the marginal EIG I(S; A_j)."""
    candidate = np.asarray(candidate, dtype=np.float64)
    selected = np.asarray(selected, dtype=np.float64).reshape(-1, candidate.shape[0])
    with_candidate = np.vstack([selected, candidate[None, :]])
    return conditional_entropy(selected, prior) - conditional_entropy(with_candidate, prior)


@dataclass(frozen=True)
class Selection:
    """Greedy EIG selection: question indices in the order chosen and each one's conditional EIG when chosen."""

    indices: tuple[int, ...]
    gains: tuple[float, ...]


def greedy_eig_selection(theta: np.ndarray, prior: np.ndarray, k: int, epsilon: float = 0.0) -> Selection:
    """Greedy non-adaptive rubric: repeatedly add argmax_j EIG(j | Q) over the unselected questions (ties to the
    lowest index) until |Q| = k or the best gain is below ``epsilon`` (that question is not added)."""
    theta = _as_likelihoods(theta)
    if not 1 <= k <= min(theta.shape[0], MAX_ENUMERATED_QUESTIONS):
        raise ValueError(f"k must be in [1, min(questions, {MAX_ENUMERATED_QUESTIONS})], got {k}")
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    chosen: list[int] = []
    gains: list[float] = []
    while len(chosen) < k:
        candidates = [j for j in range(theta.shape[0]) if j not in chosen]
        scores = [expected_information_gain(theta[j], theta[chosen], prior) for j in candidates]
        best = int(np.argmax(scores))
        if scores[best] < epsilon:
            break
        chosen.append(candidates[best])
        gains.append(float(scores[best]))
    return Selection(tuple(chosen), tuple(gains))


def posterior(answers: np.ndarray, theta: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """p(s | a) proportional to p(s) prod_j theta[j, s]^a_j (1 - theta[j, s])^(1 - a_j); (n, K) for answers (n, m)."""
    theta = _as_likelihoods(theta)
    prior = _as_prior(prior, theta.shape[1])
    with np.errstate(divide="ignore"):
        log_joint = np.log(prior)[None, :] + log_likelihood(answers, theta)
    top = log_joint.max(axis=1, keepdims=True)
    if np.any(~np.isfinite(top)):
        raise ValueError("an answer pattern has zero probability under every level")
    weights = np.exp(log_joint - top)
    return weights / weights.sum(axis=1, keepdims=True)


def posterior_mean_score(answers: np.ndarray, theta: np.ndarray, prior: np.ndarray,
                         levels: np.ndarray | None = None) -> np.ndarray:
    """score = E[s | a] = sum_s s p(s | a), with s the level values (default 0, ..., K-1); (n,) for answers (n, m)."""
    post = posterior(answers, theta, prior)
    values = np.arange(post.shape[1], dtype=np.float64) if levels is None else np.asarray(levels, dtype=np.float64)
    return post @ values


def laplace_likelihoods(answers: np.ndarray, levels: np.ndarray, n_levels: int) -> np.ndarray:
    """Variant A: theta[j, s] = (n_yes(j, s) + 1) / (n(s) + 2) from binary answers (n, Q) and labels (n,)."""
    answers = np.asarray(answers)
    levels = np.asarray(levels)
    if answers.ndim != 2 or levels.shape != (answers.shape[0],):
        raise ValueError(f"answers (n, Q) and levels (n,) must agree, got {answers.shape} and {levels.shape}")
    if np.any((answers != 0) & (answers != 1)):
        raise ValueError("answers must be 0 or 1")
    if np.any(levels < 0) or np.any(levels >= n_levels):
        raise ValueError(f"levels must lie in [0, {n_levels})")
    onehot = (levels[:, None] == np.arange(n_levels)[None, :]).astype(np.float64)
    yes = answers.T.astype(np.float64) @ onehot
    return (yes + 1.0) / (onehot.sum(axis=0)[None, :] + 2.0)


def level_prior(levels: np.ndarray, n_levels: int) -> np.ndarray:
    """Laplace-smoothed level frequencies p(s) = (n(s) + 1) / (n + K)."""
    counts = np.bincount(np.asarray(levels), minlength=n_levels).astype(np.float64)
    if counts.shape[0] != n_levels:
        raise ValueError(f"levels must lie in [0, {n_levels})")
    return (counts + 1.0) / (counts.sum() + n_levels)


def likelihoods_from_evaluator(prob_yes: Callable[[int, int], float], n_questions: int, n_levels: int
                               ) -> np.ndarray:
    """Variant B (label-free): theta[j, s] = prob_yes(j, s), the evaluator's own probability of "yes" to question j
    for a sample it is told has score s (no human labels)."""
    theta = np.array([[float(prob_yes(j, s)) for s in range(n_levels)] for j in range(n_questions)])
    return _as_likelihoods(theta, "evaluator probabilities")


# --- consistency and alignment --------------------------------------------------------------------------


def _interval_alpha(values: np.ndarray) -> float:
    """Interval alpha of complete (units, m) data in closed form: with delta^2 = (x - x')^2 the coincidence sums are
    sum o delta^2 = sum_u 2 m / (m - 1) SS_u and sum n_c n_k delta^2 = 2 n SS, SS_u the squares about unit u's mean
    and SS those about the grand mean, so alpha = 1 - (n - 1) m sum_u SS_u / ((m - 1) n SS)."""
    m = values.shape[1]
    n = values.size
    within = float(np.sum((values - values.mean(axis=1, keepdims=True)) ** 2))
    total = float(np.sum((values - values.mean()) ** 2))
    if total == 0.0:
        return float("nan")
    return 1.0 - (n - 1) * m * within / ((m - 1) * n * total)


def _nominal_alpha(ratings: np.ndarray) -> float:
    """Nominal alpha of complete data: sum o delta^2 = sum_u (m^2 - sum_c n_uc^2) / (m - 1) and
    sum n_c n_k delta^2 = n^2 - sum_c n_c^2, with n_uc the count of value c in unit u."""
    m = ratings.shape[1]
    n = ratings.size
    values, index = np.unique(ratings, return_inverse=True)
    if values.size < 2:  # one value only: n^2 - sum n_c^2 = 0, alpha undefined
        return np.nan
    counts = np.zeros((ratings.shape[0], values.size))
    np.add.at(counts, (np.repeat(np.arange(ratings.shape[0]), m), index.ravel()), 1.0)
    observed = float(np.sum(m * m - np.sum(counts**2, axis=1))) / (m - 1)
    expected = float(n * n - np.sum(counts.sum(axis=0) ** 2))
    return 1.0 - (n - 1) * observed / expected


def krippendorff_alpha(ratings: np.ndarray, metric: AlphaMetric = "ordinal") -> float:
    """Krippendorff's alpha = 1 - D_o / D_e for complete data ``ratings`` (units, coders), coders >= 2
    (Krippendorff 2011, "Computing Krippendorff's alpha-reliability"): with coincidences o[c, k] and value totals
    n_c, alpha = 1 - (n - 1) sum o[c, k] delta^2(c, k) / sum n_c n_k delta^2(c, k).

    nominal: delta^2 = [c != k]; interval: (v_c - v_k)^2; ordinal: (sum_{g=c..k} n_g - (n_c + n_k) / 2)^2, which
    equals (M_k - M_c)^2 with M_g = sum_{h<g} n_h + n_g / 2 the mid-rank of value g: ordinal alpha is interval
    alpha on the average ranks of the pooled values. NaN when every value is equal."""
    ratings = np.asarray(ratings, dtype=np.float64)
    if ratings.ndim != 2 or ratings.shape[1] < 2 or ratings.shape[0] < 1:
        raise ValueError(f"ratings must be (units, coders >= 2), got shape {ratings.shape}")
    if np.any(~np.isfinite(ratings)):
        raise ValueError("ratings must be finite (complete data)")
    if metric == "nominal":
        return _nominal_alpha(ratings)
    if metric == "interval":
        return _interval_alpha(ratings)
    if metric == "ordinal":
        return _interval_alpha(rankdata(ratings.ravel()).reshape(ratings.shape))
    raise ValueError(f"unknown alpha metric {metric!r}; use nominal, ordinal or interval")


def icc_oneway(ratings: np.ndarray) -> float:
    """ICC(1,1), one-way random effects (Shrout & Fleiss 1979) for ratings (items, re-judgings):
    (MSB - MSW) / (MSB + (r - 1) MSW), MSB = r sum_i (mean_i - mean)^2 / (n - 1),
    MSW = sum_ij (x_ij - mean_i)^2 / (n (r - 1))."""
    ratings = np.asarray(ratings, dtype=np.float64)
    if ratings.ndim != 2 or ratings.shape[0] < 2 or ratings.shape[1] < 2:
        raise ValueError(f"ratings must be (items >= 2, re-judgings >= 2), got shape {ratings.shape}")
    n, r = ratings.shape
    item_means = ratings.mean(axis=1)
    between = r * float(np.sum((item_means - item_means.mean()) ** 2)) / (n - 1)
    within = float(np.sum((ratings - item_means[:, None]) ** 2)) / (n * (r - 1))
    denominator = between + (r - 1) * within
    return float("nan") if denominator == 0.0 else (between - within) / denominator


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rho: the Pearson correlation of the average ranks (ties share their mean rank)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.shape[0] < 2:
        raise ValueError(f"spearman needs two equal-length vectors of >= 2 values, got {x.shape} and {y.shape}")
    rx, ry = rankdata(x) - (x.shape[0] + 1) / 2.0, rankdata(y) - (x.shape[0] + 1) / 2.0
    denominator = float(np.sqrt(np.sum(rx**2) * np.sum(ry**2)))
    return float("nan") if denominator == 0.0 else float(np.sum(rx * ry)) / denominator
