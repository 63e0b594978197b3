"""Paper profile of select_to_think: the Qwen2.5 pair on MATH / GSM8K (GPU, hub access).

The same library as the cpu profile (method.decode with S2T, Takeover, S2T-Local), one problem at a time
(prompts differ in length and the decoder takes unpadded rows; the official collection is step-wise too).
Deviations: full fine-tuning of the SLM replaces LoRA (``peft`` is not a dependency of the project), and
answers are compared as normalised strings (no symbolic equivalence). Never run in CI; untested beyond its
data loaders (tests use local stand-ins)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.common import tiny_lm
from tasks.common.results import Progress, SeedResult
from tasks.select_to_think import data, method
from tasks.select_to_think.config import SelectToThinkConfig
from tasks.select_to_think.experiment import accuracy_ratio, hit_counts


def prompt_ids(tokenizer: Any, question: str, max_tokens: int) -> torch.Tensor:
    messages = [{"role": "user", "content": question + "\nPlease reason step by step, and put your final answer "
                 "within \\boxed{}."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return ids[:, -max_tokens:]


def reserved_rows(model: Any, tokenizer: Any, n_bins: int) -> list[int]:
    """Score bins on output rows beyond the tokenizer's vocabulary (Qwen2.5 pads its embedding matrix)."""
    rows = model.get_output_embeddings().weight.shape[0]
    if rows - len(tokenizer) < n_bins:
        raise ValueError(f"select_to_think.local.n_bins: the SLM has only {rows - len(tokenizer)} unused output rows")
    return list(range(len(tokenizer), len(tokenizer) + n_bins))


def run_seed_paper(config: SelectToThinkConfig, seed: int, data_dir: Path, model_dir: Path, device: str,
                   progress: Progress | None = None) -> SeedResult:
    hub, s2t, local = config.hub, config.s2t, config.local
    splits = data.read_hub_problems(hub, data_dir, seed)
    slm, llm, tokenizer = data.load_pair(hub.slm, hub.llm, hub.dtype)
    slm, llm = slm.to(device), llm.to(device)
    reserved = reserved_rows(slm, tokenizer, local.n_bins)
    vocab = len(tokenizer)

    def run(model: Any, split: str, policy: method.DecodePolicy, use_llm: bool, **kwargs: Any) -> tuple[float, list]:
        correct, traces = [], []
        for row in splits[split]:
            ids = prompt_ids(tokenizer, row["question"], hub.max_prefix_tokens).to(device)
            trace = method.decode(model, ids, hub.max_new_tokens, policy, llm=llm if use_llm else None,
                                  reserved=reserved, vocab_size=vocab, eos_id=tokenizer.eos_token_id, **kwargs)
            text = tokenizer.decode(trace.tokens[0], skip_special_tokens=True)
            correct.append(data.final_answer(text) == row["answer"])
            traces.append(trace)
        return float(np.mean(correct)), traces

    def policy(action: str, trigger: str, threshold: float = math.inf) -> method.DecodePolicy:
        return method.DecodePolicy(action=action, trigger=trigger, threshold=threshold,
                                   warmup_steps=s2t.warmup_steps, support_size=s2t.support_size, k=s2t.k_eval,
                                   ratio_to_max=s2t.ratio_to_max if action == "s2t" else None)

    def threshold(model: Any, trigger: str) -> float:
        _, traces = run(model, "calibration", policy("greedy", trigger), trigger == "kl")
        return method.calibrate_threshold([s for t in traces for s in t.scores], s2t.quantile)

    metrics: dict[str, float] = {}
    metrics["slm_greedy_accuracy"], _ = run(slm, "test", policy("greedy", "none"), False)
    metrics["test_count"] = float(len(splits["test"]))
    metrics["slm_greedy_correct_count"] = float(round(metrics["slm_greedy_accuracy"] * metrics["test_count"]))
    kl_threshold = threshold(slm, "kl")
    metrics["s2t_accuracy"], traces = run(slm, "test", policy("s2t", "kl", kl_threshold), True, hit_ks=s2t.hit_ks)
    pooled = {k: [h for t in traces for h in t.hits[k]] for k in s2t.hit_ks}
    for k, hits in pooled.items():
        metrics[f"hit_at_{k}"] = float(np.mean(hits)) if hits else math.nan
    metrics |= hit_counts(pooled, s2t.hit_ks)
    metrics["takeover_accuracy"], takeover_traces = run(slm, "test", policy("takeover", "kl", kl_threshold), True)
    differ = [not torch.equal(a.tokens[0], b.tokens[0]) for a, b in zip(traces, takeover_traces)]
    metrics |= {"s2t_takeover_differ_count": float(sum(differ)), "s2t_takeover_differ_rate": float(np.mean(differ))}
    _, collected = run(slm, "collection", policy("s2t", "kl", kl_threshold), True, collect_k=s2t.k_collect)
    groups = method.concat_groups([g for t in collected for g in t.groups], pad_id=tokenizer.eos_token_id)
    local_model = copy.deepcopy(slm)
    before = local_model.get_output_embeddings().weight.detach().clone()
    method.train_s2t_local(local_model, groups, reserved, local.epochs, local.batch_groups, local.lr,
                           local.weight_decay, method.LocalLossWeights(local.kl_weight, local.frozen_kl_weight,
                                                                       local.hinge_margin), seed,
                           pad_id=tokenizer.eos_token_id)
    metrics["local_frozen_rows_max_change"] = method.frozen_rows_change(
        before, local_model.get_output_embeddings().weight.detach(), reserved)
    entropy_threshold = threshold(local_model, "entropy")
    metrics["local_entropy_accuracy"], entropy_traces = run(local_model, "test",
                                                            policy("local", "entropy", entropy_threshold), False)
    metrics["local_entropy_llm_evaluations"] = float(sum(t.llm_row_evaluations for t in entropy_traces))
    greedy = metrics["slm_greedy_accuracy"]
    metrics |= {"hit8_minus_hit1": metrics.get("hit_at_8", math.nan) - metrics.get("hit_at_1", math.nan),
                "s2t_minus_takeover": metrics["s2t_accuracy"] - metrics["takeover_accuracy"],
                "s2t_minus_greedy": metrics["s2t_accuracy"] - greedy,
                "local_entropy_relative_gain": metrics["local_entropy_accuracy"] / greedy - 1 if greedy else math.inf,
                "local_entropy_over_greedy": accuracy_ratio(metrics["local_entropy_accuracy"], greedy),
                "local_entropy_minus_maj": math.nan}  # Maj@8 at paper scale: not implemented (cost)
    tiny_lm.save_model(local_model, Path(model_dir) / f"seed{seed}" / "slm_local")  # atomic, safetensors
    return {"seed": seed, "metrics": metrics, "curves": {},
            "tables": {"hit_at_k": [{"k": k, "hit": metrics[f"hit_at_{k}"]} for k in s2t.hit_ks]}}
