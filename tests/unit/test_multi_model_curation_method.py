"""Deterministic checks of the multi-model curation library (the acceptance checks (a) and (b) that
claims.yaml's sources name), each with a negative control that must fail the same check."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from tasks.common.params import params_section
from tasks.multi_model_curation import baselines, claim_metrics, evaluate, method
from tasks.multi_model_curation.config import CONFIG

SPECS = method.canonical_specs()
ANALYTIC = CONFIG.model_validate(params_section("multi_model_curation")["cpu"]).analytic


def convergence_metrics(analytic) -> dict[str, float]:
    """C1a-c as the flow derives them: the evaluation's fixed points, then the claim metrics."""
    metrics, _, rows = evaluate.analytic_fixed_points(analytic)
    return metrics | claim_metrics.convergence_claims(rows)


def isolated_metrics(analytic) -> tuple[dict[str, float], dict[str, list[float]], list[dict]]:
    """C2a-b as the flow derives them: the evaluation's isolated beta grid, then the claim metrics."""
    curves, rows = evaluate.isolated_beta_grid(analytic)
    return claim_metrics.isolated_claims(rows), curves, rows


def influence_heatmap(analytic) -> tuple[dict[str, float], list[dict]]:
    """C5a-c as the flow derives them: the evaluation's heat map, then the claim metrics."""
    rows = evaluate.influence_heatmap(analytic)
    return claim_metrics.influence_claims(rows, analytic), rows


# The canonical configs' analytic reference values (2,000 rounds; README, "What is measured").
REFERENCE = {
    ("isolated", 5.0): [-0.568],
    ("dampen", 5.0): [-0.948, -0.627],
    ("cross_invert", 0.0): [None, -0.526],
    ("cross_invert", 5.0): [None, -1.375],
    ("self_invert", 0.6): [-9.444, None],
    ("self_invert", 4.0): [-9.850, None],
    ("self_invert_isolated", 0.6): [-3.312],
    ("self_invert_isolated", 4.0): [-2.953],
}
REFERENCE_RADIUS = {"isolated": 0.196, "dampen": 0.404, "cross_invert": 0.357, "self_invert": 0.340}
# The isolated counterpart of self-invert (W = [[.53]], lambda = .47, beta = 4, mu = -3.36): closed-form
# Jacobian radius at its fixed point (test_convergent_radii_reference_values).
SELF_INVERT_ISOLATED_RADIUS = 0.0953


# ------------------------------------------------------------------------------------------------
# Independent closed form of the isolated 1-D map (README, "Method": K -> inf tilt), written out here so the
# reference claims are checked against algebra that does not call the library.
# ------------------------------------------------------------------------------------------------

def isolated_map(m, v, lam, beta, mu, mu0=0.0, s0=1.0):
    v_bar = 1.0 / (1.0 / v + beta)
    m_bar = v_bar * (m / v + beta * mu)
    m_new = lam * mu0 + (1 - lam) * m_bar
    return m_new, lam * (s0**2 + mu0**2) + (1 - lam) * (v_bar + m_bar**2) - m_new**2


def isolated_fixed_point(lam, beta, mu):
    """Root of (m, v) = map(m, v) by Newton-type root finding from (mu / 2, 0.5)."""
    root = optimize.fsolve(lambda z: np.array(isolated_map(z[0], z[1], lam, beta, mu)) - z, [mu / 2, 0.5],
                           xtol=1e-14)
    return float(root[0]), float(root[1])


def isolated_jacobian(m, v, lam, beta, mu):
    """The map's Jacobian in (m, v), differentiated by hand."""
    d = 1 + beta * v
    m_bar = (m + beta * mu * v) / d
    m_new = (1 - lam) * m_bar
    dmbar_dm, dmbar_dv, dvbar_dv = 1 / d, beta * (mu - m) / d**2, 1 / d**2
    dm_dm, dm_dv = (1 - lam) * dmbar_dm, (1 - lam) * dmbar_dv
    dv_dm = (1 - lam) * 2 * m_bar * dmbar_dm - 2 * m_new * dm_dm
    dv_dv = (1 - lam) * (dvbar_dv + 2 * m_bar * dmbar_dv) - 2 * m_new * dm_dv
    return np.array([[dm_dm, dm_dv], [dv_dm, dv_dv]])


def at_beta1(name: str, beta1: float) -> method.LoopSpec:
    beta = SPECS[name].beta.copy()
    beta[0] = beta1
    return SPECS[name].with_beta(beta)


def wrong_sign_tilt(theta, v, beta, targets):
    """Broken library tilt for the negative controls of (a)3: v_bar = 1 / (1/v - beta) (sign flipped)."""
    v_bar = 1.0 / (1.0 / v - beta)
    return v_bar[:, None] * (theta / v[:, None] - beta[:, None] * targets), v_bar


def refit_without_real_data(spec, theta_bar, v_bar):
    """Broken library refit for the negative control of (a)2: lambda p_data omitted, peers renormalised."""
    weights = spec.mixing / spec.mixing.sum(axis=1, keepdims=True)
    theta_new = weights @ theta_bar
    spread = np.sum((theta_bar[None, :, :] - theta_new[:, None, :]) ** 2, axis=2)
    return theta_new, np.sum(weights * (v_bar[None, :] + spread), axis=1)


# ------------------------------------------------------------------------------------------------
# (a)1 reference values, 2000 rounds
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("key", "expected"), list(REFERENCE.items()), ids=lambda x: str(x))
def test_reference_alignment_values(key, expected):
    name, beta1 = key
    fixed = method.fixed_point(at_beta1(name, beta1), max_rounds=2000)
    for got, want in zip(fixed.alignment, expected):
        if want is not None:
            assert abs(got - want) < 1e-3, (name, beta1, fixed.alignment)


@pytest.mark.parametrize(("name", "radius"), list(REFERENCE_RADIUS.items()))
def test_reference_spectral_radius(name, radius):
    assert abs(method.fixed_point(SPECS[name], max_rounds=2000).radius - radius) < 1e-3


def test_convergent_radii_reference_values(monkeypatch):
    """Claim C1a (reference): the Jacobian spectral radius at the five convergent canonical configs.
    The isolated configs' radii equal the radius of the hand-differentiated closed-form Jacobian at
    the closed-form fixed point; the coupled ones the reference values; the experiment's maximum is
    dampen's 0.404 < 1. Negative control: the library refit without the real-data term makes the
    isolated loop a pure self-consuming loop, whose radius goes to 1 (no contraction)."""
    for name, (lam, beta, mu), radius in (("isolated", (0.2, 5.0, 2.0), REFERENCE_RADIUS["isolated"]),
                                          ("self_invert_isolated", (0.47, 4.0, -3.36), SELF_INVERT_ISOLATED_RADIUS)):
        m, v = isolated_fixed_point(lam, beta, mu)
        exact = method.spectral_radius(isolated_jacobian(m, v, lam, beta, mu))
        assert exact == pytest.approx(radius, abs=1e-3)
        assert method.fixed_point(SPECS[name], max_rounds=2000).radius == pytest.approx(exact, abs=1e-7)
    metrics = convergence_metrics(ANALYTIC)
    for name, radius in REFERENCE_RADIUS.items():
        assert metrics[f"radius_{name}"] == pytest.approx(radius, abs=1e-3)
    assert metrics["c1_max_radius_convergent"] == pytest.approx(0.4043, abs=1e-4)
    assert metrics["c1_max_radius_convergent"] == metrics["radius_dampen"] < 1.0
    monkeypatch.setattr(method, "moment_refit", refit_without_real_data)
    with np.errstate(all="ignore"):
        broken = method.fixed_point(SPECS["isolated"], max_rounds=2000)
    assert broken.radius > 0.999 and broken.diverged


def test_inversion_signs_of_the_reference_configs():
    """Cross-inversion: beta_1 up lowers A_2; self-inversion: beta_1 up lowers A_1 while the
    isolated counterpart improves; dampen: the curated model ends below its isolated self."""
    cross = method.chord_effect(SPECS["cross_invert"], 0, 0.0, 5.0)
    self_inv = method.chord_effect(SPECS["self_invert"], 0, 0.6, 4.0)
    isolated = method.chord_effect(SPECS["self_invert_isolated"], 0, 0.6, 4.0)
    assert cross[1] < 0 < cross[0]
    assert self_inv[0] < 0 and self_inv[1] < 0
    assert isolated[0] > 0
    dampen = method.fixed_point(SPECS["dampen"]).alignment
    alone = method.fixed_point(baselines.isolated_counterpart(SPECS["dampen"], 0)).alignment
    assert dampen[0] < alone[0] and dampen[1] > dampen[0]
    np.testing.assert_allclose(alone, [-0.568], atol=1e-3)


def test_wrong_tilt_sign_breaks_the_reference_values(monkeypatch):
    """Negative control of (a)1/(a)3: the flipped tilt, injected into the library, misses the
    isolated reference value."""
    monkeypatch.setattr(method, "gaussian_tilt", wrong_sign_tilt)
    with np.errstate(all="ignore"):
        broken = method.fixed_point(SPECS["isolated"], max_rounds=2000).alignment
    assert not np.all(np.abs(broken - (-0.568)) < 1e-3)


# ------------------------------------------------------------------------------------------------
# (a)2 identity: no curation + isolated => the real-data distribution
# ------------------------------------------------------------------------------------------------

IDENTITY_CASES = [(0.0, 1.0, 2.0, 0.2), (0.7, 2.5, -1.0, 0.05)]


def identity_spec(real_mean, real_var, target, lam, mixing=None):
    mixing = np.array([[1 - lam]]) if mixing is None else mixing
    return method.LoopSpec("iso", mixing, np.array([lam]), np.array([0.0]), np.array([[target]]),
                           np.array([real_mean]), real_var)


def reaches_real_data(spec, real_mean, real_var, target) -> bool:
    """(a)2: from a start far from the data, 2000 rounds of the library recursion end at N(mu_0, s0^2)
    with A = -((mu_0 - mu)^2 + s0^2) / 2."""
    with np.errstate(all="ignore"):
        trajectory = method.iterate_analytic(spec, 2000, (np.array([[3.0]]), np.array([0.2])))
    expected = -((real_mean - target) ** 2 + real_var) / 2
    return bool(abs(trajectory.theta[-1, 0, 0] - real_mean) < 1e-9 and abs(trajectory.v[-1, 0] - real_var) < 1e-9
                and abs(trajectory.alignment[-1, 0] - expected) < 1e-9)


@pytest.mark.parametrize(("real_mean", "real_var", "target", "lam"), IDENTITY_CASES)
def test_no_curation_fixed_point_is_real_data(real_mean, real_var, target, lam):
    spec = identity_spec(real_mean, real_var, target, lam)
    assert reaches_real_data(spec, real_mean, real_var, target)
    expected = -((real_mean - target) ** 2 + real_var) / 2
    np.testing.assert_allclose(baselines.no_curation_alignment(spec), [expected], atol=1e-12)


@pytest.mark.parametrize(("real_mean", "real_var", "target", "lam"), IDENTITY_CASES)
def test_identity_fails_without_the_real_data_term(monkeypatch, real_mean, real_var, target, lam):
    """Negative control of (a)2: the library refit with lambda p_data omitted fails the identity."""
    spec = identity_spec(real_mean, real_var, target, lam)
    monkeypatch.setattr(method, "moment_refit", refit_without_real_data)
    assert not reaches_real_data(spec, real_mean, real_var, target)


@pytest.mark.parametrize(("real_mean", "real_var", "target", "lam"), IDENTITY_CASES)
def test_identity_fails_with_unnormalised_rows(monkeypatch, real_mean, real_var, target, lam):
    """Negative control of (a)2: W rows that do not sum to 1 - lambda are rejected by LoopSpec; with
    that validation switched off, the library recursion misses the real-data fixed point."""
    with pytest.raises(ValueError, match="rows of mixing must sum to 1 - real_share"):
        identity_spec(real_mean, real_var, target, lam, mixing=np.array([[1.0]]))
    monkeypatch.setattr(method.LoopSpec, "validate", lambda self: None)
    spec = identity_spec(real_mean, real_var, target, lam, mixing=np.array([[1.0]]))
    assert not reaches_real_data(spec, real_mean, real_var, target)


def test_loop_spec_rejects_bad_input():
    with pytest.raises(ValueError, match="non-negative"):
        method.LoopSpec("neg", np.array([[0.9, -0.1], [0.4, 0.4]]), np.array([0.2, 0.2]), np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="beta must be >= 0"):
        method.LoopSpec("beta", np.array([[0.8]]), np.array([0.2]), np.array([-1.0]), np.array([[0.0]]))
    with pytest.raises(ValueError, match="coupling must be in"):
        method.symmetric_coupling(0.2, 0.9)


# ------------------------------------------------------------------------------------------------
# (a)3 tilt
# ------------------------------------------------------------------------------------------------

def test_tilt_exact_values():
    theta_bar, v_bar = method.gaussian_tilt(np.array([[0.0]]), np.array([1.0]), np.array([5.0]), np.array([[2.0]]))
    assert v_bar[0] == pytest.approx(1 / 6, abs=1e-15)
    assert theta_bar[0, 0] == pytest.approx(5 / 3, abs=1e-15)


def isolated_a_star_increasing(analytic) -> bool:
    """Check (b)1 through the experiment: A* strictly increasing on the isolated beta grid."""
    with np.errstate(all="ignore"):
        metrics, _, rows = isolated_metrics(analytic)
    values = [r["analytic_A"] for r in rows]
    return bool(metrics["c2_isolated_min_increment_analytic"] > 0 and all(np.diff(values) > 0))


def test_isolated_a_star_increases_in_beta():
    assert isolated_a_star_increasing(ANALYTIC)


def test_isolated_fixed_points_solve_the_closed_form():
    """Claim C2a (reference): A*(beta) of the isolated loop (lambda = 0.2, mu_H = 2) on the cpu beta grid
    equals A = -((m - mu)^2 + v)/2 at the root of the closed-form fixed-point equations (solved here
    without the library); the smallest increment is 0.0318 (beta 5 -> 10). The negative control (the
    wrong tilt sign breaks the increase) is test_wrong_tilt_sign_breaks_the_isolated_monotonicity_check."""
    metrics, _, rows = isolated_metrics(ANALYTIC)
    exact = []
    for row in rows:
        m, v = isolated_fixed_point(0.2, row["beta"], 2.0)
        exact.append(-((m - 2.0) ** 2 + v) / 2)
        assert row["analytic_A"] == pytest.approx(exact[-1], abs=1e-9), row
    assert exact[0] == pytest.approx(-2.5, abs=1e-12)  # beta = 0: the real data N(0, 1)
    assert dict(zip(ANALYTIC.isolated_betas, exact))[5.0] == pytest.approx(-0.568, abs=1e-3)  # the reference value
    assert metrics["c2_isolated_min_increment_analytic"] == pytest.approx(min(np.diff(exact)), abs=1e-9)
    assert metrics["c2_isolated_min_increment_analytic"] == pytest.approx(0.031768, abs=1e-6)


def test_isolated_alignment_rises_monotonically_from_round_zero(monkeypatch):
    """Claim C2b (reference): from the real-data start (round 0), A(t) of the isolated loop never falls,
    for every curating beta of the cpu grid; the first step is the closed-form one (it is the smallest
    at beta = 0.5: +1.0222), so the check covers the transient, not only the converged tail. Negative
    control: the wrong tilt sign in the library drives A(t) down (or to NaN) and fails the check."""
    metrics, curves, _ = isolated_metrics(ANALYTIC)
    assert metrics["c2_isolated_min_step_from_round0"] >= -1e-12
    first = []
    for beta in (b for b in ANALYTIC.isolated_betas if b > 0):
        m1, v1 = isolated_map(0.0, 1.0, 0.2, beta, 2.0)
        first.append(-((m1 - 2.0) ** 2 + v1) / 2 - (-2.5))
    assert metrics["c2_isolated_min_first_step"] == pytest.approx(min(first), abs=1e-12)
    assert min(first) == pytest.approx(1.022222, abs=1e-6)
    assert curves["analytic_isolated_A"][0] == -2.5
    monkeypatch.setattr(method, "gaussian_tilt", wrong_sign_tilt)
    with np.errstate(all="ignore"):
        broken, _, _ = isolated_metrics(ANALYTIC)
    assert not broken["c2_isolated_min_step_from_round0"] >= -1e-12


def test_wrong_tilt_sign_breaks_the_isolated_monotonicity_check(monkeypatch):
    """Negative control of (a)3: the wrong tilt sign in the library makes
    A*(beta) non-increasing on the isolated beta grid (check (b)1 fails)."""
    monkeypatch.setattr(method, "gaussian_tilt", wrong_sign_tilt)
    assert not isolated_a_star_increasing(ANALYTIC)


def test_tilt_matches_numerical_integration():
    """p(y) e^{beta r(y)} normalised on a fine grid has the closed-form mean and variance."""
    y = np.linspace(-12, 12, 200_001)
    m, v, beta, mu = 0.4, 2.0, 1.5, -1.0
    weight = np.exp(-((y - m) ** 2) / (2 * v) - beta * (y - mu) ** 2 / 2)
    weight /= weight.sum()
    mean = float((weight * y).sum())
    var = float((weight * (y - mean) ** 2).sum())
    theta_bar, v_bar = method.gaussian_tilt(np.array([[m]]), np.array([v]), np.array([beta]), np.array([[mu]]))
    assert mean == pytest.approx(theta_bar[0, 0], abs=1e-8)
    assert var == pytest.approx(v_bar[0], abs=1e-8)


def test_moment_refit_matches_explicit_1d_formula():
    spec = SPECS["self_invert"]
    rng = np.random.default_rng(0)
    theta_bar, v_bar = rng.normal(size=(2, 1)), rng.uniform(0.5, 2.0, size=2)
    theta, v = method.moment_refit(spec, theta_bar, v_bar)
    m_bar, lam, w = theta_bar[:, 0], spec.real_share, spec.mixing
    m_expected = lam * 0.0 + w @ m_bar
    v_expected = lam * (1.0 + 0.0) + w @ (v_bar + m_bar**2) - m_expected**2
    np.testing.assert_allclose(theta[:, 0], m_expected, atol=1e-14)
    np.testing.assert_allclose(v, v_expected, atol=1e-14)


def test_conditional_recursion_reduces_to_1d_along_the_target_direction():
    spec = SPECS["self_invert"]
    one_d = method.fixed_point(spec).alignment
    conditional = spec.with_dim(4)
    fixed = method.fixed_point(conditional)
    np.testing.assert_allclose(fixed.alignment, one_d, atol=1e-10)
    np.testing.assert_allclose(fixed.theta[:, 1:], 0.0, atol=1e-12)


# ------------------------------------------------------------------------------------------------
# (a)4 convergence and the divergent config
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["isolated", "dampen", "cross_invert", "self_invert", "self_invert_isolated"])
def test_convergent_configs_have_radius_below_one_and_are_not_flagged(name):
    """Claim C1c (reference): no convergent canonical config is flagged (the metric counts these five)."""
    fixed = method.fixed_point(SPECS[name], max_rounds=2000)
    assert fixed.radius < 1.0
    assert not fixed.diverged


def test_divergent_config_is_flagged_and_collapses():
    fixed = method.fixed_point(SPECS["divergent"], max_rounds=200)
    assert fixed.diverged
    assert fixed.variance_trend < 0 and np.all(fixed.v < 1e-2)
    # v_t = 1 / (1/v_0 + beta t): the collapse of the divergent config (v ~ 1e-3 after 200 rounds)
    np.testing.assert_allclose(fixed.v, 1 / (1 + 5 * 200), rtol=1e-9)
    assert fixed.radius > 0.99


def test_divergence_flag_criteria():
    assert method.divergence_flag(0.9995, np.array([1.0]), np.array([1.0]))
    assert method.divergence_flag(0.5, np.array([5e-3]), np.array([6e-3]))
    assert method.divergence_flag(0.5, np.array([2e6]), np.array([1e6]))
    assert not method.divergence_flag(0.5, np.array([5e-3]), np.array([5e-3]))  # small but stable
    assert not method.divergence_flag(0.998, np.array([1.0]), np.array([1.1]))


def test_collapse_margin_is_the_collapse_criterion_of_the_flag():
    """C1d's margin is below 1 exactly when the flag's collapse criterion holds (radius 0, no blow-up), on
    random variances around the 1e-2 threshold; a stable or a rising small variance has margin >= 1."""
    rng = np.random.default_rng(0)
    for _ in range(2000):
        v_last, v_before = 10 ** rng.uniform(-3.5, -1, size=2), 10 ** rng.uniform(-3.5, -1, size=2)
        assert (method.collapse_margin(v_last, v_before) < 1) == method.divergence_flag(0.0, v_last, v_before)
    assert method.collapse_margin(np.array([5e-3]), np.array([6e-3])) == pytest.approx(5 / 6)
    assert method.collapse_margin(np.array([5e-3]), np.array([5e-3])) == 1.0  # small but stable
    assert method.collapse_margin(np.array([2e-2]), np.array([3e-2])) == pytest.approx(2.0)  # falling, not small


def test_jacobian_matches_the_analytic_derivative_of_the_isolated_map():
    """1-D isolated map, state (m, v): dm'/dm = (1 - lambda) v_bar / v (Jacobian column of m)."""
    spec = SPECS["isolated"]
    theta, v = np.array([[0.7]]), np.array([1.3])
    jac = method.jacobian_fd(spec, theta, v)
    v_bar = 1 / (1 / v[0] + 5.0)
    assert jac[0, 0] == pytest.approx(0.8 * v_bar / v[0], rel=1e-7)
    # dm'/dv = (1 - lambda) beta (mu - m) / (1 + beta v)^2
    assert jac[0, 1] == pytest.approx(0.8 * 5.0 * (2.0 - 0.7) / (1 + 5.0 * v[0]) ** 2, rel=1e-6)


# ------------------------------------------------------------------------------------------------
# (a)5 finite-K Bradley-Terry curation
# ------------------------------------------------------------------------------------------------

def test_finite_k_curation_approaches_the_tilt():
    rng = np.random.default_rng(0)
    moments = {k: method.curated_moments(0.0, 1.0, 5.0, 2.0, k, 200_000, rng) for k in (4, 16, 64, 256)}
    expected = {4: 0.99, 16: 1.51, 64: 1.64, 256: 1.66}
    for k, (mean, _) in moments.items():
        assert abs(mean - expected[k]) < 0.02, (k, mean)
    mean64, var64 = moments[64]
    assert abs(mean64 - 5 / 3) < 0.05 and abs(var64 - 1 / 6) < 0.02
    gaps = [abs(moments[k][0] - 5 / 3) for k in (4, 16, 64, 256)]
    assert all(a > b for a, b in zip(gaps, gaps[1:]))


def test_wrong_curation_does_not_approach_the_tilt():
    """Negative control of (a)5: anti-curation softmax(-beta r) moves away from the tilt, and the gap
    grows rather than shrinks with K."""
    rng = np.random.default_rng(1)
    gaps = []
    for k in (4, 16, 64):
        candidates = rng.standard_normal((100_000, k))
        picked = method.bradley_terry_pick(-0.5 * (candidates - 2.0) ** 2, -5.0, rng)
        gaps.append(abs(candidates[np.arange(100_000), picked].mean() - 5 / 3))
    assert gaps[-1] > 0.05
    assert not all(a > b for a, b in zip(gaps, gaps[1:]))


def test_bradley_terry_pick_frequencies():
    rng = np.random.default_rng(2)
    rewards = np.tile(np.array([0.0, 1.0, 2.0]), (300_000, 1))
    counts = np.bincount(method.bradley_terry_pick(rewards, 0.7, rng), minlength=3) / rewards.shape[0]
    expected = np.exp(0.7 * np.arange(3)) / np.exp(0.7 * np.arange(3)).sum()
    np.testing.assert_allclose(counts, expected, atol=3e-3)


# ------------------------------------------------------------------------------------------------
# Influence matrix and the sample-based loop
# ------------------------------------------------------------------------------------------------

def test_influence_matrix_matches_the_isolated_closed_form():
    """Isolated loop: A*(beta) from the fixed point of the 1-D map; I = dA*/dbeta by a fine difference."""
    spec = SPECS["isolated"]
    influence = method.influence_matrix(spec, step=1e-4)
    h = 1e-6
    a_plus = method.fixed_point(spec.with_beta(np.array([5.0 + h])), 4000, 1e-15).alignment[0]
    a_minus = method.fixed_point(spec.with_beta(np.array([5.0 - h])), 4000, 1e-15).alignment[0]
    assert influence[0, 0] == pytest.approx((a_plus - a_minus) / (2 * h), rel=1e-4)
    assert influence[0, 0] > 0


def test_cross_influence_vanishes_without_coupling_and_not_with_it():
    """Claim C5a (identity): I_21 = 0 when the models do not train on each other; negative control:
    with coupling 0.4 it is clearly negative."""
    targets = np.array([[1.0], [-1.0]])
    uncoupled = method.LoopSpec("u", method.symmetric_coupling(0.2, 0.0), np.full(2, 0.2), np.array([2.0, 1.0]),
                                targets)
    coupled = method.LoopSpec("c", method.symmetric_coupling(0.2, 0.4), np.full(2, 0.2), np.array([2.0, 1.0]),
                              targets)
    assert abs(method.influence_matrix(uncoupled)[1, 0]) < 1e-9
    assert method.influence_matrix(coupled)[1, 0] < -1e-3


def test_sampled_loop_tracks_the_analytic_prediction_and_is_deterministic():
    spec = SPECS["dampen"]
    real = method.unconditional_real_data(50_000, 0.0, 1.0, np.random.default_rng(0))
    run = method.iterate_sampled(spec, 15, 64, 5000, real, np.random.default_rng(3))
    again = method.iterate_sampled(spec, 15, 64, 5000, real, np.random.default_rng(3))
    np.testing.assert_array_equal(run.alignment, again.alignment)
    sampled = method.stationary_alignment(run, 7)
    predicted = method.fixed_point(spec).alignment
    np.testing.assert_allclose(sampled, predicted, rtol=0.06)
    # Negative control: without curation the loop stays at the real data, far from the prediction.
    flat = method.stationary_alignment(method.iterate_sampled(spec.with_beta(np.zeros(2)), 15, 64, 5000, real,
                                                              np.random.default_rng(3)), 7)
    assert np.all(np.abs(flat - predicted) > 0.3)


def test_training_mixture_shares():
    spec = SPECS["self_invert"]
    real = method.unconditional_real_data(10_000, 0.0, 1.0, np.random.default_rng(0))
    pools = [(np.ones((1000, 1)), np.full(1000, 10.0)), (np.ones((1000, 1)), np.full(1000, 20.0))]
    _, y = method.training_mixture(spec, 0, pools, real, 1000, np.random.default_rng(0))
    assert y.size == 1000
    assert np.sum(y == 10.0) == 50 and np.sum(y == 20.0) == 480


@pytest.fixture(scope="module")
def heatmaps():
    """The cpu influence heat map (opposite targets, as in the experiment) and the same map with a
    shared target for both models (the negative control of C5b-c)."""
    opposite = influence_heatmap(ANALYTIC)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "HEATMAP_TARGETS", np.array([[1.0], [1.0]]))
        shared = influence_heatmap(ANALYTIC)
    return opposite, shared


def test_heatmap_cross_influence_is_negative_when_coupled(heatmaps):
    """Claim C5b (reference): with opposite user preferences I_21 < 0 at every coupling > 0 of the cpu
    grid; its largest value is -0.00117 (W_12 = 0.1, beta_1 = 8), and the entry at W_12 = 0.4,
    beta_1 = 2 agrees with a finer central difference. Negative control: with a shared target the
    peer gains from model 1's curation (I_21 > 0)."""
    (metrics, rows), (shared_metrics, _) = heatmaps
    coupled = [r for r in rows if r["coupling"] > 0]
    assert len(coupled) == (len(ANALYTIC.coupling_grid) - 1) * len(ANALYTIC.heatmap_betas)
    assert all(r["I21"] < 0 for r in coupled)
    top = max(coupled, key=lambda r: r["I21"])
    assert (top["coupling"], top["beta1"]) == (0.1, 8.0)
    assert metrics["c5_cross_influence_coupled_max"] == pytest.approx(-0.0011690, abs=1e-6)
    entry = next(r for r in rows if r["coupling"] == 0.4 and r["beta1"] == 2.0)
    spec = method.LoopSpec("h", method.symmetric_coupling(0.2, 0.4), np.full(2, 0.2), np.array([2.0, 1.0]),
                           evaluate.HEATMAP_TARGETS)
    assert entry["I21"] == pytest.approx(method.influence_matrix(spec, 1e-4, 2000, 1e-14)[1, 0], rel=1e-4)
    assert shared_metrics["c5_cross_influence_coupled_max"] > 0.1


def test_net_effect_sign_flips_with_coupling(heatmaps):
    """Claim C5c (reference): the net effect of curating model 1 on A_1 + A_2 (I_11 + I_21) is positive
    at the weakest coupling and negative at the strongest for some beta_1 (at beta_1 = 1: +0.1029 at
    W_12 = 0, -0.0560 at W_12 = 0.8). Negative control: with a shared target it never flips."""
    (metrics, rows), (shared_metrics, _) = heatmaps
    net = {(r["coupling"], r["beta1"]): r["net_beta1"] for r in rows}
    assert net[(0.0, 1.0)] == pytest.approx(0.10290, abs=1e-4)
    assert net[(0.8, 1.0)] == pytest.approx(-0.05597, abs=1e-4)
    flips = [b for b in ANALYTIC.heatmap_betas if net[(0.0, b)] > 0 > net[(0.8, b)]]
    assert flips == [1.0, 2.0, 3.0, 5.0, 8.0]
    assert metrics["c5_net_sign_flips"] == 1.0
    assert shared_metrics["c5_net_sign_flips"] == 0.0
