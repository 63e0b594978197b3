"""Every claim's number of token_merging, derived from the measurements of ``evaluate.py`` only (the
``sweep`` and ``isotropic`` tables): accuracy gaps and drops in percentage points, error ratios, M2's relative
angular error (C3b's regime precondition) and merged-cluster kappa, the decomposition identity's error, RMS
shifts, and the isotropic study's scale error and KL ratio."""

from __future__ import annotations

from typing import Any

import numpy as np

from tasks.common.results import SeedResult
from tasks.token_merging import baselines
from tasks.token_merging.config import MergeSweepConfig, TokenMergingConfig


def claim_metrics(cfg: TokenMergingConfig, result: SeedResult) -> dict[str, float]:
    return isotropic_metrics(result.tables["isotropic"]) | sweep_metrics(result.tables["sweep"], cfg.merge)


def isotropic_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """C4a: the largest distance of the KL-optimal logit scale from sqrt(r); C4b: the largest KL ratio of the
    sqrt(r) shrink over proportional attention at r <= 0.25 (every r if none is that small)."""
    aggressive = [row for row in rows if row["retention"] <= 0.25] or rows
    return {
        "iso_scale_abs_error_max": max(abs(row["optimal_scale"] - row["sqrt_r"]) for row in rows),
        "iso_kl_ratio_sqrt_r_over_prop_max": max(row["kl_sqrt_r"] / row["kl_prop"] for row in aggressive),
    }


def sweep_metrics(rows: list[dict[str, Any]], sweep: MergeSweepConfig) -> dict[str, float]:
    """Per-seed scalars of the claims from the sweep's rows (one per method and r; accuracies in percentage
    points). 'Aggressive' retentions are those <= ``sweep.aggressive_retention``."""
    aggressive = [r for r in sweep.retentions if r <= sweep.aggressive_retention]
    by_point = {(row["method"], row["retention"]): row for row in rows}
    acc = {key: 100.0 * row["accuracy"] for key, row in by_point.items()}
    gap = {r: acc["M3", r] - acc["M2", r] for r in sweep.retentions}
    smallest, mildest = sweep.retentions[-1], sweep.retentions[1]
    return {
        "m3_minus_m2_acc_min": min(gap.values()),
        "m3_minus_m2_acc_aggressive_mean": float(np.mean([gap[r] for r in aggressive])),
        "m3_over_m2_angular_max_aggressive": max(by_point["M3", r]["angular"] / by_point["M2", r]["angular"]
                                                 for r in aggressive),
        # C3b's regime: M2's angular cls error relative to the unmerged cls energy, smallest over r <= 0.25
        # (the M3 / M2 ratio means something only where M2's error is above float round-off)
        "m2_angular_relative_min_aggressive": min(by_point["M2", r]["angular"] / by_point["M2", r]["reference_energy"]
                                                  for r in aggressive),
        "m2_kappa_aggressive_mean": float(np.mean([by_point["M2", r]["mean_merged_kappa"] for r in aggressive])),
        "m5_minus_m3_acc_aggressive_mean": float(np.mean([acc["M5", r] - acc["M3", r] for r in aggressive])),
        "m6_minus_m2_acc_aggressive_mean": float(np.mean([acc["M6", r] - acc["M2", r] for r in aggressive])),
        "decomposition_identity_error": max(row["identity_error"] for row in rows),
        "m2_acc_drop_mild": acc["M2", 1.0] - acc["M2", mildest],
        "m2_acc_drop_smallest_r": acc["M2", 1.0] - acc["M2", smallest],
        "m2_acc_drop_aggressive_mean": float(np.mean([acc["M2", 1.0] - acc["M2", r] for r in aggressive])),
        "m1_rms_shift_smallest_r": abs(1.0 - by_point["M1", smallest]["rms_ratio_last"]),
        "m2_rms_shift_smallest_r": abs(1.0 - by_point["M2", smallest]["rms_ratio_last"]),
        "m2_rms_shift_mild": abs(1.0 - by_point["M2", mildest]["rms_ratio_last"]),
        # C1b: the covariate shift grows with compression (smallest r against the mildest merged r)
        "m2_rms_shift_growth": abs(1.0 - by_point["M2", smallest]["rms_ratio_last"])
        - abs(1.0 - by_point["M2", mildest]["rms_ratio_last"]),
        "m2_kappa_smallest_r": by_point["M2", smallest]["mean_merged_kappa"],
        "realised_retention_smallest_r": by_point["M2", smallest]["realised_retention"],
        "r1_max_method_acc_spread": max(acc[m.name, 1.0] for m in baselines.ALL_METHODS)
        - min(acc[m.name, 1.0] for m in baselines.ALL_METHODS),
    }
