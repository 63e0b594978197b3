"""Flow of multi_model_curation: data phase, then seeds on the task runner, then claims and figures."""

from tasks.common.paper_flow import paper_flow

multi_model_curation = paper_flow(
    "multi_model_curation",
    "multi_model_curation: When and How Human Curation Backfires (multi-model self-consuming loop)",
    "N generators refit on each other's Bradley-Terry-curated outputs: fixed points, alignment, influence.")
FLOW = multi_model_curation
