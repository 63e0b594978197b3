"""Data of the multi_model_curation experiment.

smoke / cpu: the finite *real* data sets of the self-consuming loops, procedural and per seed:
1-D draws of N(mu_0, sigma_0^2) (mu_0 = 0, sigma_0 = 1) and the conditional linear-Gaussian task
(x ~ N(0, I_dim), y | x ~ N(theta_0^T x, sigma_0^2), theta_0 = 0). Every round subsamples them.
paper: prompts and human responses from a Hugging Face data set, generators and reward models by
hub name (tests use local stand-ins only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tasks.multi_model_curation import method

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


# ------------------------------------------------------------------------------------------------
# Paper profile: Hugging Face loaders (exercised in tests with local stand-ins only)
# ------------------------------------------------------------------------------------------------

def response_text(value: Any) -> str:
    """A human response: plain text, or the last assistant turn of a chat (ultrafeedback's 'chosen')."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        assistant = [turn["content"] for turn in value if turn.get("role") == "assistant"]
        return assistant[-1] if assistant else str(value[-1].get("content", ""))
    raise ValueError(f"response_column: cannot read a response from {type(value).__name__}")


def load_prompt_pairs(dataset: str, split: str, prompt_column: str, response_column: str, n: int
                      ) -> list[tuple[str, str]]:
    """The first ``n`` (prompt, human response) pairs of a hub data set (or a local data folder)."""
    from datasets import load_dataset

    rows = load_dataset(dataset, split=split)
    for column in (prompt_column, response_column):
        if column not in rows.column_names:
            raise KeyError(f"hub.{'prompt' if column == prompt_column else 'response'}_column: {column!r} not in "
                           f"{dataset} columns {rows.column_names}")
    if len(rows) < n:
        raise ValueError(f"hub.n_prompts: {dataset}[{split}] has {len(rows)} rows, fewer than {n}")
    rows = rows.select(range(n))
    return [(str(p), response_text(r)) for p, r in zip(rows[prompt_column], rows[response_column])]


def load_generator(name_or_path: str, dtype: str):
    """A causal LM and its tokenizer (left padding, so batched generation continues the prompt)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    return model, tokenizer


def load_reward_model(name_or_path: str):
    """A sequence-classification reward model (one logit) and its tokenizer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    model = AutoModelForSequenceClassification.from_pretrained(name_or_path)
    return model.eval(), tokenizer
