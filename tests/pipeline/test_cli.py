"""The `repro` command line: lazy imports, list, report, bad input."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO
from tests.pipeline.helpers import project_env


def test_help_and_list_do_not_import_torch_or_prefect(tmp_path):
    code = ("import sys\nfrom flows.cli import main\nassert main(['list']) == 0\n"
            "heavy = [m for m in ('torch', 'prefect', 'mlflow', 'transformers') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "arm_ebm" in result.stdout and "mixed" in result.stdout
    help_text = subprocess.run([sys.executable, "-m", "flows.cli", "--help"], cwd=REPO, capture_output=True,
                               text=True, timeout=60)
    for command in ("list", "run", "report", "server", "ui", "serve"):
        assert command in help_text.stdout


def test_report_without_runs(tmp_path):
    from tests.conftest import make_output_root

    root = make_output_root(tmp_path / "p")
    result = subprocess.run([sys.executable, "-m", "flows.cli", "report"], cwd=REPO, env=project_env(root),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "not run" in (root / "reports" / "index.md").read_text()
