"""Baselines of the decisive comparison **[reconstructed]**: the drifting chain-of-thought judge, the fixed generic
questionnaire, random-k rubrics under the same naive-Bayes scorer, and EIG selection on shuffled likelihoods (the
negative control of the EIG-vs-random comparison)."""

from __future__ import annotations

import numpy as np

from tasks.eig_rubric import method
from tasks.eig_rubric.config import JudgeConfig
from tasks.eig_rubric.simulator import QuestionPool, quantile_levels


def cot_drift_weights(weights: np.ndarray, n_items: int, judge: JudgeConfig, rng: np.random.Generator) -> np.ndarray:
    """The implicit criteria of one free-form (CoT) judging per item, (n_items, D): the human weights on
    ``cot_relevant_picked`` random relevant dimensions (rescaled to unit norm) plus ``cot_irrelevant_weight`` times
    a Dirichlet(1) split over the irrelevant dimensions. Drawn afresh at every judging: this is the drift."""
    relevant = np.flatnonzero(weights > 0)
    irrelevant = np.flatnonzero(weights == 0)
    keep = np.argsort(rng.random((n_items, relevant.shape[0])), axis=1)[:, : judge.cot_relevant_picked]
    run_weights = np.zeros((n_items, weights.shape[0]))
    rows = np.arange(n_items)[:, None]
    run_weights[rows, relevant[keep]] = weights[relevant[keep]]
    run_weights /= np.linalg.norm(run_weights, axis=1, keepdims=True)
    if irrelevant.size:
        run_weights[:, irrelevant] = judge.cot_irrelevant_weight * rng.dirichlet(np.ones(irrelevant.size),
                                                                                 size=n_items)
    return run_weights


def cot_drift_scores(z: np.ndarray, weights: np.ndarray, n_levels: int, judge: JudgeConfig,
                     rng: np.random.Generator) -> np.ndarray:
    """One judging pass of the CoT judge: the K-level quantile bin of w_run . z + N(0, cot_noise_sd^2), with w_run
    from ``cot_drift_weights``."""
    run_weights = cot_drift_weights(weights, z.shape[0], judge, rng)
    raw = np.sum(run_weights * z, axis=1) + judge.cot_noise_sd * rng.standard_normal(z.shape[0])
    return quantile_levels(raw, n_levels)


def fixed_questionnaire(k: int, n_dims: int, noise_sd: float) -> QuestionPool:
    """k generic questions, one per dimension in index order (i mod D), threshold 0: written without knowing which
    dimensions the task's human score weighs."""
    dims = np.arange(k) % n_dims
    return QuestionPool(dims, np.zeros(k), np.full(k, noise_sd))


def count_score(answers: np.ndarray) -> np.ndarray:
    """The fixed questionnaire's score: the number of yes answers."""
    return np.asarray(answers).sum(axis=1).astype(np.float64)


def random_rubrics(n_questions: int, k: int, n_draws: int, rng: np.random.Generator) -> np.ndarray:
    """(n_draws, k) question indices: the first k of a random permutation per draw (so prefixes are random-k')."""
    return np.stack([rng.permutation(n_questions)[:k] for _ in range(n_draws)])


def shuffled_likelihood_selection(theta: np.ndarray, prior: np.ndarray, k: int, rng: np.random.Generator
                                  ) -> tuple[int, ...]:
    """Greedy EIG selection run on likelihood rows permuted across questions: question i is chosen for the
    informativeness of another question's row. Scoring still uses each chosen question's own fitted row, so any
    gain over random-k here would come from the pipeline, not from EIG."""
    permutation = rng.permutation(theta.shape[0])
    return method.greedy_eig_selection(theta[permutation], prior, k).indices
