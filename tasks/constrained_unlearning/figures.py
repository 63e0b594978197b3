"""Figures of constrained_unlearning, from the per-seed results only (no recompute).

* ``samples.png``  DDPM samples before / after unlearning, one panel per model (first seed);
* ``tradeoff.png``  retention-unlearning plane: baseline sweeps as curves, the constrained runs as points;
* ``lambda_trajectories.png``  the dual variable against lambda* (Stage A grid and Stage B DDPM);
* ``data_unlearning.png``  Stage C memorisation ratio before / after FU data unlearning, per seed.
CSV plot sources for ``dvc plots`` go to the plots folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.constrained_unlearning.config import ConstrainedUnlearningConfig
from tasks.constrained_unlearning.method import FORMULATIONS

Results = Sequence[SeedResult]


def samples_figure(results: Results, path: Path) -> Path | None:
    rows = results[0].tables.get("samples")
    if not rows:
        return None
    frame = pl.DataFrame(rows)
    methods = list(dict.fromkeys(frame["method"].to_list()))
    fig, axes = new_figure(ncols=len(methods), width=2.4 * len(methods), height=2.6)
    for ax, name in zip(axes[0], methods):
        points = frame.filter(pl.col("method") == name)
        ax.scatter(points["x"], points["y"], s=2, alpha=0.5)
        ax.set_title(name.upper() if len(name) == 2 else name)
        ax.set_aspect("equal")
    fig.suptitle(f"DDPM samples before / after unlearning (seed {results[0].seed})")
    return save_figure(fig, path)


def tradeoff_figure(results: Results, path: Path) -> Path | None:
    rows = [row | {"seed": r.seed} for r in results for row in r.tables.get("tradeoff", [])]
    if not rows:
        return None
    fig, axes = new_figure(width=6.0, height=4.2)
    ax = axes[0, 0]
    frame = pl.DataFrame(rows)
    for i, family in enumerate(f for f in dict.fromkeys(frame["family"].to_list())
                               if f not in ("constrained", "pretrained")):
        part = frame.filter(pl.col("family") == family).group_by("param").agg(
            pl.col("forget_mass").mean(), pl.col("retained_kl").mean()).sort("forget_mass")
        ax.plot(part["forget_mass"], part["retained_kl"], marker="o", ms=3, color=f"C{i}", label=f"{family} (sweep)")
    constrained = frame.filter(pl.col("family") == "constrained")
    for j, name in enumerate(dict.fromkeys(constrained["method"].to_list())):
        part = constrained.filter(pl.col("method") == name)
        ax.scatter(part["forget_mass"], part["retained_kl"], marker="*", s=90, color=f"C{4 + j}", label=name,
                   zorder=3)
    pretrained = frame.filter(pl.col("family") == "pretrained")
    ax.scatter(pretrained["forget_mass"], pretrained["retained_kl"], marker="x", color="k", label="pretrained")
    ax.set_xlabel("forget-mode mass (lower = more unlearning)")
    ax.set_ylabel("retained-region KL to pretrained samples")
    ax.set_yscale("log")
    ax.set_title("Retention vs unlearning (every seed)")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def lambda_figure(results: Results, path: Path) -> Path:
    fig, axes = new_figure(ncols=3, nrows=2, width=12.0, height=6.0)
    for col, f in enumerate(FORMULATIONS):
        for row, stage in enumerate(("a", "b")):
            ax = axes[row, col]
            for r in results:
                curve = r.curves.get(f"{stage}_lambda_{f}")
                if curve:
                    line, = ax.plot(np.arange(1, len(curve) + 1), curve, label=f"seed {r.seed}")
                    reference = r.curves.get(f"b_lambda_{f}_analytic") if stage == "b" else None
                    if reference:  # the analytic reference run, dotted in the same colour
                        ax.plot(np.arange(1, len(reference) + 1), reference, ls=":", color=line.get_color())
                ax.axhline(r.metrics[f"a_lambda_star_{f}"], ls="--", color="k", alpha=0.4)
            ax.set_title(f"{f.upper()}: {'grid iterations' if stage == 'a' else 'DDPM (dotted: analytic reference)'}")
            ax.set_xlabel("iteration" if stage == "a" else "dual update")
            ax.set_ylabel("lambda (dashed: lambda_b of the threshold)")
            ax.legend(fontsize=6)
    return save_figure(fig, path)


def data_unlearning_figure(results: Results, path: Path) -> Path | None:
    """Stage C: memorisation ratio (near-sample fraction at the forget points / at held-out twins) of the
    retrain reference, the model fine-tuned with duplicates, and after FU data unlearning, per seed."""
    if "c_fu_memorisation_ratio" not in results[0].metrics:
        return None
    fig, axes = new_figure(width=5.5, height=3.6)
    ax = axes[0, 0]
    stages = ("retrain", "memorised", "fu")
    width = 0.8 / len(results)
    for j, r in enumerate(results):
        values = [r.metrics[f"c_{stage}_memorisation_ratio"] for stage in stages]
        ax.bar(np.arange(len(stages)) + (j - (len(results) - 1) / 2) * width, values, width, label=f"seed {r.seed}")
    ax.axhline(1.0, color="k", ls="--", alpha=0.5, label="held-out level")
    ax.set_xticks(np.arange(len(stages)), ["retrain (no duplicates)", "fine-tuned with duplicates", "after FU"])
    ax.set_ylabel("near fraction: forget / held-out")
    ax.set_title("Data unlearning: memorisation proxy")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def lambda_curve_run(name: str) -> str:
    """The run a lambda curve belongs to, from its result key ``<stage>_lambda_<run>``: ``ru``, ``ru_analytic``, ...
    (the analytic reference keeps its own label in plots/lambda_trajectories.csv)."""
    return name.split("_lambda_", 1)[1]


def make_figures(config: ConstrainedUnlearningConfig, results: Results, figures_dir: Path, plots_dir: Path
                 ) -> list[Path]:
    """PNG figures and CSV plot sources; ``config`` is unused (everything needed is in the results)."""
    made = [samples_figure(results, figures_dir / "samples.png"),
            tradeoff_figure(results, figures_dir / "tradeoff.png"),
            lambda_figure(results, figures_dir / "lambda_trajectories.png"),
            data_unlearning_figure(results, figures_dir / "data_unlearning.png")]
    tradeoff = [row | {"seed": r.seed} for r in results for row in r.tables.get("tradeoff", [])]
    if tradeoff:
        made.append(write_plot_csv(tradeoff, plots_dir / "tradeoff.csv"))
    lambdas = [{"seed": r.seed, "stage": name[0], "formulation": lambda_curve_run(name), "step": i, "lambda": v}
               for r in results for name, curve in r.curves.items() if "_lambda_" in name
               for i, v in enumerate(curve)]
    made.append(write_plot_csv(lambdas, plots_dir / "lambda_trajectories.csv"))
    return [p for p in made if p is not None]
