"""Data of the select_to_think experiment.

smoke / cpu: procedural multi-digit addition with a written chain of thought (the project's design for the
cpu profile, README "Deviations"). Operands have ``min_digits``..``max_digits`` digits and are zero-padded to
``width = max_digits`` so every sequence of a profile has the same length (batched decoding needs no
padding). One sequence, for ``47 + 38`` at width 3::

    0 4 7 + 0 3 8 =  5 1  8 0  0 0  A  0 0 8 5  <eos>
    ----prompt-----  s0 c0 s1 c1 s2 c2   answer (MSD first)

The chain of thought goes from the least significant digit: ``s_i = (a_i + b_i + c_{i-1}) mod 10``
and the carry ``c_i``; the answer copies ``c_{W-1} s_{W-1} .. s_0``. Token ids: digits 0-9, ``+`` 10,
``=`` 11, ``A`` 12, ``<eos>`` 13; ids from 14 on are the reserved S2T-Local score bins, never data.

paper: MATH / GSM8K by hub name (``datasets.load_dataset``) and the Qwen2.5 pair
(``AutoModelForCausalLM.from_pretrained``); tests use local stand-ins only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from tasks.common.io import read_json, write_dir_with, write_json, write_parquet
from tasks.select_to_think.config import AdditionDataConfig, SelectToThinkConfig

PLUS, EQUALS, ANSWER, EOS = 10, 11, 12, 13
BASE_VOCAB = 14  # digits + '+', '=', 'A', '<eos>'; reserved bin ids start here
SPLITS = ("train", "calibration", "collection", "test")
TOKEN_TEXT = [str(d) for d in range(10)] + ["+", "=", "A", "<eos>"]


def prompt_length(width: int) -> int:
    return 2 * width + 2


def generated_length(width: int) -> int:
    """Chain of thought (2 per digit), 'A', width + 1 answer digits, '<eos>'."""
    return 2 * width + 1 + (width + 1) + 1


def sequence_length(width: int) -> int:
    return prompt_length(width) + generated_length(width)


def digits_of(value: int, width: int) -> list[int]:
    """Most significant digit first, zero-padded to ``width``."""
    if value < 0 or value >= 10**width:
        raise ValueError(f"{value} does not fit in {width} digits")
    return [int(ch) for ch in str(value).zfill(width)]


def encode_prompt(a: int, b: int, width: int) -> list[int]:
    return [*digits_of(a, width), PLUS, *digits_of(b, width), EQUALS]


def encode_solution(a: int, b: int, width: int) -> list[int]:
    """The generated part: chain of thought, answer marker, answer digits, end of sequence."""
    a_digits, b_digits = digits_of(a, width)[::-1], digits_of(b, width)[::-1]
    carry, cot, sums = 0, [], []
    for a_i, b_i in zip(a_digits, b_digits):
        total = a_i + b_i + carry
        carry = total // 10
        sums.append(total % 10)
        cot += [total % 10, carry]
    return [*cot, ANSWER, carry, *sums[::-1], EOS]


def format_classes(width: int) -> list[tuple[int, ...]]:
    """The tokens the format allows at each generated step: a sum digit (any of 10), a carry (0 or 1), 'A',
    the answer's leading digit (the last carry: 0 or 1), an answer digit (any of 10), '<eos>'. A ranker that
    knows only this is C1's chance baseline (it knows which kind of token comes next, not which one)."""
    digits, carry = tuple(range(10)), (0, 1)
    cot = [digits if i % 2 == 0 else carry for i in range(2 * width)]
    return [*cot, (ANSWER,), carry, *([digits] * width), (EOS,)]


def encode_problem(a: int, b: int, width: int) -> list[int]:
    return encode_prompt(a, b, width) + encode_solution(a, b, width)


def decode_answer(generated: list[int] | np.ndarray, width: int) -> int | None:
    """The integer after 'A' (width + 1 digits, then '<eos>'); None when the format is broken."""
    tokens = [int(t) for t in generated]
    if ANSWER not in tokens:
        return None
    start = tokens.index(ANSWER) + 1
    answer = tokens[start:start + width + 1]
    if len(answer) != width + 1 or any(t > 9 for t in answer):
        return None
    if start + width + 1 >= len(tokens) or tokens[start + width + 1] != EOS:
        return None
    return int("".join(str(t) for t in answer))


def render(tokens: list[int] | np.ndarray) -> str:
    return " ".join(TOKEN_TEXT[t] if t < BASE_VOCAB else f"<bin{t - BASE_VOCAB}>" for t in tokens)


def sample_operands(n: int, min_digits: int, max_digits: int, rng: np.random.Generator) -> np.ndarray:
    """(n, 2) operands: each operand's digit count uniform in [min_digits, max_digits], then its value
    uniform among numbers with that many digits (so short operands are not swamped by long ones)."""
    lengths = rng.integers(min_digits, max_digits + 1, size=(n, 2))
    low = np.where(lengths == 1, 0, 10 ** (lengths - 1))
    return (low + np.floor(rng.random((n, 2)) * (10**lengths - low))).astype(np.int64)


def addition_problems(sizes: dict[str, int], min_digits: int, max_digits: int, seed: int) -> pl.DataFrame:
    """Columns split, a, b. Test pairs are drawn first and every other split excludes them (held out)."""
    rng = np.random.default_rng(seed)
    test = np.unique(sample_operands(4 * sizes["test"] + 16, min_digits, max_digits, rng), axis=0)
    test = test[rng.permutation(len(test))[:sizes["test"]]]
    if len(test) < sizes["test"]:
        raise ValueError(f"data.n_test: only {len(test)} distinct test problems exist for this digit range")
    held_out = {(int(a), int(b)) for a, b in test}
    frames = [pl.DataFrame({"split": "test", "a": test[:, 0], "b": test[:, 1]})]
    for split in ("train", "calibration", "collection"):
        pairs = sample_operands(sizes[split] * 2 + 16, min_digits, max_digits, rng)
        keep = np.array([(int(a), int(b)) not in held_out for a, b in pairs])
        pairs = pairs[keep][:sizes[split]]
        frames.append(pl.DataFrame({"split": split, "a": pairs[:, 0], "b": pairs[:, 1]}))
    return pl.concat(frames)


def problems_tensor(frame: pl.DataFrame, width: int) -> torch.Tensor:
    """(N, sequence_length) token ids of the full (prompt + solution) sequences."""
    rows = [encode_problem(a, b, width) for a, b in zip(frame["a"].to_list(), frame["b"].to_list())]
    return torch.tensor(rows, dtype=torch.long).reshape(-1, sequence_length(width))


def prompts_tensor(frame: pl.DataFrame, width: int) -> torch.Tensor:
    rows = [encode_prompt(a, b, width) for a, b in zip(frame["a"].to_list(), frame["b"].to_list())]
    return torch.tensor(rows, dtype=torch.long).reshape(-1, prompt_length(width))


# ------------------------------------------------------------------------------------------------
# Files of the data phase
# ------------------------------------------------------------------------------------------------

def split_sizes(cfg: AdditionDataConfig) -> dict[str, int]:
    return {"train": cfg.n_train, "calibration": cfg.n_calibration, "collection": cfg.n_collection,
            "test": cfg.n_test}


def write_data(config: SelectToThinkConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase: one parquet of addition problems per seed (splits train / calibration / collection /
    test, test pairs held out of the others) and the data config that wrote them. Paper profile: the
    hub datasets are saved per seed (``datasets.Dataset.save_to_disk``)."""
    if config.hub is not None:
        return [write_hub_problems(config.hub, seed, Path(data_dir)) for seed in seeds]
    cfg = config.data
    written = [write_problems(addition_problems(split_sizes(cfg), cfg.min_digits, cfg.max_digits, seed),
                              problems_file(data_dir, seed)) for seed in seeds]
    return [*written, write_meta(Path(data_dir), cfg.model_dump(mode="json"))]


def problems_file(data_dir: Path, seed: int) -> Path:
    return Path(data_dir) / f"addition_seed{seed}.parquet"


def meta_file(data_dir: Path) -> Path:
    return Path(data_dir) / "addition_meta.json"


def write_problems(frame: pl.DataFrame, path: Path) -> Path:
    return write_parquet(frame, path)


def write_meta(data_dir: Path, data_config: dict[str, Any]) -> Path:
    return write_json(meta_file(data_dir), data_config)


def read_problems(data_dir: Path, seed: int, data_config: dict[str, Any]) -> dict[str, pl.DataFrame]:
    """One seed's problems by split, after checking the files were written for this data config (a
    stale data phase is an error naming the key, never a silent run on other data)."""
    meta, path = meta_file(data_dir), problems_file(data_dir, seed)
    if not meta.is_file() or not path.is_file():
        raise FileNotFoundError(f"select_to_think.data: {path} or {meta} is missing; run the data phase first")
    written = read_json(meta)
    for key, value in data_config.items():
        if written.get(key) != value:
            raise ValueError(f"select_to_think.data.{key}: {data_dir} was written with {written.get(key)!r}, "
                             f"the config says {value!r}; rerun the data phase")
    frame = pl.read_parquet(path)
    splits = {name: frame.filter(pl.col("split") == name) for name in SPLITS}
    for name in SPLITS:
        expected = data_config.get(f"n_{name}")
        if expected is not None and splits[name].height != expected:
            raise ValueError(f"select_to_think.data.n_{name}: {path} holds {splits[name].height} {name} problems, "
                             f"the config says {expected}; rerun the data phase")
    return splits


# ------------------------------------------------------------------------------------------------
# Paper profile: the Qwen2.5 pair and the math datasets by hub name (tests use local stand-ins)
# ------------------------------------------------------------------------------------------------

def load_pair(slm_name: str, llm_name: str, dtype: str) -> tuple[Any, Any, Any]:
    """SLM, LLM (``AutoModelForCausalLM.from_pretrained``) and the SLM's tokenizer (the pair shares one)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype)
    slm = AutoModelForCausalLM.from_pretrained(slm_name, dtype=torch_dtype).eval()
    llm = AutoModelForCausalLM.from_pretrained(llm_name, dtype=torch_dtype).eval()
    return slm, llm, AutoTokenizer.from_pretrained(slm_name)


def final_answer(text: str) -> str | None:
    """The reference / predicted final answer: the last ``\\boxed{...}`` (MATH), else the text after
    ``####`` (GSM8K), else the last number in the text."""
    import re

    start = text.rfind("\\boxed{")
    if start >= 0:
        depth, i = 1, start + len("\\boxed{")
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j].strip()
        return None
    if "####" in text:
        return text.split("####")[-1].strip().replace(",", "")
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", text)
    return numbers[-1].replace(",", "").rstrip(".") if numbers else None


def load_math_problems(dataset: str, config: str | None, split: str, n: int, seed: int) -> list[dict[str, str]]:
    """``n`` problems drawn with ``seed`` from a hub dataset (``datasets.load_dataset``), normalised to
    {question, answer}: GSM8K (question / answer "#### x") and MATH (problem / solution with \\boxed{})."""
    from datasets import load_dataset

    rows = load_dataset(dataset, config, split=split) if config else load_dataset(dataset, split=split)
    if n > len(rows):
        raise ValueError(f"select_to_think.hub: {dataset} [{split}] has {len(rows)} problems, asked for {n}")
    picked = rows.select(np.sort(np.random.default_rng(seed).choice(len(rows), n, replace=False)).tolist())
    question = "question" if "question" in picked.column_names else "problem"
    solution = "answer" if "answer" in picked.column_names else "solution"
    return [{"question": r[question], "answer": final_answer(r[solution]) or ""} for r in picked]


def hub_problems_dir(data_dir: Path, seed: int) -> Path:
    return Path(data_dir) / f"hub_seed{seed}"


def write_hub_problems(hub: Any, seed: int, data_dir: Path) -> Path:
    """Per seed: the calibration + collection problems and the evaluation problems, saved with
    ``datasets.Dataset.save_to_disk`` (atomically, ``tasks.common.io.write_dir_with``)."""
    from datasets import Dataset

    collect = load_math_problems(hub.collect_dataset, hub.collect_config, hub.collect_split,
                                 hub.n_collect + hub.n_calibration, seed)
    evaluate = load_math_problems(hub.eval_dataset, hub.eval_config, hub.eval_split, hub.n_eval, seed)
    rows = ([r | {"split": "calibration"} for r in collect[:hub.n_calibration]]
            + [r | {"split": "collection"} for r in collect[hub.n_calibration:]]
            + [r | {"split": "test"} for r in evaluate])
    return write_dir_with(hub_problems_dir(data_dir, seed), lambda tmp: Dataset.from_list(rows).save_to_disk(str(tmp)))


def read_hub_problems(hub: Any, data_dir: Path, seed: int) -> dict[str, list[dict[str, str]]]:
    from datasets import load_from_disk

    path = hub_problems_dir(data_dir, seed)
    if not path.is_dir():
        raise FileNotFoundError(f"select_to_think.hub: {path} is missing; run the data phase first")
    rows = load_from_disk(str(path)).to_list()
    splits = {name: [r for r in rows if r["split"] == name] for name in ("calibration", "collection", "test")}
    for name, key in (("calibration", "n_calibration"), ("collection", "n_collect"), ("test", "n_eval")):
        if len(splits[name]) != getattr(hub, key):
            raise ValueError(f"select_to_think.hub.{key}: {path} holds {len(splits[name])} {name} problems, the "
                             f"config says {getattr(hub, key)}; rerun the data phase")
    return splits
