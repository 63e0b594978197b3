"""Evaluation step of eig_rubric: R re-judgings of every evaluation item by every judge with the rubrics frozen in
train.py; measures alignment with the human score (Spearman, mean over re-judgings) and test-retest consistency
(Krippendorff's alpha, ordinal and interval, and ICC(1,1) over the R re-judgings). In the simulated world it also
judges with the CoT judge at a grid of drift settings (the sweep that shows where C1 and C3b flip; the setting
with every relevant dimension and no irrelevant weight is the drift-free CoT control). Derives no claim numbers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.eig_rubric import baselines, method, simulator
from tasks.eig_rubric.config import EigRubricConfig
from tasks.eig_rubric.data import COT_SWEEP_STREAM, REJUDGING_STREAM, World, load_world
from tasks.eig_rubric.train import load_rubrics

# Judges of the decisive comparison at k (the CoT judges and the whole pool do not depend on k); a judge whose inputs
# a profile lacks (the relevant-only pool and the CoT drift grid exist only in the simulated world) is skipped.
JUDGES = ("eig", "random", "marginal", "correlation", "fixed", "fixed_nb", "cot", "cot_nodrift", "full_pool",
          "eig_relevant_pool", "random_relevant_pool", "full_relevant_pool")
SWEPT_JUDGES = ("eig", "random", "fixed", "fixed_nb")
# The CoT drift grid: irrelevant weights crossed with 1..n_relevant attended relevant dimensions.
COT_SWEEP_IRRELEVANT_WEIGHTS = (0.0, 0.25, 0.5, 1.0)


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
    questionnaire (n, k_sweep_max) per pass, the CoT judge's scores (n, R), and (simulated world only) the CoT
    judge's scores (n, R) at each (relevant dimensions attended, irrelevant weight) setting of the drift grid."""

    pool_answers: list[np.ndarray]
    fixed_answers: list[np.ndarray]
    cot: np.ndarray
    cot_sweep: dict[tuple[int, float], np.ndarray] = field(default_factory=dict)

    def naive_bayes(self, indices: np.ndarray, theta: np.ndarray, prior: np.ndarray) -> np.ndarray:
        idx = np.asarray(indices, dtype=np.int64)
        return np.stack([method.posterior_mean_score(a[:, idx], theta[idx], prior) for a in self.pool_answers],
                        axis=1)

    def fixed(self, k: int) -> np.ndarray:
        return np.stack([baselines.count_score(a[:, :k]) for a in self.fixed_answers], axis=1)

    def fixed_naive_bayes(self, k: int, theta_fixed: np.ndarray, prior: np.ndarray) -> np.ndarray:
        """The fixed questionnaire's first k questions scored like every rubric: E[s | a] under naive Bayes with
        their own likelihoods fitted on the calibration items."""
        return np.stack([method.posterior_mean_score(a[:, :k], theta_fixed[:k], prior) for a in self.fixed_answers],
                        axis=1)


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
    return Rejudgings(pool_answers, fixed_answers, np.stack(cot, axis=1).astype(np.float64),
                      cot_drift_grid(cfg, world, seed))


def cot_drift_grid(cfg: EigRubricConfig, world: World, seed: int) -> dict[tuple[int, float], np.ndarray]:
    """The CoT judge's R passes at every (relevant dimensions attended, irrelevant weight) setting, same noise and
    quantisation as the decisive CoT judge, from a stream of its own (the decisive passes are unchanged)."""
    z = world.z[world.n_calibration:]
    grid = {}
    for picked in range(1, cfg.world.n_relevant + 1):
        for w_index, weight in enumerate(COT_SWEEP_IRRELEVANT_WEIGHTS):
            judge = cfg.judge.model_copy(update={"cot_relevant_picked": picked, "cot_irrelevant_weight": weight})
            passes = [baselines.cot_drift_scores(z, world.weights, cfg.world.n_levels, judge,
                                                 np.random.default_rng([seed, COT_SWEEP_STREAM, picked, w_index, r]))
                      for r in range(judge.n_rejudgings)]
            grid[(picked, weight)] = np.stack(passes, axis=1).astype(np.float64)
    return grid


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
            "marginal": consistency_and_alignment(naive_bayes(np.asarray(rubrics["marginal_indices"])), human),
            "correlation": consistency_and_alignment(naive_bayes(np.asarray(rubrics["correlation_indices"])), human),
            "fixed": consistency_and_alignment(passes.fixed(k), human),
            "fixed_nb": consistency_and_alignment(passes.fixed_naive_bayes(k, rubrics["theta_fixed"], prior), human),
            "cot": consistency_and_alignment(passes.cot, human),
            "full_pool": consistency_and_alignment(naive_bayes(np.arange(theta.shape[0])), human)}
        if "relevant_pool" in rubrics:
            main["eig_relevant_pool"] = consistency_and_alignment(
                naive_bayes(np.asarray(rubrics["eig_relevant_pool_indices"])), human)
            main["random_relevant_pool"] = mean_over_draws(list(rubrics["random_relevant_pool_indices"]),
                                                           naive_bayes, human)
            main["full_relevant_pool"] = consistency_and_alignment(
                naive_bayes(np.asarray(rubrics["relevant_pool"])), human)
        cot_sweep = [{"cot_relevant_picked": picked, "cot_irrelevant_weight": weight,
                      **consistency_and_alignment(ratings, human)}
                     for (picked, weight), ratings in passes.cot_sweep.items()]
        drift_free = [row for row in cot_sweep
                      if row["cot_irrelevant_weight"] == 0.0 and row["cot_relevant_picked"] == max(
                          r["cot_relevant_picked"] for r in cot_sweep)]
        if drift_free:
            main["cot_nodrift"] = {name: drift_free[0][name] for name in main["cot"]}
    with result.stage("sweep"):
        sweep = []
        for kk in range(1, cfg.judge.k_sweep_max + 1):
            measured = {"eig": consistency_and_alignment(naive_bayes(np.asarray(rubrics["eig_indices"][:kk])), human),
                        "random": mean_over_draws(list(rubrics["random_indices"][:, :kk]), naive_bayes, human),
                        "fixed": consistency_and_alignment(passes.fixed(kk), human),
                        "fixed_nb": consistency_and_alignment(
                            passes.fixed_naive_bayes(kk, rubrics["theta_fixed"], prior), human)}
            sweep += [{"k": kk, "judge": name, **values} for name, values in measured.items()]
    metrics = {f"{name}_{judge}": value for judge, values in main.items() for name, value in values.items()}
    progress(1.0, f"Spearman EIG {main['eig']['spearman']:.3f} random {main['random']['spearman']:.3f} "
                  f"fixed {main['fixed']['spearman']:.3f} CoT {main['cot']['spearman']:.3f}")
    tables = {"k_sweep": sweep, **({"cot_sweep": cot_sweep} if cot_sweep else {})}
    return result.add(metrics, n_evaluation_items=float(human.shape[0]), tables=tables)


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
