"""Flow of coda: data phase, then seeds on the task runner, then claims and figures."""

from prefect import flow

from tasks.common.paper_flow import Phase, flow_options, run_paper

SLUG = "coda"
TITLE = "coda: Continuous-depth acceleration (GRU + one linear ODE + dense), reconstructed"


@flow(**flow_options(SLUG))
def coda(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    """LTC, ODE-RNN, CfC and the CoDA block on six irregularly-sampled tasks: accuracy, NFE and FLOP counts."""
    return run_paper(SLUG, profile, seeds, phase)


FLOW = coda
