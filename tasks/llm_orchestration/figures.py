"""Figures of llm_orchestration: QA accuracy against the paired-data budget (the joint model's curve against the
orchestrator's flat line), and the virtual-clock latency by component with and without memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.figures import new_figure, save_figure, write_plot_csv
from tasks.common.results import SeedResult
from tasks.llm_orchestration.config import LlmOrchestrationConfig

COMPONENTS = ("asr", "controller", "memory", "vision", "video", "tts_first_audio")


def make_figures(cfg: LlmOrchestrationConfig, results: list[SeedResult], figures_dir: Path, plots_dir: Path
                 ) -> list[Path]:
    if cfg.world is None:
        return []
    budgets = cfg.joint.budgets
    fig, axes = new_figure(ncols=2)
    rows = []
    for r in results:
        m = r.metrics
        joint = [m[f"joint_qa_correct_N{b}"] / m["qa_trials"] for b in budgets]
        joint_count = [m[f"joint_qa_correct_count_N{b}"] / m["qa_trials_count"] for b in budgets]
        oracle_count = m[f"oracle_qa_correct_count_N{cfg.joint.oracle_budget}"] / m["qa_trials_count"]
        orch = m["orch_qa_correct_vision_v2"] / m["qa_trials"]
        majority = m["count_majority_correct"] / m["qa_trials_count"]
        first = r is results[0]
        axes[0, 0].plot(budgets, joint, "o-", color="tab:red", alpha=0.6, label="joint model, all" if first else None)
        axes[0, 0].plot(budgets, joint_count, "s--", color="tab:orange", alpha=0.6,
                        label="joint model, count questions" if first else None)
        axes[0, 0].plot([cfg.joint.oracle_budget], [oracle_count], "^", color="tab:green", alpha=0.6,
                        label="capacity check (true scene), count" if first else None)
        axes[0, 0].axhline(orch, color="tab:blue", alpha=0.6, label="orchestrator (no paired data)" if first else None)
        axes[0, 0].axhline(majority, color="grey", ls=":", alpha=0.6,
                           label="most common count" if first else None)
        rows += [{"seed": r.seed, "budget": b, "joint_accuracy": a, "joint_count_accuracy": c,
                  "oracle_count_accuracy": oracle_count if b == cfg.joint.oracle_budget else float("nan"),
                  "orchestrator_accuracy": orch, "count_majority_rate": majority}
                 for b, a, c in zip(budgets, joint, joint_count, strict=True)]
    axes[0, 0].set(xscale="log", xlabel="paired QA examples N", ylabel="single-turn QA accuracy",
                   title="orchestration vs joint training")
    axes[0, 0].legend(fontsize=7)
    latency_rows = []
    bottoms = np.zeros(2)
    for component in COMPONENTS:
        values = np.array([np.mean([r.metrics[f"virtual_{component}_ms_{tag}"] / r.metrics["turns"] for r in results])
                           for tag in ("mem", "nomem")])
        axes[0, 1].bar(["memory", "no memory"], values, bottom=bottoms, label=component)
        bottoms += values
        latency_rows += [{"variant": v, "component": component, "ms_per_turn": float(x)}
                         for v, x in zip(("memory", "no memory"), values, strict=True)]
    axes[0, 1].set(ylabel="virtual ms per turn (mean over seeds)", title="latency waterfall (virtual clock)")
    axes[0, 1].legend(fontsize=7)
    return [save_figure(fig, Path(figures_dir) / "budget_curve_and_latency.png"),
            write_plot_csv(rows, Path(plots_dir) / "budget_curve.csv"),
            write_plot_csv(latency_rows, Path(plots_dir) / "latency_waterfall.csv")]
