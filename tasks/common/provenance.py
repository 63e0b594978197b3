"""Provenance of a run: code version, environment, machine."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import subprocess
from collections.abc import Iterable
from pathlib import Path

from tasks.common.env import repo_root

TRACKED_PACKAGES = ("torch", "transformers", "datasets", "polars", "numpy", "prefect", "mlflow", "dvc",
                    "pydantic")


def git_state(root: Path | None = None) -> tuple[str, bool]:
    """(commit, dirty). ``unknown`` when the folder is not a git checkout."""
    root = root or repo_root()
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=10, check=True).stdout
    except (subprocess.SubprocessError, FileNotFoundError):
        return "unknown", True
    return commit, bool(status.strip())


def package_versions(names: Iterable[str] = TRACKED_PACKAGES) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    versions["python"] = platform.python_version()
    return versions


def hash_files(relative_paths: Iterable[str], root: Path | None = None) -> str:
    """Content hash of the listed files (relative to the repo root): the code version of a cached task.

    Prefect's TASK_SOURCE hashes only the task function; a change in ``method.py`` must also
    invalidate a cached training result, so cache keys include this hash.
    """
    root = root or repo_root()
    digest = hashlib.sha256()
    for name in sorted(relative_paths):
        digest.update(name.encode())
        digest.update((root / name).read_bytes())
    return digest.hexdigest()[:16]


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, ``platform.processor()`` elsewhere).

    Trained numbers are bit-identical only on the same CPU kind and versions: another instruction
    set changes the vectorised kernels torch picks, and float sums round differently.
    """
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def torch_cpu_capability() -> str:
    """The vector instruction set torch's CPU kernels dispatch to (e.g. AVX2, AVX512)."""
    try:
        import torch

        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # noqa: BLE001 - provenance must never fail a run
        return "unknown"
