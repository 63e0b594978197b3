"""The baselines of quatro and the one entry point for all four policy losses.

GRPO (PPO clip per token, std-normalised group advantages; Shao et al. 2024), GSPO (clip on the length-normalised
sequence ratio; Zheng et al. 2025) and unclipped importance-weighted REINFORCE come from ``tasks/common/rl.py``;
QUATRO's loss (``method.quatro_loss``) takes centred advantages A = r - mean(r), the dual variable supplying the
scale (method.py, R4). Two QUATRO variants differ only in the stabiliser f(rho) (``method.stabiliser_term``), whose
expectation under pi_old is the KL in both: ``quatro`` uses rho log rho - rho + 1 (per-sample gradient
A - lambda log rho) and ``quatro_rho_log_rho`` the literal rho log rho of R3 (per-sample gradient
A - lambda (1 + log rho)).
"""

from __future__ import annotations

from torch import Tensor

from tasks.common import rl
from tasks.quatro import method
from tasks.quatro.config import Algorithm, RLConfig
from tasks.quatro.method import Stabiliser

ADVANTAGE_SCALE: dict[Algorithm, str] = {"grpo": "std", "gspo": "std", "reinforce_is": "std", "quatro": "none",
                                          "quatro_rho_log_rho": "none"}
STABILISER: dict[str, Stabiliser] = {"quatro": "generalised", "quatro_rho_log_rho": "rho_log_rho"}


def is_quatro(algorithm: Algorithm) -> bool:
    return algorithm in STABILISER


def policy_loss(algorithm: Algorithm, new_logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                rl_cfg: RLConfig, lambdas: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """The loss of ``algorithm`` on one batch; ``lambdas`` (one per row) only for QUATRO."""
    if algorithm == "grpo":
        return rl.grpo_loss(new_logprobs, old_logprobs, advantages, mask, eps_low=rl_cfg.clip_eps,
                            eps_high=rl_cfg.clip_eps, aggregation="token")
    if algorithm == "gspo":
        return rl.gspo_loss(new_logprobs, old_logprobs, advantages, mask)
    if algorithm == "reinforce_is":
        return rl.reinforce_is_loss(new_logprobs, old_logprobs, advantages, mask, aggregation="token")
    if is_quatro(algorithm):
        if lambdas is None:
            raise ValueError("QUATRO needs one dual variable per row")
        return method.quatro_loss(new_logprobs, old_logprobs, advantages, mask, lambdas, level=rl_cfg.level,
                                  stabiliser=STABILISER[algorithm])
    raise ValueError(f"unknown algorithm {algorithm!r}")
