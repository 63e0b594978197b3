"""Evaluation step of quatro: every checkpoint sampled on every target; pass@k, unique correct count, entropy.

Each target of the task's range is a prompt; ``samples_per_prompt`` responses at temperature 1 per prompt. The
targets are the training distribution's own (the task has only max_target - min_target + 1 prompts), so this is an
evaluation with fresh samples, not a held-out generalisation test.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tasks.common import rl
from tasks.common.checkpoints import load_gpt2
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.quatro import method
from tasks.quatro.config import QuatroConfig
from tasks.quatro.data import load_eval_targets, prompt_ids, rewards
from tasks.quatro.train import SFT_DIR, planned_runs, run_name

EVAL_SEED_OFFSET = 7919  # the evaluation's sampling stream, apart from training's


def evaluate_policy(model: torch.nn.Module, target_values: list[int], cfg: QuatroConfig, seed: int
                    ) -> dict[str, float]:
    """pass@k (mean over prompts), unique correct count per prompt, reward rate and token entropy of ``model``."""
    n, task = cfg.eval.samples_per_prompt, cfg.task
    targets_t = torch.tensor(target_values)
    ro = rl.sample_group(model, prompt_ids(targets_t, task), n, task.n_digits, seed=seed)
    correct = rewards(ro.completion_ids, targets_t.repeat_interleave(n), task).reshape(-1, n).bool()
    responses = [tuple(row) for row in ro.completion_ids.tolist()]
    counts = correct.sum(dim=1).tolist()
    out = {f"pass_at_{k}": float(np.mean([method.pass_at_k(n, c, k) for c in counts])) for k in cfg.eval.ks}
    out["unique_correct"] = float(np.mean([
        method.unique_correct_count(responses[i * n:(i + 1) * n], correct[i].tolist()) for i in range(len(counts))]))
    out["correct_count"] = float(sum(counts))
    out["sample_count"] = float(correct.numel())
    with torch.no_grad():
        logits = model(input_ids=ro.input_ids, attention_mask=ro.attention_mask.long()).logits
    num_completion = ro.completion_ids.shape[1]
    out["entropy"] = method.mean_token_entropy(logits[:, -num_completion - 1:-1], ro.completion_mask)
    return out


def evaluate(cfg: QuatroConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        from tasks.quatro import hub  # the paper profile (GPU, hub access)

        return hub.evaluate_hub(cfg, seed, Path(data_dir), Path(model_dir), device, progress)
    target_values = load_eval_targets(data_dir)
    names = [SFT_DIR] + [run_name(a, e, lr) for a, e, lr in planned_runs(cfg.rl)]
    result = SeedResult(seed)
    with result.stage("evaluate"):
        for i, name in enumerate(names):
            model = load_gpt2(Path(model_dir) / name)  # thread-safe (from_pretrained is not)
            measured = evaluate_policy(model, target_values, cfg, seed + EVAL_SEED_OFFSET)
            result.add({f"{name}_eval_{k}": v for k, v in measured.items()})
            progress((i + 1) / len(names), f"{name}: pass@1 {measured['pass_at_1']:.3f}")
    return result
