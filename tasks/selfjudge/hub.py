"""Paper profile of selfjudge: a real draft / target pair from the hub and the paper's benchmarks by hub name.

Pairs (the paper): ``meta-llama/Llama-3.2-1B-Instruct`` -> ``meta-llama/Llama-3.1-8B-Instruct`` and
``Qwen/Qwen2.5-0.5B-Instruct`` -> ``Qwen/Qwen2.5-7B-Instruct`` (each pair shares its tokenizer, which the
token-level method needs). Mining sets: ``openai/gsm8k``, ``livecodebench/code_generation_lite``,
``databricks/databricks-dolly-15k``; evaluation: ``openai/gsm8k``, ``HuggingFaceH4/MATH-500``,
``abisee/cnn_dailymail``, ``cais/mmlu``. The same library as the cpu profile (method.py): ``train_hub`` mines
mismatches on the target's greedy responses and fits the SelfJudge head; ``evaluate_hub`` runs exact and
judge decoding and counts target calls. Answer checks: GSM8K's ``####`` number and MMLU's letter; the other
benchmarks report speed and agreement with the target only (no scorer here - a gap against the paper).
Never run in CI (no GPU, no hub access); tests run both steps on tiny local stand-ins."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.common.results import Progress, SeedResult
from tasks.selfjudge import method
from tasks.selfjudge.config import SelfJudgeConfig

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# hub name -> (config, split, prompt field builder, reference answer or None)
Row = dict[str, Any]
DATASETS: dict[str, tuple[str | None, str, Callable[[Row], str], Callable[[Row], str | None]]] = {
    "openai/gsm8k": ("main", "test", lambda r: r["question"], lambda r: r["answer"].split("####")[-1].strip()),
    "HuggingFaceH4/MATH-500": (None, "test", lambda r: r["problem"], lambda r: str(r["answer"]).strip()),
    "abisee/cnn_dailymail": ("3.0.0", "test", lambda r: "Summarize:\n" + r["article"][:4000], lambda r: None),
    "cais/mmlu": ("all", "test", lambda r: r["question"] + "\n" + "\n".join(
        f"{'ABCD'[i]}. {c}" for i, c in enumerate(r["choices"])) + "\nAnswer with the letter.",
        lambda r: "ABCD"[int(r["answer"])]),
    "livecodebench/code_generation_lite": (None, "test", lambda r: r["question_content"], lambda r: None),
    "databricks/databricks-dolly-15k": (None, "train",
                                        lambda r: (r["instruction"] + "\n" + r.get("context", "")).strip(),
                                        lambda r: None),
}


def load_prompts(name: str, n: int, loader: Callable[..., Any] | None = None) -> list[dict[str, str | None]]:
    """The first ``n`` rows of benchmark ``name`` as {prompt, reference}; ``loader`` defaults to
    ``datasets.load_dataset`` (tests pass a local stand-in)."""
    if name not in DATASETS:
        raise ValueError(f"selfjudge.hub: unknown dataset {name!r}; known: {sorted(DATASETS)}")
    config, split, prompt_of, answer_of = DATASETS[name]
    if loader is None:
        from datasets import load_dataset as loader
    ds = loader(name, config, split=split) if config else loader(name, split=split)
    rows = [ds[i] for i in range(min(n, len(ds)))]
    return [{"prompt": prompt_of(r), "reference": answer_of(r)} for r in rows]


def load_pair(cfg: SelfJudgeConfig, device: str) -> tuple[Any, Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hub = cfg.hub
    tokenizer = AutoTokenizer.from_pretrained(hub.target)
    draft_tok = AutoTokenizer.from_pretrained(hub.draft)
    if draft_tok.get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"selfjudge.hub: {hub.draft} and {hub.target} do not share a tokenizer")
    kwargs = {"dtype": DTYPES[hub.dtype]}
    draft = AutoModelForCausalLM.from_pretrained(hub.draft, **kwargs).to(device).eval()
    target = AutoModelForCausalLM.from_pretrained(hub.target, **kwargs).to(device).eval()
    return draft, target, tokenizer


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        return list(ids)
    return tokenizer(text)["input_ids"]


def final_answer(text: str) -> str | None:
    """GSM8K-style: the last number of the text; MMLU: a lone capital letter A-D is caught the same way."""
    found = re.findall(r"-?\d[\d,]*\.?\d*|\b[ABCD]\b", text)
    return found[-1].replace(",", "").rstrip(".") if found else None


def train_hub(cfg: SelfJudgeConfig, seed: int, data_dir: Path, model_dir: Path, device: str,
              progress: Progress) -> SeedResult:
    """Mine every mining set on the target's greedy responses, label at tau (the configured quantile) and fit
    the SelfJudge head; writes heads.npz (the pair itself is not retrained)."""
    from tasks.selfjudge.train import HEAD_FILE, save_heads

    hub = cfg.hub
    draft, target, tokenizer = load_pair(cfg, device)
    eos = tokenizer.eos_token_id
    mismatches: list[method.Mismatch] = []
    result = SeedResult(seed)
    with result.stage("mining"):
        for name in hub.mine_datasets:
            for row in load_prompts(name, hub.n_mine):
                prompt = prompt_ids(tokenizer, row["prompt"])
                response = method.batch_greedy(target, [prompt], cfg.decoding.max_new_tokens, eos, device)[0]
                mismatches += method.mine_mismatches(target, draft, prompt + response, len(prompt),
                                                     cfg.mining.window, device)
            progress(0.5, f"{name}: {len(mismatches)} mismatches so far")
    tau = method.label_threshold([m.diff for m in mismatches], cfg.mining.positive_quantile)
    x, y = method.head_training_set(mismatches, tau)
    head = method.fit_judge_head(x, y, cfg.head.validation_fraction, method.c_grid(cfg.head.c_grid_size), seed,
                                 cfg.head.max_iter)
    save_heads({"selfjudge_hub": head}, Path(model_dir) / HEAD_FILE)
    progress(1.0, f"head fitted, validation AUROC {head.val_auroc:.3f}")
    return result.add(hub_mismatches=len(mismatches), hub_tau=tau, hub_head_val_auroc=head.val_auroc,
                      hub_head_c=head.c, hub_label_positive_rate=float(np.mean(y[: len(mismatches)])))


def evaluate_hub(cfg: SelfJudgeConfig, seed: int, data_dir: Path, model_dir: Path, device: str,
                 progress: Progress) -> SeedResult:
    """Exact speculative decoding and SelfJudge over the threshold sweep on every evaluation set (no KV cache:
    the memoised full forward passes are slow but exact; speed is counted in target calls)."""
    from tasks.selfjudge.train import HEAD_FILE, load_heads

    hub, dec = cfg.hub, cfg.decoding
    draft_model, target_model, tokenizer = load_pair(cfg, device)
    head = load_heads(Path(model_dir) / HEAD_FILE)["selfjudge_hub"]
    eos = tokenizer.eos_token_id
    table = []
    for name in hub.eval_datasets:
        rows = load_prompts(name, hub.n_eval)
        target = method.MemoLM(target_model, top_k=max(dec.top_ks), keep_hidden=True, device=device)
        draft = method.MemoLM(draft_model, device=device)
        prompts = [prompt_ids(tokenizer, r["prompt"]) for r in rows]
        rules = [("exact", "exact", 0.0, method.ExactRule())]
        rules += [(f"top{k}", "topk", float(k), method.TopKRule(k)) for k in dec.top_ks]
        rules += [(f"selfjudge@{t:g}", "selfjudge", t, method.JudgeRule(head, t)) for t in dec.thresholds]
        for method_name, family, knob, rule in rules:
            tokens = calls = drafted = accepted = correct = 0
            for row, prompt in zip(rows, prompts):
                trace = method.speculative_generate(target, draft, prompt, dec.max_new_tokens, dec.gamma, eos, rule)
                tokens, calls = tokens + len(trace.tokens), calls + trace.target_calls
                drafted, accepted = drafted + trace.drafted, accepted + trace.accepted_draft
                if row["reference"] is not None:
                    correct += final_answer(tokenizer.decode(trace.tokens)) == row["reference"]
            table.append({"task": name, "method": method_name, "family": family, "knob": knob,
                          "prompts": len(rows), "tokens": tokens, "target_calls": calls,
                          "tokens_per_call": tokens / max(1, calls), "drafted": drafted, "accepted_draft": accepted,
                          "acceptance_rate": accepted / max(1, drafted), "correct": correct,
                          "accuracy": correct / len(rows) if rows[0]["reference"] is not None else float("nan"),
                          "identical_to_target": float("nan")})
        progress(1.0, f"{name}: decoded")
    return SeedResult(seed).add(tables={"decoding": table})
