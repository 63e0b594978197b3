"""The test browser (tests/support/browser.py) starts on a busy machine.

``test_report_page.py::test_page_in_a_browser`` once failed inside a full ``make test`` session (passing alone)
with ``TimeoutError`` in ``Browser._connect``: Chromium had opened its DevTools port but did not answer
``/json/list`` within the single 5-second request, which was not retried although the start-up deadline was
60 s. Reproduced here without loading the machine: Chromium is stopped (SIGSTOP) for 8 s right after it
opened its port, as a starved browser is, and must still be driven once it runs again."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.browser import Browser, chromium_binary

pytestmark = pytest.mark.skipif(chromium_binary() is None, reason="Chromium not installed (see .ci/system-packages.sh)")
STALL_S = 8.0


def chromium_group_on(port: int) -> int | None:
    """The process group of the Chromium whose profile's DevToolsActivePort names ``port``."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        profile = next((a[len(b"--user-data-dir="):].decode() for a in args if a.startswith(b"--user-data-dir=")),
                       None)
        if profile is None or b"--remote-debugging-port=0" not in args:
            continue
        try:
            if int((Path(profile) / "DevToolsActivePort").read_text().split()[0]) == port:
                return os.getpgid(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return None


def test_a_browser_that_answers_late_is_still_driven(monkeypatch, tmp_path):
    real_urlopen = urllib.request.urlopen
    stalled: list[int] = []

    def urlopen_after_a_stall(url, *args, **kwargs):
        text = getattr(url, "full_url", url)
        if "/json/list" in text and not stalled:
            group = chromium_group_on(int(text.split(":")[2].split("/")[0]))
            assert group is not None, "no Chromium found for the DevTools port"
            os.killpg(group, signal.SIGSTOP)
            stalled.append(group)
            threading.Timer(STALL_S, os.killpg, (group, signal.SIGCONT)).start()
        return real_urlopen(url, *args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen_after_a_stall)
    started = time.monotonic()
    try:
        with Browser(tmp_path / "chromium.log") as browser:
            assert stalled, "the stall was never applied"
            assert time.monotonic() - started >= STALL_S
            assert browser.evaluate("1 + 1") == 2
    finally:
        for group in stalled:  # never leave a stopped browser behind
            try:
                os.killpg(group, signal.SIGCONT)
            except ProcessLookupError:
                pass
