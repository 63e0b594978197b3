"""Subprocess helpers for pipeline tests: run the project's entry points in an isolated root."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import REPO

BIN = Path(sys.executable).parent


def project_env(root: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["REPRO_ROOT"] = str(root)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run_stage(root: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 600
              ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.stage", *args], cwd=root, env=env or project_env(root),
                          capture_output=True, text=True, timeout=timeout)


def copy_repository(dest):
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    for name in files:
        src = REPO / name
        if src.is_file() and not name.startswith(("reports/", "data/", "models/")):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    subprocess.run(["git", "init", "-q"], cwd=dest, check=True)
    subprocess.run(["git", "add", "-A"], cwd=dest, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "copy"], cwd=dest,
                   check=True)


def slow_smoke_params(gpt2_steps: int = 400) -> str:
    """Smoke params whose seeds train for a few seconds each, so a kill lands between seeds' trainings."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["profile"] = "smoke"
    params["arm_ebm"]["smoke"]["gpt2"]["steps"] = gpt2_steps
    return yaml.safe_dump(params)


def train_markers(root):
    """The train phase's per-seed markers (tasks/common/paper_flow.py), by seed folder name."""
    return {p.parent.name: p for p in (root / "models" / "arm_ebm").glob("seed*/train.json")}


def seed_files(folder):
    """(mtime, bytes) of every file a seed's training left (checkpoints and marker), by relative path."""
    return {p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(folder.rglob("*")) if p.is_file()}
