"""Training step of coda: every model of ``model.model_plan`` on every synthetic task, from scratch with Adam and
early stopping on the validation split (README, "Test bed of issue 18"); the LTC -> CoDA conversion (README,
"Method": layer-wise distillation, then joint fine-tuning); at the paper profile the LFM2 student
(``hub.train_student``).

Each model is saved in the seed's folder (``model.checkpoint_path``), with the weights of its lowest validation
loss. The result holds every training- and validation-loss curve (``loss_`` / ``val_loss_<task>_<model>_L<layers>``,
one value per epoch), the ``training`` table (final training loss, epochs run, best validation loss, median
seconds per epoch; for the conversion also the last layer's distillation loss and its total seconds) and, at the
paper profile, ``lfm_final_finetune_loss``. Every input (each task, and the LFM study's token blocks) is read
and checked against the config before any training.
"""

from __future__ import annotations

import copy
import math
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
    split_part,
    task_loss,
    task_splits,
)
from tasks.common.results import Progress, SeedResult, no_progress


def validation_loss(model: method.SequenceModel, val: Split) -> float:
    with torch.no_grad():
        return float(task_loss(model.kind, model(val.inputs, val.dt), val))


def train_model(model: method.SequenceModel, train: Split, val: Split, cfg: TrainConfig, max_epochs: int, seed: int,
                lr: float) -> tuple[list[float], list[float], list[float]]:
    """Adam (learning rate ``lr``) with gradient clipping and early stopping on ``val`` (README, "Training"): stops
    once ``method.should_stop`` holds (at least ``cfg.min_epochs`` epochs and ``cfg.patience`` without
    improvement) or at ``max_epochs``, and restores the weights of the lowest validation loss. Returns the
    per-epoch mean training loss, validation loss and wall-clock seconds."""
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    losses, val_losses, seconds = [], [], []
    best_state, best_loss = copy.deepcopy(model.state_dict()), math.inf
    for _ in range(max_epochs):
        model.train()
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
        seconds.append(time.perf_counter() - start)
        losses.append(total / len(train))
        model.eval()
        val_losses.append(validation_loss(model, val))
        if val_losses[-1] < best_loss:
            best_state, best_loss = copy.deepcopy(model.state_dict()), val_losses[-1]
        if method.should_stop(val_losses, cfg.min_epochs, cfg.patience, cfg.min_rel_improvement):
            break
    model.load_state_dict(best_state)
    model.eval()
    return losses, val_losses, seconds


def fit(kind: str, layers: int, task: TaskArrays, train: Split, val: Split, cfg: CodaConfig, seed: int
        ) -> tuple[method.SequenceModel, dict[str, list[float]], dict]:
    """One model trained from scratch: the model, its training and validation loss curves and its ``training``
    row (epochs run, best validation loss, median seconds per epoch)."""
    model = build_model(kind, layers, task, cfg.model, seed).to(train.inputs.device)
    losses, val_losses, seconds = train_model(model, train, val, cfg.train, cfg.train.max_epochs, seed,
                                              cfg.train.lr_for(kind))
    row = {"task": task.name, "model": kind, "layers": layers, "final_train_loss": losses[-1],
           "epochs": len(losses), "best_val_loss": min(val_losses), "seconds_per_epoch": statistics.median(seconds)}
    return model, {"loss": losses, "val_loss": val_losses}, row


def convert_ltc(teacher: method.SequenceModel, task: TaskArrays, train: Split, val: Split, cfg: CodaConfig, seed: int,
                model_dir: Path) -> tuple[dict[str, list[float]], dict]:
    """Layer-wise distillation of a CoDA student from the trained LTC, then end-to-end fine-tuning (README,
    "Method", conversion). Saves the student after distillation and after fine-tuning; returns the
    fine-tuning loss curves (training, validation; early-stopped as every model) and the ``training`` row."""
    layers = len(teacher.layers)
    student = build_model(CODA, layers, task, cfg.model, seed + 1).to(train.inputs.device)
    start = time.perf_counter()
    distill = method.distill_layerwise(teacher, student, train.inputs, train.dt, cfg.study.distill_epochs,
                                       cfg.train.batch_size, cfg.train.lr_for(CODA),
                                       torch.Generator().manual_seed(seed))
    save_model(student, model_dir, task.name, DISTILLED, layers)
    losses, val_losses, _ = train_model(student, train, val, cfg.train, cfg.study.finetune_max_epochs, seed,
                                        cfg.train.lr_for(CODA))
    seconds = time.perf_counter() - start
    save_model(student, model_dir, task.name, CONVERTED, layers)
    return {"loss": losses, "val_loss": val_losses}, {
        "task": task.name, "model": CONVERTED, "layers": layers, "final_train_loss": losses[-1],
        "epochs": len(losses), "best_val_loss": min(val_losses), "distill_loss_last_layer": distill[-1],
        "seconds_total": seconds}


def train_all_models(cfg: CodaConfig, seed: int, tasks: dict[str, TaskArrays], model_dir: Path, device: str,
                     progress: Progress) -> tuple[dict[str, list[float]], list[dict]]:
    """Every model of the plan in order (each LTC of a conversion task converted right after it): curves
    and ``training`` rows."""
    splits = {name: (task_splits(task, device)[0], split_part(task, "val", device)) for name, task in tasks.items()}
    plan = model_plan(cfg)
    curves, rows = {}, []
    for i, (name, kind, layers) in enumerate(plan):
        model, model_curves, row = fit(kind, layers, tasks[name], *splits[name], cfg, seed)
        save_model(model, model_dir, name, kind, layers)
        curves |= {f"{curve}_{name}_{kind}_L{layers}": values for curve, values in model_curves.items()}
        rows.append(row)
        if is_converted(cfg, name, kind):
            converted_curves, converted = convert_ltc(model, tasks[name], *splits[name], cfg, seed, model_dir)
            curves |= {f"{curve}_{name}_{CONVERTED}_L{layers}": values for curve, values in converted_curves.items()}
            rows.append(converted)
        progress((i + 1) / len(plan), f"{name}: {kind} x{layers} {row['epochs']} epochs, best validation loss "
                                      f"{row['best_val_loss']:.4g}")
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
