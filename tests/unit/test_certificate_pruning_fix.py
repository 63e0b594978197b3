"""certificate_pruning, review of the issue-18 test bed: (1) once the active pool is empty, ``ask`` proposes
only points the certificate has not ruled out (U_t(x) >= l_t), from the near set at the covering scale h;
(2) ``maximize`` / ``minimize`` stop on, and return, the covering-corrected gap eps_t^+, so a stop on a noisy
sparse pool is never a false certificate. Each check has a negative control: the pre-review variant put back
into the library fails the same check."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.certificate_pruning import method as m

STEEP_L, STEEP_X_STAR, GRID = 40.0, 0.3125, 64


def steep_cone(x: np.ndarray) -> float:
    return float(1.0 - STEEP_L * abs(float(np.ravel(x)[0]) - STEEP_X_STAR))


def old_candidates(self: m.CertificateGuidedPruning) -> tuple[np.ndarray, np.ndarray]:
    """The query rule before the review: with an empty pool, the pool point nearest x_hat and perturbations
    at ``perturb_scale`` (0.05) of it, the point itself kept whatever its U_t."""
    active_idx = np.flatnonzero(self.active)
    if active_idx.size == 0:
        active_idx = np.array([int(np.argmin(np.sum((self.pool - self.recommend()) ** 2, axis=1)))])
    pool_points, pool_values = self.pool[active_idx], self._pool_upper[active_idx]
    s = self.settings
    top = np.argsort(-pool_values, kind="stable")[: s.perturb_centres]
    noise = self.rng.normal(0.0, s.perturb_scale, size=(len(top), s.perturb_per_centre, self.dim))
    perturbed = np.clip(pool_points[top][:, None, :] + noise, 0.0, 1.0).reshape(-1, self.dim)
    perturbed_values = self.upper(perturbed)
    keep = perturbed_values >= self.lower
    return (np.vstack([pool_points, perturbed[keep]]), np.concatenate([pool_values, perturbed_values[keep]]))


def old_maximize(objective, bounds, budget, lipschitz, noise_sd, seed=0, target_gap=None, **settings):
    """The driver before the review: a Sobol pool, stop on (and return) the pool gap eps_t."""
    low, high = (np.asarray(b, dtype=float) for b in zip(*bounds))
    cgp = m.CertificateGuidedPruning(len(low), m.CGPSettings(float(lipschitz * np.max(high - low)), noise_sd,
                                                             **settings), seed)
    stopped = False
    for _ in range(budget):
        u = cgp.ask()
        cgp.tell(u, float(objective(low + u * (high - low))))
        if target_gap is not None and cgp.should_stop(target_gap):
            stopped = True
            break
    return m.OptimizationResult(low + cgp.recommend() * (high - low), cgp.lower, cgp.gap, cgp.samples.total,
                                stopped)


def queries_after_the_pool_empties(covering_radius: float | None, steps: int = 30) -> tuple[list[float], float, float]:
    """Noise-free CGP (exact L) on the steep cone over a 64-cell grid: U_t(x) - l_t of each query asked
    after the active pool has emptied, and the true regret of x_hat when it emptied and ``steps`` later."""
    cgp = m.CertificateGuidedPruning(1, m.CGPSettings(STEEP_L, noise_sd=0.0, pool_size=GRID), seed=0,
                                     pool=m.grid_pool(1, GRID), covering_radius=covering_radius)
    for _ in range(20):
        x = cgp.ask()
        cgp.tell(x, steep_cone(x))
        if not cgp.active.any():
            break
    assert not cgp.active.any(), "premise: the steep cone empties the active pool within 20 steps"
    regret_at_empty = 1.0 - steep_cone(cgp.recommend())
    margins = []
    for _ in range(steps):
        x = cgp.ask()
        margins.append(float(cgp.upper(x)[0] - cgp.lower))
        cgp.tell(x, steep_cone(x))
    return margins, regret_at_empty, 1.0 - steep_cone(cgp.recommend())


@pytest.mark.parametrize("covering_radius", [None, m.grid_covering_radius(1, GRID)])
def test_ask_after_the_pool_empties_never_proposes_a_certified_suboptimal_point(covering_radius):
    margins, regret_at_empty, regret_later = queries_after_the_pool_empties(covering_radius)
    assert min(margins) >= -1e-12  # every query has U_t(x) >= l_t (item 5; rounding of U_t(x_hat) = l_t)
    assert regret_later <= regret_at_empty
    if covering_radius is None:  # the pool empties early (regret 0.07 there): the search keeps refining
        assert regret_at_empty > 0.05 and regret_later < 0.05 * regret_at_empty


def test_negative_control_the_old_fallback_queries_certified_suboptimal_points(monkeypatch):
    monkeypatch.setattr(m.CertificateGuidedPruning, "_candidates", old_candidates)
    margins, regret_at_empty, regret_later = queries_after_the_pool_empties(None)
    assert sum(mg < -1e-12 for mg in margins) >= 20  # most queries after the collapse are already ruled out
    assert regret_later > 0.05 * regret_at_empty  # and the same refinement check fails (0.0078 of 0.072)


def test_near_set_candidates_exact_on_a_hand_state():
    """Two samples on [0, 1] with L = 1, noise-free: U_t(x) = min(0.62 + |x - 0.2|, 0.9 + |x - 0.6|), l_t = 0.9
    (x_hat = 0.6). On the 4-cell grid (centres 1/8 + k/4, h = 1/8) U = (0.695, 0.795, 0.925, 1.175); the near
    set (U >= 0.9 - 0.125) is {0.375, 0.625, 0.875}, and the kept candidates are those with U >= 0.9 only."""
    cgp = m.CertificateGuidedPruning(1, m.CGPSettings(1.0, noise_sd=0.0, pool_size=4), seed=0,
                                     pool=m.grid_pool(1, 4), covering_radius=0.125)
    cgp.tell(np.array([0.2]), 0.62)
    cgp.tell(np.array([0.6]), 0.9)
    np.testing.assert_allclose(cgp._pool_upper, [0.695, 0.795, 0.925, 1.175])
    assert cgp.lower == pytest.approx(0.9) and cgp.candidate_scale() == 0.125
    points, values = cgp._candidates()
    assert np.all(values >= 0.9) and np.any(np.isclose(points[:, 0], 0.875))
    np.testing.assert_allclose(values, cgp.upper(points))
    assert not np.any(np.isclose(points[:, 0], 0.375))  # near (U 0.795 >= 0.775) but ruled out (U < l_t)
    # The scale without a covering radius: that of a grid with as many points, 0.5 / 4.
    assert m.CertificateGuidedPruning(1, m.CGPSettings(1.0, 0.0, pool_size=4), 0,
                                      pool=m.grid_pool(1, 4)).candidate_scale() == pytest.approx(0.125)
    with pytest.raises(ValueError, match="covering_radius"):
        m.CertificateGuidedPruning(1, m.CGPSettings(1.0, 0.0), 0, covering_radius=0.0)


def noisy_sparse_pool_stops(seeds: range, target: float = 0.05) -> list[tuple[bool, float, float]]:
    """(stopped, true regret, returned gap) of ``maximize`` on the steep cone with noise sd 0.005 and a
    64-point pool, one run per seed."""
    out = []
    for seed in seeds:
        rng = np.random.default_rng(1000 + seed)
        result = m.maximize(lambda x, rng=rng: steep_cone(x) + 0.005 * rng.standard_normal(), [(0.0, 1.0)], budget=150,
                            lipschitz=STEEP_L, noise_sd=0.005, seed=seed, target_gap=target, pool_size=64)
        out.append((result.stopped_early, 1.0 - steep_cone(result.x), result.gap))
    return out


def test_maximize_stops_on_a_noisy_sparse_pool_only_with_a_valid_certificate():
    runs = noisy_sparse_pool_stops(range(8))
    assert sum(stopped for stopped, _, _ in runs) >= 4  # it does stop (the check is not vacuous)
    assert all(regret <= gap <= 0.05 for stopped, regret, gap in runs if stopped)
    assert all(regret <= gap for _, regret, gap in runs)  # the returned gap bounds the regret, stop or not


def test_negative_control_stopping_on_the_pool_gap_certifies_falsely(monkeypatch):
    # The pre-review driver (the pool gap on a Sobol pool, the old query rule). With the new query rule the
    # pool empties and the pool gap is +inf, so it would never stop: the false stops need the old driver.
    monkeypatch.setattr(m, "maximize", old_maximize)
    monkeypatch.setattr(m.CertificateGuidedPruning, "_candidates", old_candidates)
    runs = noisy_sparse_pool_stops(range(8))
    assert any(stopped and regret > gap for stopped, regret, gap in runs)


def test_near_fraction_exact_and_it_sees_the_active_set_an_empty_pool_hides(monkeypatch):
    cgp = m.CertificateGuidedPruning(1, m.CGPSettings(1.0, noise_sd=0.0, pool_size=4), seed=0,
                                     pool=m.grid_pool(1, 4), covering_radius=0.125)
    cgp.tell(np.array([0.2]), 0.62)
    cgp.tell(np.array([0.6]), 0.9)
    # U = (0.695, 0.795, 0.925, 1.175), l_t = 0.9: 3 of 4 points have U >= 0.775 (h = 1/8), 2 of 4 with h = 0.
    assert cgp.near_fraction(0.125) == 0.75 and cgp.near_fraction(0.0) == 0.5
    steep = m.CertificateGuidedPruning(1, m.CGPSettings(STEEP_L, noise_sd=0.0, pool_size=GRID), seed=0,
                                       pool=m.grid_pool(1, GRID))
    for _ in range(20):
        x = steep.ask()
        steep.tell(x, steep_cone(x))
        if not steep.active.any():
            break

    def volume_sees_x_star(cgp: m.CertificateGuidedPruning) -> bool:
        # x* is in {U_t >= l_t} (noise-free, exact L), so a valid upper bound on its volume is > 0.
        return cgp.near_fraction(m.grid_covering_radius(1, GRID)) > 0.0

    assert steep.active_fraction == 0.0 and volume_sees_x_star(steep)
    # Negative control: the active pool fraction in its place reads 0 while x* is still active.
    monkeypatch.setattr(m.CertificateGuidedPruning, "near_fraction", lambda self, h: self.active_fraction)
    assert not volume_sees_x_star(steep)


def test_covered_gap_is_inf_when_the_near_set_is_empty():
    """Samples inconsistent with L = 1 (off the good event): y = 0 at 0.125 and y = 1 at 0.13. On the 4-cell
    grid U = (0, 0.25, 0.5, 0.75) and l_t = 1, so no pool point has U >= l_t - L h = 0.875: no certificate."""
    cgp = m.CertificateGuidedPruning(1, m.CGPSettings(1.0, noise_sd=0.0, pool_size=4), seed=0,
                                     pool=m.grid_pool(1, 4), covering_radius=0.125)
    cgp.tell(np.array([0.125]), 0.0)
    cgp.tell(np.array([0.13]), 1.0)
    np.testing.assert_allclose(cgp._pool_upper, [0.0, 0.25, 0.5, 0.75])
    assert cgp.covered_gap(0.125) == np.inf
    assert cgp.covered_gap(0.25) == pytest.approx(0.75 + 0.25 - 1.0)  # with h = 1/4 the point 0.875 is near


def test_trace_cgp_records_the_covered_gap_and_its_first_stop():
    from tasks.certificate_pruning import runs
    from tasks.certificate_pruning.data import Benchmark

    h = m.grid_covering_radius(1, GRID)
    bench = Benchmark("steep", 1, lambda x: 1.0 - STEEP_L * np.abs(x[:, 0] - STEEP_X_STAR), np.array([STEEP_X_STAR]),
                      STEEP_L)

    def fresh() -> m.CertificateGuidedPruning:
        return m.CertificateGuidedPruning(1, m.CGPSettings(STEEP_L, noise_sd=0.0, pool_size=GRID), seed=0,
                                          pool=m.grid_pool(1, GRID), covering_radius=h)

    trace = runs.trace_cgp(fresh(), bench, steep_cone, budget=12, stop_gap=0.3, covering_radius=h)
    replay, expected = fresh(), []
    for _ in range(12):
        x = replay.ask()
        replay.tell(x, steep_cone(x))
        expected.append(replay.covered_gap(h))
    np.testing.assert_allclose(trace.covered_gap, expected)
    assert trace.covered_stop_time == runs.first_step_at_most(np.array(expected), 0.3) is not None
    assert runs.trace_cgp(fresh(), bench, steep_cone, budget=12, stop_gap=0.3).covered_gap == []
