"""Flow that runs every paper of params.yaml's list, then builds the global report."""

from __future__ import annotations

from prefect import flow

from flows.registry import load_flow, papers
from tasks.common.report import build_index


@flow(name="reproduce-all", log_prints=True)
def reproduce_all(profile: str | None = None, seeds: list[int] | None = None) -> dict:
    outcome = {}
    for slug in papers():
        outcome[slug] = load_flow(slug)(profile=profile, seeds=seeds, phase="all")["verdicts"]
    md, _ = build_index(papers())
    print(f"report written to {md}")
    return outcome


FLOW = reproduce_all
