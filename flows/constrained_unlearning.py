"""Flow of constrained_unlearning: data phase, then seeds on the task runner, then claims and figures."""

from tasks.common.paper_flow import paper_flow

constrained_unlearning = paper_flow(
    "constrained_unlearning",
    "constrained_unlearning: Unlearning in Diffusion Models with KL and Likelihood Constraints",
    "Reverse-KL, forward-KL and likelihood-constrained unlearning by primal-dual, exact on a grid and on a small DDPM.")
FLOW = constrained_unlearning
