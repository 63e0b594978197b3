"""Claims as data, and the verdict rule (docs/architecture.md, "Claims and verdicts").

Every claim has a **kind**:

- ``empirical``  an experimental outcome that could come out either way; counted in the report;
- ``mechanism``  a check of the project's own reconstruction or derivation; counted in its own column;
- ``identity``   holds by construction or by exact algebra of the implementation;
- ``reference``  a seed-independent number from a closed form.

Identities and references are verified by the unit test named in ``verified_by`` and listed in a
separate verification table; they are never counted as reproduced. Their run-time value (when they
name a metric) must satisfy the check on every seed: ``verified`` or ``verification failed``.

Empirical and mechanism claims are decided on a 95% interval that fits the metric (``interval``):

- ``t``         Student-t interval on the mean over seeds (every n; a percentile bootstrap under-covers
                at 5 seeds). A metric whose seeds all agree has no estimable spread: inconclusive, with
                the reason (a rate must use ``binomial``; a seed-independent number is a ``reference``).
- ``log``       for ratios: the t-interval of log(value), exponentiated (the centre is the geometric mean).
- ``binomial``  for rates and coverage: Clopper-Pearson on successes / trials pooled over seeds; the
                experiment reports both counts per seed (``counts``). Trials are clustered by seed (each
                seed trains its own model), so when the per-seed rates vary the interval is the wider of
                the pooled one and the t-interval of the per-seed rates: pooling alone would treat
                1,500 trials from three disagreeing models as one sample.

Verdicts: ``reproduced`` (the whole interval satisfies the check), ``not reproduced`` (the whole interval
violates it), ``inconclusive`` (it straddles the threshold, or no interval exists), ``undecided`` (a
precondition of the test bed was not met, so the claim cannot be decided either way), ``not testable at
this profile``. For an inconclusive claim, ``seeds_needed`` is the number of seeds at which the observed
mean and spread would give a decisive interval (None with a reason when the mean sits on the threshold).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from scipy import stats

from tasks.common.io import write_json, write_text

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"
UNDECIDED = "undecided"
NOT_TESTABLE = "not testable at this profile"
# A claim with no check at all: its numbers are shown (see its note), no verdict is drawn, and it is
# not counted among the empirical claims.
REPORT_ONLY = "report only"
VERIFIED = "verified"
VERIFICATION_FAILED = "verification failed"
# An identity or reference with no run-time value: the named unit test (run by `make test`) checks it.
UNIT_TESTED = "checked by unit test"
# Verdicts of the claims the report counts (empirical and mechanism), in display order.
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, UNDECIDED, NOT_TESTABLE)
DECIDABLE = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, UNDECIDED)
VERIFICATION_VERDICTS = (VERIFIED, VERIFICATION_FAILED, UNIT_TESTED, NOT_TESTABLE)
COUNTED_KINDS = ("empirical", "mechanism")
VERIFICATION_KINDS = ("identity", "reference")
# Beyond this many seeds a claim is reported as not decidable by more seeds of the same test bed.
MAX_SEEDS_NEEDED = 1000

Kind = Literal["empirical", "mechanism", "identity", "reference"]
IntervalKind = Literal["t", "log", "binomial"]


class Check(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    op: Literal[">=", ">", "<=", "<", "between", "sign"]
    value: float | None = None
    low: float | None = None
    high: float | None = None

    @model_validator(mode="after")
    def _operands(self) -> Check:
        if self.op == "between":
            if self.low is None or self.high is None or self.low > self.high:
                raise ValueError("'between' needs low <= high")
        elif self.op == "sign":
            if self.value not in (1, -1):
                raise ValueError("'sign' needs value +1 or -1")
        elif self.value is None:
            raise ValueError(f"{self.op!r} needs a value")
        return self

    def describe(self) -> str:
        if self.op == "between":
            return f"in [{self.low:g}, {self.high:g}]"
        if self.op == "sign":
            return "> 0" if self.value == 1 else "< 0"
        return f"{self.op} {self.value:g}"

    def thresholds(self) -> tuple[float, ...]:
        if self.op == "between":
            return (self.low, self.high)
        return (0.0,) if self.op == "sign" else (self.value,)


class Counts(BaseModel):
    """Metric names of the per-seed success and trial counts of a rate (for ``interval: binomial``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    successes: str
    trials: str


class _Measured(BaseModel):
    """A metric, the check on it and the interval that fits it (shared by claims and preconditions)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: str | None = None
    check: Check | None = None
    interval: IntervalKind = "t"
    counts: Counts | None = None

    @model_validator(mode="after")
    def _consistent(self) -> _Measured:
        if (self.metric is None) != (self.check is None):
            raise ValueError("metric and check go together (both or neither)")
        if (self.interval == "binomial") != (self.counts is not None):
            raise ValueError("interval 'binomial' needs counts {successes, trials}, and only it takes them")
        if self.interval == "log" and self.check is not None:
            if self.check.op == "sign" or min(self.check.thresholds()) <= 0:
                raise ValueError("interval 'log' is for positive ratios: the check needs thresholds > 0")
        return self


class Precondition(_Measured):
    """What the test bed must show before the claim can be decided.

    Written before the run that decides the claim; ``post_hoc: true`` marks one added after its
    results were seen, and the tables say so (a reader weighs it accordingly)."""

    metric: str
    check: Check
    why: str
    post_hoc: bool = False


class Claim(_Measured):
    id: str
    claim: str
    kind: Kind
    source: str
    paper_value: float | str | None = None
    profiles: list[Literal["smoke", "cpu", "paper"]] = []
    fidelity: Literal["paper-text", "official-code", "reconstructed", "secondary"]
    preconditions: list[Precondition] = []
    verified_by: str | None = None
    note: str = ""

    @model_validator(mode="after")
    def _kind_rules(self) -> Claim:
        if self.kind in VERIFICATION_KINDS:
            if not self.verified_by:
                raise ValueError(f"a {self.kind} claim names the unit test that verifies it (verified_by)")
            if self.preconditions:
                raise ValueError(f"a {self.kind} claim has no preconditions (it is not decided on seeds)")
        return self


def load_claims(path: str | Path) -> list[Claim]:
    raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    if not isinstance(raw, list):
        raise ValueError(f"{path}: must be a list of claims")
    claims = []
    for i, item in enumerate(raw):
        try:
            claims.append(Claim.model_validate(item))
        except ValidationError as err:
            first = err.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{path}[{i}].{loc}: {first['msg']}") from None
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: claim ids must be unique, got {ids}")
    return claims


# --- intervals ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """Centre and 95% interval of a metric over seeds; ``reason`` says why there is no interval."""

    mean: float
    low: float = math.nan
    high: float = math.nan
    reason: str = ""

    @property
    def has_interval(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))


def t_interval(values: Sequence[float]) -> Estimate:
    """mean +- t(0.975, n-1) s / sqrt(n). No interval for one value, a non-finite value, or zero spread."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("t_interval: no values")
    if not np.all(np.isfinite(x)):
        bad = [i for i, v in enumerate(x) if not math.isfinite(v)]
        return Estimate(float("nan"), reason=f"non-finite value at seed position(s) {bad}")
    mean = float(x.mean())
    if x.size == 1:
        return Estimate(mean, reason="one seed: no interval")
    sd = float(x.std(ddof=1))
    if sd == 0.0:
        return Estimate(mean, reason="every seed gave the same value: no spread to estimate (a rate needs "
                                     "interval: binomial; a seed-independent number is a reference)")
    half = float(stats.t.ppf(0.975, df=x.size - 1) * sd / math.sqrt(x.size))
    return Estimate(mean, mean - half, mean + half)


def log_interval(values: Sequence[float]) -> Estimate:
    """Ratios: the t-interval of log(value), exponentiated; the centre is the geometric mean."""
    x = np.asarray(values, dtype=float)
    if np.any(~np.isfinite(x)) or np.any(x <= 0):
        bad = [i for i, v in enumerate(x) if not (math.isfinite(v) and v > 0)]
        return Estimate(float("nan"), reason=f"ratio not finite and positive at seed position(s) {bad}")
    est = t_interval(np.log(x))
    if not est.has_interval:
        return Estimate(math.exp(est.mean), reason=est.reason)
    return Estimate(math.exp(est.mean), math.exp(est.low), math.exp(est.high))


def clopper_pearson(successes: int, trials: int) -> Estimate:
    """Exact binomial 95% interval of successes / trials (beta quantiles; 0 and 1 at the ends)."""
    if trials <= 0 or not 0 <= successes <= trials:
        return Estimate(float("nan"), reason=f"invalid counts: {successes} successes of {trials} trials")
    low = 0.0 if successes == 0 else float(stats.beta.ppf(0.025, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(stats.beta.ppf(0.975, successes + 1, trials - successes))
    return Estimate(successes / trials, low, high)


def pooled_counts(per_seed: Mapping[int, Mapping[str, float]], counts: Counts) -> tuple[int, int]:
    successes = sum(_as_count(m[counts.successes], counts.successes) for m in per_seed.values())
    trials = sum(_as_count(m[counts.trials], counts.trials) for m in per_seed.values())
    return successes, trials


def _as_count(value: float, name: str) -> int:
    if not math.isfinite(value) or value < 0 or value != round(value):
        raise ValueError(f"count metric {name!r} must be a non-negative integer, got {value!r}")
    return int(round(value))


def per_seed_rates(per_seed: Mapping[int, Mapping[str, float]], counts: Counts) -> list[float]:
    rates = []
    for m in per_seed.values():
        trials = _as_count(m[counts.trials], counts.trials)
        if trials:
            rates.append(_as_count(m[counts.successes], counts.successes) / trials)
    return rates


def binomial_interval(per_seed: Mapping[int, Mapping[str, float]], counts: Counts) -> Estimate:
    """Rates clustered by seed: the wider of the pooled Clopper-Pearson interval and the t-interval of
    the per-seed rates (clipped to [0, 1]); the centre is the pooled rate."""
    pooled = clopper_pearson(*pooled_counts(per_seed, counts))
    rates = per_seed_rates(per_seed, counts)
    if not pooled.has_interval or len(rates) < 2:
        return pooled
    spread = t_interval(rates)
    if not spread.has_interval:
        return pooled
    low, high = min(pooled.low, max(0.0, spread.low)), max(pooled.high, min(1.0, spread.high))
    reason = "" if (low, high) == (pooled.low, pooled.high) else "per-seed rates vary: t-interval of the rates"
    return Estimate(pooled.mean, low, high, reason)


def estimate(measured: _Measured, per_seed: Mapping[int, Mapping[str, float]]) -> Estimate:
    """The interval ``measured.interval`` names, over the seeds of ``per_seed``."""
    if measured.interval == "binomial":
        return binomial_interval(per_seed, measured.counts)
    values = [float(m[measured.metric]) for m in per_seed.values()]
    return log_interval(values) if measured.interval == "log" else t_interval(values)


def interval95(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high) of the t-interval; NaN bounds where there is no interval."""
    est = t_interval(values)
    return est.mean, est.low, est.high


# --- verdicts ----------------------------------------------------------------------------------------


def satisfies(check: Check, value: float) -> bool:
    match check.op:
        case ">=":
            return value >= check.value
        case ">":
            return value > check.value
        case "<=":
            return value <= check.value
        case "<":
            return value < check.value
        case "between":
            return check.low <= value <= check.high
        case "sign":
            return value * check.value > 0
    raise AssertionError(check.op)


def _violates_everywhere(check: Check, low: float, high: float) -> bool:
    """True when no point of [low, high] satisfies the check."""
    if check.op == "between":
        return high < check.low or low > check.high
    return not satisfies(check, low) and not satisfies(check, high)


def verdict_for(check: Check, low: float, high: float) -> str:
    if math.isnan(low) or math.isnan(high):
        return INCONCLUSIVE
    if satisfies(check, low) and satisfies(check, high):
        return REPRODUCED
    if _violates_everywhere(check, low, high):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def _decisive(check: Check, low: float, high: float) -> bool:
    return verdict_for(check, low, high) != INCONCLUSIVE


def seeds_needed(measured: _Measured, per_seed: Mapping[int, Mapping[str, float]]) -> tuple[int | None, str]:
    """Smallest number of seeds at which the observed centre and spread give a decisive interval.

    t / log: the interval mean +- t(0.975, n-1) s / sqrt(n) with the observed mean and s (on the log
    for ratios). binomial: the Clopper-Pearson interval at the observed rate with the observed trials
    per seed, and, when the per-seed rates vary, also the t-interval of the rates (the larger n).
    (None, reason) when no number of seeds would do (the centre sits on a threshold, or more than
    MAX_SEEDS_NEEDED are needed).
    """
    if measured.interval == "binomial":
        needed = [_clopper_pearson_seeds_needed(measured, per_seed)]
        rates = np.asarray(per_seed_rates(per_seed, measured.counts))
        if rates.size >= 2 and rates.std(ddof=1) > 0:
            needed.append(_t_seeds_needed(rates, measured.check, len(per_seed)))
        unknown = [why for n, why in needed if n is None]
        return (None, unknown[0]) if unknown else (max(n for n, _ in needed), "")
    values = np.asarray([float(m[measured.metric]) for m in per_seed.values()], dtype=float)
    check = measured.check
    if measured.interval == "log":
        if np.any(~np.isfinite(values)) or np.any(values <= 0):
            return None, "ratio not finite and positive on every seed"
        values, check = np.log(values), _log_check(check)
    return _t_seeds_needed(values, check, len(per_seed))


def _clopper_pearson_seeds_needed(measured: _Measured, per_seed: Mapping[int, Mapping[str, float]]
                                  ) -> tuple[int | None, str]:
    successes, trials = pooled_counts(per_seed, measured.counts)
    if trials == 0:
        return None, "no trials"
    rate, per_seed_trials = successes / trials, trials / len(per_seed)
    if any(math.isclose(rate, t) for t in measured.check.thresholds()):
        return None, "none: the rate sits on the threshold"
    for n in range(len(per_seed) + 1, MAX_SEEDS_NEEDED + 1):
        n_trials = max(1, round(per_seed_trials * n))
        est = clopper_pearson(round(rate * n_trials), n_trials)
        if _decisive(measured.check, est.low, est.high):
            return n, ""
    return None, f"more than {MAX_SEEDS_NEEDED} seeds"


def _t_seeds_needed(values: np.ndarray, check: Check, n_now: int) -> tuple[int | None, str]:
    if not np.all(np.isfinite(values)) or values.size < 2 or values.std(ddof=1) == 0:
        return None, "no spread to extrapolate from"
    mean, sd = float(values.mean()), float(values.std(ddof=1))
    if any(math.isclose(mean, t, rel_tol=1e-9, abs_tol=1e-12) for t in check.thresholds()):
        return None, "none: the mean sits on the threshold"
    for n in range(max(n_now + 1, 2), MAX_SEEDS_NEEDED + 1):
        half = float(stats.t.ppf(0.975, df=n - 1) * sd / math.sqrt(n))
        if _decisive(check, mean - half, mean + half):
            return n, ""
    return None, f"more than {MAX_SEEDS_NEEDED} seeds"


def _log_check(check: Check) -> Check:
    if check.op == "between":
        return Check(op="between", low=math.log(check.low), high=math.log(check.high))
    return Check(op=check.op, value=math.log(check.value))


def _precondition_row(pre: Precondition, per_seed: Mapping[int, Mapping[str, float]]) -> dict[str, Any]:
    est = estimate(pre, per_seed)
    met = est.has_interval and verdict_for(pre.check, est.low, est.high) == REPRODUCED
    return {"metric": pre.metric, "check": pre.check.describe(), "interval": pre.interval, "why": pre.why,
            "post_hoc": pre.post_hoc,
            "mean": _none_if_nan(est.mean), "ci_low": _none_if_nan(est.low), "ci_high": _none_if_nan(est.high),
            "met": met}


def _none_if_nan(x: float) -> float | None:
    return None if math.isnan(x) else x


def _require_metrics(claim: Claim, per_seed: Mapping[int, Mapping[str, float]]) -> None:
    names = [claim.metric] + [p.metric for p in claim.preconditions]
    for measured in [claim, *claim.preconditions]:
        if measured.counts is not None:
            names += [measured.counts.successes, measured.counts.trials]
    for name in names:
        missing = [s for s, m in per_seed.items() if name not in m]
        if missing or not per_seed:
            raise KeyError(f"claim {claim.id}: metric {name!r} missing for seeds {missing}")


def _base_row(claim: Claim, profile: str, paper: str) -> dict[str, Any]:
    return {"paper": paper, "id": claim.id, "kind": claim.kind, "claim": claim.claim, "source": claim.source,
            "paper_value": claim.paper_value, "metric": claim.metric, "fidelity": claim.fidelity,
            "check": claim.check.describe() if claim.check else None, "interval": claim.interval,
            "profile": profile, "n_seeds": 0, "per_seed": {}, "mean": None, "ci_low": None, "ci_high": None,
            "preconditions": [], "seeds_needed": None, "seeds_needed_note": "",
            "verified_by": claim.verified_by, "note": claim.note}


def _add_note(row: dict[str, Any], text: str) -> None:
    if text:
        row["note"] = f"{row['note']} {text}".strip()


def evaluate_claim(claim: Claim, per_seed: Mapping[int, Mapping[str, float]], profile: str,
                   paper: str) -> dict[str, Any]:
    """One result row: per-seed values, centre, interval, preconditions, verdict, seeds needed."""
    row = _base_row(claim, profile, paper)
    if claim.check is None and claim.kind in VERIFICATION_KINDS:
        row["verdict"] = UNIT_TESTED
        return row
    if claim.check is None:
        # Shown without a verdict where the profile produces its numbers; otherwise nothing is shown.
        row["verdict"] = REPORT_ONLY if profile in claim.profiles else NOT_TESTABLE
        return row
    if profile not in claim.profiles:
        row["verdict"] = NOT_TESTABLE
        return row
    _require_metrics(claim, per_seed)
    values = {int(s): float(m[claim.metric]) for s, m in per_seed.items()}
    row.update(n_seeds=len(values), per_seed=values)
    if claim.kind in VERIFICATION_KINDS:
        ok = all(math.isfinite(v) and satisfies(claim.check, v) for v in values.values())
        row.update(mean=float(np.mean(list(values.values()))), verdict=VERIFIED if ok else VERIFICATION_FAILED)
        return row
    est = estimate(claim, per_seed)
    row.update(mean=_none_if_nan(est.mean), ci_low=_none_if_nan(est.low), ci_high=_none_if_nan(est.high))
    _add_note(row, est.reason)
    row["preconditions"] = [_precondition_row(p, per_seed) for p in claim.preconditions]
    unmet = [p for p in row["preconditions"] if not p["met"]]
    if unmet:
        row["verdict"] = UNDECIDED
        _add_note(row, "; ".join(f"precondition not met: {p['metric']} {p['check']} ({p['why']})" for p in unmet))
        return row
    row["verdict"] = verdict_for(claim.check, est.low, est.high)
    if row["verdict"] == INCONCLUSIVE:
        row["seeds_needed"], row["seeds_needed_note"] = seeds_needed(claim, per_seed)
    return row


def evaluate_claims(claims: Sequence[Claim], per_seed_metrics: Mapping[int, Mapping[str, float]],
                    profile: str, paper: str) -> list[dict[str, Any]]:
    return [evaluate_claim(c, per_seed_metrics, profile, paper) for c in claims]


# --- tables ------------------------------------------------------------------------------------------


def is_counted(row: Mapping[str, Any]) -> bool:
    return row.get("kind", "empirical") in COUNTED_KINDS


def headline_metrics(rows: Sequence[Mapping[str, Any]], n_seeds: int) -> dict[str, int]:
    """``reports/<slug>/headline.json``, the paper's DVC metric: how many empirical claims got each verdict
    (``report only`` rows excluded, as in ``reports/index.md``), the mechanism checks reproduced out of
    all, and the seeds. The same keys for every paper, so ``dvc metrics show`` is one narrow row per paper;
    the per-claim numbers stay in ``metrics.json`` and ``claims.json``."""
    empirical = [r["verdict"] for r in rows
                 if r.get("kind", "empirical") == "empirical" and r["verdict"] != REPORT_ONLY]
    mechanism = [r["verdict"] for r in rows if r.get("kind") == "mechanism" and r["verdict"] != REPORT_ONLY]
    # Short keys: `dvc metrics show` prints one column per key beside the file path (under 200 columns).
    short = {NOT_TESTABLE: "not_testable"}
    headline = {"empirical": len(empirical)}
    headline |= {short.get(verdict, verdict.replace(" ", "_")): empirical.count(verdict) for verdict in VERDICTS}
    headline |= {"mech_reproduced": mechanism.count(REPRODUCED), "mechanism": len(mechanism), "seeds": int(n_seeds)}
    return headline


def format_number(x: float | None) -> str:
    if x is None:
        return "-"
    if x == 0:
        return "0"
    if abs(x) >= 1e4 or abs(x) < 1e-3:
        return f"{x:.2e}"
    return f"{x:.4g}"


def format_ours(row: Mapping[str, Any]) -> str:
    if row["mean"] is None:
        return "-"
    if row["ci_low"] is None:
        return format_number(row["mean"])
    return f"{format_number(row['mean'])} [{format_number(row['ci_low'])}, {format_number(row['ci_high'])}]"


def format_seeds_needed(row: Mapping[str, Any]) -> str:
    if row.get("verdict") != INCONCLUSIVE:
        return "-"
    if row.get("seeds_needed") is not None:
        return str(row["seeds_needed"])
    return row.get("seeds_needed_note") or "-"


def _interval_label(row: Mapping[str, Any]) -> str:
    return {"t": "", "log": " (log)", "binomial": " (pooled, Clopper-Pearson)"}.get(row.get("interval", "t"), "")


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def claims_markdown(rows: Sequence[Mapping[str, Any]], with_paper: bool = False) -> str:
    """The counted claims (empirical, mechanism): verdicts on intervals, preconditions, seeds needed."""
    head = ["paper"] if with_paper else []
    cols = head + ["id", "kind", "claim", "paper's value", "check", "ours (mean [95% CI])", "n", "verdict",
                   "seeds needed", "fidelity"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        check = f"`{row['metric']}` {row['check']}{_interval_label(row)}" if row["metric"] else "-"
        for pre in row.get("preconditions", []):
            check += f"; if `{pre['metric']}` {pre['check']}"
        cells = ([row["paper"]] if with_paper else []) + [
            row["id"], row.get("kind", "empirical"), _cell(row["claim"]),
            _cell(row["paper_value"] if row["paper_value"] is not None else "-"), _cell(check),
            format_ours(row), str(row["n_seeds"] or "-"), f"**{row['verdict']}**", _cell(format_seeds_needed(row)),
            row["fidelity"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def verification_markdown(rows: Sequence[Mapping[str, Any]], with_paper: bool = False) -> str:
    """Identities and references: the unit test that verifies each, and the run-time value if any."""
    head = ["paper"] if with_paper else []
    cols = head + ["id", "kind", "claim", "check", "run-time value (all seeds)", "verdict", "verified by"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in rows:
        check = f"`{row['metric']}` {row['check']}" if row["metric"] else "-"
        values = row.get("per_seed") or {}
        shown = (f"max {format_number(max(values.values()))}, min {format_number(min(values.values()))}"
                 if values else "-")
        cells = ([row["paper"]] if with_paper else []) + [
            row["id"], row["kind"], _cell(row["claim"]), _cell(check), shown, row["verdict"],
            f"`{row.get('verified_by') or '-'}`"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def preconditions_markdown(rows: Sequence[Mapping[str, Any]]) -> str:
    lines = []
    for row in rows:
        for pre in row.get("preconditions", []):
            state = "met" if pre["met"] else "NOT met"
            when = " **post hoc** (added after results were seen)" if pre.get("post_hoc") else ""
            lines.append(f"- {row['id']}: `{pre['metric']}` {pre['check']} ({pre['why']}){when}: "
                         f"{format_ours(pre)}, {state}")
    return "\n".join(lines) + ("\n" if lines else "")


def write_claims(rows: Sequence[Mapping[str, Any]], out_dir: str | Path, title: str) -> None:
    out_dir = Path(out_dir)
    write_json(out_dir / "claims.json", list(rows))
    counted = [r for r in rows if is_counted(r)]
    verification = [r for r in rows if not is_counted(r)]
    body = f"# {title}\n\nProfile: `{rows[0]['profile'] if rows else '-'}`\n\n## Claims\n\n" + claims_markdown(counted)
    pre = preconditions_markdown(counted)
    if pre:
        body += "\n### Preconditions (stated before the run unless marked post hoc)\n\n" + pre
    if verification:
        body += ("\n## Verification (identities and references; verified by unit tests, never counted as "
                 "reproduced)\n\n" + verification_markdown(verification))
    notes = [f"- {r['id']}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        body += "\nNotes:\n" + "\n".join(notes) + "\n"
    write_text(out_dir / "claims.md", body)
