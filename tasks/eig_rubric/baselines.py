"""Baselines of the decisive comparison **[reconstructed]**: the drifting chain-of-thought judge, the fixed generic
questionnaire, random-k rubrics under the same naive-Bayes scorer, and two label-informed rankings that ignore the
conditioning of greedy EIG (top-k by marginal EIG, top-k by calibration correlation). ``shuffled_likelihood_selection``
is kept to pin down, in a unit test, why it is no negative control: it draws a uniform random k-subset."""

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
    """Greedy EIG selection run on likelihood rows permuted across questions (position i holds row perm[i]).
    It returns the positions P of the greedy set T, i.e. P = perm^{-1}(T): for a uniform permutation that is a
    uniform random k-subset whatever theta is, so it has random-k's distribution by construction and cannot serve
    as a negative control of EIG-vs-random (claim C4n, an identity). Not used by the pipeline."""
    permutation = rng.permutation(theta.shape[0])
    return method.greedy_eig_selection(theta[permutation], prior, k).indices


def marginal_eig_top_k(theta: np.ndarray, prior: np.ndarray, k: int) -> tuple[int, ...]:
    """The k questions of largest marginal EIG I(S; A_j) (ties to the lowest index): greedy EIG without the
    conditioning on the questions already chosen, so it keeps near-duplicates."""
    gains = np.array([method.expected_information_gain(row, np.empty((0, theta.shape[1])), prior) for row in theta])
    return tuple(int(j) for j in np.argsort(-gains, kind="stable")[:k])


def correlation_top_k(answers: np.ndarray, levels: np.ndarray, k: int) -> tuple[int, ...]:
    """The k questions whose calibration answers have the largest |Spearman| with the human level (a question
    answered identically on every item counts 0; ties to the lowest index)."""
    answers = np.asarray(answers)
    strength = np.array([abs(method.spearman(answers[:, j], levels)) if np.ptp(answers[:, j]) > 0 else 0.0
                         for j in range(answers.shape[1])])
    return tuple(int(j) for j in np.argsort(-strength, kind="stable")[:k])
