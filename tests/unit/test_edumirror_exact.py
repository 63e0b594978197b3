"""edumirror method: exact values where test_edumirror_method.py's inputs cannot tell a right formula from a wrong
one (issue 20, found by mutation testing): float32 inputs (the statistics must be computed in float64, as the
explicit casts say), integer answers, numeric strings, NaN and leading ties in the ranks, a large common offset
in the slope, and the p_e = 1 convention of Cohen's kappa. Each check has a negative control that breaks the
library through monkeypatch and shows the same check fails."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest

from tasks.edumirror import method

# float32 inputs whose arithmetic rounds differently in float32 and float64 (0.1, 0.7, ... are not dyadic).
NEEDS = np.array([0.1, 7.3, 4.9, 9.95])
RATINGS = np.array([[13.1, 4.7], [2.9, 11.3]])  # a confusion matrix of rating weights (not integer counts)
ITEMS = np.array([[1.1, 2.3, 0.7], [2.9, 3.1, 1.3], [0.3, 1.9, 2.2], [3.7, 2.6, 3.3]])
X = np.array([0.1, 0.7, 0.35, 1.9, 1.3])
Y = np.array([0.2, 0.3, 0.95, 1.7, 0.4])

# Each case: (function name, call on the inputs passed through `cast`). The library casts to float64 first, so
# float32 inputs must give exactly the result of their float64 copies; a float32 computation is off by ~1e-8.
FLOAT_CASES: dict[str, Callable[[Callable[[np.ndarray], np.ndarray]], object]] = {
    "svo_utility": lambda cast: method.svo_utility(cast(X), cast(Y), 40.0),
    "decay_toward_baseline": lambda cast: method.decay_toward_baseline(cast(NEEDS), 5.0, 0.3),
    "softmax_probabilities": lambda cast: method.softmax_probabilities(cast(X), 0.7),
    "cohens_kappa": lambda cast: method.cohens_kappa(cast(RATINGS)),
    "cronbach_alpha": lambda cast: method.cronbach_alpha(cast(ITEMS)),
    "pearson": lambda cast: method.pearson(cast(X), cast(Y)),
    "ols_slope": lambda cast: method.ols_slope(cast(X)),
}


def to_float32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32)


def to_float32_then_float64(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32).astype(np.float64)


def check_float32_input_gives_the_float64_result(name: str) -> None:
    low, high = FLOAT_CASES[name](to_float32), FLOAT_CASES[name](to_float32_then_float64)
    assert np.asarray(low).dtype == np.float64
    # pearson centres with np.mean of the raw input (a float32 mean): that moves r only at second order (1e-16).
    assert np.allclose(low, high, rtol=0.0, atol=1e-13)


@pytest.mark.parametrize("name", sorted(FLOAT_CASES))
def test_float32_input_gives_the_float64_result(name):
    check_float32_input_gives_the_float64_result(name)


@pytest.mark.parametrize("name", sorted(FLOAT_CASES))
def test_negative_control_float32_arithmetic_is_caught(monkeypatch, name):
    """The same check fails for a library that keeps float32 inputs in float32 (here: rounds its result)."""
    original = getattr(method, name)

    def in_input_precision(*args, **kwargs):
        exact = original(*args, **kwargs)
        if not any(getattr(arg, "dtype", None) == np.float32 for arg in args):
            return exact
        rounded = np.asarray(exact).astype(np.float32)
        return rounded if isinstance(exact, np.ndarray) else float(rounded)

    monkeypatch.setattr(method, name, in_input_precision)
    with pytest.raises(AssertionError):
        check_float32_input_gives_the_float64_result(name)


def check_reverse_code_of_integer_answers() -> None:
    coded = method.reverse_code(np.array([[1, 4, 2], [3, 1, 4]]), 4, (2,))
    assert coded.dtype == np.float64
    assert coded.tolist() == [[1.0, 1.0, 2.0], [3.0, 4.0, 4.0]]


def test_reverse_code_of_integer_answers_is_float():
    check_reverse_code_of_integer_answers()


def test_negative_control_integer_reverse_code_is_caught(monkeypatch):
    def integer_codes(answers, points, reverse_items):
        coded = np.array(answers, copy=True)
        index = [i - 1 for i in reverse_items]
        coded[..., index] = points + 1 - coded[..., index]
        return coded

    monkeypatch.setattr(method, "reverse_code", integer_codes)
    with pytest.raises(AssertionError):
        check_reverse_code_of_integer_answers()


NAN = float("nan")
# 12 numbers and 8 NaNs, interleaved; more than 16 values, so an unstable (introsort) argsort reorders the NaNs.
WITH_NANS = np.array([5.0, NAN, 3.0, NAN, 9.0, 1.0, NAN, 4.0, 4.0, NAN, 8.0, 2.0, NAN, 7.0, NAN, 6.0, 0.0, NAN,
                      11.0, NAN])


def expected_ranks_with_nans() -> list[float]:
    """By hand: the numbers 0..11 (4 twice) rank 1..12 with the tied 4s at (5 + 6) / 2; the NaNs compare unequal
    to everything, so each is its own group, ranked 13..20 after every number in input order (stable sort)."""
    by_value = {0.0: 1.0, 1.0: 2.0, 2.0: 3.0, 3.0: 4.0, 4.0: 5.5, 5.0: 7.0, 6.0: 8.0, 7.0: 9.0, 8.0: 10.0,
                9.0: 11.0, 11.0: 12.0}
    ranks, next_nan = [], 13.0
    for value in WITH_NANS:
        if np.isnan(value):
            ranks.append(next_nan)
            next_nan += 1.0
        else:
            ranks.append(by_value[value])
    return ranks


def check_average_ranks_exact() -> None:
    assert method.average_ranks(WITH_NANS).tolist() == expected_ranks_with_nans()
    # numeric strings are parsed to float64 and ranked by value ("9" and "9.0" tie), not lexicographically
    assert method.average_ranks(np.array(["10", "9", "9.0", "100"])).tolist() == [3.0, 1.5, 1.5, 4.0]
    # a tie group at the very start (the first group's rank is not 1)
    assert method.average_ranks(np.array([2.0, 7.0, 2.0, 5.0])).tolist() == [1.5, 4.0, 1.5, 3.0]


def test_average_ranks_with_nans_strings_and_a_leading_tie():
    check_average_ranks_exact()


@pytest.mark.parametrize("broken", ["unstable_sort", "no_float_cast", "skips_first_group"])
def test_negative_control_broken_ranks_are_caught(monkeypatch, broken):
    def ranks(x):
        x = np.asarray(x) if broken == "no_float_cast" else np.asarray(x, dtype=np.float64)
        order = np.argsort(x, kind="quicksort" if broken == "unstable_sort" else "stable")
        out = np.full(len(x), 1.0)  # what an unassigned entry would hold at best
        sorted_x, start = x[order], (1 if broken == "skips_first_group" else 0)
        while start < len(x):
            stop = start
            while stop + 1 < len(x) and sorted_x[stop + 1] == sorted_x[start]:
                stop += 1
            out[order[start:stop + 1]] = (start + stop) / 2.0 + 1.0
            start = stop + 1
        return out

    monkeypatch.setattr(method, "average_ranks", ranks)
    with pytest.raises(AssertionError):
        check_average_ranks_exact()


def check_ols_slope_with_a_large_offset() -> None:
    """Values 2^40 + k / 4096 are exact doubles; the slope of k / 4096 against 0..7 is computed exactly with
    fractions. Centring y keeps the differences exact; adding the mean instead (y + ybar, a formula that is equal
    in exact arithmetic because t is centred) rounds them at 2^41 and is off by a third."""
    k = [0, 3, 1, 4, 2, 7, 5, 6]
    values = np.array([2.0**40 + kk / 4096 for kk in k])
    t = [Fraction(2 * i - 7, 2) for i in range(8)]
    exact = sum(ti * Fraction(kk, 4096) for ti, kk in zip(t, k, strict=True)) / sum(ti * ti for ti in t)
    assert method.ols_slope(values) == pytest.approx(float(exact), rel=1e-12)


def test_ols_slope_with_a_large_offset():
    check_ols_slope_with_a_large_offset()


def test_negative_control_slope_adding_the_mean_is_caught(monkeypatch):
    def slope_adding_mean(values):
        y = np.asarray(values, dtype=np.float64)
        t = np.arange(len(y), dtype=np.float64)
        t = t - t.mean()
        return float(t @ (y + y.mean()) / (t @ t))

    monkeypatch.setattr(method, "ols_slope", slope_adding_mean)
    with pytest.raises(AssertionError):
        check_ols_slope_with_a_large_offset()


def check_kappa_when_chance_agreement_is_one() -> None:
    """p_e = 1 with p_o != 1 gives 0 (the library's convention), p_e = p_o = 1 gives 1. With integer counts p_e = 1
    forces p_o = 1; the 0 branch is reached by weights: a signed matrix (rows (2, 0), columns (2, 0): p_e = 4/4 = 1,
    p_o = 4/2 = 2) and non-negative weights where p_e rounds to 1.0 while p_o = 1 - 1e-16."""
    assert method.cohens_kappa(np.array([[3.0, -1.0], [-1.0, 1.0]])) == 0.0
    weights = np.array([[1e8, 1.1102230246251565e-08], [0.0, 0.0]])
    assert np.trace(weights) / weights.sum() != 1.0
    assert method.cohens_kappa(weights) == 0.0
    assert method.cohens_kappa(np.array([[0.0, 0.0], [0.0, 7.0]])) == 1.0


def test_kappa_when_chance_agreement_is_one():
    check_kappa_when_chance_agreement_is_one()


@pytest.mark.parametrize("degenerate_value", [1.0, float("nan")])
def test_negative_control_kappa_with_another_degenerate_convention_is_caught(monkeypatch, degenerate_value):
    original = method.cohens_kappa

    def kappa(confusion):
        c = np.asarray(confusion, dtype=np.float64)
        p_expected = float(c.sum(axis=1) @ c.sum(axis=0)) / c.sum() ** 2
        return degenerate_value if p_expected == 1.0 else original(confusion)

    monkeypatch.setattr(method, "cohens_kappa", kappa)
    with pytest.raises(AssertionError):
        check_kappa_when_chance_agreement_is_one()


def check_expected_scale_r_at_the_bounds() -> None:
    """n_items = 1 and n_reverse = 0 or n_reverse = n_items are valid scales. By hand, latent sd 2 of range 10 on a
    7-point scale (signal 1.2), noise 0.5, acquiescence 0.4: one plain item keeps the whole acquiescence (0.4);
    three reversed items keep it with the opposite sign ((3 - 6) / 3 * 0.4), squared the same."""
    noise_one = 0.25 + 1 / 12
    assert method.expected_scale_r(2.0, 10.0, 7, 1, 0, 0.5, 0.4) == pytest.approx(
        1.2 / (1.44 + 0.16 + noise_one) ** 0.5, abs=1e-12)
    assert method.expected_scale_r(2.0, 10.0, 7, 1, 1, 0.5, 0.4) == pytest.approx(
        1.2 / (1.44 + 0.16 + noise_one) ** 0.5, abs=1e-12)
    assert method.expected_scale_r(2.0, 10.0, 7, 3, 3, 0.5, 0.4) == pytest.approx(
        1.2 / (1.44 + 0.16 + noise_one / 3) ** 0.5, abs=1e-12)
    assert method.expected_scale_r(2.0, 10.0, 7, 3, 0, 0.5, 0.4) == pytest.approx(
        1.2 / (1.44 + 0.16 + noise_one / 3) ** 0.5, abs=1e-12)


def test_expected_scale_r_at_the_bounds():
    check_expected_scale_r_at_the_bounds()


@pytest.mark.parametrize("rejects", ["one_item", "no_reversed", "all_reversed"])
def test_negative_control_too_strict_scale_bounds_are_caught(monkeypatch, rejects):
    real = method.expected_scale_r

    def strict(latent_sd, latent_range, points, n_items, n_reverse, noise_sd, acquiescence_sd):
        if {"one_item": n_items == 1, "no_reversed": n_reverse == 0, "all_reversed": n_reverse == n_items}[rejects]:
            raise ValueError("out of range")
        return real(latent_sd, latent_range, points, n_items, n_reverse, noise_sd, acquiescence_sd)

    monkeypatch.setattr(method, "expected_scale_r", strict)
    with pytest.raises(ValueError):
        check_expected_scale_r_at_the_bounds()
