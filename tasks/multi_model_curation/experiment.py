"""The multi_model_curation experiment: analytic recursion, sample-based loops, neural refit.

Plain functions, no Prefect, no MLflow. ``run_seed`` returns metrics (one scalar per claim and
seed), curves (alignment trajectories) and tables (influence heat map, sign table) for the flow.
The analytic parts are deterministic (identical on every seed); the sampled parts use the seed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tasks.common.io import save_state_dict, write_parquet
from tasks.common.results import Progress, SeedResult
from tasks.multi_model_curation import baselines, data, method
from tasks.multi_model_curation.config import (
    COUPLED_CONFIGS,
    AnalyticConfig,
    MultiModelCurationConfig,
    NeuralConfig,
    SampledConfig,
)

# beta_1 ranges of the brief's canonical coupled configs (low -> high; the high end is canonical).
BETA1_RANGE = {"dampen": (0.0, 5.0), "cross_invert": (0.0, 5.0), "self_invert": (0.6, 4.0)}
CONVERGENT_CONFIGS = ("isolated", "dampen", "cross_invert", "self_invert", "self_invert_isolated")
HEATMAP_REAL_SHARE = 0.2
HEATMAP_TARGETS = np.array([[1.0], [-1.0]])  # the cross-invert family: opposite user preferences
HEATMAP_BETA2 = 1.0
ISOLATED_C2 = {"real_share": 0.2, "target": 2.0}
TOL = 1e-13  # fixed-point tolerance of the grids (early exit; the reference values run all rounds)


def spec_with_beta1(spec: method.LoopSpec, beta1: float) -> method.LoopSpec:
    beta = spec.beta.copy()
    beta[0] = beta1
    return spec.with_beta(beta)


# ------------------------------------------------------------------------------------------------
# Analytic (K -> infinity) claims: C1 convergence, C2 isolated loop, C3/C4 signs, C5 influence
# ------------------------------------------------------------------------------------------------

def convergence_metrics(cfg: AnalyticConfig) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Spectral radius at the canonical fixed points; the divergent config's flag and variance."""
    specs = method.canonical_specs()
    fixed = {name: method.fixed_point(specs[name], cfg.rounds, 0.0, cfg.jacobian_step) for name in CONVERGENT_CONFIGS}
    radii = {name: point.radius for name, point in fixed.items()}
    flagged_convergent = [name for name, point in fixed.items() if point.diverged]
    divergent = method.fixed_point(specs["divergent"], cfg.divergent_rounds, 0.0, cfg.jacobian_step)
    trajectory = method.iterate_analytic(specs["divergent"], cfg.divergent_rounds)
    metrics = {f"radius_{name}": r for name, r in radii.items()} | {
        "c1_max_radius_convergent": max(radii.values()),
        "c1_convergent_flagged_count": float(len(flagged_convergent)),
        "c1_divergent_flagged": float(divergent.diverged),
        "c1_divergent_radius": divergent.radius,
        "c1_divergent_final_var": float(np.min(divergent.v)),
    }
    return metrics, {"analytic_divergent_var_model1": trajectory.v[:, 0].tolist()}


def isolated_metrics(cfg: AnalyticConfig) -> tuple[dict[str, float], dict[str, list[float]], list[dict]]:
    """C2 on the K -> infinity recursion: A* increases with beta; A(t) is monotone from round 0.

    The monotonicity is measured on every curating beta of the grid over the whole trajectory from
    the real-data start (round 0), so the transient, where A(t) actually moves, is included: from
    beta = 5 on the trajectory reaches its fixed point in under 20 rounds, so a burn-in would leave
    only exact zeros to check. ``c2_isolated_min_first_step`` shows the size of the first step."""
    rows = []
    steps, first_steps = [], []
    top_trajectory = None
    for beta in cfg.isolated_betas:
        spec = method.isolated_spec("isolated", ISOLATED_C2["real_share"], beta, ISOLATED_C2["target"])
        rows.append({"beta": beta, "analytic_A": float(method.fixed_point(spec, cfg.rounds, TOL).alignment[0])})
        if beta > 0:
            trajectory = method.iterate_analytic(spec, cfg.rounds).alignment[:, 0]
            step = np.diff(trajectory)
            steps.append(float(step.min()))
            first_steps.append(float(step[0]))
            top_trajectory = trajectory
    increments = np.diff([r["analytic_A"] for r in rows])
    metrics = {"c2_isolated_min_increment_analytic": float(increments.min()),
               "c2_isolated_min_step_from_round0": min(steps),
               "c2_isolated_min_first_step": min(first_steps)}
    return metrics, {"analytic_isolated_A": top_trajectory[:200].tolist()}, rows


def analytic_chords(cfg: AnalyticConfig) -> dict[str, np.ndarray]:
    """(A*(beta_1 high) - A*(beta_1 low)) / (high - low) of both models, per canonical coupled config."""
    specs = method.canonical_specs()
    return {name: method.chord_effect(specs[name], 0, *BETA1_RANGE[name], max_rounds=cfg.rounds, tol=0.0)
            for name in COUPLED_CONFIGS}


def influence_heatmap(cfg: AnalyticConfig) -> tuple[dict[str, float], list[dict]]:
    """C5: I_ij over (coupling W_12 = W_21, beta_1) on the cross-invert family (opposite targets).

    Net effect of curating model 1 on collective alignment: I_11 + I_21. Its sign is expected to
    flip from positive (self-influence wins, weak coupling) to negative (cross-influence wins)."""
    rows = []
    for coupling in cfg.coupling_grid:
        for beta1 in cfg.heatmap_betas:
            spec = method.LoopSpec("heatmap", method.symmetric_coupling(HEATMAP_REAL_SHARE, coupling),
                                   np.full(2, HEATMAP_REAL_SHARE), np.array([beta1, HEATMAP_BETA2]), HEATMAP_TARGETS)
            influence = method.influence_matrix(spec, cfg.influence_step, cfg.rounds, TOL)
            rows.append({"coupling": coupling, "beta1": beta1, "I11": float(influence[0, 0]),
                         "I12": float(influence[0, 1]), "I21": float(influence[1, 0]), "I22": float(influence[1, 1]),
                         "net_beta1": float(influence[0, 0] + influence[1, 0])})
    uncoupled = [r for r in rows if r["coupling"] == 0.0]
    coupled = [r for r in rows if r["coupling"] > 0.0]
    weakest, strongest = cfg.coupling_grid[0], cfg.coupling_grid[-1]
    flips = [b for b in cfg.heatmap_betas
             if _net(rows, weakest, b) > 0 > _net(rows, strongest, b)]
    metrics = {
        "c5_cross_influence_uncoupled_max_abs": max(abs(r["I21"]) for r in uncoupled),
        "c5_cross_influence_coupled_max": max(r["I21"] for r in coupled),
        "c5_self_influence_min": min(r["I11"] for r in rows),
        "c5_net_sign_flips": float(bool(flips)),
    }
    return metrics, rows


def _net(rows: list[dict], coupling: float, beta1: float) -> float:
    return next(r["net_beta1"] for r in rows if r["coupling"] == coupling and r["beta1"] == beta1)


# ------------------------------------------------------------------------------------------------
# Sample-based loops (finite K): C1 agreement, C2 isolated, C3/C4 signs over seeds
# ------------------------------------------------------------------------------------------------

def loop_rng(seed: int, *stream: int) -> np.random.Generator:
    """One stream per (seed, experiment, K). The low- and high-beta runs of a pair share it (common
    random numbers), so their difference is not swamped by independent sampling noise."""
    return np.random.default_rng([seed, *stream])


def sampled_coupled(cfg: SampledConfig, analytic: AnalyticConfig, seed: int, real: method.RealData,
                    progress: Progress | None) -> tuple[dict[str, float], dict[str, list[float]], list[dict]]:
    """The three coupled configs at k_small and k_large, beta_1 low and high: chords and fixed points."""
    specs = method.canonical_specs()
    chords = analytic_chords(analytic)
    metrics: dict[str, float] = {}
    curves: dict[str, list[float]] = {}
    rows = []
    rel_errors = []
    k_values = (("ksmall", cfg.k_small), ("klarge", cfg.k_large))
    jobs = [(name, label, k) for name in COUPLED_CONFIGS for label, k in k_values]
    for index, (name, label, k) in enumerate(jobs):
        low, high = BETA1_RANGE[name]
        fixed = {}
        for end, beta1 in (("low", low), ("high", high)):
            spec = spec_with_beta1(specs[name], beta1)
            trajectory = method.iterate_sampled(spec, cfg.rounds, k, cfg.n_samples, real,
                                                loop_rng(seed, 1, COUPLED_CONFIGS.index(name), k))
            fixed[end] = method.stationary_alignment(trajectory, cfg.burn_in)
            if end == "high" and label == "klarge":
                predicted = method.fixed_point(spec, analytic.rounds).alignment
                errors = np.abs(fixed[end] - predicted) / np.abs(predicted)
                rel_errors.append(float(errors.max()))
                metrics[f"{name}_klarge_max_rel_error"] = float(errors.max())
                for i in range(spec.n_models):
                    curves[f"sampled_{name}_A{i + 1}"] = trajectory.alignment[:, i].tolist()
        chord = (fixed["high"] - fixed["low"]) / (high - low)
        for i in range(2):
            metrics[f"{name}_dA{i + 1}_{label}"] = float(chord[i])
            metrics[f"{name}_A{i + 1}_high_{label}"] = float(fixed["high"][i])
            rows.append({"config": name, "model": i + 1, "K": k, "beta1_low": low, "beta1_high": high,
                         "sampled_chord": float(chord[i]), "analytic_chord": float(chords[name][i]),
                         "sign_match": float(np.sign(chord[i]) == np.sign(chords[name][i]))})
        if label == "klarge":
            metrics[f"{name}_dsum_klarge"] = float(chord.sum())
        if progress is not None:
            progress((index + 1) / len(jobs), f"seed {seed}: sampled {name} K={k}")
    metrics["c1_klarge_max_rel_error"] = max(rel_errors)
    metrics["sign_match_fraction"] = float(np.mean([r["sign_match"] for r in rows]))
    metrics |= dampening_metrics(cfg, seed, real, metrics)
    return metrics, curves, rows


def dampening_metrics(cfg: SampledConfig, seed: int, real: method.RealData, coupled: dict[str, float]
                      ) -> dict[str, float]:
    """C3: the curated model's gain from curation, coupled (dampen) over isolated, at k_large."""
    spec = method.canonical_specs()["dampen"]
    low, high = BETA1_RANGE["dampen"]
    isolated = baselines.isolated_counterpart(spec, 0)
    gains = []
    for beta in (low, high):
        trajectory = method.iterate_sampled(isolated.with_beta(np.array([beta])), cfg.rounds, cfg.k_large,
                                            cfg.n_samples, real, loop_rng(seed, 2, cfg.k_large))
        gains.append(float(method.stationary_alignment(trajectory, cfg.burn_in)[0]))
    isolated_gain = gains[1] - gains[0]
    coupled_gain = coupled["dampen_dA1_klarge"] * (high - low)
    return {"dampen_isolated_gain_klarge": isolated_gain, "dampen_coupled_gain_klarge": coupled_gain,
            "c3_dampen_ratio_klarge": coupled_gain / isolated_gain}


def sampled_isolated(cfg: SampledConfig, seed: int, real: method.RealData) -> tuple[dict[str, float], list[dict]]:
    """C2 on the sample-based isolated loop (k_large): A* on the beta grid, common random numbers."""
    rows = []
    for beta in cfg.isolated_betas:
        spec = method.isolated_spec("isolated", ISOLATED_C2["real_share"], beta, ISOLATED_C2["target"])
        trajectory = method.iterate_sampled(spec, cfg.rounds, cfg.k_large, cfg.n_samples, real,
                                            loop_rng(seed, 3, cfg.k_large))
        rows.append({"beta": beta, "sampled_A": float(method.stationary_alignment(trajectory, cfg.burn_in)[0])})
    increments = np.diff([r["sampled_A"] for r in rows])
    return {"c2_isolated_min_increment_sampled": float(increments.min())}, rows


def self_invert_isolated_chord(cfg: SampledConfig, seed: int, real: method.RealData, k: int) -> float:
    """The isolated counterpart of self-invert's model 1 (W = [[.53]], lambda = .47) at K = ``k``:
    the control that the same curation improves the model when it is alone."""
    spec = method.canonical_specs()["self_invert_isolated"]
    low, high = BETA1_RANGE["self_invert"]
    ends = []
    for beta in (low, high):
        trajectory = method.iterate_sampled(spec.with_beta(np.array([beta])), cfg.rounds, k,
                                            cfg.n_samples, real, loop_rng(seed, 4, k))
        ends.append(float(method.stationary_alignment(trajectory, cfg.burn_in)[0]))
    return (ends[1] - ends[0]) / (high - low)


def sampled_divergent(cfg: SampledConfig, seed: int, real: method.RealData) -> tuple[dict[str, float], list[float]]:
    """The divergent config sampled at k_small, ``cfg.divergent_replicates`` independent loops per seed:
    a loop whose variance is below 1e-2 and still falling is flagged. Returns the count of flagged
    loops and of loops (the binomial counts of claim C1d) and the first loop's variance curve.

    The divergent config has lambda = 0, so the loops never read the real data set: the replicates
    of one seed are independent draws of the same experiment."""
    spec = method.canonical_specs()["divergent"]
    flagged_count = 0
    first_v: np.ndarray | None = None
    for replicate in range(cfg.divergent_replicates):
        stream = (seed, 5, cfg.k_small) if replicate == 0 else (seed, 5, cfg.k_small, replicate)
        trajectory = method.iterate_sampled(spec, cfg.rounds, cfg.k_small, cfg.n_samples, real, loop_rng(*stream))
        # The sampled variances are noisy: compare the mean of the last window of rounds with the window
        # before it. The sample loop has no Jacobian, so only the variance criteria of the flag apply.
        window = max(1, min(5, cfg.rounds // 4))
        v_last = trajectory.v[-window:].mean(axis=0)
        v_before = trajectory.v[-2 * window:-window].mean(axis=0)
        flagged_count += int(method.divergence_flag(0.0, v_last, v_before))
        if first_v is None:
            first_v = trajectory.v.min(axis=1)
    return {"c1_divergent_sampled_flagged_count": float(flagged_count),
            "c1_divergent_sampled_runs": float(cfg.divergent_replicates),
            "c1_divergent_sampled_rate": flagged_count / cfg.divergent_replicates,
            "divergent_sampled_final_var": float(first_v[-1])}, first_v.tolist()


def neural_metrics(cfg: NeuralConfig, analytic: AnalyticConfig, seed: int, real: method.RealData,
                   progress: Progress | None) -> tuple[dict[str, float], dict[str, list[float]], list]:
    """Neural generators on the conditional task vs the K -> infinity prediction (the conditional
    recursion with a_i = mu_i e_1 has the 1-D fixed point)."""
    spec = method.canonical_specs()[cfg.coupled_config].with_dim(cfg.dim)
    predicted = method.fixed_point(spec, analytic.rounds).alignment

    def on_round(done: int) -> None:
        if progress is not None:
            progress(done / cfg.rounds, f"seed {seed}: neural refit round {done}/{cfg.rounds}")

    history, models = method.iterate_neural(spec, cfg.rounds, cfg.k, cfg.n_samples, real, loop_rng(seed, 6),
                                            cfg.hidden, cfg.steps_per_round, cfg.lr, seed, progress=on_round)
    fixed = history[cfg.burn_in + 1:].mean(axis=0)
    errors = np.abs(fixed - predicted) / np.abs(predicted)
    metrics = {"c1_neural_max_rel_error": float(errors.max())} | {
        f"neural_A{i + 1}": float(fixed[i]) for i in range(spec.n_models)}
    curves = {f"neural_A{i + 1}": history[:, i].tolist() for i in range(spec.n_models)}
    return metrics, curves, models


def save_neural_models(models: list, directory: Path) -> Path:
    """The neural generators' weights (one safetensors file, atomic): ``nets.<i>.*`` and ``log_vars.<i>``."""
    import torch

    holder = torch.nn.Module()
    holder.nets = torch.nn.ModuleList([model.net for model in models])
    holder.log_vars = torch.nn.ParameterList([model.log_var for model in models])
    return save_state_dict(holder, Path(directory) / "neural_generators.safetensors")


# ------------------------------------------------------------------------------------------------
# One seed, end to end
# ------------------------------------------------------------------------------------------------

def analytic_reference_metrics(cfg: AnalyticConfig) -> dict[str, float]:
    """The brief's canonical reference values (A at the fixed point), logged for the report."""
    specs = method.canonical_specs()
    metrics = {}
    for name in ("isolated", "dampen", "cross_invert", "self_invert", "self_invert_isolated"):
        fixed = method.fixed_point(specs[name], cfg.rounds)
        for i, value in enumerate(fixed.alignment):
            metrics[f"analytic_{name}_A{i + 1}"] = float(value)
    for name, chord in analytic_chords(cfg).items():
        for i, value in enumerate(chord):
            metrics[f"analytic_{name}_dA{i + 1}"] = float(value)
    return metrics


def run_seed(config: MultiModelCurationConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress | None = None) -> SeedResult:
    """Every measurement of one seed. Reads the real data sets first, so a stale data folder fails
    before any compute; the analytic parts do not depend on the seed."""
    real_1d, real_conditional = load_real_data(config, seed, Path(data_dir))
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    metrics, curves = convergence_metrics(config.analytic)
    iso_metrics, iso_curves, iso_rows = isolated_metrics(config.analytic)
    heat_metrics, heat_rows = influence_heatmap(config.analytic)
    metrics |= iso_metrics | heat_metrics | analytic_reference_metrics(config.analytic)
    curves |= iso_curves
    tables: dict[str, Any] = {"influence_heatmap": heat_rows, "isolated_beta_grid": iso_rows}
    lap("analytic")
    if config.sampled is not None:
        sampled, sampled_curves, sign_rows = sampled_coupled(config.sampled, config.analytic, seed, real_1d, progress)
        metrics |= sampled
        curves |= sampled_curves
        tables["sign_table"] = sign_rows
        iso_sampled, iso_sampled_rows = sampled_isolated(config.sampled, seed, real_1d)
        metrics |= iso_sampled
        tables["isolated_beta_grid_sampled"] = iso_sampled_rows
        for label, k in (("ksmall", config.sampled.k_small), ("klarge", config.sampled.k_large)):
            metrics[f"self_invert_isolated_dA_{label}"] = self_invert_isolated_chord(config.sampled, seed, real_1d, k)
        divergent, divergent_var = sampled_divergent(config.sampled, seed, real_1d)
        metrics |= divergent
        curves["sampled_divergent_min_var"] = divergent_var
        lap("sampled")
    if config.neural is not None:
        neural, neural_curves, models = neural_metrics(config.neural, config.analytic, seed, real_conditional,
                                                       progress)
        metrics |= neural
        curves |= neural_curves
        save_neural_models(models, Path(model_dir) / f"seed{seed}")
        lap("neural")
    if config.hub is not None:
        from tasks.multi_model_curation import hub_loop

        hub_metrics, hub_curves = hub_loop.run_hub_loop(config.hub, seed, device, Path(model_dir) / f"seed{seed}",
                                                        progress)
        metrics |= hub_metrics
        curves |= hub_curves
        lap("hub")
    metrics |= {f"seconds_{name}": value for name, value in timings.items()}
    return {"seed": seed, "metrics": metrics, "curves": curves, "tables": tables}


# ------------------------------------------------------------------------------------------------
# Data phase
# ------------------------------------------------------------------------------------------------

def load_real_data(config: MultiModelCurationConfig, seed: int, data_dir: Path
                   ) -> tuple[method.RealData | None, method.RealData | None]:
    real_1d = real_conditional = None
    if config.sampled is not None:
        real_1d = data.read_unconditional(data.unconditional_path(data_dir, seed), config.sampled.real_pool,
                                          "sampled.real_pool")
    if config.neural is not None:
        real_conditional = data.read_conditional(data.conditional_path(data_dir, seed), config.neural.real_pool,
                                                 config.neural.dim, "neural.real_pool/neural.dim")
    return real_1d, real_conditional


def write_data(config: MultiModelCurationConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase: the finite real data sets per seed (parquet). The paper profile's prompts and
    human responses are read from the hub inside the run (``hub_loop``), as are its models."""
    data_dir = Path(data_dir)
    written = []
    for seed in seeds:
        if config.sampled is not None:
            written.append(write_parquet(data.unconditional_frame(config.sampled.real_pool, seed),
                                              data.unconditional_path(data_dir, seed)))
        if config.neural is not None:
            written.append(write_parquet(data.conditional_frame(config.neural.real_pool, config.neural.dim, seed),
                                              data.conditional_path(data_dir, seed)))
    return written
