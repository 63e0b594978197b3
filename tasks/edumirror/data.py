"""Data of edumirror: the Rater's synthetic training corpus, one per seed (narrations from the first
``train_paraphrases`` templates of each action; measurement.py). The simulations themselves are generated in the
evaluation step from seeded streams."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.io import write_parquet
from tasks.edumirror.config import EdumirrorConfig
from tasks.edumirror.measurement import rater_corpus

CORPUS_STREAM = 11


def corpus_path(data_dir: Path, seed: int) -> Path:
    return Path(data_dir) / f"rater_corpus_seed{seed}.parquet"


def write_data(cfg: EdumirrorConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    written = []
    for seed in seeds:
        texts, labels = rater_corpus(cfg.measurement.corpus_size, cfg.measurement.train_paraphrases,
                                     np.random.default_rng([seed, CORPUS_STREAM]))
        written.append(write_parquet(pl.DataFrame({"text": texts, "label": labels}), corpus_path(data_dir, seed)))
    return written


def load_corpus(data_dir: Path, seed: int) -> tuple[list[str], list[int]]:
    frame = pl.read_parquet(corpus_path(data_dir, seed))
    return frame["text"].to_list(), frame["label"].to_list()
