"""Flow of coda: data phase, then seeds on the task runner, then claims and figures."""

from tasks.common.paper_flow import paper_flow

coda = paper_flow(
    "coda",
    "coda: Continuous-depth acceleration (GRU + one linear ODE + dense), reconstructed",
    "LTC, ODE-RNN, CfC and the CoDA block on six irregularly-sampled tasks: accuracy, NFE and FLOP counts.")
FLOW = coda
