"""Data of arm_ebm (``data/arm_ebm/``), procedural at every profile.

Per seed: the enumerable toy EBM (every sequence with its energy and exact log-probability,
``toy_seed<N>.parquet``) and, where the profile has the tabular study, exact samples from a smaller toy
EBM (``tabular_seed<N>.parquet``). The paper profile's hub model is loaded by ``hub.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.arm_ebm import method
from tasks.arm_ebm.config import ArmEbmConfig, TabularConfig, ToyConfig
from tasks.common.io import write_parquet


def toy_spec(toy: ToyConfig, seed: int) -> method.ToyEBMSpec:
    """The toy EBM of one seed: the token scores are drawn from the run seed, so every seed is a
    different random EBM with the same global terms."""
    return method.ToyEBMSpec(toy.vocab_size, toy.horizon, toy.n_prompts, toy.a, toy.b, toy.c, seed=seed)


def toy_table(toy: ToyConfig, seed: int) -> pl.DataFrame:
    """One row per (prompt, sequence): tokens, energy R(x, y) and exact log p_R(y|x)."""
    _, total = method.toy_ebm_rewards(toy_spec(toy, seed))
    energy = method.sequence_energy(total)
    logp = method.ebm_log_probs(energy)
    n_prompts, width = energy.shape
    tokens = method.index_to_tokens(np.arange(width), toy.vocab_size, toy.horizon)
    return pl.DataFrame({
        "prompt": np.repeat(np.arange(n_prompts), width),
        "sequence_index": np.tile(np.arange(width), n_prompts),
        "tokens": np.tile(tokens, (n_prompts, 1)).tolist(),
        "energy": energy.ravel(),
        "log_prob": logp.ravel(),
    })


def energy_from_table(frame: pl.DataFrame, toy: ToyConfig) -> np.ndarray:
    """(X, V**T) energy array back from :func:`toy_table`'s rows."""
    frame = frame.sort(["prompt", "sequence_index"])
    return frame["energy"].to_numpy().reshape(toy.n_prompts, toy.vocab_size**toy.horizon)


def tabular_samples(tab: TabularConfig, toy: ToyConfig, seed: int) -> pl.DataFrame:
    """Exact samples from a smaller toy EBM (the tabular E3 study): columns prompt, y_1..y_T."""
    spec = method.ToyEBMSpec(tab.vocab_size, tab.horizon, tab.n_prompts, toy.a, toy.b, toy.c, seed=seed)
    _, total = method.toy_ebm_rewards(spec)
    logp = method.ebm_log_probs(method.sequence_energy(total))
    samples = method.sample_sequences(logp, tab.n_samples, np.random.default_rng(10_000 + seed), tab.vocab_size)
    columns = {"prompt": samples[:, 0]} | {f"y_{t + 1}": samples[:, t + 1] for t in range(tab.horizon)}
    return pl.DataFrame(columns)


def write_data(cfg: ArmEbmConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """The toy enumeration table and (where configured) the tabular study's samples, per seed."""
    written = []
    for seed in seeds:
        written.append(write_parquet(toy_table(cfg.toy, seed), Path(data_dir) / f"toy_seed{seed}.parquet"))
        if cfg.tabular is not None:
            written.append(write_parquet(tabular_samples(cfg.tabular, cfg.toy, seed),
                                         Path(data_dir) / f"tabular_seed{seed}.parquet"))
    return written


def read_toy_energy(data_dir: Path, toy: ToyConfig, seed: int) -> np.ndarray:
    """The seed's toy energies R(x, y), (X, V**T), as the data phase wrote them."""
    return energy_from_table(pl.read_parquet(Path(data_dir) / f"toy_seed{seed}.parquet"), toy)


def read_tabular_samples(data_dir: Path, seed: int) -> np.ndarray:
    """The seed's tabular samples as rows [x, y_1, ..., y_T]."""
    return pl.read_parquet(Path(data_dir) / f"tabular_seed{seed}.parquet").to_numpy()


def check_toy_energy(energy: np.ndarray, toy: ToyConfig, seed: int) -> None:
    """Raise if the data phase's toy table is not the toy of this config and seed (stale data)."""
    _, total = method.toy_ebm_rewards(toy_spec(toy, seed))
    if not np.allclose(method.sequence_energy(total), energy, rtol=0, atol=1e-12):
        raise ValueError("data/arm_ebm toy table does not match the toy config: rerun the data phase")
