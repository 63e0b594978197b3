"""Flow of certificate_pruning: data phase, then seeds on the task runner, then claims and figures."""

from tasks.common.paper_flow import paper_flow

certificate_pruning = paper_flow(
    "certificate_pruning",
    "certificate_pruning: Certificate-Guided Pruning for Stochastic Lipschitz Optimization",
    "CGP: certified active set of a noisy Lipschitz black box, its variants, and HOO/Zooming/DIRECT/GP-UCB baselines.")
FLOW = certificate_pruning
