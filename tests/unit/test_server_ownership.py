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
