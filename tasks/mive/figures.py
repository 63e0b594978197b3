"""Figures of mive: per-layer probe curves of the frozen VLM, edit metrics per variant, a grid of source /
reference / edited first frames."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.mive.config import MiveConfig


def make_figures(cfg: MiveConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    if cfg.hub is not None:
        return []
    probes = [{"seed": r.seed, **row} for r in results for row in r.tables["probes"]]
    variants = [{"seed": r.seed, **row} for r in results for row in r.tables["variants"]]
    written = [write_plot_csv(probes, Path(plots_dir) / "probes.csv"),
               write_plot_csv(variants, Path(plots_dir) / "variants.csv")]
    fig, axes = new_figure()
    layers = sorted({row["layer"] for row in probes})
    for key, name in (("hue_r2", "exact hue R^2 (object patch)"), ("position_r2", "object position R^2"),
                      ("semantic_accuracy", "edit semantics accuracy (held-out phrasings)")):
        values = np.array([[row[key] for row in probes if row["layer"] == layer] for layer in layers])
        axes[0, 0].errorbar(layers, values.mean(1), yerr=values.std(1), marker="o", capsize=3, label=name)
    axes[0, 0].set(xlabel="VLM hidden state (0 = embeddings, last = after final LayerNorm)",
                   ylabel="held-out probe score")
    axes[0, 0].set_xticks(layers)
    axes[0, 0].legend(fontsize=7)
    written.append(save_figure(fig, Path(figures_dir) / "layer_probes.png"))

    names = list(cfg.dit.variants)
    fig, axes = new_figure(ncols=3, width=12)
    for ax, (key, label) in zip(axes[0], (("hue_error", "hue error (deg)"), ("target_selection", "target selection"),
                                          ("unedited_mse", "unedited-region MSE")), strict=True):
        values = [[row[key] for row in variants if row["variant"] == v] for v in names]
        ax.bar(range(len(names)), [np.mean(v) for v in values], yerr=[np.std(v) for v in values], capsize=3)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
        ax.set(ylabel=label)
    written.append(save_figure(fig, Path(figures_dir) / "variants.png"))

    grid = results[0].tables["sample_grid"]
    kinds = list(dict.fromkeys(row["kind"] for row in grid))
    clips = sorted({row["clip"] for row in grid})
    size = cfg.data.image_size
    fig, axes = new_figure(ncols=len(kinds), nrows=len(clips), width=1.6 * len(kinds), height=1.6 * len(clips))
    for row in grid:
        ax = axes[clips.index(row["clip"]), kinds.index(row["kind"])]
        ax.imshow(np.clip(np.asarray(row["pixels"]).reshape(size, size, 3), 0, 1), interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        if row["clip"] == clips[0]:
            ax.set_title(row["kind"], fontsize=7)
    written.append(save_figure(fig, Path(figures_dir) / "sample_grid.png"))
    return written
