"""Every claim's number of cacr, derived from the evaluation's measurements only."""

from __future__ import annotations

from tasks.cacr.config import QUESTION_TYPES, CacrConfig
from tasks.common.results import SeedResult


def claim_metrics(cfg: CacrConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    misses = m["candidate_miss_count"]
    hits = m["candidate_hit_count"]
    rate = lambda count: count / misses if misses else float("nan")

    def balanced_accuracy(policy: str) -> float:
        """Mean of the reject rate on misses and the accept rate on hits (0.5 for either trivial policy)."""
        if not misses or not hits:
            return float("nan")
        rejected_misses = misses - m[f"{policy}_false_grounding_count"]
        return 0.5 * (rejected_misses / misses + m[f"{policy}_accept_on_hit_count"] / hits)

    trivial_accuracy = max(m["candidate_miss_rate"], 1.0 - m["candidate_miss_rate"])
    per_type = {f"full_minus_top1_miou_{t}": m[f"grpo_full_miou_{t}"] - m[f"top1_miou_{t}"] for t in QUESTION_TYPES}
    return {
        **per_type,
        "candidate_recall_r05_minus_random": m["candidate_recall_0.5"] - m["random_vbcs_candidate_recall_0.5"],
        "full_minus_no_action_miou_hit": m["grpo_full_miou_hit"] - m["grpo_no_action_miou_hit"],
        "full_reject_balanced_accuracy": balanced_accuracy("grpo_full"),
        "sft_reject_balanced_accuracy": balanced_accuracy("sft"),
        "no_reward_reject_balanced_accuracy": balanced_accuracy("grpo_no_reward"),
        "full_minus_sft_reject_balanced_accuracy": balanced_accuracy("grpo_full") - balanced_accuracy("sft"),
        "full_minus_no_reward_reject_balanced_accuracy": balanced_accuracy("grpo_full")
        - balanced_accuracy("grpo_no_reward"),
        "full_reject_accuracy_margin_over_trivial": m["grpo_full_reject_correct_count"] / m["test_questions"]
        - trivial_accuracy,
        "candidate_recall_gain_r05": m["candidate_recall_0.5"] - m["top1_r1_0.5"],
        "full_minus_top1_miou": m["grpo_full_miou"] - m["top1_miou"],
        "full_minus_dense_miou": m["grpo_full_miou"] - m["dense_miou"],
        "full_minus_top1_r05": m["grpo_full_r1_0.5"] - m["top1_r1_0.5"],
        "full_minus_dense_r05": m["grpo_full_r1_0.5"] - m["dense_r1_0.5"],
        "full_minus_no_action_miou_miss": m["grpo_full_miou_miss"] - m["grpo_no_action_miou_miss"],
        "full_minus_no_action_miou": m["grpo_full_miou"] - m["grpo_no_action_miou"],
        "full_false_grounding_rate": rate(m["grpo_full_false_grounding_count"]),
        "no_reward_false_grounding_rate": rate(m["grpo_no_reward_false_grounding_count"]),
        "sft_false_grounding_rate": rate(m["sft_false_grounding_count"]),
        "no_reward_minus_full_false_grounding": rate(m["grpo_no_reward_false_grounding_count"])
        - rate(m["grpo_full_false_grounding_count"]),
        "full_reject_accuracy": m["grpo_full_reject_correct_count"] / m["test_questions"],
        "full_minus_sft_miou": m["grpo_full_miou"] - m["sft_miou"],
        "full_minus_no_reward_miou_miss": m["grpo_full_miou_miss"] - m["grpo_no_reward_miou_miss"],
    }
