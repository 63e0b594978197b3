"""'Training' of eig_rubric: nothing is learned by gradient. The step fits the question likelihoods on the labelled
calibration items (variant A) and freezes every rubric before any evaluation item is judged: the greedy EIG
sequence, random-k rubrics and the shuffled-likelihood control selections. Written to ``rubrics.json``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.io import read_json, write_json
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.eig_rubric import baselines, method, simulator
from tasks.eig_rubric.config import EigRubricConfig, JudgeConfig
from tasks.eig_rubric.data import CALIBRATION_STREAM, load_world

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
    with result.stage("select"):
        rubrics = freeze_rubrics(theta, prior, judge, rng)
    write_json(Path(model_dir) / RUBRICS, rubrics)
    eig = rubrics["eig_indices"]
    progress(1.0, f"EIG rubric {eig[: judge.k]}, stopped at {rubrics['eig_stopped_length']} questions")
    relevant = set(np.flatnonzero(world.weights > 0).tolist())
    return result.add(eig_stopped_length=rubrics["eig_stopped_length"],
                      eig_relevant_fraction=float(np.mean([world.pool.dims[j] in relevant for j in eig[: judge.k]])),
                      curves={"eig_gain_by_step": rubrics["eig_gains"]})


def freeze_rubrics(theta: np.ndarray, prior: np.ndarray, judge: JudgeConfig, rng: np.random.Generator) -> dict:
    """Every rubric of the comparison, fixed before evaluation: the greedy EIG sequence (epsilon = 0, so its
    prefixes are the EIG rubrics of every k at equal k), the length at which the epsilon rule stops, random-k
    rubrics and the shuffled-likelihood control selections (JSON-ready)."""
    eig = method.greedy_eig_selection(theta, prior, judge.k_sweep_max, epsilon=0.0)
    stopped = method.greedy_eig_selection(theta, prior, judge.k_sweep_max, epsilon=judge.epsilon)
    random = baselines.random_rubrics(theta.shape[0], judge.k_sweep_max, judge.n_random_draws, rng)
    control = [baselines.shuffled_likelihood_selection(theta, prior, judge.k, rng)
               for _ in range(judge.n_control_draws)]
    return {"theta": theta.tolist(), "prior": prior.tolist(), "eig_indices": list(eig.indices),
            "eig_gains": list(eig.gains), "eig_stopped_length": len(stopped.indices),
            "random_indices": random.tolist(), "control_indices": [list(c) for c in control]}


def load_rubrics(model_dir: Path) -> dict:
    data = read_json(Path(model_dir) / RUBRICS)
    data["theta"] = np.asarray(data["theta"], dtype=np.float64)
    data["prior"] = np.asarray(data["prior"], dtype=np.float64)
    data["random_indices"] = np.asarray(data["random_indices"], dtype=np.int64)
    return data
