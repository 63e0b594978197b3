"""order_sensitivity method: the brief's acceptance checks (a)1-7 as exact tests, each with a negative control."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.order_sensitivity import baselines, method

H_STAR = 0.05


# (a)1 B2T -----------------------------------------------------------------------------------------

B2T_VECTOR = [(0.02, 3.519), (0.10, 1.994), (0.30, 0.963)]
SWAPPED_VECTOR = [2.839, 2.376, 1.502]


def check_b2t_vector() -> np.ndarray:
    q_lo = np.array([q for q, _ in B2T_VECTOR])
    b2t = method.bits_to_trust(q_lo, H_STAR)
    np.testing.assert_allclose(b2t, [b for _, b in B2T_VECTOR], atol=1e-3)
    return b2t


def test_b2t_matches_the_brief_vector():
    check_b2t_vector()


def _swap_kl_arguments(monkeypatch):
    """Break the library: every Bernoulli KL is computed as KL(Ber(q) || Ber(p))."""
    original = method.bernoulli_kl
    monkeypatch.setattr(method, "bernoulli_kl", lambda p, q: original(q, p))


def test_b2t_negative_control_swapped_arguments_fail(monkeypatch):
    _swap_kl_arguments(monkeypatch)
    q_lo = np.array([q for q, _ in B2T_VECTOR])
    np.testing.assert_allclose(method.bits_to_trust(q_lo, H_STAR), SWAPPED_VECTOR, atol=1e-3)  # brief's numbers
    with pytest.raises(AssertionError):
        check_b2t_vector()


def test_b2t_rejects_bad_h_star():
    with pytest.raises(ValueError, match="h_star"):
        method.bits_to_trust(0.1, 1.5)


# (a)2 p_max / RoH -------------------------------------------------------------------------------

P_MAX_DELTAS = np.array([0.5, 1.0, 2.0, 3.0])
P_MAX_VECTOR = np.array([0.495, 0.689, 0.951, 1.000])


def check_p_max_vector() -> None:
    np.testing.assert_allclose(method.p_max(P_MAX_DELTAS, 0.10), P_MAX_VECTOR, atol=1e-3)
    np.testing.assert_allclose(method.risk_of_hallucination(P_MAX_DELTAS, 0.10), 1 - P_MAX_VECTOR, atol=1e-3)


def test_p_max_matches_the_brief_vector_and_roh_is_its_complement():
    check_p_max_vector()
    deltas = P_MAX_DELTAS
    # Delta = 3 > KL(Ber(1) || Ber(0.1)) = ln 10: the whole budget fits, p_max is exactly 1.
    assert method.bernoulli_kl(1.0, 0.1) == pytest.approx(np.log(10))
    assert method.p_max(3.0, 0.1) == 1.0
    # p_max is the sup: the KL at p_max equals the budget when p_max < 1.
    np.testing.assert_allclose(method.bernoulli_kl(method.p_max(deltas[:3], 0.1), 0.1), deltas[:3], atol=1e-9)


def test_p_max_negative_control_wrong_kl_direction_fails(monkeypatch):
    """The library inverting KL(Ber(q_bar) || Ber(p)) instead of KL(Ber(p) || Ber(q_bar)) misses the vector."""
    _swap_kl_arguments(monkeypatch)
    with pytest.raises(AssertionError):
        check_p_max_vector()


# (a)3 EDFL --------------------------------------------------------------------------------------

def _edfl_draw(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    support, m = int(rng.integers(2, 11)), int(rng.integers(1, 17))
    event = rng.random(support) < 0.5
    event[rng.integers(support)] = True
    return rng.dirichlet(np.ones(support)), rng.dirichlet(np.ones(support), size=m), event


def check_edfl_on_random_draws(draws: int = 10_000) -> None:
    rng = np.random.default_rng(0)
    slacks = [method.edfl_slack(*_edfl_draw(rng)) for _ in range(draws)]
    assert min(slacks) >= -1e-12


def test_edfl_holds_on_10k_random_categorical_draws():
    check_edfl_on_random_draws()


def test_edfl_negative_control_min_over_priors_violates_the_bound(monkeypatch):
    """The library taking min_k KL(P || S_k) instead of the mean over k must break the inequality."""
    monkeypatch.setattr(method, "expected_divergence",
                        lambda posterior, priors: float(method.categorical_kl(posterior[None], priors).min()))
    with pytest.raises(AssertionError):
        check_edfl_on_random_draws()


def test_edfl_is_an_equality_for_the_exponential_tilt():
    rng = np.random.default_rng(1)
    for _ in range(200):
        support = int(rng.integers(2, 11))
        prior = rng.dirichlet(np.ones(support))
        event = np.zeros(support, dtype=bool)
        event[: int(rng.integers(1, support))] = True
        tilted = method.exponential_tilt(prior, event, float(rng.normal(scale=2.0)))
        assert abs(method.edfl_slack(tilted, prior[None], event)) <= 1e-10
        # Negative control: with >= 3 outcomes a random posterior is not a tilt of the prior (its ratio to
        # the prior is not constant on A and on not-A), and the inequality is strict.
        if support >= 3:
            other = rng.dirichlet(np.ones(support))
            assert method.edfl_slack(other, prior[None], event) > 1e-6


# (a)4 QMV on the harmonic first-order model -------------------------------------------------------

def check_qmv_chain() -> None:
    rng = np.random.default_rng(0)
    for n in range(3, 33):
        weights, phi = rng.dirichlet(np.ones(n)), method.harmonic_phi(n, 1.0)
        abs_residual, pair = method.first_order_dispersion_mc(weights, phi, 2000, rng)
        bound = method.qmv_bound(method.first_order_increments(weights, phi))
        assert abs_residual <= pair <= bound, n


def test_qmv_chain_holds_by_monte_carlo_for_n_3_to_32():
    check_qmv_chain()


def test_qmv_negative_control_reused_permutations_fail(monkeypatch):
    """The library drawing the second permutation of each E_pair pair with the same stream as the first
    (a seeding bug: q_pi' = q_pi) gives E_pair = 0 < E|R|, so the chain must fail. The bound side is loose on
    these draws (4-300x E_pair), so its exactness is tested through the increments below."""
    original = method.random_ranks
    monkeypatch.setattr(method, "random_ranks", lambda n, n_perms, rng: original(n, n_perms, np.random.default_rng(0)))
    with pytest.raises(AssertionError):
        check_qmv_chain()


def check_increments_are_the_sup() -> None:
    """Delta_{i,t} equals the largest logit change over every ranking that moves chunk i from t to t+1."""
    rng = np.random.default_rng(2)
    n = 5
    weights, phi = rng.dirichlet(np.ones(n)), method.harmonic_phi(n, 1.0)
    increments = method.first_order_increments(weights, phi)
    for i in range(n):
        for t in range(1, n):
            changes = [abs((weights[i] - weights[j]) * (phi[t] - phi[t - 1])) for j in range(n) if j != i]
            assert increments[i, t - 1] == pytest.approx(max(changes))


def test_first_order_increments_are_the_adjacent_transposition_sup():
    check_increments_are_the_sup()


def test_increments_negative_control_inf_over_neighbours_fails(monkeypatch):
    """The library taking min_j |w_i - w_j| (inf instead of sup over the chunk at t+1) fails the check."""
    def inf_over_neighbours(weights, phi):
        gaps = np.abs(weights[:, None] - weights[None, :])
        np.fill_diagonal(gaps, np.inf)
        return gaps.min(axis=1)[:, None] * np.abs(np.diff(phi))[None, :]

    monkeypatch.setattr(method, "first_order_increments", inf_over_neighbours)
    with pytest.raises(AssertionError):
        check_increments_are_the_sup()


def test_equal_weights_give_zero_dispersion_and_unequal_weights_do_not():
    rng = np.random.default_rng(3)
    n = 8
    phi = method.harmonic_phi(n, 1.0)
    abs_residual, pair = method.first_order_dispersion_mc(np.full(n, 1 / n), phi, 500, rng)
    assert abs_residual == 0.0 and pair == 0.0
    assert method.qmv_bound(method.first_order_increments(np.full(n, 1 / n), phi)) == 0.0
    abs_residual, _ = method.first_order_dispersion_mc(rng.dirichlet(np.ones(n)), phi, 500, rng)
    assert abs_residual > 1e-3


def test_harmonic_closed_form_is_log_n_and_bounds_the_regular_decay_sum():
    for n in (3, 8, 32):
        harmonic = float(np.sum(1 / np.arange(1, n)))
        assert method.qmv_regular_decay_bound(4.0, n, 1.0) == pytest.approx(harmonic)
    # alpha < 1 grows polynomially, alpha > 1 stays bounded.
    assert method.qmv_regular_decay_bound(4.0, 1000, 0.5) > 10 * method.qmv_regular_decay_bound(4.0, 10, 0.5) / 4
    assert method.qmv_regular_decay_bound(4.0, 10_000, 2.0) < np.pi**2 / 6 + 1e-9


# (a)5 log growth in the key-chunk form -----------------------------------------------------------

TEST_N = [3, 4, 6, 8, 12, 16, 24, 32]


def check_key_chunk_vector() -> None:
    values = [method.key_chunk_dispersion(n) for n in TEST_N]
    assert values[0] == pytest.approx(0.04945, abs=1e-5)
    assert values[-1] == pytest.approx(0.07982, abs=1e-5)
    assert all(a < b for a, b in zip(values, values[1:]))
    log_fit = method.fit_log_growth(TEST_N, values)
    linear_fit = method.least_squares_fit(np.asarray(TEST_N, float), np.asarray(values))
    assert log_fit.r2 == pytest.approx(0.967, abs=2e-3)
    assert linear_fit.r2 == pytest.approx(0.777, abs=2e-3)


def test_key_chunk_dispersion_vector_and_log_shape():
    check_key_chunk_vector()


def test_key_chunk_negative_control_linear_phi_fails(monkeypatch):
    """The library using phi(r) = C r (no log) instead of C ln r misses the brief's vector."""
    monkeypatch.setattr(method, "harmonic_phi", lambda n, scale: scale * np.arange(1, n + 1, dtype=float))
    with pytest.raises(AssertionError):
        check_key_chunk_vector()


def test_dirichlet_weights_over_all_chunks_shrink_dispersion_with_n():
    """With Dirichlet weights over all n chunks the dispersion shrinks with n: growth needs the key chunk."""
    rng = np.random.default_rng(4)
    means = []
    for n in (3, 32):
        phi = method.harmonic_phi(n, -0.5)
        means.append(np.mean([method.first_order_dispersion_mc(rng.dirichlet(np.ones(n)), phi, 2000, rng)[0]
                              for _ in range(20)]))
    assert means[1] < means[0]


def test_log_fit_recovers_an_exact_law():
    n = np.array(TEST_N, float)
    fit = method.fit_log_growth(n, 0.1 + 0.03 * np.log(n))
    assert fit.slope == pytest.approx(0.03) and fit.intercept == pytest.approx(0.1) and fit.r2 == pytest.approx(1.0)
    slopes = method.bootstrap_log_slope([np.full(5, 0.1 + 0.03 * np.log(k)) for k in n], n, 20,
                                        np.random.default_rng(0))
    np.testing.assert_allclose(slopes, 0.03)


# (a)6 the official code's bound -------------------------------------------------------------------

def check_official_bound_vector() -> None:
    assert method.official_martingale_bound(4) == pytest.approx(0.07292, abs=1e-5)
    assert method.official_martingale_bound(8) == pytest.approx(0.15223, abs=1e-5)


def test_official_martingale_bound_vector():
    check_official_bound_vector()


def test_official_bound_negative_control_off_by_one_harmonic_fails(monkeypatch):
    """The library using H_{n-1} instead of H_n misses the vector."""
    original = method.harmonic_number
    monkeypatch.setattr(method, "harmonic_number", lambda n: original(n - 1))
    with pytest.raises(AssertionError):
        check_official_bound_vector()


# (a)7 wiring control of the planner -----------------------------------------------------------------

def check_wiring_control() -> None:
    rng = np.random.default_rng(5)
    q_full = rng.uniform(0.01, 0.99, size=(200, 16))
    plan = method.plan_answers(q_full, q_full[:, :6], H_STAR, 6.0, "symmetric")
    assert np.all(plan.delta_bar == 0.0) and np.all(plan.isr == 0.0) and not plan.answer.any()


def test_skeletons_equal_to_the_prompt_give_zero_budget_and_abstain_everywhere():
    check_wiring_control()


def test_wiring_negative_control_misaligned_skeleton_pairing_fails(monkeypatch):
    """The library pairing skeleton k with full-prompt permutation k + 1 (an off-by-one in the pairing)
    gives u_k != 0, so the wiring check must fail."""
    original = method.paired_label_probabilities

    def shifted(q_full, q_skeleton, decision):
        return original(np.roll(q_full, -1, axis=1), q_skeleton, decision)

    monkeypatch.setattr(method, "paired_label_probabilities", shifted)
    with pytest.raises(AssertionError):
        check_wiring_control()


def test_uninformative_skeletons_let_confident_items_answer():
    q_full = np.full((4, 16), 0.995)
    plan = method.plan_answers(q_full, np.full((4, 6), 0.5), H_STAR, 6.0, "symmetric")
    # u = ln(0.995 / 0.5) = 0.688 >= B2T(0.5) = 0.495: every item answers with label 1.
    np.testing.assert_allclose(plan.delta_bar, np.log(0.995 / 0.5))
    np.testing.assert_allclose(plan.b2t, method.bits_to_trust(0.5, H_STAR))
    assert plan.answer.all() and (plan.decision == 1).all()


# Planner pieces ------------------------------------------------------------------------------------

def test_clip_modes():
    u = np.array([-8.0, -1.0, 0.5, 9.0])
    np.testing.assert_array_equal(method.clip_lift(u, 6.0, "symmetric"), [-6.0, -1.0, 0.5, 6.0])
    np.testing.assert_array_equal(method.clip_lift(u, 12.0, "one_sided"), [0.0, 0.0, 0.5, 9.0])
    with pytest.raises(ValueError, match="clip B"):
        method.clip_lift(u, 0.0, "symmetric")
    with pytest.raises(ValueError, match="clip mode"):
        method.clip_lift(u, 1.0, "both")  # type: ignore[arg-type]


def test_isr_and_gate():
    isr = method.information_sufficiency_ratio(np.array([1.0, 0.5, 0.0, 2.0]), np.array([1.0, 1.0, 0.0, 0.0]))
    np.testing.assert_array_equal(isr, [1.0, 0.5, 1.0, np.inf])
    np.testing.assert_array_equal(method.answer_gate(isr), [True, False, True, True])
    margin = method.answer_gate(isr, np.array([1.0, 0.5, 0.0, 2.0]), np.array([1.0, 1.0, 0.0, 0.0]), margin=0.5)
    np.testing.assert_array_equal(margin, [False, False, False, True])


def check_jensen_gap() -> None:
    """C3b: J = mean_k(-log q_k) + log mean_k q_k, exactly, and >= 0 on any probabilities (Jensen)."""
    q = np.array([[0.2, 0.4, 0.6, 0.8], [0.5, 0.5, 0.5, 0.5]])
    np.testing.assert_allclose(method.mean_abs_residual(q), [0.2, 0.0])
    np.testing.assert_allclose(method.mean_pair_difference(q), [(0.2 * 3 + 0.4 * 2 + 0.6) * 2 / 12, 0.0])
    gap = method.jensen_gap(q)
    expected = -np.log([0.2, 0.4, 0.6, 0.8]).mean() + np.log(0.5)  # 0.1218...
    assert gap[0] == pytest.approx(expected, abs=1e-15) and gap[1] == pytest.approx(0.0, abs=1e-15)
    assert np.all(method.mean_abs_residual(q) <= method.mean_pair_difference(q) + 1e-15)
    random = np.random.default_rng(7).uniform(1e-6, 1.0, size=(10_000, 16))
    assert method.jensen_gap(random).min() >= -1e-12


def test_dispersion_and_jensen_gap_identities():
    check_jensen_gap()


def test_jensen_gap_negative_control_over_eager_probability_clip_fails(monkeypatch):
    """The library clipping probabilities to [0.5, 1] (a wrong floor) changes J, and the exact check catches it."""
    monkeypatch.setattr(method, "_clip_prob", lambda p: np.clip(p, 0.5, 1.0))
    with pytest.raises(AssertionError):
        check_jensen_gap()


def test_eg_mixture_finds_the_informative_slot_and_uniform_is_optimal_when_slots_are_exchangeable():
    rng = np.random.default_rng(6)
    skewed = np.column_stack([np.full(100, 0.9), np.full(100, 0.3)])
    weights = method.exponentiated_gradient_mixture(skewed, 300, 0.5)
    assert weights[0] > 0.99
    assert method.uniform_mixture_gap(skewed) > 0.1
    exchangeable = rng.uniform(0.3, 0.9, size=(20_000, 4))
    assert 0 <= method.uniform_mixture_gap(exchangeable) < 1e-3


def test_confidence_gate_abstains_on_the_least_confident():
    q = np.array([0.5, 0.9, 0.45, 0.02, 0.7])
    np.testing.assert_array_equal(baselines.confidence_gate(q, 0.4), [False, True, False, True, True])
    assert baselines.abstain_lowest(q, 0.0).all()
    with pytest.raises(ValueError, match="abstention"):
        baselines.abstain_lowest(q, 1.5)


def check_zero_need_convention() -> None:
    """B2T = 0 (the prior already at the target 1 - h*): the gate is the sufficiency condition Delta_bar >= B2T,
    so a zero budget answers (the official toolkit's convention), a positive one answers, a negative one abstains.
    Through Algorithm 1: skeletons equal to the prompt at q = 0.75 with h* = 0.25 give u_k = 0, Delta_bar = 0,
    q_lo = 0.75 = 1 - h*, B2T = 0 exactly, and the item is answered."""
    isr = method.information_sufficiency_ratio(np.array([0.0, 0.2, -0.2]), np.zeros(3))
    np.testing.assert_array_equal(isr, [1.0, np.inf, -np.inf])
    np.testing.assert_array_equal(method.answer_gate(isr), [True, True, False])
    plan = method.plan_answers(np.full((2, 4), 0.75), np.full((2, 2), 0.75), 0.25, 6.0, "symmetric")
    assert plan.b2t.tolist() == [0.0, 0.0] and plan.delta_bar.tolist() == [0.0, 0.0]
    assert plan.answer.tolist() == [True, True]
    # ISR >= 1 is Delta_bar >= B2T on every input, zero need included (non-degenerate draws, some ties)
    rng = np.random.default_rng(7)
    delta = np.round(rng.normal(0.5, 0.5, 400), 1)
    b2t = np.where(rng.random(400) < 0.2, 0.0, np.round(rng.uniform(0.0, 1.0, 400), 1))
    assert (b2t == 0).any() and (delta == b2t).any() and (delta < 0).any()
    np.testing.assert_array_equal(method.answer_gate(method.information_sufficiency_ratio(delta, b2t)), delta >= b2t)


def test_gate_answers_when_no_information_is_needed_and_none_is_given():
    check_zero_need_convention()


def test_negative_control_zero_over_zero_abstaining_fails(monkeypatch):
    """The library's pre-issue-19 convention (ISR = 0 when B2T = 0 and Delta_bar = 0: abstain) breaks the check."""
    def old_ratio(delta_bar, b2t):
        delta_bar, b2t = np.broadcast_arrays(np.asarray(delta_bar, dtype=float), np.asarray(b2t, dtype=float))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(b2t > 0, delta_bar / np.where(b2t > 0, b2t, 1.0), np.where(delta_bar > 0, np.inf, 0.0))
    monkeypatch.setattr(method, "information_sufficiency_ratio", old_ratio)
    with pytest.raises(AssertionError):
        check_zero_need_convention()
