"""'Training' of eig_rubric: nothing is learned by gradient. The step fits the question likelihoods on the labelled
calibration items (variant A) and freezes every rubric before any evaluation item is judged: the greedy EIG
sequence, random-k rubrics, the top-k by marginal EIG and by calibration correlation, the fixed questionnaire's own
naive-Bayes likelihoods, and (simulated world) EIG-k / random-k within the relevant-dimension questions. Written to
``rubrics.json``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.io import read_json, write_json
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.eig_rubric import baselines, method, simulator
from tasks.eig_rubric.config import EigRubricConfig, JudgeConfig
from tasks.eig_rubric.data import CALIBRATION_STREAM, FIXED_CALIBRATION_STREAM, RELEVANT_POOL_STREAM, World, load_world

RUBRICS = "rubrics.json"


def train(cfg: EigRubricConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    if cfg.world is None:
        from tasks.eig_rubric import hub

        return hub.train(cfg, seed, Path(data_dir), Path(model_dir), device, progress)
    result = SeedResult(seed)
    world = load_world(data_dir, seed)
    judge = cfg.judge
    n_levels = cfg.world.n_levels
    with result.stage("calibrate"):
        rng = np.random.default_rng([seed, CALIBRATION_STREAM])
        answers = simulator.answer(world.z[: world.n_calibration], world.pool, rng)
        levels = world.levels[: world.n_calibration]
        theta = method.laplace_likelihoods(answers, levels, n_levels)
        prior = method.level_prior(levels, n_levels)
        fixed_pool = baselines.fixed_questionnaire(judge.k_sweep_max, cfg.world.n_dims, judge.fixed_noise_sd)
        fixed_answers = simulator.answer(world.z[: world.n_calibration], fixed_pool,
                                         np.random.default_rng([seed, FIXED_CALIBRATION_STREAM]))
        theta_fixed = method.laplace_likelihoods(fixed_answers, levels, n_levels)
    with result.stage("select"):
        rubrics = freeze_rubrics(theta, prior, judge, rng, answers, levels, theta_fixed)
        rubrics.update(relevant_pool_rubrics(world, theta, prior, judge,
                                             np.random.default_rng([seed, RELEVANT_POOL_STREAM])))
    write_json(Path(model_dir) / RUBRICS, rubrics)
    eig = rubrics["eig_indices"]
    progress(1.0, f"EIG rubric {eig[: judge.k]}, stopped at {rubrics['eig_stopped_length']} questions")
    relevant = set(np.flatnonzero(world.weights > 0).tolist())
    return result.add(eig_stopped_length=rubrics["eig_stopped_length"],
                      eig_last_gain=rubrics["eig_gains"][-1],
                      eig_relevant_fraction=float(np.mean([world.pool.dims[j] in relevant for j in eig[: judge.k]])),
                      curves={"eig_gain_by_step": rubrics["eig_gains"]})


def freeze_rubrics(theta: np.ndarray, prior: np.ndarray, judge: JudgeConfig, rng: np.random.Generator,
                   calibration_answers: np.ndarray, calibration_levels: np.ndarray, theta_fixed: np.ndarray) -> dict:
    """Every rubric of the comparison, fixed before evaluation (JSON-ready): the greedy EIG sequence (epsilon = 0,
    so its prefixes are the EIG rubrics of every k at equal k), the length at which the epsilon rule stops, random-k
    rubrics, the top-k by marginal EIG and by calibration |Spearman| (label-informed rankings without the
    conditioning), and the fixed questionnaire's likelihoods fitted on the same calibration items."""
    eig = method.greedy_eig_selection(theta, prior, judge.k_sweep_max, epsilon=0.0)
    stopped = method.greedy_eig_selection(theta, prior, judge.k_sweep_max, epsilon=judge.epsilon)
    random = baselines.random_rubrics(theta.shape[0], judge.k_sweep_max, judge.n_random_draws, rng)
    return {"theta": theta.tolist(), "prior": prior.tolist(), "eig_indices": list(eig.indices),
            "eig_gains": list(eig.gains), "eig_stopped_length": len(stopped.indices),
            "random_indices": random.tolist(),
            "marginal_indices": list(baselines.marginal_eig_top_k(theta, prior, judge.k)),
            "correlation_indices": list(baselines.correlation_top_k(calibration_answers, calibration_levels,
                                                                    judge.k)),
            "theta_fixed": np.asarray(theta_fixed).tolist()}


def relevant_pool_rubrics(world: World, theta: np.ndarray, prior: np.ndarray, judge: JudgeConfig,
                          rng: np.random.Generator) -> dict:
    """EIG-k and random-k drawn from the questions on relevant dimensions only (indices into the whole pool): the
    regime where random-k wastes no question on an irrelevant dimension, so EIG's gain over it could vanish."""
    relevant = np.flatnonzero(world.weights[world.pool.dims] > 0)
    eig = method.greedy_eig_selection(theta[relevant], prior, judge.k).indices
    random = baselines.random_rubrics(relevant.shape[0], judge.k, judge.n_random_draws, rng)
    return {"relevant_pool": relevant.tolist(), "eig_relevant_pool_indices": relevant[list(eig)].tolist(),
            "random_relevant_pool_indices": relevant[random].tolist()}


def load_rubrics(model_dir: Path) -> dict:
    data = read_json(Path(model_dir) / RUBRICS)
    data["theta"] = np.asarray(data["theta"], dtype=np.float64)
    data["prior"] = np.asarray(data["prior"], dtype=np.float64)
    for key in ("random_indices", "random_relevant_pool_indices"):
        if key in data:
            data[key] = np.asarray(data[key], dtype=np.int64)
    if "theta_fixed" in data:
        data["theta_fixed"] = np.asarray(data["theta_fixed"], dtype=np.float64)
    return data
