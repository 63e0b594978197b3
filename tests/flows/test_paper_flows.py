"""The house contract of every paper flow, at the smoke profile through Prefect and MLflow.

arm_ebm has its own, more detailed test (test_arm_ebm_flow.py); every other paper listed in
params.yaml is run here with two seeds and checked for the same things: claims.json covers exactly
the claims of claims.yaml, every claim testable at smoke has a value for each seed, figures and plot
sources exist, the resume markers are written, and MLflow holds the parent and seed runs with
provenance tags and the seeds' metrics.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml

from tests.conftest import REPO, make_output_root

SEEDS = [0, 1]
PAPERS = [slug for slug in yaml.safe_load((REPO / "params.yaml").read_text())["papers"] if slug != "arm_ebm"]
pytestmark = pytest.mark.usefixtures("prefect_server")


def seed_marker(root, slug, seed):
    """The per-seed measurements (evaluation file); the training marker must exist beside the checkpoints."""
    assert (root / "models" / slug / f"seed{seed}" / "train.json").is_file()
    return root / "reports" / slug / "evaluation" / f"seed{seed}.json"


@pytest.fixture(scope="module", params=PAPERS)
def smoke_run(request, tmp_path_factory):
    slug = request.param
    root = make_output_root(tmp_path_factory.mktemp(slug) / "project")
    mp = pytest.MonkeyPatch()
    mp.setenv("REPRO_ROOT", str(root))
    from flows.registry import load_flow

    result = load_flow(slug)(profile="smoke", seeds=SEEDS, phase="all")
    yield slug, root, result
    mp.undo()


def test_claims_cover_the_paper(smoke_run):
    slug, root, result = smoke_run
    declared = yaml.safe_load((REPO / "tasks" / slug / "claims.yaml").read_text())
    rows = json.loads((root / "reports" / slug / "claims.json").read_text())
    assert [r["id"] for r in rows] == [c["id"] for c in declared]
    assert result["verdicts"] == {r["id"]: r["verdict"] for r in rows}
    for claim, row in zip(declared, rows, strict=True):
        assert row["profile"] == "smoke"
        if "smoke" in claim.get("profiles", []) and claim.get("check"):
            assert row["n_seeds"] == len(SEEDS), row["id"]
            assert all(math.isfinite(v) for v in row["per_seed"].values()), row
            assert row["verdict"] != "not testable at this profile", row["id"]
        elif not claim.get("check"):
            shown = "smoke" in claim.get("profiles", [])
            unchecked = ("checked by unit test" if claim["kind"] in ("identity", "reference")
                         else "report only" if shown else "not testable at this profile")
            assert row["verdict"] == unchecked, row["id"]
        else:
            assert row["verdict"] == "not testable at this profile", row["id"]
    assert (root / "reports" / slug / "claims.md").read_text().count("\n|") >= len(rows)


def test_outputs_are_complete_and_atomic(smoke_run):
    slug, root, _ = smoke_run
    reports = root / "reports" / slug
    metrics = json.loads((reports / "metrics.json").read_text())
    assert metrics["n_seeds"] == len(SEEDS) and metrics["profile"] == "smoke"
    figures = list((reports / "figures").glob("*.png"))
    assert figures and all(f.stat().st_size > 1000 for f in figures)
    plots = list((reports / "plots").glob("*.csv"))
    assert plots and all(len(p.read_text().splitlines()) >= 2 for p in plots)
    for seed in SEEDS:
        marker = json.loads(seed_marker(root, slug, seed).read_text())
        assert marker["seed"] == seed and marker["metrics"]
    assert not list(root.rglob("*.partial"))


def test_mlflow_runs(smoke_run):
    slug, root, result = smoke_run
    from tasks.common.tracking import find_runs

    runs = find_runs(slug)
    parent = next(r for r in runs if r.info.run_id == result["parent_run_id"])
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == result["parent_run_id"]]
    assert parent.info.status == "FINISHED"
    assert sorted(int(r.data.tags["seed"]) for r in children) == SEEDS
    for run in [parent, *children]:
        for key in ("git_commit", "params_hash", "profile", "device", "version.torch", "prefect_flow_run_id",
                    "cpu_model", "torch_cpu_capability"):
            assert run.data.tags.get(key), (slug, key)
    for child in children:
        marker = json.loads(seed_marker(root, slug, int(child.data.tags["seed"])).read_text())
        for name, value in marker["metrics"].items():
            if math.isfinite(value):
                assert child.data.metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), (slug, name)
    from mlflow.tracking import MlflowClient

    assert {"claims.json", "claims.md"} <= {a.path for a in MlflowClient().list_artifacts(parent.info.run_id)}
