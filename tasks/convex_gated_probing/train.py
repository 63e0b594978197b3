"""Training step of convex_gated_probing: MAE pretraining of the tiny audio ViT, then full fine-tuning.

Checkpoints per seed: ``encoder.safetensors`` (the SSL encoder the probes read, frozen) and
``finetuned.safetensors`` (the fine-tuned encoder and head, the upper bound of Table 5)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.nn import functional as F

from tasks.common.io import save_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.schedules import warmup_cosine
from tasks.common.seeding import torch_init_seed
from tasks.convex_gated_probing.config import ConvexGatedProbingConfig
from tasks.convex_gated_probing.data import N_CLASSES, load_split
from tasks.convex_gated_probing.encoder import MAE, AudioViT, FineTuneModel, layer_decay_groups

ENCODER = "encoder.safetensors"
FINETUNED = "finetuned.safetensors"


def new_encoder(cfg: ConvexGatedProbingConfig) -> AudioViT:
    e = cfg.encoder
    return AudioViT(cfg.data.n_frames, cfg.data.n_mels, e.patch, e.dim, e.depth, e.heads, e.gated_attention)


def pretrain(cfg: ConvexGatedProbingConfig, spec: torch.Tensor, seed: int, progress: Progress
             ) -> tuple[AudioViT, list[float]]:
    e = cfg.encoder
    with torch_init_seed(seed):
        mae = MAE(new_encoder(cfg), e.decoder_dim, e.decoder_depth, e.heads, e.mask_ratio, e.cls_loss_weight)
    mae.encoder.set_input_statistics(spec)
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.AdamW(mae.parameters(), lr=e.ssl_lr, betas=(0.9, 0.95), weight_decay=0.05)
    schedule = warmup_cosine(optimiser, e.ssl_steps)
    losses = []
    for step in range(e.ssl_steps):
        idx = torch.randint(0, spec.shape[0], (min(e.ssl_batch, spec.shape[0]),), generator=generator)
        loss = mae.loss(spec[idx], generator)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        losses.append(float(loss))
        if (step + 1) % max(1, e.ssl_steps // 5) == 0:
            progress(0.7 * (step + 1) / e.ssl_steps, f"MAE step {step + 1}: loss {loss:.4f}")
    return mae.encoder.eval(), losses


def finetune(cfg: ConvexGatedProbingConfig, encoder: AudioViT, spec: torch.Tensor, labels: torch.Tensor,
             seed: int) -> tuple[FineTuneModel, list[float]]:
    f = cfg.finetune
    with torch_init_seed(seed + 1):
        model = FineTuneModel(new_encoder(cfg), N_CLASSES)
    model.encoder.load_state_dict(encoder.state_dict())
    optimiser = torch.optim.AdamW(layer_decay_groups(model, f.lr, f.layer_decay), weight_decay=f.weight_decay)
    schedule = warmup_cosine(optimiser, f.steps)
    generator = torch.Generator().manual_seed(seed + 7)
    model.train()
    losses = []
    for _ in range(f.steps):
        idx = torch.randint(0, spec.shape[0], (min(f.batch, spec.shape[0]),), generator=generator)
        loss = F.binary_cross_entropy_with_logits(model(spec[idx]), labels[idx])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        losses.append(float(loss))
    return model.eval(), losses


def train(cfg: ConvexGatedProbingConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    unlabelled, _ = load_split(cfg.data, data_dir, "unlabelled", seed)
    train_spec, train_labels = load_split(cfg.data, data_dir, "train", seed)
    with result.stage("ssl"):
        encoder, ssl_losses = pretrain(cfg, unlabelled, seed, progress)
    save_state_dict(encoder, Path(model_dir) / ENCODER)
    with result.stage("finetune"):
        model, ft_losses = finetune(cfg, encoder, train_spec, train_labels, seed)
    save_state_dict(model, Path(model_dir) / FINETUNED)
    progress(1.0, f"MAE loss {ssl_losses[-1]:.4f}, fine-tune loss {ft_losses[-1]:.4f}")
    return result.add(final_ssl_loss=ssl_losses[-1], final_finetune_loss=ft_losses[-1],
                      curves={"ssl_loss": ssl_losses, "finetune_loss": ft_losses})
