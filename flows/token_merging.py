"""Flow of token_merging: data phase, then seeds on the task runner, then claims and figures."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "token_merging"
TITLE = "token_merging: Token merging as statistical reconstruction (reconstructed)"


@flow(**flow_options(SLUG))
def token_merging(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    """ToMe bipartite merging with sqrt(r) logit and value corrections on a small ViT trained on digits."""
    return run_paper(SLUG, profile, seeds, phase)


FLOW = token_merging
