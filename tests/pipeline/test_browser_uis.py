"""The UIs as users see them: after a smoke run of arm_ebm, headless Chromium (Debian's ``chromium``)
opens the Prefect UI (the session's server) and the MLflow UI (``mlflow server`` over the run's
store, the command ``repro ui`` runs) and checks, in the rendered pages, that the flow run, the
experiment, its parent and seed runs, the claims table and a figure are shown.

The browser resolves no host but 127.0.0.1, so the pages must work without the internet; every
request a page makes is recorded and any that leaves the machine or fails is an error. Screenshots
go to ``$REPRO_TEST_ARTIFACTS`` (default: ``test-artifacts/`` under pytest's temporary folder).
Skipped only where no Chromium is installed (``.ci/system-packages.sh`` installs it).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from tasks.common.paper_flow import progress_label
from tests.support import local_servers
from tests.support.browser import Browser, chromium_binary

pytestmark = [
    pytest.mark.usefixtures("prefect_server"),
    pytest.mark.skipif(chromium_binary() is None,
                       reason="Chromium not installed (apt-get install chromium; see .ci/system-packages.sh)"),
]

SEEDS = [0, 1]
# Requests that answer an error by design, not for want of the internet:
#   Prefect's server has no /favicon.ico, and its flow-run page asks for an icon named "undefined"
#   (a UI bug of Prefect 3.9); MLflow's UI asks for the signed-in user, a 404 without basic-auth.
EXPECTED_HTTP_ERRORS = ("/favicon.ico: HTTP 404", "/ico/undefined.svg: HTTP 404",
                        "/ajax-api/2.0/mlflow/users/current: HTTP 404")


def screenshot_dir(tmp_path_factory) -> Path:
    folder = os.environ.get("REPRO_TEST_ARTIFACTS")
    path = Path(folder) if folder else tmp_path_factory.getbasetemp() / "test-artifacts"
    path = path / "browser-uis"
    path.mkdir(parents=True, exist_ok=True)
    return path


async def _flow_run_name(flow_run_id: str) -> str:
    from prefect import get_client

    async with get_client() as client:
        return (await client.read_flow_run(flow_run_id)).name


@pytest.fixture(scope="module")
def uis(tmp_path_factory, prefect_server):
    """Smoke run of arm_ebm into a fresh MLflow store, the MLflow UI over it, and one browser."""
    from mlflow.tracking import MlflowClient

    from flows import servers
    from tests.conftest import make_output_root

    base = tmp_path_factory.mktemp("browser-uis")
    shots = screenshot_dir(tmp_path_factory)
    root = make_output_root(base / "project")
    store = f"sqlite:///{base / 'mlflow.db'}"
    mp = pytest.MonkeyPatch()
    mp.setenv("REPRO_ROOT", str(root))
    mp.setenv("MLFLOW_TRACKING_URI", store)
    mp.setenv("REPRO_MLARTIFACTS", str(base / "mlartifacts"))
    try:
        from flows.arm_ebm import arm_ebm

        result = arm_ebm(profile="smoke", seeds=SEEDS, phase="all")
        parent = MlflowClient(tracking_uri=store).get_run(result["parent_run_id"])
        flow_run_id = parent.data.tags["prefect_flow_run_id"]
        port = local_servers.free_port()
        command = servers.mlflow_ui_command(port, artifacts_destination=(base / "served-artifacts").as_uri())
        command += ["--workers", "1"]
        with local_servers.mlflow_server(command, base / "mlflow-server.log", cwd=root) as mlflow_url, \
                Browser(base / "chromium.log") as browser:
            yield {
                "browser": browser, "shots": shots, "root": root, "result": result,
                "experiment_id": parent.info.experiment_id, "parent_run_id": parent.info.run_id,
                "flow_run_id": flow_run_id, "flow_run_name": asyncio.run(_flow_run_name(flow_run_id)),
                "prefect_ui": prefect_server.removesuffix("/api"), "mlflow_ui": mlflow_url,
            }
        assert local_servers.port_free(port), f"mlflow server still listens on {port}"
    finally:
        mp.undo()


def assert_offline_clean(browser: Browser, page: str) -> None:
    """Nothing the page loaded came from, or failed for want of, anything but this machine."""
    problems = browser.problems()
    unexpected_http = [e for e in problems["http_errors"] if not e.endswith(EXPECTED_HTTP_ERRORS)]
    # The console repeats each HTTP error as "Failed to load resource"; those are judged above.
    console = [c for c in problems["console_errors"] if not c.startswith("Failed to load resource")]
    assert not problems["external"], f"{page} requested hosts beyond 127.0.0.1: {problems['external']}"
    assert not problems["failed"], f"{page} had failed loads: {problems['failed']}"
    assert not unexpected_http, f"{page} got HTTP errors: {unexpected_http}"
    assert not problems["exceptions"], f"{page} threw: {problems['exceptions']}"
    assert not console, f"{page} logged errors: {console}"
    assert browser.requests(), f"{page}: no request recorded (is the Network domain on?)"


def test_prefect_ui_shows_the_flow_run(uis):
    browser, shots, name = uis["browser"], uis["shots"], uis["flow_run_name"]
    started = time.monotonic()
    text = browser.open(f"{uis['prefect_ui']}/runs", ["arm_ebm", name, "Completed"],
                        shots / "prefect-flow-runs.png")
    assert "Flow runs" in text
    assert_offline_clean(browser, "Prefect flow-runs page")
    browser.open(f"{uis['prefect_ui']}/runs/flow-run/{uis['flow_run_id']}", ["arm_ebm", name, "Completed"],
                 shots / "prefect-flow-run.png")
    assert_offline_clean(browser, "Prefect flow-run page")
    # The Logs tab shows the run's own log lines, the per-seed progress among them (issue 22: with progress
    # printed at WARNING level it said "This run didn't generate logs").
    browser.click_text("Logs")
    text = browser.wait_for([f"{progress_label('arm_ebm', SEEDS[0], 'train')} ", "%", "ETA"],
                            shots / "prefect-flow-run-logs.png", timeout_s=60)
    assert "didn't generate logs" not in text
    assert_offline_clean(browser, "Prefect flow-run logs")
    # The run's steps, as the contract names them (tasks/common/paper_flow.py): the task-runs tab lists them.
    browser.click_text("Task Runs")
    steps = ["prepare-data", *[f"{step}-seed-{s}" for step in ("train", "evaluate") for s in SEEDS],
             "claim-metrics", "make-figures", "publish-claims"]
    browser.wait_for(steps, shots / "prefect-flow-run-steps.png", timeout_s=60)
    assert_offline_clean(browser, "Prefect flow-run task runs")
    print(f"Prefect UI pages rendered in {time.monotonic() - started:.1f} s; screenshots in {shots}")


def test_mlflow_ui_shows_experiment_runs_and_claims(uis):
    browser, shots, ui = uis["browser"], uis["shots"], uis["mlflow_ui"]
    experiment, parent = uis["experiment_id"], uis["parent_run_id"]
    started = time.monotonic()
    browser.open(f"{ui}/#/experiments", ["arm_ebm"], shots / "mlflow-experiments.png")
    assert_offline_clean(browser, "MLflow experiments page")

    # A click on the experiment, as a user arrives. MLflow 3.17 lands by its UI's workflow toggle (GenAI by
    # default, kept in the browser's localStorage), not by the experiment's mlflow.experimentKind tag: on the
    # GenAI overview first (hence `repro ui`'s hint), on the runs table once "Model training" is chosen.
    browser.click_text("arm_ebm")
    browser.wait_for(["Overview", "Traces"], shots / "mlflow-experiment-clicked-genai-default.png", timeout_s=60)
    landed = browser.evaluate("location.hash")
    assert "workflowType=genai" in landed, f"MLflow's default landing changed ({landed}): revisit repro ui's hint"
    browser.open(f"{ui}/#/experiments", ["arm_ebm", "Model training"], shots / "mlflow-experiments.png")
    browser.click_text("Model training")
    browser.click_text("arm_ebm")
    browser.wait_for(["arm_ebm-smoke", f"{1 + len(SEEDS)} matching runs"], shots / "mlflow-experiment-clicked.png",
                     timeout_s=60)
    landed = browser.evaluate("location.hash")
    assert landed.startswith(f"#/experiments/{experiment}/runs"), landed
    assert_offline_clean(browser, "MLflow experiment page, reached by a click")

    runs_url = f"{ui}/#/experiments/{experiment}/runs"
    browser.open(runs_url, ["arm_ebm-smoke", f"{1 + len(SEEDS)} matching runs"], shots / "mlflow-runs.png")
    assert_offline_clean(browser, "MLflow runs page")
    browser.click_in_row_of("arm_ebm-smoke")  # unfold the parent run: its seed runs show under it
    browser.wait_for([f"seed-{s}" for s in SEEDS], shots / "mlflow-runs-expanded.png")

    rows = json.loads((uis["root"] / "reports" / "arm_ebm" / "claims.json").read_text())
    first = rows[0]
    text = browser.open(f"{runs_url}/{parent}/artifacts/claims.json",
                        ["claims.json", "View as table", first["id"], first["verdict"], "arm_ebm-smoke"],
                        shots / "mlflow-claims-table.png")
    assert_offline_clean(browser, "MLflow claims table")
    shown = [r["id"] for r in rows if f"\n{r['id']}\n" in text]
    assert len(shown) >= min(len(rows), 10), f"claims table shows {shown} of {[r['id'] for r in rows]}"

    browser.open(f"{runs_url}/{parent}/artifacts/figures/kl_vs_horizon.png", ["kl_vs_horizon.png"],
                 shots / "mlflow-figure.png")
    deadline = time.monotonic() + 30
    drawn = 0
    while time.monotonic() < deadline and not drawn:
        # The viewer fetches the PNG from the server and shows it from a blob: URL.
        drawn = browser.evaluate("Math.max(0, ...[...document.images].filter(i => i.complete && "
                                 "(i.src || '').startsWith('blob:')).map(i => i.naturalWidth))")
        time.sleep(0.5)
    browser.screenshot(shots / "mlflow-figure.png")
    assert drawn and drawn > 300, f"the figure never rendered (naturalWidth {drawn}); see {shots / 'mlflow-figure.png'}"
    assert any("kl_vs_horizon.png" in url for url in browser.requests()), "the figure was not fetched"
    assert_offline_clean(browser, "MLflow figure page")
    print(f"MLflow UI pages rendered in {time.monotonic() - started:.1f} s; screenshots in {shots}")
