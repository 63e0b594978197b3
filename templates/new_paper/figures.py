"""Figures of new_paper: the training objective per seed."""

from __future__ import annotations

from pathlib import Path

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.new_paper.config import NewPaperConfig


def make_figures(cfg: NewPaperConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    fig, axes = new_figure()
    rows = []
    for r in results:
        curve = r.curves["train_objective"]
        axes[0, 0].plot(range(len(curve)), curve, label=f"seed {r.seed}")
        rows += [{"seed": r.seed, "step": i, "objective": v} for i, v in enumerate(curve)]
    axes[0, 0].set(xlabel="step", ylabel="ridge objective", yscale="log", title="training")
    axes[0, 0].legend()
    return [save_figure(fig, Path(figures_dir) / "train_objective.png"),
            write_plot_csv(rows, Path(plots_dir) / "train_objective.csv")]
