"""Figures of quatro: training curves per grid cell, per-query KL at the stalest cell, pass@k against k."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.quatro.claim_metrics import fresh_cell, stale_cell
from tasks.quatro.config import QuatroConfig
from tasks.quatro.train import cell_algorithms, cell_name, cells, run_name

CURVES = (("reward", "training reward"), ("entropy", "token entropy (nats)"))


def _curve_rows(cfg: QuatroConfig, results: list[SeedResult]) -> list[dict]:
    rows = []
    for r in results:
        for epochs, lr in cells(cfg.rl):
            for algorithm in cell_algorithms(cfg.rl, epochs):
                name = run_name(algorithm, epochs, lr)
                for curve, _ in CURVES:
                    rows += [{"seed": r.seed, "cell": cell_name(epochs, lr), "algorithm": algorithm, "curve": curve,
                              "step": i, "value": v} for i, v in enumerate(r.curves[f"{name}_{curve}"])]
    return rows


def curves_figure(cfg: QuatroConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    grid = cells(cfg.rl)
    fig, axes = new_figure(ncols=len(grid), nrows=len(CURVES))
    for col, (epochs, lr) in enumerate(grid):
        for row, (curve, label) in enumerate(CURVES):
            ax = axes[row, col]
            for algorithm in cell_algorithms(cfg.rl, epochs):
                values = np.array([r.curves[f"{run_name(algorithm, epochs, lr)}_{curve}"] for r in results])
                ax.plot(values.mean(axis=0), label=algorithm)
            ax.set(xlabel="RL step", ylabel=label, title=f"mu={epochs}, lr={lr:g} (mean of {len(results)} seeds)")
    axes[0, 0].legend()
    fig.tight_layout()  # two rows of titled panels: keep a row's x labels clear of the next row's titles
    return [save_figure(fig, Path(figures_dir) / "curves.png"),
            write_plot_csv(_curve_rows(cfg, results), Path(plots_dir) / "curves.csv")]


def kl_figure(cfg: QuatroConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    epochs, lr = stale_cell(cfg)
    fig, axes = new_figure()
    ax, rows = axes[0, 0], []
    shown = [a for a in ("grpo", "gspo", "quatro") if a in cell_algorithms(cfg.rl, epochs)]
    pooled = {a: [row["kl"] for r in results for row in r.tables.get(f"{run_name(a, epochs, lr)}_exact_kl", [])]
              for a in shown}
    finite = [v for values in pooled.values() for v in values if np.isfinite(v)]
    high = float(np.quantile(finite, 0.98)) if finite else 1.0
    bins = np.linspace(0.0, max(high, 4 * cfg.rl.delta), 40)
    for algorithm, values in pooled.items():
        ax.hist(np.clip(values, bins[0], bins[-1]), bins=bins, alpha=0.55, label=f"{algorithm} (n={len(values)})")
        rows += [{"algorithm": algorithm, "kl": v} for v in values]
    ax.axvline(cfg.rl.delta, color="black", linestyle="--", label=f"delta = {cfg.rl.delta:g}")
    ax.set(xlabel="exact per-query KL(pi_theta || pi_behaviour), all responses (clipped at the 98th pct)",
           ylabel="queries",
           title=f"per-query KL after each batch, mu={epochs}, lr={lr:g}")
    ax.legend()
    return [save_figure(fig, Path(figures_dir) / "per_query_kl.png"),
            write_plot_csv(rows or [{"algorithm": "", "kl": float("nan")}], Path(plots_dir) / "per_query_kl.csv")]


def pass_at_k_figure(cfg: QuatroConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    fig, axes = new_figure(ncols=2)
    rows = []
    for col, (where, (epochs, lr)) in enumerate((("fresh", fresh_cell(cfg)), ("stale", stale_cell(cfg)))):
        ax = axes[0, col]
        for algorithm in cell_algorithms(cfg.rl, epochs):
            name = run_name(algorithm, epochs, lr)
            means = [float(np.mean([r.metrics[f"{name}_eval_pass_at_{k}"] for r in results])) for k in cfg.eval.ks]
            ax.plot(cfg.eval.ks, means, marker="o", label=algorithm)
            rows += [{"cell": where, "algorithm": algorithm, "k": k, "pass_at_k": v}
                     for k, v in zip(cfg.eval.ks, means, strict=True)]
        sft = [float(np.mean([r.metrics[f"sft_eval_pass_at_{k}"] for r in results])) for k in cfg.eval.ks]
        ax.plot(cfg.eval.ks, sft, color="grey", linestyle=":", label="warm start")
        ax.set(xscale="log", xlabel="k", ylabel="pass@k (mean over targets and seeds)",
               title=f"{where}: mu={epochs}, lr={lr:g}")
    axes[0, 0].legend()
    return [save_figure(fig, Path(figures_dir) / "pass_at_k.png"),
            write_plot_csv(rows, Path(plots_dir) / "pass_at_k.csv")]


def make_figures(cfg: QuatroConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    return (curves_figure(cfg, results, figures_dir, plots_dir) + kl_figure(cfg, results, figures_dir, plots_dir)
            + pass_at_k_figure(cfg, results, figures_dir, plots_dir))
