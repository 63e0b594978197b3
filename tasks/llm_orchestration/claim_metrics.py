"""Every claim's number of llm_orchestration, derived from the measurements only (costs seconds to change)."""

from __future__ import annotations

from tasks.common.results import SeedResult
from tasks.llm_orchestration.config import LlmOrchestrationConfig


def _rate(m: dict[str, float], correct: str, trials: str) -> float:
    return m[correct] / m[trials] if m[trials] else float("nan")


def crossing_budget(orch_accuracy: float, joint_accuracy: dict[int, float]) -> float:
    """The smallest measured budget at which the joint model's accuracy reaches the orchestrator's; ``inf``
    when it does not at any measured budget (no value between budgets is interpolated)."""
    for budget in sorted(joint_accuracy):
        if joint_accuracy[budget] >= orch_accuracy:
            return float(budget)
    return float("inf")


def middle_budget(budgets: list[int]) -> int:
    """The middle of the increasing budgets, the lower one of an even count (100, 400, 1600, 6400 -> 400)."""
    return budgets[(len(budgets) - 1) // 2]


def overhead_knob_at_share(share: float, overhead_ms: float, total_ms: float, generated_tokens: float,
                           ms_per_token: float) -> float:
    """The controller cost per generated token at which (overhead) / (total latency) equals ``share``, every other
    cost fixed: the overhead and the total both move by ``x * generated_tokens`` with the knob x, so
    (A + xG) / (B + xG) = share gives x = (share B - A) / ((1 - share) G), A and B without the token part.
    Negative when the rest of the overhead already exceeds the share."""
    fixed_overhead = overhead_ms - ms_per_token * generated_tokens
    fixed_total = total_ms - ms_per_token * generated_tokens
    return (share * fixed_total - fixed_overhead) / ((1.0 - share) * generated_tokens)


def claim_metrics(cfg: LlmOrchestrationConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    if cfg.world is None:
        return {}
    out: dict[str, float] = {
        "vision_accuracy": _rate(m, "vision_v2_correct", "vision_trials"),
        "vision_v1_accuracy": _rate(m, "vision_v1_correct", "vision_trials"),
        "video_accuracy": _rate(m, "video_correct", "video_trials"),
        "asr_word_accuracy": _rate(m, "asr_words_correct", "asr_words"),
        "orch_qa_accuracy": _rate(m, "orch_qa_correct_vision_v2", "qa_trials"),
        "routing_accuracy": _rate(m, "routing_correct", "turns"),
        "routing_accuracy_held_out": _rate(m, "routing_correct_held_out", "held_out_turns"),
        "invalid_rate_constrained": _rate(m, "invalid_constrained", "turns"),
        "invalid_rate_free": _rate(m, "invalid_free", "turns"),
        "invalid_rate_free_sampled": _rate(m, "invalid_free_sampled", "turns"),
        "invalid_rate_constrained_sampled": _rate(m, "invalid_constrained_sampled", "turns"),
    }
    budgets = cfg.joint.budgets
    count_trials, direction_trials = m["qa_trials_count"], m["qa_trials_direction"]
    orch = {"all": out["orch_qa_accuracy"],
            "count": m["orch_image_qa_correct_vision_v2"] / count_trials,
            "direction": m["orch_video_qa_correct_vision_v2"] / direction_trials}
    out["orch_count_accuracy"], out["orch_direction_accuracy"] = orch["count"], orch["direction"]
    out["count_majority_rate"] = m["count_majority_correct"] / count_trials
    curves: dict[str, dict[int, float]] = {"all": {}, "count": {}, "direction": {}}
    for b in budgets:
        for kind in ("joint", "oracle") if b == cfg.joint.oracle_budget else ("joint",):
            out[f"{kind}_qa_accuracy_N{b}"] = _rate(m, f"{kind}_qa_correct_N{b}", "qa_trials")
            out[f"{kind}_count_accuracy_N{b}"] = m[f"{kind}_qa_correct_count_N{b}"] / count_trials
            out[f"{kind}_direction_accuracy_N{b}"] = m[f"{kind}_qa_correct_direction_N{b}"] / direction_trials
            out[f"{kind}_train_accuracy_N{b}"] = _rate(m, f"{kind}_train_correct_N{b}", f"{kind}_train_trials_N{b}")
        for q in curves:
            curves[q][b] = out[f"joint_{q}_accuracy_N{b}"] if q != "all" else out[f"joint_qa_accuracy_N{b}"]
        out[f"orch_minus_joint_N{b}"] = out["orch_qa_accuracy"] - out[f"joint_qa_accuracy_N{b}"]
    top = budgets[-1]
    # the fit precondition of C1: above always answering the most common count by 0.2 at the largest budget
    out["joint_count_margin_top"] = out[f"joint_count_accuracy_N{top}"] - out["count_majority_rate"]
    out["oracle_count_margin"] = out[f"oracle_count_accuracy_N{cfg.joint.oracle_budget}"] - out["count_majority_rate"]
    out["orch_minus_joint_low"] = out[f"orch_minus_joint_N{budgets[0]}"]
    out["orch_minus_joint_mid"] = out[f"orch_minus_joint_N{middle_budget(budgets)}"]
    out["joint_minus_orch_high"] = -out[f"orch_minus_joint_N{top}"]
    out["joint_gain_last_budget_step"] = (curves["all"][top] - curves["all"][budgets[-2]]) if len(budgets) > 1 \
        else float("nan")
    out["crossing_budget"] = crossing_budget(orch["all"], curves["all"])
    out["crossing_budget_count"] = crossing_budget(orch["count"], curves["count"])
    out["crossing_budget_direction"] = crossing_budget(orch["direction"], curves["direction"])
    # C4: expert calls saved by memory on sessions with follow-ups; accuracy cost of reuse
    calls_mem, calls_nomem = m["expert_calls_followup_sessions_mem"], m["expert_calls_followup_sessions_nomem"]
    out["expert_calls_saved_fraction"] = 1.0 - calls_mem / calls_nomem if calls_nomem else float("nan")
    out["memory_accuracy_drop"] = (m["session_correct_nomem"] - m["session_correct_mem"]) / m["turns"]
    out["session_accuracy_mem"] = m["session_correct_mem"] / m["turns"]
    # C2 (virtual clock): TTFA of parallel chunked TTS relative to sequential
    out["ttfa_parallel_over_sequential"] = m["ttfa_parallel_ms"] / m["ttfa_sequential_ms"]
    out["latency_mem_over_nomem"] = m["virtual_total_ms_mem"] / m["virtual_total_ms_nomem"]
    # C8: barge-in
    out["barge_in_all_pending_cancelled_rate"] = m["barge_ins_all_pending_cancelled"] / max(1.0, m["barge_ins"])
    # C5: controller + memory share of the virtual latency, and of the wall clock (measured)
    overhead = m["virtual_controller_ms_mem"] + m["virtual_memory_ms_mem"]
    out["overhead_share_virtual"] = overhead / m["virtual_total_ms_mem"]
    wall_overhead = m["wall_controller_s"] + m["wall_memory_and_execution_s"]
    wall_experts = (m["wall_asr_s"] + m["wall_vision_per_call_s"] * m["calls_vision_mem"]
                    + m["wall_video_per_call_s"] * m["calls_video_mem"])
    out["overhead_share_wall"] = wall_overhead / (wall_overhead + wall_experts)
    out["controller_ms_per_token_at_10pct"] = overhead_knob_at_share(
        0.1, m["virtual_controller_ms_mem"] + m["virtual_memory_ms_mem"], m["virtual_total_ms_mem"],
        m["controller_tokens_generated_mem"], cfg.clock.controller_ms_per_token)
    # C6: an expert swap passes through the orchestrator (system gain over the expert's own gain)
    trials = m["qa_count_trials"]
    system_gain = (m["orch_image_qa_correct_vision_v2"] - m["orch_image_qa_correct_vision_v1"]) / trials
    expert_gain = (m["image_qa_correct_vision_v2"] - m["image_qa_correct_vision_v1"]) / trials
    out["swap_expert_gain"] = expert_gain
    out["swap_system_gain"] = system_gain
    out["swap_gain_ratio"] = system_gain / expert_gain if expert_gain > 0 else float("nan")
    # the same system gain over the expert's standalone gain in exact scene descriptions (a harder task per item)
    standalone_gain = out["vision_accuracy"] - out["vision_v1_accuracy"]
    out["swap_standalone_gain"] = standalone_gain
    out["swap_gain_ratio_standalone"] = system_gain / standalone_gain if standalone_gain > 0 else float("nan")
    return out
