"""Flow of order_sensitivity: data phase, then seeds on the task runner, then claims and figures."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "order_sensitivity"
TITLE = "order_sensitivity: Predictable Compression Failures (order sensitivity, information budgeting)"


@flow(**flow_options(SLUG))
def order_sensitivity(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    """Evidence-order dispersion (QMV bound), EDFL, the ISR answer/abstain gate and Delta-bar on a tiny GPT-2."""
    return run_paper(SLUG, profile, seeds, phase)


FLOW = order_sensitivity
