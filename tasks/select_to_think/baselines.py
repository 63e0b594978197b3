"""Baselines of the paper: SLM greedy, SLM majority vote over sampled paths (Maj@N, self-consistency), and the
LLM alone. Takeover (the LLM generates at the triggers) lives in method.py next to S2T, since it shares its
decoding loop (``DecodePolicy(action="takeover")``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tasks.select_to_think.method import DecodePolicy, decode


def majority_vote(answers: Sequence[Any]) -> Any:
    """The most frequent non-None answer; ties go to the answer reached first (a deterministic rule).
    None when every path failed to produce an answer."""
    valid = [a for a in answers if a is not None]
    if not valid:
        return None
    counts = Counter(valid)
    top = max(counts.values())
    return next(a for a in valid if counts[a] == top)


def majority_at_n(slm: Any, prompts: torch.Tensor, max_new_tokens: int, n_samples: int, temperature: float,
                  parse: Callable[[list[int]], Any], seed: int, reserved: Sequence[int] = (),
                  eos_id: int | None = None) -> list[Any]:
    """Maj@N: N temperature samples per prompt (one batched decode of N copies), majority answer per prompt."""
    repeated = prompts.repeat_interleave(n_samples, dim=0)
    trace = decode(slm, repeated, max_new_tokens, DecodePolicy(action="sample", temperature=temperature),
                   reserved=reserved, eos_id=eos_id, generator=torch.Generator().manual_seed(seed))
    answers = [parse(row) for row in trace.tokens.tolist()]
    return [majority_vote(answers[i * n_samples:(i + 1) * n_samples]) for i in range(len(prompts))]


def greedy_answers(model: Any, prompts: torch.Tensor, max_new_tokens: int, parse: Callable[[list[int]], Any],
                   reserved: Sequence[int] = (), eos_id: int | None = None) -> list[Any]:
    """Greedy decoding of one model alone (SLM greedy, or the LLM-only upper reference)."""
    trace = decode(model, prompts, max_new_tokens, DecodePolicy(), reserved=reserved, eos_id=eos_id)
    return [parse(row) for row in trace.tokens.tolist()]
