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
    # The brief's reference values of the self-invert config at beta_1 = 4.
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

def test_prior_draws_are_valid_configs_with_the_stated_laws():
    prior = method.ConfigPrior()
    batch = method.draw_configs(prior, 20_000, np.random.default_rng(0))
    rows = batch.mixing.sum(axis=2)
    assert np.allclose(rows, 1 - batch.real_share, atol=1e-12)
    assert batch.real_share.min() >= 0.05 and batch.real_share.max() <= 0.6
    assert np.abs(batch.targets).max() <= 4.0
    assert np.allclose(batch.beta1_high - batch.beta1_low, 3.0)
    # Uniform laws: means (0.05 + 0.6) / 2, 0, 1, 0.5; the split u_i has mean 1/2.
    assert batch.real_share.mean() == pytest.approx(0.325, abs=0.005)
    assert batch.targets.mean() == pytest.approx(0.0, abs=0.05)
    assert batch.beta2.mean() == pytest.approx(1.0, abs=0.02)
    assert batch.beta1_low.mean() == pytest.approx(0.5, abs=0.01)
    assert (batch.mixing[:, :, 0] / (1 - batch.real_share)).mean() == pytest.approx(0.5, abs=0.01)
    spec = batch.spec(3, float(batch.beta1_high[3]))
    assert spec.beta[0] == batch.beta1_high[3] and spec.beta[1] == batch.beta2[3]
    again = method.draw_configs(prior, 20_000, np.random.default_rng(0))
    assert np.array_equal(again.mixing, batch.mixing) and np.array_equal(again.targets, batch.targets)


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


def test_survey_claim_counts_negative_control(monkeypatch):
    """An event that ignores the isolated condition's sign and counts chords > 0 changes the counts."""
    monkeypatch.setattr(method, "self_inverts", lambda coupled, isolated: np.asarray(coupled) > 0)
    metrics = claim_metrics.survey_claims(survey_result())
    assert metrics["survey_inverting_inverting_klarge"] != 2.0


def test_survey_indices_are_first_draws_and_first_inverting():
    cfg = CONFIG.model_validate(params_section("multi_model_curation")["cpu"]).survey
    inverting = np.zeros(40, dtype=bool)
    inverting[[2, 11, 30]] = True
    assert evaluate.survey_indices(inverting, cfg) == [0, 1, 2, 3, 11]


def test_mixture_claim_chords():
    rows = [{"components": g, "beta1": b, "A1": a1, "A2": a2, "isolated_A": iso, "loglik_gain_1": gain,
             "loglik_gain_2": 0.0}
            for g, b, a1, a2, iso, gain in [(3, 0.6, -9.4, -3.3, -3.3, 0.05), (3, 4.0, -9.2, -4.4, -3.1, 0.12),
                                            (1, 4.0, -9.7, -4.2, -2.9, 0.0), (1, 0.6, -9.35, -3.35, -3.3, 0.0)]]
    metrics = claim_metrics.mixture_claims(SeedResult(0).add(tables={"mixture_self_invert": rows}), 3)
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
