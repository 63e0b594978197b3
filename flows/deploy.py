"""Deployments on a Prefect ``process`` work pool, run by a worker (``repro deploy``).

Unlike ``repro serve`` (deployments served from one long-lived process), a work pool lets any
number of workers, on any machine that has this checkout, pick up scheduled or UI-triggered runs:

    repro server start
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    repro deploy --pool repro-process --profile cpu [--cron "0 3 * * *"]
    prefect worker start --pool repro-process          # on each machine that should run flows
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from prefect import Flow

from flows.registry import papers

POOL = "repro-process"


async def ensure_process_pool(name: str = POOL) -> None:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    async with get_client() as client:
        try:
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            pass


def deploy_all(pool: str = POOL, profile: str = "smoke", seeds: list[int] | None = None,
               cron: str | None = None) -> list[str]:
    """One deployment per paper flow and one for reproduce-all on ``pool``; returns their ids."""
    asyncio.run(ensure_process_pool(pool))
    # The code's checkout (not REPRO_ROOT, which may point at an output-only folder).
    root = str(Path(__file__).resolve().parents[1])
    parameters = {"profile": profile, "seeds": seeds}
    entrypoints = [(slug, f"flows/{slug}.py:{slug}") for slug in papers()]
    entrypoints.append(("reproduce-all", "flows/reproduce_all.py:reproduce_all"))
    ids = []
    for name, entrypoint in entrypoints:
        flow = Flow.from_source(source=root, entrypoint=entrypoint)
        ids.append(str(flow.deploy(name=name, work_pool_name=pool, parameters=parameters, cron=cron,
                                   build=False, push=False, print_next_steps=False)))
    return ids
