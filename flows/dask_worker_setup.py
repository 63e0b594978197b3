"""Preloaded into the worker processes of the local Dask cluster of ``--runner dask`` (flows/runners.py)."""

from __future__ import annotations

import signal
from typing import Any


def dask_setup(worker: Any) -> None:
    """Ignore the terminal's signals (Ctrl-C, a closed terminal), which reach the whole process group: the run's
    handler (tasks/common/interrupts.py) closes its records and ends these processes itself. A worker that took
    the Ctrl-C too would close with a dozen log lines and warnings (and tracebacks once its scheduler is gone)."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
