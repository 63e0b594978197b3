"""Data of constrained_unlearning (the contract's data step, and the data every later step reads).

smoke / cpu: a procedural 2-D Gaussian mixture per seed (ring of modes, a "close" mode next to the forget
mode), its parameters and its training samples as parquet (:func:`write_data`, read back and checked by
:func:`load_seed_data`); the duplicated forget points of Stage C; the 2-D density grid of Stage A and the fixed
1-D reference problem. The paper profile's hub checkpoints are in ``hub.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.io import write_parquet
from tasks.constrained_unlearning import method
from tasks.constrained_unlearning.config import ConstrainedUnlearningConfig, GridConfig, MixtureConfig
from tasks.constrained_unlearning.hub import refuse_unimplemented
from tasks.constrained_unlearning.mixture import GaussianMixture, single_gaussian

FORGET_MODE = 0  # index of the ring mode to unlearn
ROLES = ("forget", "ring", "close")


def mixture_table(cfg: MixtureConfig, seed: int) -> pl.DataFrame:
    """One row per mode: role, centre, weight. The seed draws the ring phase and the weight jitter."""
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi)
    angles = phase + 2 * np.pi * np.arange(cfg.n_ring_modes) / cfg.n_ring_modes
    ring = cfg.ring_radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    close = (cfg.ring_radius + cfg.close_offset) * np.array([np.cos(angles[FORGET_MODE]),
                                                             np.sin(angles[FORGET_MODE])])
    centres = np.vstack([ring, close])
    raw = 1 + cfg.weight_jitter * rng.uniform(-1, 1, size=len(centres))
    roles = ["forget" if i == FORGET_MODE else "ring" for i in range(cfg.n_ring_modes)] + ["close"]
    return pl.DataFrame({"role": roles, "x": centres[:, 0], "y": centres[:, 1], "weight": raw / raw.sum(),
                         "sigma": np.full(len(centres), cfg.sigma)})


def mixture_from_table(frame: pl.DataFrame) -> tuple[GaussianMixture, GaussianMixture, np.ndarray]:
    """(q, q_u, close-mode centre) from :func:`mixture_table`'s rows."""
    means = frame.select("x", "y").to_numpy().astype(np.float64)
    sigma = float(frame["sigma"][0])
    roles = frame["role"].to_list()
    q = GaussianMixture(means, frame["weight"].to_numpy().astype(np.float64), sigma)
    forget = single_gaussian(means[roles.index("forget")], sigma)
    return q, forget, means[roles.index("close")]


def training_samples(cfg: MixtureConfig, seed: int) -> pl.DataFrame:
    """``n_train`` samples of q (the pretraining data; also the pool the unlearning reweights)."""
    q, _, _ = mixture_from_table(mixture_table(cfg, seed))
    points = q.sample(cfg.n_train, np.random.default_rng(1_000 + seed))
    return pl.DataFrame({"x": points[:, 0], "y": points[:, 1]})


def write_data(cfg: ConstrainedUnlearningConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data step: the mixture's modes and its training samples, per seed."""
    refuse_unimplemented(cfg)
    written = []
    for seed in seeds:
        written.append(write_parquet(mixture_table(cfg.mixture, seed), Path(data_dir) / f"mixture_seed{seed}.parquet"))
        written.append(write_parquet(training_samples(cfg.mixture, seed), Path(data_dir) / f"train_seed{seed}.parquet"))
    return written


def load_seed_data(cfg: ConstrainedUnlearningConfig, seed: int, data_dir: Path
                   ) -> tuple[GaussianMixture, GaussianMixture, np.ndarray, np.ndarray]:
    """(q, q_u, close-mode centre, training samples), checked against the config before any compute."""
    mixture_file = Path(data_dir) / f"mixture_seed{seed}.parquet"
    samples_file = Path(data_dir) / f"train_seed{seed}.parquet"
    for path in (mixture_file, samples_file):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run the data phase first")
    stored = pl.read_parquet(mixture_file)
    expected = mixture_table(cfg.mixture, seed)
    if stored.shape != expected.shape or not np.allclose(stored.select("x", "y", "weight", "sigma").to_numpy(),
                                                         expected.select("x", "y", "weight", "sigma").to_numpy(),
                                                         rtol=0, atol=1e-12):
        raise ValueError(f"{mixture_file} does not match the config key `mixture` (n_ring_modes, ring_radius, sigma, "
                         "close_offset, weight_jitter): rerun the data phase")
    samples = pl.read_parquet(samples_file).select("x", "y").to_numpy().astype(np.float64)
    if samples.shape[0] != cfg.mixture.n_train:
        raise ValueError(f"{samples_file} holds {samples.shape[0]} samples but `mixture.n_train` is "
                         f"{cfg.mixture.n_train}: rerun the data phase")
    q, forget, close = mixture_from_table(stored)
    return q, forget, close, samples


def duplicated_forget_points(q: GaussianMixture, n_points: int, offset: float, seed: int
                             ) -> tuple[np.ndarray, np.ndarray]:
    """(forget points, held-out points), each (n_points, 2), for the data-unlearning variant.

    Point i sits at ``offset`` from the centre of ring mode i + 1 (the Stage B forget mode 0 and the close mode
    are skipped) in a seeded random direction u_i; its held-out twin is the reflection mu - offset u_i through
    the same centre, so both have the same density under the mode's isotropic Gaussian (the other modes add
    a negligible, reported difference: ``heldout_density_ratio``)."""
    ring = q.means[:-1]  # mixture_table puts the close mode last
    if not 1 <= n_points <= len(ring) - 1:
        raise ValueError(f"n_points must be in [1, {len(ring) - 1}] (one per ring mode other than the forget mode), "
                         f"got {n_points}")
    rng = np.random.default_rng(3_000 + seed)
    angles = rng.uniform(0, 2 * np.pi, size=n_points)
    u = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    centres = ring[FORGET_MODE + 1: FORGET_MODE + 1 + n_points]
    return centres + offset * u, centres - offset * u


def duplicated_training_set(pool: np.ndarray, forget_points: np.ndarray, duplicates: int
                            ) -> tuple[np.ndarray, np.ndarray]:
    """(training points, is_forget): the pool of q-samples plus every forget point repeated ``duplicates`` times."""
    if duplicates < 1:
        raise ValueError(f"duplicates must be >= 1, got {duplicates}")
    copies = np.repeat(np.atleast_2d(forget_points), duplicates, axis=0)
    points = np.vstack([pool, copies])
    is_forget = np.zeros(points.shape[0], dtype=bool)
    is_forget[pool.shape[0]:] = True
    return points, is_forget


def grid_problem(q: GaussianMixture, forget: GaussianMixture, grid_cfg: GridConfig
                 ) -> tuple[method.Grid, method.GridProblem]:
    """q and q_u on the 2-D grid, with the forget region |x - mu_forget| < 2 sigma."""
    grid = method.Grid.regular(-grid_cfg.half_width, grid_cfg.half_width, grid_cfg.size, 2)
    problem = method.GridProblem(q.log_density(grid.points), forget.log_density(grid.points), grid.cell,
                                 grid.ball(forget.means[0], 2 * forget.sigma))
    return grid, problem


# ------------------------------------------------------------------------------------------------
# The fixed 1-D reference problem (README, "What is measured": claims C4c-f, C5d-f)
# ------------------------------------------------------------------------------------------------

REFERENCE_1D = {"modes": (-6.0, -2.0, 2.0, 6.0), "sigma": 0.7, "forget": 2.0, "far": -6.0, "half_width": 12.0}


def reference_problem_1d(points: int = 24_001) -> tuple[method.GridProblem, np.ndarray]:
    """4-mode GMM at +-2, +-6 (sigma 0.7, equal weights) on [-12, 12], forget the +2 mode; the forget region
    is |x - 2| < 2 sigma. Returns the problem and the far-mode mask |x + 6| < 2 sigma."""
    ref = REFERENCE_1D
    grid = method.Grid.regular(-ref["half_width"], ref["half_width"], points, 1)
    n_modes = len(ref["modes"])
    q = GaussianMixture(np.array(ref["modes"])[:, None], np.full(n_modes, 1 / n_modes), ref["sigma"])
    forget = single_gaussian(np.array([ref["forget"]]), ref["sigma"])
    problem = method.GridProblem(q.log_density(grid.points), forget.log_density(grid.points), grid.cell,
                                 grid.ball(forget.means[0], 2 * ref["sigma"]))
    return problem, grid.ball(np.array([ref["far"]]), 2 * ref["sigma"])
