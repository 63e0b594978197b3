"""The certificate_pruning experiment: CGP, CGP-Adaptive and the baselines on every benchmark, one seed
at a time, with the per-seed claim metrics (plain functions: no Prefect, no MLflow).

Per seed and function: one run of every method on the same noisy function (each method its own noise
stream); CGP is traced at every step (regret of x_hat_t, Vol(A_t), eps_t, the margin U_t(x*) - l_t),
the baselines at ``checkpoints``. Seeds change the noise, the Sobol pools, the baselines' randomness
and the needle's position.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tasks.certificate_pruning import baselines, data, method
from tasks.certificate_pruning.config import CertificatePruningConfig
from tasks.common.io import read_json, write_json, write_parquet
from tasks.common.results import Progress, SeedResult

PRUNED_VOLUME = 0.5  # a run "pruned" when Vol(A_T) <= this: C1 / C3a's precondition (coverage not vacuous)
INFORMATIVE_GAP = 1.0  # eps_T below the range of the rescaled objective (g(x*) = 1, g >= about 0): C7's precondition
SNAPSHOT_FRACTIONS = (0.1, 0.4, 1.0)  # 2-D active-set pictures at these fractions of T
FIGURE_POOL_POINTS = 1024
COVER_PROBES = 4096


# ------------------------------------------------------------------------------------------------
# Data phase
# ------------------------------------------------------------------------------------------------


def data_signature(cfg: CertificatePruningConfig) -> dict[str, Any]:
    """The config keys the data phase depends on; run_seed refuses data written for other values."""
    return {
        "functions": all_functions(cfg),
        "needle_width": cfg.needle_width,
        "lipschitz_samples": cfg.lipschitz_samples,
        "lipschitz_safety": cfg.lipschitz_safety,
        "svm": cfg.svm.model_dump(mode="json") if cfg.svm is not None else None,
    }


def all_functions(cfg: CertificatePruningConfig) -> list[str]:
    extra = cfg.trust_region.functions if cfg.trust_region is not None else []
    return list(dict.fromkeys([*cfg.functions, *extra]))


def write_data(cfg: CertificatePruningConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Per seed: the benchmark table (rescaling constants, x*, offline L, needle centre); once: the SVM
    accuracy table (seed-independent) and a manifest of the data-relevant config."""
    data_dir = Path(data_dir)
    written = []
    svm_table = None
    if cfg.svm is not None:
        s = cfg.svm
        svm_table = data.svm_accuracy_table(s.grid_size, s.n_samples, s.folds, s.log10_c, s.log10_gamma)
        written.append(write_parquet(svm_table, data_dir / "svm_table.parquet"))
    for seed in seeds:
        rows = data.benchmark_rows(all_functions(cfg), seed, cfg.needle_width, cfg.lipschitz_samples,
                                   cfg.lipschitz_safety, svm_table)
        written.append(write_parquet(rows, data_dir / f"benchmarks_seed{seed}.parquet"))
    written.append(write_json(data_dir / "manifest.json", data_signature(cfg) | {"seeds": list(seeds)}))
    return written


def load_benchmarks(cfg: CertificatePruningConfig, seed: int, data_dir: Path) -> dict[str, data.Benchmark]:
    """Benchmarks of one seed, after checking that the data directory was written for this config."""
    data_dir = Path(data_dir)
    manifest_path = data_dir / "manifest.json"
    if not manifest_path.exists():
        raise FileNotFoundError(f"data_dir: {manifest_path} not found: run the data phase first")
    manifest = read_json(manifest_path)
    for key, expected in data_signature(cfg).items():
        if manifest.get(key) != expected:
            raise ValueError(f"certificate_pruning.{key}: the data in {data_dir} was written for "
                             f"{manifest.get(key)!r}, the config says {expected!r}: rerun the data phase")
    table_path = data_dir / f"benchmarks_seed{seed}.parquet"
    if not table_path.exists():
        raise FileNotFoundError(f"seeds: no data for seed {seed} in {data_dir}: rerun the data phase")
    svm_table = pl.read_parquet(data_dir / "svm_table.parquet") if cfg.svm is not None else None
    rows = pl.read_parquet(table_path).to_dicts()
    return {row["name"]: data.benchmark_from_row(row, svm_table) for row in rows}


# ------------------------------------------------------------------------------------------------
# Running and tracing one optimiser
# ------------------------------------------------------------------------------------------------


@dataclass
class CGPTrace:
    """Per-step record of a CGP run (t = 1..T)."""

    regret: list[float] = field(default_factory=list)
    volume: list[float] = field(default_factory=list)
    raw_volume: list[float] = field(default_factory=list)  # pool fraction with U_t >= l_t, not intersected
    gap: list[float] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)  # U_t(x*) - l_t; x* in A_t iff >= 0 since the last reset
    snapshots: dict[int, np.ndarray] = field(default_factory=dict)
    stop_time: int | None = None


def trace_cgp(optimizer: method.CertificateGuidedPruning, bench: data.Benchmark, noisy: Callable[[np.ndarray], float],
              budget: int, stop_gap: float, snapshot_steps: Sequence[int] = ()) -> CGPTrace:
    trace = CGPTrace()
    for t in range(1, budget + 1):
        x = optimizer.ask()
        optimizer.tell(x, noisy(x))
        trace.regret.append(bench.regret(optimizer.recommend()))
        trace.volume.append(optimizer.active_fraction)
        trace.raw_volume.append(optimizer.unintersected_fraction)
        trace.gap.append(optimizer.gap)
        trace.margin.append(float(optimizer.upper(bench.x_star)[0] - optimizer.lower))
        if t in snapshot_steps:
            trace.snapshots[t] = optimizer.active.copy()
        if trace.stop_time is None and optimizer.should_stop(stop_gap):
            trace.stop_time = t
    return trace


def covered_throughout(margins: Sequence[float], from_step: int = 1) -> bool:
    """x* stays in the monotone active set from step ``from_step`` on (1-based, inclusive) iff
    U_t(x*) >= l_t at every step t >= from_step. ``margins[t - 1]`` is the margin after step t, as
    ``trace_cgp`` records it; an empty range is an error, not vacuous coverage."""
    if not 1 <= from_step <= len(margins):
        raise ValueError(f"from_step must be in [1, {len(margins)}] (steps of the trace), got {from_step}")
    return bool(np.all(np.asarray(margins[from_step - 1:]) >= 0.0))


def eventual_coverage(margins: Sequence[float], doubling_steps: Sequence[int]) -> bool:
    """CGP-Adaptive's eventual coverage: x* is never pruned from the last doubling of L_hat on.

    A doubling at step s happens inside ``tell`` of step s (``doubling_steps`` holds the sample count,
    which is t), which then resets A_t and prunes with the final L_hat, so the margin recorded at step s
    is already a post-doubling margin and is checked. Without a doubling the whole run is checked."""
    return covered_throughout(margins, doubling_steps[-1] if doubling_steps else 1)


def checkpoints(budget: int, count: int = 50) -> list[int]:
    return sorted({max(1, round(budget * k / count)) for k in range(1, count + 1)})


def trace_ask_tell(optimizer: Any, bench: data.Benchmark, noisy: Callable[[np.ndarray], float], budget: int,
                   record_at: Sequence[int]) -> list[float]:
    """Regret of ``optimizer.recommend()`` at the steps ``record_at``."""
    record = set(record_at)
    regrets = []
    for t in range(1, budget + 1):
        x = optimizer.ask()
        optimizer.tell(x, noisy(x))
        if t in record:
            regrets.append(bench.regret(optimizer.recommend()))
    return regrets


def baseline_regrets(name: str, cfg: CertificatePruningConfig, bench: data.Benchmark, budget: int, seed: int,
                     noisy: Callable[[np.ndarray], float], record_at: Sequence[int]) -> list[float]:
    b = cfg.baselines
    if name == "direct":
        history = baselines.run_direct(noisy, bench.dim, budget)
        return [bench.regret(history[t - 1]) for t in record_at]
    optimizer = {
        "hoo": lambda: baselines.HOO(bench.dim, bench.lipschitz, cfg.noise_sd, seed),
        "zooming": lambda: baselines.Zooming(bench.dim, bench.lipschitz, cfg.noise_sd, budget, seed,
                                             cfg.certificate.pool_size, cfg.certificate.delta),
        "gp_ucb": lambda: baselines.GPUCB(bench.dim, cfg.noise_sd, seed, cfg.certificate.pool_size, b.gp_candidates,
                                          b.gp_refit_growth, b.gp_initial_points, cfg.certificate.delta),
        "random": lambda: baselines.RandomSearch(bench.dim, seed),
    }[name]()
    return trace_ask_tell(optimizer, bench, noisy, budget, record_at)


def cgp_settings(cfg: CertificatePruningConfig, lipschitz: float, noise_sd: float | None = None,
                 radius_scale: float = 1.0) -> method.CGPSettings:
    c = cfg.certificate
    return method.CGPSettings(lipschitz, cfg.noise_sd if noise_sd is None else noise_sd, c.delta, c.pool_size,
                              c.perturb_centres, c.perturb_per_centre, c.perturb_scale, radius_scale)


def budget_for(cfg: CertificatePruningConfig, dim: int) -> int:
    return cfg.budget.low_dim if dim <= 3 else cfg.budget.high_dim


def stream_seed(seed: int, *parts: int) -> int:
    """A 32-bit seed for one (run seed, function, method) stream."""
    return int(np.random.SeedSequence([seed, *parts]).generate_state(1)[0])


# ------------------------------------------------------------------------------------------------
# One function: every method
# ------------------------------------------------------------------------------------------------

METHOD_IDS = {"cgp": 0, "cgp_adaptive": 1, "hoo": 2, "zooming": 3, "direct": 4, "gp_ucb": 5, "random": 6,
              "cgp_hybrid": 7}


def run_function(cfg: CertificatePruningConfig, bench: data.Benchmark, seed: int, fn_index: int) -> dict[str, Any]:
    budget = budget_for(cfg, bench.dim)
    record_at = checkpoints(budget)
    snapshot_steps = sorted({max(1, round(f * budget)) for f in SNAPSHOT_FRACTIONS}) if bench.dim == 2 else []

    def noisy_for(name: str) -> Callable[[np.ndarray], float]:
        return bench.noisy(cfg.noise_sd, np.random.default_rng(stream_seed(seed, fn_index, METHOD_IDS[name], 1)))

    def opt_seed(name: str) -> int:
        return stream_seed(seed, fn_index, METHOD_IDS[name], 2)

    out: dict[str, Any] = {"budget": budget, "record_at": record_at, "seconds": {}}
    start = time.perf_counter()
    cgp = method.CertificateGuidedPruning(bench.dim, cgp_settings(cfg, bench.lipschitz), opt_seed("cgp"))
    out["cgp"] = trace_cgp(cgp, bench, noisy_for("cgp"), budget, cfg.certificate.stop_gap, snapshot_steps)
    out["cgp_pool"] = cgp.pool
    out["cgp_samples"] = cgp.samples.points.copy()
    out["covering_radius"] = method.covering_radius_estimate(cgp.pool, COVER_PROBES, opt_seed("cgp"))
    out["seconds"]["cgp"] = time.perf_counter() - start

    start = time.perf_counter()
    adaptive = method.AdaptiveCGP(bench.dim, cgp_settings(cfg, bench.lipschitz), opt_seed("cgp_adaptive"),
                                  cfg.adaptive.initial_lipschitz)
    out["cgp_adaptive"] = trace_cgp(adaptive, bench, noisy_for("cgp_adaptive"), budget, cfg.certificate.stop_gap)
    out["adaptive_doublings"] = adaptive.doublings
    out["adaptive_doubling_steps"] = list(adaptive.doubling_steps)
    out["adaptive_final_lipschitz"] = adaptive.lipschitz
    out["seconds"]["cgp_adaptive"] = time.perf_counter() - start

    out["baselines"] = {}
    for name in cfg.baselines.methods:
        start = time.perf_counter()
        out["baselines"][name] = baseline_regrets(name, cfg, bench, budget, opt_seed(name), noisy_for(name),
                                                  record_at)
        out["seconds"][name] = time.perf_counter() - start

    if cfg.hybrid is not None:
        start = time.perf_counter()
        b = cfg.baselines
        hybrid = method.HybridCGP(bench.dim, cgp_settings(cfg, bench.lipschitz), opt_seed("cgp_hybrid"),
                                  cfg.hybrid.local_radius, check_every=cfg.hybrid.check_every,
                                  gp_refit_every=10, gp_candidates=b.gp_candidates)
        out["cgp_hybrid"] = trace_ask_tell(hybrid, bench, noisy_for("cgp_hybrid"), budget, record_at)
        out["hybrid_switched_at"] = hybrid.switched_at
        out["seconds"]["cgp_hybrid"] = time.perf_counter() - start
    return out


# ------------------------------------------------------------------------------------------------
# Negative control (acceptance check a4) and CGP-TR (claim C4)
# ------------------------------------------------------------------------------------------------


def zero_radius_failures(cfg: CertificatePruningConfig, needle: data.Benchmark, seed: int) -> dict[str, float]:
    """Needle-2D runs where CGP with c_i = 0 (at the control's higher noise) prunes x*: the count of
    failures and of runs (claim C1b and C1's precondition, pooled over seeds), and their ratio."""
    nc = cfg.negative_control
    failures = 0
    for run in range(nc.runs):
        settings = cgp_settings(cfg, needle.lipschitz, noise_sd=nc.noise_sd, radius_scale=0.0)
        optimizer = method.CertificateGuidedPruning(2, settings, stream_seed(seed, 900, run, 2))
        noisy = needle.noisy(nc.noise_sd, np.random.default_rng(stream_seed(seed, 900, run, 1)))
        trace = trace_cgp(optimizer, needle, noisy, nc.budget, cfg.certificate.stop_gap)
        failures += not covered_throughout(trace.margin)
    return {"c1_zero_radius_failures": float(failures), "c1_zero_radius_runs": float(nc.runs),
            "c1_zero_radius_failure_rate": failures / nc.runs}


def trust_region_study(cfg: CertificatePruningConfig, benches: dict[str, data.Benchmark], seed: int
                       ) -> tuple[dict[str, float], list[dict]]:
    """CGP-TR against random search on the high-dimensional functions (final simple regret)."""
    tr = cfg.trust_region
    rows, wins = [], 0
    for k, name in enumerate(tr.functions):
        bench = benches[name]
        settings = cgp_settings(cfg, bench.lipschitz)
        optimizer = method.TrustRegionCGP(bench.dim, settings, stream_seed(seed, 500, k, 2), tr.local_points)
        noisy = bench.noisy(cfg.noise_sd, np.random.default_rng(stream_seed(seed, 500, k, 1)))
        volumes = []
        for _ in range(tr.budget):
            x = optimizer.ask()
            optimizer.tell(x, noisy(x))
            volumes.append(optimizer.local_active_fraction)
        cgp_tr = bench.regret(optimizer.recommend())
        rand = trace_ask_tell(baselines.RandomSearch(bench.dim, stream_seed(seed, 501, k, 2)), bench,
                              bench.noisy(cfg.noise_sd, np.random.default_rng(stream_seed(seed, 501, k, 1))),
                              tr.budget, [tr.budget])[0]
        wins += cgp_tr <= rand
        rows.append({"function": name, "dim": bench.dim, "cgp_tr_regret": cgp_tr, "random_regret": rand,
                     "final_local_volume": volumes[-1], "restarts": optimizer.state.restarts})
    n = len(tr.functions)
    return {"c4_tr_wins_vs_random": float(wins), "c4_tr_runs": float(n), "c4_tr_win_rate_vs_random": wins / n}, rows


# ------------------------------------------------------------------------------------------------
# Claim metrics of one seed
# ------------------------------------------------------------------------------------------------


def loglog_slope(volume: Sequence[float]) -> float:
    """Slope of log Vol(A_t) against log t from the first step with Vol < 1 (0 if it never shrinks)."""
    vol = np.asarray(volume)
    shrunk = np.flatnonzero(vol < 1.0)
    if shrunk.size < 3 or np.any(vol[shrunk[0]:] <= 0):
        return 0.0
    t = np.arange(1, len(vol) + 1)[shrunk[0]:]
    return float(np.polyfit(np.log(t), np.log(vol[shrunk[0]:]), 1)[0])


def claim_metrics(cfg: CertificatePruningConfig, runs: dict[str, dict[str, Any]],
                  benches: dict[str, data.Benchmark]) -> dict[str, float]:
    """Per-seed claim metrics. Rates come with their counts (``*_runs`` trials and the successes), which
    the claims pool over seeds for a Clopper-Pearson interval; one run per (function, method) per seed."""
    synthetic = [f for f in cfg.functions if f != "svm"]
    metrics: dict[str, float] = {}
    # C1: x* never pruned by CGP with the known L (one trial per synthetic function).
    covered = sum(covered_throughout(runs[f]["cgp"].margin) for f in synthetic)
    metrics |= {"c1_covered_runs": float(covered), "c1_runs": float(len(synthetic)),
                "c1_coverage_rate": covered / len(synthetic)}
    # C1's precondition: coverage says little when nothing is pruned (x* is the last point a valid envelope prunes).
    pruned = sum(runs[f]["cgp"].volume[-1] <= PRUNED_VOLUME for f in synthetic)
    metrics |= {"c1_pruned_runs": float(pruned), "c1_pruned_rate": pruned / len(synthetic)}
    # C7: eps_t bounds the true regret of x_hat_t. The trial is a run (the bound holds at every step, the
    # anytime event of the theorem); steps of one run are not independent trials. The per-step fraction
    # is reported as well.
    bounded = [bool(np.all(np.asarray(runs[f]["cgp"].gap) >= np.asarray(runs[f]["cgp"].regret) - 1e-12))
               for f in cfg.functions]
    metrics |= {"c7_bounded_runs": float(sum(bounded)), "c7_runs": float(len(cfg.functions)),
                "c7_bounded_rate": sum(bounded) / len(cfg.functions)}
    # C7's precondition: a gap proxy >= the range of the rescaled objective bounds any regret (vacuous).
    informative = sum(bool(runs[f]["cgp"].gap[-1] < INFORMATIVE_GAP) for f in cfg.functions)
    metrics |= {"c7_informative_runs": float(informative), "c7_informative_rate": informative / len(cfg.functions)}
    gaps = np.concatenate([runs[f]["cgp"].gap for f in cfg.functions])
    regrets = np.concatenate([runs[f]["cgp"].regret for f in cfg.functions])
    cover = np.concatenate([np.asarray(runs[f]["cgp"].gap) + benches[f].lipschitz * runs[f]["covering_radius"]
                            for f in cfg.functions])
    metrics["c7_gap_bound_rate"] = float(np.mean(gaps >= regrets - 1e-12))
    metrics["c7_gap_plus_cover_bound_rate"] = float(np.mean(cover >= regrets - 1e-12))
    stopped = [f for f in cfg.functions if runs[f]["cgp"].stop_time is not None]
    metrics["c7_stopped_fraction"] = len(stopped) / len(cfg.functions)
    # C2: volume. Vol(A_t) cannot increase (A_t is intersected with A_{t-1}): the identity C2d reads the largest
    # step-to-step increase of Vol(A_t) (0 when monotone). Reported besides: the un-intersected set
    # {U_t >= l_t}, the fraction of steps where its volume rose (noise can lift U_t or lower l_t).
    metrics["c2_volume_max_increase"] = float(max(
        np.max(np.diff(runs[f]["cgp"].volume), initial=0.0) for f in cfg.functions))
    rises = np.concatenate([np.diff(runs[f]["cgp"].raw_volume) > 0 for f in cfg.functions])
    metrics["c2_unintersected_volume_rise_rate"] = float(np.mean(rises)) if rises.size else 0.0
    for f in ("needle2d", "branin", "svm"):
        if f in runs:
            metrics[f"c2_final_volume_{f}"] = runs[f]["cgp"].volume[-1]
    metrics["c2_loglog_slope_needle2d"] = loglog_slope(runs["needle2d"]["cgp"].volume)
    # C3: CGP-Adaptive, eventual coverage from its last doubling on (one trial per synthetic function).
    eventual = sum(eventual_coverage(runs[f]["cgp_adaptive"].margin, runs[f]["adaptive_doubling_steps"])
                   for f in synthetic)
    metrics |= {"c3_adaptive_covered_runs": float(eventual), "c3_adaptive_runs": float(len(synthetic)),
                "c3_adaptive_eventual_coverage": eventual / len(synthetic)}
    adaptive_pruned = sum(runs[f]["cgp_adaptive"].volume[-1] <= PRUNED_VOLUME for f in synthetic)
    metrics |= {"c3_adaptive_pruned_runs": float(adaptive_pruned),
                "c3_adaptive_pruned_rate": adaptive_pruned / len(synthetic)}
    excess = [runs[f]["adaptive_doublings"]
              - max(0, math.ceil(math.log2(benches[f].lipschitz / cfg.adaptive.initial_lipschitz)))
              for f in cfg.functions]
    metrics["c3_adaptive_excess_doublings"] = float(max(excess))
    metrics["c3_adaptive_mean_doublings"] = float(np.mean([runs[f]["adaptive_doublings"] for f in cfg.functions]))
    # C6: CGP's final simple regret against the baselines; one trial per function.
    local = [m for m in ("hoo", "zooming", "random") if m in cfg.baselines.methods]
    metrics["c6_functions_cgp_beats_hoo_zooming_random"] = float(sum(
        runs[f]["cgp"].regret[-1] <= min(runs[f]["baselines"][m][-1] for m in local) for f in cfg.functions))
    metrics["c6_functions_cgp_beats_all_baselines"] = float(sum(
        runs[f]["cgp"].regret[-1] <= min(r[-1] for r in runs[f]["baselines"].values()) for f in cfg.functions))
    metrics["c6_n_functions"] = float(len(cfg.functions))
    for name in ("hoo_zooming_random", "all_baselines"):
        metrics[f"c6_win_rate_vs_{name}"] = metrics[f"c6_functions_cgp_beats_{name}"] / len(cfg.functions)
    if cfg.hybrid is not None:
        wins = sum(runs[f]["cgp_hybrid"][-1] <= runs[f]["cgp"].regret[-1] for f in cfg.functions)
        metrics |= {"c5_hybrid_wins_vs_cgp": float(wins), "c5_hybrid_runs": float(len(cfg.functions)),
                    "c5_hybrid_win_rate_vs_cgp": wins / len(cfg.functions)}
        metrics["c5_hybrid_switched_fraction"] = float(np.mean([
            runs[f]["hybrid_switched_at"] is not None for f in cfg.functions]))
    for f in cfg.functions:
        metrics[f"regret_{f}_cgp"] = runs[f]["cgp"].regret[-1]
        metrics[f"regret_{f}_cgp_adaptive"] = runs[f]["cgp_adaptive"].regret[-1]
        for m, r in runs[f]["baselines"].items():
            metrics[f"regret_{f}_{m}"] = r[-1]
        metrics[f"lipschitz_{f}"] = benches[f].lipschitz
    return metrics


# ------------------------------------------------------------------------------------------------
# Tables and curves for the figures
# ------------------------------------------------------------------------------------------------


def regret_rows(cfg: CertificatePruningConfig, runs: dict[str, dict[str, Any]]) -> list[dict]:
    rows = []
    for f in cfg.functions:
        run = runs[f]
        series = {"cgp": [run["cgp"].regret[t - 1] for t in run["record_at"]],
                  "cgp_adaptive": [run["cgp_adaptive"].regret[t - 1] for t in run["record_at"]]}
        series |= run["baselines"]
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


# ------------------------------------------------------------------------------------------------
# One seed, end to end
# ------------------------------------------------------------------------------------------------


def run_seed(cfg: CertificatePruningConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress | None = None) -> SeedResult:
    """Every measurement of one seed. Nothing is trained, so nothing is saved under ``model_dir``;
    ``device`` is unused (numpy/scikit-learn on CPU)."""
    benches = load_benchmarks(cfg, seed, data_dir)
    runs: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    steps = len(cfg.functions) + 1 + (cfg.trust_region is not None)
    for k, name in enumerate(cfg.functions):
        runs[name] = run_function(cfg, benches[name], seed, k)
        for m, s in runs[name]["seconds"].items():
            seconds[m] = seconds.get(m, 0.0) + s
        if progress is not None:
            progress((k + 1) / steps, f"seed {seed}: {name} done")
    metrics = claim_metrics(cfg, runs, benches)
    start = time.perf_counter()
    metrics |= zero_radius_failures(cfg, benches["needle2d"], seed)
    seconds["negative_control"] = time.perf_counter() - start
    tables: dict[str, Any] = {"regret_curves": regret_rows(cfg, runs)}
    if cfg.trust_region is not None:
        start = time.perf_counter()
        tr_metrics, tables["trust_region"] = trust_region_study(cfg, benches, seed)
        metrics |= tr_metrics
        seconds["cgp_tr"] = time.perf_counter() - start
    if progress is not None:
        progress(1.0, f"seed {seed}: done")
    curves: dict[str, list[float]] = {}
    for f in cfg.functions:
        trace = runs[f]["cgp"]
        curves |= {f"volume_{f}": trace.volume, f"gap_{f}": trace.gap, f"regret_{f}_cgp": trace.regret}
        if benches[f].dim == 2:
            tables[f"active_set_{f}"] = active_set_rows(runs[f])
            tables[f"samples_{f}"] = [{"x0": float(p[0]), "x1": float(p[1])} for p in runs[f]["cgp_samples"]]
    tables["benchmarks"] = [{"function": f, "dim": benches[f].dim, "lipschitz": benches[f].lipschitz,
                             "x_star": benches[f].x_star.tolist(), "budget": runs[f]["budget"],
                             "covering_radius": runs[f]["covering_radius"],
                             "stop_time": runs[f]["cgp"].stop_time,
                             "adaptive_doublings": runs[f]["adaptive_doublings"],
                             "adaptive_final_lipschitz": runs[f]["adaptive_final_lipschitz"]}
                            for f in cfg.functions]
    metrics |= {f"seconds_{m}": s for m, s in seconds.items()}
    return {"seed": seed, "metrics": metrics, "curves": curves, "tables": tables}
