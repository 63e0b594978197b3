"""A process work pool: deploy, start a worker, trigger a paper's smoke run through the API, wait
for it to complete, and find its MLflow run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import REPO, make_output_root
from tests.pipeline.helpers import BIN, project_env

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_worker_runs_a_deployment_triggered_through_the_api(tmp_path):
    root = make_output_root(tmp_path / "project")
    env = project_env(root)
    pool = "test-process-pool"
    deployed = subprocess.run([sys.executable, "-m", "flows.cli", "deploy", "--pool", pool, "--profile", "smoke",
                               "--seeds", "0"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", pool, "--type", "process"],
                              cwd=REPO, env=env, start_new_session=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        from prefect.deployments import run_deployment

        flow_run = run_deployment("arm_ebm/arm_ebm", parameters={"profile": "smoke", "seeds": [0]}, timeout=600)
        assert flow_run.state.is_completed(), flow_run.state
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        output = worker.communicate(timeout=60)[0]
    assert flow_run.work_pool_name == pool
    assert "started!" in output, output[-2000:]
    from tasks.common.tracking import find_runs

    runs = find_runs("arm_ebm", f"tags.prefect_flow_run_id = '{flow_run.id}' and tags.kind = 'flow'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert (root / "reports" / "arm_ebm" / "claims.json").exists()
