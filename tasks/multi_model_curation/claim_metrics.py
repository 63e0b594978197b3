"""Every claim's number of multi_model_curation, derived from the measurements only (the evaluation's
tables and metrics, the training curves). Costs seconds to change.

The sampled chord ΔA_i/Δbeta_1 = (A_i(beta_1 high) - A_i(beta_1 low)) / (high - low) is the per-seed
metric whose sign claims C3 and C4 check against the K -> infinity chord (README, "What is measured").
"""

from __future__ import annotations

import numpy as np

from tasks.common.results import SeedResult
from tasks.multi_model_curation import method
from tasks.multi_model_curation.config import COUPLED_CONFIGS, AnalyticConfig, MixtureConfig, MultiModelCurationConfig
from tasks.multi_model_curation.loops import BETA1_RANGE, K_LABELS


def convergence_claims(rows: list[dict]) -> dict[str, float]:
    """C1a-c: the largest radius and the count of flagged configs among the convergent canonical configs,
    and the divergent config's flag (table ``analytic_fixed_points``)."""
    convergent = [r for r in rows if r["config"] != "divergent"]
    divergent = next(r for r in rows if r["config"] == "divergent")
    return {"c1_max_radius_convergent": max(r["radius"] for r in convergent),
            "c1_convergent_flagged_count": float(sum(bool(r["diverged"]) for r in convergent)),
            "c1_divergent_flagged": float(divergent["diverged"])}


def isolated_claims(rows: list[dict]) -> dict[str, float]:
    """C2a-b on the K -> infinity isolated loop (table ``isolated_beta_grid``): the smallest increment of A*
    along the beta grid, and the smallest (and smallest first) step of A(t) over the curating betas."""
    curating = [r for r in rows if "min_step" in r]
    return {"c2_isolated_min_increment_analytic": float(np.diff([r["analytic_A"] for r in rows]).min()),
            "c2_isolated_min_step_from_round0": min(r["min_step"] for r in curating),
            "c2_isolated_min_first_step": min(r["first_step"] for r in curating)}


def _net(rows: list[dict], coupling: float, beta1: float) -> float:
    return next(r["net_beta1"] for r in rows if r["coupling"] == coupling and r["beta1"] == beta1)


def influence_claims(rows: list[dict], cfg: AnalyticConfig) -> dict[str, float]:
    """C5a-c (table ``influence_heatmap``): the cross-influence without and with coupling, the smallest
    self-influence, and whether the net effect I_11 + I_21 flips from positive (self-influence wins, weakest
    coupling) to negative (cross-influence wins, strongest) for some beta_1."""
    uncoupled = [r for r in rows if r["coupling"] == 0.0]
    coupled = [r for r in rows if r["coupling"] > 0.0]
    weakest, strongest = cfg.coupling_grid[0], cfg.coupling_grid[-1]
    flips = [b for b in cfg.heatmap_betas if _net(rows, weakest, b) > 0 > _net(rows, strongest, b)]
    return {"c5_cross_influence_uncoupled_max_abs": max(abs(r["I21"]) for r in uncoupled),
            "c5_cross_influence_coupled_max": max(r["I21"] for r in coupled),
            "c5_self_influence_min": min(r["I11"] for r in rows),
            "c5_net_sign_flips": float(bool(flips))}


def chords(rows: list[dict]) -> np.ndarray:
    """ΔA_i/Δbeta_1 of the rows' models (same beta range)."""
    low = np.array([r["A_low"] for r in rows])
    high = np.array([r["A_high"] for r in rows])
    return (high - low) / (rows[0]["beta1_high"] - rows[0]["beta1_low"])


def coupled_claims(rows: list[dict], analytic: dict[str, float]) -> dict[str, float]:
    """C1e, C3a-d, C4a-h, C4j (table ``sampled_fixed_points``): the chords of both models per config and K,
    their sum at k_large, the k_large fixed points' relative error against the K -> infinity prediction,
    and the fraction of chords with the K -> infinity chord's sign (``analytic`` holds its chords)."""
    metrics: dict[str, float] = {}
    rel_errors, sign_matches = [], []
    for name in COUPLED_CONFIGS:
        for label in K_LABELS:
            pair = [r for r in rows if r["config"] == name and r["label"] == label]
            chord = chords(pair)
            for row, value in zip(pair, chord):
                metrics[f"{name}_dA{row['model']}_{label}"] = float(value)
                sign_matches.append(float(np.sign(value) == np.sign(analytic[f"analytic_{name}_dA{row['model']}"])))
            if label == "klarge":
                high = np.array([r["A_high"] for r in pair])
                predicted = np.array([r["A_predicted"] for r in pair])
                errors = np.abs(high - predicted) / np.abs(predicted)
                metrics[f"{name}_klarge_max_rel_error"] = float(errors.max())
                rel_errors.append(float(errors.max()))
                metrics[f"{name}_dsum_klarge"] = float(chord.sum())
    metrics["c1_klarge_max_rel_error"] = max(rel_errors)
    metrics["sign_match_fraction"] = float(np.mean(sign_matches))
    return metrics


def isolated_control_claims(result: SeedResult, dampen_chord: float) -> dict[str, float]:
    """C3e: the curated model's gain from curation, coupled (dampen) over isolated, at k_large; C4i and the
    C4 preconditions: the chord of self-invert's isolated counterpart per K; C2c: the smallest increment of
    the sampled isolated loop's A* along its beta grid."""
    low, high = BETA1_RANGE["dampen"]
    dampen = result.tables["dampen_isolated"]
    isolated_gain = dampen[1]["A"] - dampen[0]["A"]
    coupled_gain = dampen_chord * (high - low)
    metrics = {"dampen_isolated_gain_klarge": isolated_gain, "dampen_coupled_gain_klarge": coupled_gain,
               "c3_dampen_ratio_klarge": coupled_gain / isolated_gain}
    low, high = BETA1_RANGE["self_invert"]
    for label in K_LABELS:
        ends = [r["A"] for r in result.tables["self_invert_isolated"] if r["label"] == label]
        metrics[f"self_invert_isolated_dA_{label}"] = (ends[1] - ends[0]) / (high - low)
    grid = [r["sampled_A"] for r in result.tables["isolated_beta_grid_sampled"]]
    return metrics | {"c2_isolated_min_increment_sampled": float(np.diff(grid).min())}


def divergent_claims(rows: list[dict]) -> dict[str, float]:
    """C1d: the divergent config's replicate loops. The claim (every run is flagged) is decided on the worst
    run's margin (:func:`method.collapse_margin`, the largest over the seed's loops: < 1 when every loop meets
    the collapse criterion of the flag); the flagged count and the rate are reported next to it."""
    flagged = sum(int(r["flagged"]) for r in rows)
    n_models = sum(1 for key in rows[0] if key.startswith("v_last_"))
    margins = [method.collapse_margin([r[f"v_last_{i + 1}"] for i in range(n_models)],
                                      [r[f"v_before_{i + 1}"] for i in range(n_models)]) for r in rows]
    return {"c1_divergent_sampled_flagged_count": float(flagged), "c1_divergent_sampled_runs": float(len(rows)),
            "c1_divergent_sampled_rate": flagged / len(rows),
            "c1_divergent_sampled_worst_margin": max(margins)}


def survey_claims(result: SeedResult) -> dict[str, float]:
    """C7a-e (issue 19, item 1): self-inversion among configurations drawn from ``method.ConfigPrior``.

    K -> infinity: the rate of inverting draws among the converged draws (their counts are the evaluation's
    metrics ``survey_kinf_inverting`` / ``survey_kinf_trials``). Sampled at K (labels
    ksmall / klarge, table ``survey_sampled``): among the seed's first i.i.d. draws (``random``), those whose
    sampled ΔA_1 < 0 while the isolated counterpart gains at K -> infinity (``method.self_inverts``); among
    the first K -> infinity self-inverting draws (``inverting``), those that still self-invert when sampled."""
    metrics = {"survey_kinf_rate": result.metrics["survey_kinf_inverting"] / result.metrics["survey_kinf_trials"]}
    rows = result.tables["survey_sampled"]
    for label in K_LABELS:
        at_k = [r for r in rows if r["label"] == label and r["converged"]]
        for subset in ("random", "inverting"):
            chosen = [r for r in at_k if r[subset]]
            inverts = method.self_inverts([r["sampled_dA1"] for r in chosen],
                                          [r["analytic_isolated_dA"] for r in chosen])
            metrics[f"survey_{subset}_inverting_{label}"] = float(np.sum(inverts))
            metrics[f"survey_{subset}_trials_{label}"] = float(len(chosen))
            if chosen:  # no rate without trials (survey.sampled_random = 0 samples no i.i.d. draw)
                metrics[f"survey_{subset}_rate_{label}"] = float(np.mean(inverts))
    return metrics


def window_drift(curve: list[float] | np.ndarray, burn_in: int) -> float:
    """How much a loop still moves over its averaging window (rounds burn_in + 1 .. end of ``curve``, whose
    entry 0 is round 0): the mean of the window's second half minus the mean of its first half (an odd
    middle round is in neither half). 0 for a stationary loop up to sampling noise."""
    window = np.asarray(curve, dtype=float)[burn_in + 1:]
    half = window.size // 2
    if half < 1:
        raise ValueError(f"window_drift: the window after burn_in {burn_in} has fewer than 2 rounds")
    return float(window[-half:].mean() - window[:half].mean())


def drift_excess(ends: list[dict], key: str, burn_in: int) -> float:
    """Stationarity margin of a chord (review of 2026-12-02): the larger |window_drift| of the two beta_1 ends'
    curves ``key`` minus half the end-to-end difference |A(high) - A(low)| (= |chord| Δbeta_1 / 2). < 0 when
    the loop moves less within its window than half the effect the chord measures."""
    sums = [np.asarray(r["curve_A1"], dtype=float) + np.asarray(r["curve_A2"], dtype=float) for r in ends]
    curves = sums if key == "sum" else [r[f"curve_{key}"] for r in ends]
    fixed = [np.asarray(c, dtype=float)[burn_in + 1:].mean() for c in curves]
    return max(abs(window_drift(c, burn_in)) for c in curves) - abs(fixed[1] - fixed[0]) / 2


def mixture_claims(result: SeedResult, cfg: MixtureConfig) -> dict[str, float]:
    """C8a-c (issue 19, item 2): the chords ΔA_i/Δbeta_1 of self-invert with ``cfg.components``-Gaussian
    generators (``mixture_*``) and of the single-Gaussian control at the same sizes (``gaussian_control_*``),
    model 1's isolated chord for both, the mixture's log-likelihood gain over a single Gaussian on model 1's
    training data at the high beta_1 (raw and less the BIC penalty), the change one more EM step would make
    there, and the stationarity margins of the coupled chords (``drift_excess``; table ``mixture_self_invert``)."""
    low, high = BETA1_RANGE["self_invert"]
    metrics = {}
    for prefix, g in (("mixture", cfg.components), ("gaussian_control", 1)):
        ends = sorted((r for r in result.tables["mixture_self_invert"] if r["components"] == g),
                      key=lambda r: r["beta1"])
        for key, name in (("A1", "dA1"), ("A2", "dA2"), ("isolated_A", "isolated_dA")):
            metrics[f"{prefix}_self_invert_{name}"] = (ends[1][key] - ends[0][key]) / (high - low)
        metrics[f"{prefix}_self_invert_dsum"] = metrics[f"{prefix}_self_invert_dA1"] + metrics[
            f"{prefix}_self_invert_dA2"]
        metrics[f"{prefix}_loglik_gain_model1"] = ends[1]["loglik_gain_1"]
        metrics[f"{prefix}_loglik_gain_over_bic_model1"] = ends[1]["loglik_gain_1"] - method.bic_penalty_per_sample(
            g, ends[1]["fit_size"])
        metrics[f"{prefix}_em_step_gain_model1"] = max(r["em_step_gain_1"] for r in ends)
        for key, name in (("A1", "dA1"), ("A2", "dA2"), ("sum", "dsum")):
            metrics[f"{prefix}_drift_excess_{name}"] = drift_excess(ends, key, cfg.burn_in)
    return metrics


def stationary_curves(result: SeedResult, prefix: str, n_models: int) -> np.ndarray:
    """The per-model curves ``<prefix>_A<i>`` as one (rounds + 1, N) array."""
    return np.stack([np.array(result.curves[f"{prefix}_A{i + 1}"]) for i in range(n_models)], axis=1)


def neural_claims(result: SeedResult, burn_in: int) -> dict[str, float]:
    """C1f: the neural loop's stationary alignment (mean of A_i(t) after ``burn_in``) against the K -> infinity
    prediction (table ``neural``), as the largest relative error."""
    rows = result.tables["neural"]
    fixed = stationary_curves(result, "neural", len(rows))[burn_in + 1:].mean(axis=0)
    predicted = np.array([r["predicted_A"] for r in rows])
    errors = np.abs(fixed - predicted) / np.abs(predicted)
    return {"c1_neural_max_rel_error": float(errors.max())} | {
        f"neural_A{i + 1}": float(fixed[i]) for i in range(len(rows))}


def hub_claims(result: SeedResult, n_models: int) -> dict[str, float]:
    """C6a-b: each generator's final alignment and its gain over the loop (round 0 = before training)."""
    trajectory = stationary_curves(result, "hub", n_models)
    return ({f"hub_A{i + 1}_final": float(trajectory[-1, i]) for i in range(n_models)}
            | {f"hub_A{i + 1}_gain": float(trajectory[-1, i] - trajectory[0, i]) for i in range(n_models)})


def claim_metrics(config: MultiModelCurationConfig, result: SeedResult) -> dict[str, float]:
    tables = result.tables
    metrics = (convergence_claims(tables["analytic_fixed_points"]) | isolated_claims(tables["isolated_beta_grid"])
               | influence_claims(tables["influence_heatmap"], config.analytic))
    if config.sampled is not None:
        coupled = coupled_claims(tables["sampled_fixed_points"], result.metrics)
        metrics |= coupled | isolated_control_claims(result, coupled["dampen_dA1_klarge"])
        metrics |= divergent_claims(tables["divergent_sampled"])
    if config.survey is not None:
        metrics |= survey_claims(result)
    if config.mixture is not None:
        metrics |= mixture_claims(result, config.mixture)
    if config.neural is not None:
        metrics |= neural_claims(result, config.neural.burn_in)
    if config.hub is not None:
        metrics |= hub_claims(result, len(config.hub.generators))
    return metrics
