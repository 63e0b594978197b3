"""certificate_pruning method: exact values on non-degenerate (noisy, unequal-count) inputs, computed
by hand beside the library, each with a negative control that monkeypatches a broken variant into
`method` (issue 20: `recommend` under noise, the active set after an adaptive doubling)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import ConstantKernel, Matern

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


# Survivors of the fourth pass's full run (2026-12-02): candidates reproduced draw by draw from a copy of the
# generator, the state queries on their boundaries, CGP-Hybrid's GP-UCB against sklearn called by hand, CGP-TR,
# and the maximize / minimize drivers against their loop written out ---------------------------------------------

CHECK_FAILED = (AssertionError, ValueError, IndexError, TypeError)


def upper_by_hand(cgp, x: np.ndarray) -> np.ndarray:
    """U_t(x) = min_i (mu_i + c_i + L |x - x_i|), with the radii of item 1 computed here."""
    s, counts = cgp.settings, cgp.samples.counts
    radii = np.array([s.radius_scale * radius(n, cgp.samples.size, s.noise_sd, s.delta) for n in counts])
    dist = np.sqrt(((x[:, None, :] - cgp.samples.points[None, :, :]) ** 2).sum(axis=2))
    return np.min(cgp.samples.means + radii + cgp.lipschitz * dist, axis=1), cgp.samples.means - radii


def candidates_by_hand(cgp, rng):
    s, d = cgp.settings, cgp.dim
    idx = np.flatnonzero(cgp.active)
    points, values = cgp.pool[idx], cgp._pool_upper[idx]
    if s.perturb_centres == 0 or s.perturb_per_centre == 0:
        return points, values
    top = np.argsort(-values, kind="stable")[: s.perturb_centres]
    noise = rng.normal(0.0, s.perturb_scale, size=(len(top), s.perturb_per_centre, d))
    perturbed = np.clip(points[top][:, None, :] + noise, 0.0, 1.0).reshape(-1, d)
    upper, lcb = upper_by_hand(cgp, perturbed)
    keep = upper >= lcb.max()
    return np.vstack([points, perturbed[keep]]), np.concatenate([values, upper[keep]])


def near_set_by_hand(cgp, rng):
    s, d = cgp.settings, cgp.dim
    h = cgp.covering_radius if cgp.covering_radius is not None else math.sqrt(d) / 2 * len(cgp.pool) ** (-1 / d)
    _, lcb = upper_by_hand(cgp, cgp.pool[:1])
    lower = lcb.max()
    idx = np.flatnonzero(cgp.active)
    near = np.flatnonzero(cgp._pool_upper >= lower - cgp.lipschitz * h)
    top = near[np.argsort(-cgp._pool_upper[near], kind="stable")[: max(1, s.perturb_centres)]]
    centres = np.vstack([cgp.pool[top], cgp.samples.points[int(np.argmax(lcb))][None, :]])
    noise = rng.normal(0.0, h, size=(len(centres), max(1, s.perturb_per_centre), d))
    perturbed = np.clip(centres[:, None, :] + noise, 0.0, 1.0).reshape(-1, d)
    points = np.vstack([cgp.pool[idx], centres, perturbed])
    values = np.concatenate([cgp._pool_upper[idx], upper_by_hand(cgp, np.vstack([centres, perturbed]))[0]])
    keep = values >= lower
    return (points[keep], values[keep]) if keep.any() else (points, values)


def candidate_configs():
    """(cgp, which) pairs: ties in U on a grid pool (one sample at the centre), a zero-radius corner sample whose
    clipped perturbations tie with l_t, one centre / one perturbation, no perturbation, and near-set variants
    (covering radius given, active pool emptied, noise-free zero-radius samples where x_hat ties with l_t)."""
    def cgp(pool=None, cover=None, seed=2, samples=(((0.5, 0.5), 0.4), ((0.5, 0.5), 0.6)), **settings):
        base = dict(lipschitz=2.0, noise_sd=0.1, pool_size=64)
        out = m.CertificateGuidedPruning(2, m.CGPSettings(**(base | settings)), seed, pool=pool, covering_radius=cover)
        for x, y in samples:
            out.tell(np.array(x), y)
        return out
    grid = m.grid_pool(2, 8)
    corner = (((0.0, 0.0), 1.0), ((0.9, 0.8), 0.2))
    mixed = (((0.2, 0.3), 0.6), ((0.8, 0.7), 0.9), ((0.5, 0.5), 0.75), ((0.8, 0.7), 0.95), ((0.05, 0.9), 0.3))
    emptied = cgp(samples=mixed, perturb_scale=0.3)
    emptied.active[:] = False
    clean = tuple(((x, y), 1.0 - 1.5 * abs(x - 0.3) - abs(y - 0.6)) for x, y in ((0.3, 0.6), (0.8, 0.2), (0.1, 0.9)))
    return [(cgp(pool=grid), "pool"), (cgp(pool=grid, radius_scale=0.0, perturb_scale=3.0, samples=corner), "pool"),
            (cgp(samples=mixed, perturb_centres=1, perturb_per_centre=3), "pool"),
            (cgp(samples=mixed, perturb_centres=3, perturb_per_centre=1), "pool"),
            (cgp(samples=mixed, perturb_centres=0), "pool"),
            (cgp(pool=grid, cover=m.grid_covering_radius(2, 8)), "near"),
            (cgp(pool=grid, cover=0.2, samples=mixed, perturb_centres=1, perturb_per_centre=1), "near"),
            (emptied, "near"),
            (cgp(pool=grid, cover=m.grid_covering_radius(2, 8), noise_sd=0.0, radius_scale=0.0, samples=clean), "near"),
            (isolated_cgp(0.1), "near"), (isolated_cgp(0.01), "near")]


def check_candidates_draw_by_draw() -> None:
    for cgp, which in candidate_configs():
        rng = copy.deepcopy(cgp.rng)
        points, values = cgp._candidates()
        want_points, want_values = (candidates_by_hand if which == "pool" else near_set_by_hand)(cgp, rng)
        assert points.shape == want_points.shape and np.array_equal(points, want_points), which
        assert np.allclose(values, want_values, rtol=0, atol=1e-12), which


def test_candidates_reproduced_draw_by_draw():
    configs = candidate_configs()
    tied = np.sort(-configs[0][0]._pool_upper)
    assert (tied[1:8] == tied[:7]).any()  # non-degenerate: ties in U among the top-8 centres
    check_candidates_draw_by_draw()


@pytest.mark.parametrize("broken", ["unstable_sort", "no_clip_low", "keep_strict"])
def test_negative_control_candidate_variants_are_caught(monkeypatch, broken):
    real, real_argsort, real_clip = m.CertificateGuidedPruning._candidates, np.argsort, np.clip

    def variant(self):
        if broken == "keep_strict":  # a candidate whose U_t equals l_t dropped
            points, values = real(self)
            return points[values > self.lower], values[values > self.lower]
        with monkeypatch.context() as patch:
            if broken == "unstable_sort":
                patch.setattr(np, "argsort", lambda a, kind=None: real_argsort(a, kind="quicksort"))
            else:
                patch.setattr(np, "clip", lambda a, low, high: real_clip(a, None, high))
            return real(self)
    monkeypatch.setattr(m.CertificateGuidedPruning, "_candidates", variant)
    with pytest.raises(CHECK_FAILED):
        check_candidates_draw_by_draw()


def isolated_cgp(cover: float | None = None) -> m.CertificateGuidedPruning:
    """A 1-D grid pool of 4 and zero radii: x = 0.125 (mean 1) is the only pool point with U_t = l_t = 1, the
    others are pruned by the mean-0 samples (U_t = 0 there). The near set at h = 0 is {0.125}, exactly; at
    h = 0.1 (L h = 1) the threshold l_t - L h is exactly 0: every pool point; at h = 0.01 only 0.125 again."""
    cgp = m.CertificateGuidedPruning(1, m.CGPSettings(lipschitz=10.0, noise_sd=0.0, radius_scale=0.0), seed=0,
                                     pool=m.grid_pool(1, 4), covering_radius=cover)
    for x, y in ((0.125, 1.0), (0.375, 0.0), (0.625, 0.0), (0.875, 0.0)):
        cgp.tell(np.array([x]), y)
    return cgp


def check_state_queries() -> None:
    fresh = m.CertificateGuidedPruning(2, m.CGPSettings(lipschitz=2.0, noise_sd=0.1, pool_size=64), seed=1)
    assert fresh.recommend().tolist() == fresh.pool[0].tolist() and fresh.near_fraction(0.1) == 1.0
    assert not fresh.should_stop(math.inf)                       # no sample: never stop, even at an infinite target
    assert fresh.candidate_scale() == pytest.approx(math.sqrt(2) / 2 / 8, rel=1e-15)   # sqrt(d)/2 * 64^(-1/2)
    one = m.CertificateGuidedPruning(2, m.CGPSettings(lipschitz=2.0, noise_sd=0.1, pool_size=64), seed=1)
    one.tell(np.array([0.3, 0.7]), 0.5)
    assert one.recommend().tolist() == [0.3, 0.7] and one.should_stop(one.gap)
    upper, lcb = upper_by_hand(one, one.pool)
    assert one.covered_gap(0.05) == pytest.approx(upper.max() + 2.0 * 0.05 - lcb.max(), abs=1e-12)
    assert one.near_fraction(0.05) == 1.0                         # one sample: U >= mu + c > l_t everywhere
    mixed = m.CertificateGuidedPruning(2, m.CGPSettings(lipschitz=2.0, noise_sd=0.01, pool_size=64), seed=1)
    for x, y in [((0.2, 0.3), 0.6), ((0.8, 0.7), 0.9), ((0.5, 0.5), 0.75), ((0.8, 0.7), 0.95), ((0.05, 0.9), 0.3)]:
        mixed.tell(np.array(x), y)
    queries = np.array([[0.1, 0.1], [0.6, 0.4], [0.9, 0.95]])
    upper, lcb = upper_by_hand(mixed, queries)
    assert np.allclose(mixed.upper(queries), upper, rtol=0, atol=1e-12)
    pool_upper, _ = upper_by_hand(mixed, mixed.pool)
    for h in (0.0, 0.02, 0.1):
        want = np.mean(pool_upper >= lcb.max() - 2.0 * h)
        assert mixed.near_fraction(h) == pytest.approx(want, abs=1e-15)
    assert 0 < mixed.near_fraction(0.0) < mixed.near_fraction(0.1) < 1       # non-degenerate: h moves the set
    # a slack larger than every U_t - l_t: all pool points are near, the gap is max U + L h - l_t
    assert mixed.covered_gap(1.0) == pytest.approx(pool_upper.max() + 2.0 - lcb.max(), abs=1e-12)
    assert mixed.covered_gap(0.0) == pytest.approx(max(0.0, pool_upper.max() - lcb.max()), abs=1e-12)
    given = m.CertificateGuidedPruning(2, m.CGPSettings(lipschitz=2.0, noise_sd=0.1), seed=1,
                                       pool=m.grid_pool(2, 4), covering_radius=0.3)
    assert given.candidate_scale() == 0.3
    isolated = isolated_cgp()
    assert isolated.lower == 1.0 and isolated._pool_upper.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert isolated.covered_gap(0.0) == 0.0 and isolated.near_fraction(0.0) == 0.25
    # pools of one point; the grid's centres in row-major order (the last coordinate fastest)
    assert m.grid_pool(2, 1).tolist() == [[0.5, 0.5]] and m.sobol_pool(2, 1, seed=0).shape == (1, 2)
    assert m.grid_pool(2, 2).tolist() == [[0.25, 0.25], [0.25, 0.75], [0.75, 0.25], [0.75, 0.75]]
    assert m.grid_pool(3, 2)[1].tolist() == [0.25, 0.25, 0.75] and m.grid_pool(3, 2).shape == (8, 3)
    # the probes of the covering-radius estimate come from the seed
    pool = m.grid_pool(2, 3)
    probes = np.random.default_rng(7).random((300, 2))
    want = max(min(math.dist(p, q) for q in pool.tolist()) for p in probes.tolist())
    assert m.covering_radius_estimate(pool, 300, seed=7) == pytest.approx(want, abs=1e-15)


def test_state_queries_on_their_boundaries():
    check_state_queries()


@pytest.mark.parametrize("broken", ["near_fraction_strict", "covered_gap_no_slack", "recommend_first_sample",
                                    "stop_without_samples", "unseeded_probes", "scale_from_one_axis"])
def test_negative_control_state_variants_are_caught(monkeypatch, broken):
    cls = m.CertificateGuidedPruning
    if broken == "near_fraction_strict":
        monkeypatch.setattr(cls, "near_fraction", lambda self, h: 1.0 if self.samples.size == 0 else float(
            np.mean(self._pool_upper > self.lower - self.lipschitz * h)))
    elif broken == "covered_gap_no_slack":
        real = cls.covered_gap
        monkeypatch.setattr(cls, "covered_gap", lambda self, h: real(self, h) - self.lipschitz * h)
    elif broken == "recommend_first_sample":
        real = cls.recommend
        monkeypatch.setattr(cls, "recommend", lambda self: self.pool[1].copy() if self.samples.size == 0
                            else real(self))
    elif broken == "stop_without_samples":
        monkeypatch.setattr(cls, "should_stop", lambda self, target: bool(self.active.any()) and self.gap <= target)
    elif broken == "unseeded_probes":
        real = m.covering_radius_estimate
        monkeypatch.setattr(m, "covering_radius_estimate", lambda pool, n, seed: real(pool, n, seed + 1))
    else:
        monkeypatch.setattr(cls, "candidate_scale", lambda self: self.covering_radius or 0.5 / len(self.pool) ** 0.5)
    with pytest.raises(CHECK_FAILED):
        check_state_queries()


SLOPE_AT_TOLERANCE = 1.0 * (1.0 + m.SLOPE_RTOL)


def test_adaptive_cgp_boundaries():
    settings = m.CGPSettings(lipschitz=1.0, noise_sd=0.0, radius_scale=0.0, pool_size=16)
    with pytest.raises(ValueError, match="initial_lipschitz"):
        m.AdaptiveCGP(1, settings, seed=0, initial_lipschitz=0.0)
    cgp = m.AdaptiveCGP(1, settings, seed=0, initial_lipschitz=1.0)
    cgp.tell(np.array([0.0]), 0.0)
    cgp.tell(np.array([1.0]), SLOPE_AT_TOLERANCE)           # a slope of exactly L (1 + rtol): no doubling
    assert cgp.lipschitz == 1.0 and cgp.doublings == 0
    cgp.tell(np.array([0.5]), 0.6)                            # slope 1.2 > 1: one doubling
    assert cgp.lipschitz == 2.0 and cgp.doubling_steps == [3]


def test_negative_control_adaptive_doubling_at_the_tolerance_is_caught(monkeypatch):
    monkeypatch.setattr(m, "SLOPE_RTOL", 0.0)
    with pytest.raises(AssertionError):
        test_adaptive_cgp_boundaries()


HYBRID_SETTINGS = m.CGPSettings(lipschitz=3.0, noise_sd=0.05, pool_size=64)


def told_hybrid(n: int = 13, **kw) -> m.HybridCGP:
    """A 2-D CGP-Hybrid told n noisy samples of a smooth bump (one point twice: unequal counts), never asked."""
    hybrid = m.HybridCGP(2, HYBRID_SETTINGS, seed=4, check_every=1000, **kw)
    rng = np.random.default_rng(11)
    points = rng.random((n - 1, 2))
    for x in [*points, points[0]]:
        hybrid.tell(x, 1.0 - float(((x - 0.6) ** 2).sum()) + 0.05 * float(rng.standard_normal()))
    return hybrid


def gp_ucb_by_hand(hybrid, candidates, kernel, optimizer):
    means, counts = hybrid.samples.means, hybrid.samples.counts
    alpha = (0.05 / max(float(means.std()), 1e-9)) ** 2 / counts + 1e-8
    gp = GaussianProcessRegressor(kernel, alpha=alpha, normalize_y=True, optimizer=optimizer)
    gp.fit(hybrid.samples.points, means)
    mu, sd = gp.predict(candidates, return_std=True)
    beta = math.sqrt(2 * math.log(64 * hybrid.samples.total**2 * math.pi**2 / (6 * 0.05)))
    return mu + beta * sd, gp


def check_hybrid_gp_ucb() -> None:
    hybrid = told_hybrid()
    candidates = hybrid.pool[::3]
    # first call: fit the kernel from its initial value (length scale 0.2 per axis, nu = 2.5)
    want, gp = gp_ucb_by_hand(hybrid, candidates, ConstantKernel() * Matern(length_scale=np.full(2, 0.2), nu=2.5),
                              "fmin_l_bfgs_b")
    assert np.allclose(hybrid._gp_ucb(candidates), want, rtol=0, atol=1e-9)
    # later calls keep the fitted kernel without re-optimising, except when the sample count is a multiple of 20
    hybrid.tell(np.array([0.55, 0.65]), 0.98)
    want, gp = gp_ucb_by_hand(hybrid, candidates, gp.kernel_, None)
    assert np.allclose(hybrid._gp_ucb(candidates), want, rtol=0, atol=1e-9)
    for x in np.random.default_rng(5).random((6, 2)):
        hybrid.tell(x, 1.0 - float(((x - 0.6) ** 2).sum()))
    assert hybrid.samples.total == 20
    want, gp = gp_ucb_by_hand(hybrid, candidates, gp.kernel_, "fmin_l_bfgs_b")
    assert np.allclose(hybrid._gp_ucb(candidates), want, rtol=0, atol=1e-9)


def test_hybrid_gp_ucb_equals_sklearn_called_by_hand():
    check_hybrid_gp_ucb()


@pytest.mark.parametrize("broken", ["lcb", "always_refit", "no_noise_alpha", "unnormalised"])
def test_negative_control_gp_ucb_variants_are_caught(monkeypatch, broken):
    from sklearn import gaussian_process

    real_ucb, real_gpr = m.HybridCGP._gp_ucb, gaussian_process.GaussianProcessRegressor
    if broken == "lcb":
        monkeypatch.setattr(m.HybridCGP, "_gp_ucb", lambda self, c: (lambda ucb: 2 * self._gp.predict(c) - ucb)(
            real_ucb(self, c)))
    else:
        def gpr(kernel, alpha, normalize_y, optimizer):
            if broken == "always_refit":
                optimizer = "fmin_l_bfgs_b"
            if broken == "no_noise_alpha":
                alpha = 1e-10
            if broken == "unnormalised":
                normalize_y = False
            return real_gpr(kernel, alpha=alpha, normalize_y=normalize_y, optimizer=optimizer)
        monkeypatch.setattr(gaussian_process, "GaussianProcessRegressor", gpr)
    with pytest.raises(CHECK_FAILED):
        check_hybrid_gp_ucb()


def check_hybrid_ask_and_defaults() -> None:
    hybrid = told_hybrid()
    assert (hybrid.local_radius, hybrid.check_every, hybrid.gp_refit_every, hybrid.gp_candidates) == (0.2, 1000, 20,
                                                                                                       512)
    assert hybrid.residual_tol == pytest.approx(0.1, abs=1e-15)                 # 2 sigma
    assert m.HybridCGP(2, HYBRID_SETTINGS, seed=4, residual_tol=0.3).residual_tol == 0.3
    assert m.HybridCGP(2, HYBRID_SETTINGS, seed=4).check_every == 10
    assert np.array_equal(hybrid.pool, m.sobol_pool(2, 64, 4))                 # the seed reaches the pool
    hybrid.switched_at = 13
    active = np.flatnonzero(hybrid.active)
    assert 5 < active.size < 64
    # as many GP candidates as active points: all of them, no draw from the generator
    hybrid.gp_candidates = active.size
    ucb = hybrid._gp_ucb(hybrid.pool[active])
    hybrid._gp = None
    assert hybrid.ask().tolist() == hybrid.pool[active[int(np.argmax(ucb))]].tolist()
    assert hybrid.rng.random() == np.random.default_rng(4).random()
    # fewer: a sample without replacement from the generator
    sampled = told_hybrid(gp_candidates=5)
    sampled.switched_at = 13
    pick = np.random.default_rng(4).choice(np.flatnonzero(sampled.active), 5, replace=False)
    want = sampled.pool[pick[int(np.argmax(told_hybrid()._gp_ucb(sampled.pool[pick])))]]
    assert sampled.ask().tolist() == want.tolist()
    # one active point: the GP proposes it
    single = told_hybrid()
    single.switched_at, single.active[:] = 13, False
    single.active[7] = True
    assert single.ask().tolist() == single.pool[7].tolist()


def test_hybrid_ask_draws_and_defaults():
    check_hybrid_ask_and_defaults()


@pytest.mark.parametrize("broken", ["with_replacement", "always_subsample", "cgp_for_one_point"])
def test_negative_control_hybrid_ask_variants_are_caught(monkeypatch, broken):
    real = m.HybridCGP.ask

    def variant(self):
        active = np.flatnonzero(self.active)
        if self.switched_at is None:
            return real(self)
        if broken == "cgp_for_one_point" and active.size == 1:
            return m.CertificateGuidedPruning.ask(self)
        if broken == "with_replacement" and active.size > self.gp_candidates:
            idx = self.rng.choice(active, self.gp_candidates, replace=True)
            return self.pool[idx[int(np.argmax(self._gp_ucb(self.pool[idx])))]].copy()
        if broken == "always_subsample":
            idx = self.rng.choice(active, min(self.gp_candidates, active.size), replace=False)
            return self.pool[idx[int(np.argmax(self._gp_ucb(self.pool[idx])))]].copy()
        return real(self)
    monkeypatch.setattr(m.HybridCGP, "ask", variant)
    with pytest.raises(CHECK_FAILED):
        check_hybrid_ask_and_defaults()


def smooth_check_hybrid(residual_tol: float) -> m.HybridCGP:
    """Incumbent (0.25, 0.25); 11 samples strictly within 0.5 of it, one at exactly 0.5 (0.75, 0.25), one at 0.7 on
    the negative side (-0.45, 0.25) and one at 0.8 (0.25, 1.05): the local fit uses exactly the first 12."""
    hybrid = m.HybridCGP(2, m.CGPSettings(lipschitz=3.0, noise_sd=0.0, radius_scale=0.0, pool_size=16), seed=0,
                         local_radius=0.5, residual_tol=residual_tol, check_every=1000)
    hybrid.tell(np.array([0.25, 0.25]), 2.0)
    for x in NEAR_POINTS[1:] + FAR_POINTS:
        hybrid.tell(np.array(x), rough(x))
    return hybrid


NEAR_POINTS = [(0.25, 0.25), (0.3, 0.1), (0.1, 0.4), (0.45, 0.35), (0.05, 0.05), (0.4, 0.5), (0.2, 0.6), (0.5, 0.2),
               (0.0, 0.3), (0.35, 0.0), (0.15, 0.15), (0.75, 0.25)]
FAR_POINTS = [(-0.45, 0.25), (0.25, 1.05)]


def rough(x) -> float:
    return 1.0 + math.sin(7 * x[0]) * math.cos(5 * x[1])


def test_hybrid_local_fit_uses_the_closed_ball_and_a_closed_tolerance():
    values = np.array([2.0] + [rough(x) for x in NEAR_POINTS[1:]])
    r = m.quadratic_fit_residual(np.array(NEAR_POINTS), values)
    assert r is not None and r > 0
    assert smooth_check_hybrid(r)._locally_smooth()                        # residual <= tol at equality
    assert not smooth_check_hybrid(math.nextafter(r, 0.0))._locally_smooth()


def test_negative_control_open_ball_is_caught(monkeypatch):
    monkeypatch.setattr(m.HybridCGP, "_locally_smooth", lambda self: (lambda near: (
        lambda res: res is not None and res <= self.residual_tol)(m.quadratic_fit_residual(
            self.samples.points[near], self.samples.means[near])))(
        np.sum((self.samples.points - self.recommend()) ** 2, axis=1) < self.local_radius ** 2))
    with pytest.raises(AssertionError):
        test_hybrid_local_fit_uses_the_closed_ball_and_a_closed_tolerance()


def told_trust_region(face: float = 0.0, **kw) -> m.TrustRegionCGP:
    """Box = the whole cube (side 1 around the incumbent (0.5, 0.5)), with samples on its faces x = 0 and x = 1:
    the steepest pair, (face, 0.5) against the incumbent, sets the local slope."""
    settings = m.CGPSettings(lipschitz=10.0, noise_sd=0.01, pool_size=16)
    tr = m.TrustRegionCGP(2, settings, seed=3, state=m.TrustRegionState(side=1.0, success_tol=50, failure_tol=50),
                          **kw)
    for x, y in (((0.5, 0.5), 1.0), ((0.5, 0.5), 1.0), ((face, 0.5), 0.2), ((1.0 - face, 0.3), 0.6),
                 ((0.6, 0.6), 0.9)):
        tr.tell(np.array(x), y)
    return tr


def tr_ask_by_hand(tr, draws: int) -> tuple[np.ndarray, float, float]:
    from scipy.stats import qmc

    s = tr.settings
    radii = np.array([radius(n, tr.samples.size, s.noise_sd, s.delta) for n in tr.samples.counts])
    points, means = tr.samples.points, tr.samples.means
    centre = points[int(np.argmax(means - radii))]
    low, high = np.clip(centre - tr.state.side / 2, 0, 1), np.clip(centre + tr.state.side / 2, 0, 1)
    local = low + qmc.Sobol(2, scramble=True, seed=tr.seed * 100_003 + draws).random(tr.local_points) * (high - low)
    inside = np.all((points >= low) & (points <= high), axis=1)
    slope = m.empirical_slope(points[inside], means[inside], radii[inside])
    local_l = min(s.lipschitz, max(tr.lipschitz_floor, tr.slope_safety * slope))
    dist = np.sqrt(((local[:, None, :] - points[None, :, :]) ** 2).sum(axis=2))
    values = np.min(means + radii + local_l * dist, axis=1)
    active = values >= np.max(means - radii)
    idx = np.flatnonzero(active) if active.any() else np.arange(len(local))
    return local[idx[int(np.argmax(values[idx]))]], local_l, float(active.mean())


def check_trust_region() -> None:
    fresh = m.TrustRegionCGP(2, m.CGPSettings(lipschitz=10.0, noise_sd=0.01), seed=3)
    assert (fresh.local_points, fresh.local_active_fraction, fresh.local_lipschitz) == (256, 1.0, 10.0)
    for face in (0.0, 1.0):
        tr = told_trust_region(face, local_points=64)
        assert tr.box()[0].tolist() == [0.0, 0.0] and tr.box()[1].tolist() == [1.0, 1.0]
        for draws in (0, 1):
            want_x, want_l, want_fraction = tr_ask_by_hand(tr, draws)
            x = tr.ask()
            assert np.allclose(x, want_x, rtol=0, atol=1e-12)
            assert tr.local_lipschitz == pytest.approx(want_l, abs=1e-12)
            assert tr.local_active_fraction == want_fraction
        assert 2.0 < tr.local_lipschitz < 10.0   # non-degenerate: set by the face sample, not by the floor or L
    # a box of side 0: every local point is the incumbent, whose U_t equals l_t (zero radii): all active
    flat = m.TrustRegionCGP(1, m.CGPSettings(lipschitz=2.0, noise_sd=0.0, radius_scale=0.0), seed=0,
                            state=m.TrustRegionState(side=0.0, min_side=0.0))
    for x, y in ((0.4, 1.0), (0.9, 0.99)):  # consistent with the floor L = 0.1 of the local constant
        flat.tell(np.array([x]), y)
    assert flat.ask().tolist() == [0.4] and flat.local_active_fraction == 1.0
    # recommend: the largest mu - c, not the largest mu + c (0.6 four times beats 0.2 once with a higher mean)
    noisy = m.TrustRegionCGP(1, m.CGPSettings(lipschitz=1.0, noise_sd=0.5), seed=0)
    for x, y in ((0.2, 1.0), (0.6, 0.95), (0.6, 0.85), (0.6, 0.9), (0.6, 0.9)):
        noisy.tell(np.array([x]), y)
    assert noisy.recommend().tolist() == [0.6]
    # the improvement rule at its threshold: best + 1e-3 max(1, |best|), strictly
    for best, y, improved in ((2.0, 2.0 + 1e-3 * 2.0, False), (0.5, 0.5015, True), (0.5, 0.501, False)):
        rule = m.TrustRegionCGP(1, m.CGPSettings(lipschitz=1.0, noise_sd=0.0), seed=0,
                                state=m.TrustRegionState(success_tol=50, failure_tol=50))
        rule.tell(np.array([0.1]), best)
        rule.tell(np.array([0.2]), y)
        assert (rule.state.successes, rule.state.failures) == ((2, 0) if improved else (0, 1)), (best, y)


def test_trust_region_ask_reproduced_and_its_thresholds():
    check_trust_region()


@pytest.mark.parametrize("broken", ["open_box", "lcb_envelope", "same_draws", "non_strict_improvement"])
def test_negative_control_trust_region_variants_are_caught(monkeypatch, broken):
    real_ask, real_tell, real_slope = m.TrustRegionCGP.ask, m.TrustRegionCGP.tell, m.empirical_slope
    if broken == "open_box":
        monkeypatch.setattr(m, "empirical_slope", lambda p, mu, c: real_slope(
            p[(p > 0).all(axis=1) & (p < 1).all(axis=1)], mu[(p > 0).all(axis=1) & (p < 1).all(axis=1)],
            c[(p > 0).all(axis=1) & (p < 1).all(axis=1)]))
    elif broken == "lcb_envelope":
        real_env = m.upper_envelope
        monkeypatch.setattr(m, "upper_envelope", lambda d, opt, lip: real_env(d, opt - 0.2, lip))
    elif broken == "same_draws":
        def same(self):
            self._draws = 0
            return real_ask(self)
        monkeypatch.setattr(m.TrustRegionCGP, "ask", same)
    else:
        def non_strict(self, x, y):
            if np.isfinite(self._best) and y == self._best + 1e-3 * max(1.0, abs(self._best)):
                y = math.nextafter(y, math.inf)
            return real_tell(self, x, y)
        monkeypatch.setattr(m.TrustRegionCGP, "tell", non_strict)
    with pytest.raises(CHECK_FAILED):
        check_trust_region()


def test_trust_region_state_resets_its_counters_and_keeps_the_minimum_side():
    state = m.TrustRegionState(side=0.2, success_tol=2, failure_tol=1, min_side=0.1, initial_side=0.8)
    for improved in (True, True, True):
        state.update(improved)
    assert state.side == 0.4 and state.successes == 1  # doubled once, the count restarted at 0 after it
    state.update(False)
    state.update(False)
    assert state.side == 0.1 and state.restarts == 0   # exactly min_side: kept, no restart
    state.update(False)
    assert state.side == 0.8 and state.restarts == 1


def test_negative_control_trust_region_state_variants_are_caught(monkeypatch):
    real = m.TrustRegionState.update

    def restart_at_the_minimum(self, improved):
        real(self, improved)
        if self.side <= self.min_side:
            self.side, self.restarts = self.initial_side, self.restarts + 1
    monkeypatch.setattr(m.TrustRegionState, "update", restart_at_the_minimum)
    with pytest.raises(AssertionError):
        test_trust_region_state_resets_its_counters_and_keeps_the_minimum_side()


def bump(x: np.ndarray) -> float:
    return float(1.0 - abs(x[0] - 0.3) - 0.5 * abs(x[1] - 0.1))


def maximize_by_hand(objective, bounds, budget, lipschitz, noise_sd, seed, target_gap, per_axis, **settings):
    low = np.array([float(b[0]) for b in bounds])
    high = np.array([float(b[1]) for b in bounds])
    s = m.CGPSettings(lipschitz * float(np.max(high - low)), noise_sd, **settings)
    cover = math.sqrt(len(low)) / (2 * per_axis)
    opt = m.CertificateGuidedPruning(len(low), s, seed, pool=m.grid_pool(len(low), per_axis), covering_radius=cover)
    gaps, stopped = [], False
    for _ in range(budget):
        u = opt.ask()
        opt.tell(u, float(objective(low + u * (high - low))))
        gaps.append(opt.covered_gap(cover))
        if target_gap is not None and gaps[-1] <= target_gap:
            stopped = True
            break
    result = (low + opt.recommend() * (high - low), opt.lower, opt.covered_gap(cover), opt.samples.total, stopped)
    return result, gaps


def same_result(got: m.OptimizationResult, want: tuple) -> bool:
    return (np.array_equal(got.x, want[0]) and got.lower_certificate == want[1] and got.gap == want[2]
            and got.evaluations == want[3] and got.stopped_early is want[4])


def check_drivers() -> None:
    bounds = [(-1.0, 1.0), (0.0, 0.5)]
    want, gaps = maximize_by_hand(bump, bounds, 12, 2.0, 0.01, 0, None, 6, pool_size=36)
    assert same_result(m.maximize(bump, bounds, 12, 2.0, 0.01, pool_size=36), want)
    small, _ = maximize_by_hand(bump, bounds, 6, 2.0, 0.01, 0, None, 2, pool_size=4)
    assert same_result(m.maximize(bump, bounds, 6, 2.0, 0.01, pool_size=4), small)
    f32 = [(np.float32(0.1), np.float32(1.3)), (np.float32(-0.7), np.float32(0.2))]
    want32, _ = maximize_by_hand(bump, f32, 8, 2.0, 0.01, 0, None, 6, pool_size=36)
    assert same_result(m.maximize(bump, f32, 8, 2.0, 0.01, pool_size=36), want32)
    # a target equal to the covered gap reached at step k stops there (<=), with the gap of that step
    k = next(i for i in range(1, len(gaps) - 1) if gaps[i] < min(gaps[:i]))
    stop, _ = maximize_by_hand(bump, bounds, 12, 2.0, 0.01, 0, gaps[k], 6, pool_size=36)
    assert stop[3] == k + 1 and stop[4] is True
    assert same_result(m.maximize(bump, bounds, 12, 2.0, 0.01, target_gap=gaps[k], pool_size=36), stop)
    # minimize = maximize of -f, seed 0 and the settings passed through
    neg, _ = maximize_by_hand(lambda x: -bump(x), bounds, 10, 2.0, 0.01, 0, None, 6, pool_size=36)
    assert same_result(m.minimize(lambda x: -bump(x) * -1 * -1, bounds, 10, 2.0, 0.01, pool_size=36),
                       maximize_by_hand(lambda x: bump(x), bounds, 10, 2.0, 0.01, 0, None, 6, pool_size=36)[0])
    assert neg[3] == 10


def test_maximize_and_minimize_follow_their_loop_written_out():
    check_drivers()


@pytest.mark.parametrize("broken", ["seed_1", "strict_target", "float32_box", "sobol_pool"])
def test_negative_control_driver_variants_are_caught(monkeypatch, broken):
    real = m.maximize

    def variant(objective, bounds, budget, lipschitz, noise_sd, seed=0, target_gap=None, **settings):
        if broken == "seed_1":
            seed = seed + 1
        if broken == "strict_target" and target_gap is not None:
            target_gap = math.nextafter(target_gap, -math.inf)
        if broken == "float32_box" and isinstance(bounds[0][0], np.float32):   # the box's sides in float32
            bounds = [(float(a), float(a) + float(np.float32(b) - np.float32(a))) for a, b in bounds]
        if broken == "sobol_pool":
            settings = dict(settings, pool_size=16)
        return real(objective, bounds, budget, lipschitz, noise_sd, seed, target_gap, **settings)
    monkeypatch.setattr(m, "maximize", variant)
    with pytest.raises(CHECK_FAILED):
        check_drivers()


def check_constructor_and_store() -> None:
    for delta in (0.0, 1.0):
        with pytest.raises(ValueError, match="delta"):
            m.CGPSettings(lipschitz=1.0, noise_sd=0.1, delta=delta)
    settings = m.CGPSettings(lipschitz=1.0, noise_sd=0.1, pool_size=16)
    with pytest.raises(ValueError, match="covering_radius"):
        m.CertificateGuidedPruning(2, settings, seed=0, pool=m.grid_pool(2, 4), covering_radius=0.0)
    with pytest.raises(ValueError, match="pool must have shape"):
        m.CertificateGuidedPruning(2, settings, seed=0, pool=m.grid_pool(3, 2))
    cgp = m.CertificateGuidedPruning(2, settings, seed=5, pool=m.grid_pool(2, 4).astype(np.float32))
    assert cgp.pool.dtype == np.float64 and np.array_equal(cgp.pool, m.grid_pool(2, 4))
    assert cgp.unintersected_fraction == 1.0                     # no sample: U = +inf everywhere
    assert cgp.rng.random() == np.random.default_rng(5).random()
    # a pool point with U_t exactly l_t stays active (A_t = {U_t >= l_t})
    assert isolated_cgp().active.tolist() == [True, False, False, False]
    # a re-query given as integers is the same point as its float copy
    store = m.SampleStore(dim=1)
    store.add(np.array([1]), 2.0)
    store.add(np.array([1.0]), 4.0)
    assert store.size == 1 and store.means.tolist() == [3.0]


def test_constructor_checks_pool_dtype_seed_and_store_keys():
    check_constructor_and_store()


@pytest.mark.parametrize("broken", ["strict_prune", "int_keys", "unseeded"])
def test_negative_control_constructor_variants_are_caught(monkeypatch, broken):
    if broken == "strict_prune":
        def strict(self):
            self._pool_upper = m.upper_envelope(self._pool_distances.matrix, self.samples.means + self.radii,
                                                self.lipschitz)
            self.active &= self._pool_upper > self.lower
        monkeypatch.setattr(m.CertificateGuidedPruning, "_prune", strict)
    elif broken == "int_keys":
        def raw_keys(self, x, y):  # the key from the bytes as given
            key = np.asarray(x).tobytes()
            i = self._index.get(key)
            if i is None:
                i = self.size
                self._points[i], self._index[key] = x, i
                self.size += 1
            self._counts[i] += 1
            self._sums[i] += y
            self.total += 1
            return i, False
        monkeypatch.setattr(m.SampleStore, "add", raw_keys)
    else:
        real_init = m.CertificateGuidedPruning.__init__

        def unseeded(self, *args, **kw):
            real_init(self, *args, **kw)
            self.rng = np.random.default_rng()
        monkeypatch.setattr(m.CertificateGuidedPruning, "__init__", unseeded)
    with pytest.raises(CHECK_FAILED):
        check_constructor_and_store()
