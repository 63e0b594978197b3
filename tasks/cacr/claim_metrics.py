"""Every claim's number of cacr, derived from the evaluation's measurements only."""

from __future__ import annotations

from tasks.cacr.config import CacrConfig
from tasks.common.results import SeedResult


def claim_metrics(cfg: CacrConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    misses = m["candidate_miss_count"]
    rate = lambda count: count / misses if misses else float("nan")
    return {
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
