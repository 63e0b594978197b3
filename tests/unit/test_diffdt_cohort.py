"""The synthetic cohort's ground truth: common random numbers, exact zero effects where the law has none, the
imaging ratios and the SPD structure of the connectivity (tasks/diffdt/cohort.py)."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.diffdt import cohort


def small_world(seed: int = 0, n: int = 600):
    rng = np.random.default_rng(seed)
    law = cohort.draw_law(rng, n_codes=10, n_linked=4, sdoh_effect=1.5, rho=0.5, death_independent_of_sdoh=True)
    subjects = cohort.draw_subjects(rng, law, n, 50.0, 70.0)
    return law, subjects


def sdoh_descendants(law: cohort.CohortLaw) -> np.ndarray:
    """Codes with a direct SDoH effect or an ancestor (through W) that has one."""
    reach = law.linked.copy()
    for k in range(law.n_codes):  # W is upper triangular: ancestors come first
        reach[k] |= bool((reach[:k] & (law.w[:k, k] != 0)).any())
    return reach


def crn_checks(law, subjects) -> tuple[bool, bool]:
    factual = cohort.simulate(law, subjects, 11, 10.0, 0.5)
    again = cohort.simulate(law, subjects, 11, 10.0, 0.5)
    identical = np.array_equal(factual, again, equal_nan=True)
    effects = cohort.true_intervention_effects(law, subjects, factual, 11, 10.0, 0.5, 10.0,
                                               np.ones(subjects.z.shape[0], dtype=bool))
    unaffected = ~sdoh_descendants(law)
    return identical, bool(unaffected.any()) and bool(np.all(effects[:, unaffected] == 0.0))


def test_common_random_numbers_identities():
    law, subjects = small_world()
    assert law.w[law.linked, -1].sum() == 0 and law.gamma[:, -1].sum() == 0  # death independent of SDoH
    identical, zero_where_no_path = crn_checks(law, subjects)
    assert identical and zero_where_no_path
    # and the edit does move the linked codes
    factual = cohort.simulate(law, subjects, 11, 10.0, 0.5)
    effects = cohort.true_intervention_effects(law, subjects, factual, 11, 10.0, 0.5, 10.0,
                                               np.ones(subjects.z.shape[0], dtype=bool))
    assert np.abs(effects[:, law.linked]).max() > 0.02


def test_negative_control_fresh_random_numbers_break_the_identities(monkeypatch):
    law, subjects = small_world()
    original = cohort.simulate
    calls = iter(range(1000))

    def fresh_stream(law, subjects, stream_seed, *args, **kwargs):
        return original(law, subjects, stream_seed + next(calls), *args, **kwargs)

    monkeypatch.setattr(cohort, "simulate", fresh_stream)
    assert crn_checks(law, subjects) == (False, False)


def test_row_subset_keeps_each_subjects_trajectory():
    law, subjects = small_world(1, 300)
    full = cohort.simulate(law, subjects, 5, 10.0, 0.5)
    rows = np.arange(300) % 3 == 0
    part = cohort.simulate(law, subjects, 5, 10.0, 0.5, rows=rows)
    assert np.array_equal(full[rows], part, equal_nan=True)


def test_events_respect_the_law():
    law, subjects = small_world(2, 2000)
    ages = cohort.simulate(law, subjects, 3, 10.0, 0.5)
    end = subjects.baseline + 10.0
    finite = np.isfinite(ages)
    assert np.all(ages[finite] >= cohort.START_AGE) and np.all((ages <= end[:, None])[finite])
    death = ages[:, -1]
    dead = np.isfinite(death)
    assert np.all(~(ages[dead] > death[dead, None] + 0.5))  # nothing after the death step
    # an SDoH-linked code with a positive effect is more frequent among carriers of its SDoH code
    j, k = np.argwhere(law.gamma > 0)[0]
    carriers = np.isfinite(subjects.sdoh_onset[:, j])
    assert np.isfinite(ages[carriers, k]).mean() > np.isfinite(ages[~carriers, k]).mean()


def test_log_hazard_exact():
    law, subjects = small_world(3, 5)
    age = np.full(5, 62.0)
    active = np.zeros((5, law.n_sdoh), dtype=bool)
    active[0, 2] = True
    had = np.zeros((5, law.n_codes), dtype=bool)
    had[0, 1] = True
    out = cohort.log_hazard(law, subjects, age, active, had)
    k = 7
    expected = (law.a[k] + law.b[k] * 2.0 + law.beta[k] * subjects.z[0, law.organ[k]] + law.sex[k] * subjects.male[0]
                + law.gamma[2, k] + law.w[1, k])
    assert out[0, k] == pytest.approx(expected, abs=1e-12)


def test_law_structure():
    law, subjects = small_world(4, 20000)
    assert np.allclose(np.tril(law.w), 0) and not law.linked[-1]
    assert law.linked.sum() == 4 and np.all((law.gamma != 0).any(axis=0) == law.linked)
    prevalence = np.isfinite(subjects.sdoh_onset).mean(axis=0)
    assert np.all((prevalence > 0.03) & (prevalence < 0.25))
    onset = subjects.sdoh_onset[np.isfinite(subjects.sdoh_onset)]
    assert onset.min() >= cohort.START_AGE
    shares = {o: m.mean() for o, m in cohort.imaging_masks(np.random.default_rng(0), 20000).items()}
    assert all(abs(shares[o] - cohort.IMAGING_SHARE[o]) < 0.02 for o in shares)


def test_brain_connectivity_is_spd_and_geodesic():
    law, subjects = small_world(5, 200)
    c1, c2, dt, follow = cohort.brain_connectivity(np.random.default_rng(0), subjects, 8, 0.03, 0.15, 0.1, 0.5)
    assert np.all(np.linalg.eigvalsh(c1)[:, 0] > 0)
    assert np.all(np.linalg.eigvalsh(c2[follow])[:, 0] > 0) and np.all(np.isnan(c2[~follow]))
    assert np.all((dt[follow] >= 2) & (dt[follow] <= 5)) and 0.3 < follow.mean() < 0.7
    # the Euclidean increment is small next to C1 but C1 is ill-conditioned: eigenvalues spread over two decades
    eig = np.linalg.eigvalsh(c1)
    assert np.median(eig[:, -1] / eig[:, 0]) > 20
