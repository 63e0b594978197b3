"""`repro serve`: deployments per paper flow, triggered through the Prefect API, complete."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tests.conftest import REPO, make_output_root
from tests.pipeline.helpers import project_env

pytestmark = pytest.mark.usefixtures("prefect_server")


async def _deployment_names() -> set[str]:
    from prefect import get_client

    async with get_client() as client:
        deployments = await client.read_deployments()
        flows = {f.id: f.name for f in await client.read_flows()}
    return {f"{flows[d.flow_id]}/{d.name}" for d in deployments}


def test_serve_deployment_runs_through_the_api(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["profile"] = "smoke"  # the deployment runs smoke: its outputs are then the committed ones
    root = make_output_root(tmp_path / "project", yaml.safe_dump(params))
    serve = subprocess.Popen([sys.executable, "-m", "flows.cli", "serve", "--profile", "smoke", "--seeds", "0",
                              "--cron", "0 3 * * *"], cwd=REPO, env=project_env(root), start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    # serve registers the deployments one after another: wait for all of them.
    expected = {f"{slug}/{slug}" for slug in params["papers"]} | {"reproduce-all/reproduce-all"}
    try:
        deadline = time.monotonic() + 180
        while not expected <= (registered := asyncio.run(_deployment_names())):
            assert serve.poll() is None, serve.stdout.read()[-3000:]
            assert time.monotonic() < deadline, f"deployments never registered: {sorted(expected - registered)}"
            time.sleep(2)
        from prefect.deployments import run_deployment

        flow_run = run_deployment("arm_ebm/arm_ebm", parameters={"profile": "smoke", "seeds": [0]}, timeout=600)
        assert flow_run.state.is_completed(), flow_run.state
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=60)
    from tasks.common.tracking import find_runs

    runs = find_runs("arm_ebm", f"tags.prefect_flow_run_id = '{flow_run.id}' and tags.kind = 'flow'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert (root / "reports" / "arm_ebm" / "claims.json").exists()
