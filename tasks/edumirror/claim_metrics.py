"""Every claim's number of edumirror that the evaluation does not already report, derived from the measurements
only (costs seconds to change). Claims also read evaluation metrics directly (ordering_margin, pg_spearman,
rater_kappa, surveyor_need_r, ...)."""

from __future__ import annotations

from tasks.common.results import SeedResult
from tasks.edumirror.config import EdumirrorConfig


def claim_metrics(cfg: EdumirrorConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    out = {"slope_healthy_minus_vulnerable": m["slope_healthy"] - m["slope_vulnerable"],
           "cooperative_minus_individual": m["delta_cooperative"] - m["delta_individual"],
           "individual_minus_punitive": m["delta_individual"] - m["delta_punitive"],
           "punitive_minus_neglect": m["delta_punitive"],
           "sweep_ordering_fraction": m["sweep_orderings_held"] / m["sweep_settings"],
           "integrity_rate": m["integrity_passed"] / m["integrity_checks"],
           "pg_increasing_pairs_rate": m["pg_increasing_pairs"] / m["pg_adjacent_pairs"],
           "cooperative_breadth_margin": m["cooperative_second_smallest_need_delta"]
           - max(m["individual_second_smallest_need_delta"], m["punitive_second_smallest_need_delta"]),
           "no_retaliation_risk_slope_healthy_minus_vulnerable":
               m["no_retaliation_risk_slope_healthy"] - m["no_retaliation_risk_slope_vulnerable"],
           "surveyor_need_r_minus_expected": m["surveyor_need_r"] - m["surveyor_need_r_expected"]}
    return out
