"""Paper profile of diffdt: local UK Biobank extracts in the layout of the synthetic cohort (tasks/diffdt/data.py).

UK Biobank is access-controlled (approved application); no Hugging Face dataset or model exists for this paper, so
the paper profile reads files the user already holds, never downloads. Expected parquet extracts (paths in
params.yaml, ``diffdt.paper.ukb``):

- participants: ``eid``, ``male`` (bool), ``baseline_age`` (age at the imaging visit);
- events: ``eid``, ``age``, ``code`` (ICD-10, first occurrence per code is kept; death as ``code == "DEATH"``);
- imaging: ``eid``, ``heart_0..7``, ``liver_0..2``, ``kidney_0..3`` (imaging-derived phenotypes, null if absent);
- connectome: ``eid``, ``visit`` (0 baseline imaging, 1 repeat), ``age``, ``c_0..c_{m-1}`` (upper triangle of the
  connectivity matrix, diagonal included, row-major).

SDoH codes map to the synthetic cohort's eight groups by prefix (Z55, Z56, Z59, Z60, Z63, Z72, V, W); disease codes
are the ``n_codes - 1`` most frequent 3-character codes of chapters I-XVII (A00-Q99), death last. There are no true
counterfactuals and no true hazards, so the intervention claims are not testable at this profile and the oracle
columns are NaN. Tested with local stand-ins only (tests/unit/test_diffdt_steps.py).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tasks.diffdt import cohort
from tasks.diffdt.config import UKBConfig
from tasks.diffdt.data import ORGANS

SDOH_PREFIXES = ("Z55", "Z56", "Z59", "Z60", "Z63", "Z72", "V", "W")
DEATH = "DEATH"


def sdoh_group(code: str) -> int | None:
    for j, prefix in enumerate(SDOH_PREFIXES):
        if code.startswith(prefix):
            return j
    return None


def is_disease(code: str) -> bool:
    """Chapters I-XVII: A00-Q99."""
    return len(code) >= 3 and "A" <= code[0] <= "Q"


def read_extracts(cfg: UKBConfig, seed: int) -> pl.DataFrame:
    people = pl.read_parquet(cfg.participants_path).sort("eid")
    events = pl.read_parquet(cfg.events_path).with_columns(pl.col("code").str.slice(0, 3).alias("code3"),
                                                           pl.col("code").alias("full"))
    diseases = events.filter(pl.col("code3").map_elements(is_disease, return_dtype=pl.Boolean))
    top = diseases.group_by("code3").len().sort(["len", "code3"], descending=[True, False])["code3"]
    codes = list(top[:cfg.n_codes - 1]) + [DEATH]
    eids = people["eid"].to_numpy()
    row = {int(e): i for i, e in enumerate(eids)}
    n = len(eids)
    event_age = np.full((n, len(codes)), np.nan)
    sdoh_onset = np.full((n, len(SDOH_PREFIXES)), np.nan)
    col = {c: k for k, c in enumerate(codes)}
    for eid, age, code3, full in events.select("eid", "age", "code3", "full").iter_rows():
        i = row.get(int(eid))
        if i is None:
            continue
        key = DEATH if full == DEATH else code3
        j = sdoh_group(full)
        if j is not None:
            sdoh_onset[i, j] = np.fmin(sdoh_onset[i, j], age)
        elif key in col:
            event_age[i, col[key]] = np.fmin(event_age[i, col[key]], age)
    imaging = people.select("eid").join(pl.read_parquet(cfg.imaging_path), on="eid", how="left")
    traits, imaged = {}, {}
    for organ, dim in cohort.TRAIT_DIMS.items():
        values = imaging.select([f"{organ}_{d}" for d in range(dim)]).to_numpy().astype(float)
        imaged[organ] = np.isfinite(values).all(axis=1)
        traits[organ] = np.where(imaged[organ][:, None], values, 0.0)
    m = cfg.n_roi * (cfg.n_roi + 1) // 2
    conn = pl.read_parquet(cfg.connectome_path)
    mats = {}
    for visit in (0, 1):
        part = people.select("eid").join(conn.filter(pl.col("visit") == visit), on="eid", how="left")
        mats[visit] = (part.select([f"c_{d}" for d in range(m)]).to_numpy().astype(float), part["age"].to_numpy())
    imaged["brain"] = np.isfinite(mats[0][0]).all(axis=1)
    follow = imaged["brain"] & np.isfinite(mats[1][0]).all(axis=1)
    identity = np.eye(cfg.n_roi)[np.triu_indices(cfg.n_roi)]
    c1 = np.where(imaged["brain"][:, None], mats[0][0], identity)
    test = np.random.default_rng(seed).random(n) < cfg.test_share
    return pl.DataFrame({
        "eid": eids, "split": np.where(test, "test", "train"), "male": people["male"].to_numpy(),
        "baseline": people["baseline_age"].to_numpy().astype(float), "deprivation": np.full(n, np.nan),
        "z": np.full((n, 4), np.nan).tolist(), "sdoh_onset": sdoh_onset.tolist(), "event_age": event_age.tolist(),
        **{f"oracle{part}_log_hazard": np.full((n, len(codes)), np.nan).tolist()
           for part in ("", "_record", "_history")},
        **{f"imaged_{o}": imaged[o] for o in ORGANS}, **{f"traits_{o}": traits[o].tolist() for o in traits},
        "brain_c1": c1.tolist(), "brain_c2": np.where(follow[:, None], mats[1][0], np.nan).tolist(),
        "brain_dt": np.where(follow, mats[1][1] - mats[0][1], np.nan), "brain_follow": follow})
