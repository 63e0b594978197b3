"""Every derived number the claims of select_to_think read (claims.yaml), from evaluate.py's measurements only:
differences and ratios of accuracies, hit@8 - hit@1, and the SLM/LLM disagreement at trigger steps."""

from __future__ import annotations

import math

from tasks.common.results import SeedResult
from tasks.select_to_think.config import SelectToThinkConfig


def claim_metrics(config: SelectToThinkConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    greedy, local = m["slm_greedy_accuracy"], m["local_entropy_accuracy"]
    out = {
        "hit8_minus_hit1": m.get("hit_at_8", math.nan) - m.get("hit_at_1", math.nan),  # C2
        "s2t_minus_takeover": m["s2t_accuracy"] - m["takeover_accuracy"],  # C4a
        "s2t_minus_greedy": m["s2t_accuracy"] - greedy,  # C4b
        "local_entropy_relative_gain": relative_gain(local, greedy),  # C5, reported
        "local_entropy_over_greedy": accuracy_ratio(local, greedy),  # C5
        # C6; Maj@N is not computed at the paper profile (hub.py), so NaN there
        "local_entropy_minus_maj": local - m.get("slm_maj_accuracy", math.nan),
    }
    if 1 in config.s2t.hit_ks and 8 in config.s2t.hit_ks:
        out |= disagreement(m["trigger_count"], m["hit_at_1_count"])
    return out


def disagreement(trigger_count: float, hit_at_1_count: float) -> dict[str, float]:
    """Trigger steps where the SLM's top-1 is not the LLM's choice (C1's precondition: hit@8 >= hit@1 =
    1 - disagreement), as a count and a rate; NaN rate with no trigger step."""
    count = trigger_count - hit_at_1_count
    return {"slm_llm_disagree_count": count,
            "slm_llm_disagree_rate": count / trigger_count if trigger_count else math.nan}


def accuracy_ratio(accuracy: float, baseline: float) -> float:
    """accuracy / baseline (C5 on the log scale); NaN when the baseline solves nothing (no ratio to take)."""
    return accuracy / baseline if baseline > 0 else math.nan


def relative_gain(accuracy: float, baseline: float) -> float:
    """accuracy / baseline - 1; +inf when the baseline is 0 and the method solves anything."""
    if baseline == 0:
        return math.inf if accuracy > 0 else 0.0
    return accuracy / baseline - 1.0
