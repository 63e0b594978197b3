"""Flow of arm_ebm: data (toy EBM tables, samples) then, per seed, E1-E4, then claims and figures."""

from tasks.common.paper_flow import paper_flow

WORKERS = 3
arm_ebm = paper_flow(
    "arm_ebm", "arm_ebm: Autoregressive LMs are secretly EBMs",
    "ARMs are secretly EBMs: bijection, soft Bellman, supervised equivalence, lookahead, distillation.", WORKERS)
FLOW = arm_ebm
