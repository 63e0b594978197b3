"""Negative-control baseline of selfjudge's evaluation: a judge that knows nothing.

``RandomAcceptRule(q)`` accepts every draft token equal to the target's argmax and each mismatch with
probability q, independently of what the token means. It traces the speed / accuracy curve that blind
acceptance buys; a judge (SelfJudge or AutoJudge) that is better than chance must lie above it at equal tokens
per target call. Used at evaluation only (training never imports this module)."""

from __future__ import annotations

import numpy as np

from tasks.selfjudge.method import Window, judge_accept_mask


class RandomAcceptRule:
    """Accept a mismatch with probability ``q`` (q = 0: exact speculative decoding; q = 1: accept every draft)."""

    def __init__(self, q: float, seed: int) -> None:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must lie in [0, 1], got {q}")
        self.q = q
        self.rng = np.random.default_rng(seed)

    def __call__(self, window: Window) -> list[bool]:
        match = [p == t for p, t in zip(window.proposal, window.target_argmax)]
        # a uniform draw u < q accepts: the same comparison as the head's p < threshold, with p ~ U(0, 1)
        draws = [1.0 if m else float(self.rng.random()) for m in match]
        return judge_accept_mask(match, draws, self.q)
