"""Evaluation step of token_merging: loads the model (the seed's trained digits ViT, or the paper
profile's pretrained checkpoint), runs the isotropic study and the training-free merging sweep, and
returns the raw measurements: accuracy per method and r, the sweep, RMS-per-block, isotropic and M4
energy-matching tables. The claims' numbers are derived in ``claim_metrics.py``."""

from __future__ import annotations

from pathlib import Path

import torch

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.token_merging import baselines, data, hub, method, sweep
from tasks.token_merging.config import TokenMergingConfig
from tasks.token_merging.model import load_vit


def evaluation_inputs(cfg: TokenMergingConfig, seed: int, data_dir: Path, model_dir: Path, device: str
                      ) -> tuple[method.MergeViT, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model, the evaluated images and labels, and M4's calibration images. Digits: the test split,
    and the first ``merge.calibration_size`` training images (on the CPU, where the model was trained).
    The data is read and checked before the model is loaded."""
    if cfg.hub is not None:
        return hub.hub_model(cfg, seed, data_dir, device)
    tensors = data.read_digits_tensors(cfg.data, data_dir)
    model = load_vit(cfg.vit, cfg.data, model_dir)
    (test_images, test_labels), (train_images, _) = tensors["test"], tensors["train"]
    return model, test_images, test_labels, train_images[:cfg.merge.calibration_size]


def evaluate(cfg: TokenMergingConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    with result.stage("load"):
        model, images, labels, calibration = evaluation_inputs(cfg, seed, Path(data_dir), Path(model_dir), device)
    with result.stage("isotropic"):
        iso_rows = sweep.isotropic_rows(cfg.isotropic, seed)
    with result.stage("sweep"):
        points, exponent, mismatch, unmerged = sweep.merging_sweep(model, images, labels, calibration, cfg.merge,
                                                                   progress)
    accuracies = {f"acc_{p.method}_r{p.retention:g}": 100.0 * p.accuracy for p in points}
    curves = {f"acc_{m.name}": [100.0 * sweep.point(points, m.name, r).accuracy for r in cfg.merge.retentions]
              for m in baselines.ALL_METHODS}
    tables = {"sweep": sweep.sweep_rows(points), "rms_per_block": sweep.rms_rows(points), "isotropic": iso_rows,
              "m4_energy_mismatch": [{"value_exponent": e, "mismatch": v} for e, v in mismatch.items()]}
    return result.add(accuracies, m4_value_exponent=exponent, acc_unmerged=100.0 * unmerged, curves=curves,
                      tables=tables)
