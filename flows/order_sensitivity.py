"""Flow of order_sensitivity: data phase, then seeds on the task runner, then claims and figures."""

from tasks.common.paper_flow import paper_flow

order_sensitivity = paper_flow(
    "order_sensitivity",
    "order_sensitivity: Predictable Compression Failures (order sensitivity, information budgeting)",
    "Evidence-order dispersion (QMV bound), EDFL, the ISR answer/abstain gate and Delta-bar on a tiny GPT-2.")
FLOW = order_sensitivity
