"""Every claim's number of mive, derived from the measurements only (costs seconds to change). Per-variant
measurements (``hue_error_<variant>``, ``target_selection_<variant>``, ...) and ``vlm_caption_accuracy`` are
already metrics of the evaluation step; the claims read them directly."""

from __future__ import annotations

import math

from tasks.common.results import SeedResult
from tasks.mive.config import MiveConfig


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def claim_metrics(cfg: MiveConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    probes = {row["layer"]: row for row in result.tables["probes"]}
    first, last = probes[cfg.dit.first_layer], probes[max(probes)]
    out = {"feature_relative_std_min": min(row["relative_std"] for row in probes.values()),
           "hue_r2_first": first["hue_r2"], "hue_r2_last": last["hue_r2"],
           "hue_r2_drop": first["hue_r2"] - last["hue_r2"],
           "position_r2_drop": first["position_r2"] - last["position_r2"],
           "semantic_acc_first": first["semantic_accuracy"], "semantic_acc_last": last["semantic_accuracy"],
           "semantic_acc_gain": last["semantic_accuracy"] - first["semantic_accuracy"]}
    variants = cfg.dit.variants
    if "last_only" in variants:
        out["hue_error_ratio_vs_last_only"] = _ratio(m["hue_error_first_last"], m["hue_error_last_only"])
        out["target_selection_gain_vs_last_only"] = m["target_selection_first_last"] - m["target_selection_last_only"]
    if "first_only" in variants:
        out["hue_error_ratio_vs_first_only"] = _ratio(m["hue_error_first_last"], m["hue_error_first_only"])
        out["target_selection_gain_vs_first_only"] = (m["target_selection_first_last"]
                                                      - m["target_selection_first_only"])
    if "last_only" in variants and "first_only" in variants:
        # an absolute excess: with the x0-parameterised head every variant's unedited MSE is near 0 and a ratio
        # of two near-zero numbers is noise
        out["unedited_mse_excess_vs_best_single"] = (
            m["unedited_mse_first_last"] - min(m["unedited_mse_last_only"], m["unedited_mse_first_only"]))
    if "cross_attention" in variants:
        out["region_val_loss_ratio_vs_cross"] = _ratio(m["val_loss_region_first_last"],
                                                       m["val_loss_region_cross_attention"])
    if "decoupled" in variants:
        out["region_val_loss_ratio_vs_decoupled"] = _ratio(m["val_loss_region_first_last"],
                                                           m["val_loss_region_decoupled"])
    return out
