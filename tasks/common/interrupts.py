"""Stopping a run on Ctrl-C, SIGTERM or SIGHUP within seconds, with its records closed and its helpers ended.

Seeds train on threads, which Python cannot stop: waiting for them takes minutes, and an embedded Prefect
server killed by the same Ctrl-C makes every seed fail on connection errors meanwhile. So on the first
SIGINT, SIGTERM (what a scheduler sends) or SIGHUP (the terminal closed) the handler marks the open MLflow
runs FAILED and the Prefect flow runs Cancelled, best effort and for at most ``GRACE_S`` seconds, stops the
embedded Prefect server this process started (``os._exit`` skips the ``atexit`` hook that would) and kills its
other child processes (the local Dask cluster's workers, which ignore the terminal's signals: see
``flows/dask_worker_setup.py``), then ends the process at once (``os._exit``). Nothing finished is lost:
every output is written atomically (``tasks/common/io.py``), and a trained seed is persisted by Prefect and
marked by its ``train.json``, so a rerun resumes at the first seed that had not finished.
"""

from __future__ import annotations

import contextvars
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")
POLL_S = 0.25
_DONE = object()

GRACE_S = 5.0
# How long the handler waits for a killed embedded server to be gone.
SERVER_STOP_S = 2.0
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
OPEN_MLFLOW_RUNS: set[str] = set()
OPEN_FLOW_RUNS: set[str] = set()
_lock = threading.Lock()


def opened(mlflow_run_id: str | None = None, flow_run_id: str | None = None) -> None:
    with _lock:
        if mlflow_run_id:
            OPEN_MLFLOW_RUNS.add(mlflow_run_id)
        if flow_run_id:
            OPEN_FLOW_RUNS.add(flow_run_id)


def closed(mlflow_run_id: str | None = None, flow_run_id: str | None = None) -> None:
    with _lock:
        OPEN_MLFLOW_RUNS.discard(mlflow_run_id)
        OPEN_FLOW_RUNS.discard(flow_run_id)


def forget_all() -> None:
    """The flow has ended (Prefect recorded its final state): nothing is left to close."""
    with _lock:
        OPEN_MLFLOW_RUNS.clear()
        OPEN_FLOW_RUNS.clear()


def close_open_runs(reason: str) -> None:
    """Mark every open MLflow run FAILED and every open Prefect flow run Cancelled (with ``reason``)."""
    from tasks.common import tracking

    with _lock:
        mlflow_runs, flow_runs = sorted(OPEN_MLFLOW_RUNS), sorted(OPEN_FLOW_RUNS)
    for run_id in mlflow_runs:
        tracking.set_tags(run_id, {"interrupted": reason})
        tracking.end_run(run_id, "FAILED")
        closed(mlflow_run_id=run_id)
    if flow_runs:
        from prefect.client.orchestration import get_client
        from prefect.states import Cancelled

        with get_client(sync_client=True) as client:
            for flow_run_id in flow_runs:
                client.set_flow_run_state(flow_run_id, Cancelled(message=reason), force=True)
                closed(flow_run_id=flow_run_id)


def _close_quietly(reason: str) -> None:
    try:
        close_open_runs(reason)
    except Exception as err:  # noqa: BLE001 - the process ends next whatever failed here
        print(f"could not close every run record ({type(err).__name__}: {err})", file=sys.stderr, flush=True)


def embedded_server_processes() -> list[subprocess.Popen]:
    """The processes of Prefect's embedded ("ephemeral") API servers started by this process, if Prefect's
    server module was ever imported here (a run against a persistent server has none)."""
    server_module = sys.modules.get("prefect.server.api.server")
    if server_module is None:
        return []
    servers = list(server_module.SubprocessASGIServer._instances.values())
    return [server.server_process for server in servers if getattr(server, "server_process", None) is not None]


def stop_embedded_servers(wait_s: float = SERVER_STOP_S) -> None:
    """Kill this process's embedded Prefect servers and wait up to ``wait_s`` seconds for them. One started by
    ``flows.servers.start_embedded_prefect`` lives in a session of its own (a terminal's Ctrl-C does not reach
    it), and ``os._exit`` skips Prefect's ``atexit`` hook, so without this it would outlive us. Killed, not
    terminated: the records are closed by now, and a graceful shutdown logs its background services' errors
    (with tracebacks) on the run's terminal; its SQLite database survives a kill like any crash."""
    processes = embedded_server_processes()
    for process in processes:
        if process.poll() is None:
            process.kill()
    deadline = time.monotonic() + wait_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            continue


def end_child_processes() -> None:
    """SIGKILL every process this one started that is still alive (the local Dask cluster's workers, anything
    they started): they would otherwise notice their scheduler gone and log errors before exiting by themselves."""
    try:
        import psutil
    except ImportError:
        return
    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            continue


def stop_now(signum: int, _frame: object = None) -> None:
    """The signal handler: silence logging, close the records (bounded), stop the embedded Prefect server, then
    exit with 128 + signum (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP)."""
    name = signal.Signals(signum).name
    # From here on the run is ending and this handler reports it: log records of the threads still winding
    # down would only bury the line below in noise. Seen: polars turns SIGINT into a KeyboardInterrupt in
    # whatever thread runs a query, so a seed reading its parquet at that moment "crashes" and Prefect logs
    # "Crash detected!" at ERROR. Direct stderr writes (a thread's traceback) are not affected.
    logging.disable(logging.CRITICAL)
    from tasks.common import progress_bars

    progress_bars.stop_active()  # live bars hide the cursor: give the terminal back before the line below
    print(f"\n{name}: stopping; finished seeds are kept and a rerun resumes from them", file=sys.stderr, flush=True)
    # The closer runs in the interrupted code's context: the flow's Prefect settings name the API it talks to.
    closer = threading.Thread(target=contextvars.copy_context().run, args=(_close_quietly, f"stopped by {name}"),
                              daemon=True)
    closer.start()
    closer.join(GRACE_S)
    try:
        stop_embedded_servers()
        end_child_processes()
    except Exception as err:  # noqa: BLE001 - the process ends next whatever failed here
        print(f"could not end every helper process ({type(err).__name__}: {err})", file=sys.stderr, flush=True)
    sys.stderr.flush()
    os._exit(128 + signum)


def interruptible(items: Iterable[T]) -> Iterator[T]:
    """Iterate a blocking iterator (``prefect.futures.as_completed``) in a helper thread and hand its items
    over with waits of ``POLL_S`` seconds. A Python signal handler runs only in the main thread, once that
    thread executes bytecode: when the kernel delivers Ctrl-C to a training thread, a main thread parked in an
    untimed lock wait (what ``as_completed`` does) would sleep through it until every seed had finished.
    Exceptions of the iterator are raised here; the helper copies the caller's context (Prefect's run context).
    """
    handoff: queue.Queue = queue.Queue()
    context = contextvars.copy_context()

    def pump() -> None:
        try:
            for item in items:
                handoff.put((True, item))
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            handoff.put((False, err))
        handoff.put((True, _DONE))

    threading.Thread(target=context.run, args=(pump,), daemon=True, name="interruptible-wait").start()
    while True:
        try:
            ok, item = handoff.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if not ok:
            raise item
        if item is _DONE:
            return
        yield item


def install() -> dict[int, object]:
    """Route SIGINT, SIGTERM and SIGHUP to :func:`stop_now` (from the main thread, before the flow starts);
    returns the previous handlers for :func:`restore`. A signal the process ignores stays ignored (``nohup``
    ignores SIGHUP so that the run outlives its terminal). Off the main thread (a flow called from a worker)
    it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, stop_now) for sig in SIGNALS if signal.getsignal(sig) != signal.SIG_IGN}


def restore(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
