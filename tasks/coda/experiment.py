"""The coda experiment: one seed = every model on every synthetic task, trained from scratch with Adam,
then accuracy, deterministic cost counts (nonlinear evaluations per step, matrix-product FLOPs) and measured
times; 2-layer stacks and LTC -> CoDA conversion on the tasks the study names; the LFM2 study at the paper
profile (``tasks.coda.lfm``).

Speed claims (brief (b)1, (b)2, (b)4) are verdicted on wall-clock times measured side by side after training:
the trained LTC and CoDA models of a task are timed alternately within each repeat (one training step, one
inference pass; medians of ``study.timing_repeats``), so load changes hit both alike. The deterministic costs
(nonlinear evaluations per step, matrix-product FLOPs) are reported next to them; ``bench/coda_speedup.py``
repeats the timing on its own. Plain functions (no Prefect, no MLflow); the flow calls ``write_data`` and
``run_seed``.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tasks.coda import baselines, data, method
from tasks.coda.config import CodaConfig, ModelConfig, StudyConfig, TrainConfig
from tasks.common.io import save_state_dict
from tasks.common.results import Progress, SeedResult
from tasks.common.seeding import torch_init_seed

REFERENCE = "ltc"
CODA = "coda"
NFE_BATCH = 4  # sequences in the instrumented forward that counts nonlinear evaluations


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------

def build_layer(kind: str, in_dim: int, cfg: ModelConfig) -> tuple[nn.Module, int]:
    """One layer of the named kind and its output width. LTC and CoDA both emit ``ltc_units`` features, so
    a CoDA block can stand in for an LTC layer (and be distilled from it) anywhere in a stack."""
    if kind == "ltc":
        return method.LTCLayer(in_dim, cfg.ltc_units, cfg.ode_unfolds), cfg.ltc_units
    if kind == "coda":
        return method.CodaBlock(in_dim, cfg.ltc_units, cfg.coda_gru_hidden, cfg.coda_rank, cfg.coda_eps), cfg.ltc_units
    if kind == "cfc":
        return baselines.CfCLayer(in_dim, cfg.baseline_hidden), cfg.baseline_hidden
    if kind == "odernn":
        return baselines.ODERNNLayer(in_dim, cfg.baseline_hidden, cfg.odernn_rk4_steps), cfg.baseline_hidden
    if kind == "gru":
        return baselines.GRULayer(in_dim, cfg.baseline_hidden), cfg.baseline_hidden
    raise ValueError(f"unknown model kind {kind!r}")


def build_model(kind: str, n_layers: int, task: data.TaskArrays, cfg: ModelConfig, seed: int
                ) -> method.SequenceModel:
    with torch_init_seed(seed):  # module init draws from torch's global generator
        layers, width = [], task.inputs.shape[-1]
        for _ in range(n_layers):
            layer, width = build_layer(kind, width, cfg)
            layers.append(layer)
        return method.SequenceModel(layers, nn.Linear(width, task.n_outputs), task.kind)


@dataclass
class Split:
    inputs: torch.Tensor
    dt: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    def __len__(self) -> int:
        return len(self.inputs)

    def take(self, index: torch.Tensor | slice) -> Split:
        return Split(self.inputs[index], self.dt[index], self.targets[index], self.mask[index])


def task_splits(task: data.TaskArrays, device: str) -> tuple[Split, Split]:
    def part(name: str) -> Split:
        rows = task.split == name
        return Split(*(torch.as_tensor(a[rows]).to(device) for a in (task.inputs, task.dt, task.targets, task.mask)))

    return part("train"), part("test")


def task_loss(kind: str, outputs: torch.Tensor, batch: Split) -> torch.Tensor:
    """Masked MSE over the scored steps (forecasting) or cross-entropy of the last step (classification)."""
    if kind == "classify":
        return nn.functional.cross_entropy(outputs[:, -1], batch.targets)
    squared = (outputs - batch.targets).pow(2).mean(-1)
    return (squared * batch.mask).sum() / batch.mask.sum()


def train_model(model: method.SequenceModel, train: Split, cfg: TrainConfig, epochs: int, seed: int
                ) -> tuple[list[float], list[float]]:
    """Adam with gradient clipping; returns the per-epoch mean loss and wall-clock seconds."""
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    losses, seconds = [], []
    model.train()
    for _ in range(epochs):
        start = time.perf_counter()
        order = torch.randperm(len(train), generator=generator)
        total = 0.0
        for begin in range(0, len(order), cfg.batch_size):
            batch = train.take(order[begin:begin + cfg.batch_size].to(train.inputs.device))
            loss = task_loss(model.kind, model(batch.inputs, batch.dt), batch)
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimiser.step()
            total += float(loss.detach()) * len(batch)
        losses.append(total / len(train))
        seconds.append(time.perf_counter() - start)
    model.eval()
    return losses, seconds


def evaluate(model: method.SequenceModel, test: Split) -> float:
    """Test MSE on the scored steps (standardised units) or test accuracy in percent."""
    with torch.no_grad():
        outputs = model(test.inputs, test.dt)
    if model.kind == "classify":
        return 100.0 * float((outputs[:, -1].argmax(-1) == test.targets).double().mean())
    return float(task_loss(model.kind, outputs, test))


def chance_score(kind: str, train: Split, test: Split) -> float:
    """The score of a predictor that learned nothing from the inputs, in the units of ``evaluate``: the
    majority training label (classification, test accuracy in percent) or the mean training target over the
    scored steps (forecasting, masked test MSE). A parity claim can only fail if this is not at parity with the
    reference (claims' preconditions, ``learned``)."""
    if kind == "classify":
        majority = int(torch.bincount(train.targets).argmax())
        return 100.0 * float((test.targets == majority).double().mean())
    weights = train.mask.unsqueeze(-1)
    constant = (train.targets * weights).sum(dim=(0, 1)) / (weights.sum() + 1e-12)
    squared = (constant - test.targets).pow(2).mean(-1)
    return float((squared * test.mask).sum() / test.mask.sum())


def has_converged(losses: list[float], loss_ratio: float) -> bool:
    """Training has converged when the mean training loss a quarter of the epochs before the end (at least one
    epoch) is within ``loss_ratio`` of the last one: the last quarter of training improved it by less than the
    parity tolerance. One epoch alone cannot show it (False)."""
    back = max(1, len(losses) // 4)
    if len(losses) <= back:
        return False
    return losses[-1 - back] <= loss_ratio * losses[-1]


def median_forward_seconds(model: nn.Module, batch: Split, repeats: int) -> float:
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            model(batch.inputs, batch.dt)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_timings(models: dict[str, method.SequenceModel], batch: Split, timing: Split, repeats: int
                   ) -> dict[str, dict[str, float]]:
    """Median seconds of one training step (forward + backward on ``batch``, no optimiser step) and of one
    inference pass (``timing``) of every model, side by side: one warm-up each, then the models alternate
    within each repeat so that load changes hit all of them alike (brief (b): medians of 3 repeats)."""

    def train_step(model: method.SequenceModel) -> None:
        task_loss(model.kind, model(batch.inputs, batch.dt), batch).backward()
        model.zero_grad(set_to_none=True)

    def infer(model: method.SequenceModel) -> None:
        with torch.no_grad():
            model(timing.inputs, timing.dt)

    times: dict[str, dict[str, list[float]]] = {name: {"train": [], "inference": []} for name in models}
    for model in models.values():
        train_step(model)
        infer(model)
    for _ in range(repeats):
        for name, model in models.items():
            for phase, fn in (("train", train_step), ("inference", infer)):
                start = time.perf_counter()
                fn(model)
                times[name][phase].append(time.perf_counter() - start)
    return {name: {phase: statistics.median(values) for phase, values in phases.items()}
            for name, phases in times.items()}


# ------------------------------------------------------------------------------------------------
# One model on one task
# ------------------------------------------------------------------------------------------------

def cost_counts(model: method.SequenceModel, train: Split, test: Split, train_cfg: TrainConfig,
                study: StudyConfig, with_flops: bool) -> dict[str, float]:
    """Deterministic costs: nonlinear evaluations per step and (LTC / CoDA only: counting FLOPs through
    torch's dispatcher is slow for long Python loops) FLOPs of one training step and of inference."""
    timing = test.take(slice(0, study.timing_batch))
    batch = train.take(slice(0, train_cfg.batch_size))
    nfe = method.count_nonlinear_evaluations(model, batch.inputs[:NFE_BATCH], batch.dt[:NFE_BATCH])
    if not with_flops:
        return {"nfe_per_step": nfe}
    return {
        "nfe_per_step": nfe,
        "train_step_flops": float(method.training_step_flops(model, batch.inputs, batch.dt,
                                                             lambda out: task_loss(model.kind, out, batch))),
        "inference_flops": float(method.forward_flops(model, timing.inputs, timing.dt)),
    }


def run_model(kind: str, n_layers: int, task: data.TaskArrays, splits: tuple[Split, Split], cfg: CodaConfig,
              seed: int) -> tuple[method.SequenceModel, dict[str, Any]]:
    train, test = splits
    model = build_model(kind, n_layers, task, cfg.model, seed).to(train.inputs.device)
    losses, seconds = train_model(model, train, cfg.train, cfg.train.epochs, seed)
    timing = test.take(slice(0, cfg.study.timing_batch))
    row = {"task": task.name, "kind": task.kind, "model": kind, "layers": n_layers,
           "score": evaluate(model, test), "parameters": sum(p.numel() for p in model.parameters()),
           "seconds_per_epoch": statistics.median(seconds),
           "ms_inference_batch": 1e3 * median_forward_seconds(model, timing, cfg.study.timing_repeats),
           "ms_inference_single": 1e3 * median_forward_seconds(model, test.take(slice(0, 1)),
                                                               cfg.study.timing_repeats),
           "final_train_loss": losses[-1], "converged": has_converged(losses, cfg.study.parity_mse_ratio),
           "chance_score": chance_score(task.kind, train, test)} | cost_counts(model, train, test, cfg.train, cfg.study,
                                                          with_flops=kind in (REFERENCE, CODA))
    return model, row | {"losses": losses}


def convert_ltc(teacher: method.SequenceModel, task: data.TaskArrays, splits: tuple[Split, Split], cfg: CodaConfig,
                seed: int) -> tuple[method.SequenceModel, dict[str, Any]]:
    """Brief, "Conversion path": layer-wise distillation from the trained LTC, then end-to-end fine-tuning."""
    train, test = splits
    student = build_model(CODA, len(teacher.layers), task, cfg.model, seed + 1).to(train.inputs.device)
    start = time.perf_counter()
    distill = method.distill_layerwise(teacher, student, train.inputs, train.dt, cfg.study.distill_epochs,
                                       cfg.train.batch_size, cfg.train.lr, torch.Generator().manual_seed(seed))
    after_distill = evaluate(student, test)
    losses, _ = train_model(student, train, cfg.train, cfg.study.finetune_epochs, seed)
    return student, {"task": task.name, "kind": task.kind, "model": "coda_converted", "layers": len(teacher.layers),
                     "score": evaluate(student, test), "score_after_distillation": after_distill,
                     "distill_loss_last_layer": distill[-1], "seconds_total": time.perf_counter() - start,
                     "converged": has_converged(losses, cfg.study.parity_mse_ratio),
                     "chance_score": chance_score(task.kind, train, test), "losses": losses}


# ------------------------------------------------------------------------------------------------
# Claim metrics (per seed)
# ------------------------------------------------------------------------------------------------

def at_parity(kind: str, coda_score: float, ltc_score: float, study: StudyConfig) -> bool:
    """Brief (b): CoDA MSE <= 1.1 x LTC's, or CoDA accuracy >= LTC's - 2 points."""
    if kind == "classify":
        return coda_score >= ltc_score - study.parity_accuracy_points
    return coda_score <= study.parity_mse_ratio * ltc_score


def learned(row: dict, study: StudyConfig) -> bool:
    """The model learned its task above chance, with the parity tolerance as the margin: a predictor that
    learned nothing (``chance_score``) is NOT at parity with it, so a parity test against it can fail."""
    return not at_parity(row["kind"], row["chance_score"], row["score"], study)


def parity_metrics(pairs: list[tuple[dict, dict]], study: StudyConfig, fraction: str, trials: str, count: str,
                   learned_name: str, converged_name: str) -> dict[str, float]:
    """Per-seed metrics of one parity claim over (candidate, reference) pairs, one per task: the fraction at
    parity and its count, and the preconditions' counts (reference learned above chance; candidate and reference
    both converged), each with its fraction. Counts are integers (as floats): the claims pool them over seeds
    (binomial interval); ``trials`` is the number of pairs."""
    n = float(len(pairs))
    at = float(sum(at_parity(ref["kind"], cand["score"], ref["score"], study) for cand, ref in pairs))
    know = float(sum(learned(ref, study) for _, ref in pairs))
    done = float(sum(bool(cand["converged"]) and bool(ref["converged"]) for cand, ref in pairs))
    return {fraction: at / n, count: at, trials: n, f"{learned_name}_count": know, f"{learned_name}_fraction": know / n,
            f"{converged_name}_count": done, f"{converged_name}_fraction": done / n}


def five_of_six_quantile(values: list[float]) -> float:
    """The ceil(5n/6)-th smallest value: it is <= x exactly when at least 5 of 6 (5/6 of the) values are."""
    ordered = sorted(values)
    return ordered[math.ceil(5 * len(ordered) / 6) - 1]


def find(rows: list[dict], task: str, model: str, layers: int = 1) -> dict:
    return next(r for r in rows if r["task"] == task and r["model"] == model and r["layers"] == layers)


def best_baseline(rows: list[dict], task: str, baseline_models: list[str]) -> dict | None:
    """The best 1-layer baseline (lowest MSE / highest accuracy) of a task: a fairer reference than the LTC,
    which is under-trained at the cpu budget (README)."""
    candidates = [r for r in rows if r["task"] == task and r["model"] in baseline_models and r["layers"] == 1]
    if not candidates:
        return None
    classify = candidates[0]["kind"] == "classify"
    return max(candidates, key=lambda r: r["score"]) if classify else min(candidates, key=lambda r: r["score"])


def claim_metrics(rows: list[dict], cfg: CodaConfig) -> dict[str, float]:
    tasks = cfg.data.tasks
    ltc = {t: find(rows, t, REFERENCE) for t in tasks}
    coda = {t: find(rows, t, CODA) for t in tasks}
    metrics: dict[str, float] = {
        # deterministic costs (reported; exact by construction of the architectures, see the unit tests)
        "nfe_per_step_ltc": ltc[tasks[0]]["nfe_per_step"],
        "nfe_per_step_coda": coda[tasks[0]]["nfe_per_step"],
        "nfe_ratio_ltc_over_coda": ltc[tasks[0]]["nfe_per_step"] / coda[tasks[0]]["nfe_per_step"],
        "train_flops_ratio_coda_over_ltc_5of6": five_of_six_quantile(
            [coda[t]["train_step_flops"] / ltc[t]["train_step_flops"] for t in tasks]),
        "inference_flops_ratio_coda_over_ltc_max": max(coda[t]["inference_flops"] / ltc[t]["inference_flops"]
                                                       for t in tasks),
        # wall-clock, side by side (brief (b)1 and (b)2; claims C5a, C5b)
        "measured_train_time_ratio_coda_over_ltc_5of6": five_of_six_quantile(
            [coda[t]["ms_train_step_paired"] / ltc[t]["ms_train_step_paired"] for t in tasks]),
        "measured_inference_time_ratio_coda_over_ltc_max": max(
            coda[t]["ms_inference_batch_paired"] / ltc[t]["ms_inference_batch_paired"] for t in tasks),
    }
    # accuracy parity (brief (b)3; claims C3a, C3e), with the counts the binomial interval and preconditions pool
    metrics |= parity_metrics([(coda[t], ltc[t]) for t in tasks], cfg.study, "parity_fraction", "parity_trials",
                              "parity_count", "ltc_learned", "ltc_coda_converged")
    references = {t: best_baseline(rows, t, cfg.study.baselines) for t in tasks}
    if all(ref is not None for ref in references.values()):
        metrics |= parity_metrics([(coda[t], references[t]) for t in tasks], cfg.study,
                                  "parity_fraction_vs_best_baseline", "parity_trials", "parity_vs_best_baseline_count",
                                  "best_baseline_learned", "best_baseline_coda_converged")
    for row in rows:
        if "nfe_per_step" in row:
            metrics[f"nfe_per_step_{row['model']}_L{row['layers']}"] = row["nfe_per_step"]
        unit = "acc" if row["kind"] == "classify" else "mse"
        metrics[f"{unit}_{row['task']}_{row['model']}_L{row['layers']}"] = row["score"]
        metrics[f"{unit}_{row['task']}_chance"] = row["chance_score"]  # the same for every model of a task
    if "lorenz" in tasks:
        metrics["mse_ratio_coda_over_ltc_lorenz"] = coda["lorenz"]["score"] / ltc["lorenz"]["score"]
    two = cfg.study.two_layer_tasks
    if two:
        flop_gains, time_gains = [], []
        for t in two:
            ltc2, coda2 = find(rows, t, REFERENCE, 2), find(rows, t, CODA, 2)
            flop_gains.append((ltc2["train_step_flops"] / coda2["train_step_flops"])
                              / (ltc[t]["train_step_flops"] / coda[t]["train_step_flops"]))
            time_gains.append((ltc2["ms_train_step_paired"] / coda2["ms_train_step_paired"])
                              / (ltc[t]["ms_train_step_paired"] / coda[t]["ms_train_step_paired"]))
        metrics["flops_speedup_2layer_over_1layer_min"] = min(flop_gains)
        metrics["measured_speedup_2layer_over_1layer_min"] = min(time_gains)  # brief (b)4; claim C3c
        metrics |= parity_metrics([(find(rows, t, CODA, 2), find(rows, t, REFERENCE, 2)) for t in two], cfg.study,
                                  "two_layer_parity_fraction", "two_layer_trials", "two_layer_parity_count",
                                  "ltc_L2_learned", "two_layer_converged")  # claim C3b
    converted = [r for r in rows if r["model"] == "coda_converted"]
    if converted:  # claim C3d: each converted model against its own teacher (same depth)
        metrics |= parity_metrics([(r, find(rows, r["task"], REFERENCE, r["layers"])) for r in converted], cfg.study,
                                  "converted_parity_fraction", "converted_trials", "converted_parity_count",
                                  "teacher_learned", "converted_converged")
    return metrics


def linear_ode_checks(models: list[method.SequenceModel], dt: torch.Tensor, seed: int) -> dict[str, float]:
    """Acceptance checks (a)1 and (a)3 on the TRAINED CoDA generators: max Re eig(K) + eps (<= 0 when stable),
    and the largest gap between the exact ZOH step and a fine RK4 integration (float64)."""
    generator = torch.Generator().manual_seed(seed)
    worst_eig, worst_gap = -math.inf, 0.0
    for model in models:
        for block in (b for b in model.layers if isinstance(b, method.CodaBlock)):
            k = block.generator().detach().double()
            worst_eig = max(worst_eig, float(torch.linalg.eigvals(k).real.max()) + block.eps)
            z0 = torch.randn(block.rank, generator=generator, dtype=torch.float64)
            forcing = torch.randn(block.rank, generator=generator, dtype=torch.float64)
            step = float(dt.flatten()[0])
            phi, gamma = method.zoh_propagators(k, torch.tensor([step], dtype=torch.float64))
            exact = method.zoh_step(z0, forcing, phi[0], gamma[0])
            reference = method.rk4_integrate(lambda z, k=k, f=forcing: k @ z + f, z0, step, 200)
            worst_gap = max(worst_gap, float((exact - reference).abs().max()))
    return {"coda_max_real_eig_plus_eps": worst_eig, "zoh_vs_rk4_max_abs_error": worst_gap}


# ------------------------------------------------------------------------------------------------
# One seed, end to end
# ------------------------------------------------------------------------------------------------

def model_plan(cfg: CodaConfig) -> list[tuple[str, str, int]]:
    plan = []
    for task in cfg.data.tasks:
        plan += [(task, kind, 1) for kind in (REFERENCE, CODA, *cfg.study.baselines)]
        if task in cfg.study.two_layer_tasks:
            plan += [(task, REFERENCE, 2), (task, CODA, 2)]
    return plan


def time_side_by_side(trained: dict[tuple[str, str, int], method.SequenceModel], rows: list[dict],
                      splits: dict[str, tuple[Split, Split]], cfg: CodaConfig) -> None:
    """Paired wall-clock timing of the trained LTC and CoDA models of every (task, depth); adds
    ``ms_train_step_paired`` and ``ms_inference_batch_paired`` to their rows."""
    for name, layers in sorted({(t, n) for t, kind, n in trained if kind == REFERENCE}):
        train, test = splits[name]
        models = {kind: trained[(name, kind, layers)] for kind in (REFERENCE, CODA)}
        medians = paired_timings(models, train.take(slice(0, cfg.train.batch_size)),
                                 test.take(slice(0, cfg.study.timing_batch)), cfg.study.timing_repeats)
        for kind, phases in medians.items():
            row = find(rows, name, kind, layers)
            row["ms_train_step_paired"] = 1e3 * phases["train"]
            row["ms_inference_batch_paired"] = 1e3 * phases["inference"]


def run_seed(cfg: CodaConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress | None = None) -> SeedResult:
    """Every model on every task once; weights of the LTC and CoDA models under ``model_dir/seed<k>``.

    All inputs (every task, and the LFM study's token blocks at the paper profile) are read and checked
    against the config before any training."""
    start = time.perf_counter()
    tasks = {name: data.read_task(cfg.data, name, seed, Path(data_dir)) for name in cfg.data.tasks}
    lfm_blocks = None
    if cfg.lfm is not None:
        from tasks.coda import lfm

        lfm_blocks = lfm.read_train_eval_blocks(cfg.lfm, Path(data_dir))
    splits = {name: task_splits(task, device) for name, task in tasks.items()}
    plan = model_plan(cfg)
    rows, curves, coda_models, trained = [], {}, [], {}
    out_dir = Path(model_dir) / f"seed{seed}"
    for i, (name, kind, layers) in enumerate(plan):
        model, row = run_model(kind, layers, tasks[name], splits[name], cfg, seed)
        curves[f"loss_{name}_{kind}_L{layers}"] = row.pop("losses")
        rows.append(row)
        if kind in (REFERENCE, CODA):
            save_state_dict(model, out_dir / f"{name}_{kind}_L{layers}.safetensors")
            trained[(name, kind, layers)] = model
        if kind == CODA:
            coda_models.append(model)
        if kind == REFERENCE and name in cfg.study.convert_tasks:
            student, converted = convert_ltc(model, tasks[name], splits[name], cfg, seed)
            curves[f"loss_{name}_coda_converted_L{layers}"] = converted.pop("losses")
            rows.append(converted)
            save_state_dict(student, out_dir / f"{name}_coda_converted_L{layers}.safetensors")
        if progress is not None:
            progress((i + 1) / len(plan), f"{name}: {kind} x{layers} score {row['score']:.4g}")
    time_side_by_side(trained, rows, splits, cfg)
    metrics = claim_metrics(rows, cfg) | linear_ode_checks(coda_models, splits[cfg.data.tasks[0]][0].dt, seed)
    tables: dict[str, list[dict]] = {"models": rows}
    if cfg.lfm is not None and lfm_blocks is not None:
        lfm_metrics, lfm_rows = lfm.run_lfm_study(cfg.lfm, seed, lfm_blocks, device, progress)
        metrics |= lfm_metrics
        tables["lfm"] = lfm_rows
    metrics["seconds_run_seed"] = time.perf_counter() - start
    return {"seed": seed, "metrics": {k: float(v) for k, v in metrics.items()}, "curves": curves, "tables": tables}


def write_data(cfg: CodaConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase: every task for every seed (each seed draws its own sequences); at the paper profile also
    the tokenised text blocks of the LFM study."""
    paths = [data.write_task(cfg.data, name, seed, Path(data_dir)) for seed in seeds for name in cfg.data.tasks]
    if cfg.lfm is not None:
        from tasks.coda import lfm

        paths += lfm.write_text_blocks(cfg.lfm, Path(data_dir))
    return paths
