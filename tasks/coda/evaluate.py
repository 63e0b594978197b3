"""Evaluation step of coda: reads every trained model of the seed and measures; derives no claim numbers.

Per model (table ``models``): test score (MSE of the scored steps, or accuracy in percent), the score of a
predictor that learned nothing (``chance_score``), parameter count, inference times, and the deterministic
costs: nonlinear cell evaluations per step and (LTC / CoDA) matrix-product FLOPs of one training step and one
inference pass. Speed claims (C5a, C5b, C3c) are verdicted on wall-clock times measured side by side: the
trained LTC and CoDA models of a task are timed alternately within each repeat (one training step, one
inference pass; medians of ``study.timing_repeats``), so load changes hit both alike; ``bench/coda_speedup.py``
repeats the timing on its own. The exact checks C2 and C2b run on the trained CoDA generators
(``linear_ode_checks``). At the paper profile, the LFM2 study's perplexities and tokens/s (table ``lfm``).
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from tasks.coda import method
from tasks.coda.config import CodaConfig, StudyConfig, TrainConfig
from tasks.coda.data import TaskArrays
from tasks.coda.model import (
    ABLATION,
    CODA,
    CONVERTED,
    DISTILLED,
    REFERENCE,
    Split,
    build_model,
    is_converted,
    load_model,
    model_plan,
    read_tasks,
    score,
    split_part,
    task_loss,
    task_splits,
)
from tasks.coda.train import validation_loss
from tasks.common.results import Progress, SeedResult, no_progress

NFE_BATCH = 4  # sequences in the instrumented forward that counts nonlinear evaluations
TIMED = (REFERENCE, CODA, ABLATION)  # the models with FLOP counts and side-by-side timings


def chance_score(kind: str, train: Split, test: Split) -> float:
    """The score of a predictor that learned nothing from the inputs, in the units of ``model.score``: the
    majority training label (classification, test accuracy in percent) or the mean training target over the
    scored steps (forecasting, masked test MSE). A parity claim can only fail if this is not at parity with the
    reference (claims' preconditions, ``claim_metrics.learned``)."""
    if kind == "classify":
        majority = int(torch.bincount(train.targets).argmax())
        return 100.0 * float((test.targets == majority).double().mean())
    weights = train.mask.unsqueeze(-1)
    constant = (train.targets * weights).sum(dim=(0, 1)) / (weights.sum() + 1e-12)
    squared = (constant - test.targets).pow(2).mean(-1)
    return float((squared * test.mask).sum() / test.mask.sum())


def median_forward_seconds(model: nn.Module, batch: Split, repeats: int) -> float:
    times = []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            model(batch.inputs, batch.dt)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def paired_timings(models: dict, batch: Split, timing: Split, repeats: int) -> dict:
    """Median seconds of one training step (forward + backward on ``batch``, no optimiser step) and of one
    inference pass (``timing``) of every model, side by side: one warm-up each, then the models alternate
    within each repeat so that load changes hit all of them alike (README, "Method": medians of
    ``study.timing_repeats``)."""

    def train_step(model: method.SequenceModel) -> None:
        task_loss(model.kind, model(batch.inputs, batch.dt), batch).backward()
        model.zero_grad(set_to_none=True)

    def infer(model: method.SequenceModel) -> None:
        with torch.no_grad():
            model(timing.inputs, timing.dt)

    times: dict = {name: {"train": [], "inference": []} for name in models}
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


def measure_model(model: method.SequenceModel, kind: str, layers: int, task: TaskArrays, splits: tuple[Split, Split],
                  cfg: CodaConfig) -> dict:
    """The ``models`` row of one trained model."""
    train, test = splits
    timing = test.take(slice(0, cfg.study.timing_batch))
    return {"task": task.name, "kind": task.kind, "model": kind, "layers": layers, "score": score(model, test),
            "parameters": sum(p.numel() for p in model.parameters()),
            "ms_inference_batch": 1e3 * median_forward_seconds(model, timing, cfg.study.timing_repeats),
            "ms_inference_single": 1e3 * median_forward_seconds(model, test.take(slice(0, 1)),
                                                                cfg.study.timing_repeats),
            "chance_score": chance_score(task.kind, train, test)} | cost_counts(
                model, train, test, cfg.train, cfg.study, with_flops=kind in TIMED)


def measure_converted(task: TaskArrays, layers: int, splits: tuple[Split, Split], cfg: CodaConfig, model_dir: Path,
                      device: str) -> dict:
    """The ``models`` row of an LTC -> CoDA conversion: its score after distillation and after fine-tuning."""
    train, test = splits
    distilled, converted = (load_model(CODA, layers, task, cfg.model, model_dir, name, device)
                            for name in (DISTILLED, CONVERTED))
    return {"task": task.name, "kind": task.kind, "model": CONVERTED, "layers": layers, "score": score(converted, test),
            "score_after_distillation": score(distilled, test), "chance_score": chance_score(task.kind, train, test)}


def untrained_model(name: str, layers: int, task: TaskArrays, cfg: CodaConfig, seed: int) -> method.SequenceModel:
    """The model ``name`` of ``task`` as training started it, re-initialised through the training step's own
    code: ``model.build_model`` with the seed ``train.fit`` gives it, or for an LTC -> CoDA conversion the CoDA
    student that ``train.convert_ltc`` builds (seed + 1) before distillation."""
    if name == CONVERTED:
        return build_model(CODA, layers, task, cfg.model, seed + 1)
    return build_model(name, layers, task, cfg.model, seed)


def untrained_validation_loss(name: str, layers: int, task: TaskArrays, cfg: CodaConfig, seed: int,
                              device: str) -> float:
    """L_0: the validation loss of the untrained model (``untrained_model``) on the validation split, computed as
    training computes each epoch's (``train.validation_loss``). The reference of the convergence rule's initial
    drop (``claim_metrics.left_untrained_plateau``; review of the 2026-12-02 second round, finding 1)."""
    model = untrained_model(name, layers, task, cfg, seed).to(device).eval()
    return validation_loss(model, split_part(task, "val", device))


def find(rows: list[dict], task: str, model: str, layers: int = 1) -> dict:
    return next(r for r in rows if r["task"] == task and r["model"] == model and r["layers"] == layers)


def time_side_by_side(trained: dict[tuple[str, str, int], method.SequenceModel], rows: list[dict],
                      splits: dict[str, tuple[Split, Split]], cfg: CodaConfig) -> None:
    """Paired wall-clock timing of the trained LTC, CoDA (and no-ODE ablation) models of every (task, depth);
    adds ``ms_train_step_paired`` and ``ms_inference_batch_paired`` to their rows."""
    for name, layers in sorted({(t, n) for t, kind, n in trained if kind == REFERENCE}):
        train, test = splits[name]
        models = {kind: trained[(name, kind, layers)] for kind in TIMED if (name, kind, layers) in trained}
        medians = paired_timings(models, train.take(slice(0, cfg.train.batch_size)),
                                 test.take(slice(0, cfg.study.timing_batch)), cfg.study.timing_repeats)
        for kind, phases in medians.items():
            row = find(rows, name, kind, layers)
            row["ms_train_step_paired"] = 1e3 * phases["train"]
            row["ms_inference_batch_paired"] = 1e3 * phases["inference"]


def depth_costs(task: TaskArrays, split: tuple[Split, Split], cfg: CodaConfig, seed: int) -> list[dict]:
    """Claim C3c's rows (table ``costs``): 1- and 2-layer LTC and CoDA built from the seed and left untrained
    (their cost depends on the weights only through the ZOH series' squaring count), with FLOPs of one training
    step and one inference pass and the four models' paired wall-clock timings (one alternation)."""
    train, test = split
    batch, timing = train.take(slice(0, cfg.train.batch_size)), test.take(slice(0, cfg.study.timing_batch))
    models = {(kind, layers): build_model(kind, layers, task, cfg.model, seed).to(train.inputs.device)
              for layers in (1, 2) for kind in (REFERENCE, CODA)}
    medians = paired_timings(models, batch, timing, cfg.study.timing_repeats)
    rows = []
    for (kind, layers), model in models.items():
        flops = cost_counts(model, train, test, cfg.train, cfg.study, with_flops=True)
        rows.append({"task": task.name, "model": kind, "layers": layers,
                     "train_step_flops": flops["train_step_flops"], "inference_flops": flops["inference_flops"],
                     "ms_train_step_paired": 1e3 * medians[(kind, layers)]["train"],
                     "ms_inference_batch_paired": 1e3 * medians[(kind, layers)]["inference"]})
    return rows


def linear_ode_checks(models: list[method.SequenceModel], dt: torch.Tensor, seed: int) -> dict[str, float]:
    """Claims C2b and C2 on the TRAINED CoDA generators: max Re eig(K) + eps (<= 0 when stable), and the
    largest gap between the exact ZOH step and a fine RK4 integration (float64)."""
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


def row_metrics(rows: list[dict]) -> dict[str, float]:
    """Every model's score and nonlinear evaluations per step, and each task's chance score, as metrics
    (``<mse|acc>_<task>_<model>_L<layers>``, ``nfe_per_step_<model>_L<layers>``, ``<mse|acc>_<task>_chance``)."""
    metrics: dict[str, float] = {}
    for row in rows:
        if "nfe_per_step" in row:
            metrics[f"nfe_per_step_{row['model']}_L{row['layers']}"] = row["nfe_per_step"]
        unit = "acc" if row["kind"] == "classify" else "mse"
        metrics[f"{unit}_{row['task']}_{row['model']}_L{row['layers']}"] = row["score"]
        metrics[f"{unit}_{row['task']}_chance"] = row["chance_score"]  # the same for every model of a task
    return metrics


def measure_all_models(cfg: CodaConfig, tasks: dict[str, TaskArrays], splits: dict[str, tuple[Split, Split]],
                       model_dir: Path, device: str, progress: Progress, seed: int
                       ) -> tuple[list[dict], dict[tuple[str, str, int], method.SequenceModel]]:
    """The ``models`` rows in training order (each conversion after its teacher), each with its untrained
    validation loss (``untrained_val_loss``), and the loaded models."""
    rows, models = [], {}
    plan = model_plan(cfg)
    for i, (name, kind, layers) in enumerate(plan):
        model = load_model(kind, layers, tasks[name], cfg.model, model_dir, kind, device)
        rows.append(measure_model(model, kind, layers, tasks[name], splits[name], cfg)
                    | {"untrained_val_loss": untrained_validation_loss(kind, layers, tasks[name], cfg, seed, device)})
        models[(name, kind, layers)] = model
        if is_converted(cfg, name, kind):
            rows.append(measure_converted(tasks[name], layers, splits[name], cfg, model_dir, device)
                        | {"untrained_val_loss": untrained_validation_loss(CONVERTED, layers, tasks[name], cfg,
                                                                           seed, device)})
        progress((i + 1) / len(plan), f"{name}: {kind} x{layers} score {rows[-1]['score']:.4g}")
    return rows, models


def evaluate(cfg: CodaConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    tasks = read_tasks(cfg, seed, data_dir)
    splits = {name: task_splits(task, device) for name, task in tasks.items()}
    result = SeedResult(seed)
    with result.stage("evaluate"):
        rows, models = measure_all_models(cfg, tasks, splits, Path(model_dir), device, progress, seed)
        time_side_by_side({key: m for key, m in models.items() if key[1] in TIMED}, rows, splits, cfg)
        costs = [row for name in cfg.study.cost_tasks for row in depth_costs(tasks[name], splits[name], cfg, seed)]
    coda_models = [m for (_, kind, _), m in models.items() if kind == CODA]
    result.add(row_metrics(rows), tables={"models": rows, "costs": costs})
    result.add(linear_ode_checks(coda_models, splits[cfg.data.tasks[0]][0].dt, seed))
    if cfg.lfm is not None:
        from tasks.coda import hub

        with result.stage("evaluate_lfm"):
            lfm_rows = hub.evaluate_student(cfg.lfm, seed, hub.read_train_eval_blocks(cfg.lfm, Path(data_dir)),
                                            Path(model_dir), device)
        result.add(tables={"lfm": lfm_rows})
    return result
