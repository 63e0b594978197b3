"""Compare a run's results with those committed at a git revision (``repro diff``).

Two runs on one machine with the same versions agree bit for bit; across CPUs (another vector
instruction set, another BLAS path) trained models differ from about 1e-3 relative, and a verdict
near its threshold can change. This module says which verdicts changed and the largest metric
deltas, per paper, so a user sees at once whether a rerun reproduced the reproduction.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tasks.common.env import repo_root


@dataclass(frozen=True)
class PaperDiff:
    slug: str
    verdict_changes: list[tuple[str, str, str]] = field(default_factory=list)  # (claim id, old, new)
    metric_deltas: list[tuple[str, float, float, float]] = field(default_factory=list)  # name, old, new, rel
    missing: str = ""  # why the paper could not be compared


def committed_json(rev: str, relative_path: str, root: Path | None = None) -> Any | None:
    """The JSON file as committed at ``rev``, or None when it is not in that revision."""
    proc = subprocess.run(["git", "show", f"{rev}:{relative_path}"], cwd=root or repo_root(),
                          capture_output=True, text=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def verdict_changes(old_rows: Sequence[Mapping[str, Any]], new_rows: Sequence[Mapping[str, Any]]
                    ) -> list[tuple[str, str, str]]:
    """(id, old verdict, new verdict) of every claim whose verdict differs; added/removed claims too."""
    old = {r["id"]: r["verdict"] for r in old_rows}
    new = {r["id"]: r["verdict"] for r in new_rows}
    return [(cid, old.get(cid, "(absent)"), new.get(cid, "(absent)"))
            for cid in sorted(old.keys() | new.keys()) if old.get(cid) != new.get(cid)]


def relative_delta(old: float, new: float) -> float:
    """|new - old| / max(|old|, |new|); 0 when both are 0, inf when one is not finite and they differ."""
    if old == new or (math.isnan(old) and math.isnan(new)):
        return 0.0
    if not (math.isfinite(old) and math.isfinite(new)):
        return math.inf
    return abs(new - old) / max(abs(old), abs(new))


# Wall-clock timings and bookkeeping differ on every run; they are not results.
NOT_RESULTS = ("seconds_", "n_seeds")


def metric_deltas(old: Mapping[str, Any], new: Mapping[str, Any], top: int = 5
                  ) -> list[tuple[str, float, float, float]]:
    """The ``top`` largest relative changes of the numeric metrics present in both (timings excluded)."""
    deltas = []
    for name in sorted(old.keys() & new.keys()):
        if name.startswith(NOT_RESULTS):
            continue
        a, b = old[name], new[name]
        if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, int | float) \
                or not isinstance(b, int | float):
            continue
        rel = relative_delta(float(a), float(b))
        if rel > 0:
            deltas.append((name, float(a), float(b), rel))
    return sorted(deltas, key=lambda d: -d[3])[:top]


def diff_paper(slug: str, rev: str, reports_dir: Path, root: Path | None = None) -> PaperDiff:
    claims_path, metrics_path = reports_dir / slug / "claims.json", reports_dir / slug / "metrics.json"
    if not claims_path.exists():
        return PaperDiff(slug, missing="no current claims.json (not run here)")
    rel = reports_dir.relative_to(root or repo_root()) if reports_dir.is_absolute() else reports_dir
    old_rows = committed_json(rev, f"{rel}/{slug}/claims.json", root)
    if old_rows is None:
        return PaperDiff(slug, missing=f"no claims.json committed at {rev}")
    new_rows = json.loads(claims_path.read_text(encoding="utf-8"))
    old_metrics = committed_json(rev, f"{rel}/{slug}/metrics.json", root) or {}
    new_metrics = json.loads(metrics_path.read_text(encoding="utf-8")) if metrics_path.exists() else {}
    return PaperDiff(slug, verdict_changes(old_rows, new_rows), metric_deltas(old_metrics, new_metrics))


def format_diff(diffs: Sequence[PaperDiff], rev: str) -> str:
    lines = [f"Compared with the results committed at {rev}:"]
    n_changed = sum(len(d.verdict_changes) for d in diffs)
    for d in diffs:
        if d.missing:
            lines.append(f"- {d.slug}: {d.missing}")
            continue
        top = d.metric_deltas[0] if d.metric_deltas else None
        largest = (f"largest metric change {top[0]}: {top[1]:.6g} -> {top[2]:.6g} (rel {top[3]:.2e})"
                   if top else "metrics identical")
        lines.append(f"- {d.slug}: {len(d.verdict_changes)} verdict(s) changed; {largest}")
        lines += [f"    {cid}: {old} -> {new}" for cid, old, new in d.verdict_changes]
    lines.append(f"{n_changed} verdict(s) changed in all.")
    return "\n".join(lines) + "\n"
