"""Baselines of cacr [reconstructed]: similarity-only top-1 retrieval (VBCS's best window) and the dense span
regressor (VSLNet-style start/end heads over the frames, trained with supervision on the same frozen features).
The ablations of the policy itself (no rejection reward, no REJECT action, SFT only) are trained in
``tasks/cacr/train.py`` and differ from the full method only in the reward weight or the masked action."""

from __future__ import annotations

import torch
from torch import Tensor

from tasks.cacr import method
from tasks.cacr.model import GroundingPolicy


def top1_retrieval(candidates: Tensor) -> Tensor:
    """(Q, 2): the highest-scoring VBCS window of each question (candidates are in rank order)."""
    return candidates[:, 0]


@torch.no_grad()
def dense_regression(regressor: GroundingPolicy, features: Tensor, question: Tensor) -> Tensor:
    """(Q, 2): the regressor's best span, argmax over s <= e of start[s] + end[e]."""
    _, _, start, end = regressor(features, question)
    return method.best_span(start, end)
