"""Evaluation step of certificate_pruning: every optimiser run of one seed (black-box optimisation:
nothing is trained, the runs are the measurement). Returns the raw traces, final regrets and tables;
every claim's number is derived from them in ``claim_metrics.py``.

Order of the work (each run draws from its own seeded streams, ``runs.stream_seed``, so adding a
stage changes no other number): the main comparison method by method over every function, the
zero-radius negative control on Needle-2D, the repeated Needle-2D runs of CGP (C1), C7's zero-radius
control on every function, the tight test bed (when configured: CGP runs and their zero-radius control),
then CGP-TR against random search (when configured).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tasks.certificate_pruning.config import CertificatePruningConfig
from tasks.certificate_pruning.data import Benchmark, load_benchmarks
from tasks.certificate_pruning.runs import (
    budget_for,
    checkpoints,
    method_runners,
    repeated_needle_runs,
    run_zero_radius_cgp,
    tight_runs,
    trust_region_rows,
    zero_radius_runs,
)
from tasks.common.results import Progress, SeedResult, no_progress

FIGURE_POOL_POINTS = 1024

Runs = dict[str, dict[str, Any]]  # function -> its run record (every method's trace or regrets)


def evaluate(cfg: CertificatePruningConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    """Every measurement of one seed. ``model_dir`` holds nothing (no training); ``device`` is unused
    (numpy/scikit-learn on CPU). Each method, the negative control, the repeated Needle-2D runs, C7's
    control and CGP-TR are timed as a stage."""
    benches = load_benchmarks(cfg, seed, data_dir)
    result = SeedResult(seed)
    runs = run_main_comparison(cfg, benches, seed, result, progress)
    with result.stage("negative_control"):
        result.add(tables={"zero_radius_runs": zero_radius_runs(cfg, benches["needle2d"], seed)})
    with result.stage("repeated_needle_runs"):
        result.add(tables={"repeated_needle_runs": repeated_needle_runs(cfg, benches["needle2d"], seed)})
    with result.stage("zero_radius_gap_control"):
        result.add(curves=zero_radius_gap_curves(cfg, benches, seed))
    if cfg.tight is not None:
        with result.stage("tight"):
            result.add(**tight_test_bed(cfg, seed))
    if cfg.trust_region is not None:
        with result.stage("cgp_tr"):
            result.add(tables={"trust_region": trust_region_rows(cfg, benches, seed)})
    progress(1.0, f"seed {seed}: done")
    return result.add(final_regrets(cfg, runs, benches), curves=trace_curves(cfg, runs),
                      tables=run_tables(cfg, runs, benches))


def run_main_comparison(cfg: CertificatePruningConfig, benches: dict[str, Benchmark], seed: int,
                        result: SeedResult, progress: Progress) -> Runs:
    """Every method on every function of ``cfg.functions``, one stage ``seconds_<method>`` per method."""
    runs: Runs = {}
    for f in cfg.functions:
        budget = budget_for(cfg, benches[f].dim)
        runs[f] = {"budget": budget, "record_at": checkpoints(budget)}
    runners = method_runners(cfg)
    for i, (name, runner) in enumerate(runners.items()):
        with result.stage(name):
            for k, f in enumerate(cfg.functions):
                runs[f] |= runner(cfg, benches[f], seed, k)
        progress((i + 1) / (len(runners) + 1), f"seed {seed}: {name} done on {len(cfg.functions)} functions")
    return runs


def tight_test_bed(cfg: CertificatePruningConfig, seed: int) -> dict[str, Any]:
    """The tight test bed's run tables (``runs.tight_runs``: CGP and its zero-radius control) and, as
    curves, eps_t, eps_t^+, the true regret and Vol(A_t) of its first CGP run (for the figure)."""
    rows, controls = tight_runs(cfg, seed), tight_runs(cfg, seed, zero_radius=True)
    first = rows[0].pop("curves")
    controls[0].pop("curves")
    return {"tables": {"tight_runs": rows, "tight_zero_radius_runs": controls},
            "curves": {f"tight_run0_{name}": values for name, values in first.items()}}


def final_regrets(cfg: CertificatePruningConfig, runs: Runs, benches: dict[str, Benchmark]) -> dict[str, float]:
    """Final simple regret of every method of the main comparison per function, and the offline L."""
    metrics: dict[str, float] = {}
    for f in cfg.functions:
        metrics[f"regret_{f}_cgp"] = runs[f]["cgp"].regret[-1]
        metrics[f"regret_{f}_cgp_adaptive"] = runs[f]["cgp_adaptive"].regret[-1]
        for m in cfg.baselines.methods:
            metrics[f"regret_{f}_{m}"] = runs[f][m][-1]
        metrics[f"lipschitz_{f}"] = benches[f].lipschitz
    return metrics


def zero_radius_gap_curves(cfg: CertificatePruningConfig, benches: dict[str, Benchmark], seed: int
                           ) -> dict[str, list[float]]:
    """C7's negative control, per function of the main comparison: eps_t of CGP with c_i = 0 and the true
    regret of its own recommendation, step by step."""
    curves: dict[str, list[float]] = {}
    for k, f in enumerate(cfg.functions):
        trace = run_zero_radius_cgp(cfg, benches[f], seed, k)
        curves |= {f"zero_radius_gap_{f}": trace.gap, f"zero_radius_regret_{f}": trace.regret}
    return curves


def trace_curves(cfg: CertificatePruningConfig, runs: Runs) -> dict[str, list[float]]:
    """Per function, step by step: CGP's Vol(A_t), un-intersected volume, eps_t, regret of x_hat_t and
    margin U_t(x*) - l_t; CGP-Adaptive's Vol(A_t) and margin."""
    curves: dict[str, list[float]] = {}
    for f in cfg.functions:
        trace, adaptive = runs[f]["cgp"], runs[f]["cgp_adaptive"]
        curves |= {f"volume_{f}": trace.volume, f"gap_{f}": trace.gap, f"regret_{f}_cgp": trace.regret,
                   f"margin_{f}": trace.margin, f"unintersected_volume_{f}": trace.raw_volume,
                   f"adaptive_volume_{f}": adaptive.volume, f"adaptive_margin_{f}": adaptive.margin}
    return curves


def run_tables(cfg: CertificatePruningConfig, runs: Runs, benches: dict[str, Benchmark]) -> dict[str, list[dict]]:
    """Regret curves of every method, the per-function run summary (``benchmarks``) and, on 2-D functions,
    the active-set snapshots and CGP's samples."""
    tables: dict[str, list[dict]] = {"regret_curves": regret_rows(cfg, runs),
                                     "benchmarks": [run_summary(cfg, f, runs[f], benches[f]) for f in cfg.functions]}
    for f in cfg.functions:
        if benches[f].dim == 2:
            tables[f"active_set_{f}"] = active_set_rows(runs[f])
            tables[f"samples_{f}"] = [{"x0": float(p[0]), "x1": float(p[1])} for p in runs[f]["cgp_samples"]]
    return tables


def run_summary(cfg: CertificatePruningConfig, f: str, run: dict[str, Any], bench: Benchmark) -> dict[str, Any]:
    row = {"function": f, "dim": bench.dim, "lipschitz": bench.lipschitz, "x_star": bench.x_star.tolist(),
           "budget": run["budget"], "covering_radius": run["covering_radius"], "stop_time": run["cgp"].stop_time,
           "adaptive_doublings": run["adaptive_doublings"],
           "adaptive_doubling_steps": run["adaptive_doubling_steps"],
           "adaptive_final_lipschitz": run["adaptive_final_lipschitz"]}
    if cfg.hybrid is not None:
        row |= {"hybrid_final_regret": run["cgp_hybrid"][-1], "hybrid_switched_at": run["hybrid_switched_at"]}
    return row


def regret_rows(cfg: CertificatePruningConfig, runs: Runs) -> list[dict]:
    rows = []
    for f in cfg.functions:
        run = runs[f]
        series = {"cgp": [run["cgp"].regret[t - 1] for t in run["record_at"]],
                  "cgp_adaptive": [run["cgp_adaptive"].regret[t - 1] for t in run["record_at"]]}
        series |= {m: run[m] for m in cfg.baselines.methods}
        if "cgp_hybrid" in run:
            series["cgp_hybrid"] = run["cgp_hybrid"]
        for m, values in series.items():
            rows += [{"function": f, "method": m, "t": t, "regret": float(v)} for t, v in zip(run["record_at"], values)]
    return rows


def active_set_rows(run: dict[str, Any]) -> list[dict]:
    """Pool points (first FIGURE_POOL_POINTS of the Sobol sequence) with their activity at the snapshots."""
    pool = run["cgp_pool"][:FIGURE_POOL_POINTS]
    snaps = run["cgp"].snapshots
    return [{"x0": float(p[0]), "x1": float(p[1]), **{f"active_t{t}": bool(mask[i]) for t, mask in snaps.items()}}
            for i, p in enumerate(pool)]
