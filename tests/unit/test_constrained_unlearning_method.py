"""Deterministic checks of the constrained-unlearning library (brief constrained_unlearning.md, acceptance (a)).

Every check has a negative control: a deliberately broken variant that must fail the same check.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, optimize

from tasks.common.io import load_state_dict, save_state_dict
from tasks.common.params import paper_seeds, params_section
from tasks.constrained_unlearning import baselines, data, diffusion, evaluate, method
from tasks.constrained_unlearning.config import CONFIG
from tasks.constrained_unlearning.mixture import GaussianMixture, single_gaussian
from tasks.constrained_unlearning.model import constrained_optimum


def cpu_config():
    return CONFIG.model_validate(params_section("constrained_unlearning")["cpu"])


def gaussian_1d(points: np.ndarray, mean: float, std: float) -> np.ndarray:
    return np.exp(-(points - mean) ** 2 / (2 * std**2)) / (std * math.sqrt(2 * math.pi))


@pytest.fixture(scope="module")
def reference():
    """The brief's 1-D problem: lambda* and targets of the three formulations at 5% and 1% forget mass."""
    problem, far = data.reference_problem_1d()
    out = {"problem": problem, "far": far, "q": method.normalise(problem.q, problem.cell)}
    for mass_target in (0.05, 0.01):
        for f in method.FORMULATIONS:
            lam = method.lambda_for_forget_mass(f, problem, mass_target)
            out[f, mass_target] = (lam, method.target(f, problem, lam))
    return out


def retained(reference, f: str, mass_target: float = 0.05) -> float:
    problem = reference["problem"]
    return method.retained_kl(reference[f, mass_target][1], reference["q"], problem.forget_mask, problem.cell)


# ------------------------------------------------------------------------------------------------
# (a)1 ESD correspondence
# ------------------------------------------------------------------------------------------------

def test_esd_correspondence_eta_two_is_lambda_two_thirds():
    assert method.eta_from_lambda(2 / 3) == pytest.approx(2.0, abs=1e-12)
    assert method.lambda_from_eta(2.0) == pytest.approx(2 / 3, abs=1e-12)
    for lam in (0.0, 0.1, 0.5, 0.9):
        assert method.lambda_from_eta(method.eta_from_lambda(lam)) == pytest.approx(lam, abs=1e-12)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        method.eta_from_lambda(1.0)


# ------------------------------------------------------------------------------------------------
# (a)2 RU score identity and FU recovery of q_r
# ------------------------------------------------------------------------------------------------

def _fd_score(log_density: np.ndarray, step: float) -> np.ndarray:
    return np.gradient(log_density, step)


def ru_score_identity_error(problem, lam: float) -> float:
    """(a)2: max |FD gradient of log p*_RU - (grad log q - eta (grad log q_u - grad log q))|, both via the library."""
    step = 24.0 / (len(problem.log_q) - 1)
    log_p = np.log(method.ru_target(problem, lam))
    composed = method.ru_score(_fd_score(problem.log_q, step), _fd_score(problem.log_qu, step), lam)
    support = np.isfinite(log_p)
    return float(np.max(np.abs(_fd_score(log_p, step)[support] - composed[support])))


@pytest.mark.parametrize("lam", [0.0376, 0.3, 2 / 3])
def test_ru_score_identity_on_a_1d_grid(reference, lam):
    """Claim C6a (identity): the RU optimum's score is ESD's negatively guided score (negative controls below)."""
    assert ru_score_identity_error(reference["problem"], lam) < 1e-6


@pytest.mark.parametrize("lam", [0.0376, 0.3, 2 / 3])
def test_ru_score_identity_fails_without_the_exponent(reference, monkeypatch, lam):
    """Negative control of (a)2: the library's RU target without the 1/(1 - lambda) exponent breaks the identity."""
    monkeypatch.setattr(method, "ru_log_target", lambda log_q, log_qu, lam: log_q - lam * log_qu)
    assert ru_score_identity_error(reference["problem"], lam) > 1e-3


def test_ru_score_identity_fails_with_eta_equal_lambda(reference, monkeypatch):
    """Negative control of (a)1-2: the naive reading eta = lambda in the library breaks ESD's eta = 2 at
    lambda = 2/3 and the score identity."""
    monkeypatch.setattr(method, "eta_from_lambda", lambda lam: lam)
    assert method.eta_from_lambda(2 / 3) != pytest.approx(2.0)
    assert ru_score_identity_error(reference["problem"], 2 / 3) > 1e-3


def test_fu_recovers_the_retained_distribution():
    """Claim C6b (identity): with q = 0.9 q_r + 0.1 q_u and lambda = 0.1 the FU optimum is q_r."""
    grid = method.Grid.regular(-10, 10, 4001, 1)
    x = grid.points[:, 0]
    q_r = 0.5 * gaussian_1d(x, -3, 0.8) + 0.5 * gaussian_1d(x, 4, 0.6)
    q_u = gaussian_1d(x, 1, 0.5)
    q = 0.9 * q_r + 0.1 * q_u
    problem = method.GridProblem(np.log(q), np.log(q_u), grid.cell, np.abs(x - 1) < 1.0)
    q_r = method.normalise(q_r, grid.cell)
    assert method.tv_distance(method.fu_target(problem, 0.1), q_r, grid.cell) < 1e-10
    # Negative control: a lambda other than the mixture weight leaves some q_u in.
    assert method.tv_distance(method.fu_target(problem, 0.05), q_r, grid.cell) > 1e-3


# ------------------------------------------------------------------------------------------------
# (a)3 LU at lambda = 0, monotone forget mass
# ------------------------------------------------------------------------------------------------

def test_lu_at_zero_lambda_is_q(reference):
    problem = reference["problem"]
    np.testing.assert_allclose(method.lu_target(problem, 0.0), reference["q"], rtol=1e-12, atol=1e-15)
    # Negative control: any positive lambda changes it.
    assert method.tv_distance(method.lu_target(problem, 0.5), reference["q"], problem.cell) > 1e-3


@pytest.mark.parametrize("formulation,lams", [("ru", np.linspace(0, 0.9, 12)), ("fu", np.linspace(0, 0.24, 12)),
                                              ("lu", np.linspace(0, 30, 12))])
def test_forget_mass_strictly_decreasing_in_lambda(reference, formulation, lams):
    assert forget_mass_strictly_decreasing(reference["problem"], formulation, lams)


def forget_mass_strictly_decreasing(problem, formulation, lams) -> bool:
    masses = [method.mass(method.target(formulation, problem, lam), problem.forget_mask, problem.cell) for lam in lams]
    return bool(np.all(np.diff(masses) < 0))


# Each formulation's own broken target, injected into the library: the constraint term's sign flipped.
BROKEN_TARGETS = {
    "ru": ("ru_log_target", lambda log_q, log_qu, lam: (log_q + lam * log_qu) / (1.0 - lam)),
    "fu": ("fu_unnormalised", lambda q, qu, lam: np.clip(q + lam * qu, 0.0, None)),
    "lu": ("lu_log_target", lambda log_q, qu, lam: log_q + lam * qu),
}


@pytest.mark.parametrize("formulation,lams", [("ru", np.linspace(0, 0.9, 12)), ("fu", np.linspace(0, 0.24, 12)),
                                              ("lu", np.linspace(0, 30, 12))])
def test_forget_mass_check_fails_with_a_wrong_sign_target(reference, monkeypatch, formulation, lams):
    """Negative control of (a)3, per formulation: its target with the constraint's sign flipped (RU
    (q q_u^lambda)^{1/(1-lambda)}, FU (q + lambda q_u)_+, LU q exp(+lambda q_u)) raises the forget mass."""
    name, broken = BROKEN_TARGETS[formulation]
    monkeypatch.setattr(method, name, broken)
    assert not forget_mass_strictly_decreasing(reference["problem"], formulation, lams)


# ------------------------------------------------------------------------------------------------
# (a)4 Grid KL
# ------------------------------------------------------------------------------------------------

def test_grid_kl_exact_values():
    grid = method.Grid.regular(-15, 15, 30001, 1)
    x = grid.points[:, 0]
    p = gaussian_1d(x, 0, 1)
    assert method.kl_density(p, np.log(gaussian_1d(x, 1, 1)), grid.cell) == pytest.approx(0.5, abs=1e-4)
    assert method.kl_density(p, np.log(p), grid.cell) == 0.0
    # Negative control: a different variance is not 0.5 nats away.
    assert abs(method.kl_density(p, np.log(gaussian_1d(x, 1, 2)), grid.cell) - 0.5) > 1e-2


# ------------------------------------------------------------------------------------------------
# (a)5 The 1-D reference values
# ------------------------------------------------------------------------------------------------

def test_reference_lambda_star(reference):
    assert reference["ru", 0.05][0] == pytest.approx(0.0376, rel=0.01)
    assert reference["fu", 0.05][0] == pytest.approx(0.209, rel=0.01)
    assert reference["lu", 0.05][0] == pytest.approx(4.89, rel=0.01)
    # Negative control: RU without the 1/(1 - lambda) exponent needs a different lambda.
    problem = reference["problem"]

    def wrong_gap(lam: float) -> float:
        p = method.normalise_log(problem.log_q - lam * problem.log_qu, problem.cell)
        return method.mass(p, problem.forget_mask, problem.cell) - 0.05

    from scipy.optimize import brentq

    assert abs(brentq(wrong_gap, 0, 0.99) / 0.0376 - 1) > 0.01


def test_reference_retained_kl(reference):
    ru, fu, lu = (retained(reference, f) for f in method.FORMULATIONS)
    assert ru == pytest.approx(0.52, rel=0.05)
    assert lu < 5e-4
    assert lu < 0.5 * fu
    assert fu < ru
    assert retained(reference, "ru", 0.01) > 1.0
    assert retained(reference, "lu", 0.01) < 0.002
    problem = reference["problem"]
    assert method.mass(reference["ru", 0.05][1], reference["far"], problem.cell) == pytest.approx(0.69, abs=0.01)
    # Negative control: the KL taken on the whole line (no renormalisation on the retained region) is not 0.52.
    whole = method.kl_density(reference["ru", 0.05][1], np.log(reference["q"]), problem.cell)
    assert abs(whole / 0.52 - 1) > 0.05


# ------------------------------------------------------------------------------------------------
# The 1-D reference numbers (claims C4c-f, C5d-f) against the continuous closed form
# ------------------------------------------------------------------------------------------------
# The brief's 1-D problem written out here without the library: q = equal mixture of N(m, 0.7^2), m in
# {-6, -2, 2, 6}, on [-12, 12]; q_u = N(2, 0.7^2); forget region |x - 2| < 1.4. Integrals by adaptive
# quadrature (scipy.integrate.quad), lambda* by root finding. The library works on a 24,001-point grid, so the
# two agree to the grid's discretisation (measured: lambda* within 5e-4 relative, retained KL within 0.4%).

REF_SIGMA, REF_MODES, REF_HALF_WIDTH, REF_FORGET = 0.7, (-6.0, -2.0, 2.0, 6.0), 12.0, 2.0
REF_RADIUS = 2 * REF_SIGMA
REF_BREAKS = (-6.0, -2.0, REF_FORGET - REF_RADIUS, REF_FORGET, REF_FORGET + REF_RADIUS, 6.0)


def _normal_pdf(x: float, mean: float) -> float:
    return math.exp(-(x - mean) ** 2 / (2 * REF_SIGMA**2)) / (REF_SIGMA * math.sqrt(2 * math.pi))


def _q(x: float) -> float:
    return sum(_normal_pdf(x, m) for m in REF_MODES) / len(REF_MODES)


def _continuous_target(formulation: str, lam: float):
    """Unnormalised Lagrangian minimisers (brief, "Method"): RU (q / q_u^lam)^(1/(1-lam)), FU (q - lam q_u)_+,
    LU q exp(-lam q_u)."""
    if formulation == "ru":
        return lambda x: math.exp((math.log(_q(x)) - lam * math.log(_normal_pdf(x, REF_FORGET))) / (1 - lam))
    if formulation == "fu":
        return lambda x: max(_q(x) - lam * _normal_pdf(x, REF_FORGET), 0.0)
    return lambda x: _q(x) * math.exp(-lam * _normal_pdf(x, REF_FORGET))


def _integral(g, low: float, high: float) -> float:
    points = [b for b in REF_BREAKS if low < b < high] or None
    return integrate.quad(g, low, high, points=points, limit=400, epsabs=1e-14, epsrel=1e-12)[0]


def _retained_parts(g) -> float:
    return (_integral(g, -REF_HALF_WIDTH, REF_FORGET - REF_RADIUS)
            + _integral(g, REF_FORGET + REF_RADIUS, REF_HALF_WIDTH))


def continuous_lambda_star(formulation: str, forget_mass: float) -> float:
    def gap(lam: float) -> float:
        g = _continuous_target(formulation, lam)
        inside = _integral(g, REF_FORGET - REF_RADIUS, REF_FORGET + REF_RADIUS)
        return inside / (inside + _retained_parts(g)) - forget_mass

    high = {"ru": 0.3, "fu": 0.249, "lu": 50.0}[formulation]
    return float(optimize.brentq(gap, 0.0, high, xtol=1e-14))


def continuous_retained_kl(formulation: str, lam: float) -> float:
    """KL(p_R || q_R), both renormalised on the complement R of the forget region."""
    g = _continuous_target(formulation, lam)
    z_p, z_q = _retained_parts(g), _retained_parts(_q)

    def integrand(x: float) -> float:
        p = g(x) / z_p
        return p * math.log(p / (_q(x) / z_q)) if p > 0 else 0.0

    return _retained_parts(integrand)


REF_CASES = [(f, m, tag) for m, tag in ((0.05, ""), (0.01, "_1pct")) for f in method.FORMULATIONS]


@pytest.fixture(scope="module")
def continuous_reference():
    out = {}
    for f, m, tag in REF_CASES:
        lam = continuous_lambda_star(f, m)
        out[f"ref1d_lambda_{f}{tag}"] = lam
        out[f"ref1d_retained_kl_{f}{tag}"] = continuous_retained_kl(f, lam)
    return out


def test_reference_1d_lambda_star_exact(continuous_reference, monkeypatch):
    """Claims C5d-f (references): evaluate.py's lambda* at 5% forget mass (and at 1%) equal the continuous
    closed form to 1e-3 relative, and lie in the brief's +-1% bands (RU 0.0376, FU 0.209, LU 4.89). Negative
    control: the library's RU target without the 1/(1 - lambda) exponent misses the closed-form lambda*_RU."""
    metrics = evaluate.reference_1d()
    for f, _, tag in REF_CASES:
        key = f"ref1d_lambda_{f}{tag}"
        assert metrics[key] == pytest.approx(continuous_reference[key], rel=1e-3), key
    assert metrics["ref1d_lambda_ru"] == pytest.approx(0.037634, abs=1e-6)
    assert metrics["ref1d_lambda_fu"] == pytest.approx(0.208593, abs=1e-6)
    assert metrics["ref1d_lambda_lu"] == pytest.approx(4.89337, abs=1e-5)
    for key, brief in (("ref1d_lambda_ru", 0.0376), ("ref1d_lambda_fu", 0.209), ("ref1d_lambda_lu", 4.89)):
        assert abs(metrics[key] / brief - 1) <= 0.01
    monkeypatch.setattr(method, "ru_log_target", lambda log_q, log_qu, lam: log_q - lam * log_qu)
    broken = evaluate.reference_1d()
    assert abs(broken["ref1d_lambda_ru"] / continuous_reference["ref1d_lambda_ru"] - 1) > 0.01


def test_reference_1d_retained_kl_exact(continuous_reference, monkeypatch):
    """Claims C4c-f (references): evaluate.py's retained-region KL at lambda* equals the continuous closed
    form to 1% (RU 0.5201 and 1.0836 at 5% and 1% forget mass, LU 3.34e-4 and 1.53e-3), inside the brief's
    bands. Negative control: the KL over the whole line (no renormalisation on the retained region) misses it."""
    metrics = evaluate.reference_1d()
    for f, _, tag in REF_CASES:
        key = f"ref1d_retained_kl_{f}{tag}"
        assert metrics[key] == pytest.approx(continuous_reference[key], rel=1e-2), key
    assert metrics["ref1d_retained_kl_ru"] == pytest.approx(0.52009, abs=1e-5)
    assert metrics["ref1d_retained_kl_ru_1pct"] == pytest.approx(1.08361, abs=1e-5)
    assert 0.494 <= metrics["ref1d_retained_kl_ru"] <= 0.546
    assert metrics["ref1d_retained_kl_lu"] < 5e-4 and metrics["ref1d_retained_kl_lu_1pct"] < 0.002
    assert metrics["ref1d_retained_kl_ru_1pct"] > 1.0

    def whole_line_kl(p, q, forget_mask, cell):
        return method.kl_density(p, np.log(q), cell)

    monkeypatch.setattr(method, "retained_kl", whole_line_kl)
    broken = evaluate.reference_1d()
    assert abs(broken["ref1d_retained_kl_ru"] / continuous_reference["ref1d_retained_kl_ru"] - 1) > 0.05


# ------------------------------------------------------------------------------------------------
# (a)6 Primal-dual on the 2-D grid
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def grid_2d():
    cfg = cpu_config()
    q, forget, close = data.mixture_from_table(data.mixture_table(cfg.mixture, seed=0))
    grid, problem = data.grid_problem(q, forget, cfg.grid)
    return cfg, grid, problem, close


def _closed_form(problem, f, mass_target):
    lam = method.lambda_for_forget_mass(f, problem, mass_target)
    p = method.target(f, problem, lam)
    return lam, p, method.constraint_value(f, p, problem)


@pytest.mark.parametrize("formulation", method.FORMULATIONS)
def test_primal_dual_grid_recovers_the_closed_form(grid_2d, formulation):
    """Claims C1a-i (mechanism checks of the dual loop): with the threshold set from the requested forget mass
    (never from the optimum) and the one normalised dual step shared by RU, FU and LU, the grid iterates reach
    the constrained optimum (TV), its dual variable lambda_b and an active constraint, lambda never negative."""
    cfg, _, problem, _ = grid_2d
    optimum = constrained_optimum(formulation, problem, cfg.grid.target_forget_mass)
    dual_lr = optimum.dual_lr(cfg.grid.dual_step)
    run = method.primal_dual_grid(formulation, problem, optimum.bound, cfg.grid.iterations, cfg.grid.primal_step,
                                  dual_lr)
    assert method.tv_distance(run.p, optimum.p, problem.cell) < 1e-3
    assert abs(run.lam - optimum.lam) / optimum.lam < 0.01
    assert abs(run.slack) < 1e-3
    assert min(run.lambdas) >= 0
    # The threshold is not the answer's: bisection on the active constraint reaches it exactly, and it is the
    # requested-mass reference's constraint value.
    assert method.violation(formulation, method.constraint_value(formulation, optimum.p, problem),
                            optimum.bound) == pytest.approx(0.0, abs=1e-9)
    reference_p = method.requested_mass_reference(problem, cfg.grid.target_forget_mass)
    assert optimum.bound == method.constraint_value(formulation, reference_p, problem)
    # Negative control: a dual step with the wrong sign never satisfies the constraint.
    wrong = method.primal_dual_grid(formulation, problem, optimum.bound, cfg.grid.iterations, cfg.grid.primal_step,
                                    dual_lr, dual_update=lambda lam, g, lr: max(0.0, lam - lr * g))
    assert abs(wrong.slack) > 1e-3


def test_one_dual_step_would_fail_without_the_normalisation(grid_2d):
    """Item 3 (one dual rule): the normalised rule converges for all three formulations with one dual_step;
    the same number used as a raw learning rate (no normalisation) misses lambda_b by far for at least one of
    them within the same iterations (negative control: the normalisation is what makes one step serve all)."""
    cfg, _, problem, _ = grid_2d
    raw_errors = []
    for f in method.FORMULATIONS:
        optimum = constrained_optimum(f, problem, cfg.grid.target_forget_mass)
        raw = method.primal_dual_grid(f, problem, optimum.bound, cfg.grid.iterations, cfg.grid.primal_step,
                                      cfg.grid.dual_step)
        raw_errors.append(abs(raw.lam - optimum.lam) / optimum.lam)
    assert max(raw_errors) > 0.1


def test_requested_mass_reference_exact():
    """The requested-mass reference on a hand-made 4-cell grid: q = (0.1, 0.2, 0.3, 0.4), forget region cells
    0 and 1 (mass 0.3); request 0.15: the forget cells halve, the rest scale by 0.85 / 0.7; the bounds are the
    constraints at that reference (LU: E_p[q_u] by hand). Negative control: the optimum's own constraint value
    (the former rule) is a different number."""
    q = np.array([0.1, 0.2, 0.3, 0.4])
    qu = np.array([0.5, 0.3, 0.15, 0.05])
    problem = method.GridProblem(np.log(q), np.log(qu), 1.0, np.array([True, True, False, False]))
    ref = method.requested_mass_reference(problem, 0.15)
    np.testing.assert_allclose(ref, [0.05, 0.1, 0.3 * 0.85 / 0.7, 0.4 * 0.85 / 0.7], rtol=1e-12)
    expected_eps = 0.05 * 0.5 + 0.1 * 0.3 + 0.3 * 0.85 / 0.7 * 0.15 + 0.4 * 0.85 / 0.7 * 0.05
    assert method.bound_for_forget_mass("lu", problem, 0.15) == pytest.approx(expected_eps, rel=1e-12)
    lam = method.lambda_for_bound("lu", problem, expected_eps)
    p = method.lu_target(problem, lam)
    assert method.expectation(p, qu, 1.0) == pytest.approx(expected_eps, rel=1e-9)
    assert method.mass(p, problem.forget_mask, 1.0) != pytest.approx(0.15, abs=1e-3)
    with pytest.raises(ValueError, match="requested forget mass must be in"):
        method.requested_mass_reference(problem, 0.5)
    with pytest.raises(ValueError, match="already holds at lambda = 0"):
        method.lambda_for_bound("lu", problem, 1.0)


def test_normalised_dual_lr_exact():
    """lambda <- lambda + step g / g0^2: nu = lambda |g0| moves by step * g / |g0| (hand values)."""
    assert method.normalised_dual_lr(0.01, 0.5) == pytest.approx(0.04)
    assert method.normalised_dual_lr(0.01, -2.0) == pytest.approx(0.0025)
    lam = method.projected_dual_ascent(0.0, 0.5, method.normalised_dual_lr(0.01, 0.5))
    assert lam * 0.5 == pytest.approx(0.01)  # nu after one step at the start violation = dual_step
    with pytest.raises(ValueError):
        method.normalised_dual_lr(0.01, 0.0)


CPU_SEEDS = paper_seeds("constrained_unlearning", params_section("constrained_unlearning"))["cpu"]


@pytest.mark.parametrize("seed", CPU_SEEDS)
def test_lu_retains_better_than_ru_at_matched_forget_mass(seed):
    """Claim C4a (reference): on the 2-D grid of each cpu seed's mixture (the seed draws the ring's phase and the
    mode weights), the closed-form LU optimum's retained-region KL is < 0.5 x RU's at the target forget mass.
    Negative control: with the formulations swapped the check fails, so it is not satisfied by construction; and
    RU's retained KL is far above the zero of no unlearning (lambda = 0), where the ratio would be rounding."""
    cfg = cpu_config()
    q_mix, forget, _ = data.mixture_from_table(data.mixture_table(cfg.mixture, seed=seed))
    _, problem = data.grid_problem(q_mix, forget, cfg.grid)
    q = method.normalise(problem.q, problem.cell)
    target = cfg.grid.target_forget_mass
    kls = {f: method.retained_kl(_closed_form(problem, f, target)[1], q, problem.forget_mask, problem.cell)
           for f in ("ru", "lu")}
    assert kls["lu"] < 0.5 * kls["ru"]
    assert not kls["ru"] < 0.5 * kls["lu"]
    # RU's damage is real (not rounding): at zero unlearning both retained KLs are float rounding around 0.
    assert kls["ru"] > 1e-3
    zero = {f: method.retained_kl(method.target(f, problem, 0.0), q, problem.forget_mask, problem.cell)
            for f in ("ru", "lu")}
    assert max(abs(v) for v in zero.values()) < 1e-12


def test_lambda_for_forget_mass_rejects_unreachable_targets(reference):
    with pytest.raises(ValueError, match="target forget mass must be in"):
        method.lambda_for_forget_mass("lu", reference["problem"], 0.5)


def test_ru_target_rejects_lambda_sum_at_least_one(reference):
    problem = reference["problem"]
    with pytest.raises(ValueError, match="sum\\(lambda\\) < 1"):
        method.ru_log_target(problem.log_q, np.stack([problem.log_qu, problem.log_qu]), [0.6, 0.5])


def test_multi_constraint_targets_reduce_to_single(reference):
    problem = reference["problem"]
    two = np.stack([problem.log_qu, problem.log_qu])
    np.testing.assert_allclose(method.ru_log_target(problem.log_q, two, [0.1, 0.1]),
                               method.ru_log_target(problem.log_q, problem.log_qu, 0.2), atol=1e-12)
    np.testing.assert_allclose(method.lu_log_target(problem.log_q, np.exp(two), [1.0, 2.0]),
                               method.lu_log_target(problem.log_q, problem.qu, 3.0), atol=1e-12)


# ------------------------------------------------------------------------------------------------
# Sample-based pieces of Stage B
# ------------------------------------------------------------------------------------------------

def test_importance_weights_are_the_density_ratio():
    rng = np.random.default_rng(0)
    q = GaussianMixture(np.array([[0.0, 0.0], [3.0, 0.0]]), np.array([0.5, 0.5]), 0.5)
    forget = single_gaussian(np.array([3.0, 0.0]), 0.5)
    x = q.sample(500, rng)
    log_q, log_qu = q.log_density(x), forget.log_density(x)
    np.testing.assert_allclose(method.importance_weights("lu", log_q, log_qu, 0.0), 1.0, rtol=1e-12)
    w = method.importance_weights("lu", log_q, log_qu, 2.0)
    expected = np.exp(-2.0 * np.exp(log_qu))
    np.testing.assert_allclose(w, expected * len(x) / expected.sum(), rtol=1e-10)
    # FU at lambda = the forget weight: the weights are the retained component's share, 0.5 N_0 / q.
    w_fu = method.importance_weights("fu", log_q, log_qu, 0.5)
    retained_share = 0.5 * single_gaussian(np.zeros(2), 0.5).density(x) / np.exp(log_q)
    np.testing.assert_allclose(w_fu, retained_share * len(x) / retained_share.sum(), rtol=1e-6, atol=1e-9)
    # Negative control: the LU weights at the same lambda are not the retained share.
    assert not np.allclose(method.importance_weights("lu", log_q, log_qu, 0.5), w_fu, rtol=1e-2)
    assert method.importance_weights("ru", log_q, log_qu, 0.1).mean() == pytest.approx(1.0)


def test_knn_estimators_match_gaussian_closed_forms():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4000, 2))
    b = 1.0 + rng.standard_normal((4000, 2))
    entropy = math.log(2 * math.pi * math.e)  # N(0, I_2)
    assert method.knn_entropy(a, 5) == pytest.approx(entropy, abs=0.05)
    assert method.knn_kl(a, b, 5) == pytest.approx(1.0, abs=0.1)  # KL = |mu|^2 / 2 = 1
    # Negative control: identical distributions give (nearly) zero, not 1.
    assert abs(method.knn_kl(a, rng.standard_normal((4000, 2)), 5)) < 0.1


def test_sample_constraint_values_on_exact_samples():
    rng = np.random.default_rng(1)
    forget = single_gaussian(np.array([2.0, 0.0]), 0.5)
    model = rng.standard_normal((3000, 2))  # p = N(0, I)
    # KL(N(0, I) || N(m, s^2 I)) = 0.5 * (d/s^2 + |m|^2/s^2 - d + d log s^2), d = 2
    exact_kl = 0.5 * (2 / 0.25 + 4 / 0.25 - 2 + 2 * math.log(0.25))
    value = method.sample_constraint_value("ru", model, forget.log_density, forget.sample(3000, rng))
    assert value == pytest.approx(exact_kl, rel=0.02)
    lu = method.sample_constraint_value("lu", model, forget.log_density, forget.sample(10, rng))
    assert lu == pytest.approx(float(np.mean(forget.density(model))), rel=1e-12)


def test_noised_mixture_score_matches_finite_differences():
    q = GaussianMixture(np.array([[0.0, 0.0], [2.0, 1.0]]), np.array([0.3, 0.7]), 0.4)
    abar = 0.6
    noised = GaussianMixture(q.means * math.sqrt(abar), q.weights, math.sqrt(abar * 0.16 + 1 - abar))
    x = np.array([[0.3, -0.2], [1.5, 1.1]])
    h = 1e-5
    fd = np.stack([(noised.log_density(x + h * e) - noised.log_density(x - h * e)) / (2 * h)
                   for e in np.eye(2)], axis=1)
    score = q.noised_score_torch(torch.tensor(x), torch.full((2,), abar, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(score, fd, atol=1e-6)


def test_histogram_retained_kl_floor_and_shift():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4000, 2)), rng.standard_normal((8000, 2))
    same = method.histogram_retained_kl(a, b, np.array([5.0, 5.0]), 0.5, 16, 4.0)
    shifted = method.histogram_retained_kl(a + [1.5, 0.0], b, np.array([5.0, 5.0]), 0.5, 16, 4.0)
    assert same < 0.05  # sampling floor of 4000 vs 8000 samples on 16 x 16 bins (about 0.035)
    assert shifted > 0.5


def test_esd_target_and_loss_mixing_reduce_to_the_plain_objectives():
    schedule = diffusion.NoiseSchedule.linear(10)
    model = diffusion.build_model(8, 1, 4, 10, seed=0)
    forget = single_gaussian(np.array([1.0, 0.0]), 0.5)
    x_t = torch.randn((6, 2), generator=torch.Generator().manual_seed(0))
    t = torch.arange(6) % 10
    torch.testing.assert_close(baselines.esd_epsilon_target(model, forget, schedule, x_t, t, 0.0), model(x_t, t))
    guided = baselines.esd_epsilon_target(model, forget, schedule, x_t, t, 2.0)
    assert not torch.allclose(guided, model(x_t, t))
    pool = torch.randn((32, 2), generator=torch.Generator().manual_seed(1))
    mixed = baselines.loss_mixing_loss(model, schedule, pool, pool, 0.0, 16)(torch.Generator().manual_seed(3))
    plain_gen = torch.Generator().manual_seed(3)
    plain = diffusion.dsm_loss(model, pool[torch.randint(0, 32, (16,), generator=plain_gen)], schedule, plain_gen)
    torch.testing.assert_close(mixed, plain)


def test_dsm_weights_of_one_equal_the_plain_loss_and_weights_round_trip(tmp_path):
    schedule = diffusion.NoiseSchedule.linear(20)
    model = diffusion.build_model(16, 2, 8, 20, seed=1)
    x0 = torch.randn((64, 2), generator=torch.Generator().manual_seed(0))
    plain = diffusion.dsm_loss(model, x0, schedule, torch.Generator().manual_seed(5))
    weighted = diffusion.dsm_loss(model, x0, schedule, torch.Generator().manual_seed(5), torch.full((64,), 3.0))
    torch.testing.assert_close(plain, weighted)
    path = save_state_dict(model, tmp_path / "m.safetensors")
    twin = load_state_dict(diffusion.build_model(16, 2, 8, 20, seed=2), path)
    t0 = torch.zeros(64, dtype=torch.long)
    torch.testing.assert_close(twin(x0, t0), model(x0, t0))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


# ------------------------------------------------------------------------------------------------
# Data unlearning (FU) with duplicated forget points (Stage C, claim C3)
# ------------------------------------------------------------------------------------------------

def test_near_fraction_on_exact_samples():
    points = np.array([[0.0, 0.0], [5.0, 5.0]])
    samples = np.array([[0.05, 0.0], [5.0, 5.09], [0.0, 0.2], [3.0, 3.0], [np.nan, 0.0]])
    assert method.near_fraction(samples, points, 0.1) == pytest.approx(2 / 5)
    assert method.near_fraction(samples, points, 0.25) == pytest.approx(3 / 5)
    # strictly inside: a sample exactly on the sphere does not count
    assert method.near_fraction(np.array([[0.1, 0.0]]), points, 0.1) == 0.0
    with pytest.raises(ValueError, match="radius"):
        method.near_fraction(samples, points, 0.0)


def test_memorisation_proxy_separates_a_memorising_sampler_from_a_density_sampler():
    """Exact samplers: q = N(0, I) held fixed; forget point f and held-out twin -f have the same q-density. A
    sampler that puts 5% of its mass on f is flagged (ratio well above 2); q itself is not (ratio near 1).
    Negative control: the memorising sampler's ratio fails the <= 1.5 check of C3b."""
    rng = np.random.default_rng(0)
    f, h = np.array([[0.7, 0.3]]), np.array([[-0.7, -0.3]])
    radius = 0.1
    clean = rng.standard_normal((40_000, 2))
    memorising = clean.copy()
    memorising[:2_000] = f + 0.02 * rng.standard_normal((2_000, 2))
    ratios = {}
    for name, s in (("clean", clean), ("memorising", memorising)):
        near_f, near_h = method.near_fraction(s, f, radius), method.near_fraction(s, h, radius)
        ratios[name] = method.memorisation_ratio(near_f, near_h, len(s))
    assert 0.7 < ratios["clean"] < 1.3
    assert ratios["memorising"] > 2.0 and not ratios["memorising"] <= 1.5
    # the held-out floor of one sample keeps the ratio finite
    assert method.memorisation_ratio(0.01, 0.0, 1000) == pytest.approx(10.0)


def test_duplicated_points_have_equal_density_and_are_counted_in_the_training_set():
    q, _, _ = data.mixture_from_table(data.mixture_table(cpu_config().mixture, 0))
    forget_pts, heldout_pts = data.duplicated_forget_points(q, 7, 0.6, seed=3)
    centres = q.means[1:8]
    np.testing.assert_allclose(np.linalg.norm(forget_pts - centres, axis=1), 0.6)
    np.testing.assert_allclose(forget_pts + heldout_pts, 2 * centres)  # reflections through the mode centre
    np.testing.assert_allclose(q.density(forget_pts), q.density(heldout_pts), rtol=1e-3)
    assert not np.allclose(forget_pts, heldout_pts)
    with pytest.raises(ValueError, match="n_points"):
        data.duplicated_forget_points(q, 8, 0.6, seed=3)  # the forget mode (0) is never used
    pool = np.zeros((100, 2))
    points, is_forget = data.duplicated_training_set(pool, forget_pts[:3], 20)
    assert points.shape == (160, 2) and is_forget.sum() == 60 and not is_forget[:100].any()
    for p in forget_pts[:3]:
        assert np.sum(np.all(points == p, axis=1)) == 20


def test_empirical_fu_weights_are_retain_only_training_at_lambda_equal_share():
    """FU on the atoms of the training set: weight (1 - lambda / w)_+ on forget copies and 1 elsewhere, so at
    lambda = w (and beyond) the primal loss is DSM on the retained points only. Negative control: lambda = 0
    keeps the forget copies at full weight."""
    is_forget = np.zeros(100, dtype=bool)
    is_forget[80:] = True
    w = 0.2
    log_q, log_qu = method.empirical_log_masses(is_forget)
    for lam in (w, 2 * w):
        weights = method.importance_weights("fu", log_q, log_qu, lam)
        assert np.all(weights[80:] == 0) and np.allclose(weights[:80], 100 / 80)
    half = method.importance_weights("fu", log_q, log_qu, w / 2)
    assert half[85] / half[0] == pytest.approx(0.5)
    none = method.importance_weights("fu", log_q, log_qu, 0.0)
    np.testing.assert_allclose(none, 1.0)
    with pytest.raises(ValueError, match="forget copy"):
        method.empirical_log_masses(np.zeros(5, dtype=bool))


def test_histogram_retained_kl_accepts_several_forget_centres():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4000, 2)), rng.standard_normal((8000, 2))
    one = method.histogram_retained_kl(a, b, np.array([5.0, 5.0]), 0.5, 16, 4.0)
    same = method.histogram_retained_kl(a, b, np.array([[5.0, 5.0]]), 0.5, 16, 4.0)
    assert one == same
    # a spike at two excluded centres is invisible; the same spike outside them is not
    spiked = a.copy()
    spiked[:400] = np.repeat([[1.0, 1.0], [-1.0, 1.0]], 200, axis=0)
    centres = np.array([[1.0, 1.0], [-1.0, 1.0]])
    assert method.histogram_retained_kl(spiked, b, centres, 0.2, 16, 4.0) < 0.06
    assert method.histogram_retained_kl(spiked, b, np.array([[5.0, 5.0]]), 0.2, 16, 4.0) > 0.1
