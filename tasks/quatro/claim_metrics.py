"""Every claim's number of quatro, derived from the measurements only (costs seconds to change).

Cells: ``stale`` is the most epochs per batch with the largest learning rate among them (the decisive cell);
``fresh`` the fewest epochs with the smallest learning rate (the reference); ``aggressive`` the fewest epochs with
the largest learning rate (when it differs from fresh). Per algorithm run in a cell: pass@k, unique correct count,
token entropy at evaluation, the exact per-query KL to the behaviour policy (median and 90th percentile over the
active queries), the sample KL estimate (diagnostic), the outside-clip fraction, final reward and reward drawdown.
"Strongest baseline" gaps are the minimum over the GRPO-style baselines present (GRPO, GSPO), seed by seed.
"""

from __future__ import annotations

from tasks.common.results import SeedResult
from tasks.quatro.config import QuatroConfig
from tasks.quatro.train import SFT_DIR, cell_algorithms, cells, run_name

BASELINES = ("grpo", "gspo", "reinforce_is")
GRPO_STYLE = ("grpo", "gspo")  # the paper's "GRPO-style baselines"; reinforce_is is QUATRO's lambda = 0 ablation
LITERAL = "quatro_rho_log_rho"
PER_RUN = {"pass1": "eval_pass_at_1", "pass8": "eval_pass_at_8", "unique_correct": "eval_unique_correct",
           "entropy": "eval_entropy", "exact_kl_median": "exact_kl_median", "exact_kl_p90": "exact_kl_p90",
           "sample_kl_median": "median_kl", "drift_kl": "drift_kl", "outside_clip": "outside_clip",
           "final_reward": "final_reward", "reward_drawdown": "reward_drawdown"}


def stale_cell(cfg: QuatroConfig) -> tuple[int, float]:
    """The most epochs per batch, then the largest learning rate among them."""
    return max(cells(cfg.rl))


def fresh_cell(cfg: QuatroConfig) -> tuple[int, float]:
    """The fewest epochs per batch, then the smallest learning rate among them."""
    return min(cells(cfg.rl))


def aggressive_cell(cfg: QuatroConfig) -> tuple[int, float] | None:
    """The fewest epochs per batch with the largest learning rate among them; None when that is the fresh cell."""
    fewest = min(e for e, _ in cells(cfg.rl))
    cell = max(c for c in cells(cfg.rl) if c[0] == fewest)
    return None if cell == fresh_cell(cfg) else cell


def claim_metrics(cfg: QuatroConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    out: dict[str, float] = {}
    top_k = max(cfg.eval.ks)
    delta = cfg.rl.delta
    where_cells = {"stale": stale_cell(cfg), "fresh": fresh_cell(cfg)}
    if (aggressive := aggressive_cell(cfg)) is not None:
        where_cells["aggressive"] = aggressive
    present: dict[str, list[str]] = {}
    for where, (epochs, lr) in where_cells.items():
        present[where] = cell_algorithms(cfg.rl, epochs)
        for algorithm in present[where]:
            name = run_name(algorithm, epochs, lr)
            out |= {f"{where}_{algorithm}_{key}": m[f"{name}_{source}"] for key, source in PER_RUN.items()}
            out[f"{where}_{algorithm}_pass{top_k}"] = m[f"{name}_eval_pass_at_{top_k}"]
    for k in (1, 8, top_k):
        out[f"sft_pass{k}"] = m[f"{SFT_DIR}_eval_pass_at_{k}"]
    out["sft_entropy"] = m[f"{SFT_DIR}_eval_entropy"]
    out["delta"] = delta
    # drift of the stale cell, pooled over every algorithm run there (independent of any one baseline's fate)
    stale_algorithms = present["stale"]
    out["stale_drift_kl_over_delta"] = sum(out[f"stale_{a}_drift_kl"] for a in stale_algorithms) / (
        len(stale_algorithms) * delta)
    if "quatro" not in stale_algorithms:
        return out
    out["stale_quatro_kl_p90_over_delta"] = out["stale_quatro_exact_kl_p90"] / delta
    out["stale_quatro_kl_over_delta"] = out["stale_quatro_exact_kl_median"] / delta
    out["stale_quatro_sample_kl_over_delta"] = out["stale_quatro_sample_kl_median"] / delta
    out["stale_quatro_pass1_gain_over_sft"] = out["stale_quatro_pass1"] - out["sft_pass1"]
    out["stale_entropy_below_sft"] = out["sft_entropy"] - out["stale_quatro_entropy"]
    out[f"stale_pass{top_k}_gap_sft"] = out[f"stale_quatro_pass{top_k}"] - out[f"sft_pass{top_k}"]
    for base in (b for b in BASELINES if b in stale_algorithms):
        out[f"stale_{base}_kl_over_delta"] = out[f"stale_{base}_exact_kl_median"] / delta
        out[f"stale_kl_gap_{base}"] = out[f"stale_{base}_exact_kl_median"] - out["stale_quatro_exact_kl_median"]
        out[f"stale_entropy_gap_{base}"] = out["stale_quatro_entropy"] - out[f"stale_{base}_entropy"]
        for metric in ("pass1", "pass8", f"pass{top_k}", "unique_correct"):
            out[f"stale_{metric}_gap_{base}"] = out[f"stale_quatro_{metric}"] - out[f"stale_{base}_{metric}"]
        out[f"stale_large_k_gain_{base}"] = out[f"stale_pass{top_k}_gap_{base}"] - out[f"stale_pass1_gap_{base}"]
        if base in present["fresh"]:
            out[f"{base}_stale_pass8_drop"] = out[f"fresh_{base}_pass8"] - out[f"stale_{base}_pass8"]
    strong = [b for b in GRPO_STYLE if b in stale_algorithms]
    if strong:
        for metric in ("entropy_gap", "pass1_gap", "unique_correct_gap", "large_k_gain"):
            out[f"stale_{metric}_strongest"] = min(out[f"stale_{metric}_{b}"] for b in strong)
        weakest_for_quatro = min(strong, key=lambda b: out[f"stale_large_k_gain_{b}"])
        out["stale_large_k_baseline_entropy"] = out[f"stale_{weakest_for_quatro}_entropy"]
    if "quatro" in present["fresh"]:
        out["quatro_stale_pass8_drop"] = out["fresh_quatro_pass8"] - out["stale_quatro_pass8"]
        out["fresh_quatro_pass8_gain_over_sft"] = out["fresh_quatro_pass8"] - out["sft_pass8"]
    if "aggressive" in present and {"grpo", "quatro"} <= set(present["aggressive"]) & set(present["fresh"]):
        out["quatro_aggressive_pass8_drop"] = out["fresh_quatro_pass8"] - out["aggressive_quatro_pass8"]
        out["grpo_aggressive_pass8_drop"] = out["fresh_grpo_pass8"] - out["aggressive_grpo_pass8"]
    if "grpo" in stale_algorithms:
        out["stale_grpo_entropy_drop"] = out["sft_entropy"] - out["stale_grpo_entropy"]
    if {"grpo", LITERAL} <= set(stale_algorithms):
        # the literal rho log rho stabiliser of the reconstruction (R3), run at the stale cell only
        out["stale_literal_pass8_gap_grpo"] = out[f"stale_{LITERAL}_pass8"] - out["stale_grpo_pass8"]
        out["stale_literal_kl_over_delta"] = out[f"stale_{LITERAL}_exact_kl_median"] / delta
        out["stale_pass8_gap_literal"] = out["stale_quatro_pass8"] - out[f"stale_{LITERAL}_pass8"]
    return out
