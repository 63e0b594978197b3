"""The baselines of quatro and the one entry point for all four policy losses.

GRPO (PPO clip per token, std-normalised group advantages; Shao et al. 2024) and GSPO (clip on the length-normalised
sequence ratio; Zheng et al. 2025) come from ``tasks/common/rl.py``. ``reinforce_is``, the unclipped
importance-weighted REINFORCE, is QUATRO's own loss with lambda = 0 (same centred advantages, same level): the
ablation that isolates the trust-region term from QUATRO's other choices (advantage scale, sequence-level ratio);
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

ADVANTAGE_SCALE: dict[Algorithm, str] = {"grpo": "std", "gspo": "std", "reinforce_is": "none", "quatro": "none",
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
        # QUATRO with lambda = 0: the unclipped importance-weighted REINFORCE in QUATRO's exact form (the ablation)
        return method.quatro_loss(new_logprobs, old_logprobs, advantages, mask, advantages.new_zeros(advantages.shape),
                                  level=rl_cfg.level, stabiliser=STABILISER["quatro"])
    if is_quatro(algorithm):
        if lambdas is None:
            raise ValueError("QUATRO needs one dual variable per row")
        return method.quatro_loss(new_logprobs, old_logprobs, advantages, mask, lambdas, level=rl_cfg.level,
                                  stabiliser=STABILISER[algorithm])
    raise ValueError(f"unknown algorithm {algorithm!r}")
