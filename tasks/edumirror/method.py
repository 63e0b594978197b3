"""EduMirror's value-driven agent and dual-track measurement, as pure numeric functions.

The paper (arXiv 2606.07948, Section 3) describes agents whose psychological needs and social value orientation
(SVO) drive a planner, and a dual-track measurement: a Rater coding observable behaviour and a Surveyor reading
latent states through validated scales. The numeric forms below are **reconstructed** from the paper text and the
prior work it names (D2A's desire dynamics, Murphy's SVO angle); the paper gives none of the equations.

- SVO utility (Murphy's angle):               U = cos(theta) U_self + sin(theta) U_other
- Public-goods gain of contributing 1 unit:    self = m/N - 1, each other agent = m/N
- Deficit weights (Maslow-ordered softmax):    w = softmax(beta * prio_k * max(0, e_k - n_k))
- Need decay (D2A-style):                      n <- n + clip(b - n, -rate, rate), then clipped to [0, 10]
- RSES (Rosenberg, 10 items, 4-point):         sum of positive items + sum of (5 - reverse items)
- Cohen's kappa, Cronbach's alpha, Pearson / Spearman correlations, OLS slope: the measurement statistics.
- Expected validity of a Likert scale under the project's response model (closed form, no clipping): the
  reference that the Surveyor's correlation is compared with.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

NEED_NAMES = ("safety", "belonging", "esteem", "meaning", "health")
NEED_MIN, NEED_MAX = 0.0, 10.0
# Rosenberg Self-Esteem Scale: items 2, 5, 6, 8 and 9 (1-based) are negatively worded (reverse-coded).
RSES_REVERSE_ITEMS = (2, 5, 6, 8, 9)
RSES_POINTS = 4


def svo_utility(u_self: np.ndarray | float, u_other: np.ndarray | float, theta_deg: float) -> np.ndarray:
    """U = cos(theta) U_self + sin(theta) U_other with theta in degrees (Murphy's SVO angle)."""
    theta = math.radians(theta_deg)
    return math.cos(theta) * np.asarray(u_self, dtype=np.float64) + math.sin(theta) * np.asarray(
        u_other, dtype=np.float64)


def public_goods_gains(multiplier: float, n_agents: int, contribution: float = 1.0) -> tuple[float, float]:
    """Payoff change of contributing ``contribution`` to a linear public good shared equally by ``n_agents``:
    (gain to the contributor, summed gain to the n - 1 others) = (c (m/N - 1), c m (N - 1) / N)."""
    if n_agents < 2:
        raise ValueError(f"a public-goods game needs >= 2 agents, got {n_agents}")
    share = multiplier * contribution / n_agents
    return share - contribution, share * (n_agents - 1)


def public_goods_utility_difference(theta_deg: float, multiplier: float, n_agents: int) -> float:
    """U(contribute) - U(free-ride) of one agent under SVO angle theta (other gain summed over the others)."""
    u_self, u_other = public_goods_gains(multiplier, n_agents)
    return float(svo_utility(u_self, u_other, theta_deg))


def deficit_weights(needs: np.ndarray, targets: np.ndarray, priorities: np.ndarray, beta: float) -> np.ndarray:
    """w = softmax(beta * prio_k * max(0, e_k - n_k)) over the last axis (numerically stable)."""
    logits = beta * np.asarray(priorities) * np.maximum(0.0, np.asarray(targets) - np.asarray(needs))
    logits = logits - logits.max(axis=-1, keepdims=True)
    expd = np.exp(logits)
    return expd / expd.sum(axis=-1, keepdims=True)


def decay_toward_baseline(needs: np.ndarray, baseline: float, rate: float) -> np.ndarray:
    """One tick of need decay: each need moves ``rate`` toward ``baseline`` without overshooting it."""
    needs = np.asarray(needs, dtype=np.float64)
    return needs + np.clip(baseline - needs, -rate, rate)


def clip_needs(needs: np.ndarray) -> np.ndarray:
    """Needs live on the paper's 0-10 scale."""
    return np.clip(needs, NEED_MIN, NEED_MAX)


def softmax_probabilities(utilities: np.ndarray, temperature: float) -> np.ndarray:
    """Selection probabilities softmax(U / tau) of the planner's select step."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = np.asarray(utilities, dtype=np.float64) / temperature
    z = z - z.max()
    p = np.exp(z)
    return p / p.sum()


def affinity_update(affinity: float, signed_effect: float, rate: float) -> float:
    """Reflect step: R_ij <- clip(R_ij + rate * tanh(effect of j on i), -1, 1)."""
    return float(np.clip(affinity + rate * math.tanh(signed_effect), -1.0, 1.0))


def reverse_code(answers: np.ndarray, points: int, reverse_items: Sequence[int]) -> np.ndarray:
    """Answers on a 1..points scale with the given 1-based items reversed (points + 1 - answer)."""
    coded = np.array(answers, dtype=np.float64, copy=True)
    index = [i - 1 for i in reverse_items]
    coded[..., index] = points + 1 - coded[..., index]
    return coded


def rses_score(answers: np.ndarray) -> np.ndarray:
    """Rosenberg Self-Esteem Scale total (10..40): positive items as answered, items 2, 5, 6, 8, 9 reversed."""
    answers = np.asarray(answers, dtype=np.float64)
    if answers.shape[-1] != 10:
        raise ValueError(f"RSES has 10 items, got {answers.shape[-1]}")
    return reverse_code(answers, RSES_POINTS, RSES_REVERSE_ITEMS).sum(axis=-1)


def cohens_kappa(confusion: np.ndarray) -> float:
    """kappa = (p_o - p_e) / (1 - p_e) from a square confusion matrix (rows: truth, columns: rating)."""
    c = np.asarray(confusion, dtype=np.float64)
    n = c.sum()
    p_observed = np.trace(c) / n
    p_expected = float(c.sum(axis=1) @ c.sum(axis=0)) / n**2
    if p_expected == 1.0:
        return 1.0 if p_observed == 1.0 else 0.0
    return float((p_observed - p_expected) / (1.0 - p_expected))


def confusion_matrix(truth: Sequence[int], rated: Sequence[int], n_classes: int) -> np.ndarray:
    """Counts of (true class, rated class) pairs."""
    c = np.zeros((n_classes, n_classes), dtype=np.int64)
    np.add.at(c, (np.asarray(truth, dtype=np.int64), np.asarray(rated, dtype=np.int64)), 1)
    return c


def cronbach_alpha(items: np.ndarray) -> float:
    """alpha = k/(k-1) (1 - sum_i var(item_i) / var(total)) for a (respondents, k items) matrix (ddof 1)."""
    x = np.asarray(items, dtype=np.float64)
    k = x.shape[1]
    if k < 2:
        raise ValueError("Cronbach's alpha needs >= 2 items")
    total_var = x.sum(axis=1).var(ddof=1)
    if total_var == 0:
        return float("nan")
    return float(k / (k - 1) * (1.0 - x.var(axis=0, ddof=1).sum() / total_var))


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson correlation of two equal-length vectors."""
    x = np.asarray(x, dtype=np.float64) - np.mean(x)
    y = np.asarray(y, dtype=np.float64) - np.mean(y)
    denominator = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / denominator if denominator > 0 else float("nan")


def average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n with ties given their average rank."""
    x = np.asarray(x, dtype=np.float64)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    start = 0
    while start < len(x):
        stop = start
        while stop + 1 < len(x) and sorted_x[stop + 1] == sorted_x[start]:
            stop += 1
        ranks[order[start:stop + 1]] = (start + stop) / 2.0 + 1.0
        start = stop + 1
    return ranks


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation (Pearson of average ranks)."""
    return pearson(average_ranks(x), average_ranks(y))


def ols_slope(values: np.ndarray) -> float:
    """Least-squares slope of values against their index 0..T-1 (need change per tick)."""
    y = np.asarray(values, dtype=np.float64)
    t = np.arange(len(y), dtype=np.float64)
    t = t - t.mean()
    return float(t @ (y - y.mean()) / (t @ t))


def ordering_margin(punitive: float, individual: float, cooperative: float) -> float:
    """Smallest gap of the ordering cooperative > individual > punitive (composite change vs neglect);
    positive exactly when the strict ordering among the active strategies holds."""
    return float(min(cooperative - individual, individual - punitive))


def expected_scale_r(latent_sd: float, latent_range: float, points: int, n_items: int, n_reverse: int,
                     noise_sd: float, acquiescence_sd: float) -> float:
    """Pearson r between a latent trait and the reverse-coded mean of its Likert items, in closed form.

    Response model (measurement.likert): answer = round(1 + (points - 1) L + a + e) with L = latent / range,
    a ~ N(0, acquiescence_sd^2) shared by a respondent's items, e ~ N(0, noise_sd^2) per item; a reverse-worded
    item answers with 1 - L and is reverse-coded (points + 1 - answer), which flips the sign of its a and e.
    Treating the rounding error as an independent uniform (variance 1/12) and ignoring the clipping at 1 and
    ``points`` (which only attenuates r further), the mean of the k coded items is
    1 + (points - 1) L + a (k - 2 r) / k + noise of variance (noise_sd^2 + 1/12) / k, so
    r = (points - 1) sd(L) / sqrt((points - 1)^2 var(L) + acq^2 (k - 2 r)^2 / k^2 + (noise^2 + 1/12) / k)."""
    if n_items < 1 or not 0 <= n_reverse <= n_items:
        raise ValueError(f"need 1 <= n_items and 0 <= n_reverse <= n_items, got {n_items}, {n_reverse}")
    signal = (points - 1) * latent_sd / latent_range
    bias = acquiescence_sd * (n_items - 2 * n_reverse) / n_items
    noise_var = (noise_sd ** 2 + 1.0 / 12.0) / n_items
    return float(signal / math.sqrt(signal ** 2 + bias ** 2 + noise_var))
