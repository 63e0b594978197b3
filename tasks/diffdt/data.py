"""Data of diffdt: one synthetic UKB-like cohort per seed (tasks/diffdt/cohort.py), or local UKB extracts.

Per seed ``subjects_seed<N>.parquet`` (one row per participant: split, sex, baseline age, SDoH onset ages, disease
event ages, imaging flags and traits, baseline and follow-up connectivity, the true log-hazards at baseline) and,
for the synthetic cohort, ``effects_seed<N>.parquet`` (the true change in 10-year incidence of every code when
each SDoH code is present from baseline on, from common-random-number re-simulation) and ``law_seed<N>.parquet``
(which codes carry a direct SDoH effect).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.io import write_parquet
from tasks.diffdt import cohort
from tasks.diffdt.config import CohortConfig, DiffdtConfig

ORGANS = ("brain", "heart", "liver", "kidney")


def upper(mats: np.ndarray) -> np.ndarray:
    """Plain upper triangle (diagonal included, no scaling) of (..., n, n) matrices: the storage layout."""
    rows, cols = np.triu_indices(mats.shape[-1])
    return mats[..., rows, cols]


def from_upper(values: np.ndarray, n: int) -> np.ndarray:
    rows, cols = np.triu_indices(n)
    out = np.zeros((*values.shape[:-1], n, n))
    out[..., rows, cols] = values
    out[..., cols, rows] = values
    return out


def synthetic_cohort(cfg: CohortConfig, seed: int, intervention_horizon: float
                     ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Subjects, true intervention effects and the law's linked codes of one seed. Subjects who die before their
    baseline visit are never recruited (dropped), as in UKB."""
    rng = np.random.default_rng(seed)
    law = cohort.draw_law(rng, cfg.n_codes, cfg.n_linked, cfg.sdoh_effect, cfg.rho)
    subjects = cohort.draw_subjects(rng, law, cfg.n_subjects, cfg.baseline_low, cfg.baseline_high)
    stream = seed * 7919 + 17
    ages = cohort.simulate(law, subjects, stream, cfg.follow_up, cfg.dt)
    recruited = ~(ages[:, -1] <= subjects.baseline)
    test = recruited & (rng.random(cfg.n_subjects) < cfg.test_share)
    effects = cohort.true_intervention_effects(law, subjects, ages, stream, cfg.follow_up, cfg.dt,
                                               intervention_horizon, test)
    before = ages <= subjects.baseline[:, None]
    active = subjects.sdoh_onset <= subjects.baseline[:, None]
    oracle = cohort.log_hazard(law, subjects, subjects.baseline, active, before)
    # what a model of the event record can know at best: the true hazard without the unobserved organ axes z,
    # with and without the SDoH codes (the headroom of SDoH tokens, claims C2a / C6)
    unseen = cohort.Subjects(subjects.male, subjects.baseline, subjects.deprivation, np.zeros_like(subjects.z),
                             subjects.sdoh_onset)
    oracle_record = cohort.log_hazard(law, unseen, subjects.baseline, active, before)
    oracle_history = cohort.log_hazard(law, unseen, subjects.baseline, np.zeros_like(active), before)
    imaged = cohort.imaging_masks(rng, cfg.n_subjects)
    traits = {o: cohort.tabular_traits(rng, subjects, o) for o in cohort.TRAIT_DIMS}
    c1, c2, brain_dt, follow = cohort.brain_connectivity(rng, subjects, cfg.n_roi, cfg.eig_low,
                                                         cfg.brain_step_scale, cfg.brain_noise, cfg.follow_share)
    follow &= imaged["brain"]
    columns = {
        "eid": np.arange(cfg.n_subjects), "split": np.where(test, "test", "train"), "male": subjects.male,
        "baseline": subjects.baseline, "deprivation": subjects.deprivation, "z": subjects.z.tolist(),
        "sdoh_onset": subjects.sdoh_onset.tolist(), "event_age": ages.tolist(), "oracle_log_hazard": oracle.tolist(),
        "oracle_record_log_hazard": oracle_record.tolist(), "oracle_history_log_hazard": oracle_history.tolist(),
        **{f"imaged_{o}": imaged[o] for o in ORGANS},
        **{f"traits_{o}": traits[o].tolist() for o in traits},
        "brain_c1": upper(c1).tolist(), "brain_c2": upper(np.where(follow[:, None, None], c2, np.nan)).tolist(),
        "brain_dt": np.where(follow, brain_dt, np.nan), "brain_follow": follow}
    subjects_frame = pl.DataFrame(columns).filter(pl.Series(recruited))
    j, k = np.meshgrid(np.arange(law.n_sdoh), np.arange(law.n_codes), indexing="ij")
    effects_frame = pl.DataFrame({"sdoh": j.ravel(), "code": k.ravel(), "true_delta": effects.ravel()})
    law_frame = pl.DataFrame({"code": np.arange(law.n_codes), "linked": law.linked, "organ": law.organ})
    return subjects_frame, effects_frame, law_frame


def write_data(cfg: DiffdtConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    written = []
    for seed in seeds:
        if cfg.cohort is not None:
            frames = dict(zip(("subjects", "effects", "law"),
                              synthetic_cohort(cfg.cohort, seed, cfg.intervention.horizon), strict=True))
        else:
            from tasks.diffdt import ukb

            frames = {"subjects": ukb.read_extracts(cfg.ukb, seed)}
        for name, frame in frames.items():
            written.append(write_parquet(frame, Path(data_dir) / f"{name}_seed{seed}.parquet"))
    return written


@dataclass(frozen=True)
class Cohort:
    """One seed's subjects as arrays (``split`` picks train or test rows)."""

    male: np.ndarray
    baseline: np.ndarray
    sdoh_onset: np.ndarray      # (N, J)
    event_age: np.ndarray       # (N, K), death last
    oracle_log_hazard: np.ndarray  # (N, K) true log-hazard at baseline, NaN for real data
    oracle_record_log_hazard: np.ndarray  # (N, K) the same without the unobserved organ axes
    oracle_history_log_hazard: np.ndarray  # (N, K) ... and without the SDoH codes
    imaged: dict[str, np.ndarray]
    traits: dict[str, np.ndarray]
    brain_c1: np.ndarray        # (N, n, n)
    brain_c2: np.ndarray        # (N, n, n), NaN without follow-up
    brain_dt: np.ndarray
    brain_follow: np.ndarray

    @property
    def n(self) -> int:
        return int(self.baseline.shape[0])

    def rows(self, mask: np.ndarray) -> Cohort:
        return Cohort(**{name: ({o: v[mask] for o, v in value.items()} if isinstance(value, dict) else value[mask])
                         for name, value in self.__dict__.items()})


def _matrix(frame: pl.DataFrame, column: str) -> np.ndarray:
    return np.asarray(frame[column].to_list(), dtype=np.float64)


def load_cohort(data_dir: Path, seed: int, split: str) -> Cohort:
    frame = pl.read_parquet(Path(data_dir) / f"subjects_seed{seed}.parquet").filter(pl.col("split") == split)
    c1 = _matrix(frame, "brain_c1")
    n_roi = int((np.sqrt(8 * c1.shape[1] + 1) - 1) / 2)
    return Cohort(male=frame["male"].to_numpy(), baseline=frame["baseline"].to_numpy(),
                  sdoh_onset=_matrix(frame, "sdoh_onset"), event_age=_matrix(frame, "event_age"),
                  oracle_log_hazard=_matrix(frame, "oracle_log_hazard"),
                  oracle_record_log_hazard=_matrix(frame, "oracle_record_log_hazard"),
                  oracle_history_log_hazard=_matrix(frame, "oracle_history_log_hazard"),
                  imaged={o: frame[f"imaged_{o}"].to_numpy() for o in ORGANS},
                  traits={o: _matrix(frame, f"traits_{o}") for o in cohort.TRAIT_DIMS},
                  brain_c1=from_upper(c1, n_roi), brain_c2=from_upper(_matrix(frame, "brain_c2"), n_roi),
                  brain_dt=frame["brain_dt"].to_numpy(), brain_follow=frame["brain_follow"].to_numpy())


def load_effects(data_dir: Path, seed: int) -> np.ndarray:
    """True delta incidence (J, K)."""
    frame = pl.read_parquet(Path(data_dir) / f"effects_seed{seed}.parquet")
    j, k = int(frame["sdoh"].max()) + 1, int(frame["code"].max()) + 1
    out = np.zeros((j, k))
    out[frame["sdoh"].to_numpy(), frame["code"].to_numpy()] = frame["true_delta"].to_numpy()
    return out


def load_linked(data_dir: Path, seed: int) -> np.ndarray:
    return pl.read_parquet(Path(data_dir) / f"law_seed{seed}.parquet")["linked"].to_numpy()
