"""eig_rubric config, simulator, baselines, the train / evaluate / claim_metrics steps at the smoke profile, figures,
the LLM rubric library and the paper profile (data loader and both steps) on local stand-ins: a tiny GPT-2 for
scoring and a local dataset folder (no network). Profiles validating and bad values naming their key are checked
for every paper in tests/unit/test_paper_contracts.py."""

from __future__ import annotations

import itertools
import math

import numpy as np
import polars as pl
import pytest
from pydantic import ValidationError
from scipy.stats import norm

from tasks.common.llm_policy import LLMPolicy, OpenAIServerPolicy, TransformersPolicy
from tasks.common.llm_server import build_tiny_local_model, torch_threads
from tasks.common.params import params_section, validate_paper_section
from tasks.eig_rubric import (
    baselines,
    claim_metrics,
    data,
    evaluate,
    figures,
    hub,
    llm_rubric,
    method,
    simulator,
    train,
)
from tasks.eig_rubric.config import CONFIG

SLUG = "eig_rubric"


def smoke_config():
    return CONFIG.model_validate(params_section(SLUG)["smoke"])


# --- config -------------------------------------------------------------------------------------------


def test_paper_profile_uses_the_hub_and_the_others_the_simulator():
    configs = validate_paper_section(SLUG, params_section(SLUG))
    assert configs["paper"].hub is not None and configs["paper"].world is None
    assert all(configs[p].world is not None and configs[p].hub is None for p in ("smoke", "cpu"))


@pytest.mark.parametrize(("path", "value", "message"), [
    (("world", "n_relevant"), 8, "n_relevant .* must be < n_dims"),
    (("world", "n_calibration"), 590, "must leave >= 20 evaluation items"),
    (("world", "noise_levels"), [0.5, 0.0], "noise_levels must be > 0"),
    (("judge", "k"), 11, "k .* must be <= k_sweep_max"),
    (("judge", "cot_relevant_picked"), 5, "cot_relevant_picked .* must be <= world.n_relevant"),
    (("judge", "k"), 0, "greater than or equal to 1"),
])
def test_config_validators_give_clear_errors(path, value, message):
    raw = params_section(SLUG)["cpu"]
    raw[path[0]][path[1]] = value
    with pytest.raises(ValidationError, match=message):
        CONFIG.model_validate(raw)


def test_hub_calibration_must_leave_evaluation_items():
    raw = params_section(SLUG)["paper"]
    raw["hub"]["n_calibration"] = raw["hub"]["n_items"] - 10
    with pytest.raises(ValidationError, match="must leave >= 20 evaluation items"):
        CONFIG.model_validate(raw)


def test_world_and_hub_are_exclusive():
    section = params_section(SLUG)
    both = {**section["cpu"], "hub": section["paper"]["hub"]}
    with pytest.raises(ValidationError, match="exactly one of 'world'"):
        CONFIG.model_validate(both)
    neither = {k: v for k, v in section["cpu"].items() if k != "world"}
    with pytest.raises(ValidationError, match="exactly one of 'world'"):
        CONFIG.model_validate(neither)


# --- simulator and baselines -------------------------------------------------------------------------


def test_quantile_levels_exact():
    raw = np.array([0.3, -1.0, 2.0, 0.5, 0.0, 1.0])
    # ranks 2, 0, 5, 3, 1, 4 -> floor(rank * 3 / 6)
    np.testing.assert_array_equal(simulator.quantile_levels(raw, 3), [1, 0, 2, 1, 0, 2])


def calibration_levels_check(levels_of) -> None:
    # Calibration raw (items 0-3) = 4, 1, 3, 2: the 1/2-quantile is 2.5, so levels 1, 0, 1, 0; the evaluation
    # items 100, -100, 0 are binned by that cut-point and do not move it (the median of all seven items is 2,
    # which would put item 3 at level 1).
    raw = np.array([4.0, 1.0, 3.0, 2.0, 100.0, -100.0, 0.0])
    np.testing.assert_array_equal(levels_of(raw, 4, 2), [1, 0, 1, 0, 1, 0, 0])
    # Three levels from 6 calibration values 0..5: cut-points at the 1/3 and 2/3 quantiles, 5/3 and 10/3.
    raw = np.array([5.0, 0.0, 4.0, 1.0, 3.0, 2.0, 1.7, 3.4, -7.0])
    np.testing.assert_array_equal(levels_of(raw, 6, 3), [2, 0, 2, 0, 1, 1, 1, 2, 0])


def test_calibrated_levels_exact():
    calibration_levels_check(simulator.calibrated_levels)


def test_negative_control_levels_cut_on_all_items_are_caught():
    def cut_on_all_items(raw, n_calibration, n_levels):
        return simulator.calibrated_levels(raw, raw.shape[0], n_levels)
    with pytest.raises(AssertionError):
        calibration_levels_check(cut_on_all_items)


def test_answers_follow_the_threshold_rule():
    pool = simulator.QuestionPool(np.array([0, 1, 0]), np.array([0.0, 0.0, 1.0]), np.array([1e-9, 1e-9, 1e-9]))
    z = np.array([[0.5, -0.2], [1.5, 0.1]])
    np.testing.assert_array_equal(simulator.answer(z, pool, np.random.default_rng(0)), [[1, 0, 0], [1, 1, 1]])
    # With noise sigma the yes rate is Phi((z - tau) / sigma): Phi(0.3 / 0.5) = 0.7257 for z = 0.3, tau = 0.
    noisy = simulator.QuestionPool(np.array([0]), np.array([0.0]), np.array([0.5]))
    rate = simulator.answer(np.full((40_000, 1), 0.3), noisy, np.random.default_rng(1)).mean()
    assert rate == pytest.approx(norm.cdf(0.6), abs=0.01)
    with pytest.raises(ValueError, match="equal-length"):
        simulator.QuestionPool(np.array([0, 1]), np.array([0.0]), np.array([1.0]))


def test_world_has_relevant_and_irrelevant_dimensions_and_a_pool_per_dimension():
    cfg = smoke_config()
    world = data.make_world(cfg.world, seed=3)
    assert np.count_nonzero(world.weights) == cfg.world.n_relevant
    assert np.linalg.norm(world.weights) == pytest.approx(1.0, abs=1e-12)
    assert world.pool.size == cfg.world.n_dims * cfg.world.questions_per_dim
    np.testing.assert_array_equal(np.bincount(world.pool.dims), np.full(cfg.world.n_dims, cfg.world.questions_per_dim))
    assert set(world.pool.thresholds) <= set(cfg.world.thresholds)
    # Cut-points from the calibration items: they fall in K equal bins; the evaluation items need not.
    n_cal = cfg.world.n_calibration
    assert np.bincount(world.levels[:n_cal]).tolist() == [n_cal // cfg.world.n_levels] * cfg.world.n_levels
    np.testing.assert_array_equal(world.levels, simulator.calibrated_levels(world.human_raw, n_cal, cfg.world.n_levels))
    # The human score follows w_h . z: its Spearman with the noiseless raw score is high but not 1 (noise 0.3).
    assert 0.8 < method.spearman(world.human_raw, world.z @ world.weights) < 1.0


def test_cot_judge_without_drift_is_the_noiseless_human_score_and_drifts_otherwise():
    cfg = smoke_config()
    world = data.make_world(cfg.world, seed=0)
    steady = cfg.judge.model_copy(update={"cot_relevant_picked": cfg.world.n_relevant, "cot_irrelevant_weight": 0.0,
                                          "cot_noise_sd": 0.0})
    scores = baselines.cot_drift_scores(world.z, world.weights, 5, steady, np.random.default_rng(0))
    np.testing.assert_array_equal(scores, simulator.quantile_levels(world.z @ world.weights, 5))
    runs = np.stack([baselines.cot_drift_scores(world.z, world.weights, 5, cfg.judge, np.random.default_rng(r))
                     for r in range(3)], axis=1)
    assert method.krippendorff_alpha(runs, "ordinal") < 0.8  # drift makes re-judgings disagree


def test_cot_judge_attends_to_the_picked_relevant_dimensions_plus_irrelevant_weight():
    cfg = smoke_config()
    weights = np.array([0.0, 0.6, 0.0, 0.8, 0.0])
    judge = cfg.judge.model_copy(update={"cot_relevant_picked": 1, "cot_irrelevant_weight": 0.5})
    run = baselines.cot_drift_weights(weights, 300, judge, np.random.default_rng(0))
    relevant = run[:, [1, 3]]
    # One relevant dimension per judging, rescaled to unit norm; the irrelevant ones share 0.5.
    assert np.all(np.count_nonzero(relevant, axis=1) == 1) and np.allclose(relevant.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_allclose(run[:, [0, 2, 4]].sum(axis=1), 0.5, atol=1e-12)
    assert np.all(run >= 0)
    # Both relevant dimensions are drawn across items (the drift), about equally often.
    assert 0.4 < np.mean(relevant[:, 0] > 0) < 0.6


def test_fixed_questionnaire_and_random_rubrics():
    fixed = baselines.fixed_questionnaire(10, 8, 0.5)
    np.testing.assert_array_equal(fixed.dims, [0, 1, 2, 3, 4, 5, 6, 7, 0, 1])
    assert np.all(fixed.thresholds == 0) and np.all(fixed.noise_sd == 0.5)
    np.testing.assert_array_equal(baselines.count_score(np.array([[1, 0, 1], [0, 0, 0]])), [2.0, 0.0])
    rubrics = baselines.random_rubrics(12, 5, 7, np.random.default_rng(0))
    assert rubrics.shape == (7, 5) and all(len(set(row)) == 5 for row in rubrics)


class FixedPermutation:
    """A stand-in generator whose permutation is given: to enumerate every permutation exactly."""

    def __init__(self, permutation):
        self._permutation = np.asarray(permutation)

    def permutation(self, n):
        assert n == self._permutation.shape[0]
        return self._permutation.copy()


def shuffled_control_check(select) -> None:
    """C4n: the shuffled-likelihood selection is perm^-1 of the greedy set for every permutation, and over all
    5! permutations it picks each of the C(5, 2) = 10 pairs exactly 12 times: the uniform random 2-subset, i.e.
    random-k's distribution, so its mean Spearman equals random-k's on common draws (it IS a random-k rubric)."""
    theta = np.array([[0.1, 0.3, 0.7, 0.9], [0.5, 0.5, 0.5, 0.5], [0.2, 0.2, 0.9, 0.8],
                      [0.6, 0.4, 0.5, 0.45], [0.05, 0.5, 0.5, 0.95]])
    prior = np.array([0.1, 0.2, 0.3, 0.4])
    greedy = set(method.greedy_eig_selection(theta, prior, 2).indices)
    counts: dict[tuple[int, ...], int] = {}
    for permutation in itertools.permutations(range(5)):
        chosen = select(theta, prior, 2, FixedPermutation(permutation))
        inverse = np.argsort(permutation)
        assert set(chosen) == {int(inverse[j]) for j in greedy}
        key = tuple(sorted(chosen))
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 10 and set(counts.values()) == {12}


def test_shuffled_control_is_random_k_by_construction():
    shuffled_control_check(baselines.shuffled_likelihood_selection)


def test_negative_control_a_control_returning_the_greedy_set_is_caught():
    # Scoring the permuted rows' own greedy positions as if they were unpermuted (no inverse) is not uniform.
    def greedy_set(theta, prior, k, rng):
        rng.permutation(theta.shape[0])
        return method.greedy_eig_selection(theta, prior, k).indices
    with pytest.raises(AssertionError):
        shuffled_control_check(greedy_set)


def ranking_check(marginal_top_k, correlation_top_k) -> None:
    # Rows 0 and 1 are the same noiseless 50/50 split (marginal EIG ln 2 each), row 2 a noisy one, row 3 useless:
    # marginal top-2 keeps the duplicate pair, greedy conditional EIG swaps the duplicate for row 2.
    theta = np.array([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0], [0.1, 0.9, 0.1, 0.9], [0.5, 0.5, 0.5, 0.5]])
    prior = np.full(4, 0.25)
    assert marginal_top_k(theta, prior, 2) == (0, 1)
    assert marginal_top_k(theta, prior, 3) == (0, 1, 2)
    assert method.greedy_eig_selection(theta, prior, 2).indices == (0, 2)
    # |Spearman| with levels 0..4. Column 0 (0, 1, 0, 1, 1): centred ranks (-1.5, 1, -1.5, 1, 1) against
    # (-2, -1, 0, 1, 2): 5 / sqrt(7.5 * 10) = 0.5774. Column 1 (1, 1, 0, 0, 0): -7.5 / sqrt(75) = -0.8660, so
    # |rho| ranks it first. Column 2 is constant: 0.
    answers = np.array([[0, 1, 1], [1, 1, 1], [0, 0, 1], [1, 0, 1], [1, 0, 1]])
    levels = np.array([0, 1, 2, 3, 4])
    rho0 = method.spearman(answers[:, 0].astype(float), levels.astype(float))
    assert rho0 == pytest.approx(0.5773502691896258, abs=1e-12)
    assert correlation_top_k(answers, levels, 2) == (1, 0)
    assert correlation_top_k(answers, levels, 3) == (1, 0, 2)


def test_marginal_and_correlation_rankings_exact():
    ranking_check(baselines.marginal_eig_top_k, baselines.correlation_top_k)


def test_negative_control_rankings_by_signed_value_are_caught():
    def signed_correlation(answers, levels, k):
        strength = [method.spearman(answers[:, j].astype(float), levels.astype(float)) if np.ptp(answers[:, j])
                    else 0.0 for j in range(answers.shape[1])]
        return tuple(int(j) for j in np.argsort(-np.asarray(strength), kind="stable")[:k])
    with pytest.raises(AssertionError):
        ranking_check(baselines.marginal_eig_top_k, signed_correlation)

    def ascending_marginal(theta, prior, k):
        return tuple(reversed(baselines.marginal_eig_top_k(theta, prior, theta.shape[0])))[:k]
    with pytest.raises(AssertionError):
        ranking_check(ascending_marginal, baselines.correlation_top_k)


# --- the steps at the smoke profile --------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    cfg = smoke_config()
    root = tmp_path_factory.mktemp("eig_rubric")
    data.write_data(cfg, (0,), root / "data")
    (root / "model").mkdir()
    trained = train.train(cfg, 0, root / "data", root / "model")
    evaluated = evaluate.evaluate(cfg, 0, root / "data", root / "model")
    return cfg, root, trained, evaluated


def test_data_round_trips(smoke_run):
    cfg, root, _, _ = smoke_run
    world, loaded = data.make_world(cfg.world, 0), data.load_world(root / "data", 0)
    np.testing.assert_array_equal(world.z, loaded.z)
    np.testing.assert_array_equal(world.levels, loaded.levels)
    np.testing.assert_array_equal(world.pool.thresholds, loaded.pool.thresholds)
    assert loaded.n_calibration == cfg.world.n_calibration


def test_train_freezes_rubrics_fitted_on_the_calibration_items_only(smoke_run):
    cfg, root, trained, _ = smoke_run
    rubrics = train.load_rubrics(root / "model")
    world = data.load_world(root / "data", 0)
    rng = np.random.default_rng([0, data.CALIBRATION_STREAM])
    answers = simulator.answer(world.z[: world.n_calibration], world.pool, rng)
    theta = method.laplace_likelihoods(answers, world.levels[: world.n_calibration], cfg.world.n_levels)
    np.testing.assert_allclose(rubrics["theta"], theta, atol=1e-15)
    expected = method.greedy_eig_selection(theta, rubrics["prior"], cfg.judge.k_sweep_max)
    assert tuple(rubrics["eig_indices"]) == expected.indices
    assert rubrics["random_indices"].shape == (cfg.judge.n_random_draws, cfg.judge.k_sweep_max)
    assert tuple(rubrics["marginal_indices"]) == baselines.marginal_eig_top_k(theta, rubrics["prior"], cfg.judge.k)
    assert tuple(rubrics["correlation_indices"]) == baselines.correlation_top_k(
        answers, world.levels[: world.n_calibration], cfg.judge.k)
    # The fixed questionnaire's likelihoods are fitted on the same calibration items, from their own stream.
    fixed_pool = baselines.fixed_questionnaire(cfg.judge.k_sweep_max, cfg.world.n_dims, cfg.judge.fixed_noise_sd)
    fixed_answers = simulator.answer(world.z[: world.n_calibration], fixed_pool,
                                     np.random.default_rng([0, data.FIXED_CALIBRATION_STREAM]))
    np.testing.assert_allclose(rubrics["theta_fixed"], method.laplace_likelihoods(
        fixed_answers, world.levels[: world.n_calibration], cfg.world.n_levels), atol=1e-15)
    # The relevant-only pool holds exactly the questions on relevant dimensions; its rubrics stay inside it.
    relevant = [j for j in range(world.pool.size) if world.weights[world.pool.dims[j]] > 0]
    assert rubrics["relevant_pool"] == relevant
    assert set(rubrics["eig_relevant_pool_indices"]) <= set(relevant)
    assert set(np.ravel(rubrics["random_relevant_pool_indices"]).tolist()) <= set(relevant)
    sub = method.greedy_eig_selection(theta[relevant], rubrics["prior"], cfg.judge.k).indices
    assert rubrics["eig_relevant_pool_indices"] == [relevant[j] for j in sub]
    assert trained.metrics["eig_last_gain"] == rubrics["eig_gains"][-1]
    assert cfg.judge.k_sweep_max >= trained.metrics["eig_stopped_length"] >= 1
    # I(S; A_Q) is submodular when answers are independent given S (Krause & Guestrin 2005): greedy gains
    # never increase.
    gains = trained.curves["eig_gain_by_step"]
    assert all(later <= earlier + 1e-12 for earlier, later in zip(gains, gains[1:], strict=False))


def test_evaluate_measures_every_judge_and_the_sweep(smoke_run):
    cfg, _, _, evaluated = smoke_run
    for judge in evaluate.JUDGES:
        for name in ("spearman", "alpha_ordinal", "alpha_interval", "icc"):
            value = evaluated.metrics[f"{name}_{judge}"]
            assert -1.0 <= value <= 1.0, (judge, name, value)
    sweep = evaluated.tables["k_sweep"]
    assert len(sweep) == cfg.judge.k_sweep_max * len(evaluate.SWEPT_JUDGES)
    eig_at_k = next(r for r in sweep if r["judge"] == "eig" and r["k"] == cfg.judge.k)
    assert eig_at_k["spearman"] == evaluated.metrics["spearman_eig"]
    assert evaluated.metrics["n_evaluation_items"] == cfg.world.n_items - cfg.world.n_calibration
    grid = evaluated.tables["cot_sweep"]
    assert len(grid) == cfg.world.n_relevant * len(evaluate.COT_SWEEP_IRRELEVANT_WEIGHTS)
    drift_free = next(r for r in grid if r["cot_relevant_picked"] == cfg.world.n_relevant
                      and r["cot_irrelevant_weight"] == 0.0)
    assert evaluated.metrics["alpha_ordinal_cot_nodrift"] == drift_free["alpha_ordinal"]


def test_drift_free_cot_passes_differ_only_by_noise(smoke_run):
    # The grid's drift-free setting judges every pass by the fixed human weights: its passes are the quantile bins
    # of w_h . z + noise, and the same setting with cot_noise_sd = 0 gives identical passes (alpha exactly 1).
    cfg, root, _, _ = smoke_run
    world = data.load_world(root / "data", 0)
    quiet = cfg.model_copy(update={"judge": cfg.judge.model_copy(update={"cot_noise_sd": 0.0})})
    grid = evaluate.cot_drift_grid(quiet, world, 0)
    ratings = grid[(cfg.world.n_relevant, 0.0)]
    expected = simulator.quantile_levels(world.z[world.n_calibration:] @ world.weights, cfg.world.n_levels)
    for r in range(ratings.shape[1]):
        np.testing.assert_array_equal(ratings[:, r], expected)
    assert method.krippendorff_alpha(ratings, "ordinal") == 1.0
    assert method.krippendorff_alpha(grid[(1, 0.5)], "ordinal") < 0.9  # drift without noise still disagrees


def fixed_naive_bayes_check(score) -> None:
    # Two passes over two items; k = 1 of 2 fixed questions: E[s | a] = P(s = 1 | a) for K = 2, by hand.
    theta_fixed = np.array([[0.2, 0.8], [0.9, 0.1]])
    prior = np.array([0.5, 0.5])
    passes = evaluate.Rejudgings([np.zeros((2, 1))], [np.array([[1, 0], [0, 1]]), np.array([[0, 0], [1, 1]])],
                                 np.zeros((2, 2)))
    # yes to question 0: 0.8 / (0.2 + 0.8) = 0.8; no: 0.2 / (0.8 + 0.2) = 0.2.
    np.testing.assert_allclose(score(passes, 1, theta_fixed, prior), [[0.8, 0.2], [0.2, 0.8]], atol=1e-12)
    # k = 2, item 1 of pass 0 answers (no, yes): P(s=1) = 0.2 * 0.1 / (0.2 * 0.1 + 0.8 * 0.9) = 0.02 / 0.74.
    assert score(passes, 2, theta_fixed, prior)[1, 0] == pytest.approx(0.02 / 0.74, abs=1e-12)


def test_fixed_questionnaire_scored_by_naive_bayes_exact():
    fixed_naive_bayes_check(evaluate.Rejudgings.fixed_naive_bayes)


def test_negative_control_fixed_scored_on_every_question_is_caught():
    def every_question(passes, k, theta_fixed, prior):
        return evaluate.Rejudgings.fixed_naive_bayes(passes, theta_fixed.shape[0], theta_fixed, prior)
    with pytest.raises(AssertionError):
        fixed_naive_bayes_check(every_question)


def test_evaluate_is_reproducible(smoke_run):
    cfg, root, _, evaluated = smoke_run
    again = evaluate.evaluate(cfg, 0, root / "data", root / "model")
    assert again.metrics == {k: v for k, v in evaluated.metrics.items()} | {
        k: again.metrics[k] for k in again.metrics if k.startswith("seconds_")}


def test_consistency_and_alignment_on_known_ratings():
    ratings = np.array([[1.0, 1.0], [2.0, 3.0], [3.0, 3.0]])
    measured = evaluate.consistency_and_alignment(ratings, np.array([0, 1, 2]))
    assert measured["alpha_ordinal"] == pytest.approx(7 / 9, abs=1e-12)
    assert measured["alpha_interval"] == pytest.approx(24 / 29, abs=1e-12)
    # Column 0 ranks (1, 2, 3): rho 1; column 1 (1, 3, 3) -> ranks (1, 2.5, 2.5): rho = 1.5 / sqrt(2 * 1.5).
    assert measured["spearman"] == pytest.approx((1 + 1.5 / math.sqrt(3)) / 2, abs=1e-12)
    assert measured["icc"] == pytest.approx(method.icc_oneway(ratings), abs=1e-15)


def test_claim_metrics_are_the_differences_of_the_measurements(smoke_run):
    cfg, _, _, evaluated = smoke_run
    m, c = evaluated.metrics, claim_metrics.claim_metrics(cfg, evaluated)
    assert c["alpha_eig_minus_cot"] == m["alpha_ordinal_eig"] - m["alpha_ordinal_cot"]
    assert c["alpha_full_pool_minus_cot"] == m["alpha_ordinal_full_pool"] - m["alpha_ordinal_cot"]
    assert c["spearman_eig_minus_random"] == m["spearman_eig"] - m["spearman_random"]
    assert c["spearman_eig_minus_fixed"] == m["spearman_eig"] - m["spearman_fixed"]
    assert c["spearman_eig_minus_fixed_nb"] == m["spearman_eig"] - m["spearman_fixed_nb"]
    assert c["spearman_eig_minus_marginal"] == m["spearman_eig"] - m["spearman_marginal"]
    assert c["alpha_cot_nodrift_minus_cot"] == m["alpha_ordinal_cot_nodrift"] - m["alpha_ordinal_cot"]
    assert c["spearman_eig_minus_random_relevant_pool"] == (m["spearman_eig_relevant_pool"]
                                                            - m["spearman_random_relevant_pool"])
    assert c["spearman_eig_minus_cot"] == m["spearman_eig"] - m["spearman_cot"]


def test_figures_are_written(smoke_run, tmp_path):
    cfg, _, _, evaluated = smoke_run
    paths = figures.make_figures(cfg, [evaluated], tmp_path / "figures", tmp_path / "plots")
    assert {p.name for p in paths} == {"spearman_vs_k.png", "spearman_vs_k.csv", "consistency_by_judge.png",
                                       "consistency_by_judge.csv", "cot_drift_sweep.png", "cot_drift_sweep.csv"}
    assert all(p.stat().st_size > 0 for p in paths)
    assert pl.read_csv(tmp_path / "plots" / "consistency_by_judge.csv").height == len(evaluate.JUDGES)


# --- the LLM rubric library ----------------------------------------------------------------------------


def test_parse_questions_and_scores():
    text = "Here are questions:\n1. Is it correct?\n- Is it polite?\nnot a question\n2) Is it correct?\n* Is it short?"
    assert llm_rubric.parse_questions(text) == ["Is it correct?", "Is it polite?", "Is it short?"]
    assert llm_rubric.parse_score("reasoning... Score: 9\nActually Score: 4", 5) == 3
    assert llm_rubric.parse_score("score = 2 then Score: 7", 5) == 1  # the last in-range score
    assert llm_rubric.parse_score("no verdict", 5) is None


def test_tempered_and_two_way_probabilities_exact():
    # p = 0.8 at T = 0.5: 0.64 / (0.64 + 0.04) = 16/17; T = 1 keeps p; T = 0 is greedy.
    np.testing.assert_allclose(llm_rubric.tempered_yes_probability(np.array([0.8, 0.3]), 0.5),
                               [16 / 17, 0.09 / (0.09 + 0.49)], atol=1e-12)
    np.testing.assert_allclose(llm_rubric.tempered_yes_probability(np.array([0.8, 0.3]), 1.0), [0.8, 0.3], atol=1e-12)
    np.testing.assert_array_equal(llm_rubric.tempered_yes_probability(np.array([0.8, 0.5, 0.3]), 0.0), [1, 0.5, 0])
    assert llm_rubric.two_way_yes(math.log(0.3), math.log(0.1)) == pytest.approx(0.75, abs=1e-12)


def test_negative_control_temperature_ignored_is_caught(monkeypatch):
    monkeypatch.setattr(llm_rubric, "tempered_yes_probability", lambda p, t: np.asarray(p, dtype=float))
    assert not np.allclose(llm_rubric.tempered_yes_probability(np.array([0.8]), 0.5), [16 / 17], atol=1e-6)


def test_sample_answers_rate_matches_the_tempered_probability():
    rate = hub.sample_answers(np.full(40_000, 0.8), 0.5, np.random.default_rng(0)).mean()
    assert rate == pytest.approx(16 / 17, abs=0.01)


class FakeScorer:
    """LLMPolicy whose log-probs of ' Yes' / ' No' are fixed per prompt substring (no model)."""

    def __init__(self, table: dict[str, tuple[float, float]], text: str = "") -> None:
        self.table, self.text = table, text

    def generate(self, prompts, max_new_tokens, temperature=0.0, seed=0):
        return [self.text for _ in prompts]

    def score(self, prompt, continuations):
        assert list(continuations) == [llm_rubric.YES, llm_rubric.NO]
        return list(next(v for k, v in self.table.items() if k in prompt))

    def choose(self, prompt, options):
        return 0


def test_yes_probabilities_and_label_free_likelihoods_through_the_policy_interface():
    policy = FakeScorer({"response 1 on": (math.log(0.2), math.log(0.6)),
                         "response 2 on": (math.log(0.5), math.log(0.5)),
                         "good": (math.log(0.9), math.log(0.1)), "bad": (math.log(0.1), math.log(0.3))})
    assert isinstance(policy, LLMPolicy)
    np.testing.assert_allclose(llm_rubric.yes_probabilities(policy, ["good item", "bad item"], ["Q?"]),
                               [[0.9], [0.25]], atol=1e-12)
    theta = method.likelihoods_from_evaluator(
        lambda j, s: llm_rubric.hypothetical_yes_probability(policy, "Q?", s, 2), 1, 2)
    np.testing.assert_allclose(theta, [[0.25, 0.5]], atol=1e-12)
    with pytest.raises(ValueError, match="parseable questions"):
        llm_rubric.generate_question_pool(FakeScorer({}, "nothing here"), "task", 5, 10)
    assert llm_rubric.generate_question_pool(FakeScorer({}, "A?\nB?\nC?"), "task", 2, 10) == ["A?", "B?"]


# --- the paper profile on local stand-ins --------------------------------------------------------------


def judgment(qid: int, a: str, b: str, winner: str, turn: int = 1) -> dict:
    def conv(model: str) -> list[dict]:
        return [{"role": "user", "content": f"q{qid}"}, {"role": "assistant", "content": f"{model} a{qid}"},
                {"role": "user", "content": "more"}, {"role": "assistant", "content": f"{model} b{qid}"}]

    return {"question_id": qid, "model_a": a, "model_b": b, "winner": winner, "judge": "human",
            "conversation_a": conv(a), "conversation_b": conv(b), "turn": turn}


def test_response_scores_and_levels_exact():
    rows = [judgment(1, "x", "y", "model_a"), judgment(1, "x", "z", "tie"), judgment(1, "y", "z", "model_b"),
            judgment(1, "x", "y", "model_b", turn=2)]
    frame = hub.response_scores(rows)
    got = {(r["turn"], r["model"]): (r["human_raw"], r["n_judgments"]) for r in frame.iter_rows(named=True)}
    assert got == {(1, "x"): (0.75, 2), (1, "y"): (0.0, 2), (1, "z"): (0.75, 2), (2, "x"): (0.0, 1),
                   (2, "y"): (1.0, 1)}
    text = frame.filter((pl.col("turn") == 2) & (pl.col("model") == "y"))["text"][0]
    assert text == "user: q1\nassistant: y a1\nuser: more\nassistant: y b1"
    assert hub.render_conversation(rows[0]["conversation_a"], 1) == "user: q1\nassistant: x a1"
    # Cuts at the 1/3 and 2/3 quantiles of (0, 0, 0.5, 1, 1, 1) = 0.1667 and 1.0: equal values share a level.
    np.testing.assert_array_equal(hub.tied_quantile_levels(np.array([0, 0, 0.5, 1, 1, 1.0]), 3), [0, 0, 1, 2, 2, 2])


class CannedGeneration:
    """A real TransformersPolicy for scoring; generation returns canned text (a tiny random model writes no
    parseable questions)."""

    def __init__(self, policy: TransformersPolicy) -> None:
        self.policy = policy

    def generate(self, prompts, max_new_tokens, temperature=0.0, seed=0):
        canned = "1. Is it right?\n2. Is it kind?\n3. Is it short?\n4. Is it clear?"
        return [canned if "rubrics" in p else f"thinking... Score: {1 + (seed + i) % 5}" for i, p in enumerate(prompts)]

    def score(self, prompt, continuations):
        return self.policy.score(prompt, continuations)

    def choose(self, prompt, options):
        return self.policy.choose(prompt, options)


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
    root = tmp_path_factory.mktemp("eig_hub")
    pairs = (("m1", "m2", "model_a"), ("m2", "m3", "model_b"), ("m1", "m3", "tie"), ("m3", "m4", "model_a"))
    rows = [judgment(q, a, b, w) for q in range(1, 10) for a, b, w in pairs]  # 9 questions x 4 models
    folder = root / "mt_bench"
    (folder / "data").mkdir(parents=True)
    pl.DataFrame(rows).write_parquet(folder / "data" / "human-00000-of-00001.parquet")
    model_dir = build_tiny_local_model(root / "tiny", seed=0, train_steps=0, n_embd=16, n_layer=1)
    return root, folder, model_dir


def test_paper_profile_steps_run_on_local_stand_ins(stand_in, monkeypatch):
    root, folder, model_dir = stand_in
    raw = params_section(SLUG)["paper"]
    raw["hub"].update(evaluator_model=str(model_dir), dataset=str(folder), n_items=30, n_calibration=10,
                      pool_size=4)
    raw["judge"].update(k=2, k_sweep_max=3, n_rejudgings=2, n_random_draws=2)
    raw["device"] = "cpu"
    cfg = CONFIG.model_validate(raw)
    data.write_data(cfg, (0,), root / "data")
    frame = pl.read_parquet(root / "data" / "responses_seed0.parquet")
    assert frame.height == 30 and (frame["split"] == "calibration").sum() == 10
    policy = hub.load_policy(cfg.hub, "cpu")
    # An instruct model is prompted through its chat template (the stand-in's tokenizer has one).
    assert isinstance(policy, TransformersPolicy) and policy.chat == (policy.tokenizer.chat_template is not None)
    canned = CannedGeneration(policy)
    (root / "model").mkdir()
    with torch_threads(1):
        trained = hub.train(cfg, 0, root / "data", root / "model", policy=canned)
        evaluated = hub.evaluate(cfg, 0, root / "data", root / "model", policy=canned)
    assert trained.metrics["pool_size"] == 4
    rubrics = train.load_rubrics(root / "model")
    assert len(rubrics["eig_indices"]) == 3 and len(rubrics["label_free_indices"]) == 2
    simulated_only = {"cot_nodrift", "eig_relevant_pool", "random_relevant_pool", "full_relevant_pool"}
    assert not any(f"spearman_{judge}" in evaluated.metrics for judge in simulated_only)
    for judge in set(evaluate.JUDGES) - simulated_only:
        assert -1.0 <= evaluated.metrics[f"alpha_ordinal_{judge}"] <= 1.0 or math.isnan(
            evaluated.metrics[f"alpha_ordinal_{judge}"])
    assert evaluated.metrics["cot_parse_failures"] == 0
    assert "spearman_eig_label_free" in evaluated.metrics
    # The answers' probabilities come from the real model through LLMPolicy.score.
    p = llm_rubric.yes_probability(policy, frame["text"][0], "Is it right?")
    log_yes, log_no = policy.score(llm_rubric.answer_prompt(frame["text"][0], "Is it right?"), [" Yes", " No"])
    assert p == pytest.approx(1 / (1 + math.exp(log_no - log_yes)), abs=1e-12) and 0 < p < 1


def test_a_server_url_gives_the_openai_client_policy():
    cfg = CONFIG.model_validate(params_section(SLUG)["paper"])
    server = cfg.hub.model_copy(update={"server_url": "http://127.0.0.1:9/v1"})
    policy = hub.load_policy(server, "cpu")
    assert isinstance(policy, OpenAIServerPolicy) and policy.chat is False  # scoring needs echoed log-probs
