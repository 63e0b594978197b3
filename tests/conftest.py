"""Test-session isolation: Prefect, MLflow and outputs live in a temporary folder, never in the
checkout. Set before anything imports Prefect or MLflow (they read settings at import)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SESSION_DIR = Path(tempfile.mkdtemp(prefix="repro-tests-"))

os.environ["PREFECT_HOME"] = str(SESSION_DIR / "prefect-home")
os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(SESSION_DIR / "prefect-home" / "storage")
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{SESSION_DIR / 'mlflow.db'}"
os.environ["REPRO_MLARTIFACTS"] = str(SESSION_DIR / "mlartifacts")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
for key in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ[key] = "1"
os.environ.pop("PREFECT_API_URL", None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def prefect_server():
    """One Prefect server for the whole session (flows in-process and in subprocesses use it)."""
    from flows import servers

    port = free_port()
    env = servers.server_env(port)
    log = open(SESSION_DIR / "prefect-server.log", "wb")  # noqa: SIM115
    process = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host",
                                "127.0.0.1", "--port", str(port)], env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    import time

    deadline = time.monotonic() + 240
    while not servers.prefect_running(port):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError((SESSION_DIR / "prefect-server.log").read_text()[-3000:])
        time.sleep(1)
    url = servers.prefect_api_url(port)
    os.environ["PREFECT_API_URL"] = url
    yield url
    os.environ.pop("PREFECT_API_URL", None)
    os.killpg(process.pid, 15)
    process.wait(timeout=30)


def make_output_root(base: Path, params_text: str | None = None) -> Path:
    """A project root for outputs: params.yaml (given, or the real one with ``profile: smoke``, the profile
    tests run, so their outputs land in data/, models/, reports/ as a committed run's do) and a link to tasks/."""
    base.mkdir(parents=True, exist_ok=True)
    if params_text is None:
        params = yaml.safe_load((REPO / "params.yaml").read_text())
        params_text = (REPO / "params.yaml").read_text().replace(f"profile: {params['profile']}", "profile: smoke", 1)
    (base / "params.yaml").write_text(params_text)
    (base / "tasks").symlink_to(REPO / "tasks", target_is_directory=True)
    return base


@pytest.fixture
def output_root(tmp_path, monkeypatch) -> Path:
    root = make_output_root(tmp_path / "project")
    monkeypatch.setenv("REPRO_ROOT", str(root))
    return root


@pytest.fixture(scope="session", autouse=True)
def _cleanup_session_dir():
    yield
    shutil.rmtree(SESSION_DIR, ignore_errors=True)
