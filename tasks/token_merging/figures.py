"""Figures of token_merging, built from the per-seed results only (no recompute), and their CSV
sources for ``dvc plots``: accuracy vs r per method, the radial / angular cls error vs r, the residual
RMS drift per block, and the isotropic logit-scale study."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.token_merging.config import TokenMergingConfig

METHOD_LABELS = {"M1": "M1 plain average", "M2": "M2 ToMe prop. attn", "M3": "M3 + √r logit shrink",
                 "M4": "M4 = M3 + value scale", "M5": "M5 per-cluster κ", "M6": "M6 MLERP (ToFu)"}


M4_IS_M3_LABEL = "M3 √r logit shrink (= M4: energy matching picked e = 0)"


def m4_is_m3(results: Sequence[SeedResult]) -> bool:
    """Energy matching picked the value exponent e = 0 on every seed: M4 is then M3 exactly (its value scale
    r^(e/2) is 1), so the figures draw one line labelled as both instead of two identical ones."""
    return all(r.metrics.get("m4_value_exponent") == 0.0 for r in results)


def _rows(results: Sequence[SeedResult], table: str) -> pl.DataFrame:
    return pl.DataFrame([row | {"seed": r.seed} for r in results for row in r.tables[table]])


def _summary(frame: pl.DataFrame, keys: list[str], values: list[str]) -> pl.DataFrame:
    aggregations = [pl.col(v).mean().alias(f"{v}_mean") for v in values]
    aggregations += [pl.col(v).std(ddof=1).fill_null(0.0).alias(f"{v}_sd") for v in values]
    return frame.group_by(keys).agg(aggregations).sort(keys, descending=[False] + [True] * (len(keys) - 1))


def accuracy_vs_retention(sweep: pl.DataFrame, path: Path, labels: dict[str, str] = METHOD_LABELS) -> Path:
    fig, axes = new_figure(width=5.6)
    ax = axes[0, 0]
    for name in sorted(sweep["method"].unique()):
        part = sweep.filter(pl.col("method") == name).sort("retention")
        mean, sd = 100 * part["accuracy_mean"].to_numpy(), 100 * part["accuracy_sd"].to_numpy()
        ax.errorbar(part["retention"].to_numpy(), mean, yerr=sd, marker="o", ms=3, capsize=2,
                    label=labels.get(name, name))
    ax.invert_xaxis()
    ax.set_xlabel("retention r (patch tokens reaching the last block / all)")
    ax.set_ylabel("top-1 accuracy [%] (mean ± sd over seeds)")
    ax.set_title("Training-free merging: accuracy vs r")
    ax.legend()
    return save_figure(fig, path)


def cls_error_decomposition(sweep: pl.DataFrame, path: Path, labels: dict[str, str] = METHOD_LABELS) -> Path:
    """Stacked radial + angular parts of ||y - y_hat||^2 of the final cls residual, one panel per method."""
    methods = sorted(sweep["method"].unique())
    fig, axes = new_figure(ncols=3, nrows=(len(methods) + 2) // 3, width=11, height=3.2 * ((len(methods) + 2) // 3))
    top = float((sweep["radial_mean"] + sweep["angular_mean"]).max()) * 1.05 or 1.0
    for ax, name in zip(axes.ravel(), methods):
        part = sweep.filter(pl.col("method") == name).sort("retention")
        r = part["retention"].to_numpy()
        ax.stackplot(r, part["radial_mean"].to_numpy(), part["angular_mean"].to_numpy(),
                     labels=["radial (energy)", "angular (direction)"], alpha=0.8)
        ax.invert_xaxis()
        ax.set_ylim(0, top)
        ax.set_title(labels.get(name, name))
        ax.set_xlabel("retention r")
        ax.set_ylabel("cls ||y - ŷ||² (mean)")
    axes.ravel()[0].legend(loc="upper left")
    for ax in axes.ravel()[len(methods):]:
        ax.set_visible(False)
    return save_figure(fig, path)


def rms_drift(rms: pl.DataFrame, path: Path, labels: dict[str, str] = METHOD_LABELS) -> Path:
    """Residual RMS ratio (merged / unmerged) entering the last block vs r: the covariate shift of C1."""
    last = rms.filter(pl.col("block") == rms["block"].max())
    fig, axes = new_figure()
    ax = axes[0, 0]
    for name in sorted(last["method"].unique()):
        part = last.filter(pl.col("method") == name).sort("retention")
        ax.plot(part["retention"].to_numpy(), part["rms_ratio_mean"].to_numpy(), marker="o", ms=3,
                label=labels.get(name, name))
    ax.axhline(1.0, color="k", ls=":", lw=1)
    ax.invert_xaxis()
    ax.set_xlabel("retention r")
    ax.set_ylabel("residual RMS, merged / unmerged")
    ax.set_title("Covariate shift entering the last block")
    ax.legend()
    return save_figure(fig, path)


def isotropic_scale(iso: pl.DataFrame, path: Path) -> Path:
    fig, axes = new_figure(ncols=2, width=9)
    ax = axes[0, 0]
    r = iso["retention"].to_numpy()
    grid = np.linspace(r.min(), r.max(), 50)
    ax.errorbar(r, iso["optimal_scale_mean"].to_numpy(), yerr=iso["optimal_scale_sd"].to_numpy(), marker="o",
                ls="none", label="KL-optimal logit scale")
    ax.plot(grid, np.sqrt(grid), ls="--", label="√r")
    ax.fill_between(grid, np.sqrt(grid) - 0.07, np.sqrt(grid) + 0.07, alpha=0.15, label="check band ±0.07")
    ax.set_xlabel("retention r")
    ax.set_ylabel("scale a of q·k_c/√d")
    ax.set_title("Isotropic tokens (d=64, N=192)")
    ax.legend()
    ax = axes[0, 1]
    width = 0.35 * float(np.min(np.diff(np.sort(r)))) if len(r) > 1 else 0.05
    ax.bar(r - width / 2, iso["kl_prop_mean"].to_numpy(), width=width, label="proportional attention (a = 1)")
    ax.bar(r + width / 2, iso["kl_sqrt_r_mean"].to_numpy(), width=width, label="√r shrink")
    ax.set_xlabel("retention r")
    ax.set_ylabel("cluster-mass KL [nats]")
    ax.set_title("Cluster-mass KL to the unmerged attention")
    ax.legend()
    return save_figure(fig, path)


def make_figures(config: TokenMergingConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path
                 ) -> list[Path]:
    """PNGs in ``figures_dir`` and their CSV sources in ``plots_dir``, from the results only."""
    if not results:
        raise ValueError("make_figures: no results")
    figures_dir, plots_dir = Path(figures_dir), Path(plots_dir)
    sweep = _summary(_rows(results, "sweep"), ["method", "retention"],
                     ["accuracy", "radial", "angular", "realised_retention"])
    rms = _summary(_rows(results, "rms_per_block"), ["method", "retention", "block"], ["rms_ratio"])
    labels = METHOD_LABELS
    if m4_is_m3(results):  # one line for M3 = M4, not two identical ones (the CSVs keep every row)
        labels = METHOD_LABELS | {"M3": M4_IS_M3_LABEL}
        drawn_sweep, drawn_rms = (frame.filter(pl.col("method") != "M4") for frame in (sweep, rms))
    else:
        drawn_sweep, drawn_rms = sweep, rms
    iso = _summary(_rows(results, "isotropic"), ["retention"], ["optimal_scale", "kl_sqrt_r", "kl_prop"])
    paths = [
        write_plot_csv(sweep.sort(["method", "retention"]).to_dicts(), plots_dir / "accuracy_and_cls_error_vs_r.csv"),
        write_plot_csv(rms.sort(["method", "retention", "block"]).to_dicts(), plots_dir / "rms_ratio_per_block.csv"),
        write_plot_csv(iso.sort("retention").to_dicts(), plots_dir / "isotropic_scale.csv"),
        accuracy_vs_retention(drawn_sweep, figures_dir / "accuracy_vs_r.png", labels),
        cls_error_decomposition(drawn_sweep, figures_dir / "cls_error_radial_angular.png", labels),
        rms_drift(drawn_rms, figures_dir / "residual_rms_drift.png", labels),
        isotropic_scale(iso, figures_dir / "isotropic_logit_scale.png"),
    ]
    return paths
