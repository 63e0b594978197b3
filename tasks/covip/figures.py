"""Figures of covip: CapEval GT/noisy accuracy per captioner, and the GRPO reward curve."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.covip.config import CovipConfig

CAPTIONERS = ("sft", "grpo", "sft_more", "recite_all", "random_subset", "blind_grpo", "correct")


def make_figures(cfg: CovipConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    rows = [{"seed": r.seed, "captioner": c, "gt_acc": r.metrics[f"{c}_gt_acc"],
             "noisy_acc": r.metrics[f"{c}_noisy_acc"], "reward": r.metrics[f"{c}_reward"],
             "cag_f1": r.metrics[f"{c}_cag_f1"]} for r in results for c in CAPTIONERS]
    fig, axes = new_figure(ncols=2)
    x = np.arange(len(CAPTIONERS))
    for offset, key in ((-0.2, "gt_acc"), (0.2, "noisy_acc")):
        means = [np.mean([row[key] for row in rows if row["captioner"] == c]) for c in CAPTIONERS]
        axes[0, 0].bar(x + offset, means, width=0.4, label=key.replace("_", " "))
    axes[0, 0].set_xticks(x, CAPTIONERS, rotation=30, ha="right")
    axes[0, 0].set(ylabel="CapEval accuracy (mean over seeds)", ylim=(0, 1.05), title="GT vs noisy QAs")
    axes[0, 0].legend()
    curve_rows = []
    for r in results:
        curve = r.curves.get("grpo_reward", [])
        if curve:
            smooth = np.convolve(curve, np.ones(10) / 10, mode="valid") if len(curve) >= 10 else np.asarray(curve)
            axes[0, 1].plot(range(len(smooth)), smooth, label=f"seed {r.seed}")
        curve_rows += [{"seed": r.seed, "step": i, "reward": v} for i, v in enumerate(curve)]
    axes[0, 1].set(xlabel="GRPO step", ylabel="mean caption reward (10-step average)", title="GRPO reward")
    axes[0, 1].legend()
    return [save_figure(fig, Path(figures_dir) / "capeval_and_reward.png"),
            write_plot_csv(rows, Path(plots_dir) / "capeval.csv"),
            write_plot_csv(curve_rows or [{"seed": -1, "step": 0, "reward": float("nan")}],
                           Path(plots_dir) / "grpo_reward.csv")]
