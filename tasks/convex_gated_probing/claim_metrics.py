"""Every claim's number of convex_gated_probing, derived from the measurements only (costs seconds to change).

Claims read gate_lp_spearman, lp_max_gradient and middle_layer_lp_gain (its layer chosen on a validation split in
evaluate.py) straight from the evaluation's metrics."""

from __future__ import annotations

from tasks.common.results import SeedResult
from tasks.convex_gated_probing.config import ConvexGatedProbingConfig
from tasks.convex_gated_probing.method import gap_closure


def claim_metrics(cfg: ConvexGatedProbingConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    return {
        "cgp_minus_lp": m["cgp_map"] - m["lp_map"],
        "cgp_minus_lp_mean": m["cgp_map"] - m["lp_mean_map"],
        "gap_closure": gap_closure(m["cgp_map"], m["lp_map"], m["finetune_map"]),
        "ft_minus_lp": m["finetune_map"] - m["lp_map"],
        "cgp_minus_protobin": m["cgp_map"] - m["protobin_map"],
        "cgp_minus_lcgp": m["cgp_map"] - m["lcgp_map"],
        "cgp_minus_head2toe": m["cgp_map"] - m["head2toe_map"],
        "gate_gain": m["cgp_map"] - m["cgp_frozen_last_gate_map"],
        "planted_margin": m["planted_cgp_map"] - m["planted_lp_map"],
        "planted_frozen_gate_margin": m["planted_frozen_gate_map"] - m["planted_lp_map"],
        "planted_pass_rate": m["planted_passed_count"] / m["planted_trials"],
        "ft_loss_below_prior": m["prior_entropy"] - m["ft_train_loss"],
        "ft_above_chance": m["finetune_map"] - m["chance_map"],
        "lcgp_above_chance": m["lcgp_map"] - m["chance_map"],
        "max_feature_cosine_to_mean": max(m["max_cls_cosine_to_mean"], m["max_patch_cosine_to_mean"]),
    }
