"""Deployments of every paper flow and of reproduce-all, served from this process (``repro serve``).

Each deployment takes the parameters ``profile`` and ``seeds``; ``--cron`` adds a schedule. Trigger
them from the Prefect UI or the API (``prefect deployment run 'arm_ebm/arm_ebm'``).
"""

from __future__ import annotations

from prefect import serve

from flows.registry import load_flow, papers
from flows.reproduce_all import reproduce_all


def build_deployments(profile: str = "smoke", seeds: list[int] | None = None, cron: str | None = None) -> list:
    parameters = {"profile": profile, "seeds": seeds}
    deployments = [load_flow(slug).to_deployment(name=slug, parameters=parameters, cron=cron,
                                                 tags=["paper", slug]) for slug in papers()]
    deployments.append(reproduce_all.to_deployment(name="reproduce-all", parameters=parameters, cron=cron,
                                                   tags=["all"]))
    return deployments


def serve_all(profile: str = "smoke", seeds: list[int] | None = None, cron: str | None = None) -> None:
    serve(*build_deployments(profile, seeds, cron))
