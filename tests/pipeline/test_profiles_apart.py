"""A run at another profile than params.yaml's (`repro run <slug> --profile smoke` in a checkout whose
committed results are cpu) writes under runs/<profile>/ and leaves the committed files alone (issue 21)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import REPO, make_output_root
from tests.pipeline.helpers import run_stage

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_a_smoke_run_never_overwrites_the_committed_cpu_results(tmp_path):
    root = make_output_root(tmp_path / "p", (REPO / "params.yaml").read_text())  # committed profile: cpu
    committed = root / "reports" / "arm_ebm"
    committed.mkdir(parents=True)
    (committed / "claims.json").write_text("[]\n")
    (committed / "claims.md").write_text("committed cpu results\n")
    done = run_stage(root, "arm_ebm", "--profile", "smoke", "--seeds", "0", "1")
    assert done.returncode == 0, done.stderr[-4000:]
    assert (committed / "claims.json").read_text() == "[]\n"
    assert (committed / "claims.md").read_text() == "committed cpu results\n"
    assert sorted(p.name for p in committed.iterdir()) == ["claims.json", "claims.md"]
    assert not (root / "models" / "arm_ebm").exists() and not (root / "data" / "arm_ebm").exists()
    rows = json.loads((root / "runs" / "smoke" / "reports" / "arm_ebm" / "claims.json").read_text())
    assert rows and {r["profile"] for r in rows} == {"smoke"}
    assert (root / "runs" / "smoke" / "models" / "arm_ebm" / "seed1" / "train.json").is_file()
