"""Synthetic UK-Biobank-like cohort with known ground truth (the cpu and smoke profiles' data). [project design]

Every subject has a latent deprivation D ~ N(0, 1) that drives 8 SDoH codes (ICD-10 Z55, Z56, Z59, Z60, Z63, Z72,
V transport, W falls; onset at a uniform age before the baseline visit) and the organ health
z = rho D + sqrt(1 - rho^2) N(0, I_4) (cardiometabolic, neuro, hepatic, renal). Diseases (each at most once) and
death follow piecewise-constant competing hazards on a grid of ``dt`` years,

    log h_k(t) = a_k + b_k (age - 60) + beta_k z_organ(k) + sex_k male + sum_j gamma_jk s_j(t) + sum_{m in hist} W_mk,

with W strictly upper triangular (a DAG over codes) and gamma non-zero only for the ``linked`` codes (both
signs). Common random numbers: one uniform per subject x code x grid step, drawn in the same order in every
re-simulation, decides the event (u < 1 - exp(-h dt)) and its position inside the step (u / p), so the true
counterfactual of an SDoH edit is the same subject re-simulated with the edit and the same uniforms.

The intervention of the experiment is "SDoH code j present from the baseline visit on" for subjects who did
not have it; its true effect on code k is the change in the 10-year incidence after baseline. Imaging at the
baseline visit: brain / heart / liver / kidney subsets in UKB's ratios (44,834 / 23,987 / 28,722 / 32,155 of
~100k imaged), tabular traits with Student-t noise, and brain connectivity on the SPD manifold with a geodesic
follow-up C2 = C1^1/2 expm(dt G(z, D) + noise) C1^1/2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SDOH_CODES = ("Z55", "Z56", "Z59", "Z60", "Z63", "Z72", "V_transport", "W_falls")
ORGAN_AXES = ("cardio", "neuro", "hepatic", "renal")
IMAGING_SHARE = {"brain": 0.45, "heart": 0.24, "liver": 0.29, "kidney": 0.32}
TRAIT_DIMS = {"heart": 8, "liver": 3, "kidney": 4}
TRAIT_AXIS = {"heart": 0, "liver": 2, "kidney": 3}
START_AGE = 40.0
PAD_EVERY = 5.0


@dataclass(frozen=True)
class CohortLaw:
    """The generator's parameters (drawn once per seed by ``draw_law``): the ground truth the models must learn."""

    a: np.ndarray          # (K,) log-hazard at 60
    b: np.ndarray          # (K,) age slope
    beta: np.ndarray       # (K,) organ effect
    organ: np.ndarray      # (K,) organ axis of each code
    sex: np.ndarray        # (K,) male effect
    gamma: np.ndarray      # (J, K) SDoH effects (non-zero only on linked codes)
    w: np.ndarray          # (K, K) history effects, strictly upper triangular
    sdoh_intercept: np.ndarray  # (J,) logit prevalence at D = 0
    sdoh_slope: float
    rho: float
    linked: np.ndarray     # (K,) bool: gamma_k != 0

    @property
    def n_codes(self) -> int:
        return int(self.a.shape[0])

    @property
    def n_sdoh(self) -> int:
        return int(self.gamma.shape[0])


def draw_law(rng: np.random.Generator, n_codes: int, n_linked: int, sdoh_effect: float, rho: float,
             death_independent_of_sdoh: bool = True) -> CohortLaw:
    """Random but fixed-per-seed parameters. The last code is death. ``n_linked`` disease codes get 1-2 SDoH
    effects of size ``sdoh_effect`` x U(0.7, 1.3), a third of them negative; death (and, when
    ``death_independent_of_sdoh``, every W entry from a linked code into death) gets none."""
    k = n_codes
    a = np.log(rng.uniform(0.003, 0.012, k))
    a[-1] = np.log(0.006)
    b = rng.uniform(0.04, 0.08, k)
    b[-1] = 0.09
    organ = rng.integers(0, len(ORGAN_AXES), k)
    beta = rng.uniform(0.3, 0.7, k)
    sex = rng.normal(0.0, 0.2, k)
    j = len(SDOH_CODES)
    linked = np.zeros(k, dtype=bool)
    linked[rng.choice(k - 1, size=n_linked, replace=False)] = True
    gamma = np.zeros((j, k))
    for code in np.flatnonzero(linked):
        sources = rng.choice(j, size=rng.integers(1, 3), replace=False)
        sign = -1.0 if rng.random() < 1 / 3 else 1.0
        gamma[sources, code] = sign * sdoh_effect * rng.uniform(0.7, 1.3, len(sources))
    w = np.triu(rng.uniform(0.3, 0.8, (k, k)) * (rng.random((k, k)) < 0.1), 1)
    if death_independent_of_sdoh:
        w[linked, -1] = 0.0
    prevalence = rng.uniform(0.05, 0.15, j)
    return CohortLaw(a=a, b=b, beta=beta, organ=organ, sex=sex, gamma=gamma, w=w,
                     sdoh_intercept=np.log(prevalence / (1 - prevalence)), sdoh_slope=0.8, rho=rho, linked=linked)


@dataclass(frozen=True)
class Subjects:
    """Baseline characteristics drawn before any event."""

    male: np.ndarray        # (N,) bool
    baseline: np.ndarray    # (N,) age at the baseline (imaging) visit
    deprivation: np.ndarray  # (N,) latent D
    z: np.ndarray           # (N, 4) organ health
    sdoh_onset: np.ndarray  # (N, J) onset age, NaN if absent


def draw_subjects(rng: np.random.Generator, law: CohortLaw, n: int, baseline_low: float, baseline_high: float
                  ) -> Subjects:
    male = rng.random(n) < 0.45
    baseline = rng.uniform(baseline_low, baseline_high, n)
    dep = rng.standard_normal(n)
    z = law.rho * dep[:, None] + np.sqrt(1 - law.rho**2) * rng.standard_normal((n, len(ORGAN_AXES)))
    logit = law.sdoh_intercept[None, :] + law.sdoh_slope * dep[:, None]
    has = rng.random((n, law.n_sdoh)) < 1 / (1 + np.exp(-logit))
    onset = START_AGE + rng.random((n, law.n_sdoh)) * (baseline[:, None] - START_AGE)
    return Subjects(male=male, baseline=baseline, deprivation=dep, z=z, sdoh_onset=np.where(has, onset, np.nan))


def log_hazard(law: CohortLaw, subjects: Subjects, age: np.ndarray, sdoh_active: np.ndarray, had: np.ndarray
               ) -> np.ndarray:
    """log h_k for every subject (N, K) at ``age`` (N,) given active SDoH (N, J) and disease history (N, K)."""
    return (law.a[None, :] + law.b[None, :] * (age[:, None] - 60.0)
            + law.beta[None, :] * subjects.z[:, law.organ] + law.sex[None, :] * subjects.male[:, None]
            + sdoh_active.astype(float) @ law.gamma + had.astype(float) @ law.w)


def simulate(law: CohortLaw, subjects: Subjects, stream_seed: int, follow_up: float, dt: float,
             insert_sdoh_at_baseline: int | None = None, rows: np.ndarray | None = None) -> np.ndarray:
    """Event ages (N, K), NaN where the code never occurred before the end of follow-up (baseline + follow_up) or
    death. ``insert_sdoh_at_baseline = j`` re-simulates with SDoH j active from the baseline visit on (for
    subjects without an earlier onset); the same ``stream_seed`` gives the same uniforms (common random numbers).
    ``rows`` (bool mask) simulates only those subjects, still drawing every subject's uniforms, so a subject's
    trajectory does not depend on which others are simulated; the result has one row per selected subject.
    """
    n_all, k = subjects.z.shape[0], law.n_codes
    keep = np.ones(n_all, dtype=bool) if rows is None else np.asarray(rows, dtype=bool)
    subjects = Subjects(**{f: getattr(subjects, f)[keep] for f in subjects.__dataclass_fields__})
    n = subjects.z.shape[0]
    end = subjects.baseline + follow_up
    n_steps = int(np.ceil((end.max() - START_AGE) / dt))
    rng = np.random.default_rng(stream_seed)
    had = np.zeros((n, k), dtype=bool)
    alive = np.ones(n, dtype=bool)
    ages = np.full((n, k), np.nan)
    onset = subjects.sdoh_onset.copy()
    if insert_sdoh_at_baseline is not None:
        j = insert_sdoh_at_baseline
        onset[:, j] = np.where(np.isnan(onset[:, j]), subjects.baseline, onset[:, j])
    # log h = static + b (age - 60) + SDoH term + history term; the last two are updated only where something
    # changed (row-wise adds instead of per-step matrix products, which dominate the cost under BLAS contention)
    static = (law.a[None, :] + law.beta[None, :] * subjects.z[:, law.organ]
              + law.sex[None, :] * subjects.male[:, None])
    sdoh_term = np.zeros((n, k))
    hist_term = np.zeros((n, k))
    active = np.zeros(onset.shape, dtype=bool)
    for step in range(n_steps):
        age = START_AGE + step * dt
        u = rng.random((n_all, k))[keep]
        now_active = onset <= age  # NaN compares False
        for j in np.flatnonzero((now_active & ~active).any(axis=0)):
            sdoh_term += (now_active[:, j] & ~active[:, j])[:, None] * law.gamma[j][None, :]
        active = now_active
        p = -np.expm1(-np.exp(static + law.b[None, :] * (age - 60.0) + sdoh_term + hist_term) * dt)
        event = (u < p) & ~had & alive[:, None] & (age < end)[:, None]
        ages = np.where(event, age + dt * u / np.where(p > 0, p, 1.0), ages)
        for m in np.flatnonzero(event.any(axis=0)):
            hist_term += event[:, m][:, None] * law.w[m][None, :]
        had |= event
        alive &= ~event[:, -1]
    ages = np.where(ages <= end[:, None], ages, np.nan)
    return ages


def incidence_after_baseline(event_ages: np.ndarray, baseline: np.ndarray, horizon: float) -> np.ndarray:
    """(N, K) indicator: the code occurs in (baseline, baseline + horizon]."""
    return (event_ages > baseline[:, None]) & (event_ages <= baseline[:, None] + horizon)


def true_intervention_effects(law: CohortLaw, subjects: Subjects, factual: np.ndarray, stream_seed: int,
                              follow_up: float, dt: float, horizon: float, rows: np.ndarray
                              ) -> np.ndarray:
    """True delta incidence (J, K): for each SDoH code j, the mean over ``rows`` subjects without j at baseline of
    the change in the ``horizon``-year incidence of each code when j is active from baseline on."""
    out = np.zeros((law.n_sdoh, law.n_codes))
    base_inc = incidence_after_baseline(factual, subjects.baseline, horizon)
    for j in range(law.n_sdoh):
        group = rows & np.isnan(subjects.sdoh_onset[:, j])
        cf = simulate(law, subjects, stream_seed, follow_up, dt, insert_sdoh_at_baseline=j, rows=group)
        cf_inc = incidence_after_baseline(cf, subjects.baseline[group], horizon)
        out[j] = (cf_inc.astype(float) - base_inc[group].astype(float)).mean(axis=0)
    return out


def imaging_masks(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {organ: rng.random(n) < share for organ, share in IMAGING_SHARE.items()}


def tabular_traits(rng: np.random.Generator, subjects: Subjects, organ: str) -> np.ndarray:
    """Nonlinear traits of one organ from (age, sex, its organ axis, D) with Student-t (df 5) noise."""
    dim = TRAIT_DIMS[organ]
    mix = np.random.default_rng(1000 + dim).normal(0, 1, (4, dim))  # fixed per organ
    zo = subjects.z[:, TRAIT_AXIS[organ]]
    age = (subjects.baseline - 60.0) / 10.0
    feats = np.stack([zo, np.tanh(zo) * age, age, subjects.male - 0.45 + 0.3 * np.sin(zo)], axis=1)
    return feats @ mix + 0.3 * rng.standard_t(5, (subjects.z.shape[0], dim))


def _random_symmetric(rng: np.random.Generator, n: int, count: int) -> np.ndarray:
    raw = rng.standard_normal((count, n, n))
    mats = (raw + raw.transpose(0, 2, 1)) / 2
    return mats / np.linalg.norm(mats, axis=(1, 2), keepdims=True)


def _sym_apply(mats: np.ndarray, fn) -> np.ndarray:
    vals, vecs = np.linalg.eigh(mats)
    return (vecs * fn(vals)[..., None, :]) @ np.swapaxes(vecs, -1, -2)


def brain_connectivity(rng: np.random.Generator, subjects: Subjects, n_roi: int, eig_low: float,
                       step_scale: float, noise: float, follow_share: float
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Baseline C1 = B^1/2 expm(sum_m f_m U_m + noise) B^1/2 with B's eigenvalues log-spaced on [eig_low, 3], and a
    follow-up C2 = C1^1/2 expm(dt G + noise) C1^1/2, G = sum_m g_m(z_neuro, D, age) V_m, after dt ~ U(2, 5) years
    for a ``follow_share`` of subjects. Returns C1, C2 (NaN without follow-up), dt (NaN) and the follow-up mask."""
    n = subjects.z.shape[0]
    law_rng = np.random.default_rng(7)  # the population structure is fixed across seeds
    q, _ = np.linalg.qr(law_rng.standard_normal((n_roi, n_roi)))
    base = (q * np.geomspace(eig_low, 3.0, n_roi)) @ q.T
    u_basis = _random_symmetric(law_rng, n_roi, 4)
    v_basis = _random_symmetric(law_rng, n_roi, 3)
    zn = subjects.z[:, 1]
    dep = subjects.deprivation
    age = (subjects.baseline - 60.0) / 10.0
    f = np.stack([zn, dep * 0.5, age, np.tanh(zn + dep)], axis=1) * 0.8
    eta = np.einsum("nm,mij->nij", f, u_basis) + noise * _random_symmetric(rng, n_roi, n)
    base_half = _sym_apply(base, np.sqrt)
    c1 = base_half @ _sym_apply(eta, np.exp) @ base_half
    c1 = (c1 + np.swapaxes(c1, 1, 2)) / 2
    g = np.stack([np.tanh(zn), 0.7 * dep, 0.5 * age + 0.3 * zn * dep], axis=1) * step_scale
    gen = np.einsum("nm,mij->nij", g, v_basis)
    follow = rng.random(n) < follow_share
    dt = rng.uniform(2.0, 5.0, n)
    step = dt[:, None, None] * gen + noise * 0.5 * _random_symmetric(rng, n_roi, n)
    c1_half = _sym_apply(c1, np.sqrt)
    c2 = c1_half @ _sym_apply(step, np.exp) @ c1_half
    c2 = (c2 + np.swapaxes(c2, 1, 2)) / 2
    c2[~follow] = np.nan
    return c1, c2, np.where(follow, dt, np.nan), follow
