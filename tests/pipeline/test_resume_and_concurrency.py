"""Reliability: kill and resume, determinism, two flows on one MLflow store, no network."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from tasks.common.claims import NOT_TESTABLE, REPORT_ONLY
from tests.conftest import REPO, make_output_root
from tests.pipeline.helpers import project_env, run_stage, seed_files, slow_smoke_params, train_markers

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_killed_run_resumes_without_redoing_finished_seeds(tmp_path):
    root = make_output_root(tmp_path / "project", slow_smoke_params())
    env = project_env(root)
    seeds = ["--seeds", "0", "1", "2", "3", "4", "5"]
    assert run_stage(root, "arm_ebm", "--phase", "data", *seeds, env=env).returncode == 0
    process = subprocess.Popen([sys.executable, "-m", "flows.stage", "arm_ebm", "--phase", "run", *seeds],
                               cwd=root, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not train_markers(root) and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    markers = train_markers(root)
    assert markers, "no seed finished training before the kill"
    assert len(markers) < 6, "every seed finished training before the kill: the test did not interrupt training"
    finished = {seed: seed_files(path.parent) for seed, path in markers.items()}
    # A writer killed mid-write leaves only its temp sibling (*.partial); every final file is whole.
    for seed, files in finished.items():
        record = json.loads(files["train.json"][1])
        assert record["seed"] == int(seed.removeprefix("seed"))
        assert "gpt2_arm/model.safetensors" in record["checkpoints"]
        assert set(record["checkpoints"]) == set(files) - {"train.json"}
    for debris in root.rglob("*.partial"):
        assert debris.name.startswith("."), f"a final path looks half-written: {debris}"
    assert not (root / "reports" / "arm_ebm" / "evaluation").exists(), "the kill did not land in training"
    assert not (root / "reports" / "arm_ebm" / "claims.json").exists()

    again = run_stage(root, "arm_ebm", "--phase", "run", *seeds, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(train_markers(root)) == [f"seed{s}" for s in range(6)]
    for seed, files in finished.items():
        # The marker and every checkpoint of a finished seed are untouched: its training was not redone.
        assert seed_files(root / "models" / "arm_ebm" / seed) == files, f"{seed} was retrained"
    assert not list(root.rglob("*.partial")), "the resumed run left the killed run's temp files"
    assert sorted(p.name for p in (root / "reports" / "arm_ebm" / "evaluation").iterdir()) == [
        f"seed{s}.json" for s in range(6)]
    rows = json.loads((root / "reports" / "arm_ebm" / "claims.json").read_text())
    assert {r["n_seeds"] for r in rows if r["verdict"] not in (NOT_TESTABLE, REPORT_ONLY)} == {6}


def train_and_evaluate(config, seed, data_dir, model_dir):
    """One seed through the contract's steps, as the flow runs them: train, evaluate, claim metrics."""
    from tasks.arm_ebm import claim_metrics, evaluate, train

    result = train.train(config, seed, data_dir, model_dir).merged(
        evaluate.evaluate(config, seed, data_dir, model_dir))
    return result.add(claim_metrics.claim_metrics(config, result))


def test_same_seed_gives_identical_metrics(tmp_path):
    from tasks.arm_ebm import data
    from tasks.common.params import resolve_run

    spec = resolve_run("arm_ebm", "smoke", [0], REPO / "params.yaml")
    data.write_data(spec.config, (0, 1), tmp_path / "data")
    first = train_and_evaluate(spec.config, 0, tmp_path / "data", tmp_path / "m1")
    second = train_and_evaluate(spec.config, 0, tmp_path / "data", tmp_path / "m2")
    strip = lambda r: {k: v for k, v in r.metrics.items() if not k.startswith("seconds_")}  # noqa: E731
    assert strip(first) == strip(second)
    assert first.curves == second.curves
    # The checkpoints themselves are byte-identical (what the train marker's sha256s rely on).
    checkpoints = lambda folder: {k: v for k, (_, v) in seed_files(folder).items()}  # noqa: E731
    assert checkpoints(tmp_path / "m1") == checkpoints(tmp_path / "m2")
    # Control: another seed must change the metrics, or the comparison above proves nothing.
    other = train_and_evaluate(spec.config, 1, tmp_path / "data", tmp_path / "m3")
    assert strip(other) != strip(first)
    # Seeds run on parallel threads in the flow: the results must not depend on the interleaving.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        threaded = list(pool.map(lambda s: train_and_evaluate(spec.config, s, tmp_path / "data", tmp_path / f"t{s}"),
                                 [0, 1]))
    assert strip(threaded[0]) == strip(first)
    assert strip(threaded[1]) == strip(other)


def test_two_flows_share_one_mlflow_store(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["profile"] = "smoke"
    roots = [make_output_root(tmp_path / f"p{i}", yaml.safe_dump(params)) for i in range(2)]
    store = f"sqlite:///{tmp_path / 'shared-mlflow.db'}"
    procs = [subprocess.Popen([sys.executable, "-m", "flows.stage", "arm_ebm", "--seeds", "0", "1"], cwd=root,
                              env=project_env(root, MLFLOW_TRACKING_URI=store,
                                              REPRO_MLARTIFACTS=str(tmp_path / "artifacts")),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for root in roots]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("arm_ebm")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if r.data.tags.get("kind") == "flow"]
    assert len(parents) == 2 and all(r.info.status == "FINISHED" for r in parents)
    assert len([r for r in runs if r.data.tags.get("kind") == "seed"]) == 4


def test_smoke_makes_no_network_connection(tmp_path):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["profile"] = "smoke"
    root = make_output_root(tmp_path / "project", yaml.safe_dump(params))
    record = tmp_path / "network.log"
    record.touch()
    result = subprocess.run([sys.executable, "-m", "tests.support.network_guard", str(record), "flows.stage",
                             "arm_ebm", "--seeds", "0"], cwd=REPO, env=project_env(root),
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert record.read_text() == "", f"network attempts: {record.read_text()}"
    assert (root / "reports" / "arm_ebm" / "claims.json").exists()


def test_network_guard_catches_a_connection(tmp_path):
    """Negative control: the guard must record and refuse a real outside connection attempt."""
    record = tmp_path / "network.log"
    record.touch()
    (tmp_path / "runpy_probe.py").write_text(
        "import urllib.request\ntry:\n    urllib.request.urlopen('http://example.com', timeout=5)\n"
        "except Exception as err:\n    print(type(err).__name__)\n")
    result = subprocess.run([sys.executable, "-m", "tests.support.network_guard", str(record), "runpy_probe"],
                            cwd=REPO, env=project_env(tmp_path, PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}"),
                            capture_output=True, text=True, timeout=60)
    assert "example.com" in record.read_text(), result.stdout + result.stderr


@pytest.mark.parametrize("victim", ["gpt2_arm/model.safetensors", "train.json"])
def test_a_truncated_checkpoint_or_marker_is_retrained_with_a_warning_naming_it(tmp_path, victim):
    """A checkpoint or training record cut short after training (disk full, a bad copy) is never loaded: the
    train phase names the file on one warning line and trains that seed again; an intact seed is reused
    (issue 21)."""
    root = make_output_root(tmp_path / "project")
    env = project_env(root)
    seeds = ["--seeds", "0", "1"]
    assert run_stage(root, "arm_ebm", "--phase", "data", *seeds, env=env).returncode == 0
    assert run_stage(root, "arm_ebm", "--phase", "train", *seeds, env=env).returncode == 0
    intact = seed_files(root / "models" / "arm_ebm" / "seed1")
    seed0 = root / "models" / "arm_ebm" / "seed0"
    recorded = json.loads((seed0 / "train.json").read_text())["checkpoints"]
    checkpoint = seed0 / "gpt2_arm" / "model.safetensors"
    whole = checkpoint.read_bytes()
    damaged = seed0 / victim
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])
    again = run_stage(root, "arm_ebm", "--phase", "train", *seeds, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    warnings = [line for line in (again.stdout + again.stderr).splitlines() if "training again" in line]
    assert len(warnings) == 1 and "seed 0" in warnings[0] and str(damaged) in warnings[0], warnings
    assert checkpoint.read_bytes() == whole  # retrained to the same bytes (seeded, deterministic)
    assert json.loads((seed0 / "train.json").read_text())["checkpoints"] == recorded
    assert seed_files(root / "models" / "arm_ebm" / "seed1") == intact


def test_params_changed_and_back_retrain_so_the_checkpoints_match_the_reported_params(tmp_path):
    """Prefect's cache keeps a seed's result per params, so going back to earlier params finds it while models/
    holds the checkpoints of the params in between. The training record's params hash is checked against the
    run's: the seed is trained again, and its checkpoints and record are those of the params the run reports
    (issue 21: files under models/ must describe the run that produced the claims)."""
    root = make_output_root(tmp_path / "project", slow_smoke_params(20))
    env = project_env(root)
    seed0 = root / "models" / "arm_ebm" / "seed0"
    assert run_stage(root, "arm_ebm", "--phase", "data", "--seeds", "0", env=env).returncode == 0

    def train(steps: int) -> tuple[str, dict, bytes]:
        (root / "params.yaml").write_text(slow_smoke_params(steps))
        done = run_stage(root, "arm_ebm", "--phase", "train", "--seeds", "0", env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        record = json.loads((seed0 / "train.json").read_text())
        return done.stdout + done.stderr, record, (seed0 / "gpt2_arm" / "model.safetensors").read_bytes()

    _, first, first_weights = train(20)
    changed_log, changed, changed_weights = train(24)
    assert changed_weights != first_weights, "control: the params change must change the trained weights"
    assert "the params have changed" in changed_log
    back_log, back, back_weights = train(20)
    assert [line for line in back_log.splitlines() if "training again" in line and "the params have changed" in line]
    assert back["params_hash"] == first["params_hash"] != changed["params_hash"]
    assert back_weights == first_weights and back["checkpoints"] == first["checkpoints"]
    assert back["result"]["curves"] == first["result"]["curves"]
