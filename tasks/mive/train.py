"""Training step of mive: pretrain the tiny VLM on captions and freeze it, then train every DiT variant on the
frozen VLM's features with rectified flow (same data, same steps, same seed for every variant)."""

from __future__ import annotations

from pathlib import Path

import torch

from tasks.common.io import save_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.tiny_vlm import save_vlm
from tasks.mive import data, model
from tasks.mive.config import MiveConfig

VLM_DIR = "vlm"


def editor_file(variant: str) -> str:
    return f"editor_{variant}.safetensors"


def needed_layers(cfg: MiveConfig, n_states: int) -> set[int]:
    """Non-negative hidden-state indices any configured variant conditions on."""
    return {i % n_states for v in cfg.dit.variants for i in model.variant_layers(v, cfg.dit.first_layer)}


def train(cfg: MiveConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        from tasks.mive import hub

        return hub.train_hub(cfg, seed, model_dir)
    result = SeedResult(seed)
    vlm_frame = data.load_split(data_dir, "vlm", seed)
    vlm_arrays = data.clip_arrays(vlm_frame, 1, cfg.data.image_size)
    captions = torch.from_numpy(data.caption_ids(vlm_frame))
    with result.stage("vlm"):
        vlm, vlm_losses = model.pretrain_vlm(cfg, seed, model.vlm_images(vlm_arrays),
                                             torch.from_numpy(vlm_arrays["ids"]), captions)
    for p in vlm.parameters():
        p.requires_grad_(False)
    save_vlm(vlm, Path(model_dir) / VLM_DIR)
    progress(0.1, f"VLM pretrained, caption loss {vlm_losses[-1]:.3f}")

    arrays = data.clip_arrays(data.load_split(data_dir, "train", seed), cfg.data.frames, cfg.data.image_size)
    states = model.vlm_hidden_states(vlm, model.vlm_images(arrays), torch.from_numpy(arrays["ids"]))
    train_set = model.edit_set(arrays, states, needed_layers(cfg, len(states)))
    curves = {"vlm_caption_loss": vlm_losses}
    metrics = {"vlm_final_caption_loss": sum(vlm_losses[-20:]) / len(vlm_losses[-20:])}
    for k, variant in enumerate(cfg.dit.variants):
        with result.stage(f"dit_{variant}"):
            editor, losses = model.train_editor(cfg, variant, seed, train_set)
        save_state_dict(editor, Path(model_dir) / editor_file(variant))
        curves[f"dit_loss_{variant}"] = losses
        metrics[f"dit_final_loss_{variant}"] = sum(losses[-50:]) / len(losses[-50:])
        progress(0.1 + 0.9 * (k + 1) / len(cfg.dit.variants), f"{variant}: final loss {losses[-1]:.3f}")
    return result.add(metrics, curves=curves)
