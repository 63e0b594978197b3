"""`repro server start` never adopts a Prefect server that this checkout did not start (issue 21)."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import threading

import pytest

from flows import servers


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the http.server API
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def foreign_server():
    """Something answering Prefect's health check on a free loopback port, as another checkout's server does."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = http.server.HTTPServer(("127.0.0.1", port), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield port
    server.shutdown()


def test_a_server_of_another_checkout_is_refused(output_root, foreign_server):
    assert servers.prefect_running(foreign_server)
    with pytest.raises(servers.ServerConflict, match=rf"did not start answers at http://127.0.0.1:{foreign_server}"):
        servers.start_prefect(foreign_server, wait_s=1)


def test_a_stale_pid_file_does_not_make_it_ours(output_root, foreign_server):
    dead = subprocess.Popen(["true"])
    dead.wait()
    (output_root / ".prefect").mkdir()
    (output_root / ".prefect" / "server.pid").write_text(f"{dead.pid} {foreign_server}")
    with pytest.raises(servers.ServerConflict):
        servers.start_prefect(foreign_server, wait_s=1)


def test_this_checkouts_own_server_is_reused(output_root, foreign_server):
    """Negative control of the two above: with this checkout's live pid recorded for the port, it is reused."""
    (output_root / ".prefect").mkdir()
    (output_root / ".prefect" / "server.pid").write_text(f"{os.getpid()} {foreign_server}")
    assert servers.start_prefect(foreign_server, wait_s=1) == servers.prefect_api_url(foreign_server)
    (output_root / ".prefect" / "server.pid").write_text(f"{os.getpid()} {foreign_server + 1}")
    with pytest.raises(servers.ServerConflict):
        servers.start_prefect(foreign_server, wait_s=1)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _start_group(code: str, port: int) -> subprocess.Popen:
    """A server as ``repro ui`` starts one: in a session of its own, listening on ``port``."""
    import sys
    import time

    process = subprocess.Popen([sys.executable, "-c", code, str(port)], start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not _listening(port):
        assert process.poll() is None and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.05)
    return process


# Like `mlflow server`: a parent process whose child (uvicorn there) holds the port.
SERVER_WITH_A_WORKER = ("import subprocess, sys; subprocess.run([sys.executable, '-m', 'http.server', '--bind', "
                        "'127.0.0.1', sys.argv[1]])")
DEAF_TO_SIGTERM = ("import signal, socket, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                   "s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); time.sleep(600)")


def test_stop_group_frees_the_port_a_servers_worker_holds():
    import time

    port = servers_free_port()
    process = _start_group(SERVER_WITH_A_WORKER, port)
    started = time.monotonic()
    servers.stop_group(process.pid, port, wait_s=20)
    assert time.monotonic() - started < 10
    assert servers.port_free(port) and not servers.group_alive(process.pid)
    assert process.poll() is not None  # reaped, not left a zombie


def test_stop_group_kills_a_server_deaf_to_sigterm_after_the_wait():
    import time

    port = servers_free_port()
    process = _start_group(DEAF_TO_SIGTERM, port)
    started = time.monotonic()
    servers.stop_group(process.pid, port, wait_s=1.5)
    waited = time.monotonic() - started
    assert waited >= 1.5 and waited < 8, waited  # the full grace period, then SIGKILL
    assert servers.port_free(port) and not servers.group_alive(process.pid)


def servers_free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
