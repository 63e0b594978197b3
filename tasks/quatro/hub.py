"""Paper profile of quatro: a Qwen2.5-Math policy trained on MATH with the same losses (GPU, hub access).

Assumed setup (the paper's is unconfirmed): ``Qwen/Qwen2.5-Math-1.5B``, training prompts from
``DigitalLearningGmbH/MATH-lighteval``, evaluation on ``HuggingFaceH4/MATH-500`` (the other five benchmarks of the
paper need their own loaders), answers compared as normalised ``\\boxed{}`` strings (no symbolic equivalence). The RL
loop is the cpu profile's (``train.rl_run``) with token-level QUATRO. Never run in CI; the tests run every function
here on a tiny local GPT-2 with a word-level tokenizer and a local parquet dataset.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from tasks.common import rl
from tasks.common.io import write_parquet
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.quatro import method
from tasks.quatro.config import HubConfig, QuatroConfig

INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."
BASE = "sft"  # the untrained policy's evaluation, under the cpu profile's name for the warm start


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def normalise_answer(answer: str) -> str:
    """Whitespace, ``$``, ``\\left``/``\\right`` and a trailing period removed; ``\\dfrac`` as ``\\frac``."""
    answer = re.sub(r"\\left|\\right|\$|\s", "", answer).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return answer.rstrip(".")


def math_rewards(texts: list[str], answers: list[str]) -> torch.Tensor:
    """1.0 where the last boxed answer of a response equals the reference after normalisation."""
    out = []
    for text, answer in zip(texts, answers, strict=True):
        boxed = extract_boxed(text)
        out.append(float(boxed is not None and normalise_answer(boxed) == normalise_answer(answer)))
    return torch.tensor(out)


def load_math_rows(dataset: str, split: str, n: int, seed: int) -> list[dict[str, str]]:
    """Up to ``n`` rows {problem, answer} drawn with ``seed`` from a hub (or local) dataset; the answer is the
    dataset's ``answer`` column or the boxed part of its ``solution``."""
    from datasets import load_dataset

    data = load_dataset(dataset, split=split)
    order = np.random.default_rng(seed).permutation(len(data))[:n]
    rows = []
    for i in order.tolist():
        row = data[i]
        answer = row.get("answer") or extract_boxed(row.get("solution", "")) or ""
        if answer:
            rows.append({"problem": row["problem"], "answer": str(answer)})
    if not rows:
        raise ValueError(f"quatro.hub: {dataset} [{split}] has no rows with an answer")
    return rows


def file_stem(dataset: str) -> str:
    """A dataset name as a file name part: ``a/b`` -> ``a__b`` (a local path keeps only its last part)."""
    return dataset.rstrip("/").split("/")[-1] if Path(dataset).exists() else dataset.replace("/", "__")


def write_hub_data(hub: HubConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    written = []
    for seed in seeds:
        train = load_math_rows(hub.train_dataset, "train", hub.max_prompts, seed)
        written.append(write_parquet(pl.DataFrame(train), Path(data_dir) / f"hub_train_seed{seed}.parquet"))
    for name in hub.eval_datasets:
        rows = load_math_rows(name, "test", hub.max_prompts, 0)
        written.append(write_parquet(pl.DataFrame(rows), Path(data_dir) / f"hub_eval_{file_stem(name)}.parquet"))
    return written


def load_policy(name: str | Path, device: str) -> tuple[Any, Any]:
    """(causal LM in bfloat16 on GPU / float32 on CPU, tokenizer with left padding)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(name), padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(name), dtype=dtype).to(device)
    return model, tokenizer


def encode(tokenizer: Any, problems: list[str], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompt ids and mask: the chat template when the tokenizer has one, else the plain text."""
    texts = [p + INSTRUCTION for p in problems]
    if getattr(tokenizer, "chat_template", None):
        texts = [tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                               add_generation_prompt=True) for t in texts]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"].to(device), enc["attention_mask"].bool().to(device)


def _decoder(tokenizer: Any, answers: list[str], group_size: int):
    repeated = [a for a in answers for _ in range(group_size)]
    return lambda ids: math_rewards(tokenizer.batch_decode(ids, skip_special_tokens=True), repeated)


def hub_batches(rows: list[dict[str, str]], tokenizer: Any, cfg: QuatroConfig, seed: int, device: str) -> list:
    """``rl.steps`` PromptBatches of ``rl.prompts_per_step`` rows drawn with ``seed`` (keys: the row index)."""
    from tasks.quatro.train import PromptBatch

    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(cfg.rl.steps):
        idx = rng.choice(len(rows), size=min(cfg.rl.prompts_per_step, len(rows)), replace=False).tolist()
        ids, mask = encode(tokenizer, [rows[i]["problem"] for i in idx], device)
        batches.append(PromptBatch(ids, mask, idx, _decoder(tokenizer, [rows[i]["answer"] for i in idx],
                                                             cfg.rl.group_size)))
    return batches


def train_hub(cfg: QuatroConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cuda",
              progress: Progress = no_progress) -> SeedResult:
    """Every algorithm in every cell from the hub policy; checkpoints ``<algorithm>_<cell>/`` (save_pretrained)."""
    from tasks.quatro.train import planned_runs, rl_run, run_name, summarise

    hub, result = cfg.hub, SeedResult(seed)
    base, tokenizer = load_policy(hub.model, device)
    rows = pl.read_parquet(Path(data_dir) / f"hub_train_seed{seed}.parquet").to_dicts()
    batches = hub_batches(rows, tokenizer, cfg, seed, device)
    runs = planned_runs(cfg.rl)
    for i, (algorithm, epochs, lr) in enumerate(runs):
        name = run_name(algorithm, epochs, lr)
        policy = copy.deepcopy(base)
        with result.stage(name):
            log = rl_run(policy, algorithm, epochs, lr, batches, cfg.rl, hub.max_new_tokens, seed=seed * 1000 + 17,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        policy.save_pretrained(str(Path(model_dir) / name))
        tokenizer.save_pretrained(str(Path(model_dir) / name))
        summarise(result, log, name)
        progress((i + 1) / len(runs), f"{name}: final reward {result.metrics[f'{name}_final_reward']:.3f}")
    return result


def evaluate_rows(model: Any, tokenizer: Any, rows: list[dict[str, str]], cfg: QuatroConfig, seed: int,
                  device: str) -> dict[str, float]:
    """pass@k, unique correct responses per problem and token entropy over ``samples_per_prompt`` samples each."""
    n, counts, unique, entropies = cfg.eval.samples_per_prompt, [], [], []
    generator = torch.Generator(device=device).manual_seed(seed)
    for row in rows:
        ids, mask = encode(tokenizer, [row["problem"]], device)
        ro = rl.sample_group(model, ids, n, cfg.hub.max_new_tokens, seed=generator, prompt_mask=mask,
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(ro.completion_ids, skip_special_tokens=True)
        correct = math_rewards(texts, [row["answer"]] * n).bool().tolist()
        counts.append(sum(correct))
        unique.append(method.unique_correct_count([tuple(r) for r in ro.completion_ids.tolist()], correct))
        with torch.no_grad():
            logits = model(input_ids=ro.input_ids, attention_mask=ro.attention_mask.long()).logits
        t = ro.completion_ids.shape[1]
        entropies.append(method.mean_token_entropy(logits[:, -t - 1:-1], ro.completion_mask))
    out = {f"pass_at_{k}": float(np.mean([method.pass_at_k(n, c, k) for c in counts])) for k in cfg.eval.ks}
    return out | {"unique_correct": float(np.mean(unique)), "correct_count": float(sum(counts)),
                  "sample_count": float(n * len(rows)), "entropy": float(np.mean(entropies))}


def evaluate_hub(cfg: QuatroConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cuda",
                 progress: Progress = no_progress) -> SeedResult:
    """The base policy (as ``sft``) and every checkpoint on the first evaluation set (metric names as at cpu)."""
    from tasks.quatro.train import planned_runs, run_name

    rows = pl.read_parquet(Path(data_dir) / f"hub_eval_{file_stem(cfg.hub.eval_datasets[0])}.parquet").to_dicts()
    names = [BASE] + [run_name(a, e, lr) for a, e, lr in planned_runs(cfg.rl)]
    result = SeedResult(seed)
    for i, name in enumerate(names):
        model, tokenizer = load_policy(cfg.hub.model if name == BASE else Path(model_dir) / name, device)
        measured = evaluate_rows(model, tokenizer, rows, cfg, seed + 7919, device)
        result.add({f"{name}_eval_{k}": v for k, v in measured.items()})
        progress((i + 1) / len(names), f"{name}: pass@1 {measured['pass_at_1']:.3f}")
    return result
