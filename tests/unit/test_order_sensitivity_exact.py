"""order_sensitivity method: exact values on non-degenerate inputs, computed by hand in plain Python
beside the library, each with a negative control that monkeypatches a broken variant into `method`
(issue 20: the planner's q_lo and Delta-bar with distinct skeleton priors, the QMV bound as a value)."""

from __future__ import annotations

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
    assert isr.tolist() == pytest.approx([1.5, 0.5, 0.0, math.inf])
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
