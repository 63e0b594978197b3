"""Training loops of diffdt (AdamW with warm-up and cosine decay): the event backbone and the conditioned DDPMs."""

from __future__ import annotations

import torch

from tasks.common.schedules import warmup_cosine
from tasks.common.seeding import torch_init_seed
from tasks.diffdt import method
from tasks.diffdt.config import BackboneConfig, DiffusionConfig


def build_backbone(vocab: method.Vocabulary, sensor_dims: dict[str, int], cfg: BackboneConfig, n_positions: int,
                   seed: int) -> method.EventBackbone:
    with torch_init_seed(seed):
        return method.EventBackbone(vocab, sensor_dims, cfg.n_layer, cfg.n_head, cfg.n_embd, n_positions)


def train_backbone(model: method.EventBackbone, tokens: torch.Tensor, ages: torch.Tensor,
                   sensors: dict[str, torch.Tensor] | None, cfg: BackboneConfig, seed: int) -> list[float]:
    """Minibatch AdamW on ``method.backbone_loss``; returns the loss of every step."""
    n = tokens.shape[0]
    per_epoch = max(1, -(-n // cfg.batch_size))
    total = cfg.epochs * per_epoch
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    sched = warmup_cosine(opt, total)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(cfg.epochs):
        order = torch.randperm(n, generator=gen)
        for start in range(0, n, cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            batch_sensors = {o: v[idx] for o, v in sensors.items()} if sensors else None
            loss = method.backbone_loss(model, tokens[idx], ages[idx], batch_sensors)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
    model.eval()
    return losses


def build_denoiser(data_dim: int, cond_dim: int, cfg: DiffusionConfig, seed: int, brain: bool = False
                   ) -> method.Denoiser:
    with torch_init_seed(seed):
        return method.Denoiser(data_dim, cond_dim, cfg.brain_hidden if brain else cfg.hidden, cfg.n_layers)


def train_denoiser(model: method.Denoiser, z0: torch.Tensor, cond: torch.Tensor, cfg: DiffusionConfig,
                   seed: int, cond_dropout: float) -> list[float]:
    """AdamW on ``method.ddpm_loss`` over random minibatches; ``cond_dropout`` 1 trains an unconditional model."""
    schedule = method.NoiseSchedule.linear(cfg.steps)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = warmup_cosine(opt, cfg.train_steps)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(cfg.train_steps):
        idx = torch.randint(0, z0.shape[0], (min(cfg.batch_size, z0.shape[0]),), generator=gen)
        loss = method.ddpm_loss(model, schedule, z0[idx], cond[idx], gen, cond_dropout)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses
