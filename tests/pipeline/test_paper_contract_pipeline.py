"""The paper contract end to end, on the template paper (templates/new_paper) in a copy of the repository.

What the contract promises (docs/adding_a_paper.md): a README edit recomputes nothing; an evaluation
or claim-metric change re-evaluates without retraining, under DVC and under Prefect's task cache; a
training change retrains; the template runs as it is, so a new paper starts from working code.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO
from tests.pipeline.helpers import BIN, copy_repository, project_env, run_stage

pytestmark = pytest.mark.usefixtures("prefect_server")
SLUG = "new_paper"
TEMPLATE = REPO / "templates" / "new_paper"


def add_template_paper(repo):
    """Copy the template in as a paper, make it the only one in params.yaml, regenerate dvc.yaml."""
    folder = repo / "tasks" / SLUG
    folder.mkdir()
    for path in TEMPLATE.iterdir():
        if path.name not in ("flow.py", "params.yaml", f"test_{SLUG}_method.py"):
            shutil.copy2(path, folder / path.name)
    shutil.copy2(TEMPLATE / "flow.py", repo / "flows" / f"{SLUG}.py")
    shutil.copy2(TEMPLATE / f"test_{SLUG}_method.py", repo / "tests" / "unit" / f"test_{SLUG}_method.py")
    params = yaml.safe_load((repo / "params.yaml").read_text())
    params |= yaml.safe_load((TEMPLATE / "params.yaml").read_text())
    params.update(profile="smoke", seeds=[0, 1], papers=[SLUG])
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    generated = subprocess.run([sys.executable, "-m", "flows.dvc_yaml"], cwd=repo, capture_output=True, text=True)
    assert generated.returncode == 0, generated.stderr
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "paper"], cwd=repo,
                   check=True)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    dest = tmp_path_factory.mktemp("contract") / "repo"
    dest.mkdir()
    copy_repository(dest)
    add_template_paper(dest)
    env = project_env(dest)
    env.pop("REPRO_ROOT")  # the copy's own code must find its own root
    first = dvc(dest, env, "repro")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    return dest, env


def dvc(repo, env, *args):
    return subprocess.run([str(BIN / "dvc"), *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600)


def changed_stages(repo, env) -> set[str]:
    status = dvc(repo, env, "status", "--json")
    assert status.returncode == 0, status.stderr
    return set(json.loads(status.stdout or "{}"))


def mtimes(folder) -> dict[str, int]:
    return {p.relative_to(folder).as_posix(): p.stat().st_mtime_ns for p in sorted(folder.rglob("*")) if p.is_file()}


def edit(path, line="\n# edited by the contract test\n"):
    path.write_text(path.read_text() + line)


def test_the_template_runs_and_reports(repo):
    root, _ = repo
    for seed in (0, 1):
        assert (root / "models" / SLUG / f"seed{seed}" / "model.safetensors").stat().st_size > 0
        record = json.loads((root / "models" / SLUG / f"seed{seed}" / "train.json").read_text())
        assert record["checkpoints"] and record["result"]["curves"]["train_objective"]
        evaluation = json.loads((root / "reports" / SLUG / "evaluation" / f"seed{seed}.json").read_text())
        assert evaluation["metrics"]["test_mse"] > 0
    rows = {r["id"]: r for r in json.loads((root / "reports" / SLUG / "claims.json").read_text())}
    assert rows["C1"]["n_seeds"] == 2 and rows["C1"]["interval"] == "log"
    assert rows["C1"]["preconditions"][0]["metric"] == "objective_gap"
    assert "gd_over_closed_form_risk" in json.loads((root / "reports" / SLUG / "metrics.json").read_text())
    assert (root / "reports" / SLUG / "figures" / "train_objective.png").stat().st_size > 1000
    unit = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"tests/unit/test_{SLUG}_method.py"], cwd=root, capture_output=True, text=True)
    assert unit.returncode == 0, unit.stdout[-2000:]


def test_readme_edit_recomputes_nothing(repo):
    root, env = repo
    edit(root / "tasks" / SLUG / "README.md", "\nmore words\n")
    assert changed_stages(root, env) == set()


def test_evaluation_and_claim_metric_changes_do_not_retrain_under_dvc(repo):
    root, env = repo
    checkpoints = mtimes(root / "models" / SLUG)
    for name in ("evaluate.py", "claim_metrics.py"):
        evaluated = mtimes(root / "reports" / SLUG / "evaluation")
        edit(root / "tasks" / SLUG / name)
        assert changed_stages(root, env) == {f"evaluate-{SLUG}"}, name
        again = dvc(root, env, "repro")
        assert again.returncode == 0, again.stderr[-2000:]
        assert mtimes(root / "models" / SLUG) == checkpoints, f"{name}: training ran again"
        if name == "evaluate.py":
            assert mtimes(root / "reports" / SLUG / "evaluation") != evaluated
    assert changed_stages(root, env) == set()


def test_prefect_cache_skips_training_after_an_evaluation_change(repo):
    root, env = repo
    env = env | {"REPRO_ROOT": str(root)}
    checkpoints = mtimes(root / "models" / SLUG)
    evaluated = mtimes(root / "reports" / SLUG / "evaluation")
    edit(root / "tasks" / SLUG / "evaluate.py", "\nEDITED = True\n")
    result = run_stage(root, SLUG, "--phase", "run", env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert mtimes(root / "models" / SLUG) == checkpoints, "training ran again"
    assert mtimes(root / "reports" / SLUG / "evaluation") != evaluated, "evaluation did not run"


def test_training_change_retrains(repo):
    root, env = repo
    edit(root / "tasks" / SLUG / "method.py")
    assert {f"train-{SLUG}", f"evaluate-{SLUG}"} <= changed_stages(root, env)
    assert f"data-{SLUG}" not in changed_stages(root, env)
