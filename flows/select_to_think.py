"""Flow of select_to_think: data phase, then seeds on the task runner, then claims and figures."""

from tasks.common.paper_flow import paper_flow

select_to_think = paper_flow(
    "select_to_think",
    "select_to_think: Select to Think, local sufficiency of a small model's top-K",
    "S2T (large model selects among the small model's top-K at divergence triggers), Takeover, S2T-Local.")
FLOW = select_to_think
