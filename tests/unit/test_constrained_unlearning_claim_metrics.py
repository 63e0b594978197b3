"""Claim metrics and preconditions added after the review of the 2026-12-02 cpu run: the analytic reference's
forget-mass drop (C7a-b's precondition) on hand-computed values, and the post-hoc preconditions of C1j-l and
C7a-b deciding hand-made seeds. Each check has a negative control. Fast: no model is trained."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.common.claims import REPRODUCED, UNDECIDED, evaluate_claim, load_claims
from tasks.common.params import params_section
from tasks.constrained_unlearning import claim_metrics
from tasks.constrained_unlearning.config import CONFIG

TASK_DIR = Path(__file__).resolve().parents[2] / "tasks" / "constrained_unlearning"
FORMULATIONS = ("ru", "fu", "lu")
# Hand-made measurements: pretrained forget mass 0.0957; analytic references at 0.0955 (RU: unlearned almost
# nothing), 0.0620 (FU), 0.0580 (LU); density-free runs at 0.0950 / 0.0650 / 0.0600.
PRETRAINED = 0.0957
ANALYTIC = {"ru": 0.0955, "fu": 0.0620, "lu": 0.0580}
DENSITY_FREE = {"ru": 0.0950, "fu": 0.0650, "lu": 0.0600}
EXPECTED_DROP = {"ru": 0.0002, "fu": 0.0337, "lu": 0.0377}  # 0.0957 - 0.0955, 0.0957 - 0.0620, 0.0957 - 0.0580


def measurements() -> dict[str, float]:
    m = {"b_pretrained_forget_mass": PRETRAINED}
    for f in FORMULATIONS:
        m |= {f"a_lambda_star_{f}": 0.5, f"a_{f}_forget_mass_at_bound": 0.06, f"b_{f}_lambda": 0.6,
              f"b_{f}_analytic_lambda": 0.55, f"b_{f}_forget_mass": DENSITY_FREE[f],
              f"b_{f}_analytic_forget_mass": ANALYTIC[f]}
    return m


def smoke_config():
    return CONFIG.model_validate(params_section("constrained_unlearning")["smoke"])


def assert_analytic_drops_exact(errors: dict[str, float]) -> None:
    for f in FORMULATIONS:
        assert errors[f"b_{f}_analytic_forget_mass_drop"] == pytest.approx(EXPECTED_DROP[f], abs=1e-12)
        # the density-free run's own drop stays a separate number (0.0007 / 0.0307 / 0.0357)
        assert errors[f"b_{f}_forget_mass_drop"] == pytest.approx(PRETRAINED - DENSITY_FREE[f], abs=1e-12)


def test_analytic_forget_mass_drop_exact():
    assert_analytic_drops_exact(claim_metrics.unlearning_errors(smoke_config(), measurements()))


def test_analytic_forget_mass_drop_check_fails_on_a_broken_variant(monkeypatch):
    """Negative control: a variant that measures the drop on the density-free run (the quantity C7a-b must not
    condition on: it is what they compare) fails the same exact check."""
    honest = claim_metrics.unlearning_errors

    def broken(cfg, m):
        out = honest(cfg, m)
        return out | {f"b_{f}_analytic_forget_mass_drop": out[f"b_{f}_forget_mass_drop"] for f in FORMULATIONS}

    monkeypatch.setattr(claim_metrics, "unlearning_errors", broken)
    with pytest.raises(AssertionError):
        assert_analytic_drops_exact(claim_metrics.unlearning_errors(smoke_config(), measurements()))


def claims_by_id():
    return {c.id: c for c in load_claims(TASK_DIR / "claims.yaml")}


def seeds(values: dict[str, list[float]]) -> dict[int, dict[str, float]]:
    return {s: {k: v[s] for k, v in values.items()} for s in range(5)}


def test_c7a_reads_undecided_when_the_reference_did_not_unlearn():
    """A density-free RU run that did nothing (within 0.001 of a reference that also did nothing) is undecided
    under C7a's precondition. Negative control: the same seeds under the pre-review C7a (no precondition) read
    reproduced, the vacuous pass the review found; and a reference that unlearned 0.033 lets C7a decide."""
    claim = claims_by_id()["C7a"]
    did_nothing = seeds({"b_ru_minus_analytic_forget_mass": [0.001, -0.0005, 0.0008, -0.001, 0.0002],
                         "b_ru_analytic_forget_mass_drop": [0.0002, 0.001, -0.0004, 0.0006, 0.0]})
    assert evaluate_claim(claim, did_nothing, "cpu", "p")["verdict"] == UNDECIDED
    without = claim.model_copy(update={"preconditions": []})
    assert evaluate_claim(without, did_nothing, "cpu", "p")["verdict"] == REPRODUCED
    unlearned = seeds({"b_ru_minus_analytic_forget_mass": [0.001, -0.0005, 0.0008, -0.001, 0.0002],
                       "b_ru_analytic_forget_mass_drop": [0.033, 0.030, 0.036, 0.031, 0.035]})
    assert evaluate_claim(claim, unlearned, "cpu", "p")["verdict"] == REPRODUCED


@pytest.mark.parametrize("cid,f", [("C1j", "ru"), ("C1k", "fu"), ("C1l", "lu")])
def test_c1_lambda_claims_need_a_converged_reference_and_a_real_drop(cid, f):
    """C1j-l decide only when the analytic reference reaches lambda_b within 25% and the optimum asks for a
    drop above 0.02. Negative controls: an unconverged reference (error 0.30) or a near-zero required drop
    (0.004) make the same seeds undecided; with both preconditions met they read reproduced."""
    claim = claims_by_id()[cid]
    error = [0.10, 0.12, 0.08, 0.15, 0.11]
    good = {f"b_{f}_lambda_rel_error": error, f"b_{f}_analytic_lambda_rel_error": [0.1, 0.05, 0.12, 0.08, 0.09],
            f"b_{f}_required_mass_drop": [0.036, 0.052, 0.045, 0.034, 0.035]}
    assert evaluate_claim(claim, seeds(good), "cpu", "p")["verdict"] == REPRODUCED
    unconverged = good | {f"b_{f}_analytic_lambda_rel_error": [0.30, 0.28, 0.33, 0.26, 0.31]}
    assert evaluate_claim(claim, seeds(unconverged), "cpu", "p")["verdict"] == UNDECIDED
    no_drop = good | {f"b_{f}_required_mass_drop": [0.005, 0.005, 0.011, 0.002, -0.002]}
    assert evaluate_claim(claim, seeds(no_drop), "cpu", "p")["verdict"] == UNDECIDED


def test_review_preconditions_are_marked_post_hoc_and_c7d_is_an_identity():
    claims = claims_by_id()
    for cid in ("C1j", "C1k", "C1l", "C7a", "C7b"):
        assert claims[cid].preconditions and all(p.post_hoc for p in claims[cid].preconditions)
        assert all("after the 2026-12-02 cpu run" in p.why for p in claims[cid].preconditions)
    assert claims["C7d"].kind == "identity" and claims["C7d"].check is None
    assert claims["C7d"].verified_by.endswith("::test_lu_likelihood_weights_equal_the_analytic_density_ratio")
    # round 3: C7c compares the on-policy LU run with its reference; its precondition is stated before that run
    assert claims["C7c"].kind == "mechanism" and claims["C7c"].metric == "b_lu_minus_analytic_forget_mass"
    assert [(p.metric, p.post_hoc) for p in claims["C7c"].preconditions] == [("b_lu_analytic_forget_mass_drop", False)]
