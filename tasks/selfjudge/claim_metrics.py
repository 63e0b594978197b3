"""Every derived number the claims of selfjudge read (claims.yaml), from the measurements only: speed-ups of
judge decoding over exact speculative decoding at the pre-registered threshold, accuracy differences, the
comparison with top-K and AutoJudge at equal speed, and the test bed's preconditions."""

from __future__ import annotations

import math

from tasks.common.results import SeedResult
from tasks.selfjudge import method
from tasks.selfjudge.config import SelfJudgeConfig


def row(table: list[dict], task: str, name: str) -> dict | None:
    return next((r for r in table if r["task"] == task and r["method"] == name), None)


def sweep(table: list[dict], task: str, family: str) -> list[tuple[float, float]]:
    return [(r["tokens_per_call"], r["accuracy"]) for r in table if r["task"] == task and r["family"] == family]


def bracket_gap(points: list[tuple[float, float]], speed: float) -> float:
    """Width in tokens per target call of the sweep interval that ``method.accuracy_at_speed`` interpolates
    across at ``speed``: the distance between the nearest swept speeds at or below and at or above it (0 when
    a swept point sits at ``speed``); NaN when ``speed`` lies outside the sweep. A wide gap means the
    interpolated accuracy is a straight line between two far-apart measurements, not a measurement."""
    speeds = sorted({float(s) for s, _ in points})
    below = [s for s in speeds if s <= speed]
    above = [s for s in speeds if s >= speed]
    if not below or not above:
        return math.nan
    return above[0] - below[-1]


def is_lossless_method(r: dict) -> bool:
    """Exact speculative decoding and judge decoding at threshold 0 must reproduce the target (identity I1)."""
    return r["family"] == "exact" or (r["family"] == "selfjudge" and r["knob"] == 0)


def task_metrics(cfg: SelfJudgeConfig, table: list[dict], task: str) -> dict[str, float]:
    exact = row(table, task, "exact")
    judge = row(table, task, f"selfjudge@{cfg.decoding.decision_threshold:g}")
    if exact is None or judge is None:
        return {}
    judge_sweep = sweep(table, task, "selfjudge")
    k = cfg.decoding.top_ks[0]
    topk = row(table, task, f"top{k}")
    out = {f"{task}_exact_acceptance_rate": exact["acceptance_rate"],
           f"{task}_exact_accepted_draft": exact["accepted_draft"], f"{task}_exact_drafted": exact["drafted"],
           f"{task}_exact_tokens_per_call": exact["tokens_per_call"],
           f"{task}_exact_accuracy": exact["accuracy"],
           f"{task}_judge_tokens_per_call": judge["tokens_per_call"],
           f"{task}_judge_speedup": judge["tokens_per_call"] / exact["tokens_per_call"],
           f"{task}_judge_accuracy": judge["accuracy"], f"{task}_judge_correct": judge["correct"],
           f"{task}_judge_accuracy_change": judge["accuracy"] - exact["accuracy"],
           f"{task}_lossless_violations": sum(r["prompts"] - r["identical_to_target"] for r in table
                                              if r["task"] == task and is_lossless_method(r))}
    if topk is not None:
        out |= {f"{task}_topk_speedup": topk["tokens_per_call"] / exact["tokens_per_call"],
                f"{task}_topk_accuracy_drop": exact["accuracy"] - topk["accuracy"],
                f"{task}_judge_minus_topk_at_equal_speed":
                    method.accuracy_at_speed(judge_sweep, topk["tokens_per_call"]) - topk["accuracy"],
                f"{task}_topk_speed_bracket_gap": bracket_gap(judge_sweep, topk["tokens_per_call"])}
    auto = row(table, task, f"autojudge@{cfg.decoding.decision_threshold:g}")
    if auto is not None:
        out |= {f"{task}_autojudge_speedup": auto["tokens_per_call"] / exact["tokens_per_call"],
                f"{task}_autojudge_accuracy_change": auto["accuracy"] - exact["accuracy"],
                f"{task}_judge_minus_autojudge_at_equal_speed":
                    method.accuracy_at_speed(judge_sweep, auto["tokens_per_call"]) - auto["accuracy"],
                f"{task}_autojudge_speed_bracket_gap": bracket_gap(judge_sweep, auto["tokens_per_call"])}
    return out


def claim_metrics(cfg: SelfJudgeConfig, result: SeedResult) -> dict[str, float]:
    table = result.tables.get("decoding", [])
    out: dict[str, float] = {}
    for task in sorted({r["task"] for r in table}):
        out |= task_metrics(cfg, table, task)
    m = result.metrics
    if "arith_lossless_violations" in out or "desc_lossless_violations" in out:
        out["lossless_violations"] = out.get("arith_lossless_violations", 0) + out.get("desc_lossless_violations", 0)
    if "autojudge_agreement_auroc" not in m:
        out["autojudge_agreement_auroc"] = math.nan
    return out
