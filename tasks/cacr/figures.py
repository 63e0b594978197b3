"""Figures of cacr: mIoU by method and question type; candidate recall; timelines of candidate misses."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.cacr.config import QUESTION_TYPES, CacrConfig
from tasks.cacr.evaluate import METHODS
from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult

LABELS = {"top1": "VBCS top-1", "dense": "dense regressor", "sft": "SFT only", "grpo_full": "CACR (full)",
          "grpo_no_reward": "no reject reward", "grpo_no_action": "no REJECT action"}


def _mean_sd(results: list[SeedResult], key: str) -> tuple[float, float]:
    values = np.array([r.metrics[key] for r in results], dtype=float)
    return float(np.nanmean(values)), float(np.nanstd(values))


def make_figures(cfg: CacrConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    written = []
    groups = [*QUESTION_TYPES, "miss", "all"]
    rows = []
    fig, axes = new_figure(width=11, height=4)
    ax = axes[0, 0]
    width = 0.8 / len(METHODS)
    for i, name in enumerate(METHODS):
        keys = [f"{name}_miou_{g}" if g != "all" else f"{name}_miou" for g in groups]
        stats = [_mean_sd(results, k) for k in keys]
        ax.bar(np.arange(len(groups)) + i * width, [m for m, _ in stats], width, yerr=[s for _, s in stats],
               label=LABELS[name])
        rows += [{"method": name, "group": g, "miou_mean": m, "miou_sd": s} for g, (m, s) in zip(groups, stats)]
    recall = [_mean_sd(results, f"candidate_recall_tau_{t}")[0] for t in QUESTION_TYPES]
    ax.plot(np.arange(len(QUESTION_TYPES)) + 0.4, recall, "k*", markersize=10, label="candidate recall@K (tIoU>=tau)")
    ax.set_xticks(np.arange(len(groups)) + 0.4, groups)
    ax.set(ylabel="mIoU (mean ± sd over seeds)", title=f"{len(results)} seeds, test questions by type")
    ax.legend(fontsize=7, ncols=2)
    written += [save_figure(fig, Path(figures_dir) / "miou_by_type.png"),
                write_plot_csv(rows, Path(plots_dir) / "miou_by_type.csv")]

    timeline = results[0].tables.get("timeline", [])
    if timeline:
        questions = sorted({r["question"] for r in timeline})
        fig, axes = new_figure(ncols=1, nrows=len(questions), width=9, height=1.6 * len(questions))
        for ax, q in zip(axes[:, 0], questions):
            segs = [r for r in timeline if r["question"] == q]
            for y, r in enumerate(segs):
                colour = "green" if r["kind"] == "ground truth" else ("grey" if r["kind"].startswith("cand") else "C0")
                ax.barh(y, r["end"] - r["start"] + 1, left=r["start"], color=colour)
            ax.set_yticks(range(len(segs)), [r["kind"] for r in segs], fontsize=6)
            ax.set_xlim(0, cfg.data.frames)
            ax.set_title(f"seed {results[0].seed}, question {q} ({segs[0]['qtype']}): a candidate miss", fontsize=8)
        axes[-1, 0].set_xlabel("frame")
        written += [save_figure(fig, Path(figures_dir) / "timeline_misses.png"),
                    write_plot_csv(timeline, Path(plots_dir) / "timeline_misses.csv")]

    fig, axes = new_figure()
    curve_rows = []
    for r in results:
        for name in ("grpo_full_reward", "grpo_no_reward_reward", "grpo_no_action_reward"):
            curve = r.curves.get(name, [])
            axes[0, 0].plot(curve, label=f"{name.removesuffix('_reward')} seed {r.seed}", alpha=0.7)
            curve_rows += [{"seed": r.seed, "run": name, "step": i, "reward": v} for i, v in enumerate(curve)]
    axes[0, 0].set(xlabel="GRPO step", ylabel="mean reward of the batch", title="GRPO training reward")
    axes[0, 0].legend(fontsize=6)
    written += [save_figure(fig, Path(figures_dir) / "grpo_reward.png"),
                write_plot_csv(curve_rows, Path(plots_dir) / "grpo_reward.csv")]
    return written
