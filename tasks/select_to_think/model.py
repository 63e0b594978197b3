"""What train.py and evaluate.py share at the smoke / cpu profiles: the tiny GPT-2 pair, one seed's splits as
addition tasks, the decoding policies with their calibrated triggers, the hit@K counts, the class-only chance
ranker of C1's precondition, the held-out scorer counts of C5/C6's preconditions, and the names of the checkpoint
folders in ``models/select_to_think/seed<N>/``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from tasks.common import tiny_lm
from tasks.common.checkpoints import load_gpt2
from tasks.select_to_think import data, method
from tasks.select_to_think.config import S2TConfig, SelectToThinkConfig, TinyLMConfig

# Checkpoint folders of one seed (tiny_lm.save_model: config.json + model.safetensors); LOCAL_FROZEN is
# S2T-Local with the body frozen (only the reserved rows trained), the control of C5b / C6b.
LLM, SLM, LOCAL, LOCAL_FROZEN = "llm", "slm", "slm_local", "slm_local_frozen"


def build_lm(lm: TinyLMConfig, vocab_size: int, width: int, seed: int, untied: bool) -> torch.nn.Module:
    """A GPT-2 over the addition vocabulary plus the reserved bins. The SLM's head is untied so that
    S2T-Local can move only its reserved rows (claim C8)."""
    config = tiny_lm.tiny_gpt2_config(vocab_size, data.sequence_length(width) + 1, lm.n_layer, lm.n_head, lm.n_embd)
    config.tie_word_embeddings = not untied
    return tiny_lm.build_tiny_gpt2(config, seed=seed)


def load_lm(model_dir: Path, name: str) -> torch.nn.Module:
    """One trained model of the seed (``LLM``, ``SLM`` or ``LOCAL``), in eval mode (thread-safe: the seeds
    evaluate on parallel threads; tasks/common/checkpoints.py)."""
    return load_gpt2(Path(model_dir) / name)


class AdditionTask:
    """Prompts, answers and parsing of one split at one width."""

    def __init__(self, frame: pl.DataFrame, width: int):
        self.width = width
        self.prompts = data.prompts_tensor(frame, width)
        self.truth = [a + b for a, b in zip(frame["a"].to_list(), frame["b"].to_list())]
        self.steps = data.generated_length(width)

    def parse(self, row: list[int]) -> int | None:
        return data.decode_answer(row, self.width)

    def accuracy(self, answers: list[int | None]) -> float:
        return float(np.mean([a == t for a, t in zip(answers, self.truth)]))

    def correct(self, answers: list[int | None]) -> float:
        """The number of problems solved (an integer, as a float: the binomial claims pool it over seeds)."""
        return float(sum(a == t for a, t in zip(answers, self.truth)))

    def trace_accuracy(self, trace: method.DecodeTrace) -> float:
        return self.accuracy([self.parse(row) for row in trace.tokens.tolist()])


@dataclass(frozen=True)
class Setup:
    """One seed's problems read from the data phase, and the vocabulary layout of the pair."""

    width: int
    reserved: list[int]  # the S2T-Local score bins, ids BASE_VOCAB .. BASE_VOCAB + n_bins - 1
    vocab: int
    train: torch.Tensor  # (N, sequence_length) full training sequences
    calibration: AdditionTask
    collection: AdditionTask
    test: AdditionTask

    @property
    def prompt_len(self) -> int:
        return data.prompt_length(self.width)


def load_setup(config: SelectToThinkConfig, seed: int, data_dir: Path) -> Setup:
    splits = data.read_problems(Path(data_dir), seed, config.data.model_dump(mode="json"))
    width = config.data.max_digits
    calibration, collection, test = (AdditionTask(splits[name], width)
                                     for name in ("calibration", "collection", "test"))
    return Setup(width=width, reserved=method.bin_ids(data.BASE_VOCAB, config.local.n_bins),
                 vocab=data.BASE_VOCAB + config.local.n_bins, train=data.problems_tensor(splits["train"], width),
                 calibration=calibration, collection=collection, test=test)


def policy_for(s2t: S2TConfig, action: str, trigger: str, threshold: float = math.inf, rate: float = 0.0
               ) -> method.DecodePolicy:
    return method.DecodePolicy(action=action, trigger=trigger, threshold=threshold, random_rate=rate,
                               warmup_steps=s2t.warmup_steps, support_size=s2t.support_size, k=s2t.k_eval,
                               ratio_to_max=s2t.ratio_to_max if action == "s2t" else None)


def calibrate(slm: Any, task: AdditionTask, s2t: S2TConfig, trigger: str, reserved: list[int],
              llm: Any = None) -> float:
    """Threshold = the ``s2t.quantile`` of the trigger score along the SLM's greedy paths on calibration
    problems (steps after the warm-up)."""
    trace = method.decode(slm, task.prompts, task.steps, policy_for(s2t, "greedy", trigger), llm=llm,
                          reserved=reserved)
    return method.calibrate_threshold(trace.scores, s2t.quantile)


def hit_counts(hits: dict[int, list[bool]], ks: list[int]) -> dict[str, float]:
    """Counts over the trigger steps (the trials of the hit-rate claims, pooled over seeds): hits at each K, and,
    when 1 and 8 are among ``ks``, the steps where the LLM's token is in the SLM's top-8 but not its top-1 (C2).
    The disagreement C1's precondition reads is derived from these in claim_metrics.py."""
    triggers = len(hits[ks[0]]) if ks else 0
    out = {"trigger_count": float(triggers)} | {f"hit_at_{k}_count": float(sum(hits[k])) for k in ks}
    if 1 in ks and 8 in ks:
        out["hit8_not_hit1_count"] = float(sum(h8 and not h1 for h1, h8 in zip(hits[1], hits[8])))
    return out


def class_chance_counts(class_sizes: Sequence[int], in_class: Sequence[bool], ks: Sequence[int], vocab: int,
                        rng: np.random.Generator) -> dict[str, float]:
    """Hits at each K of a ranker that knows only the class of the next token (C1's chance baseline): it lists
    the class's tokens first in a uniformly random order, then the other tokens in a uniformly random order.
    One trigger step per entry (``class_sizes``, and whether the LLM's token is in the class); the target's
    rank is drawn once per step, so the hits are nested in K. The counts share C1's trials (``trigger_count``)."""
    sizes = np.asarray(class_sizes, dtype=float)
    inside = np.asarray(in_class, dtype=bool)
    u = rng.random(len(sizes))
    rank = np.where(inside, np.floor(u * sizes), sizes + np.floor(u * (vocab - sizes)))
    return {f"class_chance_hit_at_{k}_count": float((rank < k).sum()) for k in ks}


def exact_chance_hits(class_sizes: Sequence[int], in_class: Sequence[bool], ks: Sequence[int], vocab: int
                      ) -> dict[str, float]:
    """The expected number of hits at each K of the random ranking of ``class_chance_counts``, computed exactly
    (``method.random_ranking_hit_probability`` summed over the trigger steps): C1b's chance level, with no
    sampling noise. A sum of probabilities (not an integer): divided by ``trigger_count`` it is the chance hit@K."""
    return {f"chance_hit_at_{k}_expected": float(sum(method.random_ranking_hit_probability(n, inside, k, vocab)
                                                     for n, inside in zip(class_sizes, in_class)))
            for k in ks}


def class_chance_at_triggers(fired: torch.Tensor, targets: torch.Tensor, classes: Sequence[Sequence[int]],
                             ks: Sequence[int], vocab: int, rng: np.random.Generator) -> dict[str, float]:
    """``class_chance_counts`` over the trigger steps of a decode (``fired`` (B, T)), with the classes the format
    puts at each generated step (``data.format_classes``) and the LLM's preferred tokens ``targets`` (B, T)."""
    rows, steps = fired.nonzero(as_tuple=True)
    sizes = [len(classes[s]) for s in steps.tolist()]
    inside = [int(targets[r, s]) in classes[s] for r, s in zip(rows.tolist(), steps.tolist())]
    return class_chance_counts(sizes, inside, ks, vocab, rng) | exact_chance_hits(sizes, inside, ks, vocab)


def scorer_counts(model: Any, groups: method.CandidateGroups, reserved: Sequence[int], batch_groups: int,
                  pad_id: int = 0) -> dict[str, float]:
    """S2T-Local's scorer on held-out groups (collected like its training data, on problems it never saw): how
    often its bin scores pick the teacher's candidate (the argmax of the teacher's probabilities over the
    candidates), and how often the SLM's top-1 is that candidate (candidate 0: the SLM's top-k, most probable
    first). C5/C6's precondition: the scorer must beat the SLM's own top-1 at its task."""
    teacher = groups.teacher_probs.argmax(-1)
    return {"heldout_group_count": float(len(groups)),
            "local_scorer_teacher_count": scorer_teacher_count(model, groups, reserved, batch_groups, pad_id),
            "slm_top1_teacher_count": float((teacher == 0).sum()),
            # a uniformly random pick among a group's candidates finds the teacher's with probability 1 / K
            "scorer_chance_expected": float(len(groups)) / groups.candidates.shape[1] if len(groups) else 0.0}


def scorer_teacher_count(model: Any, groups: method.CandidateGroups, reserved: Sequence[int], batch_groups: int,
                         pad_id: int = 0) -> float:
    """Held-out groups on which the bin scores' argmax is the teacher's candidate (the LLM's argmax over the
    group's candidates). Ties at the top score count 1 / (number tied) when the teacher's candidate is among
    them (a random tie-break), so a collapsed scorer (every score equal) gets chance, 1 / K, not the SLM's top-1
    that ``argmax`` would return."""
    teacher = groups.teacher_probs.argmax(-1)
    total = 0.0
    for start in range(0, len(groups), batch_groups):
        part = groups.subset(torch.arange(start, min(start + batch_groups, len(groups))))
        with torch.no_grad():
            scores = method.candidate_scores(model, part.prefixes, part.lengths, part.candidates, reserved, pad_id)
        top = scores == scores.max(-1, keepdim=True).values
        chosen = top.gather(-1, teacher[start:start + len(part), None].to(top.device)).squeeze(-1)
        total += float((chosen.double() / top.sum(-1).double()).sum())
    return total
