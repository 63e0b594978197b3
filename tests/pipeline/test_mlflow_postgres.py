"""A shared tracking server: arm_ebm's smoke flow logs to ``mlflow server`` (the command ``repro ui``
runs) whose backend store is a real PostgreSQL and whose artifacts are proxied into a folder.

The set-up starts a throwaway PostgreSQL cluster (Debian's ``postgresql`` package) on 127.0.0.1 and
the MLflow server on 127.0.0.1; both are stopped at the end. Skipped only where the PostgreSQL
server binaries are not installed (``.ci/system-packages.sh`` installs them).
"""

from __future__ import annotations

import json
import time
from urllib.parse import urlsplit

import pytest

from tests.support import local_servers

pytestmark = [
    pytest.mark.usefixtures("prefect_server"),
    pytest.mark.skipif(local_servers.postgres_bin_dir() is None,
                       reason="PostgreSQL server binaries not installed (apt-get install postgresql; "
                              "see .ci/system-packages.sh)"),
]

SEEDS = [0, 1]


@pytest.fixture(scope="module")
def postgres_tracking(tmp_path_factory):
    """PostgreSQL + ``mlflow server`` with proxied artifacts; the smoke flow run against them."""
    pytest.importorskip("psycopg", reason="psycopg[binary] is SQLAlchemy's driver for postgresql:// URIs")
    from flows import servers
    from tests.conftest import make_output_root

    base = tmp_path_factory.mktemp("mlflow-postgres")
    artifacts = base / "artifacts"
    artifacts.mkdir()
    root = make_output_root(base / "project")
    mp = pytest.MonkeyPatch()
    timings: dict[str, float] = {}
    started = time.monotonic()
    with local_servers.postgres_cluster("mlflow") as backend_uri:
        timings["postgres_start_s"] = time.monotonic() - started
        port = local_servers.free_port()
        command = servers.mlflow_ui_command(port, backend_store_uri=backend_uri,
                                            artifacts_destination=artifacts.as_uri())
        command += ["--workers", "1"]  # two cores: one worker is plenty for one flow
        started = time.monotonic()
        with local_servers.mlflow_server(command, base / "mlflow-server.log", cwd=root) as url:
            timings["mlflow_server_start_s"] = time.monotonic() - started
            mp.setenv("REPRO_ROOT", str(root))
            mp.setenv("MLFLOW_TRACKING_URI", url)
            try:
                from flows.arm_ebm import arm_ebm

                started = time.monotonic()
                result = arm_ebm(profile="smoke", seeds=SEEDS, phase="all")
                timings["flow_s"] = time.monotonic() - started
                print(f"postgres-backed tracking timings: {timings}")
                yield {"url": url, "backend_uri": backend_uri, "artifacts": artifacts, "root": root,
                       "result": result, "log": base / "mlflow-server.log"}
            finally:
                mp.undo()
    # Nothing is left listening: both servers are gone once their context managers exit.
    assert local_servers.port_free(port), f"mlflow server still listens on {port}"
    assert local_servers.port_free(urlsplit(backend_uri).port), "postgres still listens"


@pytest.fixture
def client(postgres_tracking):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=postgres_tracking["url"])


def test_server_is_backed_by_postgres(postgres_tracking):
    """The server's store is the PostgreSQL database: its tables hold the runs, not a local file."""
    import psycopg

    uri = urlsplit(postgres_tracking["backend_uri"])
    with psycopg.connect(host=uri.hostname, port=uri.port, user=uri.username, dbname=uri.path[1:]) as connection:
        counts = dict(connection.execute("SELECT e.name, count(r.run_uuid) FROM experiments e JOIN runs r "
                                         "ON r.experiment_id = e.experiment_id GROUP BY e.name").fetchall())
    assert counts.get("arm_ebm") == 1 + len(SEEDS), counts
    assert not list(postgres_tracking["root"].glob("*.db")), "a local SQLite store was created instead"


def test_parent_and_seed_runs_with_metrics(postgres_tracking, client):
    parent_id = postgres_tracking["result"]["parent_run_id"]
    experiment = client.get_experiment_by_name("arm_ebm")
    assert experiment is not None, "no arm_ebm experiment on the server"
    # Proxied artifacts: the experiment's root is the server's mlflow-artifacts:/ scheme.
    assert experiment.artifact_location.startswith("mlflow-artifacts:"), experiment.artifact_location
    runs = client.search_runs([experiment.experiment_id])
    parent = next(r for r in runs if r.info.run_id == parent_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.tags["kind"] == "flow" and parent.data.tags["profile"] == "smoke"
    assert parent.data.tags["prefect_flow_run_id"] != "none"
    assert parent.data.params["toy.vocab_size"] == "3"
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]
    assert sorted(r.data.tags["seed"] for r in children) == [str(s) for s in SEEDS]
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.metrics["e1_max_logprob_error"] < 1e-8
        # The training curve keeps its steps.
        curve = "curve/gpt2_train_nll"
        assert curve in child.data.metrics, sorted(child.data.metrics)
        history = client.get_metric_history(child.info.run_id, curve)
        assert len(history) > 1 and len({m.step for m in history}) == len(history), history[:3]
    assert parent.data.metrics, "the parent run has no metrics"


def test_claims_table_and_figures_land_on_the_server(postgres_tracking, client, tmp_path):
    parent_id = postgres_tracking["result"]["parent_run_id"]
    run = client.get_run(parent_id)
    assert run.info.artifact_uri.startswith("mlflow-artifacts:"), run.info.artifact_uri
    top = {a.path for a in client.list_artifacts(parent_id)}
    assert {"claims.json", "claims.md", "figures"} <= top, top
    figures = {a.path for a in client.list_artifacts(parent_id, "figures")}
    assert {"figures/kl_vs_horizon.png", "figures/first_token_marginals.png", "figures/nll_curves.png"} <= figures

    # Downloaded through the server, the claims table matches the report written by the flow.
    local = client.download_artifacts(parent_id, "claims.json", str(tmp_path))
    table = json.loads(open(local).read())
    report = json.loads((postgres_tracking["root"] / "reports" / "arm_ebm" / "claims.json").read_text())
    assert table["columns"] and "id" in table["columns"]
    ids = [row[table["columns"].index("id")] for row in table["data"]]
    assert sorted(ids) == sorted(r["id"] for r in report)

    # The bytes themselves sit in the server's artifacts destination, not in the project.
    stored = {p.relative_to(postgres_tracking["artifacts"]).as_posix()
              for p in postgres_tracking["artifacts"].rglob("*") if p.is_file()}
    for name in ("claims.json", "claims.md", "figures/kl_vs_horizon.png"):
        assert any(s.endswith(f"{parent_id}/artifacts/{name}") for s in stored), (name, sorted(stored)[:20])
    png = next(p for p in postgres_tracking["artifacts"].rglob("kl_vs_horizon.png") if parent_id in str(p))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (postgres_tracking["root"] / "mlartifacts").exists()
