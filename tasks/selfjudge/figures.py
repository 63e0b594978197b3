"""Figures of selfjudge: (1) accuracy vs tokens per target call per decoding method, per task; (2) diff_N by
mismatch kind (meaning vs style) on both tasks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.selfjudge.config import SelfJudgeConfig

FAMILY_STYLE = {"selfjudge": ("o-", "SelfJudge (threshold sweep)"), "autojudge": ("s--", "AutoJudge (sweep)"),
                "topk": ("^", "top-K"), "exact": ("*", "exact speculative decoding"),
                "random": ("x:", "random acceptance (negative control)")}


def make_figures(cfg: SelfJudgeConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    rows = [r | {"seed": res.seed} for res in results for r in res.tables.get("decoding", [])]
    tasks = sorted({r["task"] for r in rows})
    written = []
    if rows:
        fig, axes = new_figure(ncols=len(tasks))
        for ax, task in zip(axes[0], tasks):
            for family, (marker, label) in FAMILY_STYLE.items():
                names = list(dict.fromkeys(r["method"] for r in rows if r["task"] == task and r["family"] == family))
                pts = []
                for name in names:
                    sel = [r for r in rows if r["task"] == task and r["method"] == name]
                    pts.append((np.mean([r["tokens_per_call"] for r in sel]), np.mean([r["accuracy"] for r in sel])))
                if pts:
                    pts.sort()
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, label=label)
            ax.set(xlabel="generated tokens per target call", title=task,
                   ylabel="answer accuracy" if task == "arith" else "slot preservation")
            ax.legend()
        written.append(save_figure(fig, Path(figures_dir) / "tradeoff.png"))
        written.append(write_plot_csv(rows, Path(plots_dir) / "tradeoff.csv"))
    mism = [{k: r[k] for k in ("task", "kind", "diff", "label")} | {"seed": res.seed}
            for res in results for r in res.tables.get("mismatches", [])]
    if mism:
        fig, axes = new_figure(ncols=2)
        for ax, task in zip(axes[0], ("arith", "desc")):
            for kind in ("meaning", "style"):
                values = [r["diff"] for r in mism if r["task"] == task and r["kind"] == kind]
                if values:
                    ax.hist(values, bins=30, alpha=0.6, label=f"{kind} ({len(values)})")
            ax.set(xlabel=f"diff_{cfg.mining.window}", ylabel="mismatches", title=task)
            ax.legend()
        written.append(save_figure(fig, Path(figures_dir) / "diff_by_kind.png"))
        written.append(write_plot_csv(mism, Path(plots_dir) / "diff_by_kind.csv"))
    return written
