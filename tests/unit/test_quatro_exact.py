"""quatro method: exact values where test_quatro_method.py's inputs could not tell a right formula from a wrong one
(issue 20, survivors of the first full mutation run: old log-probs of 0, advantages of +-1, one group, converged
bisections that hide the floor / ceiling rules), each with a negative control that breaks the library."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.quatro import method

F64 = torch.float64
# A check fails by an assertion, by a pytest.raises that saw nothing, or by a ValueError it did not expect.
CHECK_FAILED = (AssertionError, pytest.fail.Exception, ValueError)


def centred(rewards) -> torch.Tensor:
    r = torch.tensor(rewards, dtype=F64)
    return r - r.mean()


# ---------------------------------------------------------------------------------------------------------------
# exact_response_kl: float64 arithmetic, the 1e-3 mass tolerance, which table is incomplete
# ---------------------------------------------------------------------------------------------------------------

def check_exact_kl_float32_inputs_and_tolerance() -> None:
    p = torch.tensor([[0.15, 0.35, 0.5], [0.6, 0.3, 0.1]])  # float32 log-probs, not dyadic
    q = torch.tensor([[0.3, 0.3, 0.4], [0.2, 0.2, 0.6]])
    kl = method.exact_response_kl(p.log(), q.log())
    reference = method.exact_response_kl(p.log().double(), q.log().double())   # the same float32 values, in float64
    assert kl.dtype == F64 and torch.equal(kl, reference)
    # a table whose rows sum to 1 + 5e-4 (float32 rounding of a model's output) is accepted, 1 + 2e-3 is not
    loose = torch.tensor([[0.3, 0.7005]], dtype=F64)
    half = torch.tensor([[0.5, 0.5]], dtype=F64)
    by_hand = 0.3 * math.log(0.3 / 0.5) + 0.7005 * math.log(0.7005 / 0.5)
    assert float(method.exact_response_kl(loose.log(), half.log())) == pytest.approx(by_hand, abs=1e-15)
    with pytest.raises(ValueError, match="complete distributions"):
        method.exact_response_kl(torch.tensor([[0.3, 0.702]], dtype=F64).log(), half.log())


def test_exact_kl_float32_inputs_are_computed_in_float64_and_the_mass_tolerance_is_1e_3():
    check_exact_kl_float32_inputs_and_tolerance()


def test_negative_control_input_precision_is_caught(monkeypatch):
    monkeypatch.setattr(method, "exact_response_kl",
                        lambda new, old: (new.exp() * (new - old)).sum(dim=1).double())
    with pytest.raises(CHECK_FAILED):
        check_exact_kl_float32_inputs_and_tolerance()


def test_negative_control_default_allclose_tolerance_is_caught(monkeypatch):
    real = method.exact_response_kl

    def strict(new, old):
        for table in (new, old):
            mass = torch.logsumexp(table.double(), dim=1).exp()
            if not bool(torch.allclose(mass, torch.ones_like(mass))):
                raise ValueError("rows are not complete distributions")
        return real(new, old)
    monkeypatch.setattr(method, "exact_response_kl", strict)
    with pytest.raises(CHECK_FAILED):
        check_exact_kl_float32_inputs_and_tolerance()


def check_exact_kl_names_the_incomplete_table() -> None:
    good, bad = torch.tensor([[0.5, 0.5]], dtype=F64).log(), torch.tensor([[0.5, 0.2]], dtype=F64).log()
    with pytest.raises(ValueError, match=r"^new rows are not complete"):
        method.exact_response_kl(bad, good)
    with pytest.raises(ValueError, match=r"^behaviour rows are not complete"):
        method.exact_response_kl(good, bad)


def test_exact_kl_error_names_the_incomplete_table():
    check_exact_kl_names_the_incomplete_table()


def test_negative_control_unnamed_table_is_caught(monkeypatch):
    real = method.exact_response_kl

    def unnamed(new, old):
        try:
            return real(new, old)
        except ValueError as error:
            raise ValueError(str(error).split(" ", 1)[1]) from None
    monkeypatch.setattr(method, "exact_response_kl", unnamed)
    with pytest.raises(CHECK_FAILED):
        check_exact_kl_names_the_incomplete_table()


# ---------------------------------------------------------------------------------------------------------------
# The duals: argument checks, floor / ceiling / tie rules shown with a 2-step bisection (60 or 100 halvings converge
# to the bracket's ends and hide them), float32 advantages, the default number of halvings
# ---------------------------------------------------------------------------------------------------------------

def check_dual_argument_checks() -> None:
    adv = centred((1, 0, 0))
    for bad in (dict(lam_min=0.0), dict(lam_min=2.0, lam_max=2.0)):
        with pytest.raises(ValueError, match="lam_min"):
            method.solve_dual_bisection(adv, 0.05, **bad)
        with pytest.raises(ValueError, match="lam_min"):
            method.group_duals(adv, 3, 0.05, **bad)
    for delta in (0.0, -0.1):
        with pytest.raises(ValueError, match="delta"):
            method.solve_dual_bisection(adv, delta)
        with pytest.raises(ValueError, match="delta"):
            method.group_duals(adv, 3, delta)
    # groups of two are valid (GRPO's smallest group): the same lambda* as the scalar bisection
    pair = centred((1, 0))
    assert float(method.group_duals(pair, 2, 0.05)[0]) == pytest.approx(method.solve_dual_bisection(pair, 0.05),
                                                                        rel=1e-12)
    # a group of one response is a constant group: skipped
    assert method.is_degenerate(torch.tensor([0.7], dtype=F64))
    assert method.solve_dual_bisection(torch.tensor([0.7], dtype=F64), 0.05) == 0.0


def test_dual_argument_checks_and_smallest_groups():
    check_dual_argument_checks()


def test_negative_control_missing_lam_min_check_is_caught(monkeypatch):
    real = method.solve_dual_bisection
    monkeypatch.setattr(method, "solve_dual_bisection",
                        lambda adv, delta, lam_min=1e-3, lam_max=1e3, iters=100:
                        real(adv, delta, lam_min=max(lam_min, 1e-6), lam_max=lam_max + 1.0, iters=iters))
    with pytest.raises(CHECK_FAILED):
        check_dual_argument_checks()


def test_negative_control_groups_of_two_refused_is_caught(monkeypatch):
    real = method.group_duals

    def three_or_more(adv, group_size, delta, **kw):
        if group_size < 3:
            raise ValueError("groups of size >= 3")
        return real(adv, group_size, delta, **kw)
    monkeypatch.setattr(method, "group_duals", three_or_more)
    with pytest.raises(CHECK_FAILED):
        check_dual_argument_checks()


def test_negative_control_one_response_group_not_degenerate_is_caught(monkeypatch):
    monkeypatch.setattr(method, "is_degenerate", lambda a: a.numel() > 1 and bool((a == a[1]).all()))
    with pytest.raises(CHECK_FAILED):
        check_dual_argument_checks()


def both_solvers(adv: torch.Tensor, delta: float, **kw) -> tuple[float, float]:
    return method.solve_dual_bisection(adv, delta, **kw), float(method.group_duals(adv, adv.numel(), delta, **kw)[0])


def check_floor_ceiling_and_ties() -> None:
    one_of_two, one_of_eight = centred((1, 0)), centred((1, 0, 0, 0, 0, 0, 0, 0))
    lo, hi = math.log(1e-3), math.log(1e3)
    # floor because KL(lam_min) = 0.111 <= delta = 0.5 < log 2: exactly lam_min even after 2 halvings
    assert both_solvers(one_of_two, 0.5, lam_min=1.0, iters=2) == (1.0, 1.0)
    # floor because delta = log(G / n_max) exactly: two of three share the maximum, and KL(lam_min) rounds one ulp
    # above log(3/2), so only the feasibility-limit rule (>=) puts it on the floor
    two_of_three = torch.tensor([0.6, 0.6, -1.2], dtype=F64)
    assert float(method.tilted_kl(two_of_three, 1e-3)) > math.log(1.5), "precondition: KL(lam_min) rounds above"
    assert both_solvers(two_of_three, math.log(1.5)) == (1e-3, 1e-3)
    # floor when delta equals KL(lam_min) to the last bit (<=)
    at_floor = float(method.tilted_kl(one_of_eight, 0.05))
    assert float(method.tilted_kl(one_of_eight.reshape(1, -1), 0.05)) == at_floor
    assert both_solvers(one_of_eight, at_floor, lam_min=0.05, iters=2) == (0.05, 0.05)
    # ceiling because KL(lam_max) > delta: exactly lam_max after 2 halvings
    huge = torch.tensor([7e3] + [-1e3] * 7, dtype=F64)
    assert both_solvers(huge, 0.05, iters=2) == (1e3, 1e3)
    # delta equal to KL(lam_max) is not the ceiling (>): two halvings from below, lambda = lam_min^(1/8) lam_max^(7/8)
    at_ceiling = float(method.tilted_kl(one_of_eight, 10.0))
    assert float(method.tilted_kl(one_of_eight.reshape(1, -1), 10.0)) == at_ceiling
    expected = 1e-3 ** (1 / 8) * 10.0 ** (7 / 8)
    assert both_solvers(one_of_eight, at_ceiling, lam_max=10.0, iters=2) == pytest.approx((expected, expected),
                                                                                          rel=1e-12)
    # a tie at the first midpoint (KL(1) == delta) is not "too far": high moves down,
    # lambda = lam_min^(5/8) lam_max^(3/8)
    tie_scalar = float(method.tilted_kl(one_of_eight, math.exp(0.5 * (lo + hi))))
    mid = 0.5 * (torch.full((1,), lo, dtype=F64) + torch.full((1,), hi, dtype=F64))
    tie_vector = float(method.tilted_kl(one_of_eight.reshape(1, -1), torch.exp(mid).unsqueeze(1)))
    expected = 1e-3 ** (5 / 8) * 1e3 ** (3 / 8)
    assert method.solve_dual_bisection(one_of_eight, tie_scalar, iters=2) == pytest.approx(expected, rel=1e-12)
    assert float(method.group_duals(one_of_eight, 8, tie_vector, iters=2)[0]) == pytest.approx(expected, rel=1e-12)


def test_floor_ceiling_and_ties_are_exact_for_any_number_of_halvings():
    check_floor_ceiling_and_ties()


def test_negative_control_floor_and_ceiling_left_to_the_bisection_is_caught(monkeypatch):
    """The solvers with the floor / ceiling rules removed: only the bisection (which, converged, lands near them)."""
    def bisection_only(adv, delta, lam_min=1e-3, lam_max=1e3, iters=100):
        adv = adv.reshape(-1)
        if method.is_degenerate(adv):
            return 0.0
        low, high = math.log(lam_min), math.log(lam_max)
        for _ in range(iters):
            mid = 0.5 * (low + high)
            low, high = (mid, high) if float(method.tilted_kl(adv, math.exp(mid))) > delta else (low, mid)
        return math.exp(0.5 * (low + high))
    monkeypatch.setattr(method, "solve_dual_bisection", bisection_only)
    with pytest.raises(CHECK_FAILED):
        check_floor_ceiling_and_ties()


def test_negative_control_tie_counted_as_too_far_is_caught(monkeypatch):
    real = method.group_duals
    monkeypatch.setattr(method, "group_duals", lambda adv, g, delta, **kw: real(adv, g, math.nextafter(delta, 0), **kw))
    with pytest.raises(CHECK_FAILED):
        check_floor_ceiling_and_ties()


def check_group_duals_match_the_scalar_solver_above_small_limits() -> None:
    """delta = 0.2: above log(8/7) (groups with 7 maxima sit on the floor), below log 8 (one maximum: interior)."""
    gen = torch.Generator().manual_seed(3)
    rewards = (torch.rand(12, 8, generator=gen) < 0.4).double()
    rewards[0] = torch.tensor([1.0] + [0.0] * 7)
    rewards[1] = torch.tensor([1.0] * 7 + [0.0])
    adv = (rewards - rewards.mean(dim=1, keepdim=True)).reshape(-1)
    vector = method.group_duals(adv, 8, 0.2)
    assert vector.tolist() == pytest.approx([method.solve_dual_bisection(g, 0.2) for g in adv.reshape(-1, 8)],
                                            rel=1e-10, abs=1e-12)
    assert float(vector[0]) == pytest.approx(0.6992691564185011, rel=1e-9) and float(vector[1]) == 1e-3


def test_group_duals_match_the_scalar_solver_above_small_feasibility_limits():
    check_group_duals_match_the_scalar_solver_above_small_limits()


def test_negative_control_limit_from_the_non_maximal_count_is_caught(monkeypatch):
    real = method.group_duals

    def wrong_limit(adv, group_size, delta, **kw):
        groups = adv.reshape(-1, group_size)
        n_other = (groups != groups.max(dim=1, keepdim=True).values).sum(dim=1)
        out = real(adv, group_size, delta, **kw)
        return torch.where(delta >= torch.log(group_size / n_other.double()), torch.full_like(out, 1e-3), out)
    monkeypatch.setattr(method, "group_duals", wrong_limit)
    with pytest.raises(CHECK_FAILED):
        check_group_duals_match_the_scalar_solver_above_small_limits()


def check_duals_of_float32_advantages() -> None:
    """float32 advantages (not dyadic) are solved in float64: the same bits as their float64 copy."""
    adv32 = torch.tensor([0.7, -0.3, 0.1, -0.5, 0.35, -0.35])
    assert torch.equal(method.group_duals(adv32, 6, 0.05), method.group_duals(adv32.double(), 6, 0.05))
    assert method.solve_dual_bisection(adv32, 0.05) == method.solve_dual_bisection(adv32.double(), 0.05)
    # the floor test in float64: delta = KL(lam_min) of the float64 copy is the floor, although the same KL computed
    # in float32 rounds above it
    at_floor = float(method.tilted_kl(adv32.double(), 0.05))
    assert float(method.tilted_kl(adv32.double().reshape(1, -1), 0.05)) == at_floor
    assert float(method.tilted_kl(adv32, 0.05)) > at_floor, "precondition: the float32 KL rounds above"
    assert both_solvers(adv32, at_floor, lam_min=0.05, iters=2) == (0.05, 0.05)


def test_duals_of_float32_advantages_are_solved_in_float64():
    check_duals_of_float32_advantages()


def test_negative_control_float32_bisection_is_caught(monkeypatch):
    """Solvers that keep a float32 input in float32 (the KL of the bisection computed in the input's precision)."""
    real_kl, real_scalar, real_vector = method.tilted_kl, method.solve_dual_bisection, method.group_duals

    def in_input_precision(real):
        def solver(adv, *args, **kw):
            if adv.dtype != torch.float32:
                return real(adv, *args, **kw)
            with monkeypatch.context() as patch:
                patch.setattr(method, "tilted_kl", lambda a, lam: real_kl(
                    a.float(), lam.float() if isinstance(lam, torch.Tensor) else lam).double())
                return real(adv, *args, **kw)
        return solver
    monkeypatch.setattr(method, "solve_dual_bisection", in_input_precision(real_scalar))
    monkeypatch.setattr(method, "group_duals", in_input_precision(real_vector))
    with pytest.raises(CHECK_FAILED):
        check_duals_of_float32_advantages()


def check_group_duals_halve_60_times_by_default() -> None:
    """On a bracket as wide as float64 allows, the 61st halving still moves lambda: the default is 60."""
    adv, wide = centred((1, 0, 0, 0, 0, 0, 0, 0)), dict(lam_min=1e-300, lam_max=1e300)
    default = method.group_duals(adv, 8, 0.05, **wide)
    assert torch.equal(default, method.group_duals(adv, 8, 0.05, iters=60, **wide))
    assert float(default[0]) == pytest.approx(1.25489, rel=1e-4)


def test_group_duals_halve_60_times_by_default():
    check_group_duals_halve_60_times_by_default()
    adv, wide = centred((1, 0, 0, 0, 0, 0, 0, 0)), dict(lam_min=1e-300, lam_max=1e300)
    # the check can fail: 61 halvings give other bits on this bracket
    assert not torch.equal(method.group_duals(adv, 8, 0.05, iters=61, **wide),
                           method.group_duals(adv, 8, 0.05, iters=60, **wide))


def test_negative_control_61_halvings_are_caught(monkeypatch):
    real = method.group_duals
    monkeypatch.setattr(method, "group_duals",
                        lambda adv, g, delta, iters=61, **kw: real(adv, g, delta, iters=iters, **kw))
    with pytest.raises(CHECK_FAILED):
        check_group_duals_halve_60_times_by_default()


# ---------------------------------------------------------------------------------------------------------------
# Diagnostics and metrics on the boundaries
# ---------------------------------------------------------------------------------------------------------------

def check_diagnostics_on_boundaries() -> None:
    # ratios exactly on 1 - eps_low and 1 + eps_high are inside the closed range; the masked 0.5 never counts
    on_bounds = torch.tensor([[0.0, 0.0, 0.5]])
    assert method.outside_clip_fraction(on_bounds, torch.tensor([[True, True, False]]), 0.0, 0.0) == 0.0
    assert method.outside_clip_fraction(on_bounds, torch.ones(1, 3), 0.0, 0.0) == pytest.approx(1 / 3)
    assert method.outside_clip_fraction(torch.tensor([[0.7]]), torch.ones(1, 1)) == 1.0   # one valid token
    # pass@k with every sample correct
    assert method.pass_at_k(4, 4, 2) == 1.0 and method.pass_at_k(5, 5, 5) == 1.0
    # two groups: one KL estimate per group
    log_rho = torch.tensor([0.5, math.log(2), -0.3, 0.1], dtype=F64)
    expected = [(math.exp(0.5) * 0.5 + 2 * math.log(2)) / 2, (math.exp(-0.3) * -0.3 + math.exp(0.1) * 0.1) / 2]
    kl = method.per_query_kl(log_rho, 2)
    assert kl.shape == (2,) and kl.tolist() == pytest.approx(expected, abs=1e-15)
    # the default stabiliser is rho log rho
    x = torch.tensor([-0.5, 0.4], dtype=F64)
    assert torch.allclose(method.stabiliser_term(x), torch.exp(x) * x, rtol=0, atol=1e-16)


def test_diagnostics_and_metrics_on_their_boundaries():
    check_diagnostics_on_boundaries()


@pytest.mark.parametrize("broken", ["half_open_clip", "mask_floor_2", "pass_at_k_all_correct", "one_group_kl",
                                    "generalised_default"])
def test_negative_control_boundary_variants_are_caught(monkeypatch, broken):
    real_clip, real_pass, real_kl, real_stab = (method.outside_clip_fraction, method.pass_at_k, method.per_query_kl,
                                                method.stabiliser_term)
    if broken == "half_open_clip":
        def half_open(lr, m, eps_low=0.2, eps_high=0.2):
            ratio, m = torch.exp(lr), m.bool()
            return float((((ratio <= 1 - eps_low) | (ratio >= 1 + eps_high)) & m).sum() / m.sum().clamp_min(1))
        monkeypatch.setattr(method, "outside_clip_fraction", half_open)
    elif broken == "mask_floor_2":
        monkeypatch.setattr(method, "outside_clip_fraction", lambda lr, m, eps_low=0.2, eps_high=0.2: real_clip(
            lr, m, eps_low, eps_high) * float(m.bool().sum()) / max(float(m.bool().sum()), 2.0))
    elif broken == "pass_at_k_all_correct":
        def refuses_all_correct(n, c, k):
            if c >= n:
                raise ValueError("need c < n")
            return real_pass(n, c, k)
        monkeypatch.setattr(method, "pass_at_k", refuses_all_correct)
    elif broken == "one_group_kl":
        monkeypatch.setattr(method, "per_query_kl", lambda lr, g: real_kl(lr, lr.numel()))
    else:
        monkeypatch.setattr(method, "stabiliser_term", lambda lr, s="generalised": real_stab(lr, s))
    with pytest.raises(CHECK_FAILED):
        check_diagnostics_on_boundaries()


# ---------------------------------------------------------------------------------------------------------------
# quatro_loss with a non-zero behaviour policy, advantages other than +-1, both clamp sides, float32 log-probs
# ---------------------------------------------------------------------------------------------------------------

NEW = torch.tensor([[0.2, -0.4], [-1.5, 0.3]], dtype=F64)
OLD = torch.tensor([[0.5, -0.1], [0.5, 0.1]], dtype=F64)
MASK = torch.tensor([[True, True], [True, False]])
ADV = torch.tensor([0.5, -0.25], dtype=F64)
LAM = torch.tensor([0.3, 0.2], dtype=F64)


def by_hand(level: str, stabiliser: str, bound: float | None) -> float:
    """Token log-ratios (-0.3, -0.3 | -2.0, masked); sequence log rho (-0.6, -2.0)."""
    def f(log_rho: float) -> float:
        rho = math.exp(log_rho)
        return rho * log_rho if stabiliser == "rho_log_rho" else rho * log_rho - rho + 1

    def clamp(x: float) -> float:
        return x if bound is None else min(max(x, -bound), bound)
    adv, lam = (0.5, -0.25), (0.3, 0.2)
    if level == "sequence":
        terms = [math.exp(clamp(s)) * a - lm * f(clamp(s)) for s, a, lm in zip((-0.6, -2.0), adv, lam, strict=True)]
        return -sum(terms) / 2
    tokens = [(-0.3, 0), (-0.3, 0), (-2.0, 1)]
    return -sum(math.exp(clamp(t)) * adv[i] - lam[i] * f(clamp(t)) for t, i in tokens) / 3


def check_quatro_loss_exact() -> None:
    for level in ("sequence", "token"):
        for stabiliser in ("rho_log_rho", "generalised"):
            for bound in (None, 1.0):
                loss, _ = method.quatro_loss(NEW, OLD, ADV, MASK, LAM, level=level, stabiliser=stabiliser,
                                             max_log_ratio=bound)
                assert float(loss) == pytest.approx(by_hand(level, stabiliser, bound), abs=1e-14), (
                    level, stabiliser, bound)
    # float32 log-probs: advantages and lambdas are cast to the log-probs' dtype, the loss is float32
    loss32, _ = method.quatro_loss(NEW.float(), OLD.float(), ADV, MASK, LAM, level="token")
    same32, _ = method.quatro_loss(NEW.float(), OLD.float(), ADV.float(), MASK, LAM.float(), level="token")
    assert loss32.dtype == torch.float32 and torch.equal(loss32, same32)
    seq32, _ = method.quatro_loss(NEW.float(), OLD.float(), ADV, MASK, LAM)
    assert seq32.dtype == torch.float32


def test_quatro_loss_exact_with_a_behaviour_policy_and_both_clamp_sides():
    check_quatro_loss_exact()


@pytest.mark.parametrize("broken", ["plus_old", "clamp_dropped", "token_default_stabiliser", "float64_adv"])
def test_negative_control_loss_variants_are_caught(monkeypatch, broken):
    real = method.quatro_loss

    def variant(new, old, adv, mask, lam, *, level="sequence", stabiliser="rho_log_rho", max_log_ratio=None):
        if broken == "plus_old":
            return real(new, -old, adv, mask, lam, level=level, stabiliser=stabiliser, max_log_ratio=max_log_ratio)
        if broken == "clamp_dropped" and max_log_ratio is not None:
            return real(new, old, adv, mask, lam, level=level, stabiliser=stabiliser, max_log_ratio=5.0)
        if broken == "token_default_stabiliser" and level == "token":
            return real(new, old, adv, mask, lam, level=level, max_log_ratio=max_log_ratio)
        if broken == "float64_adv":
            return real(new.double(), old.double(), adv, mask, lam, level=level, stabiliser=stabiliser,
                        max_log_ratio=max_log_ratio)
        return real(new, old, adv, mask, lam, level=level, stabiliser=stabiliser, max_log_ratio=max_log_ratio)
    monkeypatch.setattr(method, "quatro_loss", variant)
    with pytest.raises(CHECK_FAILED):
        check_quatro_loss_exact()
