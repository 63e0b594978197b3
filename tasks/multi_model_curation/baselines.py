"""Reference points the coupled loops are compared against (all closed form or analytic).

- no curation (beta = 0): the loop's fixed point is the real data distribution;
- the isolated loop of Ferbach et al. (W = diag(1 - lambda)): curation alone, no peers;
- the K -> infinity recursion (``method.fixed_point``) is the predictor of the sampled loops.
"""

from __future__ import annotations

import numpy as np

from tasks.multi_model_curation import method


def no_curation_alignment(spec: method.LoopSpec) -> np.ndarray:
    """A_i when nobody curates: every model converges to the real data, A_i = -(|theta_0 - a_i|^2 + s0^2)/2."""
    return -(np.sum((spec.real_theta[None, :] - spec.targets) ** 2, axis=1) + spec.real_var) / 2.0


def isolated_counterpart(spec: method.LoopSpec, model: int) -> method.LoopSpec:
    """Model ``model`` alone with the same real-data share: W = [[1 - lambda_i]], same beta and target."""
    lam = float(spec.real_share[model])
    return method.LoopSpec(f"{spec.name}_isolated_{model}", np.array([[1.0 - lam]]), np.array([lam]),
                           spec.beta[model:model + 1], spec.targets[model:model + 1], spec.real_theta, spec.real_var)
