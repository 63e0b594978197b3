"""Which papers exist and how to reach their flow, config and claims, without importing torch."""

from __future__ import annotations

import importlib
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from tasks.common.env import repo_root
from tasks.common.io import read_json
from tasks.common.params import read_params, validate_params


def papers(params_file: str | Path | None = None) -> list[str]:
    """The papers of the pipeline, in the order of params.yaml's ``papers`` list (validated)."""
    params = read_params(params_file)
    validate_params(params)
    return list(params.get("papers", []))


def load_flow(slug: str) -> Any:
    return importlib.import_module(f"flows.{slug}").FLOW


def claims_file(slug: str) -> Path:
    return repo_root() / "tasks" / slug / "claims.yaml"


def fidelity(slug: str) -> str:
    """``paper-text``, ``official-code``, ``reconstructed``, or ``mixed (...)`` from claims.yaml."""
    raw = yaml.safe_load(claims_file(slug).read_text(encoding="utf-8")) or []
    counts = Counter(item.get("fidelity", "?") for item in raw)
    if len(counts) == 1:
        return next(iter(counts))
    return "mixed (" + ", ".join(f"{k} {v}" for k, v in counts.most_common()) + ")"


def last_verdicts(slug: str) -> tuple[str, Counter]:
    """(profile, verdict counts of the empirical and mechanism claims) of the last run in reports/<slug>/claims.json.

    Identities and references are verified by unit tests and are not counted."""
    path = repo_root() / "reports" / slug / "claims.json"
    if not path.exists():
        return "not run", Counter()
    rows = read_json(path)
    return (rows[0]["profile"] if rows else "-"), Counter(
        r["verdict"] for r in rows if r.get("kind", "empirical") in ("empirical", "mechanism"))
