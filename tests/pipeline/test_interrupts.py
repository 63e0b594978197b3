"""Ctrl-C and SIGTERM stop a run within seconds, close its Prefect and MLflow records, and a rerun resumes
(issue 21)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import yaml

from tasks.common import interrupts
from tests.conftest import REPO, make_output_root
from tests.pipeline.helpers import project_env

pytestmark = pytest.mark.usefixtures("prefect_server")


def long_training_params() -> str:
    """The smoke profile with a GPT-2 that trains for minutes, so the signal lands mid-training."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["profile"] = "smoke"
    params["arm_ebm"]["smoke"]["gpt2"].update(steps=200_000)
    return yaml.safe_dump(params)


def flow_run_states(name: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[name])))
    return [r.state.type.value for r in runs]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_within_seconds_and_cancels_the_flow_run(tmp_path, sig):
    root = make_output_root(tmp_path / "p", long_training_params())
    before = flow_run_states("arm_ebm")
    process = subprocess.Popen([sys.executable, "-m", "flows.stage", "arm_ebm", "--phase", "all", "--seeds", "0",
                                "1"], cwd=root, env=project_env(root), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not list((root / "data" / "arm_ebm").glob("*.parquet")):  # the data phase is done; training is next
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[1][-3000:]
        time.sleep(0.5)
    time.sleep(5)
    sent = time.monotonic()
    process.send_signal(sig)
    _, stderr = process.communicate(timeout=60)
    stopped_after = time.monotonic() - sent
    assert process.returncode == 128 + sig, stderr[-3000:]
    assert stopped_after < 10, f"{stopped_after:.1f} s from {sig.name} to exit"
    tail = stderr.split(f"{sig.name}: stopping")[-1]
    assert "Traceback" not in tail and len(tail.splitlines()) <= 3, tail
    after = flow_run_states("arm_ebm")
    assert len(after) == len(before) + 1
    assert after.count("CANCELLED") == before.count("CANCELLED") + 1 and "RUNNING" not in after
    # Nothing half-written: only finished files or the atomic writer's temp siblings, which a rerun clears.
    for path in (root / "models").rglob("*"):
        assert path.is_dir() or path.suffix != ".safetensors" or path.stat().st_size > 0


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
