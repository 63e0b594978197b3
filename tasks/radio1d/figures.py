"""Figures of radio1d: probe mAP vs k, reconstruction error vs k (every model), retrieval P@1 bars."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.radio1d.config import Radio1DConfig

LABELS = {"elastic": "RADIO1D (random k)", "plain": "plain 2D ViT, pooled"}


def label(model: str) -> str:
    return LABELS.get(model, f"fixed k = {model.removeprefix('fixed')}")


def make_figures(cfg: Radio1DConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    if cfg.hub is not None:
        rows = [{"seed": r.seed, **row} for r in results for row in r.tables.get("hub_knn", [])]
        return [write_plot_csv(rows, Path(plots_dir) / "hub_knn.csv")] if rows else []
    per_k = [{"seed": r.seed, **row} for r in results for row in r.tables["per_k"]]
    retrieval = [{"seed": r.seed, **row} for r in results for row in r.tables["retrieval"]]
    models = list(dict.fromkeys(row["model"] for row in per_k))
    written = []
    for metric, ylabel, name in (("probe_map", "linear-probe mAP (mean of k tokens)", "probe_map_vs_k"),
                                 ("recon_error", "dense-teacher reconstruction error (relative)", "recon_vs_k")):
        fig, axes = new_figure()
        for model in models:
            ks = list(cfg.eval.ks)
            values = np.array([[row[metric] for row in per_k if row["model"] == model and row["k"] == k]
                               for k in ks])
            axes[0, 0].errorbar(ks, values.mean(1), yerr=values.std(1), marker="o", capsize=3, label=label(model))
        axes[0, 0].set(xscale="log", xlabel="tokens k", ylabel=ylabel)
        axes[0, 0].set_xticks(list(cfg.eval.ks), [str(k) for k in cfg.eval.ks])
        axes[0, 0].legend()
        written += [save_figure(fig, Path(figures_dir) / f"{name}.png")]
    fig, axes = new_figure()
    bars = [(row_model, rep) for row_model in models for rep in ("tokens", "cls")]
    means = [np.mean([r["p_at_1"] for r in retrieval if r["model"] == m and r["representation"] == rep])
             for m, rep in bars]
    axes[0, 0].bar(range(len(bars)), means)
    axes[0, 0].set_xticks(range(len(bars)), [f"{label(m)}\n{rep if rep == 'cls' else f'{cfg.eval.retrieval_k} tok'}"
                                             for m, rep in bars], rotation=45, ha="right", fontsize=7)
    axes[0, 0].set(ylabel="composition retrieval P@1")
    written += [save_figure(fig, Path(figures_dir) / "retrieval_p_at_1.png"),
                write_plot_csv(per_k, Path(plots_dir) / "per_k.csv"),
                write_plot_csv(retrieval, Path(plots_dir) / "retrieval.csv")]
    return written
