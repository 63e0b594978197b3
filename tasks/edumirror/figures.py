"""Figures of edumirror: victim need trajectories (the paper's Figure 5 analogue), per-need change by teacher
branch (Figure 6 analogue), contribution rate against the SVO angle, and the Surveyor's validity against the
response noise."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.edumirror.config import EdumirrorConfig
from tasks.edumirror.method import NEED_NAMES


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of a normal 95% interval over the values (0 for a single value)."""
    v = np.asarray(values, dtype=np.float64)
    half = 1.96 * v.std(ddof=1) / np.sqrt(len(v)) if len(v) > 1 else 0.0
    return float(v.mean()), float(half)


def make_figures(cfg: EdumirrorConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path) -> list[Path]:
    written = []
    fig, axes = new_figure(ncols=2)
    series: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in results:
        for row in r.tables["e1_trajectories"]:
            series[(row["condition"], row["tick"])].append(row["composite"])
    rows = []
    for condition in ("healthy", "vulnerable"):
        ticks = sorted(t for c, t in series if c == condition)
        stats = [mean_ci(series[(condition, t)]) for t in ticks]
        means = np.array([s[0] for s in stats])
        halves = np.array([s[1] for s in stats])
        axes[0, 0].plot(ticks, means, label=f"{condition} victim")
        axes[0, 0].fill_between(ticks, means - halves, means + halves, alpha=0.3)
        rows += [{"condition": condition, "tick": t, "mean": m, "ci_half": h}
                 for t, m, h in zip(ticks, means, halves, strict=True)]
    axes[0, 0].set(xlabel="tick", ylabel="victim composite need (0-10)", title="E1 bullying (95% CI, classrooms)")
    axes[0, 0].legend()
    goal_series: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in results:
        for row in r.tables["e2_trajectories"]:
            goal_series[(row["goal"], row["tick"])].append(row["composite"])
    for goal in ("neglect", "punitive", "individual", "cooperative"):
        ticks = sorted(t for g, t in goal_series if g == goal)
        axes[0, 1].plot(ticks, [np.mean(goal_series[(goal, t)]) for t in ticks], label=goal)
    axes[0, 1].axvline(cfg.scenario.branch_tick, color="grey", linestyle=":")
    axes[0, 1].set(xlabel="tick", ylabel="victim composite need", title="E2 branches from a shared checkpoint")
    axes[0, 1].legend()
    written += [save_figure(fig, Path(figures_dir) / "need_trajectories.png"),
                write_plot_csv(rows, Path(plots_dir) / "need_trajectories.csv")]

    fig, axes = new_figure(ncols=1, width=9)
    deltas: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in results:
        for row in r.tables["e2_need_deltas"]:
            deltas[(row["goal"], row["need"])].append(row["delta"])
    goals = ("punitive", "individual", "cooperative")
    positions, data, labels = [], [], []
    for k, need in enumerate(NEED_NAMES):
        for g, goal in enumerate(goals):
            positions.append(k * 4 + g)
            data.append(deltas[(goal, need)])
            labels.append(f"{need[:4]}/{goal[:4]}")
    axes[0, 0].boxplot(data, positions=positions, widths=0.8)
    axes[0, 0].set_xticks(positions, labels, rotation=90, fontsize=6)
    axes[0, 0].axhline(0.0, color="grey", linestyle=":")
    axes[0, 0].set(ylabel="victim need change vs neglect (tick end)", title="E2 per-need change by teacher goal")
    written += [save_figure(fig, Path(figures_dir) / "need_change_by_branch.png"),
                write_plot_csv([{"goal": g, "need": n, "mean": float(np.mean(v)), "count": len(v)}
                                for (g, n), v in sorted(deltas.items())],
                               Path(plots_dir) / "need_change_by_branch.csv")]

    fig, axes = new_figure(ncols=2)
    pg: dict[float, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        for row in r.tables["public_goods"]:
            pg[row["theta"]]["value"].append(row["contribution_rate"])
            pg[row["theta"]]["random"].append(row["random_contribution_rate"])
    thetas = sorted(pg)
    pg_rows = []
    for name, label in (("value", "value-driven"), ("random", "random policy")):
        stats = [mean_ci(pg[t][name]) for t in thetas]
        axes[0, 0].errorbar(thetas, [s[0] for s in stats], yerr=[s[1] for s in stats], marker="o", label=label)
        pg_rows += [{"policy": label, "theta": t, "mean": s[0], "ci_half": s[1]}
                    for t, s in zip(thetas, stats, strict=True)]
    axes[0, 0].set(xlabel="SVO angle theta (deg)", ylabel="contribution rate", title="E3 public-goods game")
    axes[0, 0].legend()
    grid: dict[float, list[float]] = defaultdict(list)
    for r in results:
        for row in r.tables["survey_noise_grid"]:
            grid[row["noise_sd"]].append(row["surveyor_need_r"])
    noise = sorted(grid)
    axes[0, 1].plot(noise, [np.mean(grid[n]) for n in noise], marker="o")
    axes[0, 1].axhline(0.8, color="grey", linestyle=":")
    axes[0, 1].set(xlabel="Surveyor response noise (scale points)", ylabel="need scale r with latent need",
                   title="Surveyor validity vs response noise")
    written += [save_figure(fig, Path(figures_dir) / "cooperation_and_survey.png"),
                write_plot_csv(pg_rows, Path(plots_dir) / "contribution_vs_theta.csv"),
                write_plot_csv([{"noise_sd": n, "need_r": float(np.mean(grid[n]))} for n in noise],
                               Path(plots_dir) / "survey_noise_grid.csv")]
    return written
