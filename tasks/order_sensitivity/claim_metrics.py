"""Every claim's number of order_sensitivity that is derived from the measurements (rates of counts, differences);
the raw measurements themselves (fits, correlations, identity checks, counts) are ``evaluate.py``'s.

Hallucination := answered AND (Control item OR wrong label); rates "among answered" divide by the answered items.
"""

from __future__ import annotations

import math

from tasks.common.results import SeedResult
from tasks.order_sensitivity.config import OrderSensitivityConfig


def rate(successes: float, trials: float) -> float:
    """successes / trials; NaN without trials (e.g. a gate that answers nothing has no hallucination rate: NaN
    makes the claim inconclusive instead of a vacuous 0)."""
    return successes / trials if trials else math.nan


def claim_metrics(cfg: OrderSensitivityConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    isr_rate = rate(m["gate_hallucinated_count"], m["gate_answered_count"])
    conf_rate = rate(m["confidence_gate_hallucinated_count"], m["confidence_gate_answered_count"])
    out = {
        # C3a, C7a precondition: share of non-Control test items whose label changes between permutations
        "order_flip_fraction": rate(m["order_flip_count"], m["non_control_count"]),
        # C3a: the m-permutation mixture's accuracy minus the mean single-permutation accuracy, in points
        "mixture_minus_single_acc_pp": 100.0 * (m["mixture_accuracy"] - m["single_order_accuracy"]),
        # C7a: hallucination among the test items the ISR gate answers
        "gate_hallucination_answered": isr_rate,
        # C7b: the ISR gate's abstention over all test items
        "gate_abstention": 1.0 - m["gate_answered_count"] / m["test_item_count"],
        # the mixture's own wrong-label rate on non-Control items, without the gate (reported)
        "ungated_mixture_wrong_label_rate": rate(m["ungated_mixture_wrong_label_count"], m["non_control_count"]),
        # C7a precondition: the mixture's label answered on every test item (Controls included), no gate
        "ungated_mixture_hallucination_rate": rate(m["ungated_mixture_hallucinated_count"], m["test_item_count"]),
        # C7d: hallucination among answered of the confidence gate at the ISR gate's abstention (its precondition)
        "confidence_gate_hallucination_answered": conf_rate,
        # C7d: the confidence gate's hallucination among answered minus the ISR gate's, in points (> 0: ISR wins)
        "confidence_minus_isr_hallucination_pp": 100.0 * (conf_rate - isr_rate),
        # C7c: every Control the ungated model answers is a hallucination, so this is >= 0 by the definition
        "ungated_hallucination_minus_control_share": m["ungated_hallucination"] - m["control_share"],
    }
    if "dose_evidence_count" in m:  # the dose study (C6b precondition: hallucinations on evidence items d >= 1)
        out["dose_evidence_hallucination_rate"] = rate(m["dose_evidence_hallucinated_count"],
                                                       m["dose_evidence_count"])
    return out
