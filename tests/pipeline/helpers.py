"""Subprocess helpers for pipeline tests: run the project's entry points in an isolated root."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
