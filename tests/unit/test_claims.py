"""The verdict machinery (tasks/common/claims.py): claim kinds, intervals fit to the metric,
preconditions, seeds needed, and the tables."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from tasks.common import claims as claims_module
from tasks.common.claims import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    REPORT_ONLY,
    REPRODUCED,
    UNDECIDED,
    UNIT_TESTED,
    VERIFICATION_FAILED,
    VERIFIED,
    Check,
    Claim,
    clopper_pearson,
    evaluate_claim,
    evaluate_claims,
    load_claims,
    log_interval,
    seeds_needed,
    t_interval,
    verdict_for,
    write_claims,
)
from tasks.common.report import build_index


def claim(**kw) -> Claim:
    base = dict(id="A", claim="a", kind="empirical", source="s", metric="m", check=Check(op=">=", value=1.0),
                profiles=["cpu"], fidelity="paper-text")
    return Claim.model_validate(base | kw)


def seeds_of(values, name="m") -> dict[int, dict[str, float]]:
    return {i: {name: v} for i, v in enumerate(values)}


# --- intervals ---------------------------------------------------------------------------------------

def test_t_interval_matches_closed_form_at_every_n():
    for values in ([1.0, 2.0, 4.0], [0.1, 0.2, 0.15, 0.3, 0.25], list(np.linspace(0, 1, 9))):
        est = t_interval(values)
        n = len(values)
        half = stats.t.ppf(0.975, n - 1) * stats.tstd(values) / math.sqrt(n)
        assert (est.mean, est.low, est.high) == pytest.approx((np.mean(values), np.mean(values) - half,
                                                                np.mean(values) + half))
    # t(0.975, 2) = 4.303: a normal quantile (1.96) would give a much narrower interval.
    est = t_interval([1.0, 2.0, 4.0])
    assert est.high - est.low == pytest.approx(2 * 4.3027 * stats.tstd([1.0, 2.0, 4.0]) / math.sqrt(3), rel=1e-4)


def test_equal_seeds_get_no_zero_width_interval():
    est = t_interval([1.0, 1.0, 1.0])
    assert not est.has_interval and "same value" in est.reason
    row = evaluate_claim(claim(), seeds_of([1.0, 1.0, 1.0]), "cpu", "p")
    assert row["verdict"] == INCONCLUSIVE and row["ci_low"] is None and "same value" in row["note"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_seed_is_inconclusive_with_reason(bad):
    row = evaluate_claim(claim(), seeds_of([2.0, bad, 2.5]), "cpu", "p")
    assert row["verdict"] == INCONCLUSIVE
    assert "non-finite" in row["note"] and "[1]" in row["note"]


def test_single_seed_has_no_interval():
    est = t_interval([3.0])
    assert est.mean == 3.0 and not est.has_interval
    assert verdict_for(Check(op=">=", value=1), est.low, est.high) == INCONCLUSIVE


def test_log_interval_is_the_exponentiated_t_interval_of_logs():
    ratios = [40.0, 55.0, 3.0, 120.0, 80.0]
    logs = np.log(ratios)
    half = stats.t.ppf(0.975, 4) * logs.std(ddof=1) / math.sqrt(5)
    est = log_interval(ratios)
    assert (est.mean, est.low, est.high) == pytest.approx(
        (math.exp(logs.mean()), math.exp(logs.mean() - half), math.exp(logs.mean() + half)))
    assert est.low > 0  # the arithmetic t-interval of these ratios reaches below zero
    assert t_interval(ratios).low < est.low
    assert not log_interval([2.0, -1.0, 3.0]).has_interval


@pytest.mark.parametrize(("k", "n"), [(21, 21), (0, 12), (7, 30), (1, 1), (299, 300)])
def test_clopper_pearson_matches_scipy(k, n):
    est = clopper_pearson(k, n)
    ref = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert (est.low, est.high) == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert est.mean == k / n


def test_binomial_claim_pools_counts_over_seeds():
    c = claim(metric="rate", check=Check(op=">=", value=0.9), interval="binomial",
              counts={"successes": "k", "trials": "n"})
    per_seed = {0: {"rate": 1.0, "k": 7, "n": 7}, 1: {"rate": 1.0, "k": 7, "n": 7}, 2: {"rate": 1.0, "k": 7, "n": 7}}
    row = evaluate_claim(c, per_seed, "cpu", "p")
    # 21 of 21: the exact lower bound is 0.025 ** (1/21) = 0.8389 < 0.9, so 95% coverage is not established.
    assert row["ci_low"] == pytest.approx(0.025 ** (1 / 21))
    assert row["verdict"] == INCONCLUSIVE
    n = row["seeds_needed"]
    assert n is not None and 0.025 ** (1 / (7 * n)) >= 0.9 > 0.025 ** (1 / (7 * (n - 1)))


def test_counts_must_be_integers():
    c = claim(metric="rate", check=Check(op=">=", value=0.5), interval="binomial",
              counts={"successes": "k", "trials": "n"})
    with pytest.raises(ValueError, match="non-negative integer"):
        evaluate_claim(c, {0: {"rate": 0.5, "k": 2.5, "n": 5}}, "cpu", "p")


# --- verdicts ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("check", "low", "high", "expected"),
    [
        (Check(op=">=", value=0.9), 0.91, 0.99, REPRODUCED),
        (Check(op=">=", value=0.9), 0.85, 0.95, INCONCLUSIVE),
        (Check(op=">=", value=0.9), 0.5, 0.89, NOT_REPRODUCED),
        (Check(op="<", value=0.05), 0.01, 0.04, REPRODUCED),
        (Check(op="<", value=0.05), 0.01, 0.05, INCONCLUSIVE),
        (Check(op="<=", value=0.05), 0.06, 0.2, NOT_REPRODUCED),
        (Check(op="between", low=1, high=2), 1.2, 1.8, REPRODUCED),
        (Check(op="between", low=1, high=2), 0.5, 1.5, INCONCLUSIVE),
        (Check(op="between", low=1, high=2), 2.1, 3.0, NOT_REPRODUCED),
        (Check(op="between", low=1, high=2), 0.0, 3.0, INCONCLUSIVE),
        (Check(op="sign", value=1), 0.1, 0.2, REPRODUCED),
        (Check(op="sign", value=1), -0.1, 0.2, INCONCLUSIVE),
        (Check(op="sign", value=-1), 0.1, 0.2, NOT_REPRODUCED),
    ],
)
def test_verdict_rule(check, low, high, expected):
    assert verdict_for(check, low, high) == expected


def test_log_ratio_claim_decides_where_the_arithmetic_interval_cannot():
    c = claim(metric="ratio", check=Check(op=">=", value=10.0), interval="log")
    per_seed = seeds_of([60.0, 45.0, 200.0, 30.0, 90.0], "ratio")
    assert evaluate_claim(c, per_seed, "cpu", "p")["verdict"] == REPRODUCED
    arithmetic = evaluate_claim(claim(metric="ratio", check=Check(op=">=", value=10.0)), per_seed, "cpu", "p")
    assert arithmetic["ci_low"] < 10 < arithmetic["ci_high"] and arithmetic["verdict"] == INCONCLUSIVE


def test_preconditions_gate_the_verdict():
    pre = {"metric": "baseline_drop", "check": {"op": ">=", "value": 2.0}, "why": "the baseline must degrade",
           "post_hoc": True}
    c = claim(preconditions=[pre])
    met = {0: {"m": 2.0, "baseline_drop": 3.0}, 1: {"m": 2.2, "baseline_drop": 3.5}, 2: {"m": 1.9, "baseline_drop": 4}}
    assert evaluate_claim(c, met, "cpu", "p")["verdict"] == REPRODUCED
    unmet = {s: m | {"baseline_drop": v} for (s, m), v in zip(met.items(), [0.1, 0.3, 0.2])}
    row = evaluate_claim(c, unmet, "cpu", "p")
    assert row["verdict"] == UNDECIDED
    assert "precondition not met: baseline_drop >= 2" in row["note"] and "must degrade" in row["note"]
    assert row["preconditions"][0]["met"] is False and row["mean"] == pytest.approx(2.0333, abs=1e-4)
    assert row["preconditions"][0]["post_hoc"] is True
    # a precondition whose own interval straddles its threshold is not met either
    straddle = {s: m | {"baseline_drop": v} for (s, m), v in zip(met.items(), [1.0, 3.0, 2.2])}
    assert evaluate_claim(c, straddle, "cpu", "p")["verdict"] == UNDECIDED


def test_seeds_needed_is_the_first_decisive_n():
    values = [1.05, 1.4, 0.95]  # mean 1.1333 >= 1: inconclusive at three seeds
    row = evaluate_claim(claim(), seeds_of(values), "cpu", "p")
    assert row["verdict"] == INCONCLUSIVE
    n = row["seeds_needed"]
    mean, sd = np.mean(values), np.std(values, ddof=1)

    def decisive(k: int) -> bool:
        return mean - stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k) >= 1.0

    assert decisive(n) and not decisive(n - 1)


def test_seeds_needed_none_when_the_mean_sits_on_the_threshold():
    n, why = seeds_needed(claim(), seeds_of([0.5, 1.5, 1.0]))
    assert n is None and "sits on the threshold" in why


def test_seeds_needed_only_for_inconclusive():
    row = evaluate_claim(claim(), seeds_of([2.0, 2.1, 1.9]), "cpu", "p")
    assert row["verdict"] == REPRODUCED and row["seeds_needed"] is None


# --- kinds and schema --------------------------------------------------------------------------------

def test_identity_is_verified_on_every_seed_not_on_an_interval():
    ident = claim(kind="identity", metric="err", check=Check(op="<=", value=1e-8), verified_by="tests/x.py::test_y")
    assert evaluate_claim(ident, seeds_of([1e-15, 1e-15, 1e-15], "err"), "cpu", "p")["verdict"] == VERIFIED
    assert evaluate_claim(ident, seeds_of([1e-15, 1e-3, 1e-15], "err"), "cpu", "p")["verdict"] == VERIFICATION_FAILED
    with pytest.raises(ValueError, match="verified_by"):
        claim(kind="identity")
    with pytest.raises(ValueError, match="no preconditions"):
        claim(kind="reference", verified_by="t", preconditions=[
            {"metric": "x", "check": {"op": ">", "value": 0}, "why": "w"}])


def test_schema_rejects_bad_entries(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text("- {id: A, kind: empirical, claim: a, source: s, metric: m, profiles: [cpu], "
                   "fidelity: paper-text}\n")
    with pytest.raises(ValueError, match="metric and check go together"):
        load_claims(bad)
    bad.write_text("- {id: A, claim: a, source: s, check: {op: '>=', value: 1}, metric: m, fidelity: paper-text}\n")
    with pytest.raises(ValueError, match=r"\[0\]\.kind"):
        load_claims(bad)
    bad.write_text("- {id: A, kind: guess, claim: a, source: s, fidelity: paper-text}\n")
    with pytest.raises(ValueError, match="kind"):
        load_claims(bad)
    with pytest.raises(ValueError, match="binomial"):
        claim(interval="binomial")
    with pytest.raises(ValueError, match="log"):
        claim(interval="log", check=Check(op="sign", value=1))
    with pytest.raises(ValueError):
        Check(op="between", low=2, high=1)
    assert claim(fidelity="secondary").fidelity == "secondary"


def test_profiles_and_missing_metrics():
    claims = [claim(), Claim(id="B", claim="b", kind="empirical", source="s", fidelity="paper-text", profiles=["cpu"])]
    per_seed = seeds_of([2.0, 2.1, 1.9])
    rows = evaluate_claims(claims, per_seed, "cpu", "paper")
    assert [r["verdict"] for r in rows] == [REPRODUCED, REPORT_ONLY]
    assert evaluate_claims(claims, per_seed, "paper", "paper")[1]["verdict"] == NOT_TESTABLE
    assert rows[0]["per_seed"] == {0: 2.0, 1: 2.1, 2: 1.9}
    assert evaluate_claims(claims, per_seed, "smoke", "paper")[0]["verdict"] == NOT_TESTABLE
    with pytest.raises(KeyError, match="metric 'm' missing"):
        evaluate_claims(claims, {0: {"other": 1.0}}, "cpu", "paper")
    with pytest.raises(KeyError, match="metric 'baseline' missing"):
        evaluate_claim(claim(preconditions=[{"metric": "baseline", "check": {"op": ">", "value": 0}, "why": "w"}]),
                       per_seed, "cpu", "p")


def test_a_claims_file_of_every_kind_reaches_the_right_tables(tmp_path):
    path = tmp_path / "claims.yaml"
    path.write_text("""
- {id: E, kind: empirical, claim: emp, source: s, metric: m, check: {op: '>=', value: 1}, profiles: [cpu],
   fidelity: paper-text, preconditions: [{metric: b, check: {op: '>', value: 0}, why: headroom}]}
- {id: M, kind: mechanism, claim: mech, source: s, metric: m, check: {op: '<=', value: 5}, profiles: [cpu],
   fidelity: reconstructed}
- {id: I, kind: identity, claim: ident, source: s, metric: e, check: {op: '<=', value: 1.0e-8}, profiles: [cpu],
   fidelity: paper-text, verified_by: 'tests/unit/test_x.py::test_i'}
- {id: R, kind: reference, claim: ref, source: s, fidelity: reconstructed, verified_by: 'tests/unit/test_x.py::test_r'}
- {id: O, kind: empirical, claim: shown only, source: s, fidelity: reconstructed, note: "read m", profiles: [cpu]}
- {id: N, kind: empirical, claim: paper only, source: s, fidelity: reconstructed, note: "not run here"}
""")
    per_seed = {s: {"m": v, "b": 1.0 + 0.1 * s, "e": 0.0} for s, v in enumerate([2.0, 2.5, 3.0])}
    rows = evaluate_claims(load_claims(path), per_seed, "cpu", "paperX")
    assert {r["id"]: r["verdict"] for r in rows} == {"E": REPRODUCED, "M": REPRODUCED, "I": VERIFIED,
                                                     "R": UNIT_TESTED, "O": REPORT_ONLY, "N": NOT_TESTABLE}
    write_claims(rows, tmp_path / "out" / "paperX", "Paper X")
    md = (tmp_path / "out" / "paperX" / "claims.md").read_text()
    claims_part, verification_part = md.split("## Verification")
    assert "| E | empirical" in claims_part and "| M | mechanism" in claims_part
    assert "| I |" not in claims_part and "| I | identity" in verification_part
    assert "tests/unit/test_x.py::test_r" in verification_part
    assert "headroom" in claims_part and "**post hoc**" not in claims_part
    build_index(["paperX"], tmp_path / "out")
    index = (tmp_path / "out" / "index.md").read_text()
    # 1 empirical claim, reproduced; mechanism 1 / 1; verification 1 verified of 2
    assert ("| [paperX](paperX/claims.md) | cpu | 2 | 1 | 0 | 0 | 0 | 1 | 1 / 1 | 1 at run time + 1 by unit test, "
            "0 failed | 1 |") in index
    assert "| paperX | I |" not in index


def test_negative_control_wrong_t_quantile_is_caught(monkeypatch):
    """The closed-form check above fails if the interval used the normal quantile."""
    monkeypatch.setattr(claims_module.stats.t, "ppf", lambda q, df: stats.norm.ppf(q))
    est = t_interval([1.0, 2.0, 4.0])
    assert est.high - est.low != pytest.approx(2 * 4.3027 * stats.tstd([1.0, 2.0, 4.0]) / math.sqrt(3), rel=1e-4)


def test_binomial_widens_to_the_spread_of_disagreeing_seeds():
    """500 trials per seed at rates 0.50 / 0.38 / 0.14: pooled Clopper-Pearson alone is about
    [0.317, 0.364]; the seeds disagree far beyond binomial noise, so the t-interval of the three rates
    (mean 0.34, s 0.183) decides, and a check '>= 0.3' is no longer reproduced."""
    c = claim(metric="rate", check=Check(op=">=", value=0.3), interval="binomial",
              counts={"successes": "k", "trials": "n"})
    per_seed = {s: {"rate": k / 500, "k": k, "n": 500} for s, k in enumerate([250, 190, 70])}
    row = evaluate_claim(c, per_seed, "cpu", "p")
    rates = np.array([0.5, 0.38, 0.14])
    half = stats.t.ppf(0.975, 2) * rates.std(ddof=1) / math.sqrt(3)
    assert row["mean"] == pytest.approx(510 / 1500)
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((max(0, rates.mean() - half), rates.mean() + half))
    assert row["verdict"] == INCONCLUSIVE and "rates vary" in row["note"]
    pooled = clopper_pearson(510, 1500)
    assert pooled.low > 0.3  # pooling alone would have called it reproduced
    n = row["seeds_needed"]
    assert n is not None and rates.mean() - stats.t.ppf(0.975, n - 1) * rates.std(ddof=1) / math.sqrt(n) >= 0.3


def test_binomial_with_agreeing_seeds_is_the_pooled_interval():
    c = claim(metric="rate", check=Check(op=">=", value=0.5), interval="binomial",
              counts={"successes": "k", "trials": "n"})
    per_seed = {s: {"rate": 0.7, "k": 70, "n": 100} for s in range(3)}
    row = evaluate_claim(c, per_seed, "cpu", "p")
    ref = stats.binomtest(210, 300).proportion_ci(method="exact")
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((ref.low, ref.high))


def test_binomial_with_no_trials_on_any_seed_is_inconclusive_not_a_crash():
    c = claim(metric="rate", check=Check(op=">=", value=0.5), interval="binomial",
              counts={"successes": "k", "trials": "n"})
    row = evaluate_claim(c, {s: {"rate": math.nan, "k": 0, "n": 0} for s in range(3)}, "cpu", "p")
    assert row["verdict"] == INCONCLUSIVE and "invalid counts" in row["note"]
    one = {0: {"rate": 1.0, "k": 3, "n": 3}, 1: {"rate": math.nan, "k": 0, "n": 0}}
    assert evaluate_claim(c, one, "cpu", "p")["ci_low"] == pytest.approx(clopper_pearson(3, 3).low)
