"""Figures of diffdt: AUC by code group and model, the brain follow-up AIRM error histogram (geometric vs
Euclidean vs no change), and predicted vs true delta incidence of the simulated interventions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.diffdt.config import DiffdtConfig

MODELS = ("delphi", "delphi_sdoh", "diffdt", "oracle")


def make_figures(cfg: DiffdtConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    written = []
    fig, axes = new_figure()
    rows = []
    groups = ("linked", "other")
    for g, group in enumerate(groups):
        for i, model in enumerate(MODELS):
            values = [r.metrics.get(f"auc_{model}_{group}", np.nan) for r in results]
            rows += [{"group": group, "model": model, "seed": r.seed, "auc": v} for r, v in zip(results, values)]
            axes[0, 0].scatter([g * (len(MODELS) + 1) + i] * len(values), values, s=14, color=f"C{i}",
                               label=model if g == 0 else None)
    axes[0, 0].set_xticks([1.5, len(MODELS) + 2.5], ["SDoH-linked codes", "other codes"])
    axes[0, 0].set(ylabel=f"age-stratified AUC ({cfg.auc_horizon:g} y)", title="event prediction, per seed")
    axes[0, 0].legend(fontsize=7)
    written += [save_figure(fig, Path(figures_dir) / "auc_by_group.png"),
                write_plot_csv(rows, Path(plots_dir) / "auc_by_group.csv")]

    fig, axes = new_figure()
    rows = []
    for r in results:
        rows += [{"seed": r.seed, **row} for row in r.tables.get("brain_airm", [])]
    for kind in ("geometric", "euclidean", "no_change"):
        values = [row[kind] for row in rows]
        if values:
            axes[0, 0].hist(values, bins=30, alpha=0.5, label=kind)
    axes[0, 0].set(xlabel="AIRM distance to the true follow-up C2", ylabel="subjects", title="brain follow-up")
    axes[0, 0].legend()
    written += [save_figure(fig, Path(figures_dir) / "brain_airm_hist.png"),
                write_plot_csv(rows or [{"seed": -1}], Path(plots_dir) / "brain_airm.csv")]

    rows = []
    for r in results:
        rows += [{"seed": r.seed, **row} for row in r.tables.get("intervention", [])]
    if rows:
        fig, axes = new_figure()
        true = np.array([row["true_delta"] for row in rows])
        model = np.array([row["model_delta"] for row in rows])
        axes[0, 0].scatter(100 * true, 100 * model, s=10)
        lim = 100 * max(np.abs(true).max(), np.abs(model).max(), 1e-3)
        axes[0, 0].plot([-lim, lim], [-lim, lim], color="grey", lw=0.8)
        axes[0, 0].axhline(0, color="grey", lw=0.5)
        axes[0, 0].axvline(0, color="grey", lw=0.5)
        axes[0, 0].set(xlabel="true delta 10-y incidence (pp)", ylabel="model delta (pp)",
                       title="SDoH inserted at baseline, all codes and seeds")
        written += [save_figure(fig, Path(figures_dir) / "intervention_scatter.png"),
                    write_plot_csv(rows, Path(plots_dir) / "intervention.csv")]
    return written
