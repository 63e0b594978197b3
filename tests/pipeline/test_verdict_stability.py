"""Verdict stability: one paper rerun on seeds the project never used, and how many verdicts change.

Three-seed verdicts near a threshold flip on other seeds; a user should know how many. The test
prints the count (pytest -s shows it; it is also written to test-artifacts/) and fails only on what
must never change with the seeds: identities and references are seed-independent by definition, so
their verification verdicts must agree on both seed sets.
"""

from __future__ import annotations

import json

import pytest

from tasks.common.claims import VERIFICATION_KINDS
from tasks.common.compare import verdict_changes
from tests.conftest import REPO, make_output_root

pytestmark = pytest.mark.usefixtures("prefect_server")
SLUG = "arm_ebm"
SEED_SETS = ([0, 1, 2], [10, 11, 12])


def run_on(seeds, tmp_path, monkeypatch):
    root = make_output_root(tmp_path / f"seeds-{'-'.join(map(str, seeds))}")
    monkeypatch.setenv("REPRO_ROOT", str(root))
    from flows.registry import load_flow

    load_flow(SLUG)(profile="smoke", seeds=seeds, phase="all")
    return json.loads((root / "reports" / SLUG / "claims.json").read_text())


def test_verdicts_on_unused_seeds(tmp_path, monkeypatch):
    first, second = (run_on(seeds, tmp_path, monkeypatch) for seeds in SEED_SETS)
    changes = verdict_changes(first, second)
    kinds = {r["id"]: r["kind"] for r in first}
    counted = [c for c in changes if kinds[c[0]] not in VERIFICATION_KINDS]
    summary = {"paper": SLUG, "profile": "smoke", "seed_sets": SEED_SETS, "claims": len(first),
               "changed": [list(c) for c in counted]}
    out = REPO / "test-artifacts"
    out.mkdir(exist_ok=True)
    (out / "verdict_stability.json").write_text(json.dumps(summary, indent=1))
    print(f"\n{SLUG} smoke: {len(counted)} of {len(first)} verdicts changed between seeds "
          f"{SEED_SETS[0]} and {SEED_SETS[1]}: {counted}")
    assert [r["id"] for r in first] == [r["id"] for r in second]
    assert not [c for c in changes if kinds[c[0]] in VERIFICATION_KINDS], \
        "an identity or reference changed with the seeds: it is not seed-independent"
