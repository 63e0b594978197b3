"""Data of the multi_model_curation experiment.

smoke / cpu: the finite *real* data sets of the self-consuming loops, procedural and per seed:
1-D draws of N(mu_0, sigma_0^2) (mu_0 = 0, sigma_0 = 1) and the conditional linear-Gaussian task
(x ~ N(0, I_dim), y | x ~ N(theta_0^T x, sigma_0^2), theta_0 = 0). Every round subsamples them.
paper: prompts and human responses, generators and reward models come from the hub inside the
training step (``hub.py``; tests use local stand-ins only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.io import write_parquet
from tasks.multi_model_curation import method
from tasks.multi_model_curation.config import MultiModelCurationConfig

REAL_MEAN = 0.0
REAL_VAR = 1.0


def real_rng(seed: int, stream: int) -> np.random.Generator:
    """Separate streams per seed for the 1-D (0) and conditional (1) real data sets."""
    return np.random.default_rng([seed, 7919, stream])


def unconditional_frame(size: int, seed: int) -> pl.DataFrame:
    real = method.unconditional_real_data(size, REAL_MEAN, REAL_VAR, real_rng(seed, 0))
    return pl.DataFrame({"y": real.y})


def conditional_frame(size: int, dim: int, seed: int) -> pl.DataFrame:
    real = method.conditional_real_data(size, np.zeros(dim), REAL_VAR, real_rng(seed, 1))
    return pl.DataFrame({f"x_{k + 1}": real.phi[:, k] for k in range(dim)} | {"y": real.y})


def unconditional_path(data_dir: Path, seed: int) -> Path:
    return data_dir / f"real_1d_seed{seed}.parquet"


def conditional_path(data_dir: Path, seed: int) -> Path:
    return data_dir / f"real_conditional_seed{seed}.parquet"


def _read(path: Path, key: str) -> pl.DataFrame:
    if not path.is_file():
        raise FileNotFoundError(f"{key}: {path} is missing: run the data phase for this profile and seed")
    return pl.read_parquet(path)


def read_unconditional(path: Path, expected_rows: int, key: str) -> method.RealData:
    """The 1-D real data set, checked against the config (``key`` names the config entry)."""
    frame = _read(path, key)
    if frame.columns != ["y"] or frame.height != expected_rows:
        raise ValueError(f"{key}: {path} holds {frame.height} rows {frame.columns}, the config asks for "
                         f"{expected_rows} rows ['y']: rerun the data phase")
    y = frame["y"].to_numpy()
    return method.RealData(np.ones((y.size, 1)), y)


def read_conditional(path: Path, expected_rows: int, dim: int, key: str) -> method.RealData:
    frame = _read(path, key)
    expected = [f"x_{k + 1}" for k in range(dim)] + ["y"]
    if frame.columns != expected or frame.height != expected_rows:
        raise ValueError(f"{key}: {path} holds {frame.height} rows {frame.columns}, the config asks for "
                         f"{expected_rows} rows {expected}: rerun the data phase")
    return method.RealData(frame.select(expected[:-1]).to_numpy(), frame["y"].to_numpy())


def read_real_1d(config: MultiModelCurationConfig, seed: int, data_dir: Path) -> method.RealData:
    """The sampled loops' real data set (evaluation step), checked against ``sampled.real_pool``."""
    return read_unconditional(unconditional_path(Path(data_dir), seed), config.sampled.real_pool, "sampled.real_pool")


def read_real_conditional(config: MultiModelCurationConfig, seed: int, data_dir: Path) -> method.RealData:
    """The neural loop's real data set (training step), checked against ``neural.real_pool`` and ``neural.dim``."""
    return read_conditional(conditional_path(Path(data_dir), seed), config.neural.real_pool, config.neural.dim,
                            "neural.real_pool/neural.dim")


def write_data(config: MultiModelCurationConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase: the finite real data sets per seed (parquet). The paper profile's prompts and
    human responses are read from the hub inside the training step (``hub.py``), as are its models."""
    data_dir = Path(data_dir)
    written = []
    for seed in seeds:
        if config.sampled is not None:
            written.append(write_parquet(unconditional_frame(config.sampled.real_pool, seed),
                                         unconditional_path(data_dir, seed)))
        if config.neural is not None:
            written.append(write_parquet(conditional_frame(config.neural.real_pool, config.neural.dim, seed),
                                         conditional_path(data_dir, seed)))
    return written
