"""Local servers: a persistent Prefect server on 127.0.0.1, the embedded one of a single run, and the MLflow
UI on the SQLite store."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tasks.common.env import repo_root

PREFECT_HOST = "127.0.0.1"
PREFECT_PORT = int(os.environ.get("REPRO_PREFECT_PORT", "4200"))
MLFLOW_PORT = int(os.environ.get("REPRO_MLFLOW_PORT", "5000"))


def prefect_api_url(port: int = PREFECT_PORT) -> str:
    return f"http://{PREFECT_HOST}:{port}/api"


def _bin(name: str) -> str:
    """An executable of this environment (the venv's, not whatever is first on PATH)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on ``host:port`` now. With SO_REUSEADDR, as uvicorn binds: connections of a
    server stopped a moment ago (TIME_WAIT) do not keep the port, a listening socket does."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def prefect_running(port: int = PREFECT_PORT) -> bool:
    return healthy(f"{prefect_api_url(port)}/health")


def server_env(port: int = PREFECT_PORT) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)  # the server itself must not point at another API
    # The UI must be told where the API is on any port but the default one.
    env.setdefault("PREFECT_UI_API_URL", prefect_api_url(port))
    env["PREFECT_SERVER_API_HOST"] = PREFECT_HOST
    env["PREFECT_SERVER_API_PORT"] = str(port)
    return env


class ServerConflict(RuntimeError):
    """A Prefect server that this checkout did not start answers on the port."""


def _pid_file() -> Path:
    return repo_root() / ".prefect" / "server.pid"


def pid_file_entry() -> str | None:
    """``.prefect/server.pid`` as written ("pid port"), or None when there is none."""
    try:
        return _pid_file().read_text().strip()
    except OSError:
        return None


def own_server_port() -> int | None:
    """The port of the Prefect server this checkout started (``.prefect/server.pid`` holds "pid port"), if
    that process is still alive; None otherwise."""
    try:
        pid_text, _, port_text = _pid_file().read_text().strip().partition(" ")
        pid = int(pid_text)
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return int(port_text) if port_text.isdigit() else PREFECT_PORT


def start_prefect(port: int = PREFECT_PORT, wait_s: float = 180.0) -> str:
    """Start ``prefect server`` in the background unless this checkout's answers already; return the API URL.

    A server of another checkout (or any other process) on the port is refused, not reused: its flow runs
    would land in the other checkout's database, and stopping it there would crash this one's runs.
    """
    url = prefect_api_url(port)
    if prefect_running(port):
        if own_server_port() == port:
            return url
        raise ServerConflict(
            f"a Prefect server that this checkout did not start answers at {url} (another checkout's?). "
            f"Stop it where it was started ('repro server stop' there), or use another port here: "
            f"REPRO_PREFECT_PORT={port + 1} repro server start (make reproduce PREFECT_PORT={port + 1})")
    log_dir = repo_root() / ".prefect"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / "server.log", "ab")  # noqa: SIM115 - handed to the detached server
    process = subprocess.Popen([_bin("prefect"), "server", "start", "--host", PREFECT_HOST, "--port", str(port)],
                               env=server_env(port), stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    _pid_file().write_text(f"{process.pid} {port}")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if prefect_running(port):
            return url
        if process.poll() is not None:
            raise RuntimeError(f"prefect server exited with {process.returncode}; see {log_dir / 'server.log'}")
        time.sleep(1.0)
    raise TimeoutError(f"prefect server did not answer at {url} within {wait_s:.0f} s")


def stop_prefect(wait_s: float = 20.0) -> bool:
    """Stop the server this checkout started (only that one) and wait until its port is free (SIGKILL after
    ``wait_s`` seconds), so that a command run next can start one on the same port."""
    pid_file = _pid_file()
    if not pid_file.exists():
        return False
    pid_text, _, port_text = pid_file.read_text().strip().partition(" ")
    port = int(port_text) if port_text.isdigit() else PREFECT_PORT
    stop_group(int(pid_text), port, wait_s)
    pid_file.unlink()
    return True


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` is still running. Its leader, when it is this process's child, is
    reaped first (else it would stay a zombie of the group until this process exits)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid: int, port: int | None = None, wait_s: float = 20.0) -> None:
    """Stop a server started with ``start_new_session`` (group ``pgid``, its workers included): SIGTERM, then
    wait until every process of the group has exited and ``port`` is free; SIGKILL what is left after
    ``wait_s`` seconds. Waiting for the whole group, not only the port, lets a server finish its shutdown
    (Prefect closes its database after it stops listening)."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    if not _wait_down(pgid, port, wait_s):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        _wait_down(pgid, port, 5.0)


def _wait_down(pgid: int, port: int | None, wait_s: float) -> bool:
    """Wait until no process of group ``pgid`` runs and ``port`` is free; whether that happened in time."""
    deadline = time.monotonic() + wait_s
    while group_alive(pgid) or (port is not None and not port_free(port)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


class _OwnSessionSubprocess:
    """The ``subprocess`` module as Prefect's server module sees it while it launches the embedded server:
    ``Popen`` starts the child in a session of its own, everything else is the real module."""

    def __getattr__(self, name: str) -> object:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(*args: object, **kwargs: object) -> subprocess.Popen:  # noqa: N802 - stands in for subprocess.Popen
        return subprocess.Popen(*args, start_new_session=True, **kwargs)


def start_embedded_prefect() -> str | None:
    """Start the embedded Prefect server of this run (the one Prefect would start on first use when no
    ``PREFECT_API_URL`` is configured) in a session of its own, and return its API URL; None when a server is
    configured or Prefect's ephemeral mode is off (Prefect then behaves as it always does).

    Started by Prefect, the server shares the terminal's process group, so the Ctrl-C that stops the run kills
    it at the same instant and the flow run cannot be marked Cancelled (it stayed "Running" forever). In its
    own session it survives the Ctrl-C until ``tasks.common.interrupts.stop_now`` has closed the records and
    stops it; a normal exit stops it through Prefect's ``atexit`` hook. Prefect finds it through its own
    registry (``SubprocessASGIServer()`` is one instance per process), so nothing else changes."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    if settings.api.url or not settings.server.ephemeral.enabled:
        return None
    from prefect.server.api import server as prefect_server

    embedded = prefect_server.SubprocessASGIServer()
    if not embedded.running:
        launcher = prefect_server.subprocess
        prefect_server.subprocess = _OwnSessionSubprocess()
        try:
            embedded.start()
        finally:
            prefect_server.subprocess = launcher
    return embedded.api_url


@contextlib.contextmanager
def using_prefect_api(api_url: str | None):
    """Within the block, this process's Prefect settings and the processes it starts (Dask workers) talk to
    ``api_url``; without it each Dask worker, handed this process's settings (no API URL), would start an
    embedded server of its own on the same database, which nothing stops when the run is interrupted."""
    if api_url is None:
        yield
        return
    from prefect.settings import PREFECT_API_URL, temporary_settings

    previous = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api_url
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield
    finally:
        if previous is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = previous


def mlflow_server_env() -> dict[str, str]:
    """The environment of ``mlflow server``: MLflow 3's job runner (seven extra worker processes,
    unused by this project) is off unless the user turned it on; it also halves the start-up time."""
    env = dict(os.environ)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    return env


def start_mlflow_ui(port: int = MLFLOW_PORT) -> subprocess.Popen:
    """``mlflow server`` (the UI) in a process group of its own, in the foreground's output: a terminal's Ctrl-C
    reaches ``repro ui`` only, which stops the whole group itself (``mlflow server`` runs its uvicorn workers as
    child processes, which a signal to the ``mlflow`` process alone would leave holding the port)."""
    return subprocess.Popen(mlflow_ui_command(port), cwd=repo_root(), env=mlflow_server_env(), start_new_session=True)


def mlflow_ui_command(port: int = MLFLOW_PORT, backend_store_uri: str | None = None,
                      artifacts_destination: str | None = None) -> list[str]:
    """``mlflow server`` on loopback over the project's store (or ``backend_store_uri``, e.g. a
    ``postgresql://`` database), artifacts served through it from ``artifacts_destination``."""
    uri = backend_store_uri or os.environ["MLFLOW_TRACKING_URI"]
    destination = artifacts_destination or (repo_root() / "mlartifacts").as_uri()
    return [_bin("mlflow"), "server", "--backend-store-uri", uri,
            "--artifacts-destination", destination,
            "--host", "127.0.0.1", "--port", str(port)]
