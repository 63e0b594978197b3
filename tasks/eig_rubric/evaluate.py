"""Evaluation step of eig_rubric: R re-judgings of every evaluation item by every judge with the rubrics frozen in
train.py; measures alignment with the human score (Spearman, mean over re-judgings) and test-retest consistency
(Krippendorff's alpha, ordinal and interval, and ICC(1,1) over the R re-judgings). Derives no claim numbers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.eig_rubric import baselines, method, simulator
from tasks.eig_rubric.config import EigRubricConfig
from tasks.eig_rubric.data import REJUDGING_STREAM, World, load_world
from tasks.eig_rubric.train import load_rubrics

# Judges of the decisive comparison at k (the CoT judge and the full pool do not depend on k).
JUDGES = ("eig", "random", "control", "fixed", "cot", "full_pool")
SWEPT_JUDGES = ("eig", "random", "fixed")


def consistency_and_alignment(ratings: np.ndarray, human_levels: np.ndarray) -> dict[str, float]:
    """Spearman with the human levels (mean over the R re-judgings) and test-retest alpha / ICC of (n, R) ratings."""
    return {"spearman": float(np.mean([method.spearman(ratings[:, r], human_levels)
                                       for r in range(ratings.shape[1])])),
            "alpha_ordinal": method.krippendorff_alpha(ratings, "ordinal"),
            "alpha_interval": method.krippendorff_alpha(ratings, "interval"),
            "icc": method.icc_oneway(ratings)}


def mean_over_draws(rubrics: list[np.ndarray], score: Callable[[np.ndarray], np.ndarray],
                    human_levels: np.ndarray) -> dict[str, float]:
    per_draw = [consistency_and_alignment(score(idx), human_levels) for idx in rubrics]
    return {name: float(np.mean([d[name] for d in per_draw])) for name in per_draw[0]}


@dataclass(frozen=True)
class Rejudgings:
    """The R judging passes over the evaluation items: answers to the whole pool (n, Q) and to the fixed
    questionnaire (n, k_sweep_max) per pass, and the CoT judge's scores (n, R)."""

    pool_answers: list[np.ndarray]
    fixed_answers: list[np.ndarray]
    cot: np.ndarray

    def naive_bayes(self, indices: np.ndarray, theta: np.ndarray, prior: np.ndarray) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        return np.stack([method.posterior_mean_score(a[:, idx], theta[idx], prior) for a in self.pool_answers],
                        axis=1)

    def fixed(self, k: int) -> np.ndarray:
        return np.stack([baselines.count_score(a[:, :k]) for a in self.fixed_answers], axis=1)


def simulated_rejudgings(cfg: EigRubricConfig, world: World, seed: int) -> Rejudgings:
    """R passes of the simulated evaluator with fresh answer noise and fresh CoT drift each time."""
    judge = cfg.judge
    z = world.z[world.n_calibration:]
    fixed_pool = baselines.fixed_questionnaire(judge.k_sweep_max, z.shape[1], judge.fixed_noise_sd)
    pool_answers, fixed_answers, cot = [], [], []
    for r in range(judge.n_rejudgings):
        rng = np.random.default_rng([seed, REJUDGING_STREAM, r])
        pool_answers.append(simulator.answer(z, world.pool, rng))
        fixed_answers.append(simulator.answer(z, fixed_pool, rng))
        cot.append(baselines.cot_drift_scores(z, world.weights, cfg.world.n_levels, judge, rng))
    return Rejudgings(pool_answers, fixed_answers, np.stack(cot, axis=1).astype(np.float64))


def measure(cfg: EigRubricConfig, seed: int, passes: Rejudgings, rubrics: dict, human: np.ndarray,
            result: SeedResult, progress: Progress = no_progress) -> SeedResult:
    """Every judge's alignment and consistency at k, and the k sweep; shared by the simulated and the LLM
    evaluator (hub.py)."""
    theta, prior, k = rubrics["theta"], rubrics["prior"], cfg.judge.k

    def naive_bayes(idx: np.ndarray) -> np.ndarray:
        return passes.naive_bayes(idx, theta, prior)

    with result.stage("measure"):
        main = {
            "eig": consistency_and_alignment(naive_bayes(np.asarray(rubrics["eig_indices"][:k])), human),
            "random": mean_over_draws(list(rubrics["random_indices"][:, :k]), naive_bayes, human),
            "control": mean_over_draws([np.asarray(c) for c in rubrics["control_indices"]], naive_bayes, human),
            "fixed": consistency_and_alignment(passes.fixed(k), human),
            "cot": consistency_and_alignment(passes.cot, human),
            "full_pool": consistency_and_alignment(naive_bayes(np.arange(theta.shape[0])), human)}
    with result.stage("sweep"):
        sweep = []
        for kk in range(1, cfg.judge.k_sweep_max + 1):
            measured = {"eig": consistency_and_alignment(naive_bayes(np.asarray(rubrics["eig_indices"][:kk])), human),
                        "random": mean_over_draws(list(rubrics["random_indices"][:, :kk]), naive_bayes, human),
                        "fixed": consistency_and_alignment(passes.fixed(kk), human)}
            sweep += [{"k": kk, "judge": name, **values} for name, values in measured.items()]
    metrics = {f"{name}_{judge}": value for judge, values in main.items() for name, value in values.items()}
    progress(1.0, f"Spearman EIG {main['eig']['spearman']:.3f} random {main['random']['spearman']:.3f} "
                  f"fixed {main['fixed']['spearman']:.3f} CoT {main['cot']['spearman']:.3f}")
    return result.add(metrics, n_evaluation_items=float(human.shape[0]), tables={"k_sweep": sweep})


def evaluate(cfg: EigRubricConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    if cfg.world is None:
        from tasks.eig_rubric import hub

        return hub.evaluate(cfg, seed, Path(data_dir), Path(model_dir), device, progress)
    result = SeedResult(seed)
    world = load_world(data_dir, seed)
    with result.stage("judge"):
        passes = simulated_rejudgings(cfg, world, seed)
    return measure(cfg, seed, passes, load_rubrics(model_dir), world.levels[world.n_calibration:], result, progress)
