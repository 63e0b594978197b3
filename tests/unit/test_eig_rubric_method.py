"""eig_rubric method: exact values against hand-computed Bayesian posteriors and entropies, identities, and a
negative control per checked quantity that breaks the library through monkeypatch and shows the same check fails.

Hand computations (natural logs). K = 4, uniform prior:
- theta = 0.3 for every level: A is independent of S, I(S; A) = 0.
- theta = (0, 0, 1, 1): A reveals the half, I = H(A) = ln 2 = 0.693147.
- K = 5 uniform, theta = (0, 0, 0, 1, 1): I = H(A) = H_b(0.4) = 0.673012.
- theta = (0.1, 0.1, 0.9, 0.9): I = H(A) - H(A | S) = ln 2 - H_b(0.1) = 0.693147 - 0.325083 = 0.368064.
- the same noisy question asked twice: given A_1 = 1 the posterior is (0.05, 0.05, 0.45, 0.45), so
  p(A_2 = 1 | A_1 = 1) = 2 (0.05 * 0.1) + 2 (0.45 * 0.9) = 0.82 (and 0.18 given A_1 = 0, by symmetry);
  I(S; A_2 | A_1) = H_b(0.82) - H_b(0.1) = 0.471394 - 0.325083 = 0.146311.
K = 3, prior (0.5, 0.3, 0.2), q1 = (0.2, 0.5, 0.9), q2 = (0.6, 0.4, 0.1), answers (1, 0):
  p(s, a) = (0.5 * 0.2 * 0.4, 0.3 * 0.5 * 0.6, 0.2 * 0.9 * 0.9) = (0.04, 0.09, 0.162), p(a) = 0.292,
  posterior (0.136986, 0.308219, 0.554795), E[s | a] = 0.308219 + 2 * 0.554795 = 1.417808.
  Enumerating the 4 patterns: I(S; A_1) = 0.160153, I(S; A_2) = 0.082504, I(S; A_2 | A_1) = 0.060508.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.eig_rubric import method

UNIFORM4 = np.full(4, 0.25)
NOISY = np.array([0.1, 0.1, 0.9, 0.9])
NOISELESS = np.array([0.0, 0.0, 1.0, 1.0])
PRIOR3 = np.array([0.5, 0.3, 0.2])
Q1 = np.array([0.2, 0.5, 0.9])
Q2 = np.array([0.6, 0.4, 0.1])
NONE4 = np.empty((0, 4))


def h_b(p: float) -> float:
    return -p * math.log(p) - (1 - p) * math.log(1 - p)


def eig_values_match() -> bool:
    return all(abs(got - want) < 1e-6 for got, want in (
        (method.expected_information_gain(np.full(4, 0.3), NONE4, UNIFORM4), 0.0),
        (method.expected_information_gain(NOISELESS, NONE4, UNIFORM4), 0.693147),
        (method.expected_information_gain(np.array([0, 0, 0, 1, 1.0]), np.empty((0, 5)), np.full(5, 0.2)), 0.673012),
        (method.expected_information_gain(NOISY, NONE4, UNIFORM4), 0.368064),
        (method.expected_information_gain(Q1, np.empty((0, 3)), PRIOR3), 0.160153),
        (method.expected_information_gain(Q2, np.empty((0, 3)), PRIOR3), 0.082504),
        (method.expected_information_gain(Q2, Q1[None, :], PRIOR3), 0.060508)))


def test_eig_exact_values():
    assert abs(method.expected_information_gain(np.full(4, 0.3), NONE4, UNIFORM4)) < 1e-9
    assert method.expected_information_gain(NOISELESS, NONE4, UNIFORM4) == pytest.approx(math.log(2), abs=1e-12)
    assert method.expected_information_gain(np.array([0, 0, 0, 1, 1.0]), np.empty((0, 5)),
                                            np.full(5, 0.2)) == pytest.approx(h_b(0.4), abs=1e-12)
    assert method.expected_information_gain(NOISY, NONE4, UNIFORM4) == pytest.approx(math.log(2) - h_b(0.1),
                                                                                     abs=1e-12)
    assert eig_values_match()


def test_negative_control_eig_without_the_answer_entropy_is_caught(monkeypatch):
    # Forgetting to subtract H(A_Q) turns H(S | A_Q) into the joint entropy H(S, A_Q).
    monkeypatch.setattr(method, "conditional_entropy",
                        lambda theta, prior: method.entropy(method.joint_answer_level(theta, prior)))
    assert not eig_values_match()


def test_negative_control_eig_in_bits_is_caught(monkeypatch):
    monkeypatch.setattr(method, "entropy", lambda p: float(-np.sum(p[p > 0] * np.log2(p[p > 0]))))
    assert not eig_values_match()


def test_conditional_entropy_of_nothing_is_the_prior_entropy_and_joint_sums_to_one():
    assert method.conditional_entropy(np.empty((0, 3)), PRIOR3) == pytest.approx(1.0296530140645737, abs=1e-12)
    joint = method.joint_answer_level(np.vstack([Q1, Q2]), PRIOR3)
    assert joint.shape == (4, 3) and joint.sum() == pytest.approx(1.0, abs=1e-12)
    # Row 1 of answer_patterns(2) is (1, 0): p(s, a) = (0.04, 0.09, 0.162).
    np.testing.assert_allclose(joint[1], [0.04, 0.09, 0.162], atol=1e-12)
    np.testing.assert_array_equal(method.answer_patterns(2), [[0, 0], [1, 0], [0, 1], [1, 1]])


def duplicates_behave() -> bool:
    """Conditioning: exact duplicate of a noiseless question gains 0 and is skipped; a noisy duplicate gains
    0.146311 < 0.368064."""
    noiseless_dup = method.expected_information_gain(NOISELESS, NOISELESS[None, :], UNIFORM4)
    noisy_dup = method.expected_information_gain(NOISY, NOISY[None, :], UNIFORM4)
    # Pool: the noiseless split, its exact duplicate, and a weaker question on the other split {0} | {1, 2, 3}.
    pool = np.vstack([NOISELESS, NOISELESS, [0.0, 1.0, 1.0, 1.0]])
    chosen = method.greedy_eig_selection(pool, UNIFORM4, k=2).indices
    return (abs(noiseless_dup) < 1e-9 and abs(noisy_dup - 0.146311) < 1e-6 and noisy_dup < 0.368064
            and chosen == (0, 2))


def test_duplicates_conditional_eig_and_greedy_skip():
    assert duplicates_behave()
    # After the half split, the {0} | {1, 2, 3} question resolves the lower half: gain (1/2) ln 2.
    selection = method.greedy_eig_selection(np.vstack([NOISELESS, NOISELESS, [0.0, 1.0, 1.0, 1.0]]), UNIFORM4, 3)
    assert selection.indices == (0, 2, 1)
    np.testing.assert_allclose(selection.gains, [math.log(2), math.log(2) / 2, 0.0], atol=1e-12)


def test_negative_control_marginal_eig_ranking_selects_duplicates(monkeypatch):
    marginal = method.expected_information_gain
    monkeypatch.setattr(method, "expected_information_gain",
                        lambda candidate, selected, prior: marginal(candidate, np.empty((0, len(candidate))), prior))
    assert not duplicates_behave()


def test_greedy_stops_below_epsilon_and_breaks_ties_to_the_lowest_index():
    pool = np.vstack([[0.0, 1.0, 1.0, 1.0], NOISELESS, NOISELESS])
    assert method.greedy_eig_selection(pool, UNIFORM4, 3, epsilon=0.4).indices == (1,)  # second gain ln2/2 < 0.4
    assert method.greedy_eig_selection(pool, UNIFORM4, 3, epsilon=0.3).indices == (1, 0)  # then 0 < 0.3
    assert method.greedy_eig_selection(pool, UNIFORM4, 3, epsilon=0.0).indices == (1, 0, 2)  # a gain == epsilon stays
    assert method.greedy_eig_selection(pool, UNIFORM4, 3, epsilon=0.8).indices == ()
    assert method.greedy_eig_selection(np.vstack([NOISY, NOISY]), UNIFORM4, 1).indices == (0,)
    with pytest.raises(ValueError, match="k must be"):
        method.greedy_eig_selection(pool, UNIFORM4, 4)
    with pytest.raises(ValueError, match="epsilon"):
        method.greedy_eig_selection(pool, UNIFORM4, 1, epsilon=-1.0)


def posterior_matches_hand() -> bool:
    post = method.posterior(np.array([[1, 0]]), np.vstack([Q1, Q2]), PRIOR3)
    score = method.posterior_mean_score(np.array([[1, 0], [0, 1]]), np.vstack([Q1, Q2]), PRIOR3)
    # (0, 1): p(s, a) = (0.5 * 0.8 * 0.6, 0.3 * 0.5 * 0.4, 0.2 * 0.1 * 0.1) = (0.24, 0.06, 0.002); sum 0.302.
    second = (0.06 + 2 * 0.002) / 0.302
    return bool(np.allclose(post, [[0.04 / 0.292, 0.09 / 0.292, 0.162 / 0.292]], atol=1e-12)
                and np.allclose(score, [1.417808219178, second], atol=1e-9))


def test_posterior_and_score_exact_values():
    assert posterior_matches_hand()
    levels = method.posterior_mean_score(np.array([1, 0]), np.vstack([Q1, Q2]), PRIOR3, levels=np.array([1, 3, 5]))
    np.testing.assert_allclose(levels, [1 + 2 * 1.417808219178], atol=1e-9)


def test_negative_control_posterior_without_prior_is_caught(monkeypatch):
    likelihood = method.log_likelihood
    monkeypatch.setattr(method, "log_likelihood", lambda a, t: likelihood(a, t) - np.log(PRIOR3)[None, :])
    assert not posterior_matches_hand()


def test_negative_control_posterior_with_swapped_answers_is_caught(monkeypatch):
    likelihood = method.log_likelihood
    monkeypatch.setattr(method, "log_likelihood", lambda a, t: likelihood(1 - np.atleast_2d(a), t))
    assert not posterior_matches_hand()


def prior_is_kept() -> bool:
    theta = np.full((3, 3), 0.5)
    answers = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1]])
    post = method.posterior(answers, theta, PRIOR3)
    score = method.posterior_mean_score(answers, theta, PRIOR3)
    return bool(np.allclose(post, PRIOR3[None, :], atol=1e-12) and np.allclose(score, 0.3 + 2 * 0.2, atol=1e-12))


def test_uninformative_answers_leave_the_prior():
    assert prior_is_kept()


def test_negative_control_uniform_prior_is_caught(monkeypatch):
    posterior = method.posterior
    monkeypatch.setattr(method, "posterior", lambda a, t, p: posterior(a, t, np.full(len(p), 1 / len(p))))
    assert not prior_is_kept()


def test_zero_likelihoods_give_no_nan_and_impossible_patterns_are_refused():
    theta = np.array([NOISELESS])
    np.testing.assert_allclose(method.posterior(np.array([[1]]), theta, UNIFORM4), [[0, 0, 0.5, 0.5]], atol=1e-15)
    with pytest.raises(ValueError, match="zero probability"):
        method.posterior(np.array([[1]]), np.array([[0.0, 0.0, 0.0, 0.0]]), UNIFORM4)
    with pytest.raises(ValueError, match="probabilities"):
        method.posterior(np.array([[1]]), np.array([[0.0, 0.0, 1.5, 1.0]]), UNIFORM4)
    with pytest.raises(ValueError, match="prior"):
        method.posterior(np.array([[1]]), theta, np.array([0.5, 0.5, 0.5, 0.5]))
    with pytest.raises(ValueError, match="prior must have shape"):
        method.posterior(np.array([[1]]), theta, PRIOR3)
    with pytest.raises(ValueError, match="questions"):
        method.posterior(np.array([[1, 0]]), theta, UNIFORM4)
    with pytest.raises(ValueError, match="exact enumeration"):
        method.answer_patterns(method.MAX_ENUMERATED_QUESTIONS + 1)


def test_laplace_likelihoods_and_level_prior_exact_values():
    answers = np.array([[1, 0], [1, 1], [0, 1], [1, 1], [0, 0]])
    levels = np.array([0, 0, 1, 1, 1])
    # Question 0: level 0 has 2 yes of 2 -> 3/4; level 1 has 1 of 3 -> 2/5; level 2 is empty -> 1/2.
    # Question 1: level 0: 1 of 2 -> 2/4; level 1: 2 of 3 -> 3/5; level 2 -> 1/2.
    np.testing.assert_allclose(method.laplace_likelihoods(answers, levels, 3),
                               [[3 / 4, 2 / 5, 1 / 2], [2 / 4, 3 / 5, 1 / 2]], atol=1e-15)
    np.testing.assert_allclose(method.level_prior(levels, 3), [3 / 8, 4 / 8, 1 / 8], atol=1e-15)
    with pytest.raises(ValueError, match="0 or 1"):
        method.laplace_likelihoods(answers * 2, levels, 3)
    with pytest.raises(ValueError, match="levels must lie"):
        method.laplace_likelihoods(answers, levels + 2, 3)
    with pytest.raises(ValueError, match="must agree"):
        method.laplace_likelihoods(answers, levels[:3], 3)
    with pytest.raises(ValueError, match="levels must lie"):
        method.level_prior(levels + 3, 3)


def test_likelihoods_from_evaluator_builds_theta_and_checks_range():
    theta = method.likelihoods_from_evaluator(lambda j, s: 0.1 * (j + 1) + 0.2 * s, 2, 3)
    np.testing.assert_allclose(theta, [[0.1, 0.3, 0.5], [0.2, 0.4, 0.6]], atol=1e-15)
    with pytest.raises(ValueError, match="evaluator probabilities"):
        method.likelihoods_from_evaluator(lambda j, s: 1.5, 1, 2)


# Hand computation: units (1, 1), (2, 3), (3, 3); coincidences o11 = 2, o23 = o32 = 1, o33 = 2; n = (2, 1, 3), 6.
# nominal: 1 - 5 * 2 / (2 (2 + 6 + 3)) = 6/11; interval: delta^2 = 1, 4, 1 -> 1 - 5 * 2 / 58 = 24/29;
# ordinal: delta^2(1,2) = (3 - 1.5)^2 = 2.25, (1,3) = (6 - 2.5)^2 = 12.25, (2,3) = (4 - 2)^2 = 4:
# 1 - 5 * 8 / (2 (2 * 2.25 + 6 * 12.25 + 3 * 4)) = 1 - 40/180 = 7/9.
RATINGS = np.array([[1.0, 1.0], [2.0, 3.0], [3.0, 3.0]])


def alphas_match() -> bool:
    return all(abs(method.krippendorff_alpha(RATINGS, metric) - want) < 1e-12
               for metric, want in (("nominal", 6 / 11), ("interval", 24 / 29), ("ordinal", 7 / 9)))


def test_krippendorff_alpha_exact_values():
    assert alphas_match()
    # Three coders, a value present only once: cross-checked against the `krippendorff` package (0.9.0).
    three = np.array([[1.0, 2.0, 1.0], [3.0, 3.0, 4.0], [2.0, 2.0, 2.0], [4.0, 5.0, 4.0]])
    assert method.krippendorff_alpha(three, "interval") == pytest.approx(THREE_CODERS["interval"], abs=1e-12)
    assert method.krippendorff_alpha(three, "ordinal") == pytest.approx(THREE_CODERS["ordinal"], abs=1e-12)
    assert method.krippendorff_alpha(three, "nominal") == pytest.approx(THREE_CODERS["nominal"], abs=1e-12)
    assert math.isnan(method.krippendorff_alpha(np.ones((3, 2)), "interval"))
    assert math.isnan(method.krippendorff_alpha(np.ones((3, 2)), "nominal"))
    assert math.isnan(method.krippendorff_alpha(np.full((3, 2), 2.0), "ordinal"))
    # Two values, nominal: perfect agreement gives 1; [[1, 2], [1, 2]]: sum o delta^2 = 2 * (4 - 2) / 1 = 4,
    # n^2 - sum n_c^2 = 16 - 8 = 8, so 1 - 3 * 4 / 8 = -0.5.
    assert method.krippendorff_alpha(np.array([[1.0, 1.0], [2.0, 2.0]]), "nominal") == 1.0
    assert method.krippendorff_alpha(np.array([[1.0, 2.0], [1.0, 2.0]]), "nominal") == pytest.approx(-0.5, abs=1e-12)
    assert method.krippendorff_alpha(np.array([[1.0, 1.0], [2.0, 2.0]]), "ordinal") == 1.0
    with pytest.raises(ValueError, match="coders >= 2"):
        method.krippendorff_alpha(np.ones((3, 1)))
    with pytest.raises(ValueError, match="finite"):
        method.krippendorff_alpha(np.array([[1.0, np.nan], [1.0, 2.0]]))
    with pytest.raises(ValueError, match="unknown alpha metric"):
        method.krippendorff_alpha(RATINGS, "ratio")


THREE_CODERS = {"interval": 0.8493150684931506, "ordinal": 0.8692901234567901, "nominal": 0.4}


def test_negative_control_alpha_with_unsquared_distances_is_caught(monkeypatch):
    def absolute(values):
        m, n = values.shape[1], values.size
        within = float(np.sum(np.abs(values - values.mean(axis=1, keepdims=True))))
        return 1.0 - (n - 1) * m * within / ((m - 1) * n * float(np.sum(np.abs(values - values.mean()))))

    monkeypatch.setattr(method, "_interval_alpha", absolute)
    assert not alphas_match()


def test_negative_control_ordinal_as_interval_is_caught(monkeypatch):
    monkeypatch.setattr(method, "rankdata", lambda x: np.asarray(x, dtype=float))
    assert not alphas_match()


def test_negative_control_nominal_without_the_n_minus_one_factor_is_caught(monkeypatch):
    nominal = method._nominal_alpha
    monkeypatch.setattr(method, "_nominal_alpha", lambda r: 1 - (1 - nominal(r)) * r.size / (r.size - 1))
    assert not alphas_match()


def test_icc_oneway_exact_value_and_control(monkeypatch):
    # Means 1.5, 3, 4.5 (grand 3): MSB = 2 * 4.5 / 2 = 4.5, MSW = 1 / 3; ICC = (4.5 - 1/3) / (4.5 + 1/3) = 25/29.
    ratings = np.array([[1.0, 2.0], [3.0, 3.0], [5.0, 4.0]])
    assert method.icc_oneway(ratings) == pytest.approx(25 / 29, abs=1e-12)
    assert method.icc_oneway(np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])) == pytest.approx(1.0, abs=1e-12)
    assert math.isnan(method.icc_oneway(np.ones((3, 2))))
    with pytest.raises(ValueError, match="re-judgings >= 2"):
        method.icc_oneway(np.ones((3, 1)))
    monkeypatch.setattr(method, "icc_oneway", lambda r: float(np.corrcoef(np.asarray(r).T)[0, 1]))
    assert method.icc_oneway(ratings) != pytest.approx(25 / 29, abs=1e-6)  # Pearson of two columns: 0.866


def test_spearman_exact_values_and_control(monkeypatch):
    # Ranks (1, 2, 3, 4) vs (1, 3, 2, 4): sum d^2 = 2, rho = 1 - 6 * 2 / (4 * 15) = 0.8.
    assert method.spearman(np.array([10.0, 20, 30, 40]), np.array([1.0, 3, 2, 4])) == pytest.approx(0.8, abs=1e-12)
    # Ties share their mean rank: x ranks (1.5, 1.5, 3, 4), y ranks (1, 2, 3, 4): Pearson = 4.5 / sqrt(4.5 * 5).
    assert method.spearman(np.array([1.0, 1, 2, 3]), np.array([1.0, 2, 3, 4])) == pytest.approx(
        4.5 / math.sqrt(4.5 * 5), abs=1e-12)
    assert math.isnan(method.spearman(np.ones(4), np.arange(4.0)))
    with pytest.raises(ValueError, match="equal-length"):
        method.spearman(np.ones(3), np.ones(4))
    monkeypatch.setattr(method, "rankdata", lambda x: np.asarray(x, dtype=float))  # Pearson, not Spearman
    assert method.spearman(np.array([10.0, 20, 30, 40]), np.array([1.0, 3, 2, 4])) != pytest.approx(0.8, abs=1e-3)


def test_entropy_ignores_zeros():
    assert method.entropy(np.array([0.5, 0.0, 0.5])) == pytest.approx(math.log(2), abs=1e-15)
    assert method.entropy(np.array([1.0, 0.0])) == 0.0


# --- boundaries and numerical stability (each pins a mutant of method.py that the value tests above let pass) ---


def test_a_prior_with_a_zero_level_is_accepted():
    post = method.posterior(np.array([[1]]), np.array([[0.2, 0.6, 0.9]]), np.array([0.5, 0.5, 0.0]))
    np.testing.assert_allclose(post, [[0.25, 0.75, 0.0]], atol=1e-15)


def test_enumeration_limit_is_inclusive():
    patterns = method.answer_patterns(method.MAX_ENUMERATED_QUESTIONS)
    assert patterns.shape == (2**method.MAX_ENUMERATED_QUESTIONS, method.MAX_ENUMERATED_QUESTIONS)
    assert method.answer_patterns(0).shape == (1, 0)


def test_mismatched_answers_name_both_sizes():
    with pytest.raises(ValueError, match=r"^answers have 2 questions, theta has 1$"):
        method.log_likelihood(np.array([[1, 0]]), np.array([[0.2, 0.6]]))


def test_posterior_is_stable_when_every_joint_probability_underflows():
    # 800 yes answers with theta = (0.2, 0.8): log p(a | s) = 800 ln 0.2 = -1287.6 and 800 ln 0.8 = -178.5;
    # exp of the first underflows to 0, so only the max-shifted computation gives the posterior (~0, 1).
    theta = np.tile([[0.2, 0.8]], (800, 1))
    post = method.posterior(np.ones((1, 800), dtype=int), theta, np.array([0.5, 0.5]))
    assert np.all(np.isfinite(post))
    np.testing.assert_allclose(post, [[0.0, 1.0]], atol=1e-300)
    theta = np.tile([[0.01, 0.02]], (400, 1))  # both levels' log-likelihoods near -1600 (exp underflows)
    post = method.posterior(np.ones((1, 400), dtype=int), theta, np.array([0.5, 0.5]))
    # ratio of likelihoods 2^400: p(s = 0 | a) = 1 / (1 + 2^400), finite and tiny.
    assert np.all(np.isfinite(post)) and post[0, 1] == pytest.approx(1.0, abs=1e-15)


def test_alpha_of_one_unit_and_of_no_units():
    # One unit (1, 2): SS_u = SS = 0.5, m = n = 2: alpha = 1 - 1 * 2 * 0.5 / (1 * 2 * 0.5) = 0.
    assert method.krippendorff_alpha(np.array([[1.0, 2.0]]), "interval") == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match="units"):
        method.krippendorff_alpha(np.empty((0, 2)))


def test_icc_with_three_rejudgings_exact_and_one_item_refused():
    # Items (1, 2, 3), (4, 4, 4): means 2 and 4 (grand 3); MSB = 3 * 2 / 1 = 6, MSW = 2 / (2 * 2) = 0.5;
    # ICC = (6 - 0.5) / (6 + 2 * 0.5) = 5.5 / 7.
    assert method.icc_oneway(np.array([[1.0, 2.0, 3.0], [4.0, 4.0, 4.0]])) == pytest.approx(5.5 / 7, abs=1e-12)
    with pytest.raises(ValueError, match="items >= 2"):
        method.icc_oneway(np.ones((1, 3)))


def test_spearman_of_two_values():
    assert method.spearman(np.array([1.0, 2.0]), np.array([5.0, 3.0])) == pytest.approx(-1.0, abs=1e-15)
    with pytest.raises(ValueError, match=">= 2 values"):
        method.spearman(np.array([1.0]), np.array([2.0]))
