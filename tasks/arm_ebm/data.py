"""Data of the arm_ebm experiment.

smoke / cpu: the enumerable toy EBM (every sequence with its energy and exact log-probability) and
exact samples for the tabular study, both procedural. paper: prompts for a real causal LM from the
hub (`hub.hf_model`), loaded with ``transformers``; tests use a local stand-in folder.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.arm_ebm import method
from tasks.arm_ebm.config import TabularConfig, ToyConfig
from tasks.common.io import write_with


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


def write_parquet(frame: pl.DataFrame, path: Path) -> Path:
    return write_with(path, lambda tmp: frame.write_parquet(tmp))


def load_hub_model(name_or_path: str, dtype: str):
    """Paper profile: a real causal LM and its tokenizer by hub name (or a local folder in tests)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    return model.eval(), tokenizer
