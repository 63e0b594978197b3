"""Flow of llm_orchestration (copy to flows/<slug>.py; the body is tasks/common/paper_flow.py)."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "llm_orchestration"


@flow(**flow_options(SLUG))
def llm_orchestration(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    return run_paper(SLUG, profile, seeds, phase)


FLOW = llm_orchestration
