"""The select_to_think experiment: one seed = train a tiny 'LLM' and 'SLM' (GPT-2, from scratch) on
procedural addition with a chain of thought, then measure local sufficiency (hit@K at divergence
points), S2T vs Takeover vs the SLM baselines, collect trigger groups, train S2T-Local and evaluate it
with the LLM-free entropy trigger and with the KL trigger.

Plain functions (no Prefect, no MLflow); the generic flow calls ``write_data`` and ``run_seed``.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from torch.nn import functional as F

from tasks.common import tiny_lm
from tasks.common.results import Progress, SeedResult
from tasks.select_to_think import baselines, data, method
from tasks.select_to_think.config import AdditionDataConfig, S2TConfig, SelectToThinkConfig, TinyLMConfig

# ------------------------------------------------------------------------------------------------
# Data phase
# ------------------------------------------------------------------------------------------------

def split_sizes(cfg: AdditionDataConfig) -> dict[str, int]:
    return {"train": cfg.n_train, "calibration": cfg.n_calibration, "collection": cfg.n_collection,
            "test": cfg.n_test}


def write_data(config: SelectToThinkConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase: one parquet of addition problems per seed (splits train / calibration / collection /
    test, test pairs held out of the others) and the data config that wrote them. Paper profile: the
    hub datasets are saved per seed (``datasets.Dataset.save_to_disk``)."""
    if config.hub is not None:
        return [data.write_hub_problems(config.hub, seed, Path(data_dir)) for seed in seeds]
    cfg = config.data
    written = [data.write_problems(data.addition_problems(split_sizes(cfg), cfg.min_digits, cfg.max_digits, seed),
                                   data.problems_file(data_dir, seed)) for seed in seeds]
    return [*written, data.write_meta(Path(data_dir), cfg.model_dump(mode="json"))]


# ------------------------------------------------------------------------------------------------
# Tiny GPT-2 pair
# ------------------------------------------------------------------------------------------------

def build_lm(lm: TinyLMConfig, vocab_size: int, width: int, seed: int, untied: bool) -> torch.nn.Module:
    """A GPT-2 over the addition vocabulary plus the reserved bins. The SLM's head is untied so that
    S2T-Local can move only its reserved rows (acceptance a3)."""
    config = tiny_lm.tiny_gpt2_config(vocab_size, data.sequence_length(width) + 1, lm.n_layer, lm.n_head, lm.n_embd)
    config.tie_word_embeddings = not untied
    return tiny_lm.build_tiny_gpt2(config, seed=seed)


def generated_loss(model: torch.nn.Module, batch: torch.Tensor, prompt_len: int, base_vocab: int) -> torch.Tensor:
    """Cross-entropy on the generated part only (the prompt digits are random: nothing to learn), softmax over
    the unreserved vocabulary (bins are never data)."""
    logits = model(input_ids=batch).logits[:, prompt_len - 1:-1, :base_vocab]
    return F.cross_entropy(logits.reshape(-1, base_vocab), batch[:, prompt_len:].reshape(-1))


def train_lm(model: torch.nn.Module, lm: TinyLMConfig, sequences: torch.Tensor, prompt_len: int, seed: int,
             accuracy_check: Callable[[], float] | None = None, progress: Progress | None = None, name: str = "lm"
             ) -> tuple[list[float], int]:
    """AdamW (no weight decay) with a 5% linear warm-up; then a cosine decay over ``lm.steps``, or a constant
    rate with a stop at ``lm.target_accuracy`` (checked every ``lm.check_every`` steps). Returns the loss
    curve and the number of steps taken."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lm.lr, weight_decay=0.0)
    warmup = max(1, lm.steps // 20)
    stop_early = lm.target_accuracy is not None and accuracy_check is not None

    def factor(step: int) -> float:
        ramp = min(1.0, (step + 1) / warmup)
        return ramp if stop_early else ramp * 0.5 * (1 + math.cos(math.pi * step / lm.steps))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    losses: list[float] = []
    model.train()
    for step in range(lm.steps):
        batch = sequences[torch.randint(0, len(sequences), (lm.batch_size,), generator=generator)]
        loss = generated_loss(model, batch, prompt_len, data.BASE_VOCAB)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if stop_early and (step + 1) % lm.check_every == 0:
            model.eval()
            reached = accuracy_check() >= lm.target_accuracy
            model.train()
            if reached:
                break
        if progress is not None and (step + 1) % max(1, lm.steps // 5) == 0:
            progress((step + 1) / lm.steps, f"{name} step {step + 1}/{lm.steps}, loss {losses[-1]:.3f}")
    model.eval()
    return losses, len(losses)


# ------------------------------------------------------------------------------------------------
# Evaluation helpers
# ------------------------------------------------------------------------------------------------

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


def calibration_accuracy(model: Any, task: AdditionTask, reserved: list[int]) -> float:
    """Greedy accuracy on the calibration problems: the stopping check of ``train_lm`` (never the test split)."""
    return task.accuracy(baselines.greedy_answers(model, task.prompts, task.steps, task.parse, reserved))


def trigger_rate(trace: method.DecodeTrace, warmup_steps: int) -> float:
    """Share of the steps after the warm-up at which the trigger fired."""
    return float(trace.fired[:, warmup_steps:].float().mean())


# ------------------------------------------------------------------------------------------------
# One seed, end to end
# ------------------------------------------------------------------------------------------------

def run_seed(config: SelectToThinkConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress | None = None) -> SeedResult:
    """Every measurement of one seed; each model is trained once and reused for every claim."""
    if config.hub is not None:
        from tasks.select_to_think import paper

        return paper.run_seed_paper(config, seed, Path(data_dir), Path(model_dir), device, progress)
    start = time.perf_counter()
    timings: dict[str, float] = {}

    def lap(name: str) -> None:
        timings[name] = time.perf_counter() - start - sum(timings.values())

    def report(fraction: float, message: str) -> None:
        if progress is not None:
            progress(fraction, message)

    splits = data.read_problems(Path(data_dir), seed, config.data.model_dump(mode="json"))
    width, s2t, local = config.data.max_digits, config.s2t, config.local
    prompt_len = data.prompt_length(width)
    reserved = method.bin_ids(data.BASE_VOCAB, local.n_bins)
    vocab = data.BASE_VOCAB + local.n_bins
    train = data.problems_tensor(splits["train"], width)
    calibration, collection, test = (AdditionTask(splits[name], width)
                                     for name in ("calibration", "collection", "test"))

    # 1. The pair. The LLM never uses the bins but shares the vocabulary, so logits line up.
    llm = build_lm(config.llm, vocab, width, seed=2 * seed, untied=False)
    llm_curve, llm_steps = train_lm(llm, config.llm, train, prompt_len, seed,
                                    lambda: calibration_accuracy(llm, calibration, reserved),
                                    lambda f, m: report(0.3 * f, m), name="LLM")
    slm = build_lm(config.slm, vocab, width, seed=2 * seed + 1, untied=True)
    slm_curve, slm_steps = train_lm(slm, config.slm, train, prompt_len, seed + 10_000,
                                    lambda: calibration_accuracy(slm, calibration, reserved),
                                    lambda f, m: report(0.3 + 0.15 * f, m), name="SLM")
    lap("train_pair")

    # 2. Baselines on the test problems.
    metrics: dict[str, float] = {"llm_train_steps": float(llm_steps), "slm_train_steps": float(slm_steps)}
    llm_answers = baselines.greedy_answers(llm, test.prompts, test.steps, test.parse, reserved)
    slm_answers = baselines.greedy_answers(slm, test.prompts, test.steps, test.parse, reserved)
    metrics |= {"llm_accuracy": test.accuracy(llm_answers), "llm_correct_count": test.correct(llm_answers),
                "slm_greedy_accuracy": test.accuracy(slm_answers),
                "slm_greedy_correct_count": test.correct(slm_answers), "test_count": float(len(test.truth))}
    metrics["slm_maj_accuracy"] = test.accuracy(baselines.majority_at_n(
        slm, test.prompts, test.steps, s2t.maj_samples, s2t.maj_temperature, test.parse, seed, reserved))
    lap("baselines")
    report(0.5, "baselines done")

    # 3. Triggers calibrated on calibration problems; S2T, Takeover and hit@K on the test problems.
    kl_threshold = calibrate(slm, calibration, s2t, "kl", reserved, llm)
    s2t_trace = method.decode(slm, test.prompts, test.steps, policy_for(s2t, "s2t", "kl", kl_threshold), llm=llm,
                              reserved=reserved, hit_ks=[*s2t.hit_ks, data.BASE_VOCAB])
    takeover = method.decode(slm, test.prompts, test.steps, policy_for(s2t, "takeover", "kl", kl_threshold),
                             llm=llm, reserved=reserved)
    kl_rate = trigger_rate(s2t_trace, s2t.warmup_steps)
    random_s2t = method.decode(slm, test.prompts, test.steps, policy_for(s2t, "s2t", "random", rate=kl_rate),
                               llm=llm, reserved=reserved, generator=torch.Generator().manual_seed(seed))
    hits = {k: float(np.mean(v)) if v else math.nan for k, v in s2t_trace.hits.items()}
    metrics |= {f"hit_at_{k}": hits[k] for k in s2t.hit_ks} | {"hit_at_full_vocab": hits[data.BASE_VOCAB]}
    metrics |= hit_counts(s2t_trace.hits, s2t.hit_ks)
    metrics |= differ_counts(s2t_trace.tokens, takeover.tokens)
    metrics |= {
        "kl_threshold": kl_threshold,
        "kl_trigger_rate": kl_rate,
        "triggers_per_problem": float(s2t_trace.fired.sum()) / len(test.truth),
        "s2t_accuracy": test.trace_accuracy(s2t_trace),
        "takeover_accuracy": test.trace_accuracy(takeover),
        "s2t_random_trigger_accuracy": test.trace_accuracy(random_s2t),
    }
    lap("s2t")
    report(0.6, "S2T / Takeover done")

    # 4. S2T-Local: groups collected along S2T paths on the collection problems, then training.
    collected = method.decode(slm, collection.prompts, collection.steps, policy_for(s2t, "s2t", "kl", kl_threshold),
                              llm=llm, reserved=reserved, collect_k=s2t.k_collect)
    groups = method.concat_groups(collected.groups)
    if local.max_groups is not None and len(groups) > local.max_groups:
        groups = groups.subset(torch.arange(local.max_groups))
    local_model = copy.deepcopy(slm)
    head_before = local_model.get_output_embeddings().weight.detach().clone()
    weights = method.LocalLossWeights(local.kl_weight, local.frozen_kl_weight, local.hinge_margin)
    log = method.train_s2t_local(local_model, groups, reserved, local.epochs, local.batch_groups, local.lr,
                                 local.weight_decay, weights, seed,
                                 on_step=lambda i, n: report(0.6 + 0.3 * i / n, f"S2T-Local step {i}/{n}")
                                 if i % max(1, n // 5) == 0 else None)
    metrics["local_groups"] = float(len(groups))
    metrics["local_frozen_rows_max_change"] = method.frozen_rows_change(
        head_before, local_model.get_output_embeddings().weight.detach(), reserved)
    lap("local_train")

    # 5. S2T-Local at inference: entropy trigger with no LLM at all, and the KL trigger (LLM computes it).
    entropy_threshold = calibrate(local_model, calibration, s2t, "entropy", reserved)
    local_entropy = method.decode(local_model, test.prompts, test.steps,
                                  policy_for(s2t, "local", "entropy", entropy_threshold), llm=None, reserved=reserved)
    local_kl_threshold = calibrate(local_model, calibration, s2t, "kl", reserved, llm)
    local_kl = method.decode(local_model, test.prompts, test.steps,
                             policy_for(s2t, "local", "kl", local_kl_threshold), llm=llm, reserved=reserved)
    greedy = metrics["slm_greedy_accuracy"]
    metrics |= {
        "local_entropy_accuracy": test.trace_accuracy(local_entropy),
        "local_entropy_trigger_rate": trigger_rate(local_entropy, s2t.warmup_steps),
        "local_entropy_llm_evaluations": float(local_entropy.llm_row_evaluations),
        "local_kl_accuracy": test.trace_accuracy(local_kl),
        "local_body_greedy_accuracy": test.accuracy(baselines.greedy_answers(
            local_model, test.prompts, test.steps, test.parse, reserved)),
    }
    metrics |= {
        "hit8_minus_hit1": metrics.get("hit_at_8", math.nan) - metrics.get("hit_at_1", math.nan),
        "s2t_minus_takeover": metrics["s2t_accuracy"] - metrics["takeover_accuracy"],
        "s2t_minus_greedy": metrics["s2t_accuracy"] - greedy,
        "local_entropy_relative_gain": relative_gain(metrics["local_entropy_accuracy"], greedy),
        "local_entropy_over_greedy": accuracy_ratio(metrics["local_entropy_accuracy"], greedy),
        "local_entropy_minus_maj": metrics["local_entropy_accuracy"] - metrics["slm_maj_accuracy"],
    }
    lap("local_eval")

    for name, model in (("llm", llm), ("slm", slm), ("slm_local", local_model)):
        tiny_lm.save_model(model, Path(model_dir) / f"seed{seed}" / name)
    lap("save")
    report(1.0, "done")
    metrics |= {f"seconds_{k}": v for k, v in timings.items()}
    curves = {"llm_train_loss": llm_curve, "slm_train_loss": slm_curve, "local_train_loss": log.total,
              "local_ce": log.ce, "local_hinge": log.hinge}
    tables = {"hit_at_k": [{"k": k, "hit": hits[k]} for k in [*s2t.hit_ks, data.BASE_VOCAB]],
              "examples": example_rows(test, {"greedy": None, "s2t": s2t_trace, "local_entropy": local_entropy})}
    return {"seed": seed, "metrics": {k: float(v) for k, v in metrics.items()}, "curves": curves, "tables": tables}


def hit_counts(hits: dict[int, list[bool]], ks: list[int]) -> dict[str, float]:
    """Counts over the trigger steps (the trials of the hit-rate claims, pooled over seeds): hits at each K, and,
    when 1 and 8 are among ``ks``, the steps where the LLM's token is in the SLM's top-8 but not its top-1 (C2)
    and where the SLM's top-1 differs from the LLM's choice (the disagreement C1's precondition needs)."""
    triggers = len(hits[ks[0]]) if ks else 0
    out = {"trigger_count": float(triggers)} | {f"hit_at_{k}_count": float(sum(hits[k])) for k in ks}
    if 1 in ks and 8 in ks:
        out["hit8_not_hit1_count"] = float(sum(h8 and not h1 for h1, h8 in zip(hits[1], hits[8])))
        out["slm_llm_disagree_count"] = float(sum(not h1 for h1 in hits[1]))
        out["slm_llm_disagree_rate"] = out["slm_llm_disagree_count"] / triggers if triggers else math.nan
    return out


def differ_counts(s2t_tokens: torch.Tensor, takeover_tokens: torch.Tensor) -> dict[str, float]:
    """Problems whose S2T and Takeover generations differ anywhere: the only problems on which their accuracies
    can differ (C4a's precondition)."""
    width = min(s2t_tokens.shape[1], takeover_tokens.shape[1])
    differ = (s2t_tokens[:, :width] != takeover_tokens[:, :width]).any(dim=1)
    differ |= torch.tensor(s2t_tokens.shape[1] != takeover_tokens.shape[1])
    return {"s2t_takeover_differ_count": float(differ.sum()), "s2t_takeover_differ_rate": float(differ.float().mean())}


def accuracy_ratio(accuracy: float, baseline: float) -> float:
    """accuracy / baseline (C5 on the log scale); NaN when the baseline solves nothing (no ratio to take)."""
    return accuracy / baseline if baseline > 0 else math.nan


def relative_gain(accuracy: float, baseline: float) -> float:
    """accuracy / baseline - 1; +inf when the baseline is 0 and the method solves anything."""
    if baseline == 0:
        return math.inf if accuracy > 0 else 0.0
    return accuracy / baseline - 1.0


def example_rows(task: AdditionTask, traces: dict[str, method.DecodeTrace | None], n: int = 5) -> list[dict]:
    """A few decoded test problems per method, as text (the README's qualitative examples)."""
    rows = []
    for name, trace in traces.items():
        if trace is None:
            continue
        for i in range(min(n, len(task.truth))):
            rows.append({"method": name, "prompt": data.render(task.prompts[i].tolist()),
                         "generated": data.render(trace.tokens[i].tolist()), "truth": task.truth[i],
                         "triggers": int(trace.fired[i].sum())})
    return rows
