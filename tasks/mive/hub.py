"""Paper profile of mive: the multiscale condition tokens of a real vision-language model from the hub.

``vlm_layer_features`` runs a ``transformers`` model (Qwen3-VL at the paper profile: ``hub.vlm``) with
``output_hidden_states=True`` and returns the hidden states at ``hub.layers`` (default ``(1, -1)``; the
alternative reading of "first layer", the embedding output, is ``hub.alt_layers = (0, -1)``) through the same
``method.select_layers`` as the cpu profile. Not implemented (GPU-days at the paper's scale, 8x80 GB): training
the Wan-family DiT (``hub.dit``) on those tokens and the FLUX.1 Kontext reference edits, so ``train_hub`` and
``evaluate_hub`` raise ``NotImplementedError`` naming what is missing. Tested with a local stand-in model
(tests/unit/test_mive_steps.py); never run in CI."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from tasks.common.results import SeedResult
from tasks.mive import method
from tasks.mive.config import MiveConfig


def load_vlm(name: str, dtype: str, device: str = "cpu") -> tuple[Any, Any]:
    """Processor and model of a hub vision-language model (``AutoModelForImageTextToText``), frozen, eval mode."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(name)
    model = AutoModelForImageTextToText.from_pretrained(name, dtype=getattr(torch, dtype)).to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return processor, model


@torch.no_grad()
def vlm_layer_features(model: Any, inputs: Mapping[str, torch.Tensor], layers: Sequence[int]) -> list[torch.Tensor]:
    """Hidden states at ``layers`` of ``model(**inputs, output_hidden_states=True)`` (MiVE's condition tokens
    before the per-layer projectors)."""
    out = model(**inputs, output_hidden_states=True)
    return method.select_layers(out.hidden_states, layers)


def train_hub(cfg: MiveConfig, seed: int, model_dir: Path) -> SeedResult:
    raise NotImplementedError(f"mive.paper: training the {cfg.hub.dit} DiT on {cfg.hub.vlm} features is not "
                              "implemented (needs the paper's training set and GPU-days); the library pieces are "
                              "hub.vlm_layer_features and method.EditDiT")


def evaluate_hub(cfg: MiveConfig, seed: int, model_dir: Path) -> SeedResult:
    raise NotImplementedError("mive.paper: no trained paper-scale DiT to evaluate (see train_hub)")
