"""Data step of token_merging.

smoke / cpu: scikit-learn's bundled digits (1,797 8x8 images, no network), a fixed stratified split
stored as parquet (raw pixels 0..16, label, split); the ViT sees them upsampled to ``image_size``.
paper: a per-seed subset of ImageNet-1k validation (``datasets``), saved with ``save_to_disk``; the
pretrained checkpoint is loaded at evaluation (``hub.py``). Tests use local stand-ins only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch.nn import functional as F

from tasks.common.io import read_json, write_dir_with, write_json, write_parquet
from tasks.token_merging.config import DigitsDataConfig, SceneConfig, TextureConfig, TokenMergingConfig

DIGITS_FILES = {"train": "digits_train.parquet", "test": "digits_test.parquet"}
META_FILE = "digits_meta.json"
PIXEL_MAX = 16.0  # load_digits pixel range 0..16


def digits_split(cfg: DigitsDataConfig) -> dict[str, pl.DataFrame]:
    """The fixed train / test split (stratified, ``split_seed``); ``n_train`` subsamples the training part."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    index = np.arange(len(digits.target))
    train_idx, test_idx = train_test_split(index, test_size=cfg.test_size, random_state=cfg.split_seed,
                                           stratify=digits.target)
    if cfg.n_train is not None:
        if cfg.n_train > len(train_idx):
            raise ValueError(f"data.n_train: at most {len(train_idx)} training images, got {cfg.n_train}")
        train_idx = np.sort(np.random.default_rng(cfg.split_seed).choice(train_idx, cfg.n_train, replace=False))
    return {name: pl.DataFrame({"index": idx, "pixels": digits.data[idx].astype(np.int16).tolist(),
                                "label": digits.target[idx].astype(np.int64), "split": name})
            for name, idx in (("train", np.sort(train_idx)), ("test", np.sort(test_idx)))}


def write_digits(cfg: DigitsDataConfig, data_dir: Path) -> list[Path]:
    """Both splits as parquet, plus ``digits_meta.json`` (the data config that produced them)."""
    paths = [write_parquet(frame, data_dir / DIGITS_FILES[name]) for name, frame in digits_split(cfg).items()]
    return [*paths, write_json(data_dir / META_FILE, cfg.model_dump(mode="json"))]


def read_digits(cfg: DigitsDataConfig, data_dir: Path) -> dict[str, pl.DataFrame]:
    """Read both splits, checking they were written for this config (a stale data phase is an error
    naming the key, not a silent run on other data)."""
    meta_path = data_dir / META_FILE
    if not meta_path.is_file():
        raise FileNotFoundError(f"token_merging.data: {meta_path} is missing; run the data phase first")
    written = read_json(meta_path)
    for key, value in cfg.model_dump(mode="json").items():
        if written.get(key) != value:
            raise ValueError(f"token_merging.data.{key}: {data_dir} was written with {written.get(key)!r}, "
                             f"config says {value!r}; rerun the data phase")
    frames = {name: pl.read_parquet(data_dir / file) for name, file in DIGITS_FILES.items()}
    if frames["test"].height != cfg.test_size:
        raise ValueError(f"token_merging.data.test_size: {data_dir} holds {frames['test'].height} test images, "
                         f"config says {cfg.test_size}; rerun the data phase")
    return frames


SCENE_SPLIT_OFFSET = {"train": 1, "test": 2}  # the fixed scenes' generator: split_seed * 10 + offset


def read_digits_tensors(cfg: DigitsDataConfig, data_dir: Path) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Images and labels of both splits, after ``read_digits`` checked them against the config. With
    ``cfg.scene`` each split is composed once into fixed scenes (generator from ``split_seed``): the test
    scenes are evaluated, the training scenes calibrate M4; training composes fresh scenes every epoch."""
    frames = read_digits(cfg, Path(data_dir))
    if cfg.texture is not None:
        grid = cfg.image_size // cfg.texture.cell
        return {name: texture_digits(*digits_tensors(frame, grid), cfg.texture,
                                     torch.Generator().manual_seed(cfg.split_seed * 10 + SCENE_SPLIT_OFFSET[name]))
                for name, frame in frames.items()}
    if cfg.scene is None:
        return {name: digits_tensors(frame, cfg.image_size) for name, frame in frames.items()}
    return {name: compose_scenes(*digits_tensors(frame, 8), cfg.scene, cfg.image_size,
                                 torch.Generator().manual_seed(cfg.split_seed * 10 + SCENE_SPLIT_OFFSET[name]))
            for name, frame in frames.items()}


def digits_tensors(frame: pl.DataFrame, image_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 1, S, S) images scaled to [-1, 1] and upsampled bilinearly, and (B,) labels."""
    pixels = torch.tensor(np.asarray(frame["pixels"].to_list(), dtype=np.float32)).view(-1, 1, 8, 8)
    images = pixels / (PIXEL_MAX / 2) - 1.0
    if image_size != 8:
        images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    return images, torch.tensor(frame["label"].to_numpy())


def compose_scenes(glyphs: torch.Tensor, labels: torch.Tensor, scene: SceneConfig, canvas: int,
                   generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One scene per glyph (B, 1, 8, 8) in [-1, 1] on a ``canvas`` x ``canvas`` image, background -1, plus
    Gaussian pixel noise (``noise_std``). ``quadrants``: the glyph, upsampled bilinearly to canvas / 2, in the
    top-left quadrant and three distractor glyphs (uniform draws from the same set) in the others; the label
    is the glyph's. ``random``: the glyph at its raw resolution at a uniform position (pixel-wise max); with two
    digits it lies in the left half, a drawn partner in the right half, and the label is the larger digit."""
    n = len(labels)
    if scene.layout == "quadrants":
        half = canvas // 2
        tiles = F.interpolate(glyphs, size=(half, half), mode="bilinear", align_corners=False)
        images = torch.full((n, 1, canvas, canvas), -1.0)
        order = [torch.arange(n)] + [torch.randint(0, n, (n,), generator=generator) for _ in range(3)]
        for chosen, (row, col) in zip(order, [(0, 0), (0, half), (half, 0), (half, half)]):
            images[:, :, row:row + half, col:col + half] = tiles[chosen]
        scene_labels = labels
    else:
        images = torch.full((n, 1, canvas, canvas), -1.0)
        partners = torch.randint(0, n, (n,), generator=generator)
        placed = [(glyphs, 0, canvas)] if scene.digits_per_scene == 1 else [
            (glyphs, 0, canvas // 2), (glyphs[partners], canvas // 2, canvas)]
        for source, x_lo, x_hi in placed:
            rows = torch.randint(0, canvas - 8 + 1, (n,), generator=generator)
            cols = torch.randint(x_lo, x_hi - 8 + 1, (n,), generator=generator)
            for i, (row, col) in enumerate(zip(rows.tolist(), cols.tolist())):
                images[i, :, row:row + 8, col:col + 8] = torch.maximum(images[i, :, row:row + 8, col:col + 8],
                                                                       source[i])
        scene_labels = labels if scene.digits_per_scene == 1 else torch.maximum(labels, labels[partners])
    if scene.noise_std > 0:
        images = images + scene.noise_std * torch.randn(images.shape, generator=generator)
    return images, scene_labels


def texture_digits(glyphs: torch.Tensor, labels: torch.Tensor, texture: TextureConfig, generator: torch.Generator,
                   shift: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Digits drawn by texture contrast: (B, 1, G, G) digits in [-1, 1] on a grid of G x G cells ->
    (B, 1, G c, G c) images, c = ``texture.cell``. Cell (i, j) is a c x c block of pixels ``+-spread_ij``, the
    signs drawn from ``generator`` (a fair coin each), ``spread_ij = low + (high - low) (g_ij + 1) / 2``. With
    ``shift`` the digits are first shifted by up to +-``shift`` cells (``random_shift``, from the same generator).
    Labels pass through."""
    if shift:
        glyphs = random_shift(glyphs, shift, generator)
    cell = texture.cell
    spread = texture.low + (texture.high - texture.low) * (glyphs + 1) / 2
    spread = spread.repeat_interleave(cell, 2).repeat_interleave(cell, 3)
    signs = torch.randint(0, 2, spread.shape, generator=generator).float() * 2 - 1
    return spread * signs, labels


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by an integer offset in [-max_shift, max_shift]^2, filling with the background."""
    if max_shift == 0:
        return images
    size = images.shape[-1]
    background = float(images.amin())
    padded = F.pad(images, (max_shift,) * 4, value=background)
    offsets = torch.randint(0, 2 * max_shift + 1, (images.shape[0], 2), generator=generator)
    out = torch.empty_like(images)
    for dy, dx in torch.unique(offsets, dim=0).tolist():
        chosen = (offsets[:, 0] == dy) & (offsets[:, 1] == dx)
        out[chosen] = padded[chosen, :, dy:dy + size, dx:dx + size]
    return out


# ----------------------------------------------------------------------------------------------------
# Paper profile: ImageNet-1k validation subsets from the Hugging Face hub
# ----------------------------------------------------------------------------------------------------


def load_validation_subset(dataset: str, split: str, n_images: int, seed: int):
    """``n_images`` images of ``dataset[split]`` drawn by ``seed`` (ImageNet-1k is gated: log in first)."""
    from datasets import load_dataset

    full = load_dataset(dataset, split=split)
    if n_images > len(full):
        raise ValueError(f"token_merging.hub.n_images: {dataset}[{split}] has {len(full)} images, got {n_images}")
    chosen = np.sort(np.random.default_rng(seed).choice(len(full), n_images, replace=False))
    return full.select(chosen.tolist())


def save_dataset(dataset, directory: Path) -> Path:
    """Atomic ``save_to_disk`` (a sibling temporary folder renamed into place)."""
    return write_dir_with(directory, lambda tmp: dataset.save_to_disk(str(tmp)))


def hub_subset_dir(data_dir: Path, seed: int) -> Path:
    return data_dir / f"hub_seed{seed}"


# ----------------------------------------------------------------------------------------------------
# The data step
# ----------------------------------------------------------------------------------------------------


def write_data(cfg: TokenMergingConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Digits: one fixed split shared by every seed. Paper: each seed's validation subset."""
    data_dir = Path(data_dir)
    if cfg.hub is None:
        return write_digits(cfg.data, data_dir)
    return [save_dataset(load_validation_subset(cfg.hub.dataset, cfg.hub.split, cfg.hub.n_images, seed),
                         hub_subset_dir(data_dir, seed)) for seed in seeds]
