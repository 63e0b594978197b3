"""order_sensitivity method: exact values on non-degenerate inputs, computed by hand in plain Python
beside the library, each with a negative control that monkeypatches a broken variant into `method`
(issue 20: the planner's q_lo and Delta-bar with distinct skeleton priors, the QMV bound as a value)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tasks.order_sensitivity import method


def ber_kl(p: float, q: float) -> float:
    out = 0.0
    if p > 0:
        out += p * math.log(p / q)
    if p < 1:
        out += (1 - p) * math.log((1 - p) / (1 - q))
    return out


# Algorithm 1 with distinct skeleton priors ---------------------------------------------------------

Q_FULL = np.array([[0.9, 0.8, 0.7], [0.2, 0.4, 0.1], [0.6, 0.55, 0.4]])
Q_SKELETON = np.array([[0.6, 0.25], [0.5, 0.35], [0.45, 0.7]])
H_STAR, CLIP = 0.3, 1.0


def plan_by_hand(mode: str) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in ("decision", "delta_bar", "q_lo", "q_prior", "b2t", "isr")}
    for full, skeleton in zip(Q_FULL.tolist(), Q_SKELETON.tolist()):
        y = 1 if sum(full) / 3 >= 0.5 else 0
        post = [q if y == 1 else 1 - q for q in full[:2]]
        prior = [s if y == 1 else 1 - s for s in skeleton]
        low = -CLIP if mode == "symmetric" else 0.0
        lifts = [min(CLIP, max(low, math.log(p) - math.log(s))) for p, s in zip(post, prior)]
        delta = sum(lifts) / 2
        b2t = ber_kl(1 - H_STAR, min(prior))
        out["decision"].append(y)
        out["delta_bar"].append(delta)
        out["q_lo"].append(min(prior))
        out["q_prior"].append(sum(prior) / 2)
        out["b2t"].append(b2t)
        out["isr"].append(delta / b2t)
    return out


def plan_check(mode: str = "symmetric") -> bool:
    plan = method.plan_answers(Q_FULL, Q_SKELETON, H_STAR, CLIP, mode)
    want = plan_by_hand(mode)
    ok = all(np.allclose(getattr(plan, key), value, atol=1e-12, rtol=0) for key, value in want.items())
    return ok and plan.answer.tolist() == [isr >= 1 for isr in want["isr"]]


@pytest.mark.parametrize("mode", ["symmetric", "one_sided"])
def test_plan_answers_exact_with_distinct_skeleton_priors(mode):
    want = plan_by_hand(mode)
    # non-degenerate: priors differ within each item, a lift is clipped (item 0: log(0.8/0.25) > 1), a lift is
    # negative (item 2: log(0.55/0.7) < 0), and the gate both answers and abstains.
    assert all(len(set(row)) == 2 for row in Q_SKELETON.tolist())
    assert want["decision"] == [1, 0, 1]
    assert plan_check(mode)


def test_plan_answers_gate_is_not_constant():
    plan = method.plan_answers(Q_FULL, Q_SKELETON, H_STAR, CLIP, "symmetric")
    assert 0 < plan.answer.sum() < len(plan.answer)
    # roh: 1 - p_max(Delta_bar, q_prior), with p_max the supremum where KL(Ber(p) || Ber(q_prior)) <= Delta_bar
    for delta, prior, roh in zip(plan.delta_bar, plan.q_prior, plan.roh):
        p = 1 - roh
        if delta <= 0:
            assert p == pytest.approx(prior, abs=1e-9)
        elif p < 1:
            assert ber_kl(p, prior) == pytest.approx(delta, abs=1e-9) and p > prior


BROKEN_PLANNER = {
    # B2T's KL arguments swapped; Delta_bar as a max; skeletons paired with the last permutations; no one-sided clip
    "bits_to_trust": lambda q_lo, h: method.bernoulli_kl(q_lo, 1.0 - h),  # arguments swapped
    "information_budget": lambda lp, lq, clip, mode: method.clip_lift(lp - lq, clip, mode).max(axis=-1),
    "paired_label_probabilities": lambda qf, qs, d: (
        method._clip_prob(method.label_probability(qf[:, -qs.shape[1]:], d)),
        method._clip_prob(method.label_probability(qs, d))),
    "clip_lift": lambda u, clip, mode: np.clip(u, -clip, clip),  # one-sided mode ignored
}


@pytest.mark.parametrize("name", sorted(BROKEN_PLANNER))
def test_negative_control_broken_planner_part_fails(monkeypatch, name):
    monkeypatch.setattr(method, name, BROKEN_PLANNER[name])
    assert not (plan_check("symmetric") and plan_check("one_sided"))


def test_negative_control_q_lo_as_mean_fails(monkeypatch):
    original = method.plan_answers

    def mean_q_lo(*args, **kwargs):
        plan = original(*args, **kwargs)
        return method.GatePlan(plan.decision, plan.delta_bar, plan.q_prior, plan.q_prior, plan.b2t, plan.isr,
                               plan.answer, plan.roh)

    monkeypatch.setattr(method, "plan_answers", mean_q_lo)
    assert not plan_check()


def test_plan_answers_with_margin_and_bad_shapes():
    plan = method.plan_answers(Q_FULL, Q_SKELETON, H_STAR, CLIP, "symmetric", margin=0.05)
    want = plan_by_hand("symmetric")
    assert plan.answer.tolist() == [i >= 1 and d >= b + 0.05 for i, d, b in
                                    zip(want["isr"], want["delta_bar"], want["b2t"])]
    with pytest.raises(ValueError):
        method.plan_answers(Q_FULL, np.ones((3, 4)) * 0.5, H_STAR, CLIP, "symmetric")
    with pytest.raises(ValueError):
        method.plan_answers(Q_FULL[0], Q_SKELETON, H_STAR, CLIP, "symmetric")


# KL, entropy, ISR, gate ---------------------------------------------------------------------------

def test_bernoulli_and_categorical_kl_and_entropy_exact():
    assert float(method.bernoulli_kl(0.3, 0.6)) == pytest.approx(ber_kl(0.3, 0.6), abs=1e-15)
    assert float(method.bernoulli_kl(1.0, 0.25)) == pytest.approx(-math.log(0.25), abs=1e-15)
    assert float(method.bernoulli_kl(0.0, 0.25)) == pytest.approx(-math.log(0.75), abs=1e-15)
    p, s = [0.5, 0.3, 0.2], [0.2, 0.5, 0.3]
    want = sum(a * math.log(a / b) for a, b in zip(p, s))
    assert float(method.categorical_kl(np.array(p), np.array(s))) == pytest.approx(want, abs=1e-15)
    assert float(method.categorical_kl(np.array([0.0, 1.0]), np.array([0.5, 0.5]))) == pytest.approx(math.log(2))
    assert float(method.binary_entropy(0.2)) == pytest.approx(-(0.2 * math.log(0.2) + 0.8 * math.log(0.8)))
    assert float(method.binary_entropy(0.0)) == 0.0
    with pytest.raises(ValueError):
        method.bernoulli_kl(1.2, 0.5)


def test_isr_gate_and_label_probability_exact():
    isr = method.information_sufficiency_ratio(np.array([0.6, 0.3, 0.0, 0.2]), np.array([0.4, 0.6, 0.0, 0.0]))
    assert isr.tolist() == pytest.approx([1.5, 0.5, 1.0, math.inf])  # 0 / 0: a zero budget meets a zero need
    assert method.answer_gate(np.array([1.5, 1.0, 0.99])).tolist() == [True, True, False]
    gated = method.answer_gate(np.array([1.5, 1.2]), np.array([0.6, 0.5]), np.array([0.4, 0.45]), margin=0.1)
    assert gated.tolist() == [True, False]
    got = method.label_probability(np.array([[0.2, 0.7], [0.6, 0.9]]), np.array([1, 0]))
    assert np.allclose(got, [[0.2, 0.7], [0.4, 0.1]])


def test_p_max_is_the_kl_inverse_and_reaches_one():
    p = float(method.p_max(0.2, 0.4))
    assert p > 0.4 and ber_kl(p, 0.4) == pytest.approx(0.2, abs=1e-10)
    assert float(method.p_max(-math.log(0.4) + 1e-3, 0.4)) == 1.0
    assert float(method.risk_of_hallucination(0.0, 0.3)) == pytest.approx(0.7, abs=1e-10)


# QMV (Theorem 1) as an exact value --------------------------------------------------------------

WEIGHTS = np.array([0.1, 0.5, 1.2, -0.4])
PHI = np.array([0.0, -0.7, -1.1, -1.3])


def increments_by_hand() -> list[list[float]]:
    w, phi = WEIGHTS.tolist(), PHI.tolist()
    out = []
    for i in range(4):
        gap = max(abs(w[i] - w[j]) for j in range(4) if j != i)
        out.append([gap * abs(phi[t + 1] - phi[t]) for t in range(3)])
    return out


def qmv_check() -> bool:
    increments = method.first_order_increments(WEIGHTS, PHI)
    want = increments_by_hand()
    return (np.allclose(increments, want, atol=1e-15)
            and method.qmv_bound(increments) == pytest.approx(0.25 * sum(map(sum, want)), abs=1e-15))


def test_qmv_bound_exact_value():
    # (0.25) * sum_i max_j |w_i - w_j| * (0.7 + 0.4 + 0.2): gaps 1.1, 0.9, 1.6, 1.6 -> 0.25 * 5.2 * 1.3
    assert method.qmv_bound(method.first_order_increments(WEIGHTS, PHI)) == pytest.approx(0.25 * 5.2 * 1.3)
    assert qmv_check()


@pytest.mark.parametrize("broken", ["half", "min_gap"])
def test_negative_control_qmv_variants_fail(monkeypatch, broken):
    if broken == "half":
        monkeypatch.setattr(method, "qmv_bound", lambda inc: 0.5 * float(np.sum(inc)))
    else:
        def min_gap(weights, phi):
            w = np.asarray(weights, float)
            gaps = np.abs(w[:, None] - w[None, :])
            np.fill_diagonal(gaps, np.inf)
            return gaps.min(axis=1)[:, None] * np.abs(np.diff(phi))[None, :]
        monkeypatch.setattr(method, "first_order_increments", min_gap)
    assert not qmv_check()


def test_qmv_regular_decay_closed_forms():
    assert method.qmv_regular_decay_bound(2.0, 5, 0.5) == pytest.approx(0.25 * 2.0 * 4**0.5 / 0.5)
    assert method.qmv_regular_decay_bound(2.0, 5, 1.0) == pytest.approx(0.5 * (1 + 1 / 2 + 1 / 3 + 1 / 4))
    assert method.qmv_regular_decay_bound(2.0, 4, 2.0) == pytest.approx(0.5 * (1 + 1 / 4 + 1 / 9))
    assert method.qmv_regular_decay_bound(2.0, 1, 0.5) == 0.0
    assert method.harmonic_number(4) == pytest.approx(25 / 12) and method.harmonic_number(0) == 0.0
    assert method.official_martingale_bound(4, lipschitz=2.0, c=3.0) == pytest.approx(6 / 8 * (25 / 12 - 1.5))


def test_first_order_logits_and_key_chunk_exact():
    ranks = np.array([[1, 2, 3, 4], [4, 3, 2, 1]])
    got = method.first_order_logits(WEIGHTS, PHI, ranks, offset=0.3)
    want = [0.3 + sum(w * PHI[r - 1] for w, r in zip(WEIGHTS, row)) for row in ranks.tolist()]
    assert np.allclose(got, want, atol=1e-15)
    assert np.allclose(method.harmonic_phi(3, -0.5), [0.0, -0.5 * math.log(2), -0.5 * math.log(3)])
    logits = [0.0, -0.5 * math.log(2), -0.5 * math.log(3)]
    centred = [x - sum(logits) / 3 for x in logits]
    q = [1 / (1 + math.exp(-x)) for x in centred]
    want_er = sum(abs(v - sum(q) / 3) for v in q) / 3
    assert method.key_chunk_dispersion(3, -0.5) == pytest.approx(want_er, abs=1e-15)
    assert float(method.sigmoid(0.7)) == pytest.approx(1 / (1 + math.exp(-0.7)), abs=1e-15)
    ranks = method.random_ranks(5, 3, np.random.default_rng(0))
    assert sorted(ranks[0].tolist()) == [1, 2, 3, 4, 5] and ranks.shape == (3, 5)


# Dispersion, Jensen gap, fits ---------------------------------------------------------------------

Q = np.array([[0.2, 0.5, 0.9], [0.4, 0.4, 0.7]])


def test_dispersion_measures_exact():
    er = [sum(abs(v - sum(row) / 3) for v in row) / 3 for row in Q.tolist()]
    pairs = [sum(abs(a - b) for a in row for b in row) / 6 for row in Q.tolist()]
    jensen = [-sum(math.log(v) for v in row) / 3 + math.log(sum(row) / 3) for row in Q.tolist()]
    assert np.allclose(method.mean_abs_residual(Q), er, atol=1e-15)
    assert np.allclose(method.mean_pair_difference(Q), pairs, atol=1e-15)
    assert np.allclose(method.jensen_gap(Q), jensen, atol=1e-15)
    with pytest.raises(ValueError):
        method.mean_pair_difference(np.array([[0.3]]))


def test_least_squares_and_log_growth_exact():
    fit = method.least_squares_fit(np.array([0.0, 1.0, 2.0, 3.0]), np.array([1.0, 2.5, 3.5, 5.5]))
    # slope = cov/var = (sum (x-1.5)(y-3.125)) / 5 = 7.25 / 5; intercept = 3.125 - 1.45 * 1.5
    assert fit.slope == pytest.approx(1.45) and fit.intercept == pytest.approx(0.95)
    residual = [y - (0.95 + 1.45 * x) for x, y in zip([0, 1, 2, 3], [1.0, 2.5, 3.5, 5.5])]
    total = sum((y - 3.125) ** 2 for y in [1.0, 2.5, 3.5, 5.5])
    assert fit.r2 == pytest.approx(1 - sum(r * r for r in residual) / total)
    law = method.fit_log_growth([2, 4, 8], [0.1 + 0.3 * math.log(n) for n in (2, 4, 8)])
    assert law.slope == pytest.approx(0.3) and law.intercept == pytest.approx(0.1) and law.r2 == pytest.approx(1.0)
    assert method.least_squares_fit(np.array([1.0, 2.0]), np.array([3.0, 3.0])).r2 == 1.0
    with pytest.raises(ValueError):
        method.least_squares_fit(np.array([1.0, 1.0]), np.array([0.0, 1.0]))


def test_bootstrap_log_slope_on_an_exact_law_is_that_slope():
    values = [np.full(5, 0.2 + 0.4 * math.log(n)) for n in (2, 4, 8)]
    slopes = method.bootstrap_log_slope(values, [2, 4, 8], resamples=7, rng=np.random.default_rng(0))
    assert slopes.shape == (7,) and np.allclose(slopes, 0.4)


# EDFL and mixtures --------------------------------------------------------------------------------

POSTERIOR = np.array([0.6, 0.3, 0.1])
PRIORS = np.array([[0.2, 0.5, 0.3], [0.4, 0.4, 0.2]])
EVENT = np.array([True, False, True])


def test_expected_divergence_and_edfl_slack_exact():
    kls = [sum(p * math.log(p / s) for p, s in zip(POSTERIOR, row)) for row in PRIORS.tolist()]
    assert method.expected_divergence(POSTERIOR, PRIORS) == pytest.approx(sum(kls) / 2, abs=1e-15)
    p, q_bar = 0.7, (0.5 + 0.6) / 2
    assert method.edfl_slack(POSTERIOR, PRIORS, EVENT) == pytest.approx(sum(kls) / 2 - ber_kl(p, q_bar), abs=1e-12)


def test_exponential_tilt_exact():
    tilt = method.exponential_tilt(np.array([0.2, 0.5, 0.3]), EVENT, 0.8)
    raw = [0.2 * math.exp(0.8), 0.5, 0.3 * math.exp(0.8)]
    assert np.allclose(tilt, [r / sum(raw) for r in raw], atol=1e-15)


def test_mixture_log_loss_and_eg_exact():
    p_gold = np.array([[0.9, 0.1], [0.6, 0.2], [0.3, 0.4]])
    w = np.array([0.7, 0.3])
    want = -sum(math.log(a * 0.7 + b * 0.3) for a, b in p_gold.tolist()) / 3
    assert method.mixture_log_loss(p_gold, w) == pytest.approx(want, abs=1e-15)
    # one EG step from uniform, by hand
    mix = [a * 0.5 + b * 0.5 for a, b in p_gold.tolist()]
    grad = [-sum(row[k] / m for row, m in zip(p_gold.tolist(), mix)) / 3 for k in range(2)]
    raw = [0.5 * math.exp(-0.3 * (g - min(grad))) for g in grad]
    assert np.allclose(method.exponentiated_gradient_mixture(p_gold, 1, 0.3), [r / sum(raw) for r in raw])
    gap = method.uniform_mixture_gap(p_gold, steps=300, lr=0.5)
    assert gap > 0.01  # slot 0 is better: the uniform mixture is beaten
    assert method.uniform_mixture_gap(np.array([[0.5, 0.5], [0.2, 0.2]])) == pytest.approx(0.0, abs=1e-12)


# Survivors of `make mutation SLUG=order_sensitivity` -------------------------------------------------

def test_bernoulli_kl_domain_tolerance_is_1e_9():
    assert float(method.bernoulli_kl(-1e-10, 0.5)) == pytest.approx(math.log(2))  # rounding noise accepted
    for bad in (-1e-8, -0.5, 1 + 1e-8):
        with pytest.raises(ValueError):
            method.bernoulli_kl(bad, 0.5)


def test_bits_to_trust_rejects_h_star_at_the_ends():
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError):
            method.bits_to_trust(0.5, bad)


def test_first_order_logits_default_offset_is_zero():
    ranks = np.array([[2, 1, 4, 3]])
    want = sum(w * PHI[r - 1] for w, r in zip(WEIGHTS, ranks[0]))
    assert method.first_order_logits(WEIGHTS, PHI, ranks).tolist() == pytest.approx([want], abs=1e-15)


# Survivors of the full run (issue 20, second pass): float32 inputs, boundaries, defaults, argument plumbing --------

def f32(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def f32_as_f64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.float32).astype(np.float64)


# Each case: (name, call on the inputs passed through `cast`). The library converts to float64 first, so float32
# inputs must give exactly the result of their float64 copies; float32 arithmetic is off by ~1e-8.
FLOAT32_CASES = {
    "binary_entropy": lambda cast: method.binary_entropy(cast([0.1, 0.35])),
    "label_probability": lambda cast: method.label_probability(cast([[0.1, 0.7]]), np.array([0])),
    "mean_abs_residual": lambda cast: method.mean_abs_residual(cast([[0.1, 0.7, 0.35]])),
    "mean_pair_difference": lambda cast: method.mean_pair_difference(cast([[0.1, 0.7, 0.35]])),
    "sigmoid": lambda cast: method.sigmoid(cast([0.3, -1.7])),
    "first_order_increments_weights": lambda cast: method.first_order_increments(cast([0.1, 0.7, -0.35]), PHI[:3]),
    "first_order_increments_phi": lambda cast: method.first_order_increments(WEIGHTS[:3], cast([0.0, -0.1, -1.3])),
    "least_squares_fit": lambda cast: list(vars(method.least_squares_fit(cast([0.1, 1.3, 2.7]), cast([0.7, 0.2, 1.9])
                                                                         )).values()),
    "fit_log_growth": lambda cast: list(vars(method.fit_log_growth(cast([2.3, 4.1, 8.9]), [0.1, 0.3, 0.35])).values()),
    "exponential_tilt_event": lambda cast: method.exponential_tilt(np.array([0.2, 0.5, 0.3]), cast([1.0, 0.0, 1.0]),
                                                                   0.7),
    "bernoulli_kl": lambda cast: method.bernoulli_kl(cast([0.1, 0.35]), cast([0.6, 0.3])),
    "categorical_kl": lambda cast: method.categorical_kl(np.array([0.5, 0.3, 0.2]), cast([0.2, 0.5, 0.3])),
    "edfl_slack": lambda cast: np.asarray(method.edfl_slack(cast([0.6, 0.3, 0.1]), PRIORS, EVENT)),
}


def check_float32_input(name: str) -> None:
    low, high = FLOAT32_CASES[name](f32), FLOAT32_CASES[name](f32_as_f64)
    assert np.asarray(low).dtype == np.float64
    assert np.array_equal(np.asarray(low), np.asarray(high))


@pytest.mark.parametrize("name", sorted(FLOAT32_CASES))
def test_float32_inputs_give_the_float64_result(name):
    check_float32_input(name)


@pytest.mark.parametrize("name", sorted(FLOAT32_CASES))
def test_negative_control_float32_arithmetic_is_caught(monkeypatch, name):
    """A library that keeps float32 inputs in float32 (here: rounds the result when an input is float32) fails."""
    function = {"first_order_increments_weights": "first_order_increments",
                "first_order_increments_phi": "first_order_increments",
                "exponential_tilt_event": "exponential_tilt"}.get(name, name)
    original = getattr(method, function)

    def in_float32(*args, **kwargs):
        result = original(*args, **kwargs)
        if not any(getattr(a, "dtype", None) == np.float32 for a in args):
            return result
        if isinstance(result, method.LogFit):
            return method.LogFit(*(float(np.float32(v)) for v in vars(result).values()))
        return np.asarray(result).astype(np.float32)

    monkeypatch.setattr(method, function, in_float32)
    with pytest.raises(AssertionError):
        check_float32_input(name)


def extended(values) -> np.ndarray:
    """np.longdouble values with bits below float64's precision (80-bit on x86-64 Linux; where longdouble is
    float64 the extra factor rounds away and both sides of the check below are trivially equal)."""
    return np.asarray(values, dtype=np.longdouble) * (1 + np.longdouble(2) ** -60)


def extended_as_f64(values) -> np.ndarray:
    return extended(values).astype(np.float64)


# Extended precision is cast to float64 on entry as well: the result is the float64-rounded input's, in float64.
LONGDOUBLE_CASES = {
    "exponential_tilt_prior": lambda cast: method.exponential_tilt(cast([0.2, 0.5, 0.3]), EVENT, 0.8),
    "information_sufficiency_ratio_delta": lambda cast: method.information_sufficiency_ratio(
        cast([0.6, 0.2]), np.array([0.7, 0.1])),
    "information_sufficiency_ratio_b2t": lambda cast: method.information_sufficiency_ratio(
        np.array([0.6, 0.2]), cast([0.7, 0.1])),
    "uniform_mixture_gap": lambda cast: method.uniform_mixture_gap(cast([[0.9, 0.1], [0.6, 0.2], [0.3, 0.4]])),
    "p_max_delta": lambda cast: method.p_max(cast([0.2, 0.05]), 0.4),
    "least_squares_fit_x": lambda cast: list(vars(method.least_squares_fit(cast([0.1, 1.3, 2.7]),
                                                                           [0.7, 0.2, 1.9])).values()),
}


def check_longdouble_input(name: str) -> None:
    low, high = LONGDOUBLE_CASES[name](extended), LONGDOUBLE_CASES[name](extended_as_f64)
    assert np.asarray(low).dtype == np.float64
    assert np.array_equal(np.asarray(low), np.asarray(high))


@pytest.mark.parametrize("name", sorted(LONGDOUBLE_CASES))
def test_longdouble_inputs_are_cast_to_float64(name):
    check_longdouble_input(name)


@pytest.mark.skipif(np.finfo(np.longdouble).nmant <= np.finfo(np.float64).nmant, reason="longdouble is float64")
@pytest.mark.parametrize("name", sorted(LONGDOUBLE_CASES))
def test_negative_control_extended_arithmetic_is_caught(monkeypatch, name):
    """A library that keeps extended precision (here: returns the result in longdouble) fails the same check."""
    function = next(f for f in ("exponential_tilt", "information_sufficiency_ratio", "uniform_mixture_gap", "p_max",
                                "least_squares_fit") if name.startswith(f))
    original = getattr(method, function)

    def extended_result(*args, **kwargs):
        result = original(*args, **kwargs)
        if not any(getattr(a, "dtype", None) == np.longdouble for a in args):
            return result
        if isinstance(result, method.LogFit):
            return method.LogFit(*(v * (1 + np.longdouble(2) ** -60) for v in vars(result).values()))
        return np.asarray(result, dtype=np.longdouble) * (1 + np.longdouble(2) ** -60)

    monkeypatch.setattr(method, function, extended_result)
    with pytest.raises(AssertionError):
        check_longdouble_input(name)


def test_regression_on_a_boolean_regressor():
    """A 0/1 regressor given as bool is converted to float (numpy's ptp refuses booleans): y = 1 + 2 x exactly."""
    fit = method.least_squares_fit(np.array([False, True, True, False]), np.array([1.0, 3.0, 3.0, 1.0]))
    assert (fit.intercept, fit.slope, fit.r2) == pytest.approx((1.0, 2.0, 1.0), abs=1e-12)


def test_negative_control_boolean_regressor_without_the_cast_is_caught(monkeypatch):
    real = method.least_squares_fit

    def uncast(x, y):
        np.ptp(np.asarray(x))  # what the library would do without converting x first
        return real(x, y)

    monkeypatch.setattr(method, "least_squares_fit", uncast)
    with pytest.raises(TypeError):
        test_regression_on_a_boolean_regressor()


def check_bootstrap_resamples_by_hand() -> None:
    """Each resample draws len(values) indices in [0, len) per n (item 0 included), then fits a + b ln n; n may be
    float32 (converted to float64 before the log)."""
    per_n = [np.array([0.1, 0.4, 0.35, 0.9]), np.array([0.5, 0.2, 0.8]), np.array([1.1, 0.7, 0.6, 1.3, 0.2])]
    n = f32([2.3, 4.1, 8.9])
    slopes = method.bootstrap_log_slope(per_n, n, resamples=5, rng=np.random.default_rng(3))
    rng, log_n, want = np.random.default_rng(3), np.log(n.astype(np.float64)), []
    for _ in range(5):
        means = [v[rng.integers(0, len(v), len(v))].mean() for v in per_n]
        want.append(np.polyfit(log_n, means, 1)[0])
    assert np.array_equal(slopes, np.array(want))


def test_bootstrap_resamples_by_hand():
    check_bootstrap_resamples_by_hand()


def test_negative_control_bootstrap_without_item_zero_is_caught(monkeypatch):
    def bootstrap(per_n_values, n, resamples, rng):
        log_n = np.log(np.asarray(n, dtype=float))
        return np.array([np.polyfit(log_n, [v[rng.integers(1, len(v), len(v))].mean() for v in per_n_values], 1)[0]
                         for _ in range(resamples)])

    monkeypatch.setattr(method, "bootstrap_log_slope", bootstrap)
    with pytest.raises(AssertionError):
        check_bootstrap_resamples_by_hand()


def check_gates_bounds_and_defaults() -> None:
    # the margin gate needs both conditions (an inconsistent isr < 1 is not overridden), and >= is inclusive
    assert method.answer_gate(np.array([0.5]), np.array([2.0]), np.array([0.5]), margin=0.1).tolist() == [False]
    assert method.answer_gate(np.array([1.5]), np.array([1.5]), np.array([1.0]), margin=0.5).tolist() == [True]
    with pytest.raises(ValueError, match="margin needs"):
        method.answer_gate(np.array([1.5]), np.array([1.5]), None, margin=0.5)
    # ISR: an infinite budget over an infinite B2T is nan without a RuntimeWarning
    with np.errstate(all="raise"):
        assert math.isnan(float(method.information_sufficiency_ratio(np.array([math.inf]), np.array([math.inf]))[0]))
    # the budget is a mean over the last axis, also for one item's 1-D lifts
    assert float(method.information_budget(np.log([0.5, 0.9]), np.log([0.25, 0.3]), 1.0, "symmetric")) == \
        pytest.approx((math.log(2) + 1.0) / 2, abs=1e-15)
    # p_max when Delta is KL(Ber(0.75) || Ber(0.5)) itself: the first midpoint 0.75 fits (<=), so p_max >= 0.75
    assert 0.75 <= float(method.p_max(method.bernoulli_kl(0.75, 0.5), 0.5)) <= 0.75 + 1e-12
    # EG with a large rate: the shift by min(gradient) keeps exp() finite; slot 0 is better and takes all the weight
    weights = method.exponentiated_gradient_mixture(np.array([[0.9, 0.1], [0.8, 0.2]]), 1, 2000.0)
    assert np.all(np.isfinite(weights)) and weights.tolist() == pytest.approx([1.0, 0.0], abs=1e-12)
    # QMV closed forms at n = 2 and for an integer alpha
    assert method.qmv_regular_decay_bound(2.0, 2, 0.5) == pytest.approx(0.25 * 2.0 / 0.5)
    assert method.qmv_regular_decay_bound(4.0, 5, 2) == pytest.approx(1 + 1 / 4 + 1 / 9 + 1 / 16)
    assert method.qmv_regular_decay_bound(1.0, 5, 0.5) == pytest.approx(0.25 * 4**0.5 / 0.5)
    # E_pair with exactly two permutations
    assert method.mean_pair_difference(np.array([[0.2, 0.7]])).tolist() == pytest.approx([0.5])
    # the Monte Carlo dispersion uses the offset (drawn from the same generator as by hand)
    rng = np.random.default_rng(5)
    q = method.sigmoid(method.first_order_logits(WEIGHTS, PHI, method.random_ranks(4, 50, rng), 1.3))
    q_other = method.sigmoid(method.first_order_logits(WEIGHTS, PHI, method.random_ranks(4, 50, rng), 1.3))
    want = (float(np.abs(q - q.mean()).mean()), float(np.abs(q - q_other).mean()))
    assert method.first_order_dispersion_mc(WEIGHTS, PHI, 50, np.random.default_rng(5), offset=1.3) == want
    # uniform_mixture_gap's defaults are 200 steps at rate 0.5 (a slow problem: EG is far from converged at 200)
    slow = np.array([[0.50, 0.49], [0.30, 0.31], [0.60, 0.595]])
    uniform = np.full(2, 0.5)
    want_gap = method.mixture_log_loss(slow, uniform) - method.mixture_log_loss(
        slow, method.exponentiated_gradient_mixture(slow, 200, 0.5))
    assert method.uniform_mixture_gap(slow) == want_gap
    assert want_gap != method.mixture_log_loss(slow, uniform) - method.mixture_log_loss(
        slow, method.exponentiated_gradient_mixture(slow, 201, 0.5))


def test_gates_bounds_and_defaults():
    check_gates_bounds_and_defaults()


@pytest.mark.parametrize("broken", ["gate_overrides_isr", "strict_margin", "mc_without_offset", "eg_unshifted"])
def test_negative_control_gates_bounds_and_defaults(monkeypatch, broken):
    if broken == "gate_overrides_isr":
        monkeypatch.setattr(method, "answer_gate", lambda isr, d=None, b=None, margin=0.0: (
            np.asarray(d) >= np.asarray(b) + margin if margin > 0 else np.asarray(isr) >= 1.0))
    elif broken == "strict_margin":
        real = method.answer_gate
        monkeypatch.setattr(method, "answer_gate", lambda isr, d=None, b=None, margin=0.0: real(isr, d, b, margin) & (
            np.asarray(d) > np.asarray(b) + margin if margin > 0 else True))
    elif broken == "mc_without_offset":
        real_mc = method.first_order_dispersion_mc
        monkeypatch.setattr(method, "first_order_dispersion_mc", lambda w, phi, n, rng, offset=0.0: real_mc(
            w, phi, n, rng))
    else:
        def eg(p_gold, steps, lr):
            p = method._clip_prob(np.asarray(p_gold, dtype=float))
            weights = np.full(p.shape[1], 1.0 / p.shape[1])
            for _ in range(steps):
                gradient = -(p / (p @ weights)[:, None]).mean(axis=0)
                weights = weights * np.exp(-lr * (gradient + gradient.min()))
                weights /= weights.sum()
            return weights

        monkeypatch.setattr(method, "exponentiated_gradient_mixture", eg)
    with pytest.raises(AssertionError):
        check_gates_bounds_and_defaults()


def check_plan_boundaries_and_plumbing() -> None:
    q_full = np.array([[0.5, 0.5, 0.5], [0.9, 0.8, 0.7], [0.2, 0.4, 0.1]])
    # k = 1 and k = m skeletons are both valid; a mean of exactly 0.5 decides label 1; the decision is an integer
    for k in (1, 3):
        plan = method.plan_answers(q_full, np.full((3, k), 0.6), H_STAR, CLIP, "symmetric")
        assert plan.decision.dtype.kind == "i" and plan.decision.tolist() == [1, 1, 0]
        assert np.allclose(plan.roh, method.risk_of_hallucination(plan.delta_bar, plan.q_prior), atol=1e-15)
    # float32 q: the decision uses the float64 mean (0.5 - 2^-24 / 3 < 0.5), not float32's (rounds to 0.5)
    tie = f32([[0.5, 0.5, 0.5 - 2.0**-24], [0.9, 0.8, 0.7], [0.2, 0.4, 0.1]])
    assert method.plan_answers(tie, f32(np.full((3, 2), 0.6)), H_STAR, CLIP, "symmetric").decision.tolist() == \
        [0, 1, 0]
    # the margin reaches the gate: ISR >= 1 but Delta_bar < B2T + margin abstains
    strong = np.array([[0.95, 0.95], [0.9, 0.9]])
    plain = method.plan_answers(strong, np.full((2, 2), 0.6), 0.3, 2.0, "symmetric")
    assert plain.answer.tolist() == [True, True]
    margin = float((plain.delta_bar - plain.b2t).max()) + 0.01
    assert method.plan_answers(strong, np.full((2, 2), 0.6), 0.3, 2.0, "symmetric", margin).answer.tolist() == \
        [False, False]
    # a 3-D skeleton array is rejected with the shape message even when its first axis matches
    with pytest.raises(ValueError, match="must be"):
        method.plan_answers(q_full, np.full((3, 2, 1), 0.6), H_STAR, CLIP, "symmetric")


def test_plan_boundaries_and_plumbing():
    check_plan_boundaries_and_plumbing()


@pytest.mark.parametrize("broken", ["float_decision", "margin_ignored"])
def test_negative_control_plan_boundaries_and_plumbing(monkeypatch, broken):
    real = method.plan_answers

    def plan(*args, **kwargs):
        out = real(*args, **kwargs)
        if broken == "float_decision":
            return dataclasses.replace(out, decision=out.decision.astype(float))
        return real(*args[:5])

    monkeypatch.setattr(method, "plan_answers", plan)
    with pytest.raises(AssertionError):
        check_plan_boundaries_and_plumbing()


def check_p_max_rounds_an_extended_budget() -> None:
    """Delta just below KL(Ber(0.75) || Ber(0.5)) in extended precision rounds to that KL in float64, where the
    first midpoint 0.75 fits; compared in extended precision it would not (p_max < 0.75)."""
    kl = float(method.bernoulli_kl(0.75, 0.5))
    below = np.longdouble(kl) * (1 - np.longdouble(2) ** -60)
    assert float(method.p_max(below, 0.5)) == float(method.p_max(kl, 0.5)) >= 0.75


def test_p_max_rounds_an_extended_budget():
    check_p_max_rounds_an_extended_budget()


def test_negative_control_p_max_comparing_in_extended_precision_is_caught(monkeypatch):
    real = method.p_max
    # what comparing in extended precision amounts to here: the budget one float64 step below the KL
    monkeypatch.setattr(method, "p_max", lambda delta, q_bar, iterations=200: real(
        np.nextafter(float(delta), 0.0) if isinstance(delta, np.longdouble) else delta, q_bar, iterations))
    with pytest.raises(AssertionError):
        check_p_max_rounds_an_extended_budget()


def check_kl_domain_edges() -> None:
    """bernoulli_kl accepts p within 1e-9 outside [0, 1] (boundaries included) and clips it to [0, 1] exactly;
    q = 0 is floored at 1e-12, so KL stays finite; an event given as 0/1 integers is a mask, not indices."""
    assert float(method.bernoulli_kl(-1e-9, 0.5)) == float(method.bernoulli_kl(0.0, 0.5))
    assert float(method.bernoulli_kl(1 + 1e-9, 0.25)) == float(method.bernoulli_kl(1.0, 0.25))
    assert float(method.bernoulli_kl(-1e-10, 0.5)) == pytest.approx(math.log(2), abs=1e-15)
    assert float(method.bernoulli_kl(1 + 1e-10, 0.25)) == pytest.approx(-math.log(0.25), abs=1e-15)
    assert float(method.bernoulli_kl(0.5, 0.0)) == pytest.approx(0.5 * math.log(0.5 / 1e-12) + 0.5 * math.log(0.5),
                                                                abs=1e-12)
    assert method.edfl_slack(POSTERIOR, PRIORS, np.array([1, 0, 1])) == method.edfl_slack(POSTERIOR, PRIORS, EVENT)


def test_kl_domain_edges():
    check_kl_domain_edges()


@pytest.mark.parametrize("broken", ["strict_tolerance", "no_clip", "no_floor", "event_as_indices"])
def test_negative_control_kl_domain_edges(monkeypatch, broken):
    real_kl = method.bernoulli_kl
    if broken == "strict_tolerance":
        def kl(p, q):
            if np.any(np.abs(np.asarray(p, dtype=float) - 0.5) >= 0.5 + 1e-9):
                raise ValueError("p outside [0, 1]")
            return real_kl(p, q)
    elif broken == "no_clip":
        def kl(p, q):
            p = np.asarray(p, dtype=float)
            q = method._clip_prob(q)
            return method._xlogy_ratio(p, q) + method._xlogy_ratio(1.0 - p, 1.0 - q)
    elif broken == "no_floor":
        def kl(p, q):
            return real_kl(p, q) if np.all(np.asarray(q) > 0) else np.asarray(math.inf)
    else:
        kl = real_kl

        def slack(posterior, priors, event):  # the event used as given (0/1 integers index instead of masking)
            posterior, priors, event = np.asarray(posterior, float), np.atleast_2d(priors), np.asarray(event)
            p, q_bar = posterior[event].sum(), priors[:, event].sum(axis=1).mean()
            return method.expected_divergence(posterior, priors) - float(real_kl(min(p, 1.0), q_bar))

        monkeypatch.setattr(method, "edfl_slack", slack)
    monkeypatch.setattr(method, "bernoulli_kl", kl)
    with pytest.raises((AssertionError, ValueError, IndexError)):
        check_kl_domain_edges()
