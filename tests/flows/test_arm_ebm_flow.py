"""arm_ebm's flow at the smoke profile through Prefect and a temporary MLflow store."""

from __future__ import annotations

import json
import math

import pytest

from tasks.common.claims import NOT_TESTABLE, REPORT_ONLY, VERDICTS, VERIFICATION_KINDS, VERIFICATION_VERDICTS
from tasks.common.tracking import find_runs

pytestmark = pytest.mark.usefixtures("prefect_server")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    from tests.conftest import make_output_root

    root = make_output_root(tmp_path_factory.mktemp("flow") / "project")
    mp = pytest.MonkeyPatch()
    mp.setenv("REPRO_ROOT", str(root))
    from flows.arm_ebm import arm_ebm

    result = arm_ebm(profile="smoke", seeds=[0, 1], phase="all")
    yield root, result
    mp.undo()


def test_outputs_exist_and_are_well_formed(smoke_run):
    root, result = smoke_run
    reports = root / "reports" / "arm_ebm"
    rows = json.loads((reports / "claims.json").read_text())
    claim_ids = {r["id"] for r in rows}
    assert {"C1", "C2", "C3a", "C4a", "C5a", "C6"} <= claim_ids
    assert all(r["verdict"] in (VERIFICATION_VERDICTS if r["kind"] in VERIFICATION_KINDS else (*VERDICTS, REPORT_ONLY))
               for r in rows)
    assert all(r["profile"] == "smoke" for r in rows)
    by_id = {r["id"]: r for r in rows}
    # Exact identities are verified at smoke too (never counted); the neural claims are not meaningful here.
    for claim_id in ("C1", "C1b", "C1c", "C2", "C2b", "C2c", "C2d", "C4a", "C4b"):
        assert by_id[claim_id]["kind"] == "identity" and by_id[claim_id]["verdict"] == "verified", claim_id
    assert by_id["C1"]["n_seeds"] == 2
    assert by_id["C5a"]["verdict"] == "not testable at this profile"
    # claims with no check: shown where the profile computes their numbers, else not testable
    assert by_id["C4d"]["verdict"] == REPORT_ONLY
    for claim_id in ("C3b", "C4c", "C5b", "C5d", "C6"):
        assert by_id[claim_id]["verdict"] == NOT_TESTABLE, claim_id
    metrics = json.loads((reports / "metrics.json").read_text())
    assert metrics["n_seeds"] == 2 and math.isfinite(metrics["e1_max_logprob_error"])
    for name in ("kl_vs_horizon.png", "first_token_marginals.png", "nll_curves.png"):
        assert (reports / "figures" / name).stat().st_size > 1000
    assert (reports / "plots" / "kl_vs_horizon.csv").read_text().startswith("eps,T,mean_kl")
    assert (reports / "plots" / "fixed_toy_kl_vs_horizon.csv").read_text().startswith("eps,T,mean_kl")
    assert (root / "models" / "arm_ebm" / "seed1" / "gpt2_arm" / "model.safetensors").exists()
    # The contract's markers: each seed's training record (with the sha256 of every checkpoint) and evaluation.
    for seed in (0, 1):
        record = json.loads((root / "models" / "arm_ebm" / f"seed{seed}" / "train.json").read_text())
        assert {"gpt2_arm/model.safetensors", "neural_ebm.safetensors", "tabular.safetensors"} <= set(
            record["checkpoints"])
        assert "gpt2_train_nll" in record["result"]["curves"]
        evaluation = json.loads((reports / "evaluation" / f"seed{seed}.json").read_text())
        assert evaluation["seed"] == seed and "e2_kl_gpt2" in evaluation["metrics"]
    assert not list(root.rglob("*.partial"))
    assert result["verdicts"] == {r["id"]: r["verdict"] for r in rows}


def test_mlflow_parent_and_child_runs(smoke_run):
    _, result = smoke_run
    parent_id = result["parent_run_id"]
    runs = find_runs("arm_ebm")
    parent = next(r for r in runs if r.info.run_id == parent_id)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]
    assert parent.info.status == "FINISHED"
    assert sorted(r.data.tags["seed"] for r in children) == ["0", "1"]
    for run in [parent, *children]:
        tags = run.data.tags
        for key in ("git_commit", "git_dirty", "params_hash", "profile", "seeds", "device",
                    "version.torch", "version.prefect", "prefect_flow_run_id"):
            assert tags.get(key), key
        assert tags["profile"] == "smoke"
    assert parent.data.tags["prefect_flow_run_id"] != "none"
    # The MLflow run links to the Prefect flow run's page (a real server runs the tests, so a UI exists).
    flow_run_id = parent.data.tags["prefect_flow_run_id"]
    assert parent.data.tags["prefect_flow_run_url"].endswith(f"/runs/flow-run/{flow_run_id}")
    assert parent.data.tags["prefect_flow_run_url"].startswith("http://127.0.0.1:")
    assert parent.data.params["toy.vocab_size"] == "3"
    child = children[0]
    assert child.data.metrics["e1_max_logprob_error"] < 1e-8
    assert "curve/gpt2_train_nll" in child.data.metrics
    assert {d.dataset.name for d in child.inputs.dataset_inputs} == {"toy_seed0", "tabular_seed0"} or {
        d.dataset.name for d in child.inputs.dataset_inputs} == {"toy_seed1", "tabular_seed1"}
    from mlflow.tracking import MlflowClient

    artifacts = {a.path for a in MlflowClient().list_artifacts(parent_id)}
    assert {"claims.json", "claims.md", "figures"} <= artifacts
    figures = {a.path for a in MlflowClient().list_artifacts(parent_id, "figures")}
    assert "figures/kl_vs_horizon.png" in figures


def test_prefect_knows_the_flow_run(smoke_run):
    _, result = smoke_run
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    async def flow_runs():
        async with get_client() as client:
            return await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["arm_ebm"])))

    import asyncio

    runs = asyncio.run(flow_runs())
    assert any(r.state and r.state.is_completed() for r in runs)
    parent = next(r for r in find_runs("arm_ebm") if r.info.run_id == result["parent_run_id"])
    flow_run = next(r for r in runs if str(r.id) == parent.data.tags["prefect_flow_run_id"])
    # Named after what it ran, not Prefect's random adjective-animal names.
    assert flow_run.name == "arm_ebm-all-smoke-seeds-0-1"

    async def link_artifacts():
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])))

    links = [a for a in asyncio.run(link_artifacts()) if a.type == "markdown" and a.key == "mlflow-run-arm-ebm"]
    # The Prefect run links back to the MLflow parent run's page.
    assert links and f"/runs/{result['parent_run_id']})" in links[0].data
