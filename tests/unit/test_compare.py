"""``repro diff``: verdict changes and metric deltas against the results committed at a revision."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from tasks.common.compare import diff_paper, format_diff, metric_deltas, relative_delta, verdict_changes


def rows(**verdicts):
    return [{"id": cid, "verdict": v} for cid, v in verdicts.items()]


def test_verdict_changes_lists_changed_added_and_removed_claims():
    old = rows(C1="reproduced", C2="inconclusive", C3="reproduced")
    new = rows(C1="reproduced", C2="reproduced", C4="undecided")
    assert verdict_changes(old, new) == [("C2", "inconclusive", "reproduced"), ("C3", "reproduced", "(absent)"),
                                         ("C4", "(absent)", "undecided")]
    assert verdict_changes(old, old) == []


def test_relative_delta_exact_values():
    assert relative_delta(2.0, 2.0) == 0.0
    assert relative_delta(0.0, 0.0) == 0.0
    assert relative_delta(1.0, 1.001) == pytest.approx(0.001 / 1.001)
    assert relative_delta(-2.0, 2.0) == pytest.approx(2.0)
    assert relative_delta(math.nan, math.nan) == 0.0
    assert relative_delta(1.0, math.inf) == math.inf


def test_metric_deltas_sorted_and_numeric_only():
    old = {"a": 1.0, "b": 10.0, "c": 5.0, "profile": "cpu", "n_seeds": 3, "flag": True, "seconds_fit": 1.0}
    new = {"a": 1.5, "b": 10.1, "c": 5.0, "profile": "smoke", "n_seeds": 5, "flag": False, "seconds_fit": 9.0}
    assert [d[0] for d in metric_deltas(old, new)] == ["a", "b"]
    assert metric_deltas(old, new)[0] == ("a", 1.0, 1.5, pytest.approx(0.5 / 1.5))


def test_diff_paper_against_a_commit(tmp_path):
    root = tmp_path / "repo"
    reports = root / "reports" / "p"
    reports.mkdir(parents=True)
    git = lambda *a: subprocess.run(["git", *a], cwd=root, check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    (reports / "claims.json").write_text(json.dumps(rows(C1="reproduced", C2="inconclusive")))
    (reports / "metrics.json").write_text(json.dumps({"acc": 0.9, "loss": 1.0}))
    git("add", ".")
    git("-c", "user.email=a@b", "-c", "user.name=n", "commit", "-qm", "x")
    (reports / "claims.json").write_text(json.dumps(rows(C1="reproduced", C2="reproduced")))
    (reports / "metrics.json").write_text(json.dumps({"acc": 0.91, "loss": 1.0}))
    diff = diff_paper("p", "HEAD", root / "reports", root)
    assert diff.verdict_changes == [("C2", "inconclusive", "reproduced")]
    assert diff.metric_deltas == [("acc", 0.9, 0.91, pytest.approx(0.01 / 0.91))]
    text = format_diff([diff, diff_paper("q", "HEAD", root / "reports", root)], "HEAD")
    assert "p: 1 verdict(s) changed" in text and "C2: inconclusive -> reproduced" in text
    assert "q: no current claims.json" in text and "2 verdict(s) changed in all" not in text
