"""Flow of token_merging: data phase, then seeds on the task runner, then claims and figures."""

from tasks.common.paper_flow import paper_flow

token_merging = paper_flow(
    "token_merging",
    "token_merging: Token merging as statistical reconstruction (reconstructed)",
    "ToMe bipartite merging with sqrt(r) logit and value corrections on a small ViT trained on digits, training-free.")
FLOW = token_merging
