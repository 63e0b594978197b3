"""Baselines the reconstructed corrections are compared against (README.md, "Method summary").

* M1 plain average: ToMe's size-weighted merging, attention ignores sizes (no log-size prior).
* M2 ToMe (Bolya et al., ICLR 2023): size-weighted merging + proportional attention
  softmax(q.k/sqrt(d) + log s), the baseline the corrections modify.
* M6 ToFu MLERP (Kim et al., 2023): merged direction of the size-weighted mean with the size-weighted
  mean member norm (averaging no longer shrinks norms), with proportional attention [reconstructed
  from the prior-art description; ToFu's exact schedule of pruning vs merging is not reproduced].
"""

from __future__ import annotations

from tasks.token_merging.method import PER_CLUSTER_KAPPA, SQRT_R, VALUE_CORRECTED, MergeMethod

PLAIN_AVERAGE = MergeMethod("M1", "average", "none")
PROPORTIONAL = MergeMethod("M2", "average", "prop")
MLERP = MergeMethod("M6", "mlerp", "prop")

ALL_METHODS: tuple[MergeMethod, ...] = (PLAIN_AVERAGE, PROPORTIONAL, SQRT_R, VALUE_CORRECTED, PER_CLUSTER_KAPPA,
                                        MLERP)
"""M1-M6 in README.md's order; M4's value exponent is set per run by energy matching."""
