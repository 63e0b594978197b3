"""Every claim's number of quatro, derived from the measurements only (costs seconds to change).

The decisive cell is the stalest and most aggressive one of ``rl.cells``: the largest number of update epochs per
batch, with the largest learning rate among those (``stale``); the reference cell is the freshest and gentlest
(``fresh``: fewest epochs, smallest learning rate). Per algorithm and cell: pass@k, unique correct count and token
entropy at evaluation, the median per-query KL over training, the fraction of tokens outside the clip range, the final
training reward.
"""

from __future__ import annotations

from tasks.common.results import SeedResult
from tasks.quatro.config import QuatroConfig
from tasks.quatro.train import SFT_DIR, cells, run_name

BASELINES = ("grpo", "gspo", "reinforce_is")
LITERAL = "quatro_rho_log_rho"


def stale_cell(cfg: QuatroConfig) -> tuple[int, float]:
    """The most epochs per batch, then the largest learning rate among them."""
    return max(cells(cfg.rl))


def fresh_cell(cfg: QuatroConfig) -> tuple[int, float]:
    """The fewest epochs per batch, then the smallest learning rate among them."""
    return min(cells(cfg.rl))


def claim_metrics(cfg: QuatroConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    out: dict[str, float] = {}
    top_k = max(cfg.eval.ks)
    for where, (epochs, lr) in (("stale", stale_cell(cfg)), ("fresh", fresh_cell(cfg))):
        for algorithm in cfg.rl.algorithms:
            name = run_name(algorithm, epochs, lr)
            out |= {f"{where}_{algorithm}_pass1": m[f"{name}_eval_pass_at_1"],
                    f"{where}_{algorithm}_pass8": m[f"{name}_eval_pass_at_8"],
                    f"{where}_{algorithm}_pass{top_k}": m[f"{name}_eval_pass_at_{top_k}"],
                    f"{where}_{algorithm}_unique_correct": m[f"{name}_eval_unique_correct"],
                    f"{where}_{algorithm}_entropy": m[f"{name}_eval_entropy"],
                    f"{where}_{algorithm}_median_kl": m[f"{name}_median_kl"],
                    f"{where}_{algorithm}_outside_clip": m[f"{name}_outside_clip"],
                    f"{where}_{algorithm}_final_reward": m[f"{name}_final_reward"]}
    out["sft_pass8"] = m[f"{SFT_DIR}_eval_pass_at_8"]
    out["sft_entropy"] = m[f"{SFT_DIR}_eval_entropy"]
    out["delta"] = cfg.rl.delta
    if "quatro" not in cfg.rl.algorithms:
        return out
    out["stale_quatro_kl_over_delta"] = out["stale_quatro_median_kl"] / cfg.rl.delta
    for base in (b for b in BASELINES if b in cfg.rl.algorithms):
        out[f"stale_kl_gap_{base}"] = out[f"stale_{base}_median_kl"] - out["stale_quatro_median_kl"]
        out[f"stale_entropy_gap_{base}"] = out["stale_quatro_entropy"] - out[f"stale_{base}_entropy"]
        for metric in ("pass1", "pass8", f"pass{top_k}", "unique_correct"):
            out[f"stale_{metric}_gap_{base}"] = out[f"stale_quatro_{metric}"] - out[f"stale_{base}_{metric}"]
        out[f"stale_large_k_gain_{base}"] = out[f"stale_pass{top_k}_gap_{base}"] - out[f"stale_pass1_gap_{base}"]
        # how much the baseline loses from the fresh to the stale cell (a baseline that degrades)
        out[f"{base}_stale_pass8_drop"] = out[f"fresh_{base}_pass8"] - out[f"stale_{base}_pass8"]
    out["quatro_stale_pass8_drop"] = out["fresh_quatro_pass8"] - out["stale_quatro_pass8"]
    out["fresh_quatro_pass8_gain_over_sft"] = out["fresh_quatro_pass8"] - out["sft_pass8"]
    if "grpo" in cfg.rl.algorithms:
        out["stale_grpo_entropy_drop"] = out["sft_entropy"] - out["stale_grpo_entropy"]
    if {"grpo", LITERAL} <= set(cfg.rl.algorithms):
        # the literal rho log rho stabiliser of the reconstruction (R3), the same checks as quatro's
        out["literal_stale_pass8_drop"] = out[f"fresh_{LITERAL}_pass8"] - out[f"stale_{LITERAL}_pass8"]
        out["stale_literal_pass8_gap_grpo"] = out[f"stale_{LITERAL}_pass8"] - out["stale_grpo_pass8"]
        out["stale_literal_kl_over_delta"] = out[f"stale_{LITERAL}_median_kl"] / cfg.rl.delta
        out["stale_pass8_gap_literal"] = out["stale_quatro_pass8"] - out[f"stale_{LITERAL}_pass8"]
    return out
