"""``--runner dask``: seeds fanned out over Dask worker processes give the same numbers as threads."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import make_output_root
from tests.pipeline.helpers import project_env, run_stage

pytestmark = pytest.mark.usefixtures("prefect_server")
SEEDS = ("0", "1")


def seed_metrics(root: Path, seed: str) -> dict[str, float]:
    """Every metric of one seed (training record and evaluation) but wall-clock timings, which are the only
    thing allowed to differ."""
    trained = json.loads((root / "models" / "arm_ebm" / f"seed{seed}" / "train.json").read_text())["result"]
    evaluated = json.loads((root / "reports" / "arm_ebm" / "evaluation" / f"seed{seed}.json").read_text())
    metrics = trained["metrics"] | evaluated["metrics"]
    return {k: v for k, v in metrics.items() if not k.startswith("seconds_")}


@pytest.fixture(scope="module")
def dask_cluster():
    """A 2-worker cluster of separate processes, reached by address as a remote one would be."""
    distributed = pytest.importorskip("distributed")
    from flows.runners import local_cluster_kwargs

    cluster = distributed.LocalCluster(**local_cluster_kwargs())
    client = distributed.Client(cluster)
    yield cluster, client
    client.close()
    cluster.close()


def test_dask_runner_matches_threads(tmp_path, dask_cluster):
    cluster, client = dask_cluster
    runs = {}
    for runner in ("threads", "dask"):
        root = make_output_root(tmp_path / runner)
        extra = ["--dask-address", cluster.scheduler_address] if runner == "dask" else []
        done = run_stage(root, "arm_ebm", "--profile", "smoke", "--seeds", *SEEDS, "--runner", runner, *extra,
                         env=project_env(root))
        assert done.returncode == 0, done.stderr[-4000:]
        runs[runner] = root
    for seed in SEEDS:
        threaded, fanned_out = seed_metrics(runs["threads"], seed), seed_metrics(runs["dask"], seed)
        assert threaded.keys() == fanned_out.keys() and len(threaded) > 5
        assert threaded == fanned_out, {k: (threaded[k], fanned_out[k]) for k in threaded
                                        if threaded[k] != fanned_out[k]}
    # The seeds really trained and were evaluated in the worker processes, not in the flow's process.
    ran_there = client.run(lambda: {"tasks.arm_ebm.train", "tasks.arm_ebm.evaluate"} <= set(sys.modules))
    assert any(ran_there.values()), ran_there
    claims = {r["id"]: r["verdict"] for r in json.loads((runs["dask"] / "reports" / "arm_ebm" / "claims.json")
                                                         .read_text())}
    assert claims["C1"] == "verified"  # an identity (tasks/arm_ebm/claims.yaml)


def test_bad_runner_is_refused_before_compute(tmp_path):
    root = make_output_root(tmp_path / "bad")
    for args, key in ((["--runner", "ray"], "--runner"),
                      (["--dask-address", "tcp://127.0.0.1:1"], "dask_address"),
                      (["--runner", "dask", "--dask-address", "localhost:8786"], "dask_address")):
        done = run_stage(root, "arm_ebm", "--profile", "smoke", *args, timeout=60)
        assert done.returncode == 2, (args, done.stderr)
        assert key in done.stderr, (args, done.stderr)
    assert not (root / "models").exists()


def test_runner_from_environment(monkeypatch):
    from flows.runners import RunnerError, resolve_runner

    monkeypatch.delenv("REPRO_RUNNER", raising=False)
    monkeypatch.delenv("REPRO_DASK_ADDRESS", raising=False)
    assert resolve_runner(None, None) == ("threads", None)
    monkeypatch.setenv("REPRO_RUNNER", "dask")
    monkeypatch.setenv("REPRO_DASK_ADDRESS", "tcp://127.0.0.1:8786")
    assert resolve_runner(None, None) == ("dask", "tcp://127.0.0.1:8786")
    # A flag beats the environment, and the environment's address is dropped with --runner threads.
    assert resolve_runner("threads", None) == ("threads", None)
    with pytest.raises(RunnerError, match="dask_address"):
        resolve_runner("threads", "tcp://127.0.0.1:8786")
    monkeypatch.setenv("REPRO_RUNNER", "processes")
    with pytest.raises(RunnerError, match="runner: must be one of"):
        resolve_runner(None, None)
