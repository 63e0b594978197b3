"""Training step of new_paper: gradient descent on the ridge objective, one checkpoint per seed."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from tasks.common.io import write_with
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.new_paper import method
from tasks.new_paper.config import NewPaperConfig
from tasks.new_paper.data import load_split

CHECKPOINT = "model.safetensors"


def train(cfg: NewPaperConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    x, y = (torch.from_numpy(a) for a in load_split(data_dir, "train", seed))
    with result.stage("train"):
        w, losses = method.fit_gradient_descent(x, y, cfg.train.ridge, cfg.train.steps, cfg.train.lr)
    write_with(Path(model_dir) / CHECKPOINT, lambda tmp: save_file({"w": w.contiguous()}, str(tmp)))
    progress(1.0, f"trained {cfg.train.steps} steps, final objective {losses[-1]:.4g}")
    return result.add(final_train_objective=losses[-1], curves={"train_objective": losses})
