"""Models, data splits and checkpoints shared by coda's train and evaluate steps.

Every model is a ``method.SequenceModel`` (README, "Method"): 1- or 2-layer stacks of LTC, CoDA, CfC,
ODE-RNN or GRU layers with one linear head. ``model_plan`` lists the models one seed trains; each is saved as
``<task>_<model>_L<layers>.safetensors`` in the seed's model folder, the LTC -> CoDA conversion as
``<task>_coda_converted_L<layers>`` (and the distilled student before fine-tuning, ``..._coda_distilled_...``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tasks.coda import baselines, data, method
from tasks.coda.config import CodaConfig, ModelConfig
from tasks.common.io import load_state_dict, save_state_dict
from tasks.common.seeding import torch_init_seed

REFERENCE = "ltc"
CODA = "coda"
ABLATION = "gru_dense"  # CoDA without its linear ODE, at a matched parameter count (method.GruDenseBlock)
CONVERTED = "coda_converted"
DISTILLED = "coda_distilled"  # the converted student after layer-wise distillation, before fine-tuning


def build_layer(kind: str, in_dim: int, cfg: ModelConfig) -> tuple[nn.Module, int]:
    """One layer of the named kind and its output width. LTC and CoDA both emit ``ltc_units`` features, so
    a CoDA block can stand in for an LTC layer (and be distilled from it) anywhere in a stack."""
    if kind == "ltc":
        return method.LTCLayer(in_dim, cfg.ltc_units, cfg.ode_unfolds), cfg.ltc_units
    if kind == "coda":
        return method.CodaBlock(in_dim, cfg.ltc_units, cfg.coda_gru_hidden, cfg.coda_rank, cfg.coda_eps), cfg.ltc_units
    if kind == ABLATION:
        hidden = method.matched_ablation_hidden(in_dim, cfg.ltc_units, cfg.coda_gru_hidden, cfg.coda_rank)
        return method.GruDenseBlock(in_dim, cfg.ltc_units, hidden), cfg.ltc_units
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


def model_plan(cfg: CodaConfig) -> list[tuple[str, str, int]]:
    """(task, model kind, layers) of every model one seed trains, in training order."""
    plan = []
    for task in cfg.data.tasks:
        ablation = (ABLATION,) if cfg.study.ablation else ()
        plan += [(task, kind, 1) for kind in (REFERENCE, CODA, *ablation, *cfg.study.baselines)]
        if task in cfg.study.two_layer_tasks:
            plan += [(task, REFERENCE, 2), (task, CODA, 2)]
    return plan


def is_converted(cfg: CodaConfig, task: str, kind: str) -> bool:
    """The trained LTC of a ``study.convert_tasks`` task is converted to CoDA (each of its depths)."""
    return kind == REFERENCE and task in cfg.study.convert_tasks


def checkpoint_path(model_dir: Path, task: str, model: str, layers: int) -> Path:
    return Path(model_dir) / f"{task}_{model}_L{layers}.safetensors"


def save_model(model: method.SequenceModel, model_dir: Path, task: str, name: str, layers: int) -> Path:
    return save_state_dict(model, checkpoint_path(model_dir, task, name, layers))


def load_model(kind: str, layers: int, task: data.TaskArrays, cfg: ModelConfig, model_dir: Path, name: str,
               device: str) -> method.SequenceModel:
    """A trained model from its checkpoint (``name`` is the file's model part: ``kind`` or a conversion)."""
    model = build_model(kind, layers, task, cfg, seed=0)  # every weight is overwritten by the checkpoint
    load_state_dict(model, checkpoint_path(model_dir, task.name, name, layers))
    return model.to(device).eval()


def read_tasks(cfg: CodaConfig, seed: int, data_dir: Path) -> dict[str, data.TaskArrays]:
    """Every task of the profile, each checked against the data config (``data.read_task``)."""
    return {name: data.read_task(cfg.data, name, seed, Path(data_dir)) for name in cfg.data.tasks}


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


def split_part(task: data.TaskArrays, name: str, device: str) -> Split:
    """The rows of one split ("train", "val" or "test")."""
    rows = task.split == name
    return Split(*(torch.as_tensor(a[rows]).to(device) for a in (task.inputs, task.dt, task.targets, task.mask)))


def task_splits(task: data.TaskArrays, device: str) -> tuple[Split, Split]:
    """Training and test rows (the validation rows: ``split_part(task, "val", device)``)."""
    return split_part(task, "train", device), split_part(task, "test", device)


def task_loss(kind: str, outputs: torch.Tensor, batch: Split) -> torch.Tensor:
    """Masked MSE over the scored steps (forecasting) or cross-entropy of the last step (classification)."""
    if kind == "classify":
        return nn.functional.cross_entropy(outputs[:, -1], batch.targets)
    squared = (outputs - batch.targets).pow(2).mean(-1)
    return (squared * batch.mask).sum() / batch.mask.sum()


def score(model: method.SequenceModel, test: Split) -> float:
    """Test MSE on the scored steps (standardised units) or test accuracy in percent."""
    with torch.no_grad():
        outputs = model(test.inputs, test.dt)
    if model.kind == "classify":
        return 100.0 * float((outputs[:, -1].argmax(-1) == test.targets).double().mean())
    return float(task_loss(model.kind, outputs, test))
