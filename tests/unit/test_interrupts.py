"""The signal handler of tasks/common/interrupts.py in a child process (it ends its process): exit status, the
embedded Prefect server's process ended, ignored signals left ignored; the embedded server's set-up in
flows/servers.py (issue 21). The whole run under each signal: tests/pipeline/test_interrupts.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

# A child that registers a stand-in for Prefect's embedded server (a process that ignores SIGTERM when asked,
# as a server stuck in its shutdown would) in Prefect's own registry, installs the handlers, prints the
# stand-in's pid, then signals itself.
CHILD = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from prefect.server.api.server import SubprocessASGIServer
    from tasks.common import interrupts

    sig, ignore_first, stubborn = signal.Signals[sys.argv[1]], sys.argv[2] == "ignored", sys.argv[3] == "stubborn"
    # Set either way: a test session started under nohup (or as a background job) hands its children SIGHUP
    # (SIGINT) already ignored, which the handler rightly leaves ignored.
    signal.signal(sig, signal.SIG_IGN if ignore_first else signal.SIG_DFL)
    interrupts.SERVER_STOP_S = 1.0
    server = SubprocessASGIServer(port=1)
    ignore_term = "trap '' TERM; " if stubborn else ""  # an ignored signal stays ignored through exec
    # Not on this process's pipes: the test reads them to their end, which would wait for the stand-in.
    server.server_process = subprocess.Popen(["sh", "-c", ignore_term + "exec sleep 60"], start_new_session=True,
                                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(server.server_process.pid, flush=True)
    interrupts.install()
    os.kill(os.getpid(), sig)
    time.sleep(1)
    print("still running", flush=True)
    server.server_process.kill()
""")


def run_child(sig: signal.Signals, ignored: bool = False, stubborn: bool = False, script: str = CHILD
              ) -> tuple[int, str, str, int]:
    done = subprocess.run([sys.executable, "-c", script, sig.name, "ignored" if ignored else "handled",
                           "stubborn" if stubborn else "polite"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    server_pid = int(done.stdout.split()[0])
    return done.returncode, done.stdout, done.stderr, server_pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # an unreaped child of init shows as a zombie: it has ended
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_exits_128_plus_its_number_and_ends_the_embedded_server(sig):
    status, stdout, stderr, server_pid = run_child(sig)
    assert status == 128 + sig, stderr[-2000:]
    assert "still running" not in stdout
    assert f"{sig.name}: stopping" in stderr and "Traceback" not in stderr, stderr[-2000:]
    assert not alive(server_pid), "the embedded server outlived the run"


def test_the_stand_in_server_outlives_a_child_that_does_not_stop_it():
    """Negative control of the check above: a child that exits without the handler leaves the stand-in alive."""
    without_handler = CHILD.replace("interrupts.install()", "signal.signal(sig, lambda *_: os._exit(3))")
    status, _, _, server_pid = run_child(signal.SIGTERM, script=without_handler)
    try:
        assert status == 3 and alive(server_pid)
    finally:
        os.kill(server_pid, signal.SIGKILL)


def test_a_server_that_ignores_sigterm_is_killed():
    status, _, stderr, server_pid = run_child(signal.SIGTERM, stubborn=True)
    assert status == 128 + signal.SIGTERM, stderr[-2000:]
    assert not alive(server_pid)


def test_an_ignored_signal_stays_ignored():
    """``nohup`` ignores SIGHUP so that a run outlives its terminal: installing the handlers keeps that."""
    status, stdout, stderr, _ = run_child(signal.SIGHUP, ignored=True)
    assert status == 0 and "still running" in stdout, stderr[-2000:]


def test_no_embedded_server_when_an_api_url_is_configured():
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows import servers

    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert servers.start_embedded_prefect() is None


def test_using_prefect_api_points_settings_and_child_processes_at_the_server_then_restores(monkeypatch):
    from prefect.settings import PREFECT_API_URL

    from flows import servers

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    before = PREFECT_API_URL.value()
    with servers.using_prefect_api("http://127.0.0.1:8123/api"):
        assert PREFECT_API_URL.value() == "http://127.0.0.1:8123/api"
        assert os.environ["PREFECT_API_URL"] == "http://127.0.0.1:8123/api"
    assert PREFECT_API_URL.value() == before and "PREFECT_API_URL" not in os.environ
    with servers.using_prefect_api(None):
        assert "PREFECT_API_URL" not in os.environ


def test_the_embedded_server_is_launched_in_a_session_of_its_own(monkeypatch):
    """What keeps it alive through the terminal's Ctrl-C until the handler has marked the flow run Cancelled:
    Prefect's own launch, with the session set (checked on the Popen call, without starting a server)."""
    from prefect.server.api import server as prefect_server

    from flows import servers

    launched = {}

    def record(*args, **kwargs):
        launched.update(kwargs)
        raise RuntimeError("stop before starting a server")

    monkeypatch.setattr(subprocess, "Popen", record)
    monkeypatch.setattr(prefect_server.SubprocessASGIServer, "_instances", {})
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(restore_defaults={PREFECT_API_URL}), pytest.raises(RuntimeError, match="stop before"):
        servers.start_embedded_prefect()
    assert launched.get("start_new_session") is True
    assert prefect_server.subprocess is subprocess, "Prefect's module was left patched"


# A child whose engine thread keeps logging errors while the handler closes the run (its server stop made slow,
# as a real one can be): after the handler's line, nothing the logging module emits may reach the terminal.
NOISY_CHILD = textwrap.dedent("""
    import logging, os, signal, sys, threading, time
    from tasks.common import interrupts

    if sys.argv[3] == "no-silence":  # negative control: the handler without its logging switch-off
        interrupts.logging = type("NoDisable", (), {"disable": staticmethod(lambda level: None),
                                                    "CRITICAL": logging.CRITICAL})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    logging.basicConfig(stream=sys.stderr, format="%(levelname)s %(message)s")
    engine = logging.getLogger("engine")

    def crash_reports():
        while True:
            engine.error("Crash detected! Execution was aborted by an interrupt signal.")
            time.sleep(0.005)

    def slow_server_stop(wait_s=0.0):
        time.sleep(0.3)

    interrupts.stop_embedded_servers = slow_server_stop
    print(0, flush=True)
    interrupts.install()
    threading.Thread(target=crash_reports, daemon=True).start()
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(2)
""")


@pytest.mark.parametrize("variant", ["silenced", "no-silence"])
def test_after_the_handlers_line_no_log_record_reaches_the_terminal(variant):
    status, _, stderr, _ = run_child(signal.SIGINT, script=NOISY_CHILD.replace('sys.argv[3]', f'"{variant}"'))
    before, line, after = stderr.partition("SIGINT: stopping")
    assert status == 128 + signal.SIGINT and line, stderr[-2000:]
    assert "Crash detected!" in before  # the thread did log before the signal
    # Negative control: without logging.disable the thread's records go on after the line.
    assert ("Crash detected!" in after) == (variant == "no-silence"), after[-2000:]
