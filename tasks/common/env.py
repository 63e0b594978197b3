"""Process-wide defaults: project paths, quiet/offline settings, Prefect and MLflow locations.

Imported (via ``configure()``) before Prefect or MLflow are imported anywhere, because both read
some settings at import time. Every default is ``setdefault``: a user's environment always wins.
"""

from __future__ import annotations

import os
from pathlib import Path

PROFILES = ("smoke", "cpu", "paper")


def repo_root() -> Path:
    """The project root: ``REPRO_ROOT`` if set, else the folder holding this package's ``tasks/``."""
    override = os.environ.get("REPRO_ROOT")
    if override:
        return Path(override).resolve()
    return Path(__file__).resolve().parents[2]


def default_tracking_uri(root: Path | None = None) -> str:
    """SQLite store at the repo root, absolute so every DVC stage writes to the same store."""
    root = root or repo_root()
    return f"sqlite:///{root / 'mlflow.db'}"


def configure(profile: str | None = None) -> None:
    """Set quiet, offline, project-local defaults. Safe to call many times."""
    root = repo_root()
    defaults = {
        # Prefect: state and result storage live in the project, not in $HOME.
        "PREFECT_HOME": str(root / ".prefect"),
        # The embedded server needs more than its 20 s default on a cold 2-core start.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # INFO: the flow run's own log lines (progress per seed, see paper_flow.SeedProgress) reach the
        # terminal and the Prefect UI's log tab; at WARNING the UI said "This run didn't generate logs".
        "PREFECT_LOGGING_LEVEL": "INFO",
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true",
        "DO_NOT_TRACK": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_TRACKING_URI": default_tracking_uri(root),
        "DVC_NO_ANALYTICS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "GIT_PYTHON_REFRESH": "quiet",
        # No download or shard-loading bars between the log lines (the models are local and tiny).
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TRANSFORMERS_VERBOSITY": "error",
    }
    for key, value in defaults.items():
        os.environ.setdefault(key, value)
    if profile in ("smoke", "cpu"):
        # Smoke and cpu never touch the network; the paper profile needs the hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
