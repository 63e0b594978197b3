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


# False timeouts (issue 20, constrained_unlearning): mutmut's default "fork" isolation forks each mutant's worker from
# its main process, which has run the clean tests in-process. A test that ran polars there started polars' rayon
# pool; the forked worker, whose first polars query waits on a latch of a pool thread that does not exist in the
# child, slept until the time limit. The tool now forks from mutmut's fork server, which only imports and collects.

POLARS_QUERY = ("pl.DataFrame({'x': list(range(100))}).lazy()"
                ".select(pl.col('x') * 2, (pl.col('x') + 1).alias('y')).collect()")


def fork_then_query(query_in_parent: bool) -> str:
    """Child's outcome ('ok' or 'hang') of a polars query in a child forked after polars was imported, and, if
    query_in_parent, after the parent ran a query itself (what mutmut's main process did under "fork")."""
    import subprocess
    import sys

    script = "\n".join([
        "import os, sys, signal",
        "import polars as pl",
        f"if {query_in_parent}: {POLARS_QUERY}",
        "pid = os.fork()",
        "if pid == 0:",
        "    signal.alarm(5)",
        f"    {POLARS_QUERY}",
        "    os._exit(0)",
        "_, status = os.waitpid(pid, 0)",
        "print('ok' if os.waitstatus_to_exitcode(status) == 0 else 'hang')",
    ])
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120).stdout.strip()


def check_generated_config_forks_from_the_fork_server(section: str) -> None:
    import tomllib

    config = tomllib.loads(section)["tool"]["mutmut"]
    assert config["process_isolation"] == "forkserver"
    assert config["forkserver_warmup"] in {"collect", "import", "none"}


def test_generated_config_forks_from_the_fork_server():
    check_generated_config_forks_from_the_fork_server(mutation.mutmut_section(SLUG, 2.0, None))


def test_negative_control_default_fork_isolation_is_caught():
    section = mutation.mutmut_section(SLUG, 2.0, None)
    broken = "\n".join(line for line in section.splitlines() if not line.startswith(("process_isolation",
                                                                                     "forkserver_warmup")))
    with pytest.raises(KeyError):
        check_generated_config_forks_from_the_fork_server(broken)


def test_polars_query_in_a_fork_works_when_the_parent_only_imported_polars():
    # what the fork server does: import and collect, no query
    assert fork_then_query(query_in_parent=False) == "ok"


def test_negative_control_polars_query_in_the_parent_hangs_the_forked_child():
    # what mutmut's main process did under "fork": the cause of constrained_unlearning's 74 false timeouts
    assert fork_then_query(query_in_parent=True) == "hang"
