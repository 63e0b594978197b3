"""arm_ebm method: exact values on non-degenerate inputs found missing by `make mutation SLUG=arm_ebm`,
each with a negative control that monkeypatches a broken variant into `method`."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.arm_ebm import method

# Two rows, two positions, three tokens; zeros in the laws (0 log 0 = 0) and unequal entropies.
TARGETS = np.array([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],
                    [[1.0, 0.0, 0.0], [0.0, 0.25, 0.75]]])


def entropy(p: list[float]) -> float:
    return -sum(x * math.log(x) for x in p if x > 0)


def target_entropy_check() -> bool:
    want = (entropy([0.5, 0.5]) + entropy([0.2, 0.3, 0.5]) + 0.0 + entropy([0.25, 0.75])) / 2
    got = method.mean_target_entropy(TARGETS)
    return math.isfinite(got) and abs(got - want) < 1e-12


def test_mean_target_entropy_exact_with_zero_probabilities():
    assert target_entropy_check()


def test_negative_control_entropy_without_the_zero_convention_fails(monkeypatch):
    def naive(targets):
        with np.errstate(divide="ignore", invalid="ignore"):
            return float((-targets * np.log(targets)).sum(axis=(1, 2)).mean())

    monkeypatch.setattr(method, "mean_target_entropy", naive)
    assert not target_entropy_check()


def test_population_cross_entropy_exact_and_weighted():
    logits = torch.tensor([[[0.2, -0.1, 0.5, 9.0], [1.0, 0.0, -1.0, 9.0]],
                           [[0.3, 0.3, 0.0, 9.0], [-0.5, 0.4, 0.1, 9.0]]], dtype=torch.float64)
    targets = torch.tensor(TARGETS)
    rows = []
    for i in range(2):
        total = 0.0
        for t in range(2):
            z = logits[i, t, :3].tolist()
            log_norm = math.log(sum(math.exp(v) for v in z))
            total -= sum(p * (v - log_norm) for p, v in zip(TARGETS[i, t], z))
        rows.append(total)
    got = method.population_cross_entropy(logits, targets, vocab_size=3)
    assert float(got) == pytest.approx(sum(rows) / 2, abs=1e-12)  # the padded 4th logit is cut away
    weighted = method.population_cross_entropy(logits, targets, 3, torch.tensor([0.25, 0.75], dtype=torch.float64))
    assert float(weighted) == pytest.approx(0.25 * rows[0] + 0.75 * rows[1], abs=1e-12)


# ------------------------------------------------------------------ issue 20, third pass (full-run survivors)

import warnings  # noqa: E402

ROWS32 = np.array([[0.1, 2.3, -1.7, 0.4], [3.3, -0.2, 1.1, 0.05]], dtype=np.float32)


def check_float32_inputs_are_computed_in_float64() -> None:
    """A float32 input gives the float64 result of the same numbers (the library converts first)."""
    rows64 = ROWS32.astype(np.float64)
    for name, f in [("logsumexp", method.logsumexp), ("ebm_log_probs", method.ebm_log_probs),
                    ("log_partition", method.log_partition)]:
        got = f(ROWS32)
        assert got.dtype == np.float64, name
        assert np.array_equal(got, f(rows64)), name
    logq = method.log_softmax(rows64[::-1].copy())
    kl = method.kl_divergence(method.log_softmax(ROWS32.astype(np.float64)).astype(np.float32), logq.astype(np.float32))
    assert kl.dtype == np.float64
    tables32 = [ROWS32.reshape(2, 1, 4)]
    tables = method.conditional_log_probs(tables32)
    assert tables[0].dtype == np.float64
    assert np.array_equal(tables[0], method.log_softmax(rows64.reshape(2, 1, 4), axis=-1))


def test_float32_inputs_are_computed_in_float64():
    check_float32_inputs_are_computed_in_float64()


def test_negative_control_float32_arithmetic_is_caught(monkeypatch):
    real = method.logsumexp
    monkeypatch.setattr(method, "logsumexp",
                        lambda values, axis=-1: real(values, axis).astype(np.asarray(values).dtype))
    with pytest.raises(AssertionError):
        check_float32_inputs_are_computed_in_float64()


def check_logsumexp_shifts_each_row_by_its_own_peak() -> None:
    """Rows of very different scale: a shift by a global peak would underflow the small row (exp(-1000) = 0);
    an all -inf row gives -inf; the axis is honoured by log_softmax."""
    values = np.array([[1000.0, 1000.0], [0.0, 0.0], [-np.inf, -np.inf]])
    got = method.logsumexp(values)
    assert got[0] == pytest.approx(1000.0 + math.log(2), abs=1e-12)
    assert got[1] == pytest.approx(math.log(2), abs=1e-15)
    assert got[2] == -np.inf
    columns = np.array([[0.0, 5.0], [math.log(3.0), 5.0]])
    assert np.allclose(method.log_softmax(columns, axis=0), [[math.log(0.25), math.log(0.5)],
                                                            [math.log(0.75), math.log(0.5)]], rtol=0, atol=1e-15)


def test_logsumexp_shifts_each_row_by_its_own_peak():
    check_logsumexp_shifts_each_row_by_its_own_peak()


def test_negative_control_global_peak_is_caught(monkeypatch):
    def global_peak(values, axis=-1):
        values = np.asarray(values, dtype=np.float64)
        peak = np.max(values)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log(np.sum(np.exp(values - peak), axis=axis)) + peak
    monkeypatch.setattr(method, "logsumexp", global_peak)
    with pytest.raises(AssertionError):
        check_logsumexp_shifts_each_row_by_its_own_peak()


def check_zero_probabilities_raise_no_warning() -> None:
    """-inf log-probabilities (empty cells) are handled without numpy RuntimeWarnings (the errstate blocks)."""
    with np.errstate(divide="ignore"):
        logp = np.log(np.array([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]]))
        logq = np.log(np.array([[0.25, 0.25, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]]))
    q = [np.zeros((2, 1, 2)), np.zeros((2, 2, 2))]       # V = 2, T = 2: uniform next-token laws
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert method.logsumexp(np.array([[-np.inf, -np.inf]]))[0] == -np.inf
        assert method.kl_divergence(logp, logq).tolist() == pytest.approx([math.log(2.0), 0.0], abs=1e-15)
        # row 0 puts all mass on y_1 = 0 (KL log 2 to uniform at step 1), then uniform y_2 (KL 0; the prefix
        # y_1 = 1 has mass 0); row 1 is uniform (KL 0): mean over the two prompts (log 2 / 2, 0)
        assert method.stepwise_kl(logp, q).tolist() == pytest.approx([0.5 * math.log(2.0), 0.0], abs=1e-15)


def test_zero_probabilities_raise_no_warning():
    check_zero_probabilities_raise_no_warning()


def test_negative_control_warning_is_caught(monkeypatch):
    real = method.kl_divergence

    def noisy(logp, logq):
        warnings.warn("invalid value", RuntimeWarning, stacklevel=2)
        return real(logp, logq)
    monkeypatch.setattr(method, "kl_divergence", noisy)
    with pytest.raises(RuntimeWarning):
        check_zero_probabilities_raise_no_warning()


def check_myopic_arm_returns_float64_copies() -> None:
    ints = [np.array([[1, 2]])]
    assert method.myopic_arm(ints)[0].dtype == np.float64
    floats = [np.array([[0.5, 1.5]])]
    out = method.myopic_arm(floats)
    out[0][0, 0] = 9.0
    assert floats[0][0, 0] == 0.5


def test_myopic_arm_returns_float64_copies():
    check_myopic_arm_returns_float64_copies()


def test_negative_control_aliasing_is_caught(monkeypatch):
    monkeypatch.setattr(method, "myopic_arm", lambda tables: [np.asarray(t, dtype=np.float64) for t in tables])
    with pytest.raises(AssertionError):
        check_myopic_arm_returns_float64_copies()
