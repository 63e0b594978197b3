"""Claims as data, and the verdict rule of DESIGN.md section 6.

A claim names a metric the experiment produces for every seed and a check on it. The verdict is
decided on the 95% interval of the metric over seeds (Student-t for fewer than 5 seeds, a
percentile bootstrap otherwise):

- ``reproduced``      the whole interval satisfies the check,
- ``not reproduced``  the whole interval violates it,
- ``inconclusive``    the interval straddles the threshold (or fewer than two seeds),
- ``not testable at this profile``  the claim is not meaningful at this profile, or has no metric.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
NOT_TESTABLE = "not testable at this profile"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE)
BOOTSTRAP_MIN_SEEDS = 5
BOOTSTRAP_RESAMPLES = 10_000


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


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    claim: str
    source: str
    paper_value: float | str | None = None
    metric: str | None = None
    check: Check | None = None
    profiles: list[Literal["smoke", "cpu", "paper"]] = []
    fidelity: Literal["paper-text", "official-code", "reconstructed"]
    note: str = ""

    @model_validator(mode="after")
    def _metric_needs_check(self) -> Claim:
        if (self.metric is None) != (self.check is None):
            raise ValueError("metric and check go together (both or neither)")
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


def interval95(values: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """Mean and 95% interval over seeds: t-interval below 5 seeds, percentile bootstrap from 5.

    With one value there is no interval: the bounds are NaN.
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("interval95: no values")
    mean = float(x.mean())
    if x.size == 1:
        return mean, math.nan, math.nan
    if x.size < BOOTSTRAP_MIN_SEEDS:
        half = float(stats.t.ppf(0.975, df=x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
        return mean, mean - half, mean + half
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(BOOTSTRAP_RESAMPLES, x.size))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return mean, float(low), float(high)


def _satisfies(check: Check, value: float) -> bool:
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
    return not _satisfies(check, low) and not _satisfies(check, high)


def verdict_for(check: Check, low: float, high: float) -> str:
    if math.isnan(low) or math.isnan(high):
        return INCONCLUSIVE
    if _satisfies(check, low) and _satisfies(check, high):
        return REPRODUCED
    if _violates_everywhere(check, low, high):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def evaluate_claims(claims: Sequence[Claim], per_seed_metrics: Mapping[int, Mapping[str, float]],
                    profile: str, paper: str) -> list[dict[str, Any]]:
    """One result row per claim, with per-seed values, mean, interval and verdict."""
    rows = []
    for claim in claims:
        row: dict[str, Any] = {
            "paper": paper, "id": claim.id, "claim": claim.claim, "source": claim.source,
            "paper_value": claim.paper_value, "metric": claim.metric, "fidelity": claim.fidelity,
            "check": claim.check.describe() if claim.check else None, "profile": profile,
            "n_seeds": 0, "per_seed": {}, "mean": None, "ci_low": None, "ci_high": None,
            "note": claim.note,
        }
        if claim.check is None or profile not in claim.profiles:
            row["verdict"] = NOT_TESTABLE
            rows.append(row)
            continue
        missing = [s for s, m in per_seed_metrics.items() if claim.metric not in m]
        if missing or not per_seed_metrics:
            raise KeyError(f"claim {claim.id}: metric {claim.metric!r} missing for seeds {missing}")
        values = {int(s): float(m[claim.metric]) for s, m in per_seed_metrics.items()}
        mean, low, high = interval95(list(values.values()))
        row.update(n_seeds=len(values), per_seed=values, mean=mean,
                   ci_low=None if math.isnan(low) else low, ci_high=None if math.isnan(high) else high,
                   verdict=verdict_for(claim.check, low, high))
        if len(values) < 2:
            row["note"] = (row["note"] + " " if row["note"] else "") + "one seed: no interval"
        rows.append(row)
    return rows


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


def claims_markdown(rows: Sequence[Mapping[str, Any]], with_paper: bool = False) -> str:
    head = ["paper"] if with_paper else []
    lines = ["| " + " | ".join(head + ["id", "claim", "paper", "check", "ours (mean [95% CI])", "n",
                                       "verdict", "fidelity"]) + " |"]
    lines.append("|" + "---|" * (len(head) + 8))
    for row in rows:
        cells = ([row["paper"]] if with_paper else []) + [
            row["id"], row["claim"].replace("|", "\\|"), str(row["paper_value"] if row["paper_value"]
                                                              is not None else "-"),
            f"`{row['metric']}` {row['check']}" if row["metric"] else "-", format_ours(row),
            str(row["n_seeds"] or "-"), f"**{row['verdict']}**", row["fidelity"]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_claims(rows: Sequence[Mapping[str, Any]], out_dir: str | Path, title: str) -> None:
    out_dir = Path(out_dir)
    write_json(out_dir / "claims.json", list(rows))
    notes = [f"- {r['id']}: {r['note']}" for r in rows if r.get("note")]
    body = f"# {title}\n\nProfile: `{rows[0]['profile'] if rows else '-'}`\n\n" + claims_markdown(rows)
    if notes:
        body += "\nNotes:\n" + "\n".join(notes) + "\n"
    write_text(out_dir / "claims.md", body)
