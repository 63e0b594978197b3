"""Figures of certificate_pruning, from the per-seed results only (no recomputation):
regret curves per function and method, CGP's certificate traces (Vol(A_t), eps_t, true regret),
log Vol(A_t) against log t on Needle-2D, and the 2-D active set shrinking on the 2-D functions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from tasks.certificate_pruning.config import CertificatePruningConfig
from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult

Results = Sequence[SeedResult]
FLOOR = 1e-4  # regrets of exactly 0 on a log axis


def functions_of(results: Results) -> list[str]:
    return [row["function"] for row in results[0].tables["benchmarks"]]


def median_regret_frame(results: Results) -> pl.DataFrame:
    """Median over seeds of the regret at each checkpoint, per function and method."""
    rows = [row for r in results for row in r.tables["regret_curves"]]
    return (pl.DataFrame(rows).group_by(["function", "method", "t"]).agg(pl.col("regret").median())
            .sort(["function", "method", "t"]))


def trace_frame(results: Results) -> pl.DataFrame:
    """Median over seeds of CGP's Vol(A_t), eps_t and regret at every step, per function."""
    rows = []
    for f in functions_of(results):
        stacked = {k: np.median([r.curves[f"{k}_{f}"] for r in results], axis=0) for k in ("volume", "gap")}
        regret = np.median([r.curves[f"regret_{f}_cgp"] for r in results], axis=0)
        rows += [{"function": f, "t": t + 1, "volume": float(stacked["volume"][t]), "gap": float(stacked["gap"][t]),
                  "regret": float(regret[t])} for t in range(len(regret))]
    return pl.DataFrame(rows)


def grid_axes(n: int, ncols: int = 4):
    nrows = int(np.ceil(n / ncols))
    fig, axes = new_figure(ncols=min(n, ncols), nrows=nrows, width=3.2 * min(n, ncols), height=2.6 * nrows)
    flat = axes.ravel()
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat


def regret_curves(results: Results, path: Path) -> Path:
    frame = median_regret_frame(results)
    names = functions_of(results)
    fig, axes = grid_axes(len(names))
    for ax, f in zip(axes, names):
        for method in frame.filter(pl.col("function") == f)["method"].unique(maintain_order=True):
            sub = frame.filter((pl.col("function") == f) & (pl.col("method") == method))
            style = {"lw": 2.2} if method == "cgp" else {"lw": 1.0, "alpha": 0.8}
            ax.plot(sub["t"], np.maximum(sub["regret"].to_numpy(), FLOOR), label=method, **style)
        ax.set_yscale("log")
        ax.set_title(f)
        ax.set_xlabel("evaluations t")
        ax.set_ylabel("simple regret (median)")
    axes[0].legend(fontsize=6)
    fig.suptitle(f"Simple regret of the recommendation, median over {len(results)} seeds")
    return save_figure(fig, path)


def certificate_traces(results: Results, path: Path) -> Path:
    frame = trace_frame(results)
    names = functions_of(results)
    fig, axes = grid_axes(len(names))
    for ax, f in zip(axes, names):
        sub = frame.filter(pl.col("function") == f)
        ax.plot(sub["t"], sub["volume"], label="Vol(A_t)")
        ax.plot(sub["t"], np.maximum(sub["gap"].to_numpy(), FLOOR), label="eps_t (gap proxy)")
        ax.plot(sub["t"], np.maximum(sub["regret"].to_numpy(), FLOOR), label="true regret of x_hat")
        ax.set_yscale("log")
        ax.set_title(f)
        ax.set_xlabel("evaluations t")
    axes[0].legend(fontsize=6)
    fig.suptitle("CGP certificates (median over seeds): eps_t must stay above the true regret")
    return save_figure(fig, path)


def volume_loglog(results: Results, path: Path, function: str = "needle2d") -> Path:
    fig, axes = new_figure()
    ax = axes[0, 0]
    for r in results:
        volume = np.asarray(r.curves[f"volume_{function}"])
        slope = r.metrics.get(f"c2_loglog_slope_{function}")
        label = f"seed {r.seed}" + (f" (slope {slope:.2f})" if slope is not None else "")
        ax.loglog(np.arange(1, len(volume) + 1), volume, label=label)
    ax.set_xlabel("t")
    ax.set_ylabel("Vol(A_t) (active pool fraction)")
    ax.set_title(f"Active-set volume on {function} (log-log)")
    ax.legend()
    return save_figure(fig, path)


def active_set_picture(result: SeedResult, function: str, path: Path) -> Path | None:
    """Pool points coloured by the snapshot after which they were certified suboptimal (one seed)."""
    rows = result.tables.get(f"active_set_{function}")
    if not rows:
        return None
    frame = pl.DataFrame(rows)
    snaps = sorted(int(c.removeprefix("active_t")) for c in frame.columns if c.startswith("active_t"))
    fig, axes = new_figure(ncols=len(snaps), width=3.0 * len(snaps), height=3.0)
    samples = pl.DataFrame(result.tables[f"samples_{function}"])
    bench = next(b for b in result.tables["benchmarks"] if b["function"] == function)
    for ax, t in zip(axes[0], snaps):
        active = frame[f"active_t{t}"].to_numpy()
        ax.scatter(frame["x0"].to_numpy()[~active], frame["x1"].to_numpy()[~active], s=3, c="#cccccc",
                   label="certified suboptimal")
        ax.scatter(frame["x0"].to_numpy()[active], frame["x1"].to_numpy()[active], s=3, c="#1b6ca8", label="active")
        ax.scatter(samples["x0"], samples["x1"], s=5, c="#d1495b", marker="x", label="all CGP samples (t = T)")
        ax.scatter(*bench["x_star"], s=60, c="k", marker="*", label="x*")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.set_title(f"t = {t}: Vol = {active.mean():.3f}")
    axes[0, 0].legend(fontsize=6, loc="lower left")
    fig.suptitle(f"Active set A_t on {function} (seed {result.seed})")
    return save_figure(fig, path)


def median_final_regret_rows(results: Results) -> list[dict]:
    """C6 across seeds: per function and method the median over seeds of the final
    simple regret, and whether CGP's median is <= it. (The verdicted C6 metrics count functions per seed.)"""
    rows = [row for r in results for row in r.tables["regret_curves"]]
    frame = pl.DataFrame(rows)
    final = frame.filter(pl.col("t") == pl.col("t").max().over("function"))
    medians = final.group_by(["function", "method"]).agg(pl.col("regret").median().alias("median_final_regret"))
    cgp = medians.filter(pl.col("method") == "cgp").select("function", pl.col("median_final_regret").alias("cgp"))
    out = medians.join(cgp, on="function").with_columns(
        (pl.col("cgp") <= pl.col("median_final_regret")).alias("cgp_median_le"))
    return out.drop("cgp").sort(["function", "method"]).to_dicts()


def tight_traces(results: Results, path: Path) -> Path | None:
    """The tight test bed's first run of each seed: the pool gap eps_t (drawn only where the active pool is
    not empty), the covering-corrected eps_t^+, the true regret and Vol(A_t)."""
    if "tight_run0_regret" not in results[0].curves:
        return None
    fig, axes = grid_axes(len(results))
    for ax, r in zip(axes, results):
        t = np.arange(1, len(r.curves["tight_run0_regret"]) + 1)
        pool_gap = np.asarray(r.curves["tight_run0_pool_gap"], dtype=float)
        ax.plot(t, np.where(np.isfinite(pool_gap), np.maximum(pool_gap, FLOOR), np.nan), label="eps_t (pool)")
        ax.plot(t, np.maximum(r.curves["tight_run0_covered_gap"], FLOOR), label="eps_t^+ (covering-corrected)")
        ax.plot(t, np.maximum(r.curves["tight_run0_regret"], FLOOR), label="true regret of x_hat")
        ax.plot(t, np.maximum(r.curves["tight_run0_volume"], FLOOR), label="Vol(A_t)", linestyle=":")
        ax.set_yscale("log")
        ax.set_title(f"seed {r.seed}, run 0")
        ax.set_xlabel("evaluations t")
    axes[0].legend(fontsize=6)
    fig.suptitle("Tight test bed (Needle-2D, exact L): a valid gap stays above the true regret")
    return save_figure(fig, path)


def make_figures(config: CertificatePruningConfig, results: Results, figures_dir: Path, plots_dir: Path) -> list[Path]:
    """PNGs in ``figures_dir`` and CSV plot sources (medians over seeds) in ``plots_dir``."""
    figures_dir, plots_dir = Path(figures_dir), Path(plots_dir)
    written = [
        regret_curves(results, figures_dir / "regret_curves.png"),
        certificate_traces(results, figures_dir / "certificate_traces.png"),
        volume_loglog(results, figures_dir / "volume_loglog_needle2d.png"),
    ]
    tight = tight_traces(results, figures_dir / "tight_certificate_traces.png")
    if tight is not None:
        written.append(tight)
    for f in functions_of(results):
        picture = active_set_picture(results[0], f, figures_dir / f"active_set_{f}.png")
        if picture is not None:
            written.append(picture)
    written.append(write_plot_csv(median_regret_frame(results).to_dicts(), plots_dir / "regret_curves.csv"))
    written.append(write_plot_csv(trace_frame(results).to_dicts(), plots_dir / "certificate_traces.csv"))
    written.append(write_plot_csv(median_final_regret_rows(results), plots_dir / "c6_median_final_regret.csv"))
    return written
