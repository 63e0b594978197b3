"""Figures of select_to_think, built from the per-seed results only (no recompute), and their CSV
sources for ``dvc plots``: (1) hit@K vs K at divergence points; (2) accuracy of every method."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.select_to_think.config import SelectToThinkConfig

ACCURACY_METRICS = {
    "slm_greedy_accuracy": "SLM greedy",
    "slm_maj_accuracy": "SLM Maj@8",
    "s2t_random_trigger_accuracy": "S2T, random trigger",
    "s2t_accuracy": "S2T (KL trigger)",
    "takeover_accuracy": "Takeover (KL trigger)",
    "local_body_greedy_accuracy": "S2T-Local body, greedy",
    "local_entropy_accuracy": "S2T-Local, entropy trigger (no LLM)",
    "local_frozen_entropy_accuracy": "S2T-Local, body frozen (no LLM)",
    "llm_accuracy": "LLM alone",
}


def hit_rows(results: Sequence[SeedResult]) -> list[dict]:
    """hit@K per seed and K, with the exact chance level of the random ranking of the valid tokens at the same
    trigger steps (C1b; NaN where not measured, 1 at the whole vocabulary)."""
    return [{"seed": r.seed, "k": row["k"], "hit": row["hit"], "chance": chance_at(r, row["k"])}
            for r in results for row in r.tables["hit_at_k"]]


def chance_at(result: SeedResult, k: int) -> float:
    expected, triggers = result.metrics.get(f"chance_hit_at_{k}_expected"), result.metrics.get("trigger_count")
    if expected is not None and triggers:
        return expected / triggers
    return 1.0 if k == max(row["k"] for row in result.tables["hit_at_k"]) else float("nan")


def accuracy_rows(results: Sequence[SeedResult]) -> list[dict]:
    return [{"seed": r.seed, "method": label, "accuracy": r.metrics[name]}
            for r in results for name, label in ACCURACY_METRICS.items() if name in r.metrics]


def hit_at_k_figure(rows: list[dict], path: Path) -> Path:
    fig, axes = new_figure()
    ax = axes[0, 0]
    ks = sorted({row["k"] for row in rows})
    per_k = [[row["hit"] for row in rows if row["k"] == k] for k in ks]
    ax.errorbar(ks, [np.mean(v) for v in per_k], yerr=[np.std(v) for v in per_k], marker="o", capsize=3,
                label="SLM top-K")
    chance = [np.mean([row["chance"] for row in rows if row["k"] == k]) for k in ks]
    ax.plot(ks, chance, "--", marker="x", color="#b04a2f", label="chance (random order of the valid tokens)")
    ax.legend(loc="lower right", fontsize=8)
    for row in rows:
        ax.plot(row["k"], row["hit"], ".", color="grey", alpha=0.5)
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("K (SLM top-K; the last point is the whole vocabulary)")
    ax.set_ylabel("hit@K at KL-trigger steps")
    ax.set_title("Local sufficiency: LLM's choice in the SLM's top-K")
    return save_figure(fig, path)


def accuracy_figure(rows: list[dict], path: Path) -> Path:
    labels = [label for label in ACCURACY_METRICS.values() if any(r["method"] == label for r in rows)]
    values = [[r["accuracy"] for r in rows if r["method"] == label] for label in labels]
    fig, axes = new_figure(width=6.4, height=3.8)
    ax = axes[0, 0]
    y = np.arange(len(labels))
    ax.barh(y, [100 * np.mean(v) for v in values], xerr=[100 * np.std(v) for v in values], capsize=3,
            color="#1b6ca8")
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("final-answer accuracy on held-out problems [%] (mean ± sd over seeds)")
    ax.set_title("Addition with a chain of thought: tiny GPT-2 pair")
    return save_figure(fig, path)


def make_figures(config: SelectToThinkConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path
                 ) -> list[Path]:
    hits, accuracies = hit_rows(results), accuracy_rows(results)
    return [hit_at_k_figure(hits, Path(figures_dir) / "hit_at_k.png"),
            accuracy_figure(accuracies, Path(figures_dir) / "accuracy.png"),
            write_plot_csv(hits, Path(plots_dir) / "hit_at_k.csv"),
            write_plot_csv(accuracies, Path(plots_dir) / "accuracy.csv")]
