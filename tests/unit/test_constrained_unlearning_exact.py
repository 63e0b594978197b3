"""constrained_unlearning method: exact values on non-degenerate inputs, against closed forms or hand
computations, each with a negative control that monkeypatches a broken variant into `method` (issue 20:
the FU constraint value against a closed-form KL, the dual projection)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.constrained_unlearning import method as m


def gauss_log(x: np.ndarray, mu: float, sd: float) -> np.ndarray:
    return -0.5 * ((x - mu) / sd) ** 2 - math.log(sd * math.sqrt(2 * math.pi))


def gauss_kl(m1: float, s1: float, m2: float, s2: float) -> float:
    """KL(N(m1, s1^2) || N(m2, s2^2))."""
    return math.log(s2 / s1) + (s1**2 + (m1 - m2) ** 2) / (2 * s2**2) - 0.5


GRID = m.Grid.regular(-8.0, 8.0, 4001, 1)
X = GRID.points[:, 0]
Q_MU, Q_SD, QU_MU, QU_SD, P_MU, P_SD = 0.0, 1.5, 0.8, 0.5, -0.3, 0.9
PROBLEM = m.GridProblem(gauss_log(X, Q_MU, Q_SD), gauss_log(X, QU_MU, QU_SD), GRID.cell, GRID.ball([0.8], 1.0))
P = np.exp(gauss_log(X, P_MU, P_SD))


def constraint_failures() -> list[str]:
    want = {"fu": gauss_kl(QU_MU, QU_SD, P_MU, P_SD),  # KL(q_u || p): the forward direction
            "ru": gauss_kl(P_MU, P_SD, QU_MU, QU_SD),  # KL(p || q_u)
            "lu": math.exp(gauss_log(np.array(P_MU - QU_MU), 0.0, math.hypot(P_SD, QU_SD)))}  # E_p[q_u]
    return [f for f, value in want.items() if abs(m.constraint_value(f, P, PROBLEM) - value) > 1e-7]


def test_constraint_values_match_the_gaussian_closed_forms():
    assert gauss_kl(QU_MU, QU_SD, P_MU, P_SD) != pytest.approx(gauss_kl(P_MU, P_SD, QU_MU, QU_SD), abs=0.1)
    assert constraint_failures() == []


def test_negative_control_fu_with_the_reverse_kl_fails(monkeypatch):
    original = m.constraint_value
    monkeypatch.setattr(m, "constraint_value",
                        lambda f, p, problem: original("ru" if f == "fu" else f, p, problem))
    assert constraint_failures() == ["fu"]


def test_negative_control_kl_without_the_cell_measure_fails(monkeypatch):
    original = m.kl_density
    monkeypatch.setattr(m, "kl_density", lambda p, log_ref, cell: original(p, log_ref, 1.0))
    assert set(constraint_failures()) == {"fu", "ru"}


# The dual projection and the primal-dual loop, by hand ----------------------------------------------

def test_projected_dual_ascent_exact():
    assert m.projected_dual_ascent(0.3, -0.5, 0.4) == pytest.approx(0.1)
    assert m.projected_dual_ascent(0.1, -0.5, 0.4) == 0.0  # projected onto lambda >= 0
    assert m.projected_dual_ascent(0.3, 0.25, 2.0) == pytest.approx(0.8)
    assert m.violation("lu", 0.3, 0.1) == pytest.approx(0.2) and m.violation("fu", 0.3, 0.5) == pytest.approx(0.2)


TINY_Q = np.array([0.1, 0.4, 0.3, 0.2]) / 0.5  # densities on 4 cells of measure 0.5
TINY_QU = np.array([0.05, 0.15, 0.6, 0.2]) / 0.5
TINY = m.GridProblem(np.log(TINY_Q), np.log(TINY_QU), 0.5, np.array([False, False, True, False]))


def lu_loop_by_hand(bound: float, iterations: int, step: float, dual_lr: float, lam0: float):
    p, lam, lambdas, slacks = TINY_Q / (TINY_Q.sum() * 0.5), lam0, [], []
    for _ in range(iterations):
        log_p = np.log(p) - step * (np.log(p) - np.log(TINY_Q) + lam * TINY_QU)
        p = np.exp(log_p) / (np.exp(log_p).sum() * 0.5)
        g = float((p * TINY_QU).sum() * 0.5) - bound
        lam = max(0.0, lam + dual_lr * g)
        lambdas.append(lam)
        slacks.append(g)
    return p, lambdas, slacks


def primal_dual_check(dual_update=m.projected_dual_ascent) -> bool:
    # lam0 = 0.6 and a bound the start already satisfies: the dual variable falls and hits the projection at 0
    got = m.primal_dual_grid("lu", TINY, bound=0.8, iterations=6, step=0.5, dual_lr=0.8, lam0=0.6,
                             dual_update=dual_update)
    p, lambdas, slacks = lu_loop_by_hand(0.8, 6, 0.5, 0.8, 0.6)
    return (np.allclose(got.p, p, atol=1e-12) and np.allclose(got.lambdas, lambdas, atol=1e-12)
            and np.allclose(got.slacks, slacks, atol=1e-12) and got.lam == lambdas[-1])


def test_primal_dual_grid_lu_exact_with_the_projection_active():
    _, lambdas, _ = lu_loop_by_hand(0.8, 6, 0.5, 0.8, 0.6)
    assert lambdas[-1] == 0.0 and lambdas[0] > 0.0  # non-degenerate: the projection binds mid-run
    assert primal_dual_check()


def test_negative_control_unprojected_dual_step_fails():
    assert not primal_dual_check(lambda lam, g, lr: lam + lr * g)


def test_primal_dual_ru_is_capped_below_one():
    got = m.primal_dual_grid("ru", TINY, bound=50.0, iterations=3, step=0.5, dual_lr=10.0)
    assert got.lambdas == [0.99, 0.99, 0.99]
    with pytest.raises(ValueError):
        m.primal_dual_grid("lu", TINY, bound=0.1, iterations=0, step=0.5, dual_lr=1.0)


def test_primal_step_ru_and_fu_by_hand():
    p = np.array([0.3, 0.2, 0.25, 0.25]) / 0.5
    lam, step = 0.4, 0.3
    grad = (1 - lam) * np.log(p) - np.log(TINY_Q) + lam * np.log(TINY_QU)
    raw = np.exp(np.log(p) - step * grad)
    assert np.allclose(m.primal_step("ru", p, lam, TINY, step), raw / (raw.sum() * 0.5), atol=1e-12)
    best = np.clip(TINY_Q - lam * TINY_QU, 0, None)
    best = best / (best.sum() * 0.5)
    assert np.allclose(m.primal_step("fu", p, lam, TINY, step), 0.7 * p + 0.3 * best, atol=1e-12)
    with pytest.raises(ValueError):
        m.primal_step("xu", p, lam, TINY, step)


# Closed-form targets, by hand ------------------------------------------------------------------------

def test_targets_exact_on_a_tiny_grid():
    lam = 0.6
    ru = np.exp((np.log(TINY_Q) - lam * np.log(TINY_QU)) / (1 - lam))
    fu = np.clip(TINY_Q - lam * TINY_QU, 0, None)
    lu = TINY_Q * np.exp(-lam * TINY_QU)
    assert fu[2] == 0.0  # non-degenerate: FU empties the forget cell
    for name, raw in (("ru", ru), ("fu", fu), ("lu", lu)):
        assert np.allclose(m.target(name, TINY, lam), raw / (raw.sum() * 0.5), atol=1e-12)
    with pytest.raises(ValueError):
        m.target("xu", TINY, lam)
    with pytest.raises(ValueError):
        m.ru_log_target(np.log(TINY_Q), np.log(TINY_QU), 1.0)
    two = m.ru_log_target(np.log(TINY_Q), np.stack([np.log(TINY_QU), np.log(TINY_Q)]), [0.2, 0.1])
    assert np.allclose(two, (np.log(TINY_Q) - 0.2 * np.log(TINY_QU) - 0.1 * np.log(TINY_Q)) / 0.7)


def test_lambda_for_forget_mass_reaches_the_mass():
    for name in ("ru", "fu", "lu"):
        lam = m.lambda_for_forget_mass(name, TINY, 0.1)
        assert m.mass(m.target(name, TINY, lam), TINY.forget_mask, 0.5) == pytest.approx(0.1, abs=1e-9)
    with pytest.raises(ValueError):
        m.lambda_for_forget_mass("lu", TINY, 0.5)


def test_eta_lambda_and_ru_score_exact():
    assert m.eta_from_lambda(0.2) == pytest.approx(0.25) and m.lambda_from_eta(0.25) == pytest.approx(0.2)
    score = m.ru_score(np.array([1.0, -2.0]), np.array([0.5, 1.0]), 0.2)
    assert np.allclose(score, [1.0 - 0.25 * (0.5 - 1.0), -2.0 - 0.25 * (1.0 + 2.0)])
    with pytest.raises(ValueError):
        m.eta_from_lambda(1.0)
    with pytest.raises(ValueError):
        m.lambda_from_eta(-0.1)


def test_grid_measures_exact():
    grid = m.Grid.regular(0.0, 1.0, 3, 2)
    assert grid.cell == pytest.approx(0.25) and grid.points.shape == (9, 2) and grid.shape == (3, 3)
    assert grid.ball([0.5, 0.5], 0.6).sum() == 5  # centre + 4 edge midpoints (distance 0.5), corners at 0.707
    p = np.array([0.2, 0.6, 0.8, 0.4]) / 0.5 / 2.0
    r = np.array([0.5, 0.5, 0.5, 0.5])
    assert m.tv_distance(p, r, 0.5) == pytest.approx(0.5 * 0.5 * np.abs(p - r).sum())
    assert m.mass(p, np.array([True, False, True, False]), 0.5) == pytest.approx(0.5)
    assert m.expectation(p, np.array([1.0, 2.0, 3.0, 4.0]), 0.5) == pytest.approx(0.5 * (p * [1, 2, 3, 4]).sum())
    keep = np.array([True, True, False, True])
    pr, qr = p[keep] / (p[keep].sum() * 0.5), r[keep] / (r[keep].sum() * 0.5)
    assert m.retained_kl(p, r, ~keep, 0.5) == pytest.approx(float((pr * np.log(pr / qr)).sum() * 0.5))
    with pytest.raises(ValueError):
        m.normalise(np.zeros(3), 0.5)


def test_importance_weights_exact():
    log_q, log_qu = np.log(np.array([0.5, 0.3, 0.2])), np.log(np.array([0.1, 0.3, 0.6]))
    raw = np.clip(np.exp(log_q) - 0.5 * np.exp(log_qu), 0, None) / np.exp(log_q)
    assert np.allclose(m.importance_weights("fu", log_q, log_qu, 0.5), raw * 3 / raw.sum())
    raw = np.exp(-0.5 * np.exp(log_qu))
    assert np.allclose(m.importance_weights("lu", log_q, log_qu, 0.5), raw * 3 / raw.sum())
    with pytest.raises(ValueError):
        m.importance_weights("fu", log_q, log_qu, 100.0)


def test_sample_metrics_exact():
    samples = np.array([[0.0, 0.0], [0.5, 0.0], [2.0, 0.0], [0.0, 1.0]])
    assert m.ball_fraction(samples, np.array([0.0, 0.0]), 1.0) == 0.5
    log_q, log_qu = m.empirical_log_masses(np.array([False, True, True, False, False]))
    assert np.allclose(log_q, -math.log(5)) and log_qu[1] == pytest.approx(-math.log(2)) and log_qu[0] == -math.inf
    assert m.memorisation_ratio(0.2, 0.05, 1000) == pytest.approx(4.0)
    assert m.memorisation_ratio(0.2, 0.0, 1000) == pytest.approx(200.0)
    points = np.array([[0.0, 0.0], [2.0, 0.1]])
    with_nan = np.vstack([samples, [[np.nan, 0.0]]])
    assert m.near_fraction(with_nan, points, 0.6) == pytest.approx(3 / 5)


# Survivors of `make mutation SLUG=constrained_unlearning`: the Stage B loop and its constraint ---------

def _unlearn(values: list[float], formulation: str = "ru", lam_max: float | None = None):
    import torch

    from tasks.constrained_unlearning import diffusion

    model = diffusion.build_model(hidden=8, layers=1, time_dim=4, timesteps=4, seed=0)
    pool = torch.randn(32, 2, generator=torch.Generator().manual_seed(0))
    log_q = -0.5 * (pool**2).sum(1).numpy() - math.log(2 * math.pi)
    log_qu = -0.5 * ((pool - 1.0) ** 2).sum(1).numpy() - math.log(2 * math.pi)
    queue, progress = list(values), []
    result = m.primal_dual_unlearn(
        formulation, model, diffusion.NoiseSchedule.linear(4), pool, log_q.astype(np.float64),
        log_qu.astype(np.float64), bound=1.0, constraint_fn=lambda samples: queue.pop(0), dual_updates=len(values),
        steps_per_dual=2, batch_size=8, lr=1e-3, dual_lr=0.8, dual_samples=16,
        generator=torch.Generator().manual_seed(1), lam_max=lam_max, progress=progress.append)
    return result, progress


def test_primal_dual_unlearn_dual_trajectory_exact():
    result, progress = _unlearn([0.5, 2.0, 0.1])
    # g = b - KL: 0.5, -1.0, 0.9; lambda = [lambda + 0.8 g]_+ : 0.4, 0.0, 0.72
    assert result.slacks == pytest.approx([0.5, -1.0, 0.9])
    assert result.lambdas == pytest.approx([0.4, 0.0, 0.72]) and result.lam == pytest.approx(0.72)
    assert len(result.losses) == 6 and all(isinstance(x, float) and math.isfinite(x) for x in result.losses)
    assert progress == pytest.approx([1 / 3, 2 / 3, 1.0])


def test_primal_dual_unlearn_caps_lambda():
    assert _unlearn([-5.0])[0].lambdas == [0.99]  # RU's default cap
    assert _unlearn([-5.0], lam_max=0.3)[0].lambdas == [0.3]
    assert _unlearn([-5.0], formulation="lu")[0].lambdas == pytest.approx([0.0])  # LU: g = value - b < 0
    assert _unlearn([5.0], formulation="lu")[0].lambdas == pytest.approx([3.2])  # no cap for LU


def test_sample_constraint_value_uses_k():
    rng = np.random.default_rng(0)
    samples, qu_samples = rng.normal(size=(200, 2)), rng.normal(1.0, 1.0, size=(150, 2))
    log_qu_at = lambda x: -0.5 * ((x - 1.0) ** 2).sum(1) - math.log(2 * math.pi)  # noqa: E731
    want_ru = -m.knn_entropy(samples, 3) - float(np.mean(log_qu_at(samples)))
    assert m.sample_constraint_value("ru", samples, log_qu_at, qu_samples, k=3) == pytest.approx(want_ru, abs=1e-12)
    assert m.sample_constraint_value("fu", samples, log_qu_at, qu_samples, k=3) == pytest.approx(
        m.knn_kl(qu_samples, samples, 3), abs=1e-12)
    assert m.sample_constraint_value("lu", samples, log_qu_at, qu_samples) == pytest.approx(
        float(np.mean(np.exp(log_qu_at(samples)))), abs=1e-12)
    assert m.knn_entropy(samples, 3) != pytest.approx(m.knn_entropy(samples, 5), abs=1e-6)


# Mutation survivors of the fifth pass (issue 20), killed by exact values on non-degenerate inputs ----------------

QU_WITH_ZERO = np.array([0.0, 0.3, 1.2, 0.5])  # q_u = 0 on the first cell (integrates to 1 on cells of 0.5)


def lambda_for_bound_failures() -> list[str]:
    failures = []
    # a bound that holds at lambda = 0 exactly: "already holds" (not the root lambda = 0)
    try:
        m.lambda_for_bound("lu", TINY, 0.57)
        failures.append("equal at 0")
    except ValueError as error:
        if "already holds" not in str(error):
            failures.append("equal at 0")
    # a bound met with equality at the top of the search interval: that end is the root
    at_high = m.constraint_value("lu", m.target("lu", TINY, 1e4), TINY)
    try:
        if m.lambda_for_bound("lu", TINY, at_high) != 1e4:
            failures.append("equal at high")
    except ValueError:
        failures.append("equal at high")
    # violated by 0.1 (< 1) at the top: "no lambda ... meets the bound"
    try:
        m.lambda_for_bound("lu", TINY, at_high - 0.1)
        failures.append("violated at high")
    except ValueError as error:
        if "no lambda" not in str(error):
            failures.append("violated at high")
    # FU with q_u = 0 on a cell: the search bound min q / q_u is taken over the cells where q_u > 0
    zero = m.GridProblem(np.log(TINY_Q), np.log(QU_WITH_ZERO), 0.5, np.array([False, False, True, False]))
    try:
        lam = m.lambda_for_bound("fu", zero, 1.0)
        p = m.target("fu", zero, lam)
        if not (0.0 < lam < 0.5 and abs(m.constraint_value("fu", p, zero) - 1.0) < 1e-9):
            failures.append("fu with q_u = 0")
    except (ValueError, IndexError):
        failures.append("fu with q_u = 0")
    return failures


def test_lambda_for_bound_edges_exact():
    with np.errstate(divide="ignore"):
        assert lambda_for_bound_failures() == []


def test_negative_control_lambda_for_bound_strict_edges_fail(monkeypatch):
    from scipy.optimize import brentq

    def loose(formulation, problem, bound):
        def gap(lam):
            return m.violation(formulation, m.constraint_value(formulation, m.target(formulation, problem, lam),
                                                               problem), bound)
        high = m.LAMBDA_SEARCH_MAX[formulation]
        if formulation == "fu":
            high = float(np.min(problem.q[problem.qu >= 0] / problem.qu[problem.qu > 0]))
        if gap(0.0) < 0:
            raise ValueError("already holds")
        if gap(high) >= 0:
            raise ValueError("no lambda")
        return float(brentq(gap, 0.0, high))

    monkeypatch.setattr(m, "lambda_for_bound", loose)
    with np.errstate(divide="ignore", invalid="ignore"):
        assert lambda_for_bound_failures() == ["equal at 0", "equal at high", "fu with q_u = 0"]


def test_ball_fraction_off_origin_exact():
    samples = np.array([[2.0, -1.0], [2.5, -1.0], [3.5, -1.0], [-2.0, 1.0]])
    assert m.ball_fraction(samples, np.array([2.0, -1.0]), 1.0) == 0.5  # the first two (distances 0, 0.5)


def test_negative_control_ball_fraction_around_minus_centre_fails(monkeypatch):
    monkeypatch.setattr(m, "ball_fraction", lambda s, c, r: float(np.mean(np.linalg.norm(s + c, axis=1) < r)))
    samples = np.array([[2.0, -1.0], [2.5, -1.0], [3.5, -1.0], [-2.0, 1.0]])
    assert m.ball_fraction(samples, np.array([2.0, -1.0]), 1.0) != 0.5


def empirical_masses_ok() -> bool:
    log_q, log_qu = m.empirical_log_masses([1, 0, 0, 1])  # an int 0/1 mask: forget copies 0 and 3
    one_q, one_qu = m.empirical_log_masses([True])  # N = M = 1 is a valid training set
    return (np.allclose(log_q, -math.log(4), rtol=0, atol=1e-15)
            and np.array_equal(log_qu, [-math.log(2), -np.inf, -np.inf, -math.log(2)])
            and one_q.tolist() == [0.0] and one_qu.tolist() == [0.0])


def test_empirical_log_masses_int_mask_and_single_atom_exact():
    assert empirical_masses_ok()


def test_negative_control_empirical_log_masses_int_indexing_fails(monkeypatch):
    def int_indexing(is_forget):
        is_forget = np.asarray(is_forget)
        n, k = is_forget.size, int(is_forget.sum())
        log_qu = np.full(n, -math.inf)
        log_qu[is_forget] = -math.log(k)  # integer (fancy) indexing: cells 1 and 0
        return np.full(n, -math.log(n)), log_qu

    monkeypatch.setattr(m, "empirical_log_masses", int_indexing)
    assert not empirical_masses_ok()


HIST_SAMPLES = np.array([[-1.0, -1.0], [1.0, 1.0], [1.0, 1.0], [np.nan, 0.0], [11.0, 10.0]])
HIST_REFERENCE = np.array([[-1.0, -1.0], [1.0, -1.0]])


def histogram_kl_by_hand() -> float:
    """bins 2 on [-2, 2]^2 (cells (x<0,y<0), (x<0,y>0), (x>0,y<0), (x>0,y>0)) plus overflow; forget ball of radius
    1 at (10, 10): (11, 10) lies on its boundary, so it is retained and goes to the overflow bin with the NaN
    sample. p = (1, 0, 0, 2, 2) / 5; reference (1, 0, 1, 0, 0) + 0.5 = (1.5, .5, 1.5, .5, .5) / 4.5."""
    p = np.array([1, 0, 0, 2, 2]) / 5
    r = np.array([1.5, 0.5, 1.5, 0.5, 0.5]) / 4.5
    s = p > 0
    return float(np.sum(p[s] * np.log(p[s] / r[s])))


def test_histogram_retained_kl_exact():
    got = m.histogram_retained_kl(HIST_SAMPLES, HIST_REFERENCE, np.array([10, 10]), 1.0, bins=2, half_width=2.0)
    assert got == pytest.approx(histogram_kl_by_hand(), rel=1e-12)
    with pytest.raises(ValueError, match="forget region"):
        m.histogram_retained_kl(np.array([[10.0, 10.0], [10.5, 10.0]]), HIST_REFERENCE, np.array([10.0, 10.0]),
                                1.0, bins=2, half_width=2.0)


def test_negative_control_histogram_without_the_boundary_point_fails():
    # the boundary sample dropped (distance > radius): p = (1, 0, 0, 2, 1) / 4
    p, r = np.array([1, 0, 0, 2, 1]) / 4, np.array([1.5, 0.5, 1.5, 0.5, 0.5]) / 4.5
    s = p > 0
    assert float(np.sum(p[s] * np.log(p[s] / r[s]))) != pytest.approx(histogram_kl_by_hand(), rel=1e-3)


def test_importance_weights_no_overflow_exact():
    """LU: log w = -lambda q_u; q_u = 400, 401 (lambda 1): weights 2 (1, e^-1) / (1 + e^-1), finite only if the
    largest log weight is subtracted (exp(-800) underflows to 0 and 0/0 is NaN)."""
    want = 2 * np.array([1.0, math.exp(-1)]) / (1 + math.exp(-1))
    got = m.importance_weights("lu", np.zeros(2), np.log([400.0, 401.0]), 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(m.lu_likelihood_weights(np.array([400.0, 401.0]), 1.0), want, rtol=1e-12)
    # lambda = 0.5 is allowed (weights on q_u = 0, 2); float32 input computed in float64
    w32 = m.lu_likelihood_weights(np.array([0.0, 2.0], dtype=np.float32), 0.5)
    assert w32.dtype == np.float64
    np.testing.assert_allclose(w32, want, rtol=1e-15)
    np.testing.assert_array_equal(m.lu_likelihood_weights(np.array([0.3, 5.0]), 0.0), [1.0, 1.0])


def test_negative_control_weights_without_the_max_shift_are_nan():
    log_w = -np.array([400.0, 401.0])
    w = np.exp(log_w + log_w.max())
    with np.errstate(invalid="ignore", divide="ignore"):
        assert np.isnan(w * (2 / w.sum())).all()


def test_lu_reinforce_surrogate_at_lambda_zero_is_the_mean_kl():
    import torch

    got = m.lu_reinforce_surrogate(torch.tensor([1.0, 2.0]), torch.tensor([0.5, 1.5]), torch.tensor([1.0, 3.0]), 0.0)
    assert float(got) == 1.0


def test_gaussian_step_kl_float64_exact():
    import torch

    got = m.gaussian_step_kl(torch.tensor([[1.0, 2.0]], dtype=torch.float64),
                             torch.tensor([[0.5, 1.0]], dtype=torch.float64), 0.1)
    assert got.dtype == torch.float64 and float(got[0]) == pytest.approx(1.25 / 0.2, rel=1e-14)
    # the library must not round the variance to float32 (off by ~1e-8 relative): the tolerance above tells them apart
    variance_rounded_to_float32 = 1.25 / (2 * float(torch.tensor(0.1, dtype=torch.float32)))
    assert float(got[0]) != pytest.approx(variance_rounded_to_float32, rel=1e-12)


def brute_knn(points: np.ndarray, queries: np.ndarray, k: int, exclude_self: bool) -> np.ndarray:
    distance = np.sort(np.linalg.norm(queries[:, None, :] - points[None, :, :], axis=2), axis=1)
    return distance[:, k] if exclude_self else distance[:, k - 1]


def kl_entropy_by_hand(x: np.ndarray, k: int) -> float:
    from scipy.special import digamma

    n, d = x.shape
    log_ball = (d / 2) * math.log(math.pi) - math.lgamma(d / 2 + 1)
    return float(digamma(n) - digamma(k) + log_ball + d * np.mean(np.log(brute_knn(x, x, k, True))))


def knn_kl_by_hand(p: np.ndarray, q: np.ndarray, k: int) -> float:
    n, d = p.shape
    rho, nu = brute_knn(p, p, k, True), brute_knn(q, p, k, False)
    return float(d * np.mean(np.log(nu / rho)) + math.log(q.shape[0] / (n - 1)))


RNG = np.random.default_rng(5)
X3 = RNG.normal(size=(12, 3))
P2, Q2 = RNG.normal(size=(15, 2)), RNG.normal(1.0, 1.5, size=(9, 2))


def knn_failures() -> list[str]:
    failures = []
    if abs(m.knn_entropy(X3) - kl_entropy_by_hand(X3, 5)) > 1e-10:  # default k = 5, d = 3 (lgamma(2.5) != 0)
        failures.append("entropy")
    try:
        m.knn_entropy(X3[:5])
        failures.append("entropy n = k")
    except ValueError:
        pass
    if abs(m.knn_kl(P2, Q2) - knn_kl_by_hand(P2, Q2, 5)) > 1e-10:  # default k = 5, m = 9 != n - 1 = 14
        failures.append("kl")
    if abs(m.knn_kl(P2, Q2, k=1) - knn_kl_by_hand(P2, Q2, 1)) > 1e-10:  # k = 1: the 1-D query result
        failures.append("kl k=1")
    if abs(m.sample_constraint_value("fu", Q2, lambda x: x[:, 0], P2) - knn_kl_by_hand(P2, Q2, 5)) > 1e-10:
        failures.append("constraint default k")
    return failures


def test_knn_estimators_exact():
    assert knn_failures() == []


def test_negative_control_knn_kl_with_n_plus_one_fails(monkeypatch):
    original = m.knn_kl
    monkeypatch.setattr(m, "knn_kl", lambda p, q, k=5: original(p, q, k) + math.log(14 / 16))
    assert knn_failures() == ["kl", "kl k=1", "constraint default k"]


def test_negative_control_knn_entropy_with_plus_lgamma_fails(monkeypatch):
    original = m.knn_entropy
    monkeypatch.setattr(m, "knn_entropy", lambda x, k=5: original(x, k) + 2 * math.lgamma(2.5))
    assert knn_failures() == ["entropy"]


def test_near_fraction_rejects_no_samples():
    with pytest.raises(ValueError, match="no samples"):
        m.near_fraction(np.zeros((0, 2)), np.zeros((3, 2)), 1.0)


def test_log_target_fu_zero_region_is_minus_inf_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = m.log_target_unnormalised("fu", np.log([0.5, 0.5]), np.log([0.1, 0.9]), 1.0)
    assert got[1] == -np.inf and got[0] == pytest.approx(math.log(0.4), rel=1e-14)


def test_negative_control_log_of_zero_warns():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            np.log(np.array([0.0]))


def test_negative_control_surrogate_rejecting_lambda_zero_is_caught(monkeypatch):
    def strict(log_probs, step_kls, likelihoods, lam):
        if lam <= 0:
            raise ValueError("lambda")
        return (lam * (likelihoods - likelihoods.mean()) * log_probs + step_kls).mean()

    monkeypatch.setattr(m, "lu_reinforce_surrogate", strict)
    with pytest.raises(ValueError):
        test_lu_reinforce_surrogate_at_lambda_zero_is_the_mean_kl()


def test_negative_control_near_fraction_checking_the_width_is_caught(monkeypatch):
    monkeypatch.setattr(m, "near_fraction", lambda samples, points, radius: float("nan"))
    with pytest.raises(pytest.fail.Exception):
        test_near_fraction_rejects_no_samples()


# The Stage B primal losses and loop, replayed by hand on the same generator draws -----------------------------

def tiny_ddpm():
    import torch

    from tasks.constrained_unlearning import diffusion

    model = diffusion.build_model(hidden=8, layers=1, time_dim=4, timesteps=4, seed=0)
    pool = torch.randn(32, 2, generator=torch.Generator().manual_seed(0)) * torch.tensor([1.0, 3.0]) + 0.5
    return model, diffusion.NoiseSchedule.linear(4), pool


def weighted_loss_matches() -> bool:
    import torch

    from tasks.constrained_unlearning import diffusion

    model, schedule, pool = tiny_ddpm()
    weights = torch.linspace(0.1, 3.2, 32)
    got = m.importance_weighted_loss(model, schedule, pool, weights, 8)(torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    index = torch.randint(0, 32, (8,), generator=g)
    want = diffusion.dsm_loss(model, pool[index], schedule, g, weights[index])
    return bool(torch.equal(got, want))


def test_importance_weighted_loss_replayed_exactly():
    assert weighted_loss_matches()


def test_negative_control_unweighted_loss_is_caught(monkeypatch):
    from tasks.constrained_unlearning import diffusion

    def unweighted(model, schedule, pool, weights, batch_size):
        import torch

        def loss(generator):
            index = torch.randint(0, pool.shape[0], (batch_size,), generator=generator)
            return diffusion.dsm_loss(model, pool[index], schedule, generator)
        return loss

    monkeypatch.setattr(m, "importance_weighted_loss", unweighted)
    assert not weighted_loss_matches()


def ru_loss_matches() -> bool:
    import torch

    from tasks.constrained_unlearning import diffusion

    model, schedule, pool = tiny_ddpm()
    frozen_q = diffusion.build_model(hidden=8, layers=1, time_dim=4, timesteps=4, seed=1)
    frozen_u = diffusion.build_model(hidden=8, layers=1, time_dim=4, timesteps=4, seed=2)
    got = m.ru_composition_loss(model, frozen_q, frozen_u, schedule, pool, 0.4, 8)(torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    x_t, t, _ = diffusion.noise_batch(pool[torch.randint(0, 32, (8,), generator=g)], schedule, g)
    with torch.no_grad():
        target = m.ru_composed_epsilon(frozen_q(x_t, t), frozen_u(x_t, t), 0.4)
    return bool(torch.equal(got, ((model(x_t, t) - target) ** 2).sum(dim=1).mean()))


def test_ru_composition_loss_replayed_exactly():
    assert ru_loss_matches()


def test_negative_control_ru_loss_drawing_from_two_rows_is_caught(monkeypatch):
    original = m.ru_composition_loss
    monkeypatch.setattr(m, "ru_composition_loss",
                        lambda model, fq, fu, sched, pool, lam, b: original(model, fq, fu, sched, pool[:2], lam, b))
    assert not ru_loss_matches()


LOOP = dict(dual_updates=2, steps_per_dual=2, lr=0.05, dual_lr=0.5, dual_samples=16)


def loop_by_hand(lam0: float, dual_update):
    """primal_dual_loop written out: per round, samples from the model (float64), the dual step on the violation,
    then Adam steps on the primal loss at the new lambda; all draws from one generator."""
    import torch

    from tasks.constrained_unlearning import diffusion

    model, schedule, pool = tiny_ddpm()
    weights = torch.linspace(0.1, 3.2, 32)
    optimizer = torch.optim.Adam(model.parameters(), lr=LOOP["lr"])
    g, lam, lambdas, slacks, losses, seen = torch.Generator().manual_seed(7), lam0, [], [], [], []
    for _ in range(LOOP["dual_updates"]):
        samples = diffusion.sample(model, schedule, LOOP["dual_samples"], g).numpy().astype(np.float64)
        seen.append(samples)
        slack = m.violation("lu", float(np.mean(samples[:, 0] ** 2)), 0.5)
        lam = dual_update(lam, slack, LOOP["dual_lr"])
        lambdas.append(lam)
        slacks.append(slack)
        for _ in range(LOOP["steps_per_dual"]):
            index = torch.randint(0, 32, (8,), generator=g)
            loss = diffusion.dsm_loss(model, pool[index], schedule, g, weights[index] * (1 + lam))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(float(loss.detach()))
    return lam, lambdas, slacks, losses, seen


def loop_matches(lam0: float | None) -> bool:
    import torch

    model, schedule, pool = tiny_ddpm()
    weights = torch.linspace(0.1, 3.2, 32)
    seen = []

    def constraint(samples):
        seen.append(samples)
        return float(np.mean(samples[:, 0] ** 2))

    def dual_update(lam, g, lr):
        return lam + lr * g + 0.01  # not the projection: shows the argument is used

    kwargs = {} if lam0 is None else {"lam0": lam0}
    got = m.primal_dual_loop("lu", model, schedule,
                             lambda lam: m.importance_weighted_loss(model, schedule, pool, weights * (1 + lam), 8),
                             0.5, constraint, generator=torch.Generator().manual_seed(7), dual_update=dual_update,
                             **LOOP, **kwargs)
    lam, lambdas, slacks, losses, want_seen = loop_by_hand(0.0 if lam0 is None else lam0, dual_update)
    return (got.lam == lam and got.lambdas == lambdas and got.slacks == slacks and got.losses == losses
            and all(a.dtype == np.float64 and np.array_equal(a, b) for a, b in zip(seen, want_seen, strict=True)))


def test_primal_dual_loop_replayed_exactly():
    assert loop_matches(0.3) and loop_matches(None)  # None: the default lambda_0 = 0
    empty = m.primal_dual_loop("lu", *tiny_ddpm()[:2], lambda lam: None, 0.5, lambda s: 0.0, dual_updates=0,
                               steps_per_dual=1, lr=0.1, dual_lr=0.1, dual_samples=4, generator=None, lam0=0.7)
    assert empty.lam == 0.7 and empty.lambdas == []


def test_negative_control_loop_with_default_adam_lr_is_caught(monkeypatch):
    original = m.primal_dual_loop
    monkeypatch.setattr(m, "primal_dual_loop", lambda *a, lr, **k: original(*a, lr=1e-3, **k))
    assert not loop_matches(0.3)


def unlearn_matches() -> bool:
    import torch

    def dual_update(lam, g, lr):
        return 0.5 * lam + 0.1 + 1e-3 * math.tanh(g)  # lambda_0 shows in every lambda

    log_q = np.log(np.linspace(0.5, 2.0, 32))
    log_qu = np.log(np.linspace(2.0, 0.1, 32))
    runs = []
    for direct in (True, False):
        model, schedule, pool = tiny_ddpm()
        common = dict(generator=torch.Generator().manual_seed(9), lam0=0.2, dual_update=dual_update, **LOOP)
        if direct:
            runs.append(m.primal_dual_unlearn("ru", model, schedule, pool, log_q, log_qu, 0.5,
                                              lambda s: float(np.mean(s[:, 1])), batch_size=8, **common))
        else:
            def primal_loss(lam, model=model, schedule=schedule, pool=pool):
                w = torch.as_tensor(m.importance_weights("ru", log_q, log_qu, lam), dtype=torch.float32)
                return m.importance_weighted_loss(model, schedule, pool, w, 8)
            runs.append(m.primal_dual_loop("ru", model, schedule, primal_loss, 0.5, lambda s: float(np.mean(s[:, 1])),
                                           **common))
    a, b = runs
    return a.lam == b.lam and a.lambdas == b.lambdas and a.slacks == b.slacks and a.losses == b.losses


def test_primal_dual_unlearn_is_the_loop_on_importance_weights():
    assert unlearn_matches()


def test_negative_control_unlearn_ignoring_lam0_is_caught(monkeypatch):
    original = m.primal_dual_unlearn
    monkeypatch.setattr(m, "primal_dual_unlearn", lambda *a, lam0=0.0, **k: original(*a, lam0=0.0, **k))
    assert not unlearn_matches()


def lu_loss_one_step_is_finite() -> bool:
    import torch

    model, schedule, _ = tiny_ddpm()
    frozen = tiny_ddpm()[0]
    loss = m.lu_reinforce_loss(model, frozen, schedule, lambda x: torch.exp(-(x**2).sum(dim=1)), 0.5, 4, 1)
    return bool(torch.isfinite(loss(torch.Generator().manual_seed(0))))


def test_lu_reinforce_loss_accepts_one_gradient_step():
    assert lu_loss_one_step_is_finite()  # grad_steps = 1 is in [1, T]


def test_negative_control_lu_reinforce_loss_rejecting_one_step_is_caught(monkeypatch):
    original = m.lu_reinforce_loss

    def strict(*args):
        if args[-1] < 2:
            raise ValueError("grad_steps")
        return original(*args)

    monkeypatch.setattr(m, "lu_reinforce_loss", strict)
    with pytest.raises(ValueError):
        lu_loss_one_step_is_finite()
