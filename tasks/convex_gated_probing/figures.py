"""Figures of convex_gated_probing: probe mAP per method (Table 5's bars) and the learned gate vs per-layer LP."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.convex_gated_probing.config import ConvexGatedProbingConfig

METHODS = (("lp", "LP"), ("lp_mean", "LP-mean"), ("lcgp", "LCGP"), ("head2toe", "Head2Toe-lite"),
           ("protobin", "ProtoBin"), ("cgp_frozen_last_gate", "CGP, gate on last"), ("cgp", "CGP"),
           ("finetune", "FT"))


def make_figures(cfg: ConvexGatedProbingConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path
                 ) -> list[Path]:
    fig, axes = new_figure(ncols=2)
    rows = [{"seed": r.seed, "method": label, "map": r.metrics[f"{key}_map"]}
            for r in results for key, label in METHODS]
    means = [np.mean([r.metrics[f"{key}_map"] for r in results]) for key, _ in METHODS]
    axes[0, 0].bar(range(len(METHODS)), means, color="#1b6ca8")
    for i, (key, _) in enumerate(METHODS):
        axes[0, 0].scatter([i] * len(results), [r.metrics[f"{key}_map"] for r in results], color="k", s=8, zorder=3)
    axes[0, 0].set_xticks(range(len(METHODS)), [label for _, label in METHODS], rotation=45, ha="right")
    axes[0, 0].set(ylabel="test macro mAP (%)", title="probes on the frozen MAE encoder")

    layer_rows = [{"seed": r.seed, **row} for r in results for row in r.tables["per_layer"]]
    ax = axes[0, 1]
    twin = ax.twinx()
    for r in results:
        layers = [row["layer"] for row in r.tables["per_layer"]]
        ax.plot(layers, [row["cgp_alpha"] for row in r.tables["per_layer"]], color="#d1495b", marker="o", alpha=0.7)
        twin.plot(layers, [row["lp_cls_map"] for row in r.tables["per_layer"]], color="#2e933c", marker="s", alpha=0.7)
    ax.set(xlabel="layer", ylabel="CGP gate alpha (red)", title="gate vs per-layer LP mAP")
    twin.set_ylabel("per-layer LP mAP (green)")
    return [save_figure(fig, Path(figures_dir) / "probes_and_gate.png"),
            write_plot_csv(rows, Path(plots_dir) / "probe_map.csv"),
            write_plot_csv(layer_rows, Path(plots_dir) / "per_layer.csv")]
