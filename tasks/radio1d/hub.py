"""Paper profile of radio1d: the released 1D checkpoint by hub name (``nvidia/C-RADIOv4-1D-H``, remote code)
and its encoder API with a token count (``forward_encoder(images, num_tokens=k)``, model card), evaluated by
leave-one-out kNN accuracy of the mean of the first k tokens on an ImageNet-1k validation subset, for each k
of ``eval.ks``. The decoder-side reconstruction-fidelity script of the official repository (COCO) is not ported.
Nothing is trained. Tests use tiny local stand-ins only (no network)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
import torch.nn.functional as F

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.radio1d.config import Radio1DConfig


def load_hub_model(name_or_path: str, dtype: str = "float32"):
    """The released model with its remote code (``trust_remote_code``), in eval mode."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(name_or_path, trust_remote_code=True, dtype=getattr(torch, dtype)).eval()


def load_subset(dataset: str, split: str, n_images: int, seed: int):
    """The first ``n_images`` of a seeded shuffle of the split (streamed: no full download)."""
    from datasets import load_dataset

    stream = load_dataset(dataset, split=split, streaming=True).shuffle(seed=seed, buffer_size=10_000)
    return list(stream.take(n_images))


def to_pixels(images: Iterable, size: int) -> torch.Tensor:
    """PIL images -> ``(B, 3, size, size)`` in [0, 1] (RADIO conditions its input itself)."""
    import numpy as np

    arrays = [np.asarray(im.convert("RGB").resize((size, size)), dtype=np.float32) / 255.0 for im in images]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2)


def first_k_tokens(model, pixels: torch.Tensor, k: int) -> torch.Tensor:
    """``(B, k, C)`` from ``forward_encoder``; accepts a tensor or an output with ``features``/``last_hidden_state``."""
    out = model.forward_encoder(pixels, num_tokens=k)
    for name in ("features", "last_hidden_state"):
        out = getattr(out, name, out)
    if isinstance(out, tuple):  # (summary, features) as RADIO's forward returns
        out = out[-1]
    if out.dim() != 3 or out.shape[1] < k:
        raise ValueError(f"forward_encoder(num_tokens={k}) returned shape {tuple(out.shape)}, expected (B, >= {k}, C)")
    return out[:, :k]


def knn_leave_one_out_accuracy(features: torch.Tensor, labels: torch.Tensor, k: int) -> float:
    """Each item classified by majority vote (ties: smallest label) of its k cosine-nearest other items."""
    normed = F.normalize(features.double(), dim=-1)
    sims = normed @ normed.T
    sims.fill_diagonal_(-torch.inf)
    neighbours = sims.topk(k, dim=1).indices
    votes = F.one_hot(labels[neighbours], int(labels.max()) + 1).sum(1)
    return float((votes.argmax(1) == labels).double().mean())


def evaluate_hub(cfg: Radio1DConfig, seed: int, data_dir: Path, device: str = "cpu",
                 progress: Progress = no_progress, model=None, rows=None) -> SeedResult:
    hub = cfg.hub
    model = load_hub_model(hub.model, hub.dtype) if model is None else model
    rows = load_subset(hub.dataset, hub.split, hub.n_images, seed) if rows is None else rows
    model = model.to(device)
    labels = torch.tensor([row["label"] for row in rows])
    features = {k: [] for k in cfg.eval.ks}
    with torch.no_grad():
        for start in range(0, len(rows), hub.batch_size):
            pixels = to_pixels([r["image"] for r in rows[start:start + hub.batch_size]], hub.image_size)
            pixels = pixels.to(device=device, dtype=getattr(torch, hub.dtype))
            for k in cfg.eval.ks:
                features[k].append(first_k_tokens(model, pixels, k).float().mean(1).cpu())
            progress(min(1.0, (start + hub.batch_size) / len(rows)), "encoded")
    table = [{"k": k, "knn_accuracy": knn_leave_one_out_accuracy(torch.cat(features[k]), labels, hub.knn_k)}
             for k in cfg.eval.ks]
    return SeedResult(seed).add({f"hub_knn_accuracy_k{r['k']}": r["knn_accuracy"] for r in table},
                                tables={"hub_knn": table})
