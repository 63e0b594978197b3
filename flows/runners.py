"""Task runners a paper flow can run on: threads in this process (default) or a Dask cluster.

``--runner dask`` fans seeds out over Dask workers: a ``LocalCluster`` of 2 worker processes (one
thread each) by default, or an existing scheduler with ``--dask-address tcp://host:8786``. Choosing
the runner never changes a result: each seed is a pure function of (config, seed), tested identical
under both runners. See docs/scaling.md for what workers on other hosts need (the project installed,
a shared filesystem for data/ and models/, shared Prefect result storage).
"""

from __future__ import annotations

import os
from typing import Any, Literal

RunnerName = Literal["threads", "dask"]
RUNNERS: tuple[str, ...] = ("threads", "dask")
# dvc repro runs stages through `python -m flows.stage`, which reads these when no flag is given.
RUNNER_ENV = "REPRO_RUNNER"
DASK_ADDRESS_ENV = "REPRO_DASK_ADDRESS"
LOCAL_DASK_WORKERS = 2
# The runner a paper's seeds use at a profile when neither --runner nor REPRO_RUNNER says: threads, except
# where a process runner measured faster on two cores (docs/performance.md, "Runner per paper"): papers whose
# seeds hold the GIL (many small torch or numpy operations) only use one core on threads.
PREFERRED_RUNNERS: dict[tuple[str, str], RunnerName] = {}


class RunnerError(ValueError):
    """A bad runner choice, named before any compute."""


def preferred_runner(slug: str, profile: str) -> RunnerName:
    """The measured-fastest runner of ``slug`` at ``profile`` (threads unless PREFERRED_RUNNERS says)."""
    return PREFERRED_RUNNERS.get((slug, profile), "threads")


def resolve_runner(runner: str | None, dask_address: str | None,
                   preferred: str = "threads") -> tuple[str, str | None]:
    """(runner, address) from flags, else from REPRO_RUNNER / REPRO_DASK_ADDRESS, else the paper's
    ``preferred`` runner (see :func:`preferred_runner`)."""
    name = runner or os.environ.get(RUNNER_ENV) or preferred
    # The environment's address applies only when the runner is dask, so `--runner threads` still
    # works in a shell that exports REPRO_DASK_ADDRESS; an explicit --dask-address never is ignored.
    address = dask_address or (os.environ.get(DASK_ADDRESS_ENV) if name == "dask" else None) or None
    if name not in RUNNERS:
        raise RunnerError(f"runner: must be one of {', '.join(RUNNERS)}, got {name!r}")
    if address and name != "dask":
        raise RunnerError(f"dask_address: only used with --runner dask, got runner {name!r}")
    if address and not address.startswith(("tcp://", "tls://", "inproc://", "ucx://")):
        raise RunnerError(f"dask_address: must be a scheduler address like tcp://host:8786, got {address!r}")
    return name, address


def local_cluster_kwargs(n_workers: int = LOCAL_DASK_WORKERS) -> dict[str, Any]:
    """Worker processes with one thread each: torch and numpy hold the GIL, so processes (not
    threads) are what run seeds in parallel. Dask's nanny already sets OMP/MKL threads to 1."""
    return {"n_workers": n_workers, "threads_per_worker": 1, "processes": True,
            "dashboard_address": None, "preload": ["flows.dask_worker_setup"]}


def dask_task_runner(address: str | None = None, n_workers: int = LOCAL_DASK_WORKERS) -> Any:
    from prefect_dask import DaskTaskRunner

    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(cluster_class="distributed.LocalCluster", cluster_kwargs=local_cluster_kwargs(n_workers))


def with_runner(flow: Any, runner: str, address: str | None = None) -> Any:
    """The flow unchanged for threads (its own ThreadPoolTaskRunner), or a copy on Dask."""
    if runner == "threads":
        return flow
    return flow.with_options(task_runner=dask_task_runner(address))
