"""multi_model_curation method: exact values on non-degenerate inputs (two coupled models with unequal
targets, betas and shares), computed by a plain-Python recursion beside the library, each with a
negative control that monkeypatches a broken variant into `method` (issue 20: the influence estimate at
beta = 0, where the central difference must turn one-sided)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.multi_model_curation import method as m

MIXING = [[0.3, 0.4], [0.25, 0.45]]
SHARE = [0.3, 0.3]
TARGETS = [1.5, -0.5]
REAL_MEAN, REAL_VAR = 0.2, 0.8


def spec(beta: list[float]) -> m.LoopSpec:
    return m.LoopSpec("two", np.array(MIXING), np.array(SHARE), np.array(beta), np.array([[t] for t in TARGETS]),
                      np.array([REAL_MEAN]), REAL_VAR)


def step_by_hand(theta: list[float], v: list[float], beta: list[float]) -> tuple[list[float], list[float]]:
    v_bar = [1 / (1 / vi + b) for vi, b in zip(v, beta)]
    t_bar = [vb * (t / vi + b * a) for vb, t, vi, b, a in zip(v_bar, theta, v, beta, TARGETS)]
    new_t, new_v = [], []
    for i in range(2):
        mean = SHARE[i] * REAL_MEAN + sum(MIXING[i][j] * t_bar[j] for j in range(2))
        var = SHARE[i] * (REAL_VAR + (REAL_MEAN - mean) ** 2) + sum(
            MIXING[i][j] * (v_bar[j] + (t_bar[j] - mean) ** 2) for j in range(2))
        new_t.append(mean)
        new_v.append(var)
    return new_t, new_v


def alignment_by_hand(beta: list[float], rounds: int = 400) -> list[float]:
    theta, v = [REAL_MEAN, REAL_MEAN], [REAL_VAR, REAL_VAR]
    for _ in range(rounds):
        theta, v = step_by_hand(theta, v, beta)
    return [-((t - a) ** 2 + vi) / 2 for t, a, vi in zip(theta, TARGETS, v)]


def test_analytic_step_exact_on_two_coupled_models():
    theta, v = [0.4, -0.1], [0.9, 0.5]
    got_t, got_v = m.analytic_step(spec([2.0, 0.7]), np.array([[0.4], [-0.1]]), np.array(v))
    want_t, want_v = step_by_hand(theta, v, [2.0, 0.7])
    assert np.allclose(got_t[:, 0], want_t, atol=1e-14) and np.allclose(got_v, want_v, atol=1e-14)


def influence_at_zero_check() -> bool:
    """Column 1 (beta_1 = 0): one-sided (A(step) - A(0)) / step; column 0 (beta_0 = 1.2): central."""
    step = 1e-3
    got = m.influence_matrix(spec([1.2, 0.0]), step=step, max_rounds=400, tol=0.0)
    one_sided = (np.array(alignment_by_hand([1.2, step])) - np.array(alignment_by_hand([1.2, 0.0]))) / step
    central = (np.array(alignment_by_hand([1.2 + step, 0.0])) - np.array(alignment_by_hand([1.2 - step, 0.0]))) / (
        2 * step)
    return np.allclose(got[:, 1], one_sided, atol=1e-8) and np.allclose(got[:, 0], central, atol=1e-8)


def test_influence_at_beta_zero_is_the_one_sided_difference():
    one_sided = (np.array(alignment_by_hand([1.2, 1e-3])) - np.array(alignment_by_hand([1.2, 0.0]))) / 1e-3
    assert np.all(np.abs(one_sided) > 1e-3)  # non-degenerate: beta_1 moves both models' alignment
    assert influence_at_zero_check()


def test_negative_control_central_difference_through_zero_fails(monkeypatch):
    fixed_point = m.fixed_point

    def influence_without_projection(loop, step=1e-3, max_rounds=2000, tol=1e-13):
        n = loop.n_models
        influence = np.zeros((n, n))
        for j in range(n):
            low, high = loop.beta.copy(), loop.beta.copy()
            high[j] += step
            low[j] = max(0.0, low[j] - step)
            a_high = fixed_point(loop.with_beta(high), max_rounds, tol).alignment
            a_low = fixed_point(loop.with_beta(low), max_rounds, tol).alignment
            influence[:, j] = (a_high - a_low) / (2 * step)  # the central denominator even where clipped
        return influence

    monkeypatch.setattr(m, "influence_matrix", influence_without_projection)
    assert not influence_at_zero_check()


def test_negative_control_tilt_ignoring_beta_fails(monkeypatch):
    monkeypatch.setattr(m, "gaussian_tilt", lambda theta, v, beta, targets: (theta.copy(), v.copy()))
    assert not influence_at_zero_check()


def test_chord_effect_exact():
    got = m.chord_effect(spec([1.2, 0.0]), model=1, beta_low=0.5, beta_high=2.0, max_rounds=400, tol=0.0)
    want = (np.array(alignment_by_hand([1.2, 2.0])) - np.array(alignment_by_hand([1.2, 0.5]))) / 1.5
    assert np.allclose(got, want, atol=1e-10)


def test_fixed_point_and_iterate_exact():
    fp = m.fixed_point(spec([1.2, 0.3]), max_rounds=400)
    assert np.allclose(fp.alignment, alignment_by_hand([1.2, 0.3]), atol=1e-12)
    assert fp.rounds == 400 and not fp.diverged and fp.radius < 1
    trajectory = m.iterate_analytic(spec([1.2, 0.3]), rounds=3)
    theta, v = [REAL_MEAN, REAL_MEAN], [REAL_VAR, REAL_VAR]
    for t in range(1, 4):
        theta, v = step_by_hand(theta, v, [1.2, 0.3])
        assert np.allclose(trajectory.theta[t, :, 0], theta) and np.allclose(trajectory.v[t], v)
    assert trajectory.alignment.shape == (4, 2)
    early = m.fixed_point(spec([1.2, 0.3]), max_rounds=400, tol=1e-3)
    assert early.rounds < 400


def test_alignment_and_small_helpers_exact():
    got = m.alignment(np.array([[1.0, 2.0], [0.0, -1.0]]), np.array([0.5, 2.0]), np.array([[0.0, 1.0], [1.0, 1.0]]))
    assert np.allclose(got, [-(1 + 1 + 0.5) / 2, -(1 + 4 + 2.0) / 2])
    assert m.symmetric_coupling(0.2, 0.3).tolist() == [[0.5, 0.3], [0.3, 0.5]]
    with pytest.raises(ValueError):
        m.symmetric_coupling(0.2, 0.9)
    assert m.spectral_radius(np.array([[0.0, 2.0], [-0.5, 0.0]])) == pytest.approx(1.0)
    assert m.collapse_margin(np.array([0.005, 2.0]), np.array([0.01, 1.0])) == pytest.approx(0.5)
    assert m.divergence_flag(0.5, np.array([0.005]), np.array([0.01]))
    assert not m.divergence_flag(0.5, np.array([0.005]), np.array([0.001]))
    assert m.divergence_flag(0.9991, np.array([1.0]), np.array([1.0]))
    assert m.divergence_flag(0.5, np.array([2e6]), np.array([1.0]))


def test_least_squares_refit_and_training_mixture_counts():
    phi = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    y = np.array([1.0, 2.0, 2.5])
    theta, var = m.least_squares_refit(0, phi, y)
    # normal equations: [[2, 1], [1, 2]] theta = [3.5, 4.5] -> theta = (5/6, 11/6)
    assert np.allclose(theta, [5 / 6, 11 / 6])
    assert var == pytest.approx(np.mean((y - phi @ theta) ** 2))
    real = m.RealData(np.ones((50, 1)), np.arange(50.0))
    pools = [(np.ones((20, 1)), np.full(20, 100.0)), (np.ones((20, 1)), np.full(20, 200.0))]
    _, ys = m.training_mixture(spec([1.0, 1.0]), 0, pools, real, 20, np.random.default_rng(0))
    assert (ys < 50).sum() == 6 and (ys == 100.0).sum() == 6 and (ys == 200.0).sum() == 8


# Survivors of `make mutation SLUG=multi_model_curation`: the neural refit and the sampled loop ---------

def test_neural_gaussian_starts_at_the_real_data_state():
    model = m.NeuralGaussian(dim=2, hidden=4, real_var=0.7, seed=0)
    phi = np.array([[1.0, -0.5], [0.2, 0.3], [-1.0, 2.0]])
    assert model.mean(phi).tolist() == [0.0, 0.0, 0.0] and model.variance == pytest.approx(0.7)
    assert model.mean(phi[:1]).shape == (1,)
    target = np.array([0.5, -1.0])
    assert model.alignment(phi, target) == pytest.approx(-(np.mean((phi @ target) ** 2) + 0.7) / 2, rel=1e-6)


def test_neural_gaussian_fit_nll_and_first_adam_step_exact():
    model = m.NeuralGaussian(dim=2, hidden=4, real_var=0.7, seed=0)
    phi = np.array([[1.0, -0.5], [0.2, 0.3], [-1.0, 2.0]])
    y = np.array([0.3, -1.2, 2.0])
    nll = model.fit(phi, y, steps=1, lr=0.1)
    second_moment = float(np.mean(y**2))
    assert nll == pytest.approx(0.5 * (math.log(0.7) + second_moment / 0.7), rel=1e-6)  # f = 0 before the step
    # d nll / d log_var = 0.5 (1 - m2 / v) < 0 here; Adam's first step moves log_var by +lr exactly
    assert second_moment / 0.7 > 1  # the gradient 0.5 (1 - m2 / v) is negative
    assert math.log(model.variance) == pytest.approx(math.log(0.7) + 0.1, abs=1e-6)


def test_iterate_neural_first_alignment_and_progress():
    loop = m.LoopSpec("n", np.array([[0.5]]), np.array([0.5]), np.array([1.0]), np.array([[1.0, -0.5]]),
                      np.array([0.0, 0.0]), 0.8)
    real = m.conditional_real_data(64, np.zeros(2), 0.8, np.random.default_rng(1))
    seen: list[int] = []
    history, models = m.iterate_neural(loop, rounds=2, n_candidates=2, n_samples=16, real=real,
                                       rng=np.random.default_rng(2), hidden=4, steps=2, lr=0.01, seed=0,
                                       eval_size=32, progress=seen.append)
    phi_eval = np.random.default_rng(2).standard_normal((32, 2))  # the first draw of the loop's rng
    assert history.shape == (3, 1) and len(models) == 1 and seen == [1, 2]
    assert history[0, 0] == pytest.approx(-(np.mean((phi_eval @ np.array([1.0, -0.5])) ** 2) + 0.8) / 2, rel=1e-6)
    with pytest.raises(ValueError):
        m.iterate_neural(spec([1.0, 1.0]), 1, 2, 4, real, np.random.default_rng(0), 4, 1, 0.01, 0)


def test_draw_features_and_empty_pools():
    assert np.array_equal(m.draw_features(3, 5, np.random.default_rng(4)),
                          np.random.default_rng(4).standard_normal((5, 3)))
    assert m.draw_features(1, 3, np.random.default_rng(4)).tolist() == [[1.0], [1.0], [1.0]]
    loop = m.LoopSpec("one-way", np.array([[0.5, 0.0], [0.5, 0.0]]), np.array([0.5, 0.5]), np.array([1.0, 1.0]),
                      np.array([[1.0], [2.0]]))
    pools = m.curated_pools(loop, np.zeros((2, 1)), np.ones(2), 2, 8, np.random.default_rng(0))
    assert pools[0][0].shape == (8, 1) and pools[0][1].shape == (8,)
    assert pools[1][0].shape == (0, 1) and pools[1][1].shape == (0,)  # nobody trains on model 1


def test_row_sum_tolerance_and_canonical_names():
    m.LoopSpec("ok", np.array([[0.8 + 5e-10]]), np.array([0.2]), np.array([1.0]), np.array([[1.0]]))
    with pytest.raises(ValueError):
        m.LoopSpec("bad", np.array([[0.8 + 5e-9]]), np.array([0.2]), np.array([1.0]), np.array([[1.0]]))
    assert all(name == loop.name for name, loop in m.canonical_specs().items())


def test_curated_moments_chunks_the_draws():
    got = m.curated_moments(0.3, 1.2, 2.0, 1.0, n_candidates=2, draws=50_003, rng=np.random.default_rng(5))
    rng = np.random.default_rng(5)
    kept = np.concatenate([m.curate_gaussian(np.full(n, 0.3), 1.2, 2.0, np.full(n, 1.0), 2, rng)
                           for n in (50_000, 3)])
    assert got == (pytest.approx(float(kept.mean()), abs=1e-15), pytest.approx(float(kept.var()), abs=1e-15))


# Fourth pass (2026-12-02): the mixture loop (C8) written out with a copy of the generator, EM by hand, the real
# data draws, the chord survey's batch helpers -------------------------------------------------------------------

import copy  # noqa: E402
import dataclasses  # noqa: E402

MIX_SPEC = m.LoopSpec("three", np.array([[0.3, 0.2, 0.0], [0.25, 0.25, 0.0], [0.1, 0.4, 0.0]]),
                      np.array([0.5, 0.5, 0.5]), np.array([1.5, 0.0, 2.0]), np.array([[0.5], [-1.0], [2.0]]),
                      np.array([0.2]), 0.8)


def em_by_hand(y: np.ndarray, components: int, iterations: int, start=None, var_floor: float = 1e-4):
    if start is not None and start.weights.size == components:
        w, mu, var = start.weights.copy(), start.means.copy(), start.variances.copy()
    else:
        mu = np.quantile(y, (np.arange(components) + 0.5) / components)
        var, w = np.full(components, max(float(y.var()), var_floor)), np.full(components, 1.0 / components)
    for _ in range(iterations):
        dens = np.array([[wg * math.exp(-0.5 * (yn - mg) ** 2 / vg) / math.sqrt(2 * math.pi * vg)
                          for wg, mg, vg in zip(w, mu, var)] for yn in y])
        resp = dens / dens.sum(axis=1, keepdims=True)
        mass = resp.sum(axis=0)
        w = mass / y.size
        mu = (resp * y[:, None]).sum(axis=0) / mass
        var = np.maximum((resp * (y[:, None] - mu) ** 2).sum(axis=0) / mass, var_floor)
    return m.Mixture1D(w, mu, var)


def iterate_mixture_by_hand(spec, rounds, n_candidates, n_samples, real, rng, components, em_iterations):
    models = [m.Mixture1D(np.ones(1), spec.real_theta.copy(), np.array([spec.real_var]))] * spec.n_models
    targets = spec.targets[:, 0]
    history = [[mo.alignment(t) for mo, t in zip(models, targets)]]
    data = None
    for _ in range(rounds):
        pools = []
        for j in range(spec.n_models):
            if spec.mixing[:, j].sum() == 0:
                pools.append((np.zeros((0, 1)), np.zeros(0)))
            else:
                pools.append((np.ones((n_samples, 1)), m.curate_mixture(models[j], float(spec.beta[j]),
                                                                        float(targets[j]), n_candidates, n_samples,
                                                                        rng)))
        data = [m.training_mixture(spec, i, pools, real, n_samples, rng)[1] for i in range(spec.n_models)]
        models = [m.fit_mixture_em(y, components, em_iterations, start=mo) for y, mo in zip(data, models)]
        history.append([mo.alignment(t) for mo, t in zip(models, targets)])
    if not rounds:
        return np.array(history), np.zeros(spec.n_models), np.zeros(spec.n_models), 0
    gains = [m.mixture_log_likelihood(y, mo) - m.mixture_log_likelihood(y, em_by_hand(y, 1, 1))
             for y, mo in zip(data, models)]
    em_gains = [m.mixture_log_likelihood(y, m.fit_mixture_em(y, mo.weights.size, 1, start=mo))
                - m.mixture_log_likelihood(y, mo) for y, mo in zip(data, models)]
    return np.array(history), np.array(gains), np.array(em_gains), int(data[0].size)


def check_mixture_loop() -> None:
    real = m.unconditional_real_data(400, 0.2, 0.8, np.random.default_rng(3))
    for rounds in (0, 2):
        rng = np.random.default_rng(5)
        got = m.iterate_mixture(MIX_SPEC, rounds, 4, 200, real, copy.deepcopy(rng), 2, 3)
        want = iterate_mixture_by_hand(MIX_SPEC, rounds, 4, 200, real, rng, 2, 3)
        assert got.alignment.shape == (rounds + 1, 3) and np.allclose(got.alignment, want[0], rtol=0, atol=1e-12)
        assert np.allclose(got.loglik_gain, want[1], rtol=0, atol=1e-10)
        assert np.allclose(got.em_step_gain, want[2], rtol=0, atol=1e-10) and got.fit_size == want[3]
    assert want[3] == 200 and np.abs(want[1]).max() > 1e-3   # non-degenerate: the mixtures differ from one Gaussian
    # EM by hand from the quantile start and from a warm start, with a floor on the variance
    y = np.concatenate([np.random.default_rng(8).normal(-1.0, 0.3, 60), np.random.default_rng(9).normal(1.5, 0.5, 40)])
    for start in (None, m.Mixture1D(np.array([0.3, 0.7]), np.array([-0.5, 0.5]), np.array([1.0, 2.0]))):
        got, want = m.fit_mixture_em(y, 2, 4, start=start), em_by_hand(y, 2, 4, start)
        for a, b in ((got.weights, want.weights), (got.means, want.means), (got.variances, want.variances)):
            assert np.allclose(a, b, rtol=0, atol=1e-12)
    spike = np.array([0.0, 0.0, 0.0, 1.0])
    assert np.allclose(m.fit_mixture_em(spike, 2, 3, var_floor=0.01).variances,
                       em_by_hand(spike, 2, 3, var_floor=0.01).variances, rtol=0, atol=1e-12)
    # the real data: y = theta^T phi + sqrt(var) eps, with phi and eps drawn in that order
    rng = np.random.default_rng(2)
    data = m.conditional_real_data(5, np.array([0.5, -1.0]), 0.25, np.random.default_rng(2))
    phi = rng.standard_normal((5, 2))
    assert np.allclose(data.y, phi @ np.array([0.5, -1.0]) + 0.5 * rng.standard_normal(5), rtol=0, atol=1e-15)


def test_mixture_loop_em_and_real_data_written_out():
    check_mixture_loop()


@pytest.mark.parametrize("broken", ["cold_start", "one_component_gain_two_steps", "noise_subtracted"])
def test_negative_control_mixture_variants_are_caught(monkeypatch, broken):
    real_fit, real_iter, real_cond = m.fit_mixture_em, m.iterate_mixture, m.conditional_real_data
    if broken == "cold_start":
        monkeypatch.setattr(m, "fit_mixture_em", lambda y, c, it, start=None, var_floor=1e-4: real_fit(
            y, c, it, None, var_floor))
    elif broken == "one_component_gain_two_steps":
        monkeypatch.setattr(m, "iterate_mixture", lambda *a: (lambda t: m.MixtureTrajectory(
            t.alignment, t.loglik_gain + 1e-6, t.em_step_gain, t.fit_size))(real_iter(*a)))
    else:
        monkeypatch.setattr(m, "conditional_real_data", lambda size, theta, var, rng: (lambda d: m.RealData(
            d.phi, 2 * d.phi @ theta - d.y))(real_cond(size, theta, var, rng)))
    with pytest.raises(AssertionError):
        check_mixture_loop()


def check_small_helpers() -> None:
    assert m.bic_penalty_per_sample(2, 2) == pytest.approx(3 * math.log(2) / 4, abs=1e-15)   # n = 2 is allowed
    batch = m.draw_configs(m.ConfigPrior(), 3, np.random.default_rng(0))
    assert len(batch) == 3 and batch.spec(1, 0.5).name == "prior_1"
    lifted = spec([0.5, 1.0]).with_dim(3)
    assert lifted.real_theta.tolist() == [REAL_MEAN, 0.0, 0.0] and lifted.name == "two"
    # the v / collapse_var term decides (1.23 > 0.123): computed in float64 even for float32 variances
    v_last, v_before = np.array([0.0123, 0.3], dtype=np.float32), np.array([0.1, 0.2], dtype=np.float32)
    assert m.collapse_margin(v_last, v_before) == m.collapse_margin(v_last.astype(float), v_before.astype(float))
    s = spec([0.5, 1.0])
    assert np.array_equal(m.influence_matrix(s), m.influence_matrix(s, step=1e-3))
    # a model nobody trains on that is not the last one: the loop goes on to the others
    first_unused = m.LoopSpec("first", np.array([[0.0, 0.3, 0.2], [0.0, 0.25, 0.25], [0.0, 0.1, 0.4]]),
                              np.array([0.5, 0.5, 0.5]), np.array([1.5, 0.5, 2.0]), np.array([[0.5], [-1.0], [2.0]]),
                              np.array([0.2]), 0.8)
    real = m.unconditional_real_data(400, 0.2, 0.8, np.random.default_rng(3))
    rng = np.random.default_rng(6)
    got = m.iterate_mixture(first_unused, 2, 4, 200, real, copy.deepcopy(rng), 2, 3)
    want = iterate_mixture_by_hand(first_unused, 2, 4, 200, real, rng, 2, 3)
    assert np.allclose(got.alignment, want[0], rtol=0, atol=1e-12)


def test_small_helpers_and_a_first_unused_model():
    check_small_helpers()


@pytest.mark.parametrize("broken", ["bic_needs_three", "name_lost", "float32_margin"])
def test_negative_control_small_helper_variants_are_caught(monkeypatch, broken):
    if broken == "bic_needs_three":
        real = m.bic_penalty_per_sample
        monkeypatch.setattr(m, "bic_penalty_per_sample", lambda c, n: real(c, n) if n > 2 else 1 / 0)
    elif broken == "name_lost":
        real_spec = m.ConfigBatch.spec
        monkeypatch.setattr(m.ConfigBatch, "spec", lambda self, i, b: dataclasses.replace(real_spec(self, i, b),
                                                                                          name="prior"))
    else:
        monkeypatch.setattr(m, "collapse_margin", lambda a, b, collapse_var=1e-2: float(np.min(np.maximum(
            np.asarray(a) / collapse_var, np.asarray(a) / np.asarray(b)))))
    with pytest.raises((AssertionError, ZeroDivisionError)):
        check_small_helpers()


# LoopSpec's conversion and validation (issue 20, fifth-pass survivors): int and nested inputs, exact edges ---------

def loop_spec_failures() -> list[str]:
    failures = []
    spec = m.LoopSpec("s", [[0, 1], [0, 0]], [0, 1], [[1], [2]], [[1, 2], [3, 4]], [5], 2.5)
    want = {"mixing": [[0.0, 1.0], [0.0, 0.0]], "real_share": [0.0, 1.0], "beta": [1.0, 2.0],
            "targets": [[1.0, 2.0], [3.0, 4.0]], "real_theta": [5.0, 5.0]}  # the scalar theta_0 spread over d = 2
    for name, value in want.items():
        got = getattr(spec, name)
        if not (isinstance(got, np.ndarray) and got.dtype == np.float64 and got.tolist() == value):
            failures.append(name)
    row = m.LoopSpec("r", [[0.5]], [0.5], [1.0], [[1.0, 2.0]], [[1.0, 2.0]])  # a (1, d) theta row
    if row.real_theta.shape != (2,):
        failures.append("theta row")
    if spec.with_beta([3, 4]).name != "s" or spec.with_beta([3, 4]).beta.tolist() != [3.0, 4.0]:
        failures.append("with_beta")
    if spec.with_dim(3).real_var != 2.5 or spec.with_dim(3).real_theta.tolist() != [5.0, 0.0, 0.0]:
        failures.append("with_dim")
    ints = m.LoopSpec("i", [[0.5]], [0.5], [1.0], [[1.0, 2.0]], [1, 2])  # an int theta of d entries
    if not (ints.real_theta.dtype == np.float64 and ints.real_theta.tolist() == [1.0, 2.0]):
        failures.append("int theta")
    bad = {"square": (([[0.5, 0.0]], [0.5], [1.0], [[1.0]]), {}),
           "real_share must be in": (([[1.5, 0.0], [0.0, 0.5]], [-0.5, 0.5], [1.0, 1.0], [[1.0], [1.0]]), {}),
           "real_share must be in ": (([[0.0]], [1.5], [1.0], [[1.0]]), {}),
           "real_var": (([[0.5]], [0.5], [1.0], [[1.0]]), {"real_var": 0.0})}
    for message, (args, kwargs) in bad.items():
        try:
            m.LoopSpec("b", *args, **kwargs)
            failures.append(f"accepted {message.strip()}")
        except ValueError as error:
            if message.strip() not in str(error):
                failures.append(f"wrong error {message.strip()}")
    return failures


def test_loop_spec_converts_and_validates_exactly():
    assert loop_spec_failures() == []


def test_negative_control_loop_spec_without_theta_spreading_fails(monkeypatch):
    original = m.LoopSpec.__post_init__

    def no_spread(self):
        object.__setattr__(self, "real_theta", np.asarray(self.real_theta, dtype=float).reshape(-1)[:1].repeat(
            np.asarray(self.targets).reshape(np.atleast_2d(self.mixing).shape[0], -1).shape[1]) * 0)
        original(self)

    monkeypatch.setattr(m.LoopSpec, "__post_init__", no_spread)
    assert "real_theta" in loop_spec_failures()


def test_negative_control_loop_spec_accepting_real_var_zero_fails(monkeypatch):
    original = m.LoopSpec.validate

    def lenient(self):
        if self.real_var == 0:
            object.__setattr__(self, "real_var", 1.0)
        original(self)

    monkeypatch.setattr(m.LoopSpec, "validate", lenient)
    assert loop_spec_failures() == ["accepted real_var"]
