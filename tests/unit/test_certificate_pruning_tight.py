"""certificate_pruning, issue 18: the empty-pool false certificate (a steep function empties the discrete
active pool while x* is still active), the covering-corrected gap eps_t^+ and the grid pool it needs, and
the tight test bed's per-run rows and metrics. Each check has a negative control that puts the broken
variant back into the library and shows the same check fails."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.certificate_pruning import claim_metrics, runs
from tasks.certificate_pruning import method as m
from tasks.certificate_pruning.data import Benchmark
from tests.unit.test_certificate_pruning_fix import old_candidates, old_maximize

STEEP_L, STEEP_X_STAR, GRID = 40.0, 0.3125, 64


def steep_cone(x: np.ndarray) -> float:
    """1 - 40 |x - 0.3125| on [0, 1]: its active region {U_t >= l_t} soon becomes narrower than the pool."""
    return float(1.0 - STEEP_L * abs(float(np.ravel(x)[0]) - STEEP_X_STAR))


def steep_cgp() -> m.CertificateGuidedPruning:
    """Noise-free CGP with the exact L on a 64-cell grid pool (so the covering radius is exactly 1/128)."""
    return m.CertificateGuidedPruning(1, m.CGPSettings(STEEP_L, noise_sd=0.0, pool_size=GRID), seed=0,
                                      pool=m.grid_pool(1, GRID))


def run_until_the_pool_empties(cgp: m.CertificateGuidedPruning, max_steps: int = 20) -> int:
    for t in range(1, max_steps + 1):
        x = cgp.ask()
        cgp.tell(x, steep_cone(x))
        if not cgp.active.any():
            return t
    raise AssertionError("premise: the steep cone should empty the active pool within 20 steps")


def false_certificate_on_the_steep_cone(target: float = 0.01) -> tuple[bool, float]:
    """(should_stop fired while the true regret of x_hat exceeds the target, that regret)."""
    cgp = steep_cgp()
    run_until_the_pool_empties(cgp)
    regret = 1.0 - steep_cone(cgp.recommend())
    return cgp.should_stop(target) and regret > target, regret


def old_gap(self) -> float:
    """The gap before issue 18: 0 when the active pool is empty."""
    if not self.active.any():
        return 0.0
    return float(max(0.0, self._pool_upper[self.active].max() - self.lower))


def old_should_stop(self, target_gap: float) -> bool:
    return self.samples.size > 0 and self.gap <= target_gap


# The bug -------------------------------------------------------------------------------------------

def test_an_empty_active_pool_never_certifies_on_a_steep_function():
    cgp = steep_cgp()
    emptied_at = run_until_the_pool_empties(cgp)
    regret = 1.0 - steep_cone(cgp.recommend())
    margin = float(cgp.upper(np.array([[STEEP_X_STAR]]))[0] - cgp.lower)
    # Premises: the pool emptied, yet x* is still in the (continuous) active set and the regret is far from 0.
    assert emptied_at <= 5 and margin >= 0.0 and regret > 0.05
    assert cgp.gap == math.inf
    assert not cgp.should_stop(0.01) and not cgp.should_stop(1e9)
    assert not false_certificate_on_the_steep_cone()[0]


def test_negative_control_the_old_gap_certifies_falsely_on_the_same_function(monkeypatch):
    monkeypatch.setattr(m.CertificateGuidedPruning, "gap", property(old_gap))
    monkeypatch.setattr(m.CertificateGuidedPruning, "should_stop", old_should_stop)
    fired, regret = false_certificate_on_the_steep_cone()
    assert fired and regret > 0.05


def test_maximize_with_a_target_never_stops_on_a_false_certificate(monkeypatch):
    def run() -> tuple[bool, float, float]:
        result = m.maximize(lambda x: steep_cone(x), [(0.0, 1.0)], budget=60, lipschitz=STEEP_L, noise_sd=0.0,
                            target_gap=0.01, pool_size=64)
        return result.stopped_early, 1.0 - steep_cone(result.x), result.gap

    stopped, regret, gap = run()
    assert not stopped or regret <= gap <= 0.01
    # Negative control: the driver and query rule before issue 18's review (pool gap on a Sobol pool) with
    # the gap before issue 18 (0 on an empty pool).
    monkeypatch.setattr(m, "maximize", old_maximize)
    monkeypatch.setattr(m.CertificateGuidedPruning, "_candidates", old_candidates)
    monkeypatch.setattr(m.CertificateGuidedPruning, "gap", property(old_gap))
    monkeypatch.setattr(m.CertificateGuidedPruning, "should_stop", old_should_stop)
    stopped, regret, gap = run()
    assert stopped and gap == 0.0 and regret > 0.01  # the false certificate the issue describes


# Grid pool and the covering-corrected gap ----------------------------------------------------------------

def test_grid_pool_and_its_exact_covering_radius():
    pool = m.grid_pool(2, 4)
    assert pool.shape == (16, 2)
    np.testing.assert_allclose(pool[:5], [[0.125, 0.125], [0.125, 0.375], [0.125, 0.625], [0.125, 0.875],
                                          [0.375, 0.125]])
    h = m.grid_covering_radius(2, 4)
    assert h == pytest.approx(math.sqrt(2) / 8)
    probes = np.random.default_rng(0).random((4000, 2))
    nearest = m.pairwise_distances(probes, pool).min(axis=1)
    assert nearest.max() <= h + 1e-12 and nearest.max() > 0.9 * h  # attained near the cell corners
    assert m.pairwise_distances(np.array([[0.0, 0.0]]), pool).min() == pytest.approx(h)  # a corner: exactly h
    with pytest.raises(ValueError, match="per_axis"):
        m.grid_pool(2, 0)


def test_covered_gap_exact_on_a_hand_computed_envelope():
    # Pool {0.125, 0.375, 0.625, 0.875}, h = 0.125, L = 2, noise-free samples f(0.3) = 0.9 and f(0.8) = 0.5:
    # U = min(0.9 + 2 |x - 0.3|, 0.5 + 2 |x - 0.8|) on the pool = [1.25, 1.05, 0.85, 0.65], l = 0.9,
    # L h = 0.25, the set U >= 0.65 is the whole pool: eps^+ = 1.25 + 0.25 - 0.9 = 0.6.
    cgp = m.CertificateGuidedPruning(1, m.CGPSettings(2.0, noise_sd=0.0, pool_size=4), seed=0, pool=m.grid_pool(1, 4))
    cgp.tell(np.array([0.3]), 0.9)
    cgp.tell(np.array([0.8]), 0.5)
    np.testing.assert_allclose(cgp._pool_upper, [1.25, 1.05, 0.85, 0.65])
    assert cgp.active.tolist() == [True, True, False, False]
    assert cgp.covered_gap(0.125) == pytest.approx(0.6)
    # With h = 0 only U >= l counts: max(1.25, 1.05) - 0.9 = 0.35 (the active pool's gap as well).
    assert cgp.covered_gap(0.0) == pytest.approx(0.35) == pytest.approx(cgp.gap)
    assert m.CertificateGuidedPruning(1, m.CGPSettings(2.0, 0.0, pool_size=4), 0).covered_gap(0.1) == math.inf
    with pytest.raises(ValueError, match="covering_radius"):
        cgp.covered_gap(-0.1)


def covered_gap_bounds_the_regret_at_every_step(steps: int = 30) -> bool:
    cgp = steep_cgp()
    bounded = []
    for _ in range(steps):
        x = cgp.ask()
        cgp.tell(x, steep_cone(x))
        bounded.append(cgp.covered_gap(m.grid_covering_radius(1, GRID)) >= 1.0 - steep_cone(cgp.recommend()) - 1e-12)
    return all(bounded)


def test_covered_gap_bounds_the_regret_where_the_pool_gap_cannot(monkeypatch):
    assert covered_gap_bounds_the_regret_at_every_step()
    # Negative control: eps^+ without the covering slack (h = 0) is the pool's own estimate, which fails here.
    original = m.CertificateGuidedPruning.covered_gap
    monkeypatch.setattr(m.CertificateGuidedPruning, "covered_gap", lambda self, h: original(self, 0.0))
    assert not covered_gap_bounds_the_regret_at_every_step()


# The tight test bed: per-run rows and metrics -------------------------------------------------------

def hand_trace() -> runs.CGPTrace:
    trace = runs.CGPTrace(regret=[0.5, 0.2, 0.05], volume=[0.6, 0.0, 0.0], gap=[0.7, math.inf, math.inf],
                          margin=[0.3, 0.1, 0.02], covered_gap=[0.9, 0.3, 0.12])
    trace.stop_time, trace.covered_stop_time = 2, 3
    return trace


def test_tight_run_row_exact():
    row = runs.tight_run_row(hand_trace(), run=4, stop_gap=0.15, final_near_fraction=0.004)
    assert row == {"run": 4, "budget": 3, "final_volume": 0.0, "covered": True, "pool_gap_bounded": True,
                   "covered_gap_bounded": True, "first_empty_step": 2, "pool_stop_time": 2, "pool_stop_regret": 0.2,
                   "covered_stop_time": 3, "covered_stop_regret": 0.05, "covered_stop_gap": 0.12,
                   "half_target_stop_time": None, "final_near_fraction": 0.004, "stop_gap": 0.15,
                   "final_covered_gap": 0.12, "final_pool_gap": None, "final_regret": 0.05}
    half = runs.tight_run_row(hand_trace(), run=4, stop_gap=0.6, final_near_fraction=0.004)["half_target_stop_time"]
    assert half == 2
    infinite = hand_trace()
    infinite.covered_gap = [0.9, 0.3, math.inf]  # near set empty (off the good event): null, not Infinity JSON
    assert runs.tight_run_row(infinite, run=4, stop_gap=0.15, final_near_fraction=0.0)["final_covered_gap"] is None
    assert runs.first_step_at_most(np.array([0.9, 0.3, 0.12]), 0.3) == 2
    assert runs.first_step_at_most(np.array([0.9, 0.3]), 0.1) is None
    broken = hand_trace()
    broken.gap = [0.7, 0.0, 0.0]  # the old empty-pool gap: the same row now reads a violated bound
    assert not runs.tight_run_row(broken, run=4, stop_gap=0.15, final_near_fraction=0.004)["pool_gap_bounded"]


def test_tight_run_row_negative_control_a_coverage_that_ignores_misses(monkeypatch):
    missed = hand_trace()
    missed.margin = [0.3, -0.1, 0.02]  # x* pruned at step 2
    assert not runs.tight_run_row(missed, run=0, stop_gap=0.15, final_near_fraction=0.004)["covered"]
    monkeypatch.setattr(runs, "covered_throughout", lambda margins, from_step=1: True)
    assert runs.tight_run_row(missed, run=0, stop_gap=0.15, final_near_fraction=0.004)["covered"]


def row(covered=True, volume=0.0, pool_ok=False, plus_ok=True, empty=5, pool_stop=(10, 0.3), stop=(50, 0.08),
        plus_gap=0.12, regret=0.012, near=0.004, stop_gap=0.16, half=None) -> dict:
    return {"covered": covered, "final_volume": volume, "pool_gap_bounded": pool_ok, "covered_gap_bounded": plus_ok,
            "first_empty_step": empty, "pool_stop_time": pool_stop[0], "pool_stop_regret": pool_stop[1],
            "covered_stop_time": stop[0], "covered_stop_regret": stop[1], "stop_gap": 0.2,
            "covered_stop_gap": stop_gap if stop[0] is not None else None, "half_target_stop_time": half,
            "final_near_fraction": near, "final_covered_gap": plus_gap, "final_regret": regret}


def test_tight_metrics_exact_on_hand_rows():
    rows = [row(), row(covered=False, volume=0.3, pool_ok=True, empty=None, pool_stop=(None, None), stop=(None, None),
                       plus_gap=0.5, regret=0.5, near=0.3),
            row(stop=(90, 0.25), plus_gap=0.2, regret=0.002, stop_gap=0.2, half=120)]
    controls = [row(covered=False, plus_ok=False), row()]
    got = claim_metrics.tight_metrics(rows, controls)
    assert got["c1t_covered_runs"] == 2 and got["c1t_runs"] == 3 and got["c1t_coverage_rate"] == pytest.approx(2 / 3)
    assert got["c1t_pruned_runs"] == 2 and got["c1t_zero_radius_failures"] == 1
    assert got["c1t_zero_radius_failure_rate"] == 0.5
    assert got["c7t_pool_bounded_runs"] == 1 and got["c7t_pool_violation_rate"] == pytest.approx(2 / 3)
    assert got["c7t_covered_bounded_runs"] == 3 and got["c7t_covered_bounded_rate"] == 1.0
    # log10 ratios: log10(10) = 1, log10(1) = 0, log10(100) = 2 -> median 1
    assert got["c9a_log10_tightness"] == pytest.approx(1.0)
    assert got["c9b_stopped_runs"] == 2 and got["c9b_stopped_rate"] == pytest.approx(2 / 3)
    assert got["tight_valid_stops"] == 1 and got["tight_valid_stop_rate"] == 0.5  # 0.25 > 0.2 is not valid
    assert got["tight_pool_stopped_runs"] == 2 and got["tight_pool_false_stops"] == 2
    assert got["tight_empty_pool_runs"] == 2 and got["tight_median_stop_time"] == 70.0
    assert got["tight_median_final_volume"] == 0.0 and got["tight_median_final_near_fraction"] == 0.004
    # at the stop: log10(0.16 / 0.08) = 0.30103 and log10(0.2 / 0.25) = -0.09691 -> median 0.10206
    assert got["tight_log10_tightness_at_stop"] == pytest.approx((math.log10(2) + math.log10(0.8)) / 2)
    assert got["c9c_stopped_runs"] == 1 and got["c9c_stopped_rate"] == pytest.approx(1 / 3)
    assert claim_metrics.tight_metrics([row(plus_gap=None)], controls)["c9a_log10_tightness"] == math.inf  # None = +inf
    # pruned counts the near-set fraction, not the active pool fraction (0 once the pool empties)
    assert claim_metrics.tight_metrics([row(volume=0.0, near=0.2)], controls)["c1t_pruned_runs"] == 0


def test_tight_metrics_negative_control_a_pruning_threshold_nothing_meets(monkeypatch):
    rows = [row(), row(covered=False)]
    assert claim_metrics.tight_metrics(rows, [row()])["c1t_coverage_rate"] == 0.5
    monkeypatch.setattr(claim_metrics, "TIGHT_PRUNED_VOLUME", -1.0)  # nothing counts as pruned
    assert claim_metrics.tight_metrics(rows, [row()])["c1t_pruned_rate"] == 0.0


def test_tight_needle_has_its_exact_lipschitz_constant_and_a_fresh_centre():
    a = runs.tight_needle(0.08, np.random.default_rng(1))
    b = runs.tight_needle(0.08, np.random.default_rng(2))
    assert isinstance(a, Benchmark) and a.lipschitz == pytest.approx(12.5)
    assert not np.allclose(a.x_star, b.x_star) and np.all((a.x_star >= 0.15) & (a.x_star <= 0.85))
    # slope exactly 1 / width along a ray from the centre, and g(x*) = 1
    ray = a.x_star + np.array([[0.01, 0.0], [0.03, 0.0]])
    assert a.value(a.x_star[None])[0] == 1.0
    assert (a.value(ray[:1])[0] - a.value(ray[1:])[0]) / 0.02 == pytest.approx(12.5)
