"""Data of eig_rubric. smoke / cpu: the simulated world of simulator.py, one per seed (items, human scores, the
question pool, the human weights). paper: hub.py loads MT-Bench human judgments instead."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.io import write_parquet
from tasks.eig_rubric import simulator
from tasks.eig_rubric.config import EigRubricConfig, WorldConfig
from tasks.eig_rubric.simulator import QuestionPool

WORLD_STREAM = 0  # numpy SeedSequence stream ids per seed: the world, calibration answers, re-judgings, ...
CALIBRATION_STREAM = 1
REJUDGING_STREAM = 2
COT_SWEEP_STREAM = 3  # the CoT judge at other drift settings (evaluate.py), apart from the decisive passes
FIXED_CALIBRATION_STREAM = 4  # the fixed questionnaire's calibration answers (its naive-Bayes likelihoods)
RELEVANT_POOL_STREAM = 5  # random-k rubrics drawn from the relevant-dimension questions only


@dataclass(frozen=True)
class World:
    """One seed's simulated world; items [0, n_calibration) are the labelled calibration set."""

    z: np.ndarray
    human_raw: np.ndarray
    levels: np.ndarray
    weights: np.ndarray
    pool: QuestionPool
    n_calibration: int


def make_world(world: WorldConfig, seed: int) -> World:
    rng = np.random.default_rng([seed, WORLD_STREAM])
    pool = simulator.make_pool(world, rng)
    weights = simulator.human_weights(world, rng)
    z, raw, levels = simulator.make_items(world, weights, rng)
    return World(z, raw, levels, weights, pool, world.n_calibration)


def write_data(cfg: EigRubricConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    if cfg.world is None:
        from tasks.eig_rubric import hub

        return hub.write_data(cfg, seeds, Path(data_dir))
    written = []
    for seed in seeds:
        w = make_world(cfg.world, seed)
        split = np.where(np.arange(w.z.shape[0]) < w.n_calibration, "calibration", "evaluation")
        items = pl.DataFrame({"z": w.z.tolist(), "human_raw": w.human_raw, "level": w.levels, "split": split})
        pool = pl.DataFrame({"dim": w.pool.dims, "threshold": w.pool.thresholds, "noise_sd": w.pool.noise_sd})
        weights = pl.DataFrame({"dim": np.arange(w.weights.shape[0]), "weight": w.weights})
        for name, frame in (("items", items), ("pool", pool), ("weights", weights)):
            written.append(write_parquet(frame, Path(data_dir) / f"{name}_seed{seed}.parquet"))
    return written


def load_world(data_dir: Path, seed: int) -> World:
    items = pl.read_parquet(Path(data_dir) / f"items_seed{seed}.parquet")
    pool = pl.read_parquet(Path(data_dir) / f"pool_seed{seed}.parquet")
    weights = pl.read_parquet(Path(data_dir) / f"weights_seed{seed}.parquet")
    return World(z=np.asarray(items["z"].to_list(), dtype=np.float64), human_raw=items["human_raw"].to_numpy(),
                 levels=items["level"].to_numpy().astype(np.int64), weights=weights["weight"].to_numpy(),
                 pool=QuestionPool(pool["dim"].to_numpy().astype(np.int64), pool["threshold"].to_numpy(),
                                   pool["noise_sd"].to_numpy()),
                 n_calibration=int((items["split"] == "calibration").sum()))
