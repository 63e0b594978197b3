"""Figures of multi_model_curation, built from the per-seed results only (no recomputation):
alignment trajectories per config, the influence heat map over (coupling, beta_1), and the sign
table (analytic vs sampled chords, from the claim metrics). CSV plot sources go to plots_dir for
``dvc plots``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult

COUPLED = ("dampen", "cross_invert", "self_invert")
Results = Sequence[SeedResult]


def sign_rows(result: SeedResult) -> list[dict]:
    """One row per (config, model, K): the sampled chord of this seed, the K -> infinity chord and whether
    their signs agree (the per-seed claim metrics ``<config>_dA<i>_<ksmall|klarge>``)."""
    rows = []
    for row in result.tables["sampled_fixed_points"]:
        sampled = result.metrics[f"{row['config']}_dA{row['model']}_{row['label']}"]
        analytic = result.metrics[f"analytic_{row['config']}_dA{row['model']}"]
        rows.append({"config": row["config"], "model": row["model"], "K": row["K"], "beta1_low": row["beta1_low"],
                     "beta1_high": row["beta1_high"], "sampled_chord": sampled, "analytic_chord": analytic,
                     "sign_match": float(np.sign(sampled) == np.sign(analytic))})
    return rows


def alignment_trajectories(results: Results, path: Path) -> Path | None:
    """A_i(t) of the sampled loops at K = k_large (every seed, thin) with the K -> infinity fixed point."""
    first = results[0]
    if f"sampled_{COUPLED[0]}_A1" not in first.curves:
        return None
    fig, axes = new_figure(ncols=3)
    for ax, name in zip(axes[0], COUPLED):
        for i, color in ((0, "C0"), (1, "C1")):
            for r in results:
                ax.plot(r.curves[f"sampled_{name}_A{i + 1}"], color=color, alpha=0.5, lw=0.9)
            ax.axhline(first.metrics[f"analytic_{name}_A{i + 1}"], color=color, ls="--", lw=1.0,
                       label=f"model {i + 1} (dashed: K→∞)")
        ax.set_title(name.replace("_", "-"))
        ax.set_xlabel("round t")
        ax.set_ylabel("alignment A_i(t)")
        ax.legend()
    return save_figure(fig, path)


def influence_heatmap(results: Results, path: Path) -> Path:
    """I_21 (cross), I_11 (self) and the net effect on A_1 + A_2 over (coupling, beta_1); analytic."""
    rows = results[0].tables["influence_heatmap"]
    couplings = sorted({r["coupling"] for r in rows})
    betas = sorted({r["beta1"] for r in rows})
    fig, axes = new_figure(ncols=3, width=15.5, height=3.6)
    for ax, key, title in zip(axes[0], ("I11", "I21", "net_beta1"),
                              ("self-influence ∂A₁/∂β₁", "cross-influence ∂A₂/∂β₁", "net ∂(A₁+A₂)/∂β₁")):
        grid = np.array([[next(r[key] for r in rows if r["coupling"] == c and r["beta1"] == b) for b in betas]
                         for c in couplings])
        # Symmetric log-like colour scale: the values span three orders of magnitude.
        scaled = np.sign(grid) * np.log10(1 + np.abs(grid) / 1e-3)
        limit = float(np.max(np.abs(scaled))) or 1.0
        image = ax.imshow(scaled, origin="lower", aspect="auto", cmap="RdBu", vmin=-limit, vmax=limit)
        ax.set_xticks(range(len(betas)), [f"{b:g}" for b in betas])
        ax.set_yticks(range(len(couplings)), [f"{c:g}" for c in couplings])
        ax.set_xlabel("β₁ (curation strength of model 1)")
        ax.set_ylabel("coupling W₁₂ = W₂₁")
        ax.set_title(title)
        ax.grid(False)
        fig.colorbar(image, ax=ax, label="sign·log10(1+|I|/1e-3)")
    return save_figure(fig, path)


def sign_table(results: Results, path: Path) -> Path | None:
    """Sampled chords ΔA_i/Δβ_1 per seed against the K -> infinity chord, per config, model and K."""
    if "sampled_fixed_points" not in results[0].tables:
        return None
    fig, axes = new_figure(width=7.0, height=3.6)
    ax = axes[0, 0]
    tables = [sign_rows(r) for r in results]
    keys = [(r["config"], r["model"], r["K"]) for r in tables[0]]
    for x, key in enumerate(keys):
        rows = [row for table in tables for row in table if (row["config"], row["model"], row["K"]) == key]
        ax.scatter([x] * len(rows), [row["sampled_chord"] for row in rows], color="C0", s=12,
                   label="sampled (per seed)" if x == 0 else None)
        ax.scatter([x], [rows[0]["analytic_chord"]], color="C1", marker="_", s=200,
                   label="K→∞ prediction" if x == 0 else None)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks(range(len(keys)), [f"{c.replace('_', '-')}\nA{m} K={k}" for c, m, k in keys], rotation=60,
                  fontsize=7)
    ax.set_ylabel("ΔA_i / Δβ₁")
    ax.set_title("Effect of curating model 1: sign agreement")
    ax.legend()
    return save_figure(fig, path)


def survey_and_mixture(results: Results, path: Path) -> Path | None:
    """Issue 19. Left: model 1's chord sampled at K = 16 and 64 against its K -> infinity chord, for the survey's
    sampled draws of every seed (below 0 on both axes: self-inversion kept). Right: the self-invert chords
    with 3-component mixture generators and with the single-Gaussian control, per seed."""
    first = results[0]
    if "survey_sampled" not in first.tables or "mixture_self_invert" not in first.tables:
        return None
    fig, axes = new_figure(ncols=2, width=9.0, height=3.8)
    ax = axes[0, 0]
    for label, color, k_name in (("ksmall", "C0", "K = 16"), ("klarge", "C1", "K = 64")):
        rows = [row for r in results for row in r.tables["survey_sampled"] if row["label"] == label]
        ax.scatter([row["analytic_dA1"] for row in rows], [row["sampled_dA1"] for row in rows], s=14, color=color,
                   marker="o", alpha=0.7, label=k_name)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.axvline(0.0, color="k", lw=0.8)
    ax.set_xlabel("K→∞ chord ΔA₁/Δβ₁")
    ax.set_ylabel("sampled chord ΔA₁/Δβ₁")
    ax.set_title("Drawn configurations (prior fixed before the run)")
    ax.legend()
    ax = axes[0, 1]
    names = ("dA1", "dA2", "dsum")
    for offset, (prefix, color, label) in enumerate((("mixture", "C2", "3-Gaussian mixture (EM)"),
                                                      ("gaussian_control", "C3", "single Gaussian"))):
        for x, name in enumerate(names):
            values = [r.metrics[f"{prefix}_self_invert_{name}"] for r in results]
            ax.scatter([x + 0.15 * (2 * offset - 1)] * len(values), values, color=color, s=14,
                       label=label if x == 0 else None)
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks(range(len(names)), ["model 1", "peer", "A₁ + A₂"])
    ax.set_ylabel("ΔA / Δβ₁ (β₁ 0.6 → 4, K = 64)")
    ax.set_title("Self-invert config: generator class")
    ax.legend()
    return save_figure(fig, path)


def make_figures(config: Any, results: Results, figures_dir: Path, plots_dir: Path) -> list[Path]:
    """Every PNG and CSV plot source of the paper from the per-seed results."""
    figures_dir, plots_dir = Path(figures_dir), Path(plots_dir)
    made = [alignment_trajectories(results, figures_dir / "alignment_trajectories.png"),
            influence_heatmap(results, figures_dir / "influence_heatmap.png"),
            sign_table(results, figures_dir / "sign_table.png"),
            survey_and_mixture(results, figures_dir / "survey_and_mixture.png")]
    write_plot_csv([dict(row) for row in results[0].tables["influence_heatmap"]],
                   plots_dir / "influence_heatmap.csv")
    if "sampled_fixed_points" in results[0].tables:
        write_plot_csv([row | {"seed": r.seed} for r in results for row in sign_rows(r)], plots_dir / "sign_table.csv")
        trajectory_rows = [{"seed": r.seed, "config": name, "round": t, "A1": a1, "A2": a2}
                           for r in results for name in COUPLED
                           for t, (a1, a2) in enumerate(zip(r.curves[f"sampled_{name}_A1"],
                                                            r.curves[f"sampled_{name}_A2"]))]
        write_plot_csv(trajectory_rows, plots_dir / "alignment_trajectories.csv")
    if "survey_sampled" in results[0].tables:
        write_plot_csv([{key: row[key] for key in ("index", "random", "inverting", "K", "analytic_dA1",
                                                   "sampled_dA1", "analytic_dA2", "sampled_dA2")} | {"seed": r.seed}
                        for r in results for row in r.tables["survey_sampled"]], plots_dir / "survey_sampled.csv")
    return [p for p in made if p is not None]
