"""Evaluation step of selfjudge: judge decoding against exact speculative decoding and top-K, per task.

For each task's held-out prompts: the target's greedy output (the lossless reference), then every decoding
method: exact speculative decoding, top-K acceptance for each K, SelfJudge at each threshold of the sweep
(threshold 0 is exact decoding by construction and is run as a check), on the arithmetic task the AutoJudge
head at each threshold, and a random-acceptance judge (baselines.py) as a negative control. Measured per
method: generated tokens per target call (the speed proxy; the target alone makes 1), the draft acceptance
rate, answer accuracy (arithmetic) or slot preservation (descriptions), and the share of outputs identical to
the target's greedy output. No wall-clock: memoised forward passes make seconds meaningless here."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from tasks.common.checkpoints import load_gpt2
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.selfjudge import data, method
from tasks.selfjudge.baselines import RandomAcceptRule
from tasks.selfjudge.config import SelfJudgeConfig
from tasks.selfjudge.train import DRAFT, HEAD_FILE, TARGET, load_heads


def task_outcome(task: str, row: dict, tokens: list[int]) -> bool:
    """Arithmetic: the final answer is right; descriptions: every slot preserved and no other slot word."""
    words = data.decode(tokens)
    if task == "arith":
        return data.answer_of(words) == row["answer"]
    return data.slots_preserved(words, tuple(row["slots"]))


def methods_for(task: str, cfg: SelfJudgeConfig, heads: dict[str, method.JudgeHead]
                ) -> list[tuple[str, str, float, object]]:
    """(name, family, knob, rule) of every method run on ``task``."""
    out: list[tuple[str, str, float, object]] = [("exact", "exact", 0.0, method.ExactRule())]
    out += [(f"top{k}", "topk", float(k), method.TopKRule(k)) for k in cfg.decoding.top_ks]
    if f"selfjudge_{task}" in heads:
        out += [(f"selfjudge@{t:g}", "selfjudge", t, method.JudgeRule(heads[f"selfjudge_{task}"], t))
                for t in cfg.decoding.thresholds]
    if task == "arith" and "autojudge_arith" in heads:
        out += [(f"autojudge@{t:g}", "autojudge", t, method.JudgeRule(heads["autojudge_arith"], t))
                for t in cfg.decoding.thresholds]
    if f"selfjudge_{task}" in heads:
        # negative control: accept each mismatch with probability q, q over the same grid as the thresholds
        out += [(f"random@{q:g}", "random", q, RandomAcceptRule(q, seed=index))
                for index, q in enumerate(cfg.decoding.thresholds)]
    return out


def evaluate_task(task: str, frame: pl.DataFrame, target_model, draft_model, heads: dict[str, method.JudgeHead],
                  cfg: SelfJudgeConfig) -> tuple[list[dict], dict[str, float]]:
    dec = cfg.decoding
    rows = frame.to_dicts()
    prompts = [r["prompt"] for r in rows]
    reference = method.batch_greedy(target_model, prompts, dec.max_new_tokens, data.EOS)
    target = method.MemoLM(target_model, top_k=max(dec.top_ks), keep_hidden=True)
    draft = method.MemoLM(draft_model)
    for prompt, response in zip(prompts, reference):
        target.run(prompt + response)
    target_correct = sum(task_outcome(task, r, ref) for r, ref in zip(rows, reference))
    table = []
    for name, family, knob, rule in methods_for(task, cfg, heads):
        tokens = calls = drafted = accepted = mism = correct = identical = 0
        for row, prompt, ref in zip(rows, prompts, reference):
            trace = method.speculative_generate(target, draft, prompt, dec.max_new_tokens, dec.gamma, data.EOS, rule)
            tokens += len(trace.tokens)
            calls += trace.target_calls
            drafted += trace.drafted
            accepted += trace.accepted_draft
            mism += trace.accepted_mismatches
            correct += task_outcome(task, row, trace.tokens)
            identical += trace.tokens == ref
        table.append({"task": task, "method": name, "family": family, "knob": knob, "prompts": len(rows),
                      "tokens": tokens, "target_calls": calls, "tokens_per_call": tokens / calls,
                      "drafted": drafted, "accepted_draft": accepted, "acceptance_rate": accepted / max(1, drafted),
                      "accepted_mismatches": mism, "correct": correct, "accuracy": correct / len(rows),
                      "identical_to_target": identical})
    return table, {f"{task}_target_correct": target_correct, f"{task}_eval_prompts": len(rows),
                   f"{task}_target_accuracy": target_correct / len(rows)}


def evaluate(cfg: SelfJudgeConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        from tasks.selfjudge import hub
        return hub.evaluate_hub(cfg, seed, data_dir, model_dir, device, progress)
    result = SeedResult(seed)
    target_model, draft_model = load_gpt2(Path(model_dir) / TARGET), load_gpt2(Path(model_dir) / DRAFT)
    heads = load_heads(Path(model_dir) / HEAD_FILE)
    frame = data.load_split(data_dir, "eval", seed)
    table: list[dict] = []
    with result.stage("decoding"):
        for i, task in enumerate(data.TASKS):
            rows, metrics = evaluate_task(task, frame.filter(pl.col("task") == task), target_model, draft_model,
                                          heads, cfg)
            table += rows
            result.add(metrics)
            progress((i + 1) / len(data.TASKS), f"{task}: {len(rows)} decoding methods")
    return result.add(tables={"decoding": table})
