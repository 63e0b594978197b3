"""Five kinds of bad params: a one-line error naming the key, exit status 2, and no compute."""

from __future__ import annotations

import time

import pytest
import yaml

from tests.conftest import REPO, make_output_root
from tests.pipeline.helpers import run_stage


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
