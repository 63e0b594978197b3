"""Every claim's number of eig_rubric, derived from the measurements only (evaluate.py)."""

from __future__ import annotations

from tasks.common.results import SeedResult
from tasks.eig_rubric.config import EigRubricConfig


def claim_metrics(cfg: EigRubricConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    metrics = {
        # The precondition of C1 and C2: the drifting judge's test-retest deficit against the whole-pool rubric.
        "alpha_full_pool_minus_cot": m["alpha_ordinal_full_pool"] - m["alpha_ordinal_cot"],
        # C2: consistency of the EIG-k rubric against the drifting CoT judge.
        "alpha_eig_minus_cot": m["alpha_ordinal_eig"] - m["alpha_ordinal_cot"],
        "icc_eig_minus_cot": m["icc_eig"] - m["icc_cot"],
        # C3a on the same naive-Bayes scorer (fixed_nb), and the count-scored questionnaire of the first run.
        "spearman_eig_minus_fixed_nb": m["spearman_eig"] - m["spearman_fixed_nb"],
        "spearman_full_pool_minus_fixed_nb": m["spearman_full_pool"] - m["spearman_fixed_nb"],
        "spearman_eig_minus_fixed": m["spearman_eig"] - m["spearman_fixed"],
        "spearman_full_pool_minus_fixed": m["spearman_full_pool"] - m["spearman_fixed"],
        # C3b: alignment against the drifting CoT judge.
        "spearman_eig_minus_cot": m["spearman_eig"] - m["spearman_cot"],
        "spearman_full_pool_minus_cot": m["spearman_full_pool"] - m["spearman_cot"],
        # C4: EIG-k against random-k under the same scorer; C4m: against label-informed rankings without conditioning.
        "spearman_eig_minus_random": m["spearman_eig"] - m["spearman_random"],
        "spearman_full_pool_minus_random": m["spearman_full_pool"] - m["spearman_random"],
        "alpha_eig_minus_random": m["alpha_ordinal_eig"] - m["alpha_ordinal_random"],
        "spearman_eig_minus_marginal": m["spearman_eig"] - m["spearman_marginal"],
        "spearman_eig_minus_correlation": m["spearman_eig"] - m["spearman_correlation"],
    }
    if "spearman_cot_nodrift" in m:
        # C1: the drift-free CoT judge (same noise and quantisation) against the drifting one and the whole pool.
        metrics["alpha_cot_nodrift_minus_cot"] = m["alpha_ordinal_cot_nodrift"] - m["alpha_ordinal_cot"]
        metrics["alpha_full_pool_minus_cot_nodrift"] = m["alpha_ordinal_full_pool"] - m["alpha_ordinal_cot_nodrift"]
    if "spearman_eig_relevant_pool" in m:
        # C4r: the same comparison within the relevant-dimension questions, where random-k wastes nothing.
        metrics["spearman_eig_minus_random_relevant_pool"] = (m["spearman_eig_relevant_pool"]
                                                              - m["spearman_random_relevant_pool"])
        metrics["spearman_full_minus_random_relevant_pool"] = (m["spearman_full_relevant_pool"]
                                                               - m["spearman_random_relevant_pool"])
    return metrics
