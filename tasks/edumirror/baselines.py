"""Baselines of edumirror: agents without values.

``RandomPolicy`` selects uniformly among the proposed options, ignoring their utility: the planner's harness
(propose, act, reflect) without the value system. In the public-goods game it is
``simulation.public_goods_run(..., random_policy=True)``; its contribution rate must not depend on theta, which
shows that E3's dependence on the SVO angle comes from the utilities, not from the game.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tasks.edumirror.simulation import AgentView, Option


@dataclass(frozen=True)
class RandomPolicy:
    def select(self, view: Callable[[], AgentView], options: Sequence[Option], utilities: np.ndarray,
               rng: np.random.Generator) -> int:
        return int(rng.integers(len(options)))
