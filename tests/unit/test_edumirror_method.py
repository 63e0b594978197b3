"""edumirror method: the acceptance checks (a)1-(a)6 of the README ("Design") as exact values on non-degenerate
inputs, with negative controls that break the library through monkeypatch and show the same check fails."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.edumirror import method

SWEEP = (-15.0, 0.0, 15.0, 30.0, 45.0, 60.0, 75.0)


def svo_values() -> list[float]:
    return [float(method.svo_utility(2.0, 5.0, 0.0)), float(method.svo_utility(2.0, 5.0, 90.0)),
            float(method.svo_utility(1.0, -1.0, 45.0)), float(method.svo_utility(1.0, -1.0, -15.0))]


def test_a1_svo_utility_values():
    theta0, theta90, theta45, theta_minus15 = svo_values()
    assert theta0 == pytest.approx(2.0, abs=1e-12)
    assert theta90 == pytest.approx(5.0, abs=1e-12)
    assert theta45 == pytest.approx(0.0, abs=1e-12)
    assert theta_minus15 == pytest.approx(1.2247, abs=1e-4)  # cos 15 + sin 15 = sqrt(3/2)
    assert theta_minus15 == pytest.approx(math.sqrt(1.5), abs=1e-12)
    u = method.svo_utility(np.array([1.0, 0.0]), np.array([0.0, 1.0]), 30.0)
    assert np.allclose(u, [math.sqrt(3) / 2, 0.5], atol=1e-12)


def test_negative_control_svo_with_swapped_weights_is_caught(monkeypatch):
    monkeypatch.setattr(method, "svo_utility", lambda s, o, t: math.sin(math.radians(t)) * np.asarray(s)
                        + math.cos(math.radians(t)) * np.asarray(o))
    values = svo_values()
    assert values[0] != pytest.approx(2.0)


def pg_differences(thetas=SWEEP) -> list[float]:
    return [method.public_goods_utility_difference(t, 1.6, 4) for t in thetas]


def test_a2_public_goods_utility_difference():
    assert method.public_goods_gains(1.6, 4) == pytest.approx((-0.6, 1.2), abs=1e-12)
    values = dict(zip(SWEEP, pg_differences(), strict=True))
    for theta, expected in ((-15.0, -0.8901), (0.0, -0.6000), (45.0, 0.4243), (75.0, 1.0038)):
        assert values[theta] == pytest.approx(expected, abs=5e-5)
    assert all(b > a for a, b in zip(pg_differences(), pg_differences()[1:], strict=False))


def test_negative_control_flipped_sine_breaks_monotonicity(monkeypatch):
    monkeypatch.setattr(method, "svo_utility", lambda s, o, t: math.cos(math.radians(t)) * np.asarray(s)
                        - math.sin(math.radians(t)) * np.asarray(o))
    values = pg_differences()
    assert not all(b > a for a, b in zip(values, values[1:], strict=False))


def test_public_goods_needs_two_agents():
    with pytest.raises(ValueError, match="2 agents"):
        method.public_goods_gains(1.6, 1)
    assert method.public_goods_gains(3.0, 2, contribution=2.0) == pytest.approx((1.0, 3.0))


def deficit_example() -> np.ndarray:
    return method.deficit_weights(np.array([3.0, 7, 7, 7, 7]), np.full(5, 7.0), np.ones(5), 1.0)


def test_a3_deficit_weights():
    assert np.allclose(method.deficit_weights(np.full(5, 7.0), np.full(5, 7.0), np.ones(5), 1.0), 0.2, atol=1e-12)
    w = deficit_example()
    assert w[0] == pytest.approx(math.e**4 / (math.e**4 + 4), abs=1e-12)
    assert w[0] == pytest.approx(0.93174, abs=1e-5)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    # beta, priorities and a surplus (n > e counts as no deficit): logits 2*[0.5*2, 1*1, 0, 0, 0] = [2, 2, 0, 0, 0]
    w2 = method.deficit_weights(np.array([5.0, 6, 9, 7, 8]), np.full(5, 7.0), np.array([0.5, 1, 1, 1, 1]), 2.0)
    z = math.e**2 * 2 + 3
    assert np.allclose(w2, [math.e**2 / z, math.e**2 / z, 1 / z, 1 / z, 1 / z], atol=1e-12)
    batch = method.deficit_weights(np.array([[3.0, 7, 7, 7, 7], [7.0] * 5]), np.full(5, 7.0), np.ones(5), 1.0)
    assert np.allclose(batch[0], w) and np.allclose(batch[1], 0.2)


def test_negative_control_deficit_without_clipping_is_caught(monkeypatch):
    def unclipped(needs, targets, priorities, beta):
        logits = beta * np.asarray(priorities) * (np.asarray(targets) - np.asarray(needs))
        e = np.exp(logits - logits.max())
        return e / e.sum()

    monkeypatch.setattr(method, "deficit_weights", unclipped)
    w2 = method.deficit_weights(np.array([5.0, 6, 9, 7, 8]), np.full(5, 7.0), np.array([0.5, 1, 1, 1, 1]), 2.0)
    z = math.e**2 * 2 + 3
    assert not np.allclose(w2, [math.e**2 / z, math.e**2 / z, 1 / z, 1 / z, 1 / z], atol=1e-6)


def decay_path(start: float, ticks: int, baseline: float = 0.0) -> list[float]:
    n = np.array([start])
    path = []
    for _ in range(ticks):
        n = method.clip_needs(method.decay_toward_baseline(n, baseline, 0.1))
        path.append(float(n[0]))
    return path


def test_a4_need_decay_without_actions():
    assert decay_path(7.0, 10)[-1] == pytest.approx(6.0, abs=1e-9)
    long = decay_path(7.0, 200)
    assert min(long) >= 0.0 and max(long) <= 10.0 and long[-1] == 0.0
    assert decay_path(0.05, 1)[0] == 0.0  # no overshoot below the baseline
    assert decay_path(4.0, 3, baseline=5.0)[-1] == pytest.approx(4.3, abs=1e-12)  # rises toward b = 5
    assert decay_path(5.05, 1, baseline=5.0)[-1] == pytest.approx(5.0, abs=1e-12)
    assert method.clip_needs(np.array([-1.0, 11.0, 4.0])).tolist() == [0.0, 10.0, 4.0]


def test_negative_control_proportional_decay_is_caught(monkeypatch):
    monkeypatch.setattr(method, "decay_toward_baseline", lambda n, b, r: np.asarray(n) + r * (b - np.asarray(n)))
    assert decay_path(7.0, 10)[-1] != pytest.approx(6.0, abs=1e-3)


def rses_cases() -> list[float]:
    mixed = np.array([4, 1, 4, 4, 1, 1, 4, 1, 1, 4])  # positive items 4, reverse items (2, 5, 6, 8, 9) 1
    return [float(method.rses_score(np.full(10, 4))), float(method.rses_score(np.ones(10))),
            float(method.rses_score(mixed)), float(method.rses_score(np.array([1, 2, 3, 4, 1, 2, 3, 4, 1, 2])))]


def test_a5_rses_scoring():
    # last case by hand: positive items 1,3,4,7,10 -> 1+3+4+3+2 = 13; reverse items 2,5,6,8,9 -> 3+4+3+1+4 = 15
    assert rses_cases() == [25.0, 25.0, 40.0, 28.0]
    with pytest.raises(ValueError, match="10 items"):
        method.rses_score(np.ones(9))
    coded = method.reverse_code(np.array([[1, 7, 4]]), 7, (2,))
    assert coded.tolist() == [[1.0, 1.0, 4.0]]


def test_negative_control_wrong_reverse_items_are_caught(monkeypatch):
    monkeypatch.setattr(method, "RSES_REVERSE_ITEMS", (1, 3, 5, 7, 9))
    assert rses_cases() != [25.0, 25.0, 40.0, 28.0]


def check_a6_kappa_and_alpha() -> None:
    assert method.cohens_kappa(np.array([[20, 5], [10, 15]])) == pytest.approx(0.40, abs=1e-12)
    assert method.cohens_kappa(np.diag([3, 4, 5])) == pytest.approx(1.0, abs=1e-12)
    # 3 classes by hand: n = 11, p_o = 6/11, row sums (4, 3, 4), column sums (3, 4, 4): p_e = 40/121,
    # kappa = (66 - 40) / (121 - 40) = 26/81
    assert method.cohens_kappa(np.array([[2, 1, 1], [0, 2, 1], [1, 1, 2]])) == pytest.approx(26 / 81, abs=1e-12)
    assert method.cohens_kappa(np.array([[5, 0], [0, 0]])) == 1.0
    item = np.array([1.0, 2.0, 4.0, 3.0, 5.0])
    assert method.cronbach_alpha(np.stack([item] * 4, axis=1)) == pytest.approx(1.0, abs=1e-12)
    # by hand: items (1,2,3), (1,3,2): variances 1, 1; totals (2,5,5) variance 3: alpha = 2 (1 - 2/3) = 2/3
    assert method.cronbach_alpha(np.array([[1.0, 1.0], [2.0, 3.0], [3.0, 2.0]])) == pytest.approx(2 / 3)
    assert math.isnan(method.cronbach_alpha(np.ones((4, 3))))
    with pytest.raises(ValueError, match="2 items"):
        method.cronbach_alpha(np.ones((4, 1)))


def test_a6_kappa_and_alpha():
    check_a6_kappa_and_alpha()


def test_negative_control_alpha_without_the_k_over_k_minus_1_factor_is_caught(monkeypatch):
    def alpha_without_factor(items: np.ndarray) -> float:
        items = np.asarray(items, dtype=float)
        return float(1.0 - items.var(axis=0, ddof=1).sum() / items.sum(axis=1).var(ddof=1))

    monkeypatch.setattr(method, "cronbach_alpha", alpha_without_factor)
    with pytest.raises(AssertionError):
        check_a6_kappa_and_alpha()


def test_confusion_matrix_counts_pairs():
    c = method.confusion_matrix([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 0, 2], 3)
    assert c.tolist() == [[1, 1, 0], [0, 1, 0], [1, 0, 2]]


def test_negative_control_kappa_without_chance_correction_is_caught(monkeypatch):
    monkeypatch.setattr(method, "cohens_kappa", lambda c: float(np.trace(c) / np.sum(c)))
    with pytest.raises(AssertionError):
        check_a6_kappa_and_alpha()


def test_expected_scale_r_closed_form_by_hand():
    # latent sd 2 of range 10 on a 7-point scale: signal 6 * 0.2 = 1.2; 3 items, 1 reversed: acquiescence 0.4 enters
    # as 0.4 / 3; noise (0.25 + 1/12) / 3. r = 1.2 / sqrt(1.44 + 0.16/9 + (1/3)/3)
    assert method.expected_scale_r(2.0, 10.0, 7, 3, 1, 0.5, 0.4) == pytest.approx(
        1.2 / math.sqrt(1.44 + 0.16 / 9 + (0.25 + 1 / 12) / 3), abs=1e-12)
    # balanced keying cancels acquiescence: 10 items, 5 reversed, 4-point, latent sd 1.5 of range 10: signal 0.45
    assert method.expected_scale_r(1.5, 10.0, 4, 10, 5, 0.5, 3.0) == pytest.approx(
        0.45 / math.sqrt(0.45 ** 2 + (0.25 + 1 / 12) / 10), abs=1e-12)
    assert method.expected_scale_r(0.0, 10.0, 7, 3, 1, 0.5, 0.4) == 0.0
    with pytest.raises(ValueError, match="n_reverse"):
        method.expected_scale_r(2.0, 10.0, 7, 3, 4, 0.5, 0.4)


def test_expected_scale_r_matches_the_simulated_surveyor():
    """The closed form against the response model itself, on latents away from the scale ends (no clipping)."""
    from tasks.edumirror.measurement import need_scale_scores, survey

    needs = np.random.default_rng(3).uniform(2.5, 7.5, size=(20000, 5))
    _, answers = survey(needs, 0.5, 0.4, np.random.default_rng(4))
    scores = need_scale_scores(answers)
    observed = np.mean([method.pearson(scores[:, k], needs[:, k]) for k in range(5)])
    expected = method.expected_scale_r(float(needs[:, 0].std()), 10.0, 7, 3, 1, 0.5, 0.4)
    assert observed == pytest.approx(expected, abs=0.005)


def test_negative_control_expected_r_ignoring_acquiescence_is_caught(monkeypatch):
    original = method.expected_scale_r
    monkeypatch.setattr(method, "expected_scale_r",
                        lambda sd, rng, pts, k, rev, noise, acq: original(sd, rng, pts, k, rev, noise, 0.0))
    with pytest.raises(AssertionError):
        test_expected_scale_r_closed_form_by_hand()


def test_correlations_and_slope_exact():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    assert method.pearson(x, 2 * x + 1) == pytest.approx(1.0)
    assert method.pearson(x, np.array([1.0, 3.0, 2.0, 4.0])) == pytest.approx(0.8)  # by hand: 4 / 5
    assert math.isnan(method.pearson(x, np.ones(4)))
    assert method.average_ranks(np.array([10.0, 20.0, 10.0, 5.0])).tolist() == [2.5, 4.0, 2.5, 1.0]
    assert method.spearman(x, np.array([1.0, 8.0, 27.0, 64.0])) == pytest.approx(1.0)
    # by hand: ranks (1,2,3,4) vs (2,1,4,3): d^2 sum 4 -> 1 - 6*4/(4*15) = 0.6
    assert method.spearman(x, np.array([5.0, 1.0, 9.0, 7.0])) == pytest.approx(0.6)
    assert method.ols_slope(np.array([3.0, 5.0, 7.0, 9.0])) == pytest.approx(2.0)
    assert method.ols_slope(np.array([1.0, 0.0, 2.0])) == pytest.approx(0.5)


def test_softmax_probabilities_and_affinity_update():
    p = method.softmax_probabilities(np.array([0.0, math.log(3.0)]), 1.0)
    assert np.allclose(p, [0.25, 0.75])
    assert np.allclose(method.softmax_probabilities(np.array([0.0, 0.2]), 0.1), [1 / (1 + math.e**2),
                                                                                   math.e**2 / (1 + math.e**2)])
    with pytest.raises(ValueError, match="temperature"):
        method.softmax_probabilities(np.zeros(2), 0.0)
    assert method.affinity_update(0.5, 1.0, 0.2) == pytest.approx(0.5 + 0.2 * math.tanh(1.0))
    assert method.affinity_update(0.95, 10.0, 0.2) == 1.0
    assert method.affinity_update(-0.95, -10.0, 0.2) == -1.0


def test_ordering_margin():
    assert method.ordering_margin(0.1, 0.5, 0.6) == pytest.approx(0.1)
    assert method.ordering_margin(0.1, 0.5, 1.5) == pytest.approx(0.4)
    assert method.ordering_margin(0.6, 0.5, 1.5) == pytest.approx(-0.1)


def test_softmaxes_are_shift_stable_for_large_values():
    """Large logits overflow without the max shift; the shift is per row for a batch."""
    p = method.softmax_probabilities(np.array([1000.0, 1000.0 + math.log(3.0)]), 1.0)
    assert np.allclose(p, [0.25, 0.75], atol=1e-12)
    w = method.deficit_weights(np.array([[7.0, 7, 7, 7, 7], [0.0, 7, 7, 7, 7]]), np.full(5, 7.0), np.ones(5), 200.0)
    assert np.allclose(w[0], 0.2, atol=1e-12) and np.allclose(w[1], [1.0, 0, 0, 0, 0], atol=1e-12)


def test_statistics_edge_cases_by_hand():
    assert method.pearson(np.array([0.0, 0.1]), np.array([0.0, 0.2])) == pytest.approx(1.0)  # tiny variances
    assert method.average_ranks(np.array([1.0, 2.0, 2.0])).tolist() == [1.0, 2.5, 2.5]  # a tie at the end
    # totals (0, 1, 2): variance exactly 1; item variances 1/3 each: alpha = 2 (1 - 2/3) = 2/3
    assert method.cronbach_alpha(np.array([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])) == pytest.approx(2 / 3)
    c = method.confusion_matrix(np.array([0.0, 1.0, 1.0]), np.array([1.0, 1.0, 0.0]), 2)
    assert c.dtype == np.int64 and c.tolist() == [[0, 1], [1, 1]]


def test_scoring_is_batched_and_leaves_the_answers_alone():
    answers = np.array([[4.0] * 10, [1.0, 2, 3, 4, 1, 2, 3, 4, 1, 2]])
    before = answers.copy()
    assert method.rses_score(answers).tolist() == [25.0, 28.0]
    assert np.array_equal(answers, before)
    method.reverse_code(answers, 4, (1,))
    assert np.array_equal(answers, before)
