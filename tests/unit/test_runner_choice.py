"""Which task runner a paper's seeds use: --runner, then REPRO_RUNNER, then the paper's measured-fastest runner
(flows/runners.py PREFERRED_RUNNERS), then threads."""

from __future__ import annotations

import pytest

from flows import runners


@pytest.fixture
def no_runner_env(monkeypatch):
    monkeypatch.delenv(runners.RUNNER_ENV, raising=False)
    monkeypatch.delenv(runners.DASK_ADDRESS_ENV, raising=False)
    monkeypatch.setattr(runners, "PREFERRED_RUNNERS", {("paper_a", "cpu"): "dask"})


def test_the_table_applies_only_to_its_paper_and_profile(no_runner_env):
    assert runners.preferred_runner("paper_a", "cpu") == "dask"
    assert runners.preferred_runner("paper_a", "smoke") == "threads"
    assert runners.preferred_runner("paper_b", "cpu") == "threads"


def test_precedence_flag_then_environment_then_preference(no_runner_env, monkeypatch):
    preferred = runners.preferred_runner("paper_a", "cpu")
    assert runners.resolve_runner(None, None, preferred) == ("dask", None)
    assert runners.resolve_runner("threads", None, preferred) == ("threads", None)
    monkeypatch.setenv(runners.RUNNER_ENV, "threads")
    assert runners.resolve_runner(None, None, preferred) == ("threads", None)
    monkeypatch.delenv(runners.RUNNER_ENV)
    assert runners.resolve_runner(None, None) == ("threads", None)


def test_every_preferred_runner_is_a_known_runner_of_a_known_paper():
    from flows.registry import papers

    known = set(papers())
    for (slug, profile), runner in runners.PREFERRED_RUNNERS.items():
        assert slug in known and profile in ("smoke", "cpu", "paper") and runner in runners.RUNNERS, (slug, profile)
