"""Every claim's number of certificate_pruning, derived from the measurements of ``evaluate.py`` only
(CGP's per-step curves, the per-function run summary ``benchmarks``, the final regrets and the tables
of the negative control and CGP-TR).

Rates come with their counts (``*_runs`` trials and the successes), which the claims pool over seeds
for a Clopper-Pearson interval; one run per (function, method) per seed, plus the repeated Needle-2D
runs of CGP (C1) and C7's zero-radius control run per function. A rate whose
trials are 0 on a seed is NaN (the claims read the counts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from tasks.certificate_pruning.config import CertificatePruningConfig
from tasks.certificate_pruning.runs import covered_throughout
from tasks.common.results import SeedResult

# The project's numbers (README, "What is measured"):
PRUNED_VOLUME = 0.5  # a run "pruned" when Vol(A_T) <= this: C1 / C3a count coverage over such runs (not vacuous)
INFORMATIVE_GAP = 1.0  # eps_T below the range of the rescaled objective (g(x*) = 1, g >= about 0): reported
MIN_WINDOW_FRACTION = 0.5  # C3a's precondition: the window from the last doubling spans >= this share of T
TIGHT_PRUNED_VOLUME = 0.05  # the tight test bed "prunes" a run when Vol(A_T) <= this (the brief's C2 threshold)
REGRET_FLOOR = 1e-9  # a true regret of exactly 0 in the tightness ratio eps_T^+ / r_T


def claim_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    metrics = (coverage_metrics(cfg, result) | gap_metrics(cfg, result) | volume_metrics(cfg, result)
               | adaptive_metrics(cfg, result) | comparison_metrics(cfg, result)
               | zero_radius_metrics(result.tables["zero_radius_runs"])
               | conditional_coverage_metrics(cfg, result) | gap_control_metrics(cfg, result))
    if cfg.hybrid is not None:
        metrics |= hybrid_metrics(cfg, result)
    if cfg.trust_region is not None:
        metrics |= trust_region_metrics(result.tables["trust_region"])
    if cfg.tight is not None:
        metrics |= tight_metrics(result.tables["tight_runs"], result.tables["tight_zero_radius_runs"])
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
    """x* never pruned by CGP with the known L over the synthetic functions (one run each), and how many
    runs pruned (Vol(A_T) <= PRUNED_VOLUME); reported. C1 is decided over the runs that pruned
    (``conditional_coverage_metrics``): with nothing pruned, coverage is near-vacuous (x* is the last point a
    valid envelope prunes)."""
    synthetic = synthetic_functions(cfg)
    covered = sum(covered_throughout(result.curves[f"margin_{f}"]) for f in synthetic)
    pruned = sum(result.curves[f"volume_{f}"][-1] <= PRUNED_VOLUME for f in synthetic)
    return {"c1_covered_runs": float(covered), "c1_runs": float(len(synthetic)),
            "c1_coverage_rate": covered / len(synthetic),
            "c1_pruned_runs": float(pruned), "c1_pruned_rate": pruned / len(synthetic)}


def gap_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    """C7: eps_t bounds the true regret of x_hat_t. The trial is a run (the bound holds at every step, the
    anytime event of the theorem); steps of one run are not independent trials, and the per-step fraction
    is reported as well, and the runs with eps_T below the range of the rescaled objective (reported; C7's
    precondition is its negative control, ``gap_control_metrics``)."""
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
    """C3: CGP-Adaptive, eventual coverage from its last doubling on (one run per synthetic function) and
    the runs that pruned (reported; C3a is decided over the runs that pruned, ``conditional_coverage_metrics``),
    and the doublings beyond ceil(log2(L / L_hat_0))."""
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


def rate(successes: int, trials: int) -> float:
    return successes / trials if trials else math.nan


def conditional_counts(covered: Sequence[bool], pruned: Sequence[bool]) -> tuple[int, int]:
    """(successes, trials) of coverage over the runs where the certificate pruned: a run is a trial when
    its final Vol(A_T) <= PRUNED_VOLUME or x* was pruned (a miss is never dropped), and a success when it
    pruned and x* was never pruned. Only covered runs are dropped, so the rate is <= the unconditioned one."""
    trials = sum(p or not c for c, p in zip(covered, pruned, strict=True))
    successes = sum(p and c for c, p in zip(covered, pruned, strict=True))
    return successes, trials


def coverage_window(margins: Sequence[float], doubling_steps: Sequence[int]) -> int:
    """Steps checked by CGP-Adaptive's eventual coverage: from the last doubling (included) to T; T
    without a doubling."""
    return len(margins) - (doubling_steps[-1] if doubling_steps else 1) + 1


def conditional_coverage_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    """C1 and C3a over the runs that pruned (``conditional_counts``): C1 over CGP's runs on the synthetic
    functions and the repeated Needle-2D runs, C3a over CGP-Adaptive's runs on the synthetic functions.
    C3a's precondition counts the counted runs whose eventual-coverage window spans >= MIN_WINDOW_FRACTION
    of T; the window's length is reported (shortest in steps, median share of T, over every CGP-Adaptive
    run of the seed)."""
    synthetic, curves, rows = synthetic_functions(cfg), result.curves, summaries(result)
    repeated = result.tables["repeated_needle_runs"]
    covered = [covered_throughout(curves[f"margin_{f}"]) for f in synthetic]
    covered += [covered_throughout(r["margin"]) for r in repeated]
    pruned = [curves[f"volume_{f}"][-1] <= PRUNED_VOLUME for f in synthetic]
    pruned += [r["final_volume"] <= PRUNED_VOLUME for r in repeated]
    c1_k, c1_n = conditional_counts(covered, pruned)
    margins = [curves[f"adaptive_margin_{f}"] for f in synthetic]
    doublings = [rows[f]["adaptive_doubling_steps"] for f in synthetic]
    adaptive_covered = [eventual_coverage(m, d) for m, d in zip(margins, doublings, strict=True)]
    adaptive_pruned = [curves[f"adaptive_volume_{f}"][-1] <= PRUNED_VOLUME for f in synthetic]
    windows = [coverage_window(m, d) for m, d in zip(margins, doublings, strict=True)]
    shares = [w / len(m) for w, m in zip(windows, margins, strict=True)]
    c3_k, c3_n = conditional_counts(adaptive_covered, adaptive_pruned)
    long_window = sum(share >= MIN_WINDOW_FRACTION
                      for share, c, p in zip(shares, adaptive_covered, adaptive_pruned, strict=True) if p or not c)
    return {"c1_conditional_covered_runs": float(c1_k), "c1_conditional_runs": float(c1_n),
            "c1_conditional_coverage_rate": rate(c1_k, c1_n),
            "c1_repeated_runs": float(len(repeated)),
            "c1_repeated_pruned_runs": float(sum(r["final_volume"] <= PRUNED_VOLUME for r in repeated)),
            "c3_adaptive_conditional_covered_runs": float(c3_k), "c3_adaptive_conditional_runs": float(c3_n),
            "c3_adaptive_conditional_coverage": rate(c3_k, c3_n),
            "c3_adaptive_long_window_runs": float(long_window),
            "c3_adaptive_long_window_rate": rate(long_window, c3_n),
            "c3_adaptive_min_window": float(min(windows)),
            "c3_adaptive_median_window_share": float(np.median(shares))}


def gap_control_metrics(cfg: CertificatePruningConfig, result: SeedResult) -> dict[str, float]:
    """C7's negative control: runs (one per function) where eps_t of CGP with c_i = 0 fell below the true
    regret of its own recommendation at some step (the test bed can catch a gap proxy that is too small)."""
    curves = result.curves
    violated = sum(bool(np.any(np.asarray(curves[f"zero_radius_gap_{f}"])
                               < np.asarray(curves[f"zero_radius_regret_{f}"]) - 1e-12)) for f in cfg.functions)
    n = len(cfg.functions)
    return {"c7_zero_radius_violated_runs": float(violated), "c7_zero_radius_runs": float(n),
            "c7_zero_radius_violation_rate": violated / n}


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


def tight_metrics(rows: list[dict[str, Any]], controls: list[dict[str, Any]]) -> dict[str, float]:
    """The tight test bed's claims (C1t, C7t, C7c, C9a, C9b, C9c), their preconditions and the reported
    tightness numbers, from the per-run rows of ``runs.tight_run_row`` (CGP) and ``controls`` (c_i = 0).

    Counts are per run (each run a fresh needle). Tightness is log10(eps_T^+ / r_T) per run, its median
    over the seed's runs (r_T floored at REGRET_FLOOR), and the same at the eps_t^+ stopping time over the
    stopped runs. A run is pruned when its final near-set fraction is <= TIGHT_PRUNED_VOLUME.
    A "false stop" is a run whose stopping rule fired while the true regret there exceeded the target."""
    n, n_control = len(rows), len(controls)
    # "Pruned" on the near-set fraction, an upper bound on the continuous volume (the active pool fraction
    # reads 0 once the pool empties, whatever the continuous A_T).
    pruned = sum(r["final_near_fraction"] <= TIGHT_PRUNED_VOLUME for r in rows)
    stopped = [r for r in rows if r["covered_stop_time"] is not None]
    pool_stopped = [r for r in rows if r["pool_stop_time"] is not None]
    final_plus = [math.inf if r["final_covered_gap"] is None else r["final_covered_gap"] for r in rows]  # None: +inf
    ratios = [math.log10(plus / max(r["final_regret"], REGRET_FLOOR)) for plus, r in zip(final_plus, rows)]
    stop_ratios = [math.log10(r["covered_stop_gap"] / max(r["covered_stop_regret"], REGRET_FLOOR)) for r in stopped]
    counts = {
        "c1t_covered_runs": sum(r["covered"] for r in rows), "c1t_runs": n,
        "c1t_pruned_runs": pruned,
        "c1t_zero_radius_failures": sum(not r["covered"] for r in controls), "c1t_zero_radius_runs": n_control,
        "c7t_pool_bounded_runs": sum(r["pool_gap_bounded"] for r in rows),
        "c7t_pool_violated_runs": sum(not r["pool_gap_bounded"] for r in rows),
        "c7t_covered_bounded_runs": sum(r["covered_gap_bounded"] for r in rows),
        "c7t_zero_radius_violated_runs": sum(not r["covered_gap_bounded"] for r in controls),
        "c9b_stopped_runs": len(stopped),
        "c9c_stopped_runs": sum(r["half_target_stop_time"] is not None for r in rows),
        "tight_valid_stops": sum(r["covered_stop_regret"] <= r["stop_gap"] for r in stopped),
        "tight_pool_stopped_runs": len(pool_stopped),
        "tight_pool_false_stops": sum(r["pool_stop_regret"] > r["stop_gap"] for r in pool_stopped),
        "tight_empty_pool_runs": sum(r["first_empty_step"] is not None for r in rows),
    }
    metrics = {k: float(v) for k, v in counts.items()}
    metrics |= {
        "c1t_coverage_rate": rate(counts["c1t_covered_runs"], n), "c1t_pruned_rate": rate(pruned, n),
        "c1t_zero_radius_failure_rate": rate(counts["c1t_zero_radius_failures"], n_control),
        "c7t_pool_bounded_rate": rate(counts["c7t_pool_bounded_runs"], n),
        "c7t_pool_violation_rate": rate(counts["c7t_pool_violated_runs"], n),
        "c7t_covered_bounded_rate": rate(counts["c7t_covered_bounded_runs"], n),
        "c7t_zero_radius_violation_rate": rate(counts["c7t_zero_radius_violated_runs"], n_control),
        "c9a_log10_tightness": float(np.median(ratios)),
        "tight_log10_tightness_at_stop": float(np.median(stop_ratios)) if stop_ratios else math.nan,
        "c9b_stopped_rate": rate(len(stopped), n),
        "c9c_stopped_rate": rate(counts["c9c_stopped_runs"], n),
        "tight_valid_stop_rate": rate(counts["tight_valid_stops"], len(stopped)),
        "tight_pool_false_stop_rate": rate(counts["tight_pool_false_stops"], len(pool_stopped)),
        "tight_median_stop_time": float(np.median([r["covered_stop_time"] for r in stopped])) if stopped else math.nan,
        "tight_median_final_volume": float(np.median([r["final_volume"] for r in rows])),
        "tight_median_final_near_fraction": float(np.median([r["final_near_fraction"] for r in rows])),
        "tight_median_final_covered_gap": float(np.median(final_plus)),
        "tight_median_final_regret": float(np.median([r["final_regret"] for r in rows])),
    }
    return metrics
