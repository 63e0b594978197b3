"""Flow of constrained_unlearning: data phase, then seeds on the task runner, then claims and figures."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "constrained_unlearning"
TITLE = "constrained_unlearning: Unlearning in Diffusion Models with KL and Likelihood Constraints"


@flow(**flow_options(SLUG))
def constrained_unlearning(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    """Reverse-KL, forward-KL and likelihood-constrained unlearning by primal-dual, on a grid and a small DDPM."""
    return run_paper(SLUG, profile, seeds, phase)


FLOW = constrained_unlearning
