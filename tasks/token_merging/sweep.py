"""The measurements of token_merging (plain functions: no Prefect, no MLflow): the training-free merging
sweep, every method M1-M6 at every retention r against the unmerged model on the same images
(accuracy, radial / angular error of the final cls token, residual RMS drift), with M4's value exponent
chosen by energy matching on calibration images; and the isotropic study of the logit rule (acceptance
check (a)5, claims C4a-b)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tasks.common.results import Progress, no_progress
from tasks.token_merging import baselines, method
from tasks.token_merging.config import IsotropicConfig, MergeSweepConfig


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
    reference_energy: float  # mean ||y||^2 of the unmerged cls residuals: the scale of radial / angular / total


def batched_forward(model: method.MergeViT, images: torch.Tensor, merge: method.MergeMethod, schedule: list[int],
                    batch_size: int, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor, list[float], float,
                                                                   float]:
    """Logits, cls residuals, RMS per block (size-weighted energies pooled over batches), realised r, mean kappa;
    ``fused``: through the fused attention (``merge.fused_attention``)."""
    logits, cls, kappas = [], [], []
    rms_sq = np.zeros(model.shape.depth)
    realised = 1.0
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            chunk = images[start:start + batch_size]
            out = model.forward_merged(chunk, merge, schedule, fused)
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
    averaged over the merged retentions, on training images (never the evaluated images)."""
    depth = model.shape.depth
    _, reference, _, _, _ = batched_forward(model, calibration, baselines.PLAIN_AVERAGE, [0] * depth,
                                            sweep.eval_batch_size, sweep.fused_attention)
    mismatch = {}
    for exponent in sweep.value_exponents:
        candidate = method.VALUE_CORRECTED.with_value_exp(exponent)
        values = []
        for r in sweep.retentions[1:]:
            schedule = method.merge_schedule(model.shape.n_patches, depth, r)
            _, cls, _, _, _ = batched_forward(model, calibration, candidate, schedule, sweep.eval_batch_size,
                                              sweep.fused_attention)
            values.append(method.energy_mismatch(reference, cls))
        mismatch[exponent] = float(np.mean(values))
    return method.choose_value_exponent(mismatch), mismatch


def sweep_point(model: method.MergeViT, images: torch.Tensor, labels: torch.Tensor, merge: method.MergeMethod,
                r: float, reference: tuple[torch.Tensor, list[float]], batch_size: int, fused: bool = False
                ) -> SweepPoint:
    """One method at one retention against the unmerged cls residuals and RMS per block ``reference``."""
    ref_cls, ref_rms = reference
    schedule = method.merge_schedule(model.shape.n_patches, model.shape.depth, r)
    logits, cls, rms, realised, kappa = batched_forward(model, images, merge, schedule, batch_size, fused)
    total, radial, angular = method.radial_angular_decomposition(ref_cls, cls.double())
    scale = ref_cls.pow(2).sum(-1).mean()
    rms_ratio = [a / b for a, b in zip(rms, ref_rms)]
    return SweepPoint(
        method=merge.name, retention=r, realised_retention=realised,
        accuracy=float((logits.argmax(-1) == labels).double().mean()),
        radial=float(radial.mean()), angular=float(angular.mean()), total=float(total.mean()),
        identity_error=float((total - radial - angular).abs().max() / scale),
        rms_ratio_last=rms_ratio[-1], rms_ratio_per_block=rms_ratio, mean_merged_kappa=kappa,
        reference_energy=float(scale))


def merging_sweep(model: method.MergeViT, images: torch.Tensor, labels: torch.Tensor, calibration: torch.Tensor,
                  sweep: MergeSweepConfig, progress: Progress = no_progress
                  ) -> tuple[list[SweepPoint], float, dict[float, float], float]:
    """Every method at every retention against the unmerged model on the same images. Returns the points,
    M4's value exponent, the energy mismatch per candidate exponent and the unmerged model's accuracy."""
    exponent, mismatch = choose_m4_exponent(model, calibration, sweep)
    methods = [m.with_value_exp(exponent) if m.name == "M4" else m for m in baselines.ALL_METHODS]
    ref_logits, ref_cls, ref_rms, _, _ = batched_forward(model, images, baselines.PLAIN_AVERAGE,
                                                         [0] * model.shape.depth, sweep.eval_batch_size,
                                                         sweep.fused_attention)
    reference = (ref_cls.double(), ref_rms)
    points = []
    jobs = [(m, r) for r in sweep.retentions for m in methods]
    for i, (merge, r) in enumerate(jobs):
        points.append(sweep_point(model, images, labels, merge, r, reference, sweep.eval_batch_size,
                                  sweep.fused_attention))
        if (i + 1) % len(methods) == 0:
            progress((i + 1) / len(jobs), f"merging sweep: r = {r:g} done")
    unmerged_accuracy = float((ref_logits.argmax(-1) == labels).double().mean())
    return points, exponent, mismatch, unmerged_accuracy


def point(points: Sequence[SweepPoint], name: str, r: float) -> SweepPoint:
    return next(p for p in points if p.method == name and p.retention == r)


def sweep_rows(points: Sequence[SweepPoint]) -> list[dict]:
    return [{k: v for k, v in vars(p).items() if k != "rms_ratio_per_block"} for p in points]


def rms_rows(points: Sequence[SweepPoint]) -> list[dict]:
    return [{"method": p.method, "retention": p.retention, "block": b, "rms_ratio": v}
            for p in points for b, v in enumerate(p.rms_ratio_per_block)]


def isotropic_rows(iso: IsotropicConfig, seed: int) -> list[dict]:
    """Acceptance check (a)5 per seed: per retention the KL-optimal logit scale against sqrt(r), and the
    cluster-mass KL of the optimal scale, the sqrt(r) shrink and proportional attention."""
    rows = []
    for r in iso.retentions:
        res = method.isotropic_cluster_mass_study(iso.dim, iso.n_tokens, r, iso.n_queries, seed=seed,
                                                  temperature=iso.temperature)
        rows.append({"retention": r, "optimal_scale": res.optimal_scale, "sqrt_r": math.sqrt(r),
                     "kl_optimal": res.kl_optimal, "kl_sqrt_r": res.kl_sqrt_r, "kl_prop": res.kl_prop,
                     "mean_kappa": res.mean_kappa})
    return rows
