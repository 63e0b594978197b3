"""Flow of arm_ebm: data (toy EBM tables, samples) then, per seed, E1-E4, then claims and figures."""

from __future__ import annotations

from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from tasks.common.paper_flow import Phase, run_paper

SLUG = "arm_ebm"
TITLE = "arm_ebm: Autoregressive LMs are secretly EBMs"
# Three seeds run at once even on 2 cores: each trains with one torch thread, and a third worker
# beats leaving a core idle while the last seed runs alone.
WORKERS = 3


@flow(name=SLUG, task_runner=ThreadPoolTaskRunner(max_workers=WORKERS))
def arm_ebm(profile: str | None = None, seeds: list[int] | None = None, phase: Phase = "all") -> dict:
    """ARMs are secretly EBMs: bijection, soft Bellman, supervised equivalence, lookahead, distillation."""
    return run_paper(SLUG, TITLE, profile, seeds, phase, WORKERS)


FLOW = arm_ebm
