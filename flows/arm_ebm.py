"""Flow of arm_ebm: data (toy EBM tables, samples) then, per seed, E1-E4, then claims and figures."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "arm_ebm"
TITLE = "arm_ebm: Autoregressive LMs are secretly EBMs"


@flow(**flow_options(SLUG))
def arm_ebm(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    """ARMs are secretly EBMs: bijection, soft Bellman, supervised equivalence, lookahead, distillation."""
    return run_paper(SLUG, profile, seeds, phase)


FLOW = arm_ebm
