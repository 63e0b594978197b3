"""Figures of arm_ebm: KL vs horizon with the 2*T*eps bound, first-token marginals, NLL curves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tasks.arm_ebm.config import ArmEbmConfig
from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult


def _plot_kl_vs_horizon(ax, rows: list[dict], title: str) -> None:
    for i, eps in enumerate(sorted({row["eps"] for row in rows})):
        horizons = sorted({row["T"] for row in rows if row["eps"] == eps})
        mean = [np.mean([row["mean_kl"] for row in rows if row["eps"] == eps and row["T"] == t]) for t in horizons]
        line = ax.plot(horizons, mean, marker="o", label=f"eps={eps:g}", color=f"C{i}")[0]
        ax.plot(horizons, [2 * t * eps for t in horizons], ls="--", color=line.get_color(), alpha=0.6)
    ax.set_yscale("log")
    ax.set_xlabel("horizon T")
    ax.set_ylabel("KL(p_R || p_q̂)  [nats]")
    ax.set_title(title)
    ax.legend()


def kl_vs_horizon(results: Sequence[SeedResult], path: Path) -> Path:
    """E4: mean KL(p_R || p_qhat) over draws and seeds against T, one line per eps, with 2*T*eps dashed: one toy
    per T (C4a, C4d) and, where measured, the first T tokens of one toy (C4b)."""
    fixed = "e4_fixed_toy_kl_vs_T" in results[0].tables
    fig, axes = new_figure(ncols=2 if fixed else 1)
    _plot_kl_vs_horizon(axes[0, 0], [row for r in results for row in r.tables["e4_kl_vs_T"]],
                        "One toy per T (dashed: 2Tε, project's bound)")
    if fixed:
        _plot_kl_vs_horizon(axes[0, 1], [row for r in results for row in r.tables["e4_fixed_toy_kl_vs_T"]],
                            "One toy, first T tokens (C4b; dashed: 2Tε)")
    return save_figure(fig, path)


def first_token_marginals(results: Sequence[SeedResult], path: Path, b: float, c: float) -> Path | None:
    """E2: p(y_1 | x=0) of the EBM, the exact ARM, GPT-2 and the myopic ARM (first seed)."""
    rows = results[0].tables.get("first_token_marginals_prompt0")
    if rows is None:
        return None
    fig, axes = new_figure()
    ax = axes[0, 0]
    width = 0.2
    tokens = np.array([row["token"] for row in rows])
    for i, name in enumerate(("ebm", "exact", "gpt2", "myopic")):
        ax.bar(tokens + (i - 1.5) * width, [row[name] for row in rows], width=width, label=name)
    ax.set_xticks(tokens)
    ax.set_xlabel("first token y_1")
    ax.set_ylabel("p(y_1 | x=0)")
    ax.set_title(f"First-token marginals (seed {results[0].seed}, b=c={b:g}/{c:g})")
    ax.legend()
    return save_figure(fig, path)


def _moving_average(values: Sequence[float], width: int) -> np.ndarray:
    width = max(1, min(width, len(values)))
    return np.convolve(np.asarray(values, dtype=float), np.ones(width) / width, mode="valid")


def nll_curves(results: Sequence[SeedResult], path: Path) -> Path | None:
    """Training curves: GPT-2's training cross-entropy above the entropy floor H(p_R) (an estimate of KL, smoothed),
    and the tabular ARM vs the tabular EBM on the same samples."""
    first = results[0]
    if "gpt2_train_nll" not in first.curves and "tabular_arm_nll" not in first.curves:
        return None
    fig, axes = new_figure(ncols=2)
    ax = axes[0, 0]
    if "gpt2_train_nll" in first.curves:
        for r in results:
            excess = np.asarray(r.curves["gpt2_train_nll"]) - r.metrics["e2_entropy_floor"]
            smooth = _moving_average(excess, 50)
            ax.plot(np.arange(len(smooth)) + 49, np.maximum(smooth, 1e-3), label=f"seed {r.seed}")
        ax.axhline(0.05, color="k", ls=":", label="C5a threshold 0.05")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_ylabel("train NLL - H(p_R)  [nats/sequence]")
        ax.set_title("GPT-2 ARM, population cross-entropy estimate (50-step mean)")
        ax.legend()
    ax = axes[0, 1]
    if "tabular_arm_nll" in first.curves:
        ax.plot(first.curves["tabular_arm_nll"], label="tabular ARM (teacher forcing)")
        ax.plot(first.curves["tabular_ebm_nll"], ls="--", label="tabular EBM (exact MLE)")
        ax.set_xlabel("Adam step")
        ax.set_ylabel("train NLL [nats/sequence]")
        ax.set_title(f"Supervised equivalence, tabular (seed {first.seed})")
        ax.legend()
    return save_figure(fig, path)


def make_figures(config: ArmEbmConfig, results: Sequence[SeedResult], figures_dir: Path, plots_dir: Path
                 ) -> list[Path]:
    """Every figure of the paper from the seeds' results, plus the CSV sources of ``dvc plots``."""
    made = [kl_vs_horizon(results, figures_dir / "kl_vs_horizon.png"),
            first_token_marginals(results, figures_dir / "first_token_marginals.png", config.toy.b, config.toy.c),
            nll_curves(results, figures_dir / "nll_curves.png")]
    write_plot_csv([row | {"seed": r.seed} for r in results for row in r.tables["e4_kl_vs_T"]],
                   plots_dir / "kl_vs_horizon.csv")
    if "e4_fixed_toy_kl_vs_T" in results[0].tables:
        write_plot_csv([row | {"seed": r.seed} for r in results for row in r.tables["e4_fixed_toy_kl_vs_T"]],
                       plots_dir / "fixed_toy_kl_vs_horizon.csv")
    if "gpt2_train_nll" in results[0].curves:
        write_plot_csv([{"step": i, "seed": r.seed, "nll": v} for r in results
                        for i, v in enumerate(r.curves["gpt2_train_nll"])], plots_dir / "gpt2_train_nll.csv")
    return [p for p in made if p is not None]
