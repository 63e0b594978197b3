"""Flow of multi_model_curation: data phase, then seeds on the task runner, then claims and figures."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "multi_model_curation"
TITLE = "multi_model_curation: When and How Human Curation Backfires (multi-model self-consuming loop)"


@flow(**flow_options(SLUG))
def multi_model_curation(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    """N generators refit on each other's Bradley-Terry-curated outputs: fixed points, alignment, influence."""
    return run_paper(SLUG, profile, seeds, phase)


FLOW = multi_model_curation
