"""Headless Chromium (Debian's ``chromium``) driven through the DevTools protocol, for UI tests.

No browser download, no pip driver: the system binary runs with ``--remote-debugging-port`` on
127.0.0.1 and this module talks to its page target over a websocket (``websockets``' sync client,
installed with Prefect). Name resolution of every host but 127.0.0.1/localhost is mapped to
"not found", so a page that needs the internet (a CDN script, a web font) fails here exactly as it
would offline, and every request the page makes is recorded for the test to inspect.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.support.local_servers import stop_group, tail

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "[::1]", "::1"}
LOCAL_SCHEMES = {"data", "blob", "about", "chrome", "chrome-extension", "devtools"}


def chromium_binary() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


def is_external(url: str) -> bool:
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES or not parts.scheme:
        return False
    return (parts.hostname or "") not in LOOPBACK_HOSTS


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, log: Path, width: int = 1440, height: int = 900, start_timeout_s: float = 60.0):
        binary = chromium_binary()
        if binary is None:
            raise FileNotFoundError("no chromium binary on PATH")
        self.log = log
        self.width, self.height = width, height
        self.profile = Path(tempfile.mkdtemp(prefix="repro-chromium-"))
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as handle:
            self.process = subprocess.Popen(
                [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-sync",
                 "--disable-background-networking", "--disable-component-update", "--disable-default-apps",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
                 "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                 f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"],
                stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            self._connect(start_timeout_s)
        except BaseException:
            self.close()
            raise

    # -- plumbing ---------------------------------------------------------------------------

    def _connect(self, timeout_s: float) -> None:
        from websockets.sync.client import connect

        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not open its DevTools port (exit {self.process.poll()}); "
                                   f"log {self.log}:\n{tail(self.log)}")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        targets = self._page_targets(port, deadline)
        self.ws = connect(targets[0]["webSocketDebuggerUrl"], max_size=None,
                          open_timeout=max(30.0, deadline - time.monotonic()))
        for domain in ("Page", "Network", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride", width=self.width, height=self.height,
                  deviceScaleFactor=1, mobile=False)

    def _page_targets(self, port: int, deadline: float) -> list[dict[str, Any]]:
        """The browser's page targets from ``/json/list``, asked again until ``deadline``. A browser that has
        opened its DevTools port can still take seconds to answer on a busy machine: one unanswered request
        (it timed out at 5 s once inside a full test session, on 2 loaded cores) is not a failure before the
        start-up deadline."""
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list",
                                            timeout=max(1.0, min(5.0, deadline - time.monotonic()))) as response:
                    targets = [t for t in json.load(response) if t.get("type") == "page"]
                if targets:
                    return targets
            except (OSError, ValueError) as err:  # a timeout (TimeoutError is an OSError), a refused or cut reply
                last_error = err
            time.sleep(0.2)
        raise RuntimeError(f"chromium gave no page target on port {port} (exit {self.process.poll()}, last error "
                           f"{last_error!r}); log {self.log}:\n{tail(self.log)}")

    def send(self, method: str, timeout_s: float = 60.0, **params: Any) -> dict[str, Any]:
        """Call a DevTools method and return its result; events that arrive meanwhile are kept."""
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"DevTools call {method} got no answer in {timeout_s:.0f} s")
            message = json.loads(self.ws.recv(timeout=remaining))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"DevTools {method} failed: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.ws.close()
        stop_group(self.process, wait_s=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what a test uses -------------------------------------------------------------------

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result.get("result", {}).get("value")

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def dom(self) -> str:
        return self.evaluate("document.documentElement ? document.documentElement.outerHTML : ''") or ""

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def open(self, url: str, expect: list[str], screenshot: Path, timeout_s: float = 90.0,
             settle_s: float = 1.5) -> str:
        """Navigate to ``url``, wait until the rendered text holds every string of ``expect``, let
        the page settle, save a screenshot (also on failure) and return the page's text."""
        # From a blank page, so that a URL differing only in its #fragment loads afresh instead of
        # leaving a single-page app on the view it showed before.
        self.send("Page.navigate", url="about:blank")
        self.events.clear()
        self.send("Page.navigate", url=url)
        try:
            return self.wait_for(expect, screenshot, timeout_s, settle_s)
        except AssertionError as err:
            raise AssertionError(f"{url}: {err}") from None

    def click_text(self, label: str) -> None:
        """Click (a real mouse click at its centre) the innermost visible element whose text is ``label``."""
        script = f"""(() => {{
            const label = {json.dumps(label)};
            const hits = [...document.querySelectorAll('body *')].filter(el =>
                el.offsetParent !== null && (el.innerText || '').trim() === label &&
                ![...el.children].some(child => (child.innerText || '').trim() === label));
            if (!hits.length) return null;
            hits[0].scrollIntoView({{block: 'center'}});
            const box = hits[0].getBoundingClientRect();
            return [box.left + box.width / 2, box.top + box.height / 2];
        }})()"""
        point = self.evaluate(script)
        if not point:
            raise AssertionError(f"no element labelled {label!r} to click; page text:\n{self.text()[:2000]}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=point[0], y=point[1], button="left", clickCount=1)

    def click_in_row_of(self, text: str, selector: str = "button") -> None:
        """Click the first ``selector`` element in the table row holding ``text`` (an expander)."""
        script = f"""(() => {{
            const text = {json.dumps(text)};
            const rows = [...document.querySelectorAll('[role=row], tr')].filter(row =>
                row.offsetParent !== null && (row.innerText || '').includes(text));
            const target = rows.length ? rows[rows.length - 1].querySelector({json.dumps(selector)}) : null;
            if (!target) return null;
            const box = target.getBoundingClientRect();
            return [box.left + box.width / 2, box.top + box.height / 2];
        }})()"""
        point = self.evaluate(script)
        if not point:
            raise AssertionError(f"no {selector} in a row holding {text!r}; page text:\n{self.text()[:2000]}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=point[0], y=point[1], button="left", clickCount=1)

    def wait_for(self, expect: list[str], screenshot: Path, timeout_s: float = 30.0, settle_s: float = 1.5) -> str:
        """Wait (after a click) until the page's text holds every string of ``expect``; screenshot it."""
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if all(item in text for item in expect):
                time.sleep(settle_s)
                self.screenshot(screenshot)
                return self.text()
            time.sleep(0.5)
        self.screenshot(screenshot)
        missing = [item for item in expect if item not in text]
        raise AssertionError(f"{missing} never appeared within {timeout_s:.0f} s (screenshot {screenshot}); "
                             f"page text:\n{text[:3000]}\nproblems: {self.problems()}")

    def requests(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]

    def problems(self) -> dict[str, list[str]]:
        """What went wrong on the page since the last ``open``: requests that left the machine,
        failed loads, uncaught exceptions and console errors."""
        by_request = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in self.events
                      if e["method"] == "Network.requestWillBeSent"}
        failed = [f"{by_request.get(e['params']['requestId'], '?')}: {e['params'].get('errorText')}"
                  for e in self.events if e["method"] == "Network.loadingFailed"
                  and not e["params"].get("canceled")]
        bad_status = [f"{e['params']['response']['url']}: HTTP {e['params']['response']['status']}"
                      for e in self.events if e["method"] == "Network.responseReceived"
                      and e["params"]["response"]["status"] >= 400]
        exceptions = [json.dumps(e["params"]["exceptionDetails"].get("exception", {}).get("description")
                                 or e["params"]["exceptionDetails"].get("text"))[:500]
                      for e in self.events if e["method"] == "Runtime.exceptionThrown"]
        console = [e["params"]["entry"]["text"][:500] for e in self.events
                   if e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"]
        return {"external": sorted({u for u in self.requests() if is_external(u)}), "failed": failed,
                "http_errors": bad_status, "exceptions": exceptions, "console_errors": console}
