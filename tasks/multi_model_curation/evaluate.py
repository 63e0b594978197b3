"""Evaluation step of multi_model_curation: every measurement of one seed; derives no claim numbers.

- K -> infinity recursion (identical on every seed): fixed points, Jacobian radii and divergence flags
  (table ``analytic_fixed_points``), the isolated loop on its beta grid (``isolated_beta_grid``), the
  influence heat map (``influence_heatmap``) and the canonical reference values (``analytic_*``).
- Sample-based loops (finite K, seeded): stationary alignments of the coupled configs at both ends of
  beta_1 (``sampled_fixed_points``), the isolated controls (``dampen_isolated``, ``self_invert_isolated``,
  ``isolated_beta_grid_sampled``) and the divergent config's replicate loops (``divergent_sampled``).
- The trained neural generators: the K -> infinity prediction of their loop and the alignment of the
  saved generators (``neural``).

Every loop draws from its own stream (``loops.loop_rng``), so the order of the measurements does not
change them. ``claim_metrics.py`` turns these into the claims' numbers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.multi_model_curation import baselines, data, method
from tasks.multi_model_curation.config import (
    COUPLED_CONFIGS,
    AnalyticConfig,
    MixtureConfig,
    MultiModelCurationConfig,
    NeuralConfig,
    SampledConfig,
    SurveyConfig,
)
from tasks.multi_model_curation.loops import (
    BETA1_RANGE,
    CONVERGENT_CONFIGS,
    K_LABELS,
    MIXTURE_STREAM,
    SURVEY_DRAW_STREAM,
    SURVEY_LOOP_STREAM,
    load_neural_generators,
    loop_rng,
    neural_eval_features,
    neural_spec,
    spec_with_beta1,
)

HEATMAP_REAL_SHARE = 0.2
HEATMAP_TARGETS = np.array([[1.0], [-1.0]])  # the cross-invert family: opposite user preferences
HEATMAP_BETA2 = 1.0
ISOLATED_C2 = {"real_share": 0.2, "target": 2.0}
TOL = 1e-13  # fixed-point tolerance of the grids (early exit; the reference values run all rounds)


# ------------------------------------------------------------------------------------------------
# K -> infinity recursion: C1 convergence, C2 isolated loop, C5 influence, reference values
# ------------------------------------------------------------------------------------------------

def analytic_fixed_points(cfg: AnalyticConfig) -> tuple[dict[str, float], dict[str, list[float]], list[dict]]:
    """Fixed point, Jacobian radius and divergence flag (``method.fixed_point``) of the convergent canonical
    configs and of the divergent one (after ``divergent_rounds``); the divergent config's variance path."""
    specs = method.canonical_specs()
    fixed = {name: method.fixed_point(specs[name], cfg.rounds, 0.0, cfg.jacobian_step) for name in CONVERGENT_CONFIGS}
    divergent = method.fixed_point(specs["divergent"], cfg.divergent_rounds, 0.0, cfg.jacobian_step)
    trajectory = method.iterate_analytic(specs["divergent"], cfg.divergent_rounds)
    rows = [{"config": name, "radius": point.radius, "diverged": point.diverged, "rounds": point.rounds,
             "min_var": float(np.min(point.v))} for name, point in (*fixed.items(), ("divergent", divergent))]
    metrics = {f"radius_{name}": point.radius for name, point in fixed.items()} | {
        "c1_divergent_radius": divergent.radius, "c1_divergent_final_var": float(np.min(divergent.v))}
    return metrics, {"analytic_divergent_var_model1": trajectory.v[:, 0].tolist()}, rows


def isolated_beta_grid(cfg: AnalyticConfig) -> tuple[dict[str, list[float]], list[dict]]:
    """The isolated loop on the beta grid: A* per beta, and for every curating beta the smallest and the
    first round-to-round step of A(t) from the real-data start (round 0), so the transient, where A(t)
    actually moves, is included: from beta = 5 on the trajectory reaches its fixed point in under 20
    rounds. Returns the trajectory of the largest beta (200 rounds) and the rows."""
    rows = []
    top_trajectory = None
    for beta in cfg.isolated_betas:
        spec = method.isolated_spec("isolated", ISOLATED_C2["real_share"], beta, ISOLATED_C2["target"])
        row = {"beta": beta, "analytic_A": float(method.fixed_point(spec, cfg.rounds, TOL).alignment[0])}
        if beta > 0:
            trajectory = method.iterate_analytic(spec, cfg.rounds).alignment[:, 0]
            step = np.diff(trajectory)
            row |= {"min_step": float(step.min()), "first_step": float(step[0])}
            top_trajectory = trajectory
        rows.append(row)
    return {"analytic_isolated_A": top_trajectory[:200].tolist()}, rows


def influence_heatmap(cfg: AnalyticConfig) -> list[dict]:
    """I_ij over (coupling W_12 = W_21, beta_1) on the cross-invert family (opposite targets), and the net
    effect of curating model 1 on collective alignment, I_11 + I_21."""
    rows = []
    for coupling in cfg.coupling_grid:
        for beta1 in cfg.heatmap_betas:
            spec = method.LoopSpec("heatmap", method.symmetric_coupling(HEATMAP_REAL_SHARE, coupling),
                                   np.full(2, HEATMAP_REAL_SHARE), np.array([beta1, HEATMAP_BETA2]), HEATMAP_TARGETS)
            influence = method.influence_matrix(spec, cfg.influence_step, cfg.rounds, TOL)
            rows.append({"coupling": coupling, "beta1": beta1, "I11": float(influence[0, 0]),
                         "I12": float(influence[0, 1]), "I21": float(influence[1, 0]), "I22": float(influence[1, 1]),
                         "net_beta1": float(influence[0, 0] + influence[1, 0])})
    return rows


def analytic_chords(cfg: AnalyticConfig) -> dict[str, np.ndarray]:
    """(A*(beta_1 high) - A*(beta_1 low)) / (high - low) of both models, per canonical coupled config."""
    specs = method.canonical_specs()
    return {name: method.chord_effect(specs[name], 0, *BETA1_RANGE[name], max_rounds=cfg.rounds, tol=0.0)
            for name in COUPLED_CONFIGS}


def analytic_reference_metrics(cfg: AnalyticConfig) -> dict[str, float]:
    """The canonical reference values: A at the fixed point and the K -> infinity chords ΔA_i/Δbeta_1."""
    specs = method.canonical_specs()
    metrics = {}
    for name in CONVERGENT_CONFIGS:
        fixed = method.fixed_point(specs[name], cfg.rounds)
        for i, value in enumerate(fixed.alignment):
            metrics[f"analytic_{name}_A{i + 1}"] = float(value)
    for name, chord in analytic_chords(cfg).items():
        for i, value in enumerate(chord):
            metrics[f"analytic_{name}_dA{i + 1}"] = float(value)
    return metrics


def measure_analytic(cfg: AnalyticConfig, result: SeedResult) -> None:
    metrics, curves, fixed_rows = analytic_fixed_points(cfg)
    isolated_curves, isolated_rows = isolated_beta_grid(cfg)
    heat_rows = influence_heatmap(cfg)
    result.add(metrics | analytic_reference_metrics(cfg), curves=curves | isolated_curves,
               tables={"analytic_fixed_points": fixed_rows, "isolated_beta_grid": isolated_rows,
                       "influence_heatmap": heat_rows})


# ------------------------------------------------------------------------------------------------
# Sample-based loops (finite K)
# ------------------------------------------------------------------------------------------------

def stationary(spec: method.LoopSpec, cfg: SampledConfig, k: int, real: method.RealData,
               rng: np.random.Generator) -> tuple[np.ndarray, method.Trajectory]:
    """A_i at the noisy fixed point of one sampled loop (mean after ``burn_in``) and its trajectory."""
    trajectory = method.iterate_sampled(spec, cfg.rounds, k, cfg.n_samples, real, rng)
    return method.stationary_alignment(trajectory, cfg.burn_in), trajectory


def sampled_coupled(cfg: SampledConfig, analytic: AnalyticConfig, seed: int, real: method.RealData,
                    progress: Progress) -> tuple[dict[str, float], dict[str, list[float]], list[dict]]:
    """The three coupled configs at k_small and k_large, beta_1 low and high (common random numbers): the
    stationary alignments, and at k_large the K -> infinity prediction at the high end."""
    specs = method.canonical_specs()
    metrics: dict[str, float] = {}
    curves: dict[str, list[float]] = {}
    rows = []
    jobs = [(name, label, k) for name in COUPLED_CONFIGS for label, k in zip(K_LABELS, (cfg.k_small, cfg.k_large))]
    for index, (name, label, k) in enumerate(jobs):
        low, high = BETA1_RANGE[name]
        fixed = {}
        for end, beta1 in (("low", low), ("high", high)):
            spec = spec_with_beta1(specs[name], beta1)
            fixed[end], trajectory = stationary(spec, cfg, k, real, loop_rng(seed, 1, COUPLED_CONFIGS.index(name), k))
        predicted = None
        if label == "klarge":
            predicted = method.fixed_point(spec, analytic.rounds).alignment
            curves |= {f"sampled_{name}_A{i + 1}": trajectory.alignment[:, i].tolist() for i in range(spec.n_models)}
        for i in range(2):
            metrics[f"{name}_A{i + 1}_high_{label}"] = float(fixed["high"][i])
            rows.append({"config": name, "model": i + 1, "label": label, "K": k, "beta1_low": low, "beta1_high": high,
                         "A_low": float(fixed["low"][i]), "A_high": float(fixed["high"][i])}
                        | ({"A_predicted": float(predicted[i])} if predicted is not None else {}))
        progress((index + 1) / len(jobs), f"seed {seed}: sampled {name} K={k}")
    return metrics, curves, rows


def isolated_ends(spec: method.LoopSpec, beta_range: tuple[float, float], cfg: SampledConfig, k: int,
                  real: method.RealData, rng_stream: tuple[int, ...]) -> list[dict]:
    """A* of a one-model loop at both ends of a beta range (common random numbers)."""
    return [{"K": k, "beta": beta, "A": float(stationary(spec.with_beta(np.array([beta])), cfg, k, real,
                                                         loop_rng(*rng_stream))[0][0])}
            for beta in beta_range]


def isolated_controls(cfg: SampledConfig, seed: int, real: method.RealData) -> dict[str, list[dict]]:
    """The one-model loops the coupled ones are compared with: dampen's model 1 alone at k_large (C3e), the
    isolated counterpart of self-invert's model 1 at both K (C4i and the C4 preconditions), and the isolated
    loop of C2 on its beta grid at k_large."""
    dampen = baselines.isolated_counterpart(method.canonical_specs()["dampen"], 0)
    self_invert = method.canonical_specs()["self_invert_isolated"]
    grid = []
    for beta in cfg.isolated_betas:
        spec = method.isolated_spec("isolated", ISOLATED_C2["real_share"], beta, ISOLATED_C2["target"])
        grid.append({"beta": beta, "sampled_A": float(stationary(spec, cfg, cfg.k_large, real,
                                                                 loop_rng(seed, 3, cfg.k_large))[0][0])})
    return {"dampen_isolated": isolated_ends(dampen, BETA1_RANGE["dampen"], cfg, cfg.k_large, real,
                                             (seed, 2, cfg.k_large)),
            "isolated_beta_grid_sampled": grid,
            "self_invert_isolated": [row | {"label": label} for label, k in zip(K_LABELS, (cfg.k_small, cfg.k_large))
                                     for row in isolated_ends(self_invert, BETA1_RANGE["self_invert"], cfg, k, real,
                                                              (seed, 4, k))]}


def sampled_divergent(cfg: SampledConfig, seed: int, real: method.RealData
                      ) -> tuple[dict[str, float], list[float], list[dict]]:
    """The divergent config sampled at k_small, ``cfg.divergent_replicates`` independent loops per seed,
    each flagged by ``method.divergence_flag`` (a variance below 1e-2 and still falling). The sample loop
    has no Jacobian, so only the variance criteria apply; the sampled variances are noisy, so the mean of
    the last window of rounds is compared with the window before it. Returns the first loop's final
    variance and variance curve, and one row per loop (its flag, and the two windows' mean variance per
    model, ``v_last_<i>`` and ``v_before_<i>``, from which claim_metrics derives the flag's margin).

    The divergent config has lambda = 0, so the loops never read the real data set: the replicates
    of one seed are independent draws of the same experiment."""
    spec = method.canonical_specs()["divergent"]
    rows, first_v = [], None
    for replicate in range(cfg.divergent_replicates):
        stream = (seed, 5, cfg.k_small) if replicate == 0 else (seed, 5, cfg.k_small, replicate)
        trajectory = method.iterate_sampled(spec, cfg.rounds, cfg.k_small, cfg.n_samples, real, loop_rng(*stream))
        window = max(1, min(5, cfg.rounds // 4))
        v_last = trajectory.v[-window:].mean(axis=0)
        v_before = trajectory.v[-2 * window:-window].mean(axis=0)
        rows.append({"replicate": replicate, "flagged": method.divergence_flag(0.0, v_last, v_before),
                     "final_min_var": float(trajectory.v[-1].min())}
                    | {f"v_last_{i + 1}": float(v) for i, v in enumerate(v_last)}
                    | {f"v_before_{i + 1}": float(v) for i, v in enumerate(v_before)})
        if first_v is None:
            first_v = trajectory.v.min(axis=1)
    return {"divergent_sampled_final_var": float(first_v[-1])}, first_v.tolist(), rows


def measure_sampled(cfg: SampledConfig, analytic: AnalyticConfig, seed: int, real: method.RealData,
                    progress: Progress, result: SeedResult) -> None:
    metrics, curves, rows = sampled_coupled(cfg, analytic, seed, real, progress)
    divergent_metrics, divergent_var, divergent_rows = sampled_divergent(cfg, seed, real)
    result.add(metrics | divergent_metrics, curves=curves | {"sampled_divergent_min_var": divergent_var},
               tables={"sampled_fixed_points": rows, "divergent_sampled": divergent_rows}
               | isolated_controls(cfg, seed, real))


# ------------------------------------------------------------------------------------------------
# Configurations drawn from the fixed prior (issue 19, item 1)
# ------------------------------------------------------------------------------------------------

def counted_inverting(chords: dict[str, np.ndarray], converged_tol: float) -> tuple[np.ndarray, np.ndarray]:
    """(converged, inverting) masks of the survey's draws: a draw counts when its state moved at most
    ``converged_tol`` in the last round, and inverts when it counts and ``method.self_inverts`` holds."""
    converged = chords["moved"] <= converged_tol
    return converged, method.self_inverts(chords["dA1"], chords["isolated_dA"]) & converged


def survey_indices(inverting: np.ndarray, cfg: SurveyConfig) -> list[int]:
    """The draws the survey samples: the first ``sampled_random`` of the seed (i.i.d. from the prior) and the
    first ``sampled_inverting`` that self-invert at K -> infinity (in draw order; the two sets may overlap)."""
    first_inverting = np.flatnonzero(inverting)[: cfg.sampled_inverting].tolist()
    return sorted(set(range(cfg.sampled_random)) | set(first_inverting))


def sampled_chord(spec_at: method.ConfigBatch, index: int, cfg: SurveyConfig, k: int, real: method.RealData,
                  seed: int) -> np.ndarray:
    """ΔA_i/Δbeta_1 of one drawn configuration, sampled at K = ``k`` (both ends on one stream: common random
    numbers)."""
    ends = []
    for beta1 in (spec_at.beta1_low[index], spec_at.beta1_high[index]):
        trajectory = method.iterate_sampled(spec_at.spec(index, float(beta1)), cfg.rounds, k, cfg.n_samples, real,
                                            loop_rng(seed, SURVEY_LOOP_STREAM, index, k))
        ends.append(method.stationary_alignment(trajectory, cfg.burn_in))
    return (ends[1] - ends[0]) / (spec_at.beta1_high[index] - spec_at.beta1_low[index])


def measure_survey(cfg: SurveyConfig, sampled: SampledConfig, seed: int, real: method.RealData,
                   progress: Progress, result: SeedResult) -> None:
    """The seed's draws from ``method.ConfigPrior``: the K -> infinity chords of every draw (counts in the
    metrics), and the sampled chords at k_small and k_large of the draws ``survey_indices`` picks (table
    ``survey_sampled``, one row per draw and K; the K -> infinity values of the same draw beside them)."""
    batch = method.draw_configs(method.ConfigPrior(), cfg.analytic_configs, loop_rng(seed, SURVEY_DRAW_STREAM))
    chords = method.survey_chords(batch, cfg.analytic_rounds)
    converged, inverting = counted_inverting(chords, cfg.converged_tol)
    random_draws = set(range(cfg.sampled_random))
    first_inverting = set(np.flatnonzero(inverting)[: cfg.sampled_inverting].tolist())
    rows = []
    indices = survey_indices(inverting, cfg)
    for done, index in enumerate(indices):
        for label, k in zip(K_LABELS, (sampled.k_small, sampled.k_large)):
            chord = sampled_chord(batch, index, cfg, k, real, seed)
            rows.append({"index": index, "random": index in random_draws, "inverting": index in first_inverting,
                         "converged": bool(converged[index]), "label": label, "K": k,
                         "sampled_dA1": float(chord[0]), "sampled_dA2": float(chord[1]),
                         "analytic_dA1": float(chords["dA1"][index]), "analytic_dA2": float(chords["dA2"][index]),
                         "analytic_isolated_dA": float(chords["isolated_dA"][index]),
                         "lambda": batch.real_share[index].tolist(), "mixing": batch.mixing[index].tolist(),
                         "targets": batch.targets[index].tolist(), "beta2": float(batch.beta2[index]),
                         "beta1_low": float(batch.beta1_low[index]), "beta1_high": float(batch.beta1_high[index])})
        progress((done + 1) / max(1, len(indices)), f"seed {seed}: survey draw {index}")
    inverting_chords = chords["dA1"][inverting]
    result.add({"survey_kinf_trials": float(converged.sum()), "survey_kinf_inverting": float(inverting.sum()),
                "survey_kinf_unconverged": float((~converged).sum()),
                "survey_kinf_isolated_not_gaining": float((chords["isolated_dA"][converged] <= 0).sum()),
                "survey_kinf_median_inverting_dA1": float(np.median(inverting_chords)) if inverting.any()
                else float("nan")},
               tables={"survey_sampled": rows})


# ------------------------------------------------------------------------------------------------
# Gaussian-mixture generators on the self-invert config (issue 19, item 2)
# ------------------------------------------------------------------------------------------------

def mixture_ends(cfg: MixtureConfig, components: int, seed: int, real: method.RealData) -> list[dict]:
    """Self-invert's coupled loop and model 1's isolated counterpart with ``components``-Gaussian generators
    refit by EM, at both ends of beta_1 (common random numbers per loop kind): stationary A_i (mean after
    ``burn_in``), the last refit's log-likelihood gain over a single Gaussian and the change one more EM step
    would make (``method.em_step_gain``), and the coupled loop's A_1(t), A_2(t)."""
    spec = method.canonical_specs()["self_invert"]
    rows = []
    for beta1 in BETA1_RANGE["self_invert"]:
        coupled_spec = spec_with_beta1(spec, beta1)
        coupled = method.iterate_mixture(coupled_spec, cfg.rounds, cfg.k, cfg.n_samples, real,
                                         loop_rng(seed, MIXTURE_STREAM, components, cfg.k), components,
                                         cfg.em_iterations)
        alone = method.iterate_mixture(baselines.isolated_counterpart(coupled_spec, 0), cfg.rounds, cfg.k,
                                       cfg.n_samples, real, loop_rng(seed, MIXTURE_STREAM + 1, components, cfg.k),
                                       components, cfg.em_iterations)
        fixed = coupled.alignment[cfg.burn_in + 1:].mean(axis=0)
        rows.append({"components": components, "beta1": beta1, "A1": float(fixed[0]), "A2": float(fixed[1]),
                     "isolated_A": float(alone.alignment[cfg.burn_in + 1:, 0].mean()),
                     "loglik_gain_1": float(coupled.loglik_gain[0]), "loglik_gain_2": float(coupled.loglik_gain[1]),
                     "em_step_gain_1": float(coupled.em_step_gain[0]), "em_step_gain_2": float(coupled.em_step_gain[1]),
                     "fit_size": coupled.fit_size,
                     "curve_A1": coupled.alignment[:, 0].tolist(), "curve_A2": coupled.alignment[:, 1].tolist()})
    return rows


def measure_mixture(cfg: MixtureConfig, seed: int, real: method.RealData, result: SeedResult) -> None:
    """The mixture generators (``cfg.components``) and, at the same sizes, K and streams' layout, the
    single-Gaussian generators (one component: EM is then the Gaussian MLE) as the control that still
    self-inverts (table ``mixture_self_invert``)."""
    rows = mixture_ends(cfg, cfg.components, seed, real) + mixture_ends(cfg, 1, seed, real)
    result.add(tables={"mixture_self_invert": rows})


# ------------------------------------------------------------------------------------------------
# The trained neural generators
# ------------------------------------------------------------------------------------------------

def neural_rows(cfg: NeuralConfig, analytic: AnalyticConfig, seed: int, model_dir: Path) -> list[dict]:
    """Per generator: the K -> infinity prediction of the neural loop (the conditional recursion with
    a_i = mu_i e_1 has the 1-D fixed point) and the saved generator's alignment on the loop's own
    evaluation inputs (the last point of its ``neural_A<i>`` curve)."""
    spec = neural_spec(cfg)
    predicted = method.fixed_point(spec, analytic.rounds).alignment
    phi_eval = neural_eval_features(cfg, seed)
    models = load_neural_generators(cfg, seed, model_dir)
    return [{"model": i + 1, "predicted_A": float(predicted[i]),
             "checkpoint_A": model.alignment(phi_eval, spec.targets[i])} for i, model in enumerate(models)]


def evaluate(config: MultiModelCurationConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    """Every measurement of one seed. Reads the real data set first, so a stale data folder fails before
    any compute; the K -> infinity parts do not depend on the seed."""
    real = data.read_real_1d(config, seed, Path(data_dir)) if config.sampled is not None else None
    result = SeedResult(seed)
    with result.stage("analytic"):
        measure_analytic(config.analytic, result)
    if config.sampled is not None:
        with result.stage("sampled"):
            measure_sampled(config.sampled, config.analytic, seed, real, progress, result)
    if config.survey is not None:
        with result.stage("survey"):
            measure_survey(config.survey, config.sampled, seed, real, progress, result)
    if config.mixture is not None:
        with result.stage("mixture"):
            measure_mixture(config.mixture, seed, real, result)
    if config.neural is not None:
        result.add(tables={"neural": neural_rows(config.neural, config.analytic, seed, Path(model_dir))})
    return result
