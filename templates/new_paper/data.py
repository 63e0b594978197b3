"""Procedural data of new_paper: y = x . w_true + Gaussian noise, one dataset per seed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.io import write_parquet
from tasks.new_paper.config import NewPaperConfig


def make_split(cfg: NewPaperConfig, seed: int) -> dict[str, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    d = cfg.data
    w_true = rng.standard_normal(d.dim) / np.sqrt(d.dim)
    frames = {}
    for name, n in (("train", d.n_train), ("test", d.n_test)):
        x = rng.standard_normal((n, d.dim))
        y = x @ w_true + d.noise_sd * rng.standard_normal(n)
        frames[name] = pl.DataFrame({"x": x.tolist(), "y": y})
    return frames


def write_data(cfg: NewPaperConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    written = []
    for seed in seeds:
        for name, frame in make_split(cfg, seed).items():
            written.append(write_parquet(frame, Path(data_dir) / f"{name}_seed{seed}.parquet"))
    return written


def load_split(data_dir: Path, name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    frame = pl.read_parquet(Path(data_dir) / f"{name}_seed{seed}.parquet")
    return np.asarray(frame["x"].to_list(), dtype=np.float64), frame["y"].to_numpy()
