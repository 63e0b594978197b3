"""Every number the claims of diffdt read (claims.yaml), from evaluate.py's measurements only: AUC gains over the
Delphi-like baseline, the oracle's headroom, brain-model ratios and rates, the tabular energy-distance ratio and
the intervention's sign agreement."""

from __future__ import annotations

import math

from tasks.common.results import SeedResult
from tasks.diffdt.config import DiffdtConfig
from tasks.diffdt.data import ORGANS


def rate(successes: float, trials: float) -> float:
    return successes / trials if trials > 0 else math.nan


def geometric_mean(values: list[float]) -> float:
    if not values or any(not (v > 0) for v in values):
        return math.nan
    return math.exp(sum(math.log(v) for v in values) / len(values))


def claim_metrics(config: DiffdtConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    out = {
        "auc_gain_linked_diffdt": m["auc_diffdt_linked"] - m["auc_delphi_linked"],  # C2a
        "auc_gain_other_diffdt": m["auc_diffdt_other"] - m["auc_delphi_other"],  # C2b
        "auc_gain_linked_sdoh": m["auc_delphi_sdoh_linked"] - m["auc_delphi_linked"],  # C6
        "auc_gain_other_sdoh": m["auc_delphi_sdoh_other"] - m["auc_delphi_other"],  # C6, reported
        "delphi_other_above_chance": m["auc_delphi_other"] - 0.5,  # precondition: the baseline learned
        "airm_ratio_geometric_euclidean": m["geometric_airm_error"] / m["euclidean_airm_error"],  # C4b
        "euclidean_frobenius_over_no_change": m["euclidean_frobenius_error"] / m["no_change_frobenius_error"],
        "geometric_airm_over_no_change": m["geometric_airm_error"] / m["no_change_airm_error"],
        # each brain model's error over its own latent's floor (true increments encoded and decoded)
        "geometric_airm_over_latent_floor": m["geometric_airm_error"] / m["geometric_latent_floor_airm"],
        "euclidean_airm_over_latent_floor": m["euclidean_airm_error"] / m["euclidean_latent_floor_airm"],
        "geometric_spd_valid_rate": rate(m["geometric_spd_valid_count"], m["brain_test_count"]),  # C4a
        "euclidean_spd_invalid_count": m["brain_test_count"] - m["euclidean_spd_valid_count"],
        "euclidean_spd_invalid_rate": rate(m["brain_test_count"] - m["euclidean_spd_valid_count"],
                                           m["brain_test_count"]),
        # C3a: geometric mean over the tabular organs of conditional / unconditional energy distance
        "energy_ratio_cond_uncond": geometric_mean([m[f"energy_{o}_cond"] / m[f"energy_{o}_uncond"]
                                                   for o in ORGANS if f"energy_{o}_cond" in m]),
    }
    if "auc_oracle_linked" in m:  # synthetic cohort only: the generator's true hazards
        out["oracle_headroom_linked"] = m["auc_oracle_linked"] - m["auc_delphi_linked"]
        # the SDoH codes' own information: true hazard without z, with vs without the SDoH term
        out["sdoh_headroom_linked"] = m["auc_oracle_record_linked"] - m["auc_oracle_history_linked"]
    if "intervention_pair_count" in m:  # synthetic cohort only: true counterfactuals
        pairs = m["intervention_pair_count"]
        out["intervention_sign_agreement"] = rate(m["intervention_agree_count"], pairs)  # C5
        out["intervention_true_positive_share"] = rate(m["intervention_true_positive_count"], pairs)
        # C5: a constant-sign predictor scores the majority-sign rate; the model must beat it
        majority = max(out["intervention_true_positive_share"], 1.0 - out["intervention_true_positive_share"])
        out["intervention_majority_sign_rate"] = majority
        out["intervention_agreement_over_majority"] = out["intervention_sign_agreement"] - majority
    return out
