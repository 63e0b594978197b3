"""Every claim's number of certificate_pruning, derived from the measurements of ``evaluate.py`` only
(CGP's per-step curves, the per-function run summary ``benchmarks``, the final regrets and the tables
of the negative control and CGP-TR).

Rates come with their counts (``*_runs`` trials and the successes), which the claims pool over seeds
for a Clopper-Pearson interval; one run per (function, method) per seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tasks.certificate_pruning.config import CertificatePruningConfig
from tasks.certificate_pruning.runs import covered_throughout
from tasks.common.results import SeedResult

PRUNED_VOLUME = 0.5  # a run "pruned" when Vol(A_T) <= this: C1 / C3a's precondition (coverage not vacuous)
INFORMATIVE_GAP = 1.0  # eps_T below the range of the rescaled objective (g(x*) = 1, g >= about 0): C7's precondition


def claim_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    metrics = (coverage_metrics(cfg, result) | gap_metrics(cfg, result) | volume_metrics(cfg, result)
               | adaptive_metrics(cfg, result) | comparison_metrics(cfg, result)
               | zero_radius_metrics(result.tables["zero_radius_runs"]))
    if cfg.hybrid is not None:
        metrics |= hybrid_metrics(cfg, result)
    if cfg.trust_region is not None:
        metrics |= trust_region_metrics(result.tables["trust_region"])
    return metrics


def synthetic_functions(cfg: CertificatePruningConfig) -> list[str]:
    return [f for f in cfg.functions if f != "svm"]


def summaries(result: SeedResult) -> dict[str, dict[str, Any]]:
    """The per-function run summary (the ``benchmarks`` table) by function."""
    return {row["function"]: row for row in result.tables["benchmarks"]}


def eventual_coverage(margins: Sequence[float], doubling_steps: Sequence[int]) -> bool:
    """CGP-Adaptive's eventual coverage: x* is never pruned from the last doubling of L_hat on.

    A doubling at step s happens inside ``tell`` of step s (``doubling_steps`` holds the sample count,
    which is t), which then resets A_t and prunes with the final L_hat, so the margin recorded at step s
    is already a post-doubling margin and is checked. Without a doubling the whole run is checked."""
    return covered_throughout(margins, doubling_steps[-1] if doubling_steps else 1)


def loglog_slope(volume: Sequence[float]) -> float:
    """Slope of log Vol(A_t) against log t from the first step with Vol < 1 (0 if it never shrinks)."""
    vol = np.asarray(volume)
    shrunk = np.flatnonzero(vol < 1.0)
    if shrunk.size < 3 or np.any(vol[shrunk[0]:] <= 0):
        return 0.0
    t = np.arange(1, len(vol) + 1)[shrunk[0]:]
    return float(np.polyfit(np.log(t), np.log(vol[shrunk[0]:]), 1)[0])


def coverage_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    """C1: x* never pruned by CGP with the known L (one trial per synthetic function), and its precondition:
    coverage says little when nothing is pruned (x* is the last point a valid envelope prunes)."""
    synthetic = synthetic_functions(cfg)
    covered = sum(covered_throughout(result.curves[f"margin_{f}"]) for f in synthetic)
    pruned = sum(result.curves[f"volume_{f}"][-1] <= PRUNED_VOLUME for f in synthetic)
    return {"c1_covered_runs": float(covered), "c1_runs": float(len(synthetic)),
            "c1_coverage_rate": covered / len(synthetic),
            "c1_pruned_runs": float(pruned), "c1_pruned_rate": pruned / len(synthetic)}


def gap_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    """C7: eps_t bounds the true regret of x_hat_t. The trial is a run (the bound holds at every step, the
    anytime event of the theorem); steps of one run are not independent trials, and the per-step fraction
    is reported as well. C7's precondition: a gap proxy >= the range of the rescaled objective bounds any
    regret (vacuous)."""
    functions, curves, rows = cfg.functions, result.curves, summaries(result)
    bounded = [bool(np.all(np.asarray(curves[f"gap_{f}"]) >= np.asarray(curves[f"regret_{f}_cgp"]) - 1e-12))
               for f in functions]
    informative = sum(bool(curves[f"gap_{f}"][-1] < INFORMATIVE_GAP) for f in functions)
    gaps = np.concatenate([curves[f"gap_{f}"] for f in functions])
    regrets = np.concatenate([curves[f"regret_{f}_cgp"] for f in functions])
    cover = np.concatenate([np.asarray(curves[f"gap_{f}"]) + rows[f]["lipschitz"] * rows[f]["covering_radius"]
                            for f in functions])
    stopped = [f for f in functions if rows[f]["stop_time"] is not None]
    return {"c7_bounded_runs": float(sum(bounded)), "c7_runs": float(len(functions)),
            "c7_bounded_rate": sum(bounded) / len(functions),
            "c7_informative_runs": float(informative), "c7_informative_rate": informative / len(functions),
            "c7_gap_bound_rate": float(np.mean(gaps >= regrets - 1e-12)),
            "c7_gap_plus_cover_bound_rate": float(np.mean(cover >= regrets - 1e-12)),
            "c7_stopped_fraction": len(stopped) / len(functions)}


def volume_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    """C2: Vol(A_t) cannot increase (A_t is intersected with A_{t-1}): the identity C2d reads the largest
    step-to-step increase of Vol(A_t) (0 when monotone). Reported besides: the un-intersected set
    {U_t >= l_t}, the fraction of steps where its volume rose (noise can lift U_t or lower l_t)."""
    curves = result.curves
    metrics = {"c2_volume_max_increase": float(max(
        np.max(np.diff(curves[f"volume_{f}"]), initial=0.0) for f in cfg.functions))}
    rises = np.concatenate([np.diff(curves[f"unintersected_volume_{f}"]) > 0 for f in cfg.functions])
    metrics["c2_unintersected_volume_rise_rate"] = float(np.mean(rises)) if rises.size else 0.0
    for f in ("needle2d", "branin", "svm"):
        if f in cfg.functions:
            metrics[f"c2_final_volume_{f}"] = curves[f"volume_{f}"][-1]
    metrics["c2_loglog_slope_needle2d"] = loglog_slope(curves["volume_needle2d"])
    return metrics


def adaptive_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    """C3: CGP-Adaptive, eventual coverage from its last doubling on (one trial per synthetic function),
    its pruning precondition, and the doublings beyond ceil(log2(L / L_hat_0))."""
    synthetic, curves, rows = synthetic_functions(cfg), result.curves, summaries(result)
    eventual = sum(eventual_coverage(curves[f"adaptive_margin_{f}"], rows[f]["adaptive_doubling_steps"])
                   for f in synthetic)
    pruned = sum(curves[f"adaptive_volume_{f}"][-1] <= PRUNED_VOLUME for f in synthetic)
    excess = [rows[f]["adaptive_doublings"]
              - max(0, math.ceil(math.log2(rows[f]["lipschitz"] / cfg.adaptive.initial_lipschitz)))
              for f in cfg.functions]
    return {"c3_adaptive_covered_runs": float(eventual), "c3_adaptive_runs": float(len(synthetic)),
            "c3_adaptive_eventual_coverage": eventual / len(synthetic),
            "c3_adaptive_pruned_runs": float(pruned), "c3_adaptive_pruned_rate": pruned / len(synthetic),
            "c3_adaptive_excess_doublings": float(max(excess)),
            "c3_adaptive_mean_doublings": float(np.mean([rows[f]["adaptive_doublings"] for f in cfg.functions]))}


def comparison_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    """C6: CGP's final simple regret against the baselines; one trial per function."""
    m = result.metrics
    local = [b for b in ("hoo", "zooming", "random") if b in cfg.baselines.methods]
    n = len(cfg.functions)
    metrics = {
        "c6_functions_cgp_beats_hoo_zooming_random": float(sum(
            m[f"regret_{f}_cgp"] <= min(m[f"regret_{f}_{b}"] for b in local) for f in cfg.functions)),
        "c6_functions_cgp_beats_all_baselines": float(sum(
            m[f"regret_{f}_cgp"] <= min(m[f"regret_{f}_{b}"] for b in cfg.baselines.methods) for f in cfg.functions)),
        "c6_n_functions": float(n)}
    for name in ("hoo_zooming_random", "all_baselines"):
        metrics[f"c6_win_rate_vs_{name}"] = metrics[f"c6_functions_cgp_beats_{name}"] / n
    return metrics


def hybrid_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    """C5: CGP-Hybrid's final regret against CGP's, one trial per function, and how often it switched."""
    rows = summaries(result)
    wins = sum(rows[f]["hybrid_final_regret"] <= result.metrics[f"regret_{f}_cgp"] for f in cfg.functions)
    return {"c5_hybrid_wins_vs_cgp": float(wins), "c5_hybrid_runs": float(len(cfg.functions)),
            "c5_hybrid_win_rate_vs_cgp": wins / len(cfg.functions),
            "c5_hybrid_switched_fraction": float(np.mean([rows[f]["hybrid_switched_at"] is not None
                                                          for f in cfg.functions]))}


def zero_radius_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """C1b and C1's precondition: Needle-2D runs where CGP with c_i = 0 pruned x*, the runs, their ratio."""
    failures = sum(not row["covered"] for row in rows)
    return {"c1_zero_radius_failures": float(failures), "c1_zero_radius_runs": float(len(rows)),
            "c1_zero_radius_failure_rate": failures / len(rows)}


def trust_region_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """C4: functions where CGP-TR's final simple regret <= random search's."""
    wins = sum(row["cgp_tr_regret"] <= row["random_regret"] for row in rows)
    return {"c4_tr_wins_vs_random": float(wins), "c4_tr_runs": float(len(rows)),
            "c4_tr_win_rate_vs_random": wins / len(rows)}
