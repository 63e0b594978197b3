"""Flow of certificate_pruning: data phase, then seeds on the task runner, then claims and figures."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "certificate_pruning"
TITLE = "certificate_pruning: Certificate-Guided Pruning for Stochastic Lipschitz Optimization"


@flow(**flow_options(SLUG))
def certificate_pruning(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    """CGP: certified active set of a noisy Lipschitz black box, its variants, HOO/Zooming/DIRECT/GP-UCB."""
    return run_paper(SLUG, profile, seeds, phase)


FLOW = certificate_pruning
