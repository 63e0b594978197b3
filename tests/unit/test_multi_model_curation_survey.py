"""multi_model_curation, issue 19: the configuration prior and the batched K -> infinity recursion of the
survey (claims C7a-e), and the Gaussian-mixture generators refit by EM (claims C8a-c). Every quantity a
claim uses is checked against hand-computed values or an identity, with a negative control that breaks the
library and shows that the same check fails."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from tasks.common.params import ParamsError, params_section, validate_paper_section
from tasks.common.results import SeedResult
from tasks.multi_model_curation import claim_metrics, evaluate, method
from tasks.multi_model_curation.config import CONFIG

SPECS = method.canonical_specs()


def batch_of(specs: list[method.LoopSpec], beta1_low: float, beta1_high: float) -> method.ConfigBatch:
    """Two-model canonical specs as a ConfigBatch with one beta_1 range."""
    size = len(specs)
    return method.ConfigBatch(np.stack([s.mixing for s in specs]), np.stack([s.real_share for s in specs]),
                              np.stack([s.targets[:, 0] for s in specs]), np.array([s.beta[1] for s in specs]),
                              np.full(size, beta1_low), np.full(size, beta1_high))


# ------------------------------------------------------------------------------------------------
# Batched K -> infinity recursion
# ------------------------------------------------------------------------------------------------

def batched_matches_fixed_point(batched) -> bool:
    """The batched recursion gives each canonical config's fixed-point alignment (``method.fixed_point``)."""
    names = ("dampen", "cross_invert", "self_invert", "divergent")
    specs = [SPECS[n] for n in names[:3]]
    alignment, moved = batched(np.stack([s.mixing for s in specs]), np.stack([s.real_share for s in specs]),
                               np.stack([s.beta for s in specs]), np.stack([s.targets[:, 0] for s in specs]), 2000)
    expected = np.stack([method.fixed_point(s, 2000).alignment for s in specs])
    return bool(np.allclose(alignment, expected, atol=1e-10, rtol=0) and np.all(moved < 1e-12))


def test_batched_recursion_is_the_fixed_point_of_each_config():
    assert batched_matches_fixed_point(method.batched_fixed_alignment)
    # The reference values of the self-invert config at beta_1 = 4 (README, canonical configurations).
    spec = SPECS["self_invert"]
    alignment, _ = method.batched_fixed_alignment(spec.mixing[None], spec.real_share[None], spec.beta[None],
                                                  spec.targets[:, 0][None], 2000)
    assert alignment[0] == pytest.approx([-9.850, -4.476], abs=1e-3)


def test_batched_recursion_negative_control_without_real_data_term():
    """A recursion that drops the lambda p_data term of the refit must fail the same comparison."""
    def no_real_data(mixing, real_share, beta, targets, rounds):
        return method.batched_fixed_alignment(mixing, np.zeros_like(real_share), beta, targets, rounds)

    assert not batched_matches_fixed_point(no_real_data)


def test_unconverged_draws_are_reported_by_the_state_change():
    """The divergent config (lambda = 0) has no fixed point: after 200 rounds its state still moves by far
    more than the survey's tolerance (1e-9), so such a draw is not counted; dampen has converged."""
    specs = [SPECS["divergent"], SPECS["dampen"]]
    _, moved = method.batched_fixed_alignment(np.stack([s.mixing for s in specs]),
                                              np.stack([s.real_share for s in specs]),
                                              np.stack([s.beta for s in specs]),
                                              np.stack([s.targets[:, 0] for s in specs]), 200)
    assert moved[0] > 1e-4
    assert moved[1] < 1e-12


def test_survey_chords_are_the_canonical_chords():
    """self-invert over beta_1 0.6 -> 4: model 1's chord (-9.850 + 9.444) / 3.4 and its isolated counterpart's
    (-2.953 + 3.312) / 3.4 (brief reference values); dampen 0 -> 5 gains (+0.310)."""
    chords = method.survey_chords(batch_of([SPECS["self_invert"]], 0.6, 4.0), 2000)
    assert chords["dA1"][0] == pytest.approx((-9.850 + 9.444) / 3.4, abs=5e-4)
    assert chords["isolated_dA"][0] == pytest.approx((-2.953 + 3.312) / 3.4, abs=5e-4)
    expected = method.chord_effect(SPECS["self_invert"], 0, 0.6, 4.0)
    assert chords["dA2"][0] == pytest.approx(expected[1], abs=1e-10)
    dampen = method.survey_chords(batch_of([SPECS["dampen"]], 0.0, 5.0), 2000)
    assert dampen["dA1"][0] == pytest.approx(0.310, abs=1e-3)
    assert method.self_inverts(chords["dA1"], chords["isolated_dA"]).tolist() == [True]
    assert method.self_inverts(dampen["dA1"], dampen["isolated_dA"]).tolist() == [False]


def test_self_inverts_needs_both_conditions():
    coupled = np.array([-0.1, -0.1, 0.2, 0.0])
    isolated = np.array([0.3, -0.2, 0.3, 0.3])
    assert method.self_inverts(coupled, isolated).tolist() == [True, False, False, False]


# ------------------------------------------------------------------------------------------------
# The prior
# ------------------------------------------------------------------------------------------------

def prior_laws_hold() -> bool:
    """``method.draw_configs`` gives valid configurations with the stated uniform laws."""
    prior = method.ConfigPrior()
    batch = method.draw_configs(prior, 20_000, np.random.default_rng(0))
    rows = batch.mixing.sum(axis=2)
    split = batch.mixing[:, :, 0] / (1 - batch.real_share)
    return bool(np.allclose(rows, 1 - batch.real_share, atol=1e-12)
                and batch.real_share.min() >= 0.05 and batch.real_share.max() <= 0.6
                and np.abs(batch.targets).max() <= 4.0
                and np.allclose(batch.beta1_high - batch.beta1_low, 3.0)
                # Uniform laws: means (0.05 + 0.6) / 2, 0, 1, 0.5; the split u_i has mean 1/2, variance 1/12.
                and abs(batch.real_share.mean() - 0.325) < 0.005
                and abs(batch.targets.mean()) < 0.05
                and abs(batch.beta2.mean() - 1.0) < 0.02
                and abs(batch.beta1_low.mean() - 0.5) < 0.01
                and abs(split.mean() - 0.5) < 0.01 and abs(split.var() - 1 / 12) < 0.003)


def test_prior_draws_are_valid_configs_with_the_stated_laws():
    assert prior_laws_hold()
    prior = method.ConfigPrior()
    batch = method.draw_configs(prior, 20_000, np.random.default_rng(0))
    spec = batch.spec(3, float(batch.beta1_high[3]))
    assert spec.beta[0] == batch.beta1_high[3] and spec.beta[1] == batch.beta2[3]
    again = method.draw_configs(prior, 20_000, np.random.default_rng(0))
    assert np.array_equal(again.mixing, batch.mixing) and np.array_equal(again.targets, batch.targets)


@pytest.mark.parametrize("break_law", ["targets_positive", "split_not_flat"])
def test_prior_laws_negative_control(monkeypatch, break_law):
    """A prior with targets U[0, 4] instead of U[-4, 4], or a split u^2 (not flat) must fail the law check."""
    real = method.draw_configs

    def broken(prior, size, rng):
        b = real(prior, size, rng)
        if break_law == "targets_positive":
            return method.ConfigBatch(b.mixing, b.real_share, np.abs(b.targets), b.beta2, b.beta1_low, b.beta1_high)
        split = (b.mixing[:, :, 0] / (1 - b.real_share)) ** 2
        mixing = (1 - b.real_share)[:, :, None] * np.stack([split, 1 - split], axis=2)
        return method.ConfigBatch(mixing, b.real_share, b.targets, b.beta2, b.beta1_low, b.beta1_high)

    monkeypatch.setattr(method, "draw_configs", broken)
    assert not prior_laws_hold()


def test_prior_negative_control_unnormalised_split_is_rejected():
    """A draw whose synthetic shares do not sum to 1 - lambda is not a valid configuration (LoopSpec fails)."""
    batch = method.draw_configs(method.ConfigPrior(), 5, np.random.default_rng(1))
    broken = method.ConfigBatch(batch.mixing / (1 - batch.real_share)[:, :, None], batch.real_share, batch.targets,
                                batch.beta2, batch.beta1_low, batch.beta1_high)
    with pytest.raises(ValueError, match="rows of mixing must sum"):
        broken.spec(0, 1.0)


# ------------------------------------------------------------------------------------------------
# Gaussian-mixture generators
# ------------------------------------------------------------------------------------------------

def test_mixture_alignment_hand_value():
    mixture = method.Mixture1D(np.array([0.25, 0.75]), np.array([0.0, 2.0]), np.array([1.0, 0.5]))
    # -(0.25 (1 + 1) + 0.75 (1 + 0.5)) / 2
    assert mixture.alignment(1.0) == pytest.approx(-0.8125, abs=1e-12)


def test_mixture_log_likelihood_hand_values():
    y = np.array([-1.0, 0.5, 2.0])
    single = method.Mixture1D(np.ones(1), np.array([0.3]), np.array([2.0]))
    assert method.mixture_log_likelihood(y, single) == pytest.approx(
        stats.norm(0.3, np.sqrt(2.0)).logpdf(y).mean(), abs=1e-12)
    two = method.Mixture1D(np.array([0.4, 0.6]), np.array([-1.0, 1.0]), np.array([0.5, 1.5]))
    density = 0.4 * stats.norm(-1, np.sqrt(0.5)).pdf(y) + 0.6 * stats.norm(1, np.sqrt(1.5)).pdf(y)
    assert method.mixture_log_likelihood(y, two) == pytest.approx(np.log(density).mean(), abs=1e-12)


def test_mixture_sample_moments():
    mixture = method.Mixture1D(np.array([0.2, 0.8]), np.array([-3.0, 1.0]), np.array([0.25, 1.0]))
    draws = mixture.sample((200_000,), np.random.default_rng(2))
    mean = 0.2 * -3 + 0.8 * 1.0
    var = 0.2 * (0.25 + 9) + 0.8 * (1 + 1) - mean**2
    assert draws.mean() == pytest.approx(mean, abs=0.01)
    assert draws.var() == pytest.approx(var, abs=0.03)
    below = 0.2 * stats.norm.cdf((-1.5 + 3.0) / 0.5) + 0.8 * stats.norm.cdf(-2.5)  # 0.2050
    assert np.mean(draws < -1.5) == pytest.approx(below, abs=0.003)


def test_em_with_one_component_is_the_gaussian_mle():
    y = np.random.default_rng(3).normal(1.5, 2.0, size=5000)
    fit = method.fit_mixture_em(y, 1, 3)
    assert fit.weights.tolist() == [1.0]
    assert fit.means[0] == pytest.approx(y.mean(), abs=1e-12)
    assert fit.variances[0] == pytest.approx(y.var(), abs=1e-10)


TRUE_MIXTURE = method.Mixture1D(np.array([0.3, 0.7]), np.array([-3.0, 2.0]), np.array([0.25, 1.0]))


def em_recovers(fit_fn) -> bool:
    y = TRUE_MIXTURE.sample((20_000,), np.random.default_rng(4))
    fit = fit_fn(y, 2, 60)
    order = np.argsort(fit.means)
    return bool(np.allclose(fit.weights[order], TRUE_MIXTURE.weights, atol=0.01)
                and np.allclose(fit.means[order], TRUE_MIXTURE.means, atol=0.03)
                and np.allclose(fit.variances[order], TRUE_MIXTURE.variances, atol=0.04))


def test_em_recovers_a_separated_mixture():
    assert em_recovers(method.fit_mixture_em)
    y = TRUE_MIXTURE.sample((20_000,), np.random.default_rng(4))
    # The mixture explains the bimodal data far better than one Gaussian (the C8a precondition's quantity).
    gain = (method.mixture_log_likelihood(y, method.fit_mixture_em(y, 2, 60))
            - method.mixture_log_likelihood(y, method.fit_mixture_em(y, 1, 1)))
    assert gain > 0.3


def test_em_negative_control_wrong_e_step(monkeypatch):
    """An E-step with the sign of the quadratic term flipped must fail the same recovery check."""
    def broken(y, mixture):
        return (0.5 * (y[:, None] - mixture.means) ** 2 / mixture.variances
                - 0.5 * np.log(2 * np.pi * mixture.variances) + np.log(mixture.weights))

    monkeypatch.setattr(method, "_component_log_density", broken)
    assert not em_recovers(method.fit_mixture_em)


def curated_mean_var(pick) -> tuple[float, float]:
    single = method.Mixture1D(np.ones(1), np.zeros(1), np.ones(1))
    kept = np.concatenate([method.curate_mixture(single, 5.0, 2.0, 64, 50_000, np.random.default_rng(s))
                           for s in range(4)])
    return float(kept.mean()), float(kept.var())


def test_mixture_curation_matches_finite_k_reference():
    """One Bradley-Terry step from N(0, 1), beta = 5, mu = 2, K = 64 (acceptance check (a)5: mean about
    1.64, near the tilt's m = 1.667, v = 0.167)."""
    mean, var = curated_mean_var(method.bradley_terry_pick)
    assert mean == pytest.approx(1.64, abs=0.03)
    assert var == pytest.approx(1 / 6, abs=0.03)


def test_mixture_curation_negative_control(monkeypatch):
    """Keeping the worst candidate (argmin of the Gumbel-perturbed reward) must fail the same check."""
    def worst(rewards, beta, rng):
        return np.argmin(beta * rewards, axis=1)

    monkeypatch.setattr(method, "bradley_terry_pick", worst)
    mean, _ = curated_mean_var(method.bradley_terry_pick)
    assert abs(mean - 1.64) > 0.5


def test_mixture_loop_with_one_component_tracks_the_gaussian_fixed_point():
    """One component: the isolated loop (lambda = 0.2, beta = 5, mu = 2, K = 64) settles near the K -> inf
    A* = -0.568 (finite K sits slightly below), and the log-likelihood gain over one Gaussian is exactly 0."""
    spec = SPECS["isolated"]
    real = method.unconditional_real_data(20_000, 0.0, 1.0, np.random.default_rng(5))
    one = method.iterate_mixture(spec, 12, 64, 3000, real, np.random.default_rng(6), 1, 1)
    assert one.alignment.shape == (13, 1)
    assert one.alignment[0, 0] == pytest.approx(-2.5)  # the real-data start: -((0 - 2)^2 + 1) / 2
    assert one.alignment[5:, 0].mean() == pytest.approx(-0.568, abs=0.05)
    assert one.loglik_gain[0] == pytest.approx(0.0, abs=1e-12)
    three = method.iterate_mixture(spec, 4, 64, 3000, real, np.random.default_rng(6), 3, 5)
    assert three.loglik_gain[0] > 0.0


def test_mixture_loop_rejects_conditional_specs():
    with pytest.raises(ValueError, match="1-D"):
        method.iterate_mixture(SPECS["dampen"].with_dim(3), 2, 4, 200, method.RealData(np.ones((200, 1)),
                               np.zeros(200)), np.random.default_rng(0), 2, 2)


# ------------------------------------------------------------------------------------------------
# Claim metrics of the survey and of the mixture test
# ------------------------------------------------------------------------------------------------

def survey_result() -> SeedResult:
    rows = []
    # (index, random, inverting, label, sampled_dA1, isolated_dA)
    for index, random, inverting, label, dA1, iso in [
        (0, True, False, "ksmall", 0.2, 0.3), (0, True, False, "klarge", 0.21, 0.3),
        (1, True, False, "ksmall", -0.05, 0.1), (1, True, False, "klarge", -0.06, 0.1),
        (7, False, True, "ksmall", 0.01, 0.2), (7, False, True, "klarge", -0.02, 0.2),
        (9, False, True, "ksmall", -0.03, 0.2), (9, False, True, "klarge", -0.04, 0.2),
    ]:
        rows.append({"index": index, "random": random, "inverting": inverting, "converged": True, "label": label,
                     "sampled_dA1": dA1, "analytic_isolated_dA": iso})
    return SeedResult(0).add({"survey_kinf_inverting": 3.0, "survey_kinf_trials": 100.0},
                             tables={"survey_sampled": rows})


def test_survey_claim_counts():
    metrics = claim_metrics.survey_claims(survey_result())
    assert metrics["survey_kinf_rate"] == pytest.approx(0.03)
    assert (metrics["survey_random_inverting_ksmall"], metrics["survey_random_trials_ksmall"]) == (1.0, 2.0)
    assert (metrics["survey_random_inverting_klarge"], metrics["survey_random_trials_klarge"]) == (1.0, 2.0)
    assert (metrics["survey_inverting_inverting_ksmall"], metrics["survey_inverting_trials_ksmall"]) == (1.0, 2.0)
    assert (metrics["survey_inverting_inverting_klarge"], metrics["survey_inverting_trials_klarge"]) == (2.0, 2.0)
    assert metrics["survey_inverting_rate_ksmall"] == 0.5


def test_survey_without_iid_draws_has_counts_but_no_rate():
    """survey.sampled_random = 0 (cpu since 2026-12-02): zero trials, and no rate (not a NaN)."""
    result = survey_result()
    result.tables["survey_sampled"] = [r for r in result.tables["survey_sampled"] if not r["random"]]
    metrics = claim_metrics.survey_claims(result)
    assert metrics["survey_random_trials_klarge"] == 0.0 and "survey_random_rate_klarge" not in metrics
    assert metrics["survey_inverting_rate_klarge"] == 1.0


def test_survey_claim_counts_negative_control(monkeypatch):
    """An event that ignores the isolated condition's sign and counts chords > 0 changes the counts."""
    monkeypatch.setattr(method, "self_inverts", lambda coupled, isolated: np.asarray(coupled) > 0)
    metrics = claim_metrics.survey_claims(survey_result())
    assert metrics["survey_inverting_inverting_klarge"] != 2.0


def test_survey_indices_are_first_draws_and_first_inverting():
    cfg = CONFIG.model_validate(params_section("multi_model_curation")["cpu"]).survey
    inverting = np.zeros(40, dtype=bool)
    inverting[[2, 11, 30]] = True
    assert evaluate.survey_indices(inverting, cfg.model_copy(update={"sampled_random": 4})) == [0, 1, 2, 3, 11]
    # cpu since the review of 2026-12-02: no i.i.d. draws, the first two K -> inf inverters only
    assert evaluate.survey_indices(inverting, cfg) == [2, 11]


MIXTURE_CFG = CONFIG.model_validate(params_section("multi_model_curation")["smoke"]).mixture  # burn_in 3


def mixture_rows() -> list[dict]:
    """Hand-made table: curves of 9 values (rounds 0-8); with burn_in 3 the window is rounds 4-8, whose
    halves are rounds 4-5 and 7-8. Their means are the rows' A1 / A2."""
    def curve(fixed: float, drift: float) -> list[float]:
        return [0.0, 5.0, 5.0, 5.0] + [fixed - drift / 2, fixed - drift / 2, fixed, fixed + drift / 2,
                                       fixed + drift / 2]

    return [{"components": g, "beta1": b, "A1": a1, "A2": a2, "isolated_A": iso, "loglik_gain_1": gain,
             "loglik_gain_2": 0.0, "em_step_gain_1": em, "em_step_gain_2": 0.0, "fit_size": 3000,
             "curve_A1": curve(a1, d1), "curve_A2": curve(a2, 0.0)}
            for g, b, a1, a2, iso, gain, em, d1 in [
                (3, 0.6, -9.4, -3.3, -3.3, 0.05, 1e-4, 0.02), (3, 4.0, -9.2, -4.4, -3.1, 0.12, 3e-4, -0.15),
                (1, 4.0, -9.7, -4.2, -2.9, 0.0, 0.0, 0.0), (1, 0.6, -9.35, -3.35, -3.3, 0.0, 0.0, 0.0)]]


def test_window_drift_hand_values():
    assert claim_metrics.window_drift([9.0, 9.0, 9.0, 1.0, 2.0, 3.0, 4.0], 2) == pytest.approx(2.0)
    # odd window: the middle round is in neither half
    assert claim_metrics.window_drift([9.0, 1.0, 2.0, 30.0, 4.0, 5.0], 0) == pytest.approx(4.5 - 1.5)
    with pytest.raises(ValueError, match="fewer than 2"):
        claim_metrics.window_drift([0.0, 1.0, 2.0], 1)


def drift_metrics_as_hand_computed() -> bool:
    metrics = claim_metrics.mixture_claims(SeedResult(0).add(tables={"mixture_self_invert": mixture_rows()}),
                                           MIXTURE_CFG)
    # dA1: drifts 0.02 and -0.15 (|max| 0.15) against half of |-9.2 - (-9.4)| = 0.1 -> +0.05
    # dA2: no drift, half of |-4.4 - (-3.3)| = 0.55 -> -0.55; sum: drift 0.15 against |-13.6 + 12.7| / 2
    return (metrics["mixture_drift_excess_dA1"] == pytest.approx(0.05)
            and metrics["mixture_drift_excess_dA2"] == pytest.approx(-0.55)
            and metrics["mixture_drift_excess_dsum"] == pytest.approx(0.15 - 0.45)
            and metrics["gaussian_control_drift_excess_dA1"] == pytest.approx(-0.175))


def test_mixture_drift_excess_hand_values():
    assert drift_metrics_as_hand_computed()


def test_mixture_drift_excess_negative_control(monkeypatch):
    """A drift that averages from round 0 (burn-in included) must fail the same hand values."""
    real = claim_metrics.window_drift
    monkeypatch.setattr(claim_metrics, "window_drift", lambda curve, burn_in: real(curve, 0))
    assert not drift_metrics_as_hand_computed()


def test_bic_penalty_hand_values():
    assert method.bic_penalty_per_sample(3, 3000) == pytest.approx(6 * np.log(3000) / 6000)  # 0.008006
    assert method.bic_penalty_per_sample(3, 3000) == pytest.approx(0.0080064, abs=1e-7)
    assert method.bic_penalty_per_sample(1, 3000) == 0.0
    with pytest.raises(ValueError, match="components"):
        method.bic_penalty_per_sample(0, 3000)


def gain_over_bic_as_hand_computed() -> bool:
    metrics = claim_metrics.mixture_claims(SeedResult(0).add(tables={"mixture_self_invert": mixture_rows()}),
                                           MIXTURE_CFG)
    return (metrics["mixture_loglik_gain_over_bic_model1"] == pytest.approx(0.12 - 0.0080064, abs=1e-7)
            and metrics["gaussian_control_loglik_gain_over_bic_model1"] == 0.0
            and metrics["mixture_em_step_gain_model1"] == pytest.approx(3e-4))


def test_mixture_gain_over_bic_hand_values():
    assert gain_over_bic_as_hand_computed()


def test_mixture_gain_over_bic_negative_control(monkeypatch):
    """A penalty that counts all 3 G - 1 parameters of the mixture (not the 3 (G - 1) extra ones) fails."""
    monkeypatch.setattr(method, "bic_penalty_per_sample", lambda g, n: (3 * g - 1) * np.log(n) / (2 * n))
    assert not gain_over_bic_as_hand_computed()


def one_em_step_by_hand(y: np.ndarray, m: method.Mixture1D) -> float:
    """The log-likelihood change of one E/M step, written out with scipy's normal density."""
    def loglik(w, mu, v):
        return float(np.mean(np.log((w * stats.norm.pdf(y[:, None], mu, np.sqrt(v))).sum(axis=1))))

    dens = m.weights * stats.norm.pdf(y[:, None], m.means, np.sqrt(m.variances))
    resp = dens / dens.sum(axis=1, keepdims=True)
    mass = resp.sum(axis=0)
    mu = (resp * y[:, None]).sum(axis=0) / mass
    v = (resp * (y[:, None] - mu) ** 2).sum(axis=0) / mass
    return loglik(mass / y.size, mu, v) - loglik(m.weights, m.means, m.variances)


def em_step_gain_as_hand_computed() -> bool:
    y = TRUE_MIXTURE.sample((4000,), np.random.default_rng(8))
    poor = method.Mixture1D(np.array([0.5, 0.5]), np.array([-1.0, 1.0]), np.array([2.0, 2.0]))
    gain = method.em_step_gain(y, poor)
    converged = method.em_step_gain(y, method.fit_mixture_em(y, 2, 300, start=poor))
    return bool(gain > 0.05 and gain == pytest.approx(one_em_step_by_hand(y, poor), abs=1e-10)
                and abs(converged) < 1e-9)


def test_em_step_gain_is_one_em_step_and_vanishes_at_a_fixed_point():
    assert em_step_gain_as_hand_computed()


def test_em_step_gain_negative_control(monkeypatch):
    """An EM that returns its start unchanged reports no gain at the poor start: the same check fails."""
    monkeypatch.setattr(method, "fit_mixture_em", lambda y, components, iterations, start=None: start)
    assert not em_step_gain_as_hand_computed()


def test_mixture_loop_records_em_step_gain_and_fit_size():
    spec = SPECS["isolated"]
    real = method.unconditional_real_data(20_000, 0.0, 1.0, np.random.default_rng(5))
    three = method.iterate_mixture(spec, 4, 64, 3000, real, np.random.default_rng(6), 3, 5)
    assert three.fit_size == 3000
    assert three.em_step_gain.shape == (1,) and three.em_step_gain[0] >= -1e-12


def surveyed_with_an_unconverged_inverter(monkeypatch) -> tuple[SeedResult, list[int]]:
    """measure_survey on 6 draws whose K -> inf chords are hand-made: draw 1 would self-invert but has not
    converged (moved 1e-3 > tol), draws 3 and 4 self-invert and converged, draw 5 has a negative chord with
    an isolated loss (not an inversion). The sampled loops are replaced by a fixed chord."""
    cfg = CONFIG.model_validate(params_section("multi_model_curation")["cpu"]).survey.model_copy(
        update={"analytic_configs": 6, "sampled_random": 0, "sampled_inverting": 2})
    sampled = CONFIG.model_validate(params_section("multi_model_curation")["cpu"]).sampled
    table = {"dA1": np.array([0.2, -0.3, 0.1, -0.05, -0.4, -0.2]), "dA2": np.zeros(6),
             "isolated_dA": np.array([0.3, 0.2, 0.1, 0.1, 0.2, -0.1]),
             "moved": np.array([0.0, 1e-3, 0.0, 1e-12, 0.0, 0.0])}
    monkeypatch.setattr(method, "survey_chords", lambda batch, rounds: table)
    monkeypatch.setattr(evaluate, "sampled_chord", lambda *args: np.array([-0.1, -0.2]))
    result = SeedResult(0)
    evaluate.measure_survey(cfg, sampled, 0, None, lambda *a: None, result)
    return result, sorted({r["index"] for r in result.tables["survey_sampled"]})


def test_survey_skips_unconverged_inverting_draws(monkeypatch):
    result, sampled_indices = surveyed_with_an_unconverged_inverter(monkeypatch)
    assert sampled_indices == [3, 4]
    assert (result.metrics["survey_kinf_trials"], result.metrics["survey_kinf_inverting"],
            result.metrics["survey_kinf_unconverged"]) == (5.0, 2.0, 1.0)
    assert result.metrics["survey_kinf_median_inverting_dA1"] == pytest.approx(-0.225)
    assert result.metrics["survey_kinf_isolated_not_gaining"] == 1.0


def test_survey_masking_negative_control(monkeypatch):
    """Masks that ignore convergence let the unconverged draw 1 in: the same check fails."""
    monkeypatch.setattr(evaluate, "counted_inverting", lambda chords, tol: (
        np.ones(chords["moved"].size, dtype=bool), method.self_inverts(chords["dA1"], chords["isolated_dA"])))
    result, sampled_indices = surveyed_with_an_unconverged_inverter(monkeypatch)
    assert sampled_indices != [3, 4] and result.metrics["survey_kinf_trials"] != 5.0


def test_mixture_claim_chords():
    rows = mixture_rows()
    metrics = claim_metrics.mixture_claims(SeedResult(0).add(tables={"mixture_self_invert": rows}), MIXTURE_CFG)
    assert metrics["mixture_self_invert_dA1"] == pytest.approx(0.2 / 3.4)
    assert metrics["mixture_self_invert_dA2"] == pytest.approx(-1.1 / 3.4)
    assert metrics["mixture_self_invert_dsum"] == pytest.approx(-0.9 / 3.4)
    assert metrics["mixture_self_invert_isolated_dA"] == pytest.approx(0.2 / 3.4)
    assert metrics["mixture_loglik_gain_model1"] == pytest.approx(0.12)
    # the control rows are read in beta order even when stored out of order
    assert metrics["gaussian_control_self_invert_dA1"] == pytest.approx(-0.35 / 3.4)
    assert metrics["gaussian_control_self_invert_isolated_dA"] == pytest.approx(0.4 / 3.4)


# ------------------------------------------------------------------------------------------------
# Config
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("mutate", "message"), [
    (lambda f: f["cpu"]["survey"].update(burn_in=30), r"multi_model_curation\.cpu\.survey: .*burn_in"),
    (lambda f: f["cpu"]["survey"].update(sampled_random=0, sampled_inverting=0),
     r"multi_model_curation\.cpu\.survey: .*sampled_random \+ sampled_inverting"),
    (lambda f: f["cpu"]["mixture"].update(components=1), r"multi_model_curation\.cpu\.mixture\.components"),
    (lambda f: f["cpu"]["mixture"].update(n_samples=10**7), r"mixture\.n_samples .* must be <= sampled\.real_pool"),
    (lambda f: f["cpu"].pop("sampled"), r"survey needs the sampled section"),
])
def test_bad_survey_and_mixture_values_name_the_key(mutate, message):
    fragment = params_section("multi_model_curation")
    mutate(fragment)
    with pytest.raises(ParamsError, match=message):
        validate_paper_section("multi_model_curation", fragment)
