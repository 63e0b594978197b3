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
