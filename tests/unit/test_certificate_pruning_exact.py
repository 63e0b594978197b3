"""certificate_pruning method: exact values on non-degenerate (noisy, unequal-count) inputs, computed
by hand beside the library, each with a negative control that monkeypatches a broken variant into
`method` (issue 20: `recommend` under noise, the active set after an adaptive doubling)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.certificate_pruning import method as m


def radius(n: float, m_t: int, sd: float, delta: float) -> float:
    return sd * math.sqrt(2 * math.log(4 * m_t * n * n / delta) / n)


# Formulas -----------------------------------------------------------------------------------------

def test_confidence_radius_exact():
    got = m.confidence_radius(np.array([1, 3, 10]), n_distinct=5, noise_sd=0.4, delta=0.1)
    assert np.allclose(got, [radius(n, 5, 0.4, 0.1) for n in (1, 3, 10)], atol=1e-15)
    with pytest.raises(ValueError):
        m.confidence_radius(np.array([0, 2]), 2, 0.1, 0.1)


def test_envelope_certificate_and_slope_exact():
    points = np.array([[0.1, 0.2], [0.7, 0.4], [0.3, 0.9]])
    means = np.array([0.5, 1.2, 0.8])
    radii = np.array([0.1, 0.3, 0.05])
    queries = np.array([[0.0, 0.0], [0.5, 0.5]])
    dist = m.pairwise_distances(queries, points)
    want_dist = [[math.dist(q, p) for p in points.tolist()] for q in queries.tolist()]
    assert np.allclose(dist, want_dist, atol=1e-15)
    upper = m.upper_envelope(dist, means + radii, lipschitz=2.0)
    want_upper = [min(mu + c + 2.0 * d for mu, c, d in zip(means, radii, row)) for row in want_dist]
    assert np.allclose(upper, want_upper, atol=1e-15)
    assert np.isinf(m.upper_envelope(np.empty((2, 0)), np.empty(0), 1.0)).all()
    assert m.lower_certificate(means, radii) == pytest.approx(max(0.4, 0.9, 0.75))
    assert m.lower_certificate(np.empty(0), np.empty(0)) == -np.inf
    slopes = [max(0.0, abs(means[i] - means[j]) - radii[i] - radii[j]) / math.dist(points[i], points[j])
              for i in range(3) for j in range(3) if i != j]
    assert m.empirical_slope(points, means, radii) == pytest.approx(max(slopes), abs=1e-15)
    assert max(slopes) > 0  # non-degenerate: the radii do not swallow every difference
    assert m.empirical_slope(points[:1], means[:1], radii[:1]) == 0.0


def test_sobol_pool_and_covering_radius():
    pool = m.sobol_pool(2, 8, seed=0)
    assert pool.shape == (8, 2) and (pool >= 0).all() and (pool <= 1).all()
    with pytest.raises(ValueError):
        m.sobol_pool(2, 6, seed=0)
    grid = np.array([[0.25], [0.75]])
    h = m.covering_radius_estimate(grid, n_probes=2000, seed=0)
    assert 0.24 < h <= 0.25  # the farthest probe of [0, 1] from {0.25, 0.75} is 0.25 away (at 0 or 1)


def test_sample_store_merges_requeries_and_grows():
    store = m.SampleStore(dim=1, capacity=2)
    for x, y in [(0.1, 1.0), (0.5, 2.0), (0.1, 3.0), (0.9, -1.0)]:
        store.add(np.array([x]), y)
    assert store.size == 3 and store.total == 4
    assert store.counts.tolist() == [2, 1, 1] and store.means.tolist() == [2.0, 2.0, -1.0]
    columns = m.DistanceColumns(np.array([[0.0], [1.0]]), capacity=1)
    for x in (0.25, 0.5):
        columns.append(np.array([x]))
    assert np.allclose(columns.matrix, [[0.25, 0.5], [0.75, 0.5]])


# recommend under noise: argmax of mu_hat - c, not of mu_hat --------------------------------------

def _noisy_cgp() -> m.CertificateGuidedPruning:
    cgp = m.CertificateGuidedPruning(1, m.CGPSettings(lipschitz=1.0, noise_sd=0.5, pool_size=16), seed=0)
    # x = 0.2 once with the best single mean; x = 0.6 four times with a slightly lower mean
    cgp.tell(np.array([0.2]), 1.00)
    for y in (0.95, 0.85, 0.9, 0.9):
        cgp.tell(np.array([0.6]), y)
    return cgp


def recommend_check() -> bool:
    cgp = _noisy_cgp()
    means, counts = [1.0, 0.9], [1, 4]
    lcb = [mu - radius(n, 2, 0.5, 0.05) for mu, n in zip(means, counts)]
    assert lcb[1] > lcb[0] and means[0] > means[1]  # non-degenerate: the radius decides
    return cgp.recommend().tolist() == [0.6] and cgp.lower == pytest.approx(max(lcb))


def test_recommend_under_noise_is_the_lcb_argmax():
    assert recommend_check()


def test_negative_control_recommend_by_mean_fails(monkeypatch):
    monkeypatch.setattr(m.CertificateGuidedPruning, "recommend",
                        lambda self: self.samples.points[int(np.argmax(self.samples.means))].copy())
    assert not recommend_check()


def test_negative_control_radius_without_union_bound_fails(monkeypatch):
    monkeypatch.setattr(m, "confidence_radius",
                        lambda counts, n, sd, delta: sd * np.sqrt(2 * np.log(4 * np.asarray(counts, float) ** 2 / delta)
                                                                  / np.asarray(counts, float)))
    assert not recommend_check()


def test_gap_and_active_set_exact_after_noisy_samples():
    cgp = _noisy_cgp()
    radii = [radius(1, 2, 0.5, 0.05), radius(4, 2, 0.5, 0.05)]
    upper = [min(1.0 + radii[0] + abs(x - 0.2), 0.9 + radii[1] + abs(x - 0.6)) for x in cgp.pool[:, 0]]
    lower = max(1.0 - radii[0], 0.9 - radii[1])
    # the active set is intersected over time: check against the sequence of envelopes
    assert np.allclose(cgp._pool_upper, upper, atol=1e-12)
    assert cgp.gap == pytest.approx(max(u for u, a in zip(upper, cgp.active) if a) - lower)
    assert cgp.should_stop(cgp.gap) and not cgp.should_stop(cgp.gap * 0.5)


# the active set after an adaptive doubling: reset to the pool, then pruned with the doubled L ------

def _adaptive() -> m.AdaptiveCGP:
    settings = m.CGPSettings(lipschitz=1.0, noise_sd=0.0, pool_size=32)
    cgp = m.AdaptiveCGP(1, settings, seed=1, initial_lipschitz=1.0)
    cgp.tell(np.array([0.5]), 1.0)
    cgp.tell(np.array([0.9]), 0.7)  # slope 0.75 < 1: no doubling; prunes |x - 0.9| < 0.3 with L = 1
    cgp.tell(np.array([0.1]), 0.0)  # slope 2.5 > 1: doubles twice to L = 4, pruned points come back
    return cgp


def adaptive_check() -> bool:
    cgp = _adaptive()
    pool = cgp.pool[:, 0]
    upper = np.minimum.reduce([1.0 + 4.0 * np.abs(pool - 0.5), 0.7 + 4.0 * np.abs(pool - 0.9),
                               4.0 * np.abs(pool - 0.1)])
    want_active = upper >= 1.0
    return (cgp.lipschitz == 4.0 and cgp.doublings == 2 and cgp.doubling_steps == [3]
            and cgp.active.tolist() == want_active.tolist())


def test_adaptive_doubling_resets_then_prunes_with_the_new_l():
    cgp = _adaptive()
    assert 0 < cgp.active.sum() < len(cgp.active)  # non-degenerate: some points pruned, some kept
    came_back = (cgp.pool[:, 0] > 0.6) & (cgp.pool[:, 0] < 0.825)
    assert came_back.any() and cgp.active[came_back].all()  # pruned under L = 1, active again under L = 4
    assert adaptive_check()


def test_negative_control_doubling_without_reset_fails(monkeypatch):
    original = m.AdaptiveCGP.tell

    def no_reset(self, x, y):
        before = self.active.copy()
        original(self, x, y)
        self.active &= before

    monkeypatch.setattr(m.AdaptiveCGP, "tell", no_reset)
    assert not adaptive_check()


def test_negative_control_halved_slope_fails(monkeypatch):
    monkeypatch.setattr(m, "empirical_slope", lambda p, mu, c: 0.5 * float(np.max(
        np.abs(mu[:, None] - mu[None, :]) / (m.pairwise_distances(p, p) + np.eye(len(p))))))
    assert not adaptive_check()


# Survivors of `make mutation SLUG=certificate_pruning`: the seeds, CGP-Hybrid, CGP-TR ----------------

def test_sobol_pool_is_scrambled_by_the_seed():
    a, b = m.sobol_pool(2, 8, seed=0), m.sobol_pool(2, 8, seed=1)
    assert not np.allclose(a, b) and np.allclose(a, m.sobol_pool(2, 8, seed=0))
    assert not (a == 0).all(axis=1).any()  # the unscrambled sequence starts at the origin


def test_adaptive_cgp_uses_its_seed_for_the_pool():
    settings = m.CGPSettings(lipschitz=1.0, noise_sd=0.0, pool_size=16)
    assert np.array_equal(m.AdaptiveCGP(2, settings, seed=5, initial_lipschitz=1.0).pool, m.sobol_pool(2, 16, 5))


def test_trust_region_state_update_sequence():
    state = m.TrustRegionState(side=0.4, success_tol=2, failure_tol=2, min_side=0.15, initial_side=0.8)
    sides = []
    for improved in (True, True, False, False, False, False, False, False):
        state.update(improved)
        sides.append(state.side)
    # 2 successes double 0.4 -> 0.8; 2 failures halve -> 0.4 -> 0.2 -> 0.1 < min_side: restart at 0.8
    assert sides == [0.4, 0.8, 0.8, 0.4, 0.4, 0.2, 0.2, 0.8] and state.restarts == 1


def test_trust_region_cgp_recommend_box_and_improvement_rule():
    settings = m.CGPSettings(lipschitz=2.0, noise_sd=0.0, pool_size=16)
    tr = m.TrustRegionCGP(2, settings, seed=0, state=m.TrustRegionState(side=0.5, success_tol=10, failure_tol=10))
    assert tr.recommend().tolist() == [0.5, 0.5] and tr.ask().tolist() == [0.5, 0.5]
    tr.tell(np.array([0.9, 0.1]), 2.0)
    low, high = tr.box()
    assert low.tolist() == pytest.approx([0.65, 0.0]) and high.tolist() == pytest.approx([1.0, 0.35])
    tr.tell(np.array([0.2, 0.2]), 2.001)  # within 1e-3 * max(1, |best|) = 0.002 of the best: not an improvement
    assert (tr.state.successes, tr.state.failures) == (0, 1)
    tr.tell(np.array([0.3, 0.3]), 2.01)
    assert (tr.state.successes, tr.state.failures) == (1, 0)
    x = tr.ask()
    assert x.shape == (2,) and tr.local_lipschitz <= 2.0


def test_hybrid_cgp_checks_smoothness_every_k_samples_and_then_asks_the_gp():
    settings = m.CGPSettings(lipschitz=4.0, noise_sd=0.01, pool_size=64)
    hybrid = m.HybridCGP(1, settings, seed=0, local_radius=0.3, residual_tol=0.05, check_every=4,
                         gp_candidates=1000)
    xs = [0.5, 0.4, 0.6, 0.45, 0.55, 0.35, 0.65, 0.5]
    switched = []
    for x in xs:  # a smooth quadratic: the fit around the incumbent is exact
        hybrid.tell(np.array([x]), 1.0 - (x - 0.5) ** 2)
        switched.append(hybrid.switched_at)
    # checks at t = 4 (too few points near the incumbent: 4 < 2 * 3 coefficients) and t = 8 (6 near: smooth)
    assert switched == [None] * 7 + [8]
    x = hybrid.ask()
    candidates = hybrid.pool[hybrid.active]
    assert x.tolist() == candidates[int(np.argmax(hybrid._gp_ucb(candidates)))].tolist()  # the GP-UCB maximiser


def test_hybrid_local_smoothness_uses_the_squared_distance():
    settings = m.CGPSettings(lipschitz=4.0, noise_sd=0.01, pool_size=64)
    hybrid = m.HybridCGP(1, settings, seed=0, local_radius=0.3, residual_tol=0.05, check_every=100)
    for x in [0.5, 0.4, 0.6, 0.45, 0.55, 0.35]:
        hybrid.tell(np.array([x]), 1.0 - (x - 0.5) ** 2)
    for x in [0.05, 0.1, 0.9, 0.95]:  # far away and rough: must not enter the local fit
        hybrid.tell(np.array([x]), 0.5 + (3.0 if x > 0.5 else -3.0) * (x % 0.1))
    assert hybrid._locally_smooth()


def test_quadratic_fit_and_ucb_beta_exact():
    points = np.array([[0.0], [0.5], [1.0], [1.5], [2.0], [2.5]])
    assert m.quadratic_fit_residual(points, 1 + 2 * points[:, 0] - points[:, 0] ** 2) == pytest.approx(0.0, abs=1e-12)
    assert m.quadratic_fit_residual(points[:5], points[:5, 0]) is None  # 5 < 2 * 3
    assert m.quadratic_features(np.array([[2.0, 3.0]])).tolist() == [[1.0, 2.0, 3.0, 4.0, 6.0, 9.0]]
    assert m.ucb_beta_sqrt(100, 3, 0.1) == pytest.approx(math.sqrt(2 * math.log(100 * 9 * math.pi**2 / 0.6)))
    assert m.ucb_beta_sqrt(100, 0, 0.1) == pytest.approx(math.sqrt(2 * math.log(100 * math.pi**2 / 0.6)))
