"""Ctrl-C, SIGTERM and SIGHUP stop a run within seconds, end its helper processes, close its Prefect and MLflow
records, and a rerun resumes without redoing finished seeds (issue 21).

Each scenario runs ``python -m flows.stage`` in a session of its own, as a shell runs a command: Ctrl-C and
a closed terminal signal the whole process group (the embedded Prefect server and Dask's worker processes
included), ``kill PID`` (what a scheduler sends first) only the run's process. The Prefect server is either
the session's persistent one (``PREFECT_API_URL``) or the embedded one that a run without ``PREFECT_API_URL``
starts for itself; the latter dies with the run, so its flow run state is read from its database afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tasks.common import interrupts
from tests.conftest import make_output_root
from tests.pipeline.helpers import project_env, run_stage, seed_files, slow_smoke_params, train_markers

SEEDS = ["0", "1", "2", "3", "4", "5"]
STOP_LIMIT_S = 10.0


@dataclass(frozen=True)
class Scenario:
    server: str  # "persistent" (the session's server) or "embedded" (no PREFECT_API_URL)
    runner: str  # "threads" or "dask"
    signal: signal.Signals
    to_group: bool  # the whole process group (Ctrl-C, terminal closed) or the run's process only (kill PID)
    during: str  # "train" (no MLflow run open yet) or "evaluate" (the MLflow parent run is open)

    def __str__(self) -> str:
        target = "group" if self.to_group else "process"
        return f"{self.server}-{self.runner}-{self.signal.name}-to-{target}-during-{self.during}"


QUICK = [
    Scenario("persistent", "threads", signal.SIGINT, True, "train"),
    Scenario("persistent", "threads", signal.SIGTERM, False, "train"),
    Scenario("embedded", "threads", signal.SIGINT, True, "train"),
]
# Over a minute each (an embedded server's or a Dask cluster's start, the rerun): `-m slow`.
LONG = [
    Scenario("embedded", "threads", signal.SIGTERM, False, "evaluate"),
    Scenario("embedded", "threads", signal.SIGHUP, True, "train"),
    Scenario("embedded", "dask", signal.SIGINT, True, "train"),
    Scenario("embedded", "dask", signal.SIGTERM, False, "evaluate"),
    Scenario("persistent", "dask", signal.SIGINT, True, "evaluate"),
]
SCENARIOS = QUICK + [pytest.param(s, marks=pytest.mark.slow, id=str(s)) for s in LONG]


def default_signals() -> None:
    """In the run's process before exec: the signals under test at their default disposition, as in a terminal.
    A test session started under nohup or as a background job would hand them over ignored, and the handler
    rightly leaves an ignored signal ignored."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def run_env(root: Path, scenario: Scenario, request: pytest.FixtureRequest) -> dict[str, str]:
    """The run's environment: its own MLflow store (to find its parent run), and either the session's Prefect
    server or none (the embedded server then keeps its database in the root's PREFECT_HOME)."""
    env = project_env(root, MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}")
    if scenario.server == "persistent":
        env["PREFECT_API_URL"] = request.getfixturevalue("prefect_server")
    else:
        env.pop("PREFECT_API_URL", None)
        env["PREFECT_HOME"] = str(root / ".prefect")
    return env


def persistent_flow_run_states(name: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[name])))
    return [r.state.type.value for r in runs]


def embedded_flow_run_states(prefect_home: Path, name: str) -> list[str]:
    """The flow runs' state types in the embedded server's SQLite database, read after the server stopped
    (Prefect's schema: ``flow_run.state_type``, the type of the run's current state)."""
    with sqlite3.connect(f"file:{prefect_home / 'prefect.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT flow_run.state_type FROM flow_run JOIN flow ON flow.id = flow_run.flow_id "
                          "WHERE flow.name = ?", (name,)).fetchall()
    return [state for (state,) in rows]


def flow_run_states(scenario: Scenario, root: Path) -> list[str]:
    if scenario.server == "persistent":
        return persistent_flow_run_states("arm_ebm")
    if not (root / ".prefect" / "prefect.db").exists():
        return []
    return embedded_flow_run_states(root / ".prefect", "arm_ebm")


def parent_mlflow_runs(root: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("arm_ebm")
    if experiment is None:
        return []
    return [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("kind") == "flow"]


def processes_of(root: Path) -> list[psutil.Process]:
    """Live processes started for this run, found by the ``REPRO_ROOT`` every one of them inherits (also those
    started after any snapshot, e.g. a Dask worker restarted by its nanny, and orphans adopted by init)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and process.environ().get("REPRO_ROOT") == str(root):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def helpers_left(root: Path, wait_s: float = 5.0) -> list[str]:
    """The command lines of the run's processes still alive ``wait_s`` seconds after it exited."""
    deadline = time.monotonic() + wait_s
    while (alive := processes_of(root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [" ".join(p.cmdline()) for p in alive]


def evaluations(root: Path) -> list[Path]:
    return sorted((root / "reports" / "arm_ebm" / "evaluation").glob("seed*.json"))


def wait_until_in(scenario: Scenario, root: Path, process: subprocess.Popen, log: Path, timeout_s: float = 480
                  ) -> None:
    """Until some seeds finished training and others have not (``train``), or the evaluation has started
    (``evaluate``: the MLflow parent run is open)."""
    landed = (lambda: bool(train_markers(root))) if scenario.during == "train" else (lambda: bool(evaluations(root)))
    deadline = time.monotonic() + timeout_s
    while not landed():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"the run ended or stalled before its {scenario.during} phase: "
                                 f"{log.read_text()[-3000:]}")
        time.sleep(0.05)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_a_signal_stops_the_run_within_seconds_ends_its_helpers_and_a_rerun_resumes(tmp_path, request, scenario):
    root = make_output_root(tmp_path / "p", slow_smoke_params())
    env = run_env(root, scenario, request)
    before = flow_run_states(scenario, root)
    command = [sys.executable, "-m", "flows.stage", "arm_ebm", "--phase", "all", "--seeds", *SEEDS,
               "--runner", scenario.runner]
    # Output to a file, not a pipe: a helper process left behind would hold a pipe open, and reading it to its
    # end would wait for that process instead of the run.
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr_file:
        process = subprocess.Popen(command, cwd=root, env=env, start_new_session=True, preexec_fn=default_signals,
                                   stdout=subprocess.DEVNULL, stderr=stderr_file)
    try:
        wait_until_in(scenario, root, process, log)
        helpers = [p for p in processes_of(root) if p.pid != process.pid]
        finished = {seed: seed_files(path.parent) for seed, path in train_markers(root).items()}
        sent = time.monotonic()
        if scenario.to_group:
            os.killpg(process.pid, scenario.signal)
        else:
            process.send_signal(scenario.signal)
        process.wait(timeout=120)
        stopped_after = time.monotonic() - sent
        stderr = log.read_text()
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    print(f"{scenario}: {stopped_after:.1f} s from {scenario.signal.name} to exit")
    assert process.returncode == 128 + scenario.signal, stderr[-3000:]
    assert stopped_after < STOP_LIMIT_S, f"{stopped_after:.1f} s from {scenario.signal.name} to exit"
    # After the handler's line, only the seeds' own progress lines still under way (no traceback, no warning,
    # no error: Prefect's "could not" included), and few of them.
    _, stopping, tail = stderr.partition(f"{scenario.signal.name}: stopping")
    after = tail.strip().splitlines()[1:]
    assert stopping and len(after) <= 10 and all(" | INFO " in line for line in after), tail
    # Every process the run had started (the embedded server, Dask's workers) is gone; there were some.
    assert helpers or (scenario.server, scenario.runner) == ("persistent", "threads")
    assert not helpers_left(root), helpers_left(root, 0)
    after = flow_run_states(scenario, root)
    assert len(after) == len(before) + 1, (before, after)
    assert after.count("CANCELLED") == before.count("CANCELLED") + 1 and "RUNNING" not in after, after
    if scenario.during == "evaluate":
        [parent] = parent_mlflow_runs(root)
        assert parent.info.status == "FAILED", parent.info.status
        assert parent.data.tags["interrupted"] == f"stopped by {scenario.signal.name}"
    if scenario.during == "train":
        assert finished and len(finished) < len(SEEDS), "the signal did not land between seeds' trainings"
    else:
        assert len(finished) == len(SEEDS)

    again = run_stage(root, "arm_ebm", "--phase", "all", "--seeds", *SEEDS, "--runner", scenario.runner, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    for seed, files in finished.items():
        # The marker and every checkpoint of a seed that had finished are untouched: not trained again.
        assert seed_files(root / "models" / "arm_ebm" / seed) == files, f"{seed} was retrained"
    assert sorted(train_markers(root)) == [f"seed{s}" for s in SEEDS]
    rows = json.loads((root / "reports" / "arm_ebm" / "claims.json").read_text())
    assert rows and all(r["profile"] == "smoke" for r in rows)
    assert sorted(r.info.status for r in parent_mlflow_runs(root)) == (
        ["FAILED", "FINISHED"] if scenario.during == "evaluate" else ["FINISHED"])


def test_open_mlflow_runs_are_marked_failed(output_root, monkeypatch):
    from tasks.common import tracking

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{output_root / 'mlflow.db'}")
    run_id = tracking.start_run("arm_ebm", "interrupted-run", {"kind": "flow"})
    interrupts.opened(mlflow_run_id=run_id)
    interrupts.close_open_runs("stopped by SIGINT")
    run = tracking._client().get_run(run_id)
    assert run.info.status == "FAILED" and run.data.tags["interrupted"] == "stopped by SIGINT"
    assert not interrupts.OPEN_MLFLOW_RUNS


def test_a_finished_flow_leaves_nothing_to_close():
    interrupts.opened(mlflow_run_id="x", flow_run_id="y")
    interrupts.forget_all()
    assert not interrupts.OPEN_MLFLOW_RUNS and not interrupts.OPEN_FLOW_RUNS
