"""The token_merging experiment: one seed = train a digits ViT (or load a hub checkpoint), then merge
tokens training-free at every retention r with M1-M6 and measure accuracy, the radial / angular error
of the final cls token, the residual RMS drift; plus the isotropic study of the logit rule.

Plain functions (no Prefect, no MLflow); the lead's generic flow calls ``write_data`` and ``run_seed``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from tasks.common.io import save_state_dict
from tasks.common.results import Progress, SeedResult
from tasks.common.seeding import torch_init_seed
from tasks.token_merging import baselines, data, method
from tasks.token_merging.config import (
    DigitsDataConfig,
    IsotropicConfig,
    MergeSweepConfig,
    TokenMergingConfig,
    TrainConfig,
    ViTConfig,
)

# ------------------------------------------------------------------------------------------------
# The digits ViT
# ------------------------------------------------------------------------------------------------

def vit_shape(vit: ViTConfig, data_cfg: DigitsDataConfig) -> method.ViTShape:
    return method.ViTShape(image_size=data_cfg.image_size, patch_size=vit.patch_size, channels=1, dim=vit.dim,
                           depth=vit.depth, heads=vit.heads, mlp_dim=vit.dim * vit.mlp_ratio, n_classes=10)


def build_vit(vit: ViTConfig, data_cfg: DigitsDataConfig, seed: int) -> method.MergeViT:
    with torch_init_seed(seed):  # module init draws from torch's global generator
        return method.MergeViT(vit_shape(vit, data_cfg))


def train_vit(model: method.MergeViT, train: TrainConfig, images: torch.Tensor, labels: torch.Tensor, seed: int,
              progress: Progress | None = None) -> list[float]:
    """AdamW with a linear warm-up and cosine decay, +-shift augmentation; returns the per-epoch mean loss."""
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay)
    steps_per_epoch = math.ceil(len(labels) / train.batch_size)
    total = train.epochs * steps_per_epoch
    warmup = max(1, total // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda step: min(
        (step + 1) / warmup, 0.5 * (1 + math.cos(math.pi * min(1.0, step / total)))))
    model.train()
    losses = []
    for epoch in range(train.epochs):
        order = torch.randperm(len(labels), generator=generator)
        epoch_loss = 0.0
        for start in range(0, len(labels), train.batch_size):
            batch = order[start:start + train.batch_size]
            inputs = data.random_shift(images[batch], train.max_shift, generator)
            loss = F.cross_entropy(model(inputs), labels[batch])
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            optimiser.step()
            schedule.step()
            epoch_loss += float(loss.detach()) * len(batch)
        losses.append(epoch_loss / len(labels))
        if progress is not None:
            progress((epoch + 1) / train.epochs, f"seed {seed}: epoch {epoch + 1}/{train.epochs}, "
                                                 f"loss {losses[-1]:.3f}")
    model.eval()
    return losses


# ------------------------------------------------------------------------------------------------
# The merging sweep (C1-C5)
# ------------------------------------------------------------------------------------------------

@dataclass
class SweepPoint:
    """Aggregates of one (method, r) over the evaluation images."""

    method: str
    retention: float
    realised_retention: float
    accuracy: float
    radial: float
    angular: float
    total: float
    identity_error: float
    rms_ratio_last: float
    rms_ratio_per_block: list[float]
    mean_merged_kappa: float


def batched_forward(model: method.MergeViT, images: torch.Tensor, merge: method.MergeMethod, schedule: list[int],
                    batch_size: int) -> tuple[torch.Tensor, torch.Tensor, list[float], float, float]:
    """Logits, cls residuals, RMS per block (size-weighted energies pooled over batches), realised r, mean kappa."""
    logits, cls, kappas = [], [], []
    rms_sq = np.zeros(model.shape.depth)
    realised = 1.0
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            chunk = images[start:start + batch_size]
            out = model.forward_merged(chunk, merge, schedule)
            logits.append(out.logits)
            cls.append(out.cls_residual)
            rms_sq += np.square(out.rms_per_block) * len(chunk)
            realised = out.realised_retention
            if not math.isnan(out.mean_merged_kappa):
                kappas.append(out.mean_merged_kappa)
    return (torch.cat(logits), torch.cat(cls), np.sqrt(rms_sq / len(images)).tolist(), realised,
            float(np.mean(kappas)) if kappas else math.nan)


def choose_m4_exponent(model: method.MergeViT, calibration: torch.Tensor, sweep: MergeSweepConfig) -> tuple[
        float, dict[float, float]]:
    """M4's value exponent e: the candidate whose merged final cls residual matches the unmerged energy best,
    averaged over the merged retentions, on training images (never the test split)."""
    depth = model.shape.depth
    _, reference, _, _, _ = batched_forward(model, calibration, baselines.PLAIN_AVERAGE, [0] * depth,
                                            sweep.eval_batch_size)
    mismatch = {}
    for exponent in sweep.value_exponents:
        candidate = method.VALUE_CORRECTED.with_value_exp(exponent)
        values = []
        for r in sweep.retentions[1:]:
            schedule = method.merge_schedule(model.shape.n_patches, depth, r)
            _, cls, _, _, _ = batched_forward(model, calibration, candidate, schedule, sweep.eval_batch_size)
            values.append(method.energy_mismatch(reference, cls))
        mismatch[exponent] = float(np.mean(values))
    return method.choose_value_exponent(mismatch), mismatch


def merging_sweep(model: method.MergeViT, images: torch.Tensor, labels: torch.Tensor, calibration: torch.Tensor,
                  sweep: MergeSweepConfig, progress: Progress | None = None) -> tuple[list[SweepPoint], float, dict]:
    """Every method at every retention against the unmerged model on the same images."""
    depth = model.shape.depth
    exponent, mismatch = choose_m4_exponent(model, calibration, sweep)
    methods = [m.with_value_exp(exponent) if m.name == "M4" else m for m in baselines.ALL_METHODS]
    ref_logits, ref_cls, ref_rms, _, _ = batched_forward(model, images, baselines.PLAIN_AVERAGE, [0] * depth,
                                                         sweep.eval_batch_size)
    ref_cls = ref_cls.double()
    points = []
    jobs = [(m, r) for r in sweep.retentions for m in methods]
    for i, (merge, r) in enumerate(jobs):
        schedule = method.merge_schedule(model.shape.n_patches, depth, r)
        logits, cls, rms, realised, kappa = batched_forward(model, images, merge, schedule, sweep.eval_batch_size)
        total, radial, angular = method.radial_angular_decomposition(ref_cls, cls.double())
        scale = ref_cls.pow(2).sum(-1).mean()
        rms_ratio = [a / b for a, b in zip(rms, ref_rms)]
        points.append(SweepPoint(
            method=merge.name, retention=r, realised_retention=realised,
            accuracy=float((logits.argmax(-1) == labels).double().mean()),
            radial=float(radial.mean()), angular=float(angular.mean()), total=float(total.mean()),
            identity_error=float((total - radial - angular).abs().max() / scale),
            rms_ratio_last=rms_ratio[-1], rms_ratio_per_block=rms_ratio, mean_merged_kappa=kappa))
        if progress is not None and (i + 1) % len(methods) == 0:
            progress((i + 1) / len(jobs), f"merging sweep: r = {r:g} done")
    unmerged_agreement = float((ref_logits.argmax(-1) == labels).double().mean())
    return points, exponent, {"m4_energy_mismatch": mismatch, "acc_unmerged": unmerged_agreement}


def _point(points: Sequence[SweepPoint], name: str, r: float) -> SweepPoint:
    return next(p for p in points if p.method == name and p.retention == r)


def sweep_metrics(points: Sequence[SweepPoint], sweep: MergeSweepConfig) -> dict[str, float]:
    """Per-seed scalars for the claims (accuracies in percentage points)."""
    merged_rs = sweep.retentions[1:]
    aggressive = [r for r in sweep.retentions if r <= sweep.aggressive_retention]
    acc = {(p.method, p.retention): 100.0 * p.accuracy for p in points}
    gap = {r: acc["M3", r] - acc["M2", r] for r in sweep.retentions}
    smallest, mildest = sweep.retentions[-1], sweep.retentions[1]
    metrics = {
        "m3_minus_m2_acc_min": min(gap.values()),
        "m3_minus_m2_acc_aggressive_mean": float(np.mean([gap[r] for r in aggressive])),
        "m3_over_m2_angular_max_aggressive": max(_point(points, "M3", r).angular / _point(points, "M2", r).angular
                                                 for r in aggressive),
        "m5_minus_m3_acc_aggressive_mean": float(np.mean([acc["M5", r] - acc["M3", r] for r in aggressive])),
        "m6_minus_m2_acc_aggressive_mean": float(np.mean([acc["M6", r] - acc["M2", r] for r in aggressive])),
        "decomposition_identity_error": max(p.identity_error for p in points),
        "m2_acc_drop_mild": acc["M2", 1.0] - acc["M2", mildest],
        "m2_acc_drop_smallest_r": acc["M2", 1.0] - acc["M2", smallest],
        "m2_acc_drop_aggressive_mean": float(np.mean([acc["M2", 1.0] - acc["M2", r] for r in aggressive])),
        "m1_rms_shift_smallest_r": abs(1.0 - _point(points, "M1", smallest).rms_ratio_last),
        "m2_rms_shift_smallest_r": abs(1.0 - _point(points, "M2", smallest).rms_ratio_last),
        "m2_kappa_smallest_r": _point(points, "M2", smallest).mean_merged_kappa,
        "realised_retention_smallest_r": _point(points, "M2", smallest).realised_retention,
        "r1_max_method_acc_spread": max(acc[m.name, 1.0] for m in baselines.ALL_METHODS)
        - min(acc[m.name, 1.0] for m in baselines.ALL_METHODS),
    }
    for p in points:
        if p.retention in merged_rs or p.retention == 1.0:
            metrics[f"acc_{p.method}_r{p.retention:g}"] = 100.0 * p.accuracy
    return metrics


# ------------------------------------------------------------------------------------------------
# Acceptance check (a)5 as a per-seed measurement (C4, logit rule)
# ------------------------------------------------------------------------------------------------

def isotropic_metrics(iso: IsotropicConfig, seed: int) -> tuple[dict[str, float], list[dict]]:
    rows = []
    for r in iso.retentions:
        res = method.isotropic_cluster_mass_study(iso.dim, iso.n_tokens, r, iso.n_queries, seed=seed,
                                                  temperature=iso.temperature)
        rows.append({"retention": r, "optimal_scale": res.optimal_scale, "sqrt_r": math.sqrt(r),
                     "kl_optimal": res.kl_optimal, "kl_sqrt_r": res.kl_sqrt_r, "kl_prop": res.kl_prop,
                     "mean_kappa": res.mean_kappa})
    aggressive = [row for row in rows if row["retention"] <= 0.25] or rows
    return {
        "iso_scale_abs_error_max": max(abs(row["optimal_scale"] - row["sqrt_r"]) for row in rows),
        "iso_kl_ratio_sqrt_r_over_prop_max": max(row["kl_sqrt_r"] / row["kl_prop"] for row in aggressive),
    }, rows


# ------------------------------------------------------------------------------------------------
# One seed, end to end
# ------------------------------------------------------------------------------------------------

def sweep_tables(points: Sequence[SweepPoint]) -> list[dict]:
    return [{k: v for k, v in vars(p).items() if k != "rms_ratio_per_block"} for p in points]


def rms_table(points: Sequence[SweepPoint]) -> list[dict]:
    return [{"method": p.method, "retention": p.retention, "block": b, "rms_ratio": v}
            for p in points for b, v in enumerate(p.rms_ratio_per_block)]


def digits_model(cfg: TokenMergingConfig, seed: int, data_dir: Path, model_dir: Path, progress: Progress | None
                 ) -> tuple[method.MergeViT, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    frames = data.read_digits(cfg.data, data_dir)
    train_images, train_labels = data.digits_tensors(frames["train"], cfg.data.image_size)
    test_images, test_labels = data.digits_tensors(frames["test"], cfg.data.image_size)
    model = build_vit(cfg.vit, cfg.data, seed)
    losses = train_vit(model, cfg.train, train_images, train_labels, seed, progress)
    save_state_dict(model, model_dir / f"seed{seed}" / "vit.safetensors")
    calibration = train_images[:cfg.merge.calibration_size]
    return model, test_images, test_labels, calibration, {"train_loss": losses}


def hub_model(cfg: TokenMergingConfig, seed: int, data_dir: Path, device: str
              ) -> tuple[method.MergeViT, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Paper profile: a pretrained checkpoint; the first ``calibration_size`` images of the seed's subset
    calibrate M4, the rest are evaluated."""
    from datasets import load_from_disk

    hub = cfg.hub
    subset_dir = data.hub_subset_dir(data_dir, seed)
    if not subset_dir.is_dir():
        raise FileNotFoundError(f"token_merging.hub: {subset_dir} is missing; run the data phase first")
    subset = load_from_disk(str(subset_dir))
    if len(subset) != hub.n_images:
        raise ValueError(f"token_merging.hub.n_images: {subset_dir} holds {len(subset)} images, config says "
                         f"{hub.n_images}; rerun the data phase")
    if hub.n_images <= cfg.merge.calibration_size:
        raise ValueError(f"token_merging.hub.n_images ({hub.n_images}) must exceed merge.calibration_size "
                         f"({cfg.merge.calibration_size})")
    hf_model, processor = data.load_hub_vit(hub.model, hub.dtype)
    dtype = getattr(torch, hub.dtype)
    pixels, labels = zip(*data.hub_batches(subset, processor, hub.batch_size, dtype))
    images, labels = torch.cat(pixels).to(device), torch.cat(labels).to(device)
    model = method.vit_from_hf(hf_model).to(device)
    n_cal = cfg.merge.calibration_size
    return model, images[n_cal:], labels[n_cal:], images[:n_cal], {}


def run_seed(cfg: TokenMergingConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress | None = None) -> SeedResult:
    """Train (or load) the model once, then every measurement of one seed."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    # The model step reads and validates the data first, so bad data fails before any compute.
    if cfg.hub is not None:
        model, images, labels, calibration, curves = hub_model(cfg, seed, data_dir, device)
    else:
        model, images, labels, calibration, curves = digits_model(cfg, seed, Path(data_dir), Path(model_dir),
                                                                  progress)
    timings["model"] = time.perf_counter() - start
    iso_metrics, iso_rows = isotropic_metrics(cfg.isotropic, seed)
    timings["isotropic"] = time.perf_counter() - start - sum(timings.values())
    points, exponent, extra = merging_sweep(model, images, labels, calibration, cfg.merge, progress)
    timings["sweep"] = time.perf_counter() - start - sum(timings.values())
    metrics = iso_metrics | sweep_metrics(points, cfg.merge) | {"m4_value_exponent": exponent,
                                                                "acc_unmerged": 100.0 * extra["acc_unmerged"]}
    metrics |= {f"seconds_{k}": v for k, v in timings.items()}
    curves = curves | {f"acc_{m.name}": [100.0 * _point(points, m.name, r).accuracy for r in cfg.merge.retentions]
                       for m in baselines.ALL_METHODS}
    tables = {"sweep": sweep_tables(points), "rms_per_block": rms_table(points), "isotropic": iso_rows,
              "m4_energy_mismatch": [{"value_exponent": e, "mismatch": v}
                                     for e, v in extra["m4_energy_mismatch"].items()]}
    return {"seed": seed, "metrics": {k: float(v) for k, v in metrics.items()}, "curves": curves, "tables": tables}


def write_data(cfg: TokenMergingConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase. Digits: one fixed split shared by every seed. Paper: each seed's validation subset."""
    data_dir = Path(data_dir)
    if cfg.hub is None:
        return data.write_digits(cfg.data, data_dir)
    return [data.save_dataset(data.load_validation_subset(cfg.hub.dataset, cfg.hub.split, cfg.hub.n_images, seed),
                              data.hub_subset_dir(data_dir, seed)) for seed in seeds]
