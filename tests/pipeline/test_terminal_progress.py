"""A paper's stage as a user sees it (issue 22): in a terminal (a pseudo-terminal here) one live bar per
seed and no progress log lines doubling them; piped (DVC in CI, a log file), the progress log lines as
before and no bar. Either way the progress lines reach the Prefect API, i.e. the UI's log tab."""

from __future__ import annotations

import errno
import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from tests.conftest import make_output_root
from tests.pipeline.helpers import project_env

pytestmark = pytest.mark.usefixtures("prefect_server")

COMMAND = [sys.executable, "-m", "flows.stage", "arm_ebm", "--phase", "all", "--profile", "smoke", "--seeds", "0", "1"]
# SeedProgress's log line: "[arm_ebm] train seed 0  50% <message> (12 s, ETA 12 s)"
PROGRESS_LINE = re.compile(r"\[arm_ebm\] (train|evaluate) seed \d +\d+% .*\(\d+ s, (ETA \d+ s|done)\)")
BAR = "━"


def terminal_env(root) -> dict[str, str]:
    env = project_env(root, TERM="xterm-256color")
    for key in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "REPRO_PROGRESS", "COLUMNS"):
        env.pop(key, None)
    return env


def run_in_a_terminal(command: list[str], cwd, env, timeout_s: float = 600) -> tuple[int, str]:
    """Run ``command`` with stdin, stdout and stderr on a 120x40 pseudo-terminal; its exit status and output."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(command, cwd=cwd, env=env, stdin=follower, stdout=follower, stderr=follower,
                               start_new_session=True)
    os.close(follower)
    chunks, deadline = [], time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError as err:  # EIO: every process holding the terminal has closed it
                    if err.errno != errno.EIO:
                        raise
                    break
                if not data:
                    break
                chunks.append(data)
            elif process.poll() is not None:
                break
        return process.wait(timeout=30), b"".join(chunks).decode(errors="replace")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
        os.close(leader)


def progress_logged_to_prefect(after: float) -> list[str]:
    """The progress lines of the newest arm_ebm flow run started after ``after`` (the UI's log tab)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import FlowRunSort

    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs(sort=FlowRunSort.START_TIME_DESC, limit=20)
                if r.name.startswith("arm_ebm-all-smoke-seeds-0-1") and r.start_time
                and r.start_time.timestamp() >= after]
        assert runs, "no arm_ebm flow run recorded by the Prefect server"
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[runs[0].id])), limit=200)
    return [log.message for log in logs if PROGRESS_LINE.search(log.message)]


def test_a_terminal_shows_a_bar_per_seed_and_no_doubled_progress_lines(tmp_path):
    root = make_output_root(tmp_path / "p")
    started = time.time() - 1
    status, output = run_in_a_terminal(COMMAND, root, terminal_env(root))
    assert status == 0, output[-4000:]
    assert BAR in output
    for label in ("[arm_ebm] train seed 0", "[arm_ebm] train seed 1", "[arm_ebm] evaluate seed 0"):
        assert label in output, output[-4000:]
    doubled = [line for line in output.splitlines() if PROGRESS_LINE.search(line)]
    assert doubled == [], doubled[:5]
    assert "\x1b[?25h" in output  # the cursor, hidden while the bars draw, is shown again
    assert "[arm_ebm] smoke, seeds [0, 1]:" in output  # the run's summary follows the bars
    logged = progress_logged_to_prefect(started)
    assert any(line.startswith("[arm_ebm] train seed 0 100%") for line in logged), logged
    assert any(line.startswith("[arm_ebm] evaluate seed 1 100%") for line in logged), logged


def test_piped_output_keeps_the_progress_lines_and_draws_no_bar(tmp_path):
    root = make_output_root(tmp_path / "p")
    started = time.time() - 1
    result = subprocess.run(COMMAND, cwd=root, env=terminal_env(root), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    shown = [line for line in result.stderr.splitlines() if PROGRESS_LINE.search(line)]
    assert any("[arm_ebm] train seed 0 100%" in line for line in shown), result.stderr[-4000:]
    assert any("[arm_ebm] evaluate seed 1 100%" in line for line in shown), result.stderr[-4000:]
    assert BAR not in result.stderr + result.stdout and "\x1b[?25l" not in result.stderr
    logged = progress_logged_to_prefect(started)
    assert len(logged) == len(shown), (logged, shown)
