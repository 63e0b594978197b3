"""Runs at another profile than params.yaml's never overwrite the committed results, and the report never adds
verdicts of different profiles into one total (issue 21)."""

from __future__ import annotations

from tasks.common.claims import REPRODUCED, Check, Claim, evaluate_claims, write_claims
from tasks.common.report import build_index
from tasks.common.steps import paper_paths


def test_the_committed_profile_writes_the_committed_folders_and_others_write_under_runs(output_root):
    committed = paper_paths("arm_ebm", "smoke")  # conftest's output root has `profile: smoke`
    assert (committed.data, committed.models, committed.reports) == (
        output_root / "data" / "arm_ebm", output_root / "models" / "arm_ebm", output_root / "reports" / "arm_ebm")
    assert paper_paths("arm_ebm") == committed
    other = paper_paths("arm_ebm", "cpu")
    assert (other.data, other.models, other.reports) == (
        output_root / "runs" / "cpu" / "data" / "arm_ebm", output_root / "runs" / "cpu" / "models" / "arm_ebm",
        output_root / "runs" / "cpu" / "reports" / "arm_ebm")
    assert other.figures == other.reports / "figures"


def test_the_report_totals_each_profile_apart(tmp_path):
    claim = Claim(id="A", claim="a", kind="empirical", source="s", metric="m", check=Check(op=">=", value=1.0),
                  profiles=["smoke", "cpu"], fidelity="paper-text")
    per_seed = {s: {"m": v} for s, v in enumerate([2.0, 2.5, 3.0])}
    for slug, profile in (("p1", "cpu"), ("p2", "smoke"), ("p3", "cpu")):
        rows = evaluate_claims([claim], per_seed, profile, slug)
        assert rows[0]["verdict"] == REPRODUCED
        write_claims(rows, tmp_path / slug, slug)
    build_index(["p1", "p2", "p3"], tmp_path)
    index = (tmp_path / "index.md").read_text()
    assert "| **all** | cpu | 2 | 2 |" in index and "| **all** | smoke | 1 | 1 |" in index
    assert "| **all** | | 3 |" not in index and "different profiles (cpu, smoke)" in index
    build_index(["p1", "p3"], tmp_path)
    index = (tmp_path / "index.md").read_text()
    assert "| **all** | cpu | 2 | 2 |" in index and "different profiles" not in index
