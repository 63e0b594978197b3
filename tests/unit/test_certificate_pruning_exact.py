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
