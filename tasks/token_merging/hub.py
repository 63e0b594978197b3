"""Paper profile of token_merging: a pretrained DeiT / ViT checkpoint by hub name (``transformers``),
copied into a ``MergeViT`` and evaluated on the seed's ImageNet-1k validation subset (written by the
data step, ``data.write_data``). Nothing is trained: the checkpoint is merged training-free. Tests use
tiny local stand-ins only (no network)."""

from __future__ import annotations

from pathlib import Path

import torch

from tasks.token_merging import method
from tasks.token_merging.config import TokenMergingConfig
from tasks.token_merging.data import hub_subset_dir


def load_hub_vit(name_or_path: str, dtype: str = "float32"):
    """A ``ViTForImageClassification`` (DeiT and ViT checkpoints share the class) and its image processor."""
    from transformers import AutoImageProcessor, ViTForImageClassification

    model = ViTForImageClassification.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    return model.eval(), AutoImageProcessor.from_pretrained(name_or_path)


def hub_batches(dataset, processor, batch_size: int, dtype: torch.dtype):
    """Yield (pixel_values, labels) batches preprocessed by the checkpoint's own image processor."""
    for start in range(0, len(dataset), batch_size):
        rows = dataset[start:start + batch_size]
        images = [image.convert("RGB") for image in rows["image"]]
        pixels = processor(images=images, return_tensors="pt")["pixel_values"].to(dtype)
        yield pixels, torch.as_tensor(rows["label"])


def read_subset(cfg: TokenMergingConfig, seed: int, data_dir: Path):
    """The seed's validation subset, checked against the config before any model is loaded."""
    from datasets import load_from_disk

    hub = cfg.hub
    subset_dir = hub_subset_dir(Path(data_dir), seed)
    if not subset_dir.is_dir():
        raise FileNotFoundError(f"token_merging.hub: {subset_dir} is missing; run the data phase first")
    subset = load_from_disk(str(subset_dir))
    if len(subset) != hub.n_images:
        raise ValueError(f"token_merging.hub.n_images: {subset_dir} holds {len(subset)} images, config says "
                         f"{hub.n_images}; rerun the data phase")
    if hub.n_images <= cfg.merge.calibration_size:
        raise ValueError(f"token_merging.hub.n_images ({hub.n_images}) must exceed merge.calibration_size "
                         f"({cfg.merge.calibration_size})")
    return subset


def hub_model(cfg: TokenMergingConfig, seed: int, data_dir: Path, device: str
              ) -> tuple[method.MergeViT, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The pretrained model as a ``MergeViT`` on ``device``, the evaluated images and labels, and the
    calibration images: the first ``merge.calibration_size`` images of the seed's subset calibrate M4,
    the rest are evaluated."""
    hub = cfg.hub
    subset = read_subset(cfg, seed, data_dir)
    hf_model, processor = load_hub_vit(hub.model, hub.dtype)
    pixels, labels = zip(*hub_batches(subset, processor, hub.batch_size, getattr(torch, hub.dtype)))
    images, labels = torch.cat(pixels).to(device), torch.cat(labels).to(device)
    model = method.vit_from_hf(hf_model).to(device)
    n_cal = cfg.merge.calibration_size
    return model, images[n_cal:], labels[n_cal:], images[:n_cal]
