"""Training step of coda: every model of ``model.model_plan`` on every synthetic task, from scratch with Adam;
the LTC -> CoDA conversion (README, "Method": layer-wise distillation, then joint fine-tuning); at the paper
profile the LFM2 student (``hub.train_student``).

Each model is saved in the seed's folder (``model.checkpoint_path``). The result holds every training-loss
curve (``loss_<task>_<model>_L<layers>``, one value per epoch), the ``training`` table (final loss, median
seconds per epoch; for the conversion the last layer's distillation loss and its total seconds) and, at the
paper profile, ``lfm_final_finetune_loss``. Every input (each task, and the LFM study's token blocks) is read
and checked against the config before any training.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from torch import nn

from tasks.coda import method
from tasks.coda.config import CodaConfig, TrainConfig
from tasks.coda.data import TaskArrays
from tasks.coda.model import (
    CODA,
    CONVERTED,
    DISTILLED,
    Split,
    build_model,
    is_converted,
    model_plan,
    read_tasks,
    save_model,
    task_loss,
    task_splits,
)
from tasks.common.results import Progress, SeedResult, no_progress


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


def fit(kind: str, layers: int, task: TaskArrays, train: Split, cfg: CodaConfig, seed: int
        ) -> tuple[method.SequenceModel, list[float], dict]:
    """One model trained from scratch: the model, its loss curve and its ``training`` row."""
    model = build_model(kind, layers, task, cfg.model, seed).to(train.inputs.device)
    losses, seconds = train_model(model, train, cfg.train, cfg.train.epochs, seed)
    row = {"task": task.name, "model": kind, "layers": layers, "final_train_loss": losses[-1],
           "seconds_per_epoch": statistics.median(seconds)}
    return model, losses, row


def convert_ltc(teacher: method.SequenceModel, task: TaskArrays, train: Split, cfg: CodaConfig, seed: int,
                model_dir: Path) -> tuple[list[float], dict]:
    """Layer-wise distillation of a CoDA student from the trained LTC, then end-to-end fine-tuning (README,
    "Method", conversion). Saves the student after distillation and after fine-tuning; returns the
    fine-tuning loss curve and the ``training`` row."""
    layers = len(teacher.layers)
    student = build_model(CODA, layers, task, cfg.model, seed + 1).to(train.inputs.device)
    start = time.perf_counter()
    distill = method.distill_layerwise(teacher, student, train.inputs, train.dt, cfg.study.distill_epochs,
                                       cfg.train.batch_size, cfg.train.lr, torch.Generator().manual_seed(seed))
    save_model(student, model_dir, task.name, DISTILLED, layers)
    losses, _ = train_model(student, train, cfg.train, cfg.study.finetune_epochs, seed)
    seconds = time.perf_counter() - start
    save_model(student, model_dir, task.name, CONVERTED, layers)
    return losses, {"task": task.name, "model": CONVERTED, "layers": layers, "final_train_loss": losses[-1],
                    "distill_loss_last_layer": distill[-1], "seconds_total": seconds}


def train_all_models(cfg: CodaConfig, seed: int, tasks: dict[str, TaskArrays], model_dir: Path, device: str,
                     progress: Progress) -> tuple[dict[str, list[float]], list[dict]]:
    """Every model of the plan in order (each LTC of a conversion task converted right after it): curves
    and ``training`` rows."""
    splits = {name: task_splits(task, device)[0] for name, task in tasks.items()}
    plan = model_plan(cfg)
    curves, rows = {}, []
    for i, (name, kind, layers) in enumerate(plan):
        model, losses, row = fit(kind, layers, tasks[name], splits[name], cfg, seed)
        save_model(model, model_dir, name, kind, layers)
        curves[f"loss_{name}_{kind}_L{layers}"] = losses
        rows.append(row)
        if is_converted(cfg, name, kind):
            converted_losses, converted = convert_ltc(model, tasks[name], splits[name], cfg, seed, model_dir)
            curves[f"loss_{name}_{CONVERTED}_L{layers}"] = converted_losses
            rows.append(converted)
        progress((i + 1) / len(plan), f"{name}: {kind} x{layers} final train loss {losses[-1]:.4g}")
    return curves, rows


def train(cfg: CodaConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    tasks = read_tasks(cfg, seed, data_dir)
    lfm_blocks = None
    if cfg.lfm is not None:
        from tasks.coda import hub

        lfm_blocks = hub.read_train_eval_blocks(cfg.lfm, Path(data_dir))
    result = SeedResult(seed)
    with result.stage("train"):
        curves, rows = train_all_models(cfg, seed, tasks, Path(model_dir), device, progress)
    result.add(curves=curves, tables={"training": rows})
    if cfg.lfm is not None and lfm_blocks is not None:
        with result.stage("train_lfm"):
            metrics, curves = hub.train_student(cfg.lfm, seed, lfm_blocks[0], Path(model_dir), device, progress)
        result.add(metrics, curves=curves)
    return result
