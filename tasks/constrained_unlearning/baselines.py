"""Weight-based unlearning baselines the paper compares against, each with a fixed hand-set weight.

"Weight-based" in the abstract is ambiguous (loss weighting or weight-space regularisation); both
readings are implemented:

* :func:`loss_mixing_loss`  DSM(retain) - w DSM(forget), swept over w (loss weighting, gradient ascent on
  the forget data);
* :func:`esd_loss`  ESD-style negative guidance with a fixed eta: regress eps_theta onto
  eps_0 - eta (eps_u - eps_0), with eps_0 the frozen pretrained model and eps_u the forget concept's
  (here: the analytic noised score of q_u, standing in for the conditional branch of a text-to-image model);
* :func:`weight_regularised_loss`  -DSM(forget) + mu ||theta - theta_0||^2, swept over mu (weight-space
  regularisation).

All are the project's reconstructions (README, Fidelity checklist); the paper's baseline hyperparameters are
unknown.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tasks.constrained_unlearning import diffusion
from tasks.constrained_unlearning.mixture import GaussianMixture

LossFn = Callable[[torch.Generator], torch.Tensor]


def _batch(pool: torch.Tensor, batch_size: int, generator: torch.Generator) -> torch.Tensor:
    return pool[torch.randint(0, pool.shape[0], (batch_size,), generator=generator)]


def loss_mixing_loss(model: nn.Module, schedule: diffusion.NoiseSchedule, retain: torch.Tensor,
                     forget: torch.Tensor, weight: float, batch_size: int) -> LossFn:
    """DSM on retained data minus ``weight`` times DSM on forget data."""
    def loss(generator: torch.Generator) -> torch.Tensor:
        kept = diffusion.dsm_loss(model, _batch(retain, batch_size, generator), schedule, generator)
        dropped = diffusion.dsm_loss(model, _batch(forget, batch_size, generator), schedule, generator)
        return kept - weight * dropped
    return loss


def esd_epsilon_target(frozen: nn.Module, forget: GaussianMixture, schedule: diffusion.NoiseSchedule,
                       x_t: torch.Tensor, t: torch.Tensor, eta: float) -> torch.Tensor:
    """eps_0 - eta (eps_u - eps_0): the RU score grad log q - eta (grad log q_u - grad log q) in eps units."""
    abar = schedule.alpha_bars[t]
    with torch.no_grad():
        eps_0 = frozen(x_t, t)
        eps_u = -(1 - abar).sqrt()[:, None] * forget.noised_score_torch(x_t.double(), abar.double()).float()
    return eps_0 - eta * (eps_u - eps_0)


def esd_loss(model: nn.Module, frozen: nn.Module, forget: GaussianMixture, schedule: diffusion.NoiseSchedule,
             pool: torch.Tensor, eta: float, batch_size: int) -> LossFn:
    """ESD-style regression of eps_theta onto the negatively guided frozen model, on noised q-samples."""
    def loss(generator: torch.Generator) -> torch.Tensor:
        x_t, t, _ = diffusion.noise_batch(_batch(pool, batch_size, generator), schedule, generator)
        target = esd_epsilon_target(frozen, forget, schedule, x_t, t, eta)
        return ((model(x_t, t) - target) ** 2).sum(dim=1).mean()
    return loss


def weight_regularised_loss(model: nn.Module, reference: list[torch.Tensor], schedule: diffusion.NoiseSchedule,
                            forget: torch.Tensor, mu: float, batch_size: int) -> LossFn:
    """Gradient ascent on the forget data's DSM, held near the pretrained weights by mu ||theta - theta_0||^2."""
    def loss(generator: torch.Generator) -> torch.Tensor:
        ascent = -diffusion.dsm_loss(model, _batch(forget, batch_size, generator), schedule, generator)
        anchor = sum(((p - p0) ** 2).sum() for p, p0 in zip(model.parameters(), reference))
        return ascent + mu * anchor
    return loss
