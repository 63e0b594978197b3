"""Digit scenes of radio1d: a 16x16 canvas whose four 8x8 quadrants each hold a scikit-learn digit or nothing.

Quadrants are numbered 0 (top-left), 1 (top-right), 2 (bottom-left), 3 (bottom-right). A scene's layout is its
digit per quadrant, ``EMPTY`` (10) where the quadrant is blank. Digits come from a fixed 80/20 split of
``sklearn.datasets.load_digits`` (project choice): train scenes use train digits, test scenes and the retrieval
gallery use test digits. The gallery holds, for each query, a scene with the query's layout drawn from other
digit instances, so every query has at least one relevant item that is not its own copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from tasks.common.io import write_parquet
from tasks.radio1d.config import DataConfig, Radio1DConfig

CANVAS = 16
EMPTY = 10
SPLITS = ("train", "test", "gallery")


@dataclass(frozen=True)
class Scenes:
    images: torch.Tensor   # (N, 1, 16, 16) in [0, 1]
    layouts: torch.Tensor  # (N, 4) long, digit per quadrant or EMPTY

    @property
    def presence(self) -> torch.Tensor:
        """(N, 10) multi-label digit presence (the probe's labels)."""
        hot = torch.zeros(len(self.layouts), EMPTY + 1)
        hot.scatter_(1, self.layouts, 1.0)
        return hot[:, :EMPTY]


def digit_pools(cfg: DataConfig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(images (n, 8, 8) in [0, 1], labels) of the train and test digits (fixed split, ``split_seed``)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(cfg.split_seed).permutation(len(digits.target))
    n_test = round(cfg.digit_test_fraction * len(order))
    parts = {"test": order[:n_test], "train": order[n_test:]}
    return {name: (digits.images[idx] / 16.0, digits.target[idx]) for name, idx in parts.items()}


def compose(pool: tuple[np.ndarray, np.ndarray], instances: np.ndarray) -> np.ndarray:
    """One 16x16 canvas from four digit-instance indices into ``pool`` (-1: empty quadrant)."""
    canvas = np.zeros((CANVAS, CANVAS))
    for quadrant, index in enumerate(instances):
        if index >= 0:
            row, col = divmod(quadrant, 2)
            canvas[8 * row:8 * row + 8, 8 * col:8 * col + 8] = pool[0][index]
    return canvas


def random_instances(cfg: DataConfig, n: int, pool_size: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 4) instance indices: min..max_digits occupied quadrants (uniform count, uniform positions)."""
    out = np.full((n, 4), -1)
    counts = rng.integers(cfg.min_digits, cfg.max_digits + 1, size=n)
    for row, count in enumerate(counts):
        quadrants = rng.choice(4, size=count, replace=False)
        out[row, quadrants] = rng.integers(0, pool_size, size=count)
    return out


def same_layout_instances(instances: np.ndarray, labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """For each row, other instances of the same digit in the same quadrants (a different instance where the
    pool holds one)."""
    by_label = {d: np.flatnonzero(labels == d) for d in range(EMPTY)}
    out = np.full_like(instances, -1)
    for (row, quadrant), index in np.ndenumerate(instances):
        if index >= 0:
            candidates = by_label[labels[index]]
            others = candidates[candidates != index]
            out[row, quadrant] = rng.choice(others if len(others) else candidates)
    return out


def layouts_of(instances: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return np.where(instances >= 0, labels[np.maximum(instances, 0)], EMPTY)


def make_scenes(cfg: DataConfig, seed: int) -> dict[str, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    pools = digit_pools(cfg)
    train_inst = random_instances(cfg, cfg.n_train, len(pools["train"][1]), rng)
    test_inst = random_instances(cfg, cfg.n_test, len(pools["test"][1]), rng)
    gallery_inst = same_layout_instances(test_inst[:cfg.n_queries], pools["test"][1], rng)
    frames = {}
    for name, inst, pool in (("train", train_inst, pools["train"]), ("test", test_inst, pools["test"]),
                             ("gallery", gallery_inst, pools["test"])):
        images = np.stack([compose(pool, row) for row in inst]).reshape(len(inst), -1)
        frames[name] = pl.DataFrame({"image": images.astype(np.float32).tolist(),
                                     "layout": layouts_of(inst, pool[1]).tolist()})
    return frames


def write_data(cfg: Radio1DConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    if cfg.data is None:  # paper profile: the hub dataset is read in hub.py
        return []
    written = []
    for seed in seeds:
        for name, frame in make_scenes(cfg.data, seed).items():
            written.append(write_parquet(frame, Path(data_dir) / f"{name}_seed{seed}.parquet"))
    return written


def load_scenes(data_dir: Path, name: str, seed: int) -> Scenes:
    frame = pl.read_parquet(Path(data_dir) / f"{name}_seed{seed}.parquet")
    images = torch.tensor(np.asarray(frame["image"].to_list(), dtype=np.float32)).view(-1, 1, CANVAS, CANVAS)
    return Scenes(images, torch.tensor(np.asarray(frame["layout"].to_list(), dtype=np.int64)))
