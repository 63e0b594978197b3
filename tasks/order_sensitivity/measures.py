"""Measurements of one order_sensitivity seed on scored items: dispersion vs n (C1), the mixture's gains (C3,
C4), the ISR gate (C5c, C7) and the dose-response (C6); and the per-seed Monte Carlo checks of the theorems
(C2: Theorems 1-2, QMV; C5a-b: Theorem 5, EDFL). Raw measurements only: the claims' derived numbers are
``claim_metrics.py``'s.

Hallucination (project definition, printed with every number): an item is a hallucination when it is
*answered* AND (it is a Control item OR the answered label is wrong). Rates "among answered" divide by the
answered items; the ungated model answers every item.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from tasks.order_sensitivity import baselines, method
from tasks.order_sensitivity.config import EvaluationConfig, TheoryConfig

HALLUCINATION_DEFINITION = "hallucination := answered AND (Control item OR wrong label)"


@dataclass
class ScoredItems:
    """Label probabilities of items: full prompt under m permutations, skeletons of the first k, stored order."""

    q_full: np.ndarray        # (N, m)
    q_skeleton: np.ndarray    # (N, k)
    q_identity: np.ndarray    # (N,)
    label: np.ndarray         # gold label, data.NO_LABEL for controls
    is_control: np.ndarray
    n_chunks: np.ndarray
    dose: np.ndarray

    @staticmethod
    def concat(parts: Sequence[ScoredItems]) -> ScoredItems:
        return ScoredItems(*(np.concatenate([getattr(p, f) for p in parts]) for f in ScoredItems.__dataclass_fields__))


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------

def gold_probability(scored: ScoredItems) -> np.ndarray:
    """S_k(Y) of the gold label under each permutation (non-control items only)."""
    keep = ~scored.is_control
    return method.label_probability(scored.q_full[keep], scored.label[keep])


def dispersion_metrics(scored: ScoredItems, ev: EvaluationConfig, rng: np.random.Generator
                       ) -> tuple[dict[str, float], list[dict]]:
    """C1: E|R| and E_pair per n over all items (controls included), the a + b ln n fit and a bootstrap CI of b."""
    counts = sorted(set(scored.n_chunks.tolist()))
    abs_residual = method.mean_abs_residual(scored.q_full)
    pair = method.mean_pair_difference(scored.q_full)
    per_n = [abs_residual[scored.n_chunks == n] for n in counts]
    means = [float(v.mean()) for v in per_n]
    log_fit = method.fit_log_growth(counts, means)
    linear_fit = method.least_squares_fit(np.asarray(counts, float), np.asarray(means))
    slopes = method.bootstrap_log_slope(per_n, counts, ev.bootstrap_resamples, rng)
    low, high = np.percentile(slopes, [2.5, 97.5])
    rows = [{"n": n, "mean_abs_residual": m, "mean_pair_difference": float(pair[scored.n_chunks == n].mean()),
             "fit": log_fit.intercept + log_fit.slope * math.log(n)} for n, m in zip(counts, means)]
    metrics = {"dispersion_log_slope": log_fit.slope, "dispersion_log_intercept": log_fit.intercept,
               "dispersion_log_slope_ci_low": float(low), "dispersion_log_slope_ci_high": float(high),
               "dispersion_r2_log": log_fit.r2, "dispersion_r2_linear": linear_fit.r2,
               "abs_residual_over_pair_max": float(np.max(abs_residual / np.maximum(pair, 1e-300)))}
    metrics |= {f"dispersion_n{n}": m for n, m in zip(counts, means)}
    return metrics, rows


def mixture_metrics(scored: ScoredItems, ev: EvaluationConfig) -> dict[str, float]:
    """C3 (mixture vs single order, Jensen gap) and C4 (uniform vs EG mixture), on items with a gold label.

    The order flips are C3a's and C7a's precondition: |mixture - single accuracy| <= the share of items that
    flip (``claim_metrics`` divides the count by ``non_control_count``)."""
    keep = ~scored.is_control
    gold = scored.label[keep]
    p_gold = gold_probability(scored)
    mixture_correct = (scored.q_full[keep].mean(axis=1) >= 0.5).astype(int) == gold
    single_correct = (scored.q_full[keep] >= 0.5).astype(int) == gold[:, None]
    identity_correct = (scored.q_identity[keep] >= 0.5).astype(int) == gold
    labels = scored.q_full[keep] >= 0.5
    flips = labels.any(axis=1) & ~labels.all(axis=1)  # the label changes between permutations
    return {
        "order_flip_count": float(flips.sum()),
        "mixture_accuracy": float(mixture_correct.mean()),
        "single_order_accuracy": float(single_correct.mean()),
        "identity_order_accuracy": float(identity_correct.mean()),
        "jensen_gap_mean": float(method.jensen_gap(p_gold).mean()),
        "eg_mixture_gap_nats": method.uniform_mixture_gap(p_gold, ev.eg_steps, ev.eg_lr),
    }


def hallucinated(answered: np.ndarray, decision: np.ndarray, scored: ScoredItems) -> np.ndarray:
    """The project's definition: answered AND (Control item OR wrong label)."""
    return answered & (scored.is_control | (decision != scored.label))


def answered_wrong_label(answered: np.ndarray, decision: np.ndarray, scored: ScoredItems) -> np.ndarray:
    """The non-Control part of a hallucination: answered AND not a Control AND wrong label. A gate's
    hallucinations minus these are its answered Controls, so the two counts say which side a gate's
    hallucination comes from (C7a, C7d: on the procedural test bed, Control leakage or wrong labels)."""
    return answered & ~scored.is_control & (decision != scored.label)


def rate_among_answered(events: np.ndarray, answered: np.ndarray) -> float:
    """Share of answered items with ``events``; NaN when nothing is answered (a gate that abstains on every
    item has no hallucination rate: NaN makes the claim inconclusive instead of a vacuous 0)."""
    return float(events.sum() / answered.sum()) if answered.any() else math.nan


def _mean_or_nan(values: np.ndarray) -> float:
    return float(np.mean(values)) if values.size else math.nan


def gate_metrics(scored: ScoredItems, ev: EvaluationConfig) -> tuple[dict[str, float], method.GatePlan]:
    """C7: the ISR gate against the ungated identity-order model and a confidence gate at equal abstention.

    The confidence gate (``baselines.confidence_gate``) abstains on exactly as many items as the ISR gate (the
    least confident by max(q_bar, 1 - q_bar)) and answers the same mixture label, so the two differ only in
    WHICH items they answer (C7d). Returns the counts the binomial claims pool over seeds (C7a, C7b, C7d's
    precondition and C7a's); their rates, and C7c's and C7d's differences, are ``claim_metrics``'s."""
    plan = method.plan_answers(scored.q_full, scored.q_skeleton, ev.h_star, ev.clip, ev.clip_mode, ev.margin)
    gated = hallucinated(plan.answer, plan.decision, scored)
    everyone = np.ones_like(plan.answer)
    identity_decision = (scored.q_identity >= 0.5).astype(int)
    abstention = 1.0 - float(plan.answer.mean())
    confident = baselines.confidence_gate(scored.q_full.mean(axis=1), abstention)
    correct_attempts = plan.answer & ~scored.is_control & (plan.decision == scored.label)
    wiring = method.plan_answers(scored.q_full, scored.q_full[:, :ev.skeletons], ev.h_star, ev.clip, ev.clip_mode)
    non_control = ~scored.is_control
    mixture_wrong = (plan.decision != scored.label) & non_control
    confident_hallucinated = hallucinated(confident, plan.decision, scored)
    return {
        "gate_hallucinated_count": float(gated.sum()),
        "gate_answered_count": float(plan.answer.sum()),
        "gate_abstained_count": float((~plan.answer).sum()),
        "test_item_count": float(len(plan.answer)),
        "non_control_count": float(non_control.sum()),
        "ungated_mixture_wrong_label_count": float(mixture_wrong.sum()),
        # C7a precondition: the same decision (the mixture's label) answered on every item, Controls included
        "ungated_mixture_hallucinated_count": float(hallucinated(everyone, plan.decision, scored).sum()),
        "control_share": float(scored.is_control.mean()),
        "gate_accuracy_on_attempts": rate_among_answered(correct_attempts, plan.answer),
        "gate_control_abstention": _mean_or_nan(~plan.answer[scored.is_control]),
        "ungated_hallucination": float(hallucinated(everyone, identity_decision, scored).mean()),
        "ungated_wrong_label_rate": _mean_or_nan((identity_decision != scored.label)[~scored.is_control]),
        "ungated_mixture_hallucination": float(hallucinated(everyone, plan.decision, scored).mean()),
        # C7d: the confidence gate at the ISR gate's abstention (counts; claim_metrics forms the rates)
        "confidence_gate_hallucinated_count": float(confident_hallucinated.sum()),
        "confidence_gate_answered_count": float(confident.sum()),
        "confidence_gate_control_abstention": _mean_or_nan(~confident[scored.is_control]),
        # which side each gate's hallucinations come from (reported): wrong labels; the rest are answered Controls
        "gate_wrong_label_count": float(answered_wrong_label(plan.answer, plan.decision, scored).sum()),
        "confidence_gate_wrong_label_count": float(answered_wrong_label(confident, plan.decision, scored).sum()),
        "mean_delta_bar": float(plan.delta_bar.mean()),
        "mean_roh": float(plan.roh.mean()),
        "wiring_control_abstention": 1.0 - float(wiring.answer.mean()),
        "edfl_model_min_slack": edfl_model_min_slack(scored, ev),
    }, plan


def edfl_model_min_slack(scored: ScoredItems, ev: EvaluationConfig) -> float:
    """Theorem 5 on the model's own distributions: P = the k-permutation mixture of the full prompt, S_k the
    skeletons, A = {"1"}. min over items of mean_k KL(P || S_k) - KL(Ber(p) || Ber(q_bar)); must be >= 0."""
    p = scored.q_full[:, :ev.skeletons].mean(axis=1)
    delta_bar = method.bernoulli_kl(p[:, None], scored.q_skeleton).mean(axis=1)
    return float((delta_bar - method.bernoulli_kl(p, scored.q_skeleton.mean(axis=1))).min())


def gate_curve(scored: ScoredItems, plan: method.GatePlan) -> list[dict]:
    """Hallucination among answered vs abstention: ISR thresholds and confidence thresholds, for Figure 2."""
    rows = []
    confidence = np.maximum(scored.q_full.mean(axis=1), 1 - scored.q_full.mean(axis=1))
    for abstain in np.linspace(0.0, 0.9, 19):
        by_isr = baselines.abstain_lowest(plan.isr, abstain)
        by_confidence = baselines.abstain_lowest(confidence, abstain)
        rows.append({"abstention": float(abstain),
                     "isr_rank_hallucination": rate_among_answered(hallucinated(by_isr, plan.decision, scored),
                                                                   by_isr),
                     "confidence_hallucination": rate_among_answered(
                         hallucinated(by_confidence, plan.decision, scored), by_confidence)})
    return rows


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation; NaN when either side is constant (no ranking to correlate)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(stats.spearmanr(x, y).statistic)


def _ols_slope(x: np.ndarray, y: np.ndarray) -> float:
    """OLS slope of y on x; NaN when x or y is constant (e.g. no hallucination at all: nothing can fall)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return method.least_squares_fit(x, y).slope


def dose_metrics(scored: ScoredItems, ev: EvaluationConfig) -> tuple[dict[str, float], list[dict]]:
    """C6: Delta_bar and hallucination against the number d of supporting chunks (d = 0: a Control item).

    Hallucination here is the ungated model's (it answers its mixture label on every item), so the
    OLS slope measures how hallucination falls as the information budget grows. Two versions: over all
    doses (the README's acceptance check, reported only) and over the evidence items d >= 1 only. The
    all-dose version is nearly fixed by construction: a d = 0 Control has no relevant chunk to mask, so its
    skeleton is its prompt and Delta_bar = 0 exactly, and the ungated model hallucinates on it by definition;
    these points alone push the Spearman above 0.5 and the slope below 0 whenever evidence items get any
    positive budget. The d >= 1 version (label 1 on every item, hallucination = answering 0) can fail.

    The skeletons mask the values of the d supporting chunks, so the skeleton itself changes with d: its prior
    q (``skeleton_q`` per dose, ``dose_skeleton_q_shift`` = highest dose minus d = 1) is reported so that a
    budget that follows d through the skeleton, not the posterior, is visible (C6a's second precondition).
    """
    plan = method.plan_answers(scored.q_full, scored.q_skeleton, ev.h_star, ev.clip, ev.clip_mode, ev.margin)
    ungated = hallucinated(np.ones_like(plan.answer), plan.decision, scored).astype(float)
    gated = hallucinated(plan.answer, plan.decision, scored).astype(float)
    evidence = scored.dose >= 1
    per_dose = method.least_squares_fit(scored.dose.astype(float), plan.delta_bar)
    skeleton_q = scored.q_skeleton.mean(axis=1)  # the skeleton prior S_k("1"), mean over the k skeletons
    rows = []
    for d in sorted(set(scored.dose.tolist())):
        at = scored.dose == d
        rows.append({"dose": d, "delta_bar": float(plan.delta_bar[at].mean()),
                     "ungated_hallucination": float(ungated[at].mean()), "gated_hallucination": float(gated[at].mean()),
                     "abstention": float(1 - plan.answer[at].mean()),
                     "accuracy": float(((plan.decision == scored.label) & ~scored.is_control)[at].mean()),
                     "skeleton_q": float(skeleton_q[at].mean())})
    dose1 = scored.dose == 1
    top = scored.dose == scored.dose.max()
    metrics = {"dose_spearman_delta": _spearman(scored.dose, plan.delta_bar),
               # C6a precondition: how sure the model already is with one supporting chunk (gold label 1)
               "dose1_gold_probability": _mean_or_nan(scored.q_full[dose1].mean(axis=1)),
               # C6b precondition: hallucinations on evidence items (answering 0 on a supported claim)
               "dose_evidence_hallucinated_count": float(ungated[evidence].sum()),
               "dose_evidence_count": float(evidence.sum()),
               "dose_ols_hallucination_per_nat": _ols_slope(plan.delta_bar, ungated),
               "dose_spearman_delta_evidence": _spearman(scored.dose[evidence], plan.delta_bar[evidence]),
               "dose_ols_hallucination_per_nat_evidence": _ols_slope(plan.delta_bar[evidence], ungated[evidence]),
               # C6a precondition: does the skeleton prior move with d? (masking d supporting chunks changes S_k,
               # so Delta_bar could follow d through the skeleton rather than the posterior)
               "dose_skeleton_q_shift": _mean_or_nan(skeleton_q[top]) - _mean_or_nan(skeleton_q[dose1]),
               "dose_spearman_skeleton_q_evidence": _spearman(scored.dose[evidence], skeleton_q[evidence]),
               "dose_delta_per_dose": per_dose.slope,
               "dose_hallucination_drop_pp": 100.0 * (rows[0]["ungated_hallucination"]
                                                      - rows[-1]["ungated_hallucination"]),
               "dose_accuracy_gain_pp": 100.0 * (rows[-1]["accuracy"] - rows[0]["accuracy"])}
    return metrics, rows


# ------------------------------------------------------------------------------------------------
# Per-seed Monte Carlo checks of the theorems (C2, C5)
# ------------------------------------------------------------------------------------------------

def qmv_metrics(theory: TheoryConfig, seed: int) -> tuple[dict[str, float], list[dict]]:
    """Theorem 1 on Theorem 2's harmonic first-order model with Dirichlet weights: E|R| <= E_pair <= bound."""
    rng = np.random.default_rng([seed, 1_001])
    rows, violations = [], 0
    for n in theory.qmv_n:
        phi = method.harmonic_phi(n, theory.phi_scale)
        for _ in range(theory.qmv_draws):
            weights = rng.dirichlet(np.ones(n))
            abs_residual, pair = method.first_order_dispersion_mc(weights, phi, theory.qmv_permutations, rng)
            bound = method.qmv_bound(method.first_order_increments(weights, phi))
            violations += int(not abs_residual <= pair <= bound)
            rows.append({"n": n, "mean_abs_residual": abs_residual, "mean_pair_difference": pair, "bound": bound,
                         "harmonic_closed_form": method.qmv_regular_decay_bound(theory.phi_scale, n, 1.0)})
    key_chunk = [method.key_chunk_dispersion(n) for n in theory.qmv_n]
    metrics = {"qmv_violation_rate": violations / len(rows),
               "qmv_max_pair_over_bound": max(r["mean_pair_difference"] / r["bound"] for r in rows),
               "key_chunk_dispersion_increasing": float(all(a < b for a, b in zip(key_chunk, key_chunk[1:])))}
    return metrics, rows


def edfl_metrics(theory: TheoryConfig, seed: int) -> dict[str, float]:
    """Theorem 5 on random categorical draws, and the exponential tilt's equality."""
    rng = np.random.default_rng([seed, 2_002])
    slacks, tilt_errors = [], []
    for _ in range(theory.edfl_draws):
        support, m = int(rng.integers(2, 11)), int(rng.integers(1, 17))
        event = rng.random(support) < 0.5
        event[rng.integers(support)] = True
        if event.all():
            event[rng.integers(support)] = False
        slacks.append(method.edfl_slack(rng.dirichlet(np.ones(support)), rng.dirichlet(np.ones(support), size=m),
                                        event))
        prior = rng.dirichlet(np.ones(support))
        tilted = method.exponential_tilt(prior, event, float(rng.normal(scale=2.0)))
        tilt_errors.append(abs(method.edfl_slack(tilted, prior[None], event)))
    return {"edfl_violations": float(np.sum(np.asarray(slacks) < -1e-12)), "edfl_min_slack": float(min(slacks)),
            "edfl_tilt_error": float(max(tilt_errors))}
