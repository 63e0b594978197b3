"""Every derived number the claims of select_to_think read (claims.yaml), from evaluate.py's measurements only:
differences and ratios of accuracies, hit@8 - hit@1, the SLM/LLM disagreement at trigger steps, the class-only
ranker's hit rates (C1's precondition), S2T-Local's scorers (full and frozen-body) against the SLM's top-1 and
chance on held-out groups (C5/C6/C5b/C6b's preconditions) and the frozen-body variant's change outside the reserved
rows (C8b)."""

from __future__ import annotations

import math

from tasks.common.results import SeedResult
from tasks.select_to_think import method
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
    # C1's precondition: hit@K of a ranker that knows only the class of the next token, at the same trigger steps
    out |= {f"class_chance_hit_at_{k}": rate(m[f"class_chance_hit_at_{k}_count"], m["trigger_count"])
            for k in config.s2t.hit_ks if f"class_chance_hit_at_{k}_count" in m}
    out |= chance_corrected_hits(m, config.s2t.hit_ks)  # C1b
    if "heldout_group_count" in m:  # C5 / C6 preconditions: did the scorer learn its task?
        groups = m["heldout_group_count"]
        scorer, top1 = rate(m["local_scorer_teacher_count"], groups), rate(m["slm_top1_teacher_count"], groups)
        out |= {"local_scorer_teacher_rate": scorer, "slm_top1_teacher_rate": top1,
                "local_scorer_minus_top1": scorer - top1}
        if "scorer_chance_expected" in m:  # above the 1 / K of a random pick among the candidates
            chance = rate(m["scorer_chance_expected"], groups)
            out |= {"scorer_chance_rate": chance, "local_scorer_minus_chance": scorer - chance}
            if "local_frozen_scorer_teacher_count" in m:  # C5b / C6b: the frozen-body variant's scorer
                out |= frozen_scorer_rates(m["local_frozen_scorer_teacher_count"], groups, chance, top1)
    if "local_frozen_entropy_accuracy" in m:  # C5b / C6b
        frozen_local = m["local_frozen_entropy_accuracy"]
        out |= {"local_frozen_entropy_over_greedy": accuracy_ratio(frozen_local, greedy),
                "local_frozen_entropy_minus_maj": frozen_local - m.get("slm_maj_accuracy", math.nan)}
    if "local_frozen_body_max_change" in m and "local_frozen_rows_max_change_frozen_body" in m:  # C8b
        out["local_frozen_max_change_outside_reserved"] = outside_reserved_change(
            m["local_frozen_body_max_change"], m["local_frozen_rows_max_change_frozen_body"])
    if "local_body_greedy_accuracy" in m:  # C5 / C6 precondition: fine-tuning kept the SLM's own generation
        out["local_body_minus_greedy"] = m["local_body_greedy_accuracy"] - greedy
    if "slm_maj_accuracy" in m:  # C6 precondition: Maj@8 beats greedy, so "matches Maj@8" means something
        out["maj_minus_greedy"] = m["slm_maj_accuracy"] - greedy
    return out


def chance_corrected_hits(m: dict[str, float], ks: list[int]) -> dict[str, float]:
    """C1b: per K, the exact chance hit@K of the random ranking of the valid tokens at the same trigger steps
    (``chance_hit_at_K``), the excess ``hit_at_K_minus_chance`` and the chance-corrected
    ``hit_at_K_over_chance`` = (hit - chance) / (1 - chance) (method.chance_corrected_hit)."""
    out: dict[str, float] = {}
    for k in ks:
        expected = m.get(f"chance_hit_at_{k}_expected")
        if expected is None or f"hit_at_{k}" not in m:
            continue
        chance, hit = rate(expected, m["trigger_count"]), m[f"hit_at_{k}"]
        out |= {f"chance_hit_at_{k}": chance, f"hit_at_{k}_minus_chance": hit - chance,
                f"hit_at_{k}_over_chance": method.chance_corrected_hit(hit, chance)}
    return out


def frozen_scorer_rates(frozen_count: float, groups: float, chance: float, top1: float) -> dict[str, float]:
    """C5b / C6b preconditions on the frozen-body scorer, on the same held-out groups as C5's: its rate of picking
    the teacher's candidate, that rate minus chance (1 / K) and minus the SLM's own top-1 rate (the same bar as
    C5's local_scorer_minus_top1: a scorer that does not beat the top-1 cannot improve on greedy)."""
    frozen = rate(frozen_count, groups)
    return {"local_frozen_scorer_teacher_rate": frozen, "local_frozen_scorer_minus_chance": frozen - chance,
            "local_frozen_scorer_minus_top1": frozen - top1}


def outside_reserved_change(body_change: float, rows_change: float) -> float:
    """C8b's metric: the largest absolute change, after frozen-body training, of any parameter outside the reserved
    rows of lm_head: the maximum of the body's change and the non-reserved rows' change (both recorded by
    train.py); NaN when either is missing (NaN), so a lost measurement never reads as 0."""
    return math.nan if math.isnan(body_change) or math.isnan(rows_change) else max(body_change, rows_change)


def rate(successes: float, trials: float) -> float:
    """successes / trials; NaN without trials (no trigger step, no held-out group)."""
    return successes / trials if trials else math.nan


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
