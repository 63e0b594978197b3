"""eig_rubric method: exact values the mutation run (issue 20) found unpinned, each with a negative control that
monkeypatches a broken variant into `method`: posteriors whose log-likelihoods are far below another answer
pattern's (the per-row maximum of the log-sum-exp), float32 inputs computed in float64, the validation of
likelihoods, priors and labels, and the default metric of Krippendorff's alpha.

Hand value: K = 2, prior (0.5, 0.5), three questions with theta = (1e-200, 2e-200) each, all answered yes:
p(s | a) is proportional to (1e-200)^3 and (2e-200)^3, i.e. 1 : 8, so (1/9, 8/9); the all-no pattern's
log-likelihood is about 0 while the all-yes one's is about -1380 (exp underflows against the global maximum)."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.eig_rubric import method

TINY = np.array([[1e-200, 2e-200]] * 3)
Q = np.array([[0.2, 0.5, 0.9], [0.6, 0.4, 0.1]])
PRIOR3 = np.array([0.5, 0.3, 0.2])


def test_posterior_of_patterns_far_below_the_best_one():
    post = method.posterior(np.array([[1, 1, 1], [0, 0, 0]]), TINY, np.array([0.5, 0.5]))
    np.testing.assert_allclose(post[0], [1 / 9, 8 / 9], rtol=1e-12)
    np.testing.assert_allclose(post[1], [0.5, 0.5], rtol=1e-12)


def test_negative_control_posterior_with_a_global_maximum(monkeypatch):
    def global_max(answers, theta, prior):
        log_joint = np.log(prior)[None, :] + method.log_likelihood(answers, theta)
        weights = np.exp(log_joint - log_joint.max())
        return weights / weights.sum(axis=1, keepdims=True)

    monkeypatch.setattr(method, "posterior", global_max)
    with np.errstate(invalid="ignore"), pytest.raises(AssertionError):
        test_posterior_of_patterns_far_below_the_best_one()


def test_posterior_hand_value_and_float32_inputs_are_computed_in_float64():
    """Answers (1, 0) under PRIOR3 and Q: (0.04, 0.09, 0.162) / 0.292; float32 theta and prior give exactly what
    their float64 values give (no float32 logarithms)."""
    np.testing.assert_allclose(method.posterior(np.array([[1, 0]]), Q, PRIOR3)[0],
                               np.array([0.04, 0.09, 0.162]) / 0.292, rtol=1e-12)
    q32, prior32 = Q.astype(np.float32), PRIOR3.astype(np.float32)
    answers = np.array([[1, 0], [0, 1], [1, 1]])
    expected = method.posterior(answers, q32.astype(np.float64), prior32.astype(np.float64))
    np.testing.assert_allclose(method.posterior(answers, q32, PRIOR3), method.posterior(
        answers, q32.astype(np.float64), PRIOR3), rtol=1e-15, atol=0)
    np.testing.assert_allclose(method.posterior(answers, q32, prior32), expected, rtol=1e-15, atol=0)
    p32 = np.array([0.2, 0.3, 0.5], dtype=np.float32)
    assert method.entropy(p32) == method.entropy(p32.astype(np.float64))


def test_negative_control_float32_logarithms(monkeypatch):
    monkeypatch.setattr(method, "_as_likelihoods", lambda theta, name="theta": np.asarray(theta))
    with pytest.raises(AssertionError):
        test_posterior_hand_value_and_float32_inputs_are_computed_in_float64()


RATINGS32 = np.array([[1.1, 2.3, 1.7], [0.7, 1.9, 0.4], [2.2, 2.4, 2.9], [3.3, 2.6, 3.1]], dtype=np.float32)


def test_reliability_of_float32_ratings_is_computed_in_float64():
    as64 = RATINGS32.astype(np.float64)
    assert method.icc_oneway(RATINGS32) == method.icc_oneway(as64)
    assert method.krippendorff_alpha(RATINGS32, "interval") == method.krippendorff_alpha(as64, "interval")
    assert method.krippendorff_alpha(RATINGS32) == method.krippendorff_alpha(as64, "ordinal")
    assert method.krippendorff_alpha(as64) != method.krippendorff_alpha(as64, "interval")


def test_negative_control_icc_in_float32(monkeypatch):
    original = method.icc_oneway

    def float32_icc(ratings):
        ratings = np.asarray(ratings)
        if ratings.dtype == np.float32:
            n, r = ratings.shape
            means = ratings.mean(axis=1)
            between = r * np.sum((means - means.mean()) ** 2) / (n - 1)
            within = np.sum((ratings - means[:, None]) ** 2) / (n * (r - 1))
            return float((between - within) / (between + (r - 1) * within))
        return original(ratings)

    monkeypatch.setattr(method, "icc_oneway", float32_icc)
    with pytest.raises(AssertionError):
        test_reliability_of_float32_ratings_is_computed_in_float64()


def test_validation_rejects_bad_likelihoods_priors_and_labels():
    with pytest.raises(ValueError, match="theta must hold probabilities"):
        method.posterior(np.array([[1]]), np.array([[0.5, -0.1]]), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="theta must hold probabilities"):
        method.posterior(np.array([[1]]), np.array([[0.5, np.nan]]), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="evaluator probabilities must hold"):
        method.likelihoods_from_evaluator(lambda j, s: 1.5, 2, 2)
    with pytest.raises(ValueError, match="prior must be a probability vector"):
        method.posterior(np.array([[1]]), np.array([[0.5, 0.6]]), np.array([1.25, -0.25]))
    # |sum - 1| = 1.0005e-5 is outside rtol 1e-5 + atol 1e-9 (but inside numpy's default atol 1e-8)
    with pytest.raises(ValueError, match="prior must be a probability vector"):
        method.posterior(np.array([[1]]), np.array([[0.5, 0.6]]), np.array([0.5 + 1.0005e-5, 0.5]))
    method.posterior(np.array([[1]]), np.array([[0.5, 0.6]]), np.array([0.5 + 0.9995e-5, 0.5]))
    with pytest.raises(ValueError, match="levels must lie"):
        method.laplace_likelihoods(np.array([[1], [0]]), np.array([0, -1]), 2)
    assert method.answer_patterns(3).dtype == np.int8


@pytest.mark.parametrize("broken", ["no_negative_check", "loose_prior"])
def test_negative_control_validation(monkeypatch, broken):
    if broken == "no_negative_check":
        monkeypatch.setattr(method, "_as_likelihoods", lambda theta, name="theta": np.asarray(theta, dtype=float))
    else:
        def loose(prior, n_levels):
            prior = np.asarray(prior, dtype=np.float64)
            if np.any(prior < 0) or not np.isclose(prior.sum(), 1.0):
                raise ValueError("prior must be a probability vector (non-negative, summing to 1)")
            return prior
        monkeypatch.setattr(method, "_as_prior", loose)
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        test_validation_rejects_bad_likelihoods_priors_and_labels()
