"""Figures of order_sensitivity, built from the per-seed results only (no recompute), and their CSV
sources for ``dvc plots``: (1) dispersion E|R| vs n with the a + b ln n fit, (2) hallucination vs
abstention for ISR-ranked and confidence-ranked gates, (3) Delta_bar and hallucination vs dose d."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.order_sensitivity.config import OrderSensitivityConfig
from tasks.order_sensitivity.measures import HALLUCINATION_DEFINITION


def _rows(results: Sequence[SeedResult], table: str) -> pl.DataFrame:
    return pl.DataFrame([row | {"seed": r.seed} for r in results for row in r.tables.get(table, [])])


def dispersion_figure(results: Sequence[SeedResult], frame: pl.DataFrame, path: Path) -> Path:
    fig, axes = new_figure(width=5.4)
    ax = axes[0, 0]
    for result in results:
        part = frame.filter(pl.col("seed") == result.seed).sort("n")
        n = part["n"].to_numpy()
        line = ax.plot(n, part["mean_abs_residual"].to_numpy(), marker="o", ms=3, label=f"seed {result.seed}")[0]
        m = result.metrics
        grid = np.geomspace(n.min(), n.max(), 50)
        ax.plot(grid, m["dispersion_log_intercept"] + m["dispersion_log_slope"] * np.log(grid), ls="--",
                color=line.get_color(), lw=1,
                label=f"a + b ln n, b = {m['dispersion_log_slope']:.3f} "
                      f"[{m['dispersion_log_slope_ci_low']:.3f}, {m['dispersion_log_slope_ci_high']:.3f}]")
    ax.set_xscale("log")
    ax.set_xlabel("n (evidence chunks, log axis)")
    ax.set_ylabel("E|R| = E|q_π − q̄| (mean over items)")
    ax.set_title("Order dispersion vs number of chunks (C1)")
    ax.legend(fontsize=6)
    return save_figure(fig, path)


def gate_figure(results: Sequence[SeedResult], frame: pl.DataFrame, path: Path) -> Path:
    fig, axes = new_figure(width=5.4)
    ax = axes[0, 0]
    summary = frame.group_by("abstention").agg(pl.col("isr_rank_hallucination").mean(),
                                               pl.col("confidence_hallucination").mean()).sort("abstention")
    ax.plot(summary["abstention"], 100 * summary["isr_rank_hallucination"], marker="o", ms=3, label="ranked by ISR")
    ax.plot(summary["abstention"], 100 * summary["confidence_hallucination"], marker="s", ms=3,
            label="ranked by confidence max(q̄, 1 − q̄)")
    for result in results:
        m = result.metrics
        ax.scatter([m["gate_abstention"]], [100 * m["gate_hallucination_answered"]], marker="*", s=60, color="k",
                   zorder=5)
    ax.scatter([], [], marker="*", color="k", label="ISR = 1 gate (one star per seed)")
    ax.set_xlabel("abstention rate")
    ax.set_ylabel("hallucination among answered [%]")
    ax.set_title("Gate: hallucination vs abstention (C7)")
    ax.text(0.01, -0.28, HALLUCINATION_DEFINITION, transform=ax.transAxes, fontsize=6)
    ax.legend()
    return save_figure(fig, path)


def dose_figure(frame: pl.DataFrame, path: Path) -> Path:
    summary = frame.group_by("dose").agg(pl.col("delta_bar").mean(), pl.col("delta_bar").std().alias("sd"),
                                         pl.col("ungated_hallucination").mean(),
                                         pl.col("gated_hallucination").mean()).sort("dose")
    fig, axes = new_figure(width=5.4)
    ax = axes[0, 0]
    ax.errorbar(summary["dose"], summary["delta_bar"], yerr=summary["sd"].fill_null(0.0), marker="o", capsize=2,
                label="Δ̄ (nats)")
    ax.set_xlabel("d (supporting chunks of L = 4)")
    ax.set_ylabel("information budget Δ̄ [nats]")
    twin = ax.twinx()
    twin.plot(summary["dose"], 100 * summary["ungated_hallucination"], marker="s", color="#d1495b",
              label="hallucination, ungated [%]")
    twin.plot(summary["dose"], 100 * summary["gated_hallucination"], marker="^", color="#2e933c",
              label="hallucination, ISR gate [%]")
    twin.set_ylabel("hallucination over items [%]")
    ax.legend(loc="upper left")
    twin.legend(loc="center right")
    ax.set_title("Dose-response (C6)")
    return save_figure(fig, path)


def make_figures(config: OrderSensitivityConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path
                 ) -> list[Path]:
    figures_dir, plots_dir = Path(figures_dir), Path(plots_dir)
    made = []
    dispersion = _rows(results, "dispersion_vs_n")
    made.append(dispersion_figure(results, dispersion, figures_dir / "dispersion_vs_n.png"))
    made.append(write_plot_csv(dispersion.to_dicts(), plots_dir / "dispersion_vs_n.csv"))
    gate = _rows(results, "gate_curve")
    made.append(gate_figure(results, gate, figures_dir / "gate_hallucination_vs_abstention.png"))
    made.append(write_plot_csv(gate.to_dicts(), plots_dir / "gate_hallucination_vs_abstention.csv"))
    dose = _rows(results, "dose_response")
    if dose.height:
        made.append(dose_figure(dose, figures_dir / "dose_response.png"))
        made.append(write_plot_csv(dose.to_dicts(), plots_dir / "dose_response.csv"))
    return made
