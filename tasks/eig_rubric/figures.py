"""Figures of eig_rubric: (1) alignment (Spearman with the human score) against rubric size k for EIG-k, random-k
and the fixed questionnaire (yes count and naive Bayes), the CoT judge and the whole pool as references;
(2) test-retest consistency (Krippendorff's alpha, ordinal, and ICC) per judge at the decisive k, one dot per seed;
(3) the CoT judge's Spearman and alpha over its drift grid against EIG-k (where C3b and C2 flip)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.figures import PALETTE, new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.eig_rubric.config import EigRubricConfig
from tasks.eig_rubric.evaluate import JUDGES, SWEPT_JUDGES

LABELS = {"eig": "EIG-k", "random": "random-k", "marginal": "top-k marginal EIG", "correlation": "top-k |corr|",
          "fixed": "fixed (yes count)", "fixed_nb": "fixed (naive Bayes)", "cot": "CoT (drifting)",
          "cot_nodrift": "CoT (no drift)", "full_pool": "whole pool", "eig_relevant_pool": "EIG-k, relevant pool",
          "random_relevant_pool": "random-k, relevant pool", "full_relevant_pool": "whole relevant pool"}


def spearman_by_k_rows(results: list[SeedResult]) -> list[dict]:
    return [{"seed": r.seed, "k": row["k"], "judge": row["judge"], "spearman": row["spearman"],
             "alpha_ordinal": row["alpha_ordinal"]} for r in results for row in r.tables["k_sweep"]]


def consistency_rows(results: list[SeedResult]) -> list[dict]:
    return [{"seed": r.seed, "judge": judge, "alpha_ordinal": r.metrics[f"alpha_ordinal_{judge}"],
             "icc": r.metrics[f"icc_{judge}"], "spearman": r.metrics[f"spearman_{judge}"]}
            for r in results for judge in JUDGES if f"spearman_{judge}" in r.metrics]


def cot_sweep_rows(results: list[SeedResult]) -> list[dict]:
    return [{"seed": r.seed, **row} for r in results for row in r.tables.get("cot_sweep", [])]


def make_figures(cfg: EigRubricConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    sweep = spearman_by_k_rows(results)
    fig, axes = new_figure()
    ax = axes[0, 0]
    for colour, judge in zip(PALETTE, SWEPT_JUDGES, strict=False):
        ks = sorted({row["k"] for row in sweep if row["judge"] == judge})
        per_k = [[row["spearman"] for row in sweep if row["judge"] == judge and row["k"] == k] for k in ks]
        mean = np.array([np.mean(v) for v in per_k])
        ax.plot(ks, mean, marker="o", color=colour, label=LABELS[judge])
        ax.fill_between(ks, [min(v) for v in per_k], [max(v) for v in per_k], color=colour, alpha=0.15)
    for colour, judge in ((PALETTE[4], "cot"), (PALETTE[5], "full_pool")):
        ax.axhline(np.mean([r.metrics[f"spearman_{judge}"] for r in results]), color=colour, linestyle="--",
                   label=LABELS[judge])
    ax.axvline(cfg.judge.k, color="grey", linewidth=0.8)
    ax.set(xlabel="questions in the rubric (k)", ylabel="Spearman with the human score",
           title="alignment vs rubric size (band: seed range)")
    ax.legend()
    paths = [save_figure(fig, Path(figures_dir) / "spearman_vs_k.png"),
             write_plot_csv(sweep, Path(plots_dir) / "spearman_vs_k.csv")]

    rows = consistency_rows(results)
    fig, axes = new_figure(ncols=2)
    for ax, metric, title in ((axes[0, 0], "alpha_ordinal", "Krippendorff alpha (ordinal)"),
                              (axes[0, 1], "icc", "ICC(1,1)")):
        judges = [j for j in JUDGES if any(row["judge"] == j for row in rows)]
        for x, judge in enumerate(judges):
            values = [row[metric] for row in rows if row["judge"] == judge]
            ax.bar(x, np.mean(values), color=PALETTE[x % len(PALETTE)], alpha=0.6)
            ax.scatter(np.full(len(values), x), values, color="black", s=8, zorder=3)
        ax.set_xticks(range(len(judges)), [LABELS[j] for j in judges], rotation=45, ha="right", fontsize=7)
        ax.set(ylabel=title, title=f"test-retest, R = {cfg.judge.n_rejudgings}, k = {cfg.judge.k} (dots: seeds)")
    paths += [save_figure(fig, Path(figures_dir) / "consistency_by_judge.png"),
              write_plot_csv(rows, Path(plots_dir) / "consistency_by_judge.csv")]

    grid = cot_sweep_rows(results)
    if grid:
        fig, axes = new_figure(ncols=2)
        eig = {"spearman": np.mean([r.metrics["spearman_eig"] for r in results]),
               "alpha_ordinal": np.mean([r.metrics["alpha_ordinal_eig"] for r in results])}
        weights = sorted({row["cot_irrelevant_weight"] for row in grid})
        for ax, metric in ((axes[0, 0], "spearman"), (axes[0, 1], "alpha_ordinal")):
            for colour, weight in zip(PALETTE, weights, strict=False):
                picked = sorted({row["cot_relevant_picked"] for row in grid})
                mean = [np.mean([row[metric] for row in grid if row["cot_relevant_picked"] == p
                                 and row["cot_irrelevant_weight"] == weight]) for p in picked]
                ax.plot(picked, mean, marker="o", color=colour, label=f"irrelevant weight {weight:g}")
            ax.axhline(eig[metric], color="black", linestyle="--", label=f"EIG-{cfg.judge.k}")
            ax.set(xlabel="relevant dimensions a CoT judging attends to", ylabel=metric,
                   title=f"CoT judge over its drift grid (mean of {len(results)} seeds)")
            ax.legend(fontsize=7)
        paths += [save_figure(fig, Path(figures_dir) / "cot_drift_sweep.png"),
                  write_plot_csv(grid, Path(plots_dir) / "cot_drift_sweep.csv")]
    return paths
