"""Figures of coda, built from the per-seed results only (no recompute).

1. ``pareto.png``: training time per epoch (the ``training`` table) vs test error (the ``models`` table), per
   model and task.
2. ``speedup.png``: CoDA / LTC speed-up for 1- and 2-layer stacks (trained models, and the untrained stacks
   costed for claim C3c): deterministic FLOP ratios and measured wall-clock ratios.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.coda.config import CodaConfig
from tasks.common.figures import PALETTE, new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult

MODEL_ORDER = ("ltc", "coda", "gru_dense", "coda_converted", "cfc", "odernn", "gru")


def model_rows(results: list[SeedResult]) -> list[dict]:
    """One row per (seed, model): its evaluation and its training time per epoch (None for a conversion)."""
    keep = ("task", "kind", "model", "layers", "score", "seconds_per_epoch", "ms_inference_batch",
            "ms_train_step_paired", "ms_inference_batch_paired", "nfe_per_step", "train_step_flops",
            "inference_flops", "parameters")
    rows = []
    for r in results:
        training = {(t["task"], t["model"], t["layers"]): t for t in r.tables["training"]}
        for row in r.tables["models"]:
            joined = training[(row["task"], row["model"], row["layers"])] | row
            rows.append({"seed": r.seed} | {k: joined.get(k) for k in keep})
    return rows


def speedup_rows(results: list[SeedResult]) -> list[dict]:
    """LTC / CoDA cost ratios per (seed, task, depth): of the trained models (``models`` table) and of the
    untrained 1- and 2-layer stacks costed for claim C3c (``costs`` table)."""
    rows = []
    for r in results:
        for source, table in (("trained", r.tables["models"]), ("untrained", r.tables.get("costs", []))):
            rows += [row | {"seed": r.seed, "source": source} for row in ratio_rows(table)]
    return rows


def ratio_rows(table: list[dict]) -> list[dict]:
    rows = []
    for ltc in (row for row in table if row["model"] == "ltc"):
        coda = next(row for row in table if row["model"] == "coda" and row["task"] == ltc["task"]
                    and row["layers"] == ltc["layers"])
        rows.append({"task": ltc["task"], "layers": ltc["layers"],
                     "flops_speedup_train": ltc["train_step_flops"] / coda["train_step_flops"],
                     "flops_speedup_inference": ltc["inference_flops"] / coda["inference_flops"],
                     "measured_speedup_train": ltc["ms_train_step_paired"] / coda["ms_train_step_paired"],
                     "measured_speedup_inference": (ltc["ms_inference_batch_paired"]
                                                    / coda["ms_inference_batch_paired"])})
    return rows


def pareto_figure(rows: pl.DataFrame, tasks: list[str], path: Path) -> Path:
    ncols = min(3, len(tasks))
    nrows = int(np.ceil(len(tasks) / ncols))
    fig, axes = new_figure(ncols=ncols, nrows=nrows, width=3.6 * ncols, height=2.9 * nrows)
    one_layer = rows.filter(pl.col("layers") == 1, pl.col("seconds_per_epoch").is_not_null())
    for i, task in enumerate(tasks):
        ax = axes[i // ncols][i % ncols]
        sub = one_layer.filter(pl.col("task") == task).group_by("model").agg(
            pl.col("seconds_per_epoch").mean(), pl.col("score").mean(), pl.col("kind").first())
        for j, model in enumerate(MODEL_ORDER):
            point = sub.filter(pl.col("model") == model)
            if point.height:
                ax.scatter(point["seconds_per_epoch"], point["score"], color=PALETTE[j % len(PALETTE)], label=model)
        kind = sub["kind"][0] if sub.height else "forecast"
        ax.set(title=task, xlabel="s / epoch (measured)", ylabel="test accuracy %" if kind == "classify"
               else "test MSE")
        ax.set_xscale("log")
    for k in range(len(tasks), nrows * ncols):
        axes[k // ncols][k % ncols].axis("off")
    axes[0][0].legend()
    return save_figure(fig, path)


def speedup_figure(rows: pl.DataFrame, path: Path) -> Path:
    fig, axes = new_figure(ncols=2, width=8.0)
    means = rows.group_by("source", "layers").agg(pl.all().exclude("seed", "task").mean()).sort("source", "layers")
    width = 0.35
    for ax, phase in zip(axes[0], ("train", "inference")):
        x = np.arange(means.height)
        ax.bar(x - width / 2, means[f"flops_speedup_{phase}"], width, label="FLOPs (deterministic)")
        ax.bar(x + width / 2, means[f"measured_speedup_{phase}"], width, label="wall-clock (measured side by side)")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(xticks=x, xticklabels=[f"{n} layer(s)\n{src}" for src, n in zip(means["source"], means["layers"])],
               ylabel="LTC / CoDA cost",
               title=f"CoDA speed-up over LTC: {phase}")
    axes[0][0].legend()
    return save_figure(fig, path)


def make_figures(config: CodaConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    figures_dir, plots_dir = Path(figures_dir), Path(plots_dir)
    models = model_rows(results)
    speedups = speedup_rows(results)
    return [pareto_figure(pl.DataFrame(models), list(config.data.tasks), figures_dir / "pareto.png"),
            speedup_figure(pl.DataFrame(speedups), figures_dir / "speedup.png"),
            write_plot_csv(models, plots_dir / "models.csv"), write_plot_csv(speedups, plots_dir / "speedup.csv")]
