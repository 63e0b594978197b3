"""Flow of select_to_think (copy to flows/<slug>.py; the body is tasks/common/paper_flow.py)."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "select_to_think"


@flow(**flow_options(SLUG))
def select_to_think(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    return run_paper(SLUG, profile, seeds, phase)


FLOW = select_to_think
