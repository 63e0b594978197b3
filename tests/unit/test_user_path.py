"""The everyday user path around the runs: `repro list` / `repro run --help` text, `repro ui` on a taken
port, the MLflow experiment kind (runs table, not the GenAI traces page) and the links between the two UIs."""

from __future__ import annotations

import socket

import pytest

from flows import cli, servers
from tasks.common import tracking
from tasks.common.claims import claims_markdown


def test_format_table_sizes_each_column_to_its_longest_cell():
    text = cli.format_table(["a", "bb", "c"], [["long-paper-name", "x", "tail that is long"], ["p", "yyyy", "z"]])
    lines = text.splitlines()
    assert lines[0] == "a                bb    c"
    assert lines[1] == "long-paper-name  x     tail that is long"
    assert lines[2] == "p                yyyy  z"


def test_list_columns_line_up(capsys):
    assert cli.main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines[0].index("last run")
    # Every row's third column starts where its header does: no column overflows into the next.
    assert all(line[start - 2:start] == "  " and line[start] != " " for line in lines[1:])


def test_run_help_lists_the_papers_and_explains_the_phases(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run", "--help"])
    out = capsys.readouterr().out
    from flows.registry import papers

    assert all(slug in out for slug in papers())
    for phase in ("data", "train", "evaluate", "run", "all"):
        assert f"\n  {phase} " in out


def test_ui_on_a_taken_port_fails_before_starting_anything(monkeypatch, capsys):
    started = []
    monkeypatch.setattr(servers, "start_prefect", lambda *a, **k: started.append(1) or "http://x/api")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert not servers.port_free(port)
        assert cli.main(["ui", "--port", str(port)]) == 2
    assert started == []
    assert f"--port {port}: the port is in use" in capsys.readouterr().err
    assert servers.port_free(port)


def test_new_and_old_experiments_open_on_the_runs_table(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("REPRO_MLARTIFACTS", str(tmp_path / "mlartifacts"))
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    new_id = tracking.get_or_create_experiment("paper_a")
    # An experiment written before the tag existed gets it on its next run.
    old_id = client.create_experiment("paper_b", tags={"paper": "paper_b"})
    assert tracking.get_or_create_experiment("paper_b") == old_id
    for experiment_id in (new_id, old_id):
        tags = client.get_experiment(experiment_id).tags
        assert tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
    urls = tracking.experiments_runs_urls()
    assert urls == {"paper_a": f"http://127.0.0.1:5000/#/experiments/{new_id}/runs",
                    "paper_b": f"http://127.0.0.1:5000/#/experiments/{old_id}/runs"}


def test_run_urls_follow_the_tracking_server(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.lab:8080/")
    assert tracking.run_url("3", "abc") == "http://mlflow.lab:8080/#/experiments/3/runs/abc"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///x.db")
    monkeypatch.setenv("REPRO_MLFLOW_PORT", "5055")
    assert tracking.experiment_runs_url("7") == "http://127.0.0.1:5055/#/experiments/7/runs"


def test_prefect_flow_run_url(monkeypatch):
    assert tracking.prefect_flow_run_url(None) is None
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4321/api")
    assert tracking.prefect_flow_run_url("0000-11") == "http://127.0.0.1:4321/runs/flow-run/0000-11"
    monkeypatch.setenv("PREFECT_UI_URL", "http://prefect.lab/")
    assert tracking.prefect_flow_run_url("0000-11") == "http://prefect.lab/runs/flow-run/0000-11"
    monkeypatch.delenv("PREFECT_UI_URL")
    monkeypatch.delenv("PREFECT_API_URL")
    assert tracking.prefect_flow_run_url("0000-11") is None  # no server outside a flow: no link


def test_claims_table_header_names_each_column_once():
    row = {"paper": "p", "id": "C1", "kind": "empirical", "claim": "x", "paper_value": 1, "metric": "m",
           "check": "> 0", "preconditions": [], "mean": 1.0, "ci_low": 0.5, "ci_high": 1.5, "n_seeds": 3,
           "verdict": "reproduced", "fidelity": "reconstructed", "seeds_needed": None, "interval": "t"}
    header = claims_markdown([row], with_paper=True).splitlines()[0]
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert len(cells) == len(set(cells)), cells


def test_headline_metrics_count_empirical_verdicts_and_mechanism_apart():
    from tasks.common.claims import headline_metrics

    rows = [{"kind": "empirical", "verdict": "reproduced"}, {"kind": "empirical", "verdict": "reproduced"},
            {"kind": "empirical", "verdict": "not reproduced"}, {"verdict": "inconclusive"},
            {"kind": "empirical", "verdict": "report only"}, {"kind": "empirical", "verdict": "undecided"},
            {"kind": "empirical", "verdict": "not testable at this profile"},
            {"kind": "mechanism", "verdict": "reproduced"}, {"kind": "mechanism", "verdict": "not reproduced"},
            {"kind": "mechanism", "verdict": "report only"}, {"kind": "identity", "verdict": "verified"}]
    assert headline_metrics(rows, 5) == {
        "empirical": 6, "reproduced": 2, "not_reproduced": 1, "inconclusive": 1, "undecided": 1,
        "not_testable": 1, "mech_reproduced": 1, "mechanism": 2, "seeds": 5}


def test_committed_headlines_match_the_committed_claims():
    """headline.json (DVC's metric) says what claims.json says, for every paper in the pipeline."""
    import json

    from flows.registry import papers
    from tasks.common.claims import headline_metrics
    from tests.conftest import REPO

    for slug in papers():
        reports = REPO / "reports" / slug
        if not (reports / "claims.json").exists():
            continue
        rows = json.loads((reports / "claims.json").read_text())
        n_seeds = json.loads((reports / "metrics.json").read_text())["n_seeds"]
        assert json.loads((reports / "headline.json").read_text()) == headline_metrics(rows, n_seeds), slug


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_seed_progress_logs_each_tenth_with_an_eta_and_no_doubled_seed_prefix():
    from tasks.common.paper_flow import SeedProgress

    lines, percents, clock = [], [], FakeClock()
    progress = SeedProgress("arm_ebm", 3, "train", lines.append, percents.append, every_s=30.0, clock=clock)
    for step in range(1, 1001):  # a step that reports every one of 1000 training steps
        clock.now += 0.05
        progress(step / 1000, f"seed 3: GPT-2 step {step}/1000, loss 0.5")
    # one line per tenth (10%, ..., 100%) and the first call; not a thousand
    assert len(lines) == 11, lines
    assert lines[0] == "[arm_ebm] train seed 3   0% GPT-2 step 1/1000, loss 0.5 (0 s, ETA 50 s)"
    assert lines[5] == "[arm_ebm] train seed 3  50% GPT-2 step 500/1000, loss 0.5 (25 s, ETA 25 s)"
    assert lines[-1] == "[arm_ebm] train seed 3 100% GPT-2 step 1000/1000, loss 0.5 (50 s, done)"
    assert percents[-1] == 100.0 and len(percents) == 101  # the UI's bar moves by whole percents


def test_seed_progress_logs_a_slow_step_every_interval():
    from tasks.common.paper_flow import SeedProgress

    lines, clock = [], FakeClock()
    progress = SeedProgress("p", 0, "evaluate", lines.append, lambda _: None, every_s=30.0, clock=clock)
    progress(0.0, "start")
    clock.now += 31
    progress(0.01, "still going")  # same tenth, but 31 s later: logged
    clock.now += 5
    progress(0.02, "quiet")  # same tenth, 5 s later: not logged
    assert [line.split("% ")[1].split(" (")[0] for line in lines] == ["start", "still going"]


def test_run_summary_names_counts_claims_file_and_run(monkeypatch):
    from flows import stage
    from tasks.common import tracking

    monkeypatch.setattr(tracking, "run_url_of", lambda run_id: f"http://127.0.0.1:5000/#/experiments/1/runs/{run_id}")
    text = stage.run_summary("arm_ebm", "cpu", [0, 1, 2], {
        "parent_run_id": "abc", "verdicts": {"C1": "reproduced", "C2": "reproduced", "C3": "inconclusive"}})
    lines = text.splitlines()
    assert lines[0] == "[arm_ebm] cpu, seeds [0, 1, 2]: 1 inconclusive, 2 reproduced"
    assert lines[1].startswith("[arm_ebm] claims: ") and lines[1].endswith("reports/arm_ebm/claims.md")
    assert lines[2] == "[arm_ebm] MLflow run: http://127.0.0.1:5000/#/experiments/1/runs/abc (open with `repro ui`)"


def test_seed_progress_of_a_fast_step_is_brief():
    from tasks.common.paper_flow import SeedProgress

    lines, clock = [], FakeClock()
    progress = SeedProgress("p", 0, "train", lines.append, lambda _: None, clock=clock)
    for step in range(1, 21):  # a two-second smoke training
        clock.now += 0.1
        progress(step / 20, f"step {step}")
    assert [line.split("% ")[1].split(" (")[0] for line in lines] == ["step 1", "step 20"]


def test_user_errors_lose_their_traceback_in_prefects_log_but_bugs_keep_it():
    import logging
    import sys

    from tasks.common.paper_flow import RunError, UserErrorTracebackFilter
    from tasks.common.tracking import TrackingStoreError

    def record_of(error):
        try:
            raise error
        except Exception:
            return logging.LogRecord("prefect.flow_runs", logging.ERROR, __file__, 1, "failed: %r", (error,),
                                     sys.exc_info())

    for user_error in (RunError("run the data phase first"), TrackingStoreError("mlflow.db is damaged")):
        record = record_of(user_error)
        assert UserErrorTracebackFilter().filter(record) and record.exc_info is None
    bug = record_of(ZeroDivisionError("a bug"))
    assert UserErrorTracebackFilter().filter(bug) and bug.exc_info is not None
