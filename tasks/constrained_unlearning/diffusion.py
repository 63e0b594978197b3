"""A small DDPM for 2-D points: noise schedule, MLP epsilon-network, (weighted) DSM loss, ancestral sampler.

Ho et al. (2020) DDPM with a linear beta schedule scaled to T steps. Everything random draws from an
explicit ``torch.Generator``; module initialisation runs under ``torch_init_seed`` so that seeds trained
on parallel threads stay reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tasks.common.schedules import warmup_cosine
from tasks.common.seeding import torch_init_seed


@dataclass(frozen=True)
class NoiseSchedule:
    """beta_t linear from 1e-4 * 1000 / T to 0.02 * 1000 / T (the DDPM schedule stretched to T steps)."""

    betas: torch.Tensor

    @classmethod
    def linear(cls, timesteps: int) -> NoiseSchedule:
        if timesteps < 2:
            raise ValueError(f"timesteps must be >= 2, got {timesteps}")
        scale = 1000.0 / timesteps
        return cls(torch.linspace(1e-4 * scale, min(0.02 * scale, 0.999), timesteps, dtype=torch.float32))

    @property
    def timesteps(self) -> int:
        return int(self.betas.shape[0])

    @property
    def alpha_bars(self) -> torch.Tensor:
        return torch.cumprod(1.0 - self.betas, dim=0)


def time_embedding(t: torch.Tensor, dim: int, timesteps: int) -> torch.Tensor:
    """Sinusoidal embedding of the step index, scaled to [0, 1] first."""
    half = dim // 2
    freqs = torch.exp(-math.log(100.0) * torch.arange(half, dtype=torch.float32) / max(1, half - 1))
    angles = (t.float() / timesteps)[:, None] * freqs[None, :] * 2 * math.pi * 10
    return torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)


class EpsilonMLP(nn.Module):
    """eps_theta(x_t, t): an MLP on [x_t, sinusoidal(t)] with SiLU activations."""

    def __init__(self, hidden: int, layers: int, time_dim: int, timesteps: int, dim: int = 2) -> None:
        super().__init__()
        self.time_dim, self.timesteps = time_dim, timesteps
        widths = [dim + time_dim] + [hidden] * layers
        blocks: list[nn.Module] = []
        for w_in, w_out in zip(widths, widths[1:]):
            blocks += [nn.Linear(w_in, w_out), nn.SiLU()]
        blocks.append(nn.Linear(widths[-1], dim))
        self.net = nn.Sequential(*blocks)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x_t, time_embedding(t, self.time_dim, self.timesteps)], dim=1))


def build_model(hidden: int, layers: int, time_dim: int, timesteps: int, seed: int) -> EpsilonMLP:
    with torch_init_seed(seed):
        return EpsilonMLP(hidden, layers, time_dim, timesteps)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def noise_batch(x0: torch.Tensor, schedule: NoiseSchedule, generator: torch.Generator
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_t, t, eps) with t uniform on {0..T-1} and x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) eps."""
    t = torch.randint(0, schedule.timesteps, (x0.shape[0],), generator=generator)
    eps = torch.randn(x0.shape, generator=generator)
    abar = schedule.alpha_bars[t][:, None]
    return abar.sqrt() * x0 + (1 - abar).sqrt() * eps, t, eps


def dsm_loss(model: nn.Module, x0: torch.Tensor, schedule: NoiseSchedule, generator: torch.Generator,
             weights: torch.Tensor | None = None) -> torch.Tensor:
    """Denoising score matching ||eps - eps_theta(x_t, t)||^2, averaged with optional per-sample weights."""
    x_t, t, eps = noise_batch(x0, schedule, generator)
    per_sample = ((model(x_t, t) - eps) ** 2).sum(dim=1)
    if weights is None:
        return per_sample.mean()
    return (weights * per_sample).sum() / weights.sum()


@torch.no_grad()
def sample(model: nn.Module, schedule: NoiseSchedule, n: int, generator: torch.Generator) -> torch.Tensor:
    """Ancestral DDPM sampling with sigma_t^2 = beta_t."""
    betas, abars = schedule.betas, schedule.alpha_bars
    x = torch.randn((n, 2), generator=generator)
    for step in reversed(range(schedule.timesteps)):
        t = torch.full((n,), step, dtype=torch.long)
        eps = model(x, t)
        mean = (x - betas[step] / (1 - abars[step]).sqrt() * eps) / (1 - betas[step]).sqrt()
        noise = torch.randn(x.shape, generator=generator) if step > 0 else torch.zeros_like(x)
        x = mean + betas[step].sqrt() * noise
    return x


def train(model: nn.Module, loss_fn: Callable[[torch.Generator], torch.Tensor], steps: int, lr: float,
          generator: torch.Generator, on_step: Callable[[int, float], None] | None = None,
          cosine_decay: bool = False) -> list[float]:
    """Adam on ``loss_fn(generator)`` for ``steps`` steps; the loss curve. ``cosine_decay``: the learning rate
    lr 0.5 (1 + cos(pi step / steps)) at each step, without warm-up (``tasks.common.schedules.warmup_cosine``)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    scheduler = warmup_cosine(optimizer, steps, warmup_steps=0) if cosine_decay else None
    losses = []
    for step in range(steps):
        loss = loss_fn(generator)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    return losses


def denoising_mean(model: nn.Module, schedule: NoiseSchedule, x: torch.Tensor, step: int) -> torch.Tensor:
    """Mean of the ancestral step p_theta(x_{step-1} | x_step): (x - beta / sqrt(1 - abar) eps_theta) / sqrt(1 - beta)
    (Ho et al. 2020, eq. 11; the same arithmetic as :func:`sample`)."""
    betas, abars = schedule.betas, schedule.alpha_bars
    eps = model(x, torch.full((x.shape[0],), step, dtype=torch.long))
    return (x - betas[step] / (1 - abars[step]).sqrt() * eps) / (1 - betas[step]).sqrt()


@torch.no_grad()
def sample_trajectory(model: nn.Module, schedule: NoiseSchedule, n: int, generator: torch.Generator) -> torch.Tensor:
    """Every state of ``n`` ancestral chains, shape (T + 1, n, 2): ``states[T]`` is the starting noise and
    ``states[s]`` the output of step s from ``states[s + 1]``. Unlike :func:`sample`, the last step also adds its
    noise (variance beta_0), so that every step is a Gaussian policy with a log-probability (REINFORCE)."""
    states = [torch.randn((n, 2), generator=generator)]
    for step in reversed(range(schedule.timesteps)):
        mean = denoising_mean(model, schedule, states[-1], step)
        states.append(mean + schedule.betas[step].sqrt() * torch.randn((n, 2), generator=generator))
    return torch.stack(states[::-1])
