"""Evaluation step of new_paper: reads the checkpoint and measures; derives no claim numbers."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.new_paper import method
from tasks.new_paper.config import NewPaperConfig
from tasks.new_paper.data import load_split
from tasks.new_paper.train import CHECKPOINT


def test_mse(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
    return float(torch.mean((x @ w - y) ** 2))


def evaluate(cfg: NewPaperConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    w = load_file(str(Path(model_dir) / CHECKPOINT))["w"]
    x_train, y_train = (torch.from_numpy(a) for a in load_split(data_dir, "train", seed))
    x_test, y_test = (torch.from_numpy(a) for a in load_split(data_dir, "test", seed))
    w_star = method.ridge_closed_form(x_train, y_train, cfg.train.ridge)
    result = SeedResult(seed).add(
        test_mse=test_mse(w, x_test, y_test), closed_form_test_mse=test_mse(w_star, x_test, y_test),
        objective_gap=float(method.ridge_objective(w, x_train, y_train, cfg.train.ridge)
                            - method.ridge_objective(w_star, x_train, y_train, cfg.train.ridge)),
        noise_floor=cfg.data.noise_sd**2)
    progress(1.0, f"test MSE {result.metrics['test_mse']:.4g}")
    return result
