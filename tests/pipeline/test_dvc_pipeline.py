"""`dvc repro` on a copy of the repository at the smoke profile: outputs, no-op re-run, metrics, plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO
from tests.pipeline.helpers import BIN, copy_repository, project_env

# The first test's setup runs `dvc repro` of every paper at smoke, one stage process after another: about
# 42 processes for 14 papers, each paying its imports (torch, Prefect, MLflow). Minutes on a quiet machine,
# far more on a loaded one, hence limits well above the default 900 s.
pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory):
    dest = tmp_path_factory.mktemp("dvc") / "repo"
    dest.mkdir()
    copy_repository(dest)
    params = yaml.safe_load((dest / "params.yaml").read_text())
    params["profile"], params["seeds"] = "smoke", [0, 1]
    (dest / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = project_env(dest)
    env.pop("REPRO_ROOT")  # the copy's own code must find its own root
    first = subprocess.run([str(BIN / "dvc"), "repro"], cwd=dest, env=env, capture_output=True, text=True,
                           timeout=3300)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return dest, env


def dvc(repo, env, *args):
    return subprocess.run([str(BIN / "dvc"), *args], cwd=repo, env=env, capture_output=True, text=True, timeout=300)


def test_repro_writes_reports(repo_copy):
    repo, _ = repo_copy
    index = (repo / "reports" / "index.md").read_text()
    assert "arm_ebm" in index and "reproduced" in index
    rows = json.loads((repo / "reports" / "arm_ebm" / "claims.json").read_text())
    assert rows and all(r["profile"] == "smoke" for r in rows)
    assert (repo / "reports" / "index.html").read_text().count("<img") >= 3
    assert (repo / "dvc.lock").exists()


def test_second_repro_is_a_noop(repo_copy):
    repo, env = repo_copy
    before = (repo / "reports" / "arm_ebm" / "claims.json").stat().st_mtime_ns
    second = dvc(repo, env, "repro")
    assert second.returncode == 0, second.stderr
    assert "Running stage" not in second.stdout
    assert (repo / "reports" / "arm_ebm" / "claims.json").stat().st_mtime_ns == before


def test_metrics_and_plots_show(repo_copy):
    repo, env = repo_copy
    metrics = dvc(repo, env, "metrics", "show", "--json")
    assert metrics.returncode == 0, metrics.stderr
    assert "e1_max_logprob_error" in metrics.stdout
    plots = dvc(repo, env, "plots", "show", "--json")
    assert plots.returncode == 0, plots.stderr
    assert "kl_vs_horizon.csv" in plots.stdout


def test_status_is_clean_after_repro(repo_copy):
    repo, env = repo_copy
    status = dvc(repo, env, "status", "--json")
    assert json.loads(status.stdout or "{}") == {}


def test_report_stage_depends_on_every_paper():
    dvc_yaml = yaml.safe_load((REPO / "dvc.yaml").read_text())
    papers = yaml.safe_load((REPO / "params.yaml").read_text())["papers"]
    deps = dvc_yaml["stages"]["report"]["deps"]
    assert all(f"reports/{slug}/claims.json" in deps for slug in papers)


def test_dvc_yaml_is_current(tmp_path):
    """dvc.yaml is what `python -m flows.dvc_yaml` generates from params.yaml and the steps' imports."""
    env = {k: v for k, v in os.environ.items() if k != "REPRO_ROOT"}
    check = [sys.executable, "-m", "flows.dvc_yaml", "--check"]
    current = subprocess.run(check, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert current.returncode == 0, current.stderr
    # Negative control: a hand edit in a copy is caught.
    copy = tmp_path / "repo"
    copy.mkdir()
    copy_repository(copy)
    (copy / "dvc.yaml").write_text((copy / "dvc.yaml").read_text().replace("--phase evaluate", "--phase all", 1))
    stale = subprocess.run(check, cwd=copy, env=env, capture_output=True, text=True, timeout=120)
    assert stale.returncode == 1 and "out of date" in stale.stderr, stale.stderr


def test_push_then_pull_on_a_fresh_clone_restores_without_recompute(repo_copy, tmp_path):
    """`dvc push` to a directory remote; a fresh clone pulls data, models and reports and is up to
    date (`dvc status` clean, `dvc repro` runs nothing)."""
    repo, env = repo_copy
    remote = tmp_path / "remote"
    # The default remote (`.dvc-remote` in the checkout) is overridden per clone with --local.
    assert dvc(repo, env, "remote", "modify", "--local", "local", "url", str(remote)).returncode == 0
    pushed = dvc(repo, env, "push")
    assert pushed.returncode == 0, pushed.stderr
    assert any(remote.rglob("*")), "nothing was pushed"
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "results"], cwd=repo,
                   check=True)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    assert not (clone / "models" / "arm_ebm").exists()
    assert dvc(clone, env, "remote", "modify", "--local", "local", "url", str(remote)).returncode == 0
    pulled = dvc(clone, env, "pull")
    assert pulled.returncode == 0, pulled.stderr
    for path in ("data/arm_ebm/toy_seed0.parquet", "models/arm_ebm/seed1/train.json",
                 "models/arm_ebm/seed1/gpt2_arm/model.safetensors", "reports/arm_ebm/evaluation/seed1.json",
                 "reports/arm_ebm/figures/kl_vs_horizon.png", "reports/index.html"):
        assert (clone / path).read_bytes() == (repo / path).read_bytes(), path
    status = dvc(clone, env, "status", "--json")
    assert json.loads(status.stdout or "{}") == {}, status.stdout
    again = dvc(clone, env, "repro")
    assert again.returncode == 0 and "Running stage" not in again.stdout, again.stdout
