"""Five kinds of bad params: a one-line error naming the key, exit status 2, and no compute."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.conftest import REPO, make_output_root
from tests.pipeline.helpers import project_env, run_stage


def params_with(mutate) -> str:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    mutate(params)
    return yaml.safe_dump(params)


CASES = {
    "unknown paper": (lambda p: None, ["nosuch_paper"], "paper: unknown paper 'nosuch_paper'"),
    "unknown key": (lambda p: p["arm_ebm"]["smoke"]["gpt2"].update(n_layers=2), ["arm_ebm"],
                    "arm_ebm.smoke.gpt2.n_layers: unknown key"),
    "wrong type": (lambda p: p["arm_ebm"]["smoke"]["toy"].update(horizon="six"), ["arm_ebm"],
                   "arm_ebm.smoke.toy.horizon:"),
    "out of range": (lambda p: p["arm_ebm"]["smoke"]["gpt2"].update(lr=-1.0), ["arm_ebm"],
                     "arm_ebm.smoke.gpt2.lr: Input should be greater than 0"),
    "unknown profile": (lambda p: None, ["arm_ebm", "--profile", "large"],
                        "--profile: must be one of smoke|cpu|paper, got 'large'"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_params_fail_fast_with_key_path(tmp_path, case):
    mutate, args, message = CASES[case]
    params = yaml.safe_load(params_with(mutate))
    params["profile"] = "smoke"
    root = make_output_root(tmp_path / "project", yaml.safe_dump(params))
    start = time.monotonic()
    result = run_stage(root, *args)
    elapsed = time.monotonic() - start
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ") and message in lines[0]
    # Before any compute: nothing written, and no Prefect/torch start-up (those take > 10 s here).
    assert not (root / "data").exists() and not (root / "models").exists()
    assert elapsed < 10, f"validation took {elapsed:.1f} s"


@pytest.mark.usefixtures("prefect_server")
def test_a_missing_phase_input_is_one_line_naming_the_next_step(tmp_path):
    """The evaluate phase with no data: exit 1 and 'error: ... run the data phase first (command)', no traceback."""
    root = make_output_root(tmp_path / "project")
    result = run_stage(root, "arm_ebm", "--phase", "evaluate", "--seeds", "0")
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: arm_ebm: no data under ") and "python -m flows.stage arm_ebm --phase data" in last
    # Not even Prefect's engine log of the failed flow run carries a traceback (paper_flow's log filter).
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    # Said once: Prefect's "Encountered exception" and "Finished in state Failed" lines repeated it (3 copies).
    assert result.stderr.count("no data under ") == 1, result.stderr[-3000:]


@pytest.mark.usefixtures("prefect_server")
def test_an_unwritable_reports_folder_fails_before_any_compute(tmp_path):
    """A file where reports/ should be (what a read-only mount looks like to root, who passes every permission
    check): one line naming the folder, before the data or any seed is computed."""
    root = make_output_root(tmp_path / "project")
    (root / "reports").write_text("not a folder")
    result = run_stage(root, "arm_ebm", "--phase", "all", "--seeds", "0")
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and "reports/arm_ebm: not writable" in last
    assert not (root / "data" / "arm_ebm").exists() and not (root / "models" / "arm_ebm").exists()


@pytest.mark.usefixtures("prefect_server")
def test_a_truncated_parquet_file_is_named_before_training(tmp_path):
    root = make_output_root(tmp_path / "project")
    assert run_stage(root, "arm_ebm", "--phase", "data", "--seeds", "0").returncode == 0
    victim = sorted((root / "data" / "arm_ebm").rglob("*.parquet"))[0]
    victim.write_bytes(victim.read_bytes()[:-20])
    result = run_stage(root, "arm_ebm", "--phase", "train", "--seeds", "0")
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {victim}: not a readable parquet file") and "--phase data" in last
    assert not (root / "models" / "arm_ebm" / "seed0").exists()


@pytest.mark.usefixtures("prefect_server")
def test_a_damaged_mlflow_store_is_one_line_naming_the_file_and_how_to_move_it_aside(tmp_path):
    """The stage's end of tasks/common/tracking.py's TrackingStoreError: exit 1, the last line names the file
    and the `mv` that fixes it, no traceback (Prefect's engine log keeps its line, without the traceback)."""
    root = make_output_root(tmp_path / "project")
    store = root / "mlflow.db"
    store.write_bytes(b"this is not a SQLite database, it was truncated or overwritten" * 100)
    env = project_env(root, MLFLOW_TRACKING_URI=f"sqlite:///{store}")
    result = run_stage(root, "arm_ebm", "--phase", "all", "--seeds", "0", env=env)
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {store} is damaged (") and f"`mv {store} {store}.broken`" in last, last
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
