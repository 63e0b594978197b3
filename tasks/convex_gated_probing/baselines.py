"""Training of the probe heads on cached frozen features, and the probe baselines.

- ``train_head``: the official CGP training recipe (esc50_cgp_config.yaml): AdamW (0.9, 0.999), warm-up then
  cosine decay of the lr to 1e-6, weight decay, binary cross-entropy, no augmentation; used for CGP, LCGP and
  ProtoBin (``method``).
- ``linear_probe_map``: LP, the convex linear probe solved to its optimum (``method.fit_linear_probe``).
- Head2Toe-lite (Evci et al. 2022, simplified): all layers' [cls, mean patch] features concatenated, a
  group-lasso penalty per layer group, solved by proximal gradient; the groups it keeps say which layers it used.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from tasks.common.schedules import warmup_cosine_factor
from tasks.convex_gated_probing import method

FINAL_LR = 1e-6


def train_head(head: nn.Module, patch: torch.Tensor, cls: torch.Tensor | None, labels: torch.Tensor, *,
               steps: int, batch: int, lr: float, warmup_steps: int, weight_decay: float,
               generator: torch.Generator, frozen: tuple[str, ...] = ()) -> list[float]:
    """Minibatch AdamW on BCE with the official schedule (warm-up, cosine from lr to 1e-6).

    ``frozen`` names parameters that are not trained (e.g. ``gate_logits`` for the frozen-gate control).
    ``generator`` draws the minibatches AND the head's dropout masks (``method.GeneratorDropout``), so the trained
    head is a function of the seed alone, whatever other threads draw from torch's global generator.
    Returns the training loss per step."""
    method.attach_dropout_generator(head, generator)
    params = [p for name, p in head.named_parameters() if name not in frozen]
    for name, p in head.named_parameters():
        p.requires_grad_(name not in frozen)
    optimiser = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), weight_decay=weight_decay)
    floor = FINAL_LR / lr
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: floor + (1 - floor) * warmup_cosine_factor(s, steps, warmup_steps))
    head.train()
    losses = []
    n = labels.shape[0]
    for _ in range(steps):
        idx = torch.randint(0, n, (min(batch, n),), generator=generator)
        loss = F.binary_cross_entropy_with_logits(head(patch[idx], None if cls is None else cls[idx]), labels[idx])
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
        losses.append(float(loss))
    head.eval()
    return losses


@torch.no_grad()
def head_scores(head: nn.Module, patch: torch.Tensor, cls: torch.Tensor | None, chunk: int = 256) -> np.ndarray:
    head.eval()
    out = [head(patch[i:i + chunk], None if cls is None else cls[i:i + chunk]) for i in range(0, patch.shape[0], chunk)]
    return torch.cat(out).numpy()


def linear_probe_map(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                     l2: float) -> tuple[float, float]:
    """LP on standardised features solved to optimality; returns (test macro mAP, largest gradient entry)."""
    x_train, x_test = method.standardise(train_x.double(), test_x.double())
    y_train = train_y.double()
    weight, bias = method.fit_linear_probe(x_train, y_train, l2)
    scores = (x_test @ weight.T + bias).numpy()
    gradient = method.linear_probe_gradient_norm(weight, bias, x_train, y_train, l2)
    return method.macro_map(scores, test_y.numpy()), gradient


def head2toe_features(patch: torch.Tensor, cls: torch.Tensor) -> torch.Tensor:
    """(B, L, 2D): every layer's [cls, mean patch token], the groups of Head2Toe-lite."""
    return torch.cat([cls, patch.mean(dim=2)], dim=-1)


def group_soft_threshold(weight: torch.Tensor, threshold: float) -> torch.Tensor:
    """Proximal operator of threshold * sum_g ||W_g||_2 for W (C, L, G): each layer group shrinks by
    ``threshold`` in norm, and vanishes when its norm is below it."""
    norms = weight.pow(2).sum(dim=(0, 2), keepdim=True).sqrt()
    return weight * (1 - threshold / norms.clamp_min(1e-12)).clamp_min(0)


def fit_head2toe(train: torch.Tensor, labels: torch.Tensor, group_l2: float, steps: int, lr: float
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Proximal gradient (ISTA) on mean BCE + group_l2 * sum_l ||W_l||_2 for features (B, L, G) already
    standardised; returns W (C, L, G) and b (C)."""
    n_classes = labels.shape[1]
    weight = torch.zeros(n_classes, train.shape[1], train.shape[2], dtype=train.dtype, requires_grad=True)
    bias = torch.zeros(n_classes, dtype=train.dtype, requires_grad=True)
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(torch.einsum("blg,clg->bc", train, weight) + bias, labels)
        g_w, g_b = torch.autograd.grad(loss, (weight, bias))
        with torch.no_grad():
            weight.copy_(group_soft_threshold(weight - lr * g_w, lr * group_l2))
            bias -= lr * g_b
    return weight.detach(), bias.detach()


def head2toe_map(train_patch: torch.Tensor, train_cls: torch.Tensor, train_y: torch.Tensor,
                 test_patch: torch.Tensor, test_cls: torch.Tensor, test_y: torch.Tensor,
                 group_l2: float, steps: int, lr: float) -> tuple[float, list[float]]:
    """Head2Toe-lite test mAP and the norm of each layer's weight group (which layers it selected)."""
    train = head2toe_features(train_patch, train_cls).double()
    test = head2toe_features(test_patch, test_cls).double()
    layers, width = train.shape[1:]
    flat_train, flat_test = method.standardise(train.reshape(train.shape[0], -1), test.reshape(test.shape[0], -1))
    weight, bias = fit_head2toe(flat_train.reshape(-1, layers, width), train_y.double(), group_l2, steps, lr)
    scores = torch.einsum("blg,clg->bc", flat_test.reshape(-1, layers, width), weight) + bias
    return method.macro_map(scores.numpy(), test_y.numpy()), weight.pow(2).sum(dim=(0, 2)).sqrt().tolist()
