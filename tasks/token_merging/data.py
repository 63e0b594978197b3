"""Data of the token_merging experiment.

smoke / cpu: scikit-learn's bundled digits (1,797 8x8 images, no network), a fixed stratified split
stored as parquet (raw pixels 0..16, label, split); the ViT sees them upsampled to ``image_size``.
paper: a pretrained DeiT / ViT by hub name (``transformers``) and a per-seed subset of ImageNet-1k
validation (``datasets``); tests use local stand-ins only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch.nn import functional as F

from tasks.common.io import read_json, write_dir_with, write_json, write_parquet
from tasks.token_merging.config import DigitsDataConfig

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


def digits_tensors(frame: pl.DataFrame, image_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 1, S, S) images scaled to [-1, 1] and upsampled bilinearly, and (B,) labels."""
    pixels = torch.tensor(np.asarray(frame["pixels"].to_list(), dtype=np.float32)).view(-1, 1, 8, 8)
    images = pixels / (PIXEL_MAX / 2) - 1.0
    if image_size != 8:
        images = F.interpolate(images, size=(image_size, image_size), mode="bilinear", align_corners=False)
    return images, torch.tensor(frame["label"].to_numpy())


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
# Paper profile: pretrained checkpoints and ImageNet-1k validation from the Hugging Face hub
# ----------------------------------------------------------------------------------------------------


def load_hub_vit(name_or_path: str, dtype: str = "float32"):
    """A ``ViTForImageClassification`` (DeiT and ViT checkpoints share the class) and its image processor."""
    from transformers import AutoImageProcessor, ViTForImageClassification

    model = ViTForImageClassification.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    return model.eval(), AutoImageProcessor.from_pretrained(name_or_path)


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


def hub_batches(dataset, processor, batch_size: int, dtype: torch.dtype):
    """Yield (pixel_values, labels) batches preprocessed by the checkpoint's own image processor."""
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start:start + batch_size]
        images = [image.convert("RGB") for image in rows["image"]]
        pixels = processor(images=images, return_tensors="pt")["pixel_values"].to(dtype)
        yield pixels, torch.as_tensor(rows["label"])
