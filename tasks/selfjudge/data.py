"""Procedural data of selfjudge (the project's toy design; the paper uses GSM8K, LiveCodeBench and Dolly).

Two tasks share one word-level vocabulary and one corpus:

- arithmetic word problems with a verifiable answer. Prompt ``<math> tom has 3 apples , buys 4 , loses 2 .``;
  response ``first 3 plus 4 is 7 . then 7 minus 2 is 5 . so the answer is 5 . <eos>``. Every number of the
  response is copied or computed from the prompt (determined by context), every word from a synonym group is a
  free uniform choice (``first|initially``, ``plus|add``, ``is|makes|equals``, ...), and a filler ``well ,`` opens
  30% of responses: the target should be confident on numbers and spread on synonyms.
- object descriptions with no answer checker. Prompt ``<desc> describe the big red ball .``; response
  ``the ball is big and red . it looks nice . <eos>``. The size, colour and object are slots copied from the
  prompt; ``looks|seems|appears`` and ``nice|fine|lovely`` are free choices.

Mismatch kinds (``mismatch_kind``): a substitution inside one synonym group (or of the filler) is ``style``; one
that replaces a number, an operator or a slot word is ``meaning``; anything else is ``other``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.io import write_parquet
from tasks.selfjudge.config import SelfJudgeConfig

MAX_NUMBER = 19
MAX_OPERAND = 5
NAMES = ["tom", "ann", "bob", "eve", "sam"]
OBJECTS = ["apples", "pens", "cards", "coins"]
PLUS_VERBS = ["buys", "gets", "finds"]
MINUS_VERBS = ["loses", "eats", "sells"]
SYNONYM_GROUPS: dict[str, list[str]] = {
    "opener": ["first", "initially"],
    "plus": ["plus", "add"],
    "minus": ["minus", "less"],
    "equals": ["is", "makes", "equals"],
    "connector": ["then", "next"],
    "conclusion": ["so", "thus", "hence"],
    "looks": ["looks", "seems", "appears"],
    "nice": ["nice", "fine", "lovely"],
}
SIZES = ["big", "small", "tiny", "huge"]
COLOURS = ["red", "blue", "green", "black", "white"]
THINGS = ["ball", "box", "cup", "hat", "car"]
FILLER = ["well", ","]
FILLER_RATE = 0.3
SPECIALS = ["<math>", "<desc>", "<eos>", ".", ",", "?", ":", "the", "answer", "has", "describe", "it", "and"]
NUMBERS = [str(n) for n in range(MAX_NUMBER + 1)]
VOCAB: list[str] = list(dict.fromkeys(
    SPECIALS + NUMBERS + NAMES + OBJECTS + PLUS_VERBS + MINUS_VERBS + FILLER
    + [w for group in SYNONYM_GROUPS.values() for w in group] + SIZES + COLOURS + THINGS))
TOKEN_ID = {w: i for i, w in enumerate(VOCAB)}
EOS = TOKEN_ID["<eos>"]
GROUP_OF = {w: g for g, words in SYNONYM_GROUPS.items() for w in words}
SLOT_WORDS = set(SIZES) | set(COLOURS) | set(THINGS)
TASKS = ("arith", "desc")


def encode(words: list[str]) -> list[int]:
    return [TOKEN_ID[w] for w in words]


def decode(ids: list[int]) -> list[str]:
    return [VOCAB[i] for i in ids]


def arithmetic_example(rng: np.random.Generator, n_steps: int) -> tuple[list[str], list[str], int]:
    """(prompt words, response words, answer) of one word problem with ``n_steps`` operations."""
    total = int(rng.integers(1, MAX_NUMBER - MAX_OPERAND + 1))
    prompt = ["<math>", str(rng.choice(NAMES)), "has", str(total), str(rng.choice(OBJECTS))]
    response = ["well", ","] if rng.random() < FILLER_RATE else []
    pick = lambda group: str(rng.choice(SYNONYM_GROUPS[group]))  # noqa: E731
    for step in range(n_steps):
        plus = total + MAX_OPERAND <= MAX_NUMBER and (total < MAX_OPERAND or rng.random() < 0.5)
        operand = int(rng.integers(1, min(MAX_OPERAND, MAX_NUMBER - total if plus else total) + 1))
        prompt += [",", str(rng.choice(PLUS_VERBS if plus else MINUS_VERBS)), str(operand)]
        result = total + operand if plus else total - operand
        response += [pick("opener") if step == 0 else pick("connector"), str(total),
                     pick("plus" if plus else "minus"), str(operand), pick("equals"), str(result), "."]
        total = result
    prompt.append(".")
    response += [pick("conclusion"), "the", "answer", pick("equals"), str(total), ".", "<eos>"]
    return prompt, response, total


def description_example(rng: np.random.Generator) -> tuple[list[str], list[str], tuple[str, str, str]]:
    """(prompt words, response words, (size, colour, thing)) of one object description."""
    size, colour, thing = str(rng.choice(SIZES)), str(rng.choice(COLOURS)), str(rng.choice(THINGS))
    prompt = ["<desc>", "describe", "the", size, colour, thing, "."]
    response = ["well", ","] if rng.random() < FILLER_RATE else []
    response += ["the", thing, str(rng.choice(SYNONYM_GROUPS["equals"])), size, "and", colour, "."]
    response += ["it", str(rng.choice(SYNONYM_GROUPS["looks"])), str(rng.choice(SYNONYM_GROUPS["nice"])), ".",
                 "<eos>"]
    return prompt, response, (size, colour, thing)


def answer_of(words: list[str]) -> int | None:
    """The final answer of an arithmetic response: the number after ``answer <equals-word>``; None if absent."""
    for i in range(len(words) - 2, 0, -1):
        if words[i - 1] == "answer" and words[i + 1] in NUMBERS:
            return int(words[i + 1])
    return None


def slots_preserved(words: list[str], slots: tuple[str, ...]) -> bool:
    """All prompt slots appear in the response and no other slot word does (size, colour, object)."""
    used = {w for w in words if w in SLOT_WORDS}
    return used == set(slots)


def mismatch_kind(original: str, substitute: str) -> str:
    """``style`` (same synonym group, or the filler), ``meaning`` (a number, operator or slot replaced), ``other``."""
    if original in GROUP_OF and GROUP_OF.get(substitute) == GROUP_OF[original]:
        return "style"
    if original in FILLER:
        return "style"
    if original in NUMBERS or original in SLOT_WORDS or GROUP_OF.get(original) in ("plus", "minus"):
        return "meaning"
    return "other"


def make_rows(rng: np.random.Generator, n: int, task: str, cfg: SelfJudgeConfig) -> pl.DataFrame:
    """``n`` examples of ``task``: prompt and response token ids, answer (arith) and slots (desc)."""
    rows = []
    for _ in range(n):
        if task == "arith":
            steps = int(rng.integers(cfg.data.min_steps, cfg.data.max_steps + 1))
            prompt, response, answer = arithmetic_example(rng, steps)
            slots: list[str] = []
        else:
            prompt, response, triple = description_example(rng)
            answer, slots = -1, list(triple)
        rows.append({"task": task, "prompt": encode(prompt), "response": encode(response), "answer": answer,
                     "slots": slots})
    return pl.DataFrame(rows, schema={"task": pl.String, "prompt": pl.List(pl.Int64),
                                      "response": pl.List(pl.Int64), "answer": pl.Int64,
                                      "slots": pl.List(pl.String)})


def make_splits(cfg: SelfJudgeConfig, seed: int) -> dict[str, pl.DataFrame]:
    rng = np.random.default_rng(seed)
    d = cfg.data
    half = d.n_train // 2
    splits = {"train": pl.concat([make_rows(rng, half, "arith", cfg), make_rows(rng, d.n_train - half, "desc", cfg)])}
    for name, n in (("mine", d.n_mine), ("eval", d.n_eval)):
        splits[name] = pl.concat([make_rows(rng, n, task, cfg) for task in TASKS])
    return splits


def write_data(cfg: SelfJudgeConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    if cfg.hub is not None:
        return []  # the paper profile reads its benchmarks from the hub at train / evaluate time
    written = []
    for seed in seeds:
        for name, frame in make_splits(cfg, seed).items():
            written.append(write_parquet(frame, Path(data_dir) / f"{name}_seed{seed}.parquet"))
    return written


def load_split(data_dir: Path, name: str, seed: int) -> pl.DataFrame:
    return pl.read_parquet(Path(data_dir) / f"{name}_seed{seed}.parquet")
