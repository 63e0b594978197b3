"""`dvc repro` on a copy of the repository at the smoke profile: outputs, no-op re-run, metrics, plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

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


def test_metrics_show_is_one_narrow_row_per_paper(repo_copy):
    repo, env = repo_copy
    metrics = dvc(repo, env, "metrics", "show", "--json")
    assert metrics.returncode == 0, metrics.stderr
    data = json.loads(metrics.stdout)[""]["data"]  # DVC 3 keys the workspace as ""
    papers = yaml.safe_load((repo / "params.yaml").read_text())["papers"]
    assert set(data) == {f"reports/{slug}/headline.json" for slug in papers}
    keys = {key for entry in data.values() for key in entry["data"]}
    assert keys == {"empirical", "reproduced", "not_reproduced", "inconclusive", "undecided", "not_testable",
                    "mech_reproduced", "mechanism", "seeds"}
    table = dvc(repo, env, "metrics", "show")
    assert table.returncode == 0, table.stderr
    # Was about 1280 columns wide with every metric of every paper; the details stay in metrics.json.
    assert max(len(line) for line in table.stdout.splitlines()) < 200, table.stdout[:2000]
    details = json.loads((repo / "reports" / "arm_ebm" / "metrics.json").read_text())
    assert "e1_max_logprob_error" in details


def test_plots_show_renders_the_figures_offline(repo_copy, tmp_path, tmp_path_factory):
    """`dvc plots show` draws each paper's matplotlib figures as images: no vega, no CDN script, and DVC no
    longer guesses axes from CSV columns."""
    repo, env = repo_copy
    out = tmp_path / "dvc_plots"
    shown = dvc(repo, env, "plots", "show", "-o", str(out))
    assert shown.returncode == 0, shown.stderr
    assert "failed to load" not in (shown.stdout + shown.stderr).lower()
    page = (out / "index.html").read_text()
    figures = sorted(repo.glob("reports/*/figures/*.png"))
    assert figures and page.count("<img") == len(figures)
    assert "cdn.jsdelivr" not in page and "<script src=" not in page
    from tests.support.browser import Browser, chromium_binary

    if chromium_binary() is None:
        pytest.skip("Chromium not installed: the page was checked as text only")
    from tests.pipeline.test_browser_uis import screenshot_dir

    shots = screenshot_dir(tmp_path_factory)
    with Browser(tmp_path / "chromium.log") as browser:
        browser.send("Page.navigate", url=(out / "index.html").as_uri())
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            drawn = browser.evaluate("Array.from(document.images).filter(i => i.complete && i.naturalWidth > 0).length")
            if drawn == len(figures):
                break
            time.sleep(0.5)
        browser.screenshot(shots / "dvc-plots-show.png")
        assert drawn == len(figures), f"{drawn} of {len(figures)} figures drawn"
        external = [u for u in browser.problems()["external"] if not u.startswith("file://")]
        assert external == [], external


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
