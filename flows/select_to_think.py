"""Flow of select_to_think: data phase, then seeds on the task runner, then claims and figures."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "select_to_think"
TITLE = "select_to_think: Select to Think, local sufficiency of a small model's top-K"


@flow(**flow_options(SLUG))
def select_to_think(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    """S2T (large model selects among the small model's top-K at divergence triggers), Takeover, S2T-Local."""
    return run_paper(SLUG, profile, seeds, phase)


FLOW = select_to_think
