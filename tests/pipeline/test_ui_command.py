"""`repro ui` and Ctrl-C (issue 22): it stops the Prefect server and the MLflow UI it started, prints no
traceback, exits 130 within seconds, and leaves both ports free: once both servers answer, and while the
Prefect server is still starting.

The signal goes to the command's whole process group, as a terminal's Ctrl-C does."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import servers
from tests.conftest import free_port, make_output_root
from tests.pipeline.helpers import project_env

STOP_WITHIN_S = 30.0


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def bindable(port: int) -> bool:
    """A server (binding with SO_REUSEADDR, as uvicorn does) could listen on the port again."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def read_pid_entry(root) -> tuple[int, int] | None:
    try:
        pid, port = (root / ".prefect" / "server.pid").read_text().split()
    except (OSError, ValueError):
        return None
    return int(pid), int(port)


def stop_leftovers(*ports: int) -> None:
    """After a failure: kill every process group whose command line names one of the ports (the servers'
    ``--port N``), so that a failing run of this test leaves no server behind."""
    # Arguments end with a NUL in /proc/<pid>/cmdline: port 500 must not match "--port 5000".
    wanted = {f"--port\0{port}\0".encode() for port in ports} | {f"--port={port}\0".encode() for port in ports}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if any(w in cmdline for w in wanted):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(os.getpgid(int(proc.name)), signal.SIGKILL)


# "serving" waits for both servers to start: 85 s at load 2-3 on 2 cores, hence -m slow; "starting" (3 s)
# stays in the default suite.
@pytest.mark.parametrize("moment", [pytest.param("serving", marks=pytest.mark.slow), "starting"])
def test_ctrl_c_stops_the_servers_it_started_without_a_traceback(tmp_path, moment):
    root = make_output_root(tmp_path / "p")
    prefect_port, mlflow_port = free_port(), free_port()
    env = project_env(root, REPRO_PREFECT_PORT=str(prefect_port), PREFECT_HOME=str(tmp_path / "prefect-home"),
                      MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'mlflow.db'}")
    env.pop("PREFECT_API_URL", None)  # the session's server is not this command's
    # Files, not pipes: a server left behind holding a pipe must not hang the test.
    out_path, err_path = tmp_path / "ui.out", tmp_path / "ui.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        process = subprocess.Popen([sys.executable, "-m", "flows.cli", "ui", "--port", str(mlflow_port)], cwd=root,
                                   env=env, stdout=out, stderr=err, start_new_session=True)
    try:
        deadline = time.monotonic() + 300

        def ready() -> bool:
            if moment == "starting":  # the Prefect server process exists, and does not answer yet
                return read_pid_entry(root) is not None
            return servers.healthy(f"http://127.0.0.1:{mlflow_port}/health") and servers.prefect_running(prefect_port)

        while not ready():
            assert process.poll() is None and time.monotonic() < deadline, err_path.read_text()[-3000:]
            time.sleep(0.2 if moment == "starting" else 1.0)
        prefect_pid, recorded_port = read_pid_entry(root)
        assert recorded_port == prefect_port
        if moment == "starting":
            assert not servers.prefect_running(prefect_port), "the server answered before the signal: too late"
        sent = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)  # a terminal's Ctrl-C: the foreground process group
        process.wait(timeout=STOP_WITHIN_S + 30)
        took = time.monotonic() - sent
        print(f"repro ui stopped {took:.1f} s after Ctrl-C ({moment})")
        stderr = err_path.read_text()
        assert process.returncode == 130, (out_path.read_text(), stderr)
        assert took < STOP_WITHIN_S, f"{took:.1f} s from Ctrl-C to exit"
        assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
        expected = "the MLflow UI and the Prefect server" if moment == "serving" else "the Prefect server"
        assert stderr.rstrip().endswith(f"stopped {expected}"), stderr
        # Both ports are free once the command has returned, and nothing of the Prefect server runs on.
        assert not listening(prefect_port) and not listening(mlflow_port)
        assert bindable(prefect_port) and bindable(mlflow_port)
        assert not group_alive(prefect_pid)
        assert read_pid_entry(root) is None
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        stop_leftovers(prefect_port, mlflow_port)
