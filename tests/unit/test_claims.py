"""Verdict rule of DESIGN.md section 6 and the claim schema."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from tasks.common.claims import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    NOT_TESTABLE,
    REPRODUCED,
    Check,
    Claim,
    evaluate_claims,
    interval95,
    load_claims,
    verdict_for,
)


def test_t_interval_matches_closed_form():
    values = [1.0, 2.0, 4.0]
    mean, low, high = interval95(values)
    half = stats.t.ppf(0.975, 2) * stats.tstd(values) / math.sqrt(3)
    assert mean == pytest.approx(7 / 3)
    assert (low, high) == pytest.approx((7 / 3 - half, 7 / 3 + half))
    # t(0.975, 2) = 4.303: a wrong quantile (normal 1.96) would give a much narrower interval.
    assert high - low == pytest.approx(2 * 4.3027 * stats.tstd(values) / math.sqrt(3), rel=1e-4)


def test_bootstrap_from_five_seeds_is_deterministic_and_covers_mean():
    values = [0.1, 0.2, 0.15, 0.3, 0.25]
    first, second = interval95(values), interval95(values)
    assert first == second
    mean, low, high = first
    assert low < mean < high
    assert low >= min(values) and high <= max(values)


def test_single_value_has_no_interval():
    mean, low, high = interval95([3.0])
    assert mean == 3.0 and math.isnan(low) and math.isnan(high)
    assert verdict_for(Check(op=">=", value=1), low, high) == INCONCLUSIVE


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


def test_evaluate_claims_profiles_and_missing_metric():
    claims = [
        Claim(id="A", claim="a", source="s", metric="m", check=Check(op=">=", value=1.0), profiles=["cpu"],
              fidelity="paper-text"),
        Claim(id="B", claim="b", source="s", profiles=[], fidelity="paper-text"),
    ]
    per_seed = {0: {"m": 2.0}, 1: {"m": 2.1}, 2: {"m": 1.9}}
    rows = evaluate_claims(claims, per_seed, "cpu", "paper")
    assert [r["verdict"] for r in rows] == [REPRODUCED, NOT_TESTABLE]
    assert rows[0]["per_seed"] == {0: 2.0, 1: 2.1, 2: 1.9}
    assert evaluate_claims(claims, per_seed, "smoke", "paper")[0]["verdict"] == NOT_TESTABLE
    with pytest.raises(KeyError, match="metric 'm' missing"):
        evaluate_claims(claims, {0: {"other": 1.0}}, "cpu", "paper")


def test_claim_schema_rejects_bad_entries(tmp_path):
    bad = tmp_path / "claims.yaml"
    bad.write_text("- {id: A, claim: a, source: s, metric: m, profiles: [cpu], fidelity: paper-text}\n")
    with pytest.raises(ValueError, match="metric and check go together"):
        load_claims(bad)
    bad.write_text("- {id: A, claim: a, source: s, check: {op: '>=', value: 1}, metric: m, fidelity: guess}\n")
    with pytest.raises(ValueError, match="fidelity"):
        load_claims(bad)
    with pytest.raises(ValueError):
        Check(op="between", low=2, high=1)
