"""Flow of multi_model_curation (copy to flows/<slug>.py; the body is tasks/common/paper_flow.py)."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "multi_model_curation"


@flow(**flow_options(SLUG))
def multi_model_curation(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    return run_paper(SLUG, profile, seeds, phase)


FLOW = multi_model_curation
