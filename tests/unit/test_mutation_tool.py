"""tools/mutation.py: what RETRY re-tests (issue 20). A mutant listed as equivalent during a run is not among that
run's survivors; RETRY must still re-test it, or removing its listing leaves a stale "survived"."""

from __future__ import annotations

import json

import pytest

from tools import mutation

SLUG = "toy"
SURVIVOR, KILLED, LISTED = (f"tasks.{SLUG}.method.x_f__mutmut_{n}" for n in (1, 2, 3))


def summary_of_a_run(tmp_path, monkeypatch) -> dict:
    """A run with one survivor, one killed mutant and one survivor listed as equivalent."""
    meta = tmp_path / "mutants" / "tasks" / SLUG / "method.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(json.dumps({"exit_code_by_key": {SURVIVOR: 0, KILLED: 1, LISTED: 0}}))
    monkeypatch.setattr(mutation, "equivalents", lambda slug: {LISTED: "a reason"})
    monkeypatch.setattr(mutation, "diffs", lambda work, slug, names: "")
    return mutation.summarise(SLUG, tmp_path, 1.0, None, sampled=False)


def check_retry_re_tests_survivors_and_listed_equivalents(tmp_path, monkeypatch) -> None:
    summary = summary_of_a_run(tmp_path, monkeypatch)
    assert list(summary["survivors"]) == [SURVIVOR] and summary["equivalent"] == 1
    assert summary["undetected_all"] == [SURVIVOR, LISTED]
    # the listing removed after the run: the listed mutant is still re-tested
    assert mutation.retry_targets(summary, set()) == [SURVIVOR, LISTED]
    # a summary written before "undetected_all" existed: the mutants listed now are re-tested
    old = {"survivors": {SURVIVOR: "survived"}}
    assert mutation.retry_targets(old, {LISTED}) == [SURVIVOR, LISTED]
    assert mutation.retry_targets(old, set()) == [SURVIVOR]


def test_retry_re_tests_survivors_and_listed_equivalents(tmp_path, monkeypatch):
    check_retry_re_tests_survivors_and_listed_equivalents(tmp_path, monkeypatch)


def test_negative_control_survivors_only_is_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(mutation, "retry_targets", lambda summary, listed: sorted(summary["survivors"]))
    with pytest.raises(AssertionError):
        check_retry_re_tests_survivors_and_listed_equivalents(tmp_path, monkeypatch)
