"""quatro method (tasks/quatro/method.py, reconstructed): exact values on hand-built inputs, identities, and negative
controls that monkeypatch a deliberately broken variant into the library and show the same check then fails."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.common import rl
from tasks.quatro import baselines, method
from tasks.quatro.config import RLConfig

F64 = torch.float64
DELTA = 0.05
# The acceptance vectors: G = 8, delta = 0.05, A = r - mean(r), and lambda* to 1e-4 relative.
DUAL_VECTORS = [((1, 0, 0, 0, 0, 0, 0, 0), 1.25489), ((1, 1, 1, 0, 0, 0, 0, 0), 1.575281),
                ((1, 1, 1, 1, 1, 1, 1, 0), 0.728589)]


def centred(rewards) -> torch.Tensor:
    r = torch.tensor(rewards, dtype=F64)
    return r - r.mean()


def rl_config(**overrides) -> RLConfig:
    base = dict(steps=1, prompts_per_step=1, group_size=2, cells=[(1, 1e-3)], rollout_lag=0,
                algorithms=["grpo", "quatro"], clip_eps=0.2, delta=DELTA, level="sequence", dual_mode="bisection",
                dual_step_size=1.0, lam_min=1e-3, max_grad_norm=1.0)
    return RLConfig(**(base | overrides))


# ---------------------------------------------------------------------------------------------------------------
# C1: clipping masks the gradient; C3: the stabiliser's gradient is never masked
# ---------------------------------------------------------------------------------------------------------------

def grpo_ratio_gradient(ratio: float, advantage: float) -> float:
    """d loss / d rho of the GRPO loss the experiment uses (baselines.policy_loss), one token, rho a leaf."""
    rho = torch.tensor([[ratio]], dtype=F64, requires_grad=True)
    loss, _ = baselines.policy_loss("grpo", torch.log(rho), torch.zeros(1, 1, dtype=F64),
                                    torch.tensor([advantage], dtype=F64), torch.ones(1, 1, dtype=torch.bool),
                                    rl_config())
    (grad,) = torch.autograd.grad(loss, rho)
    return float(grad)


def clip_masks_outside_the_range() -> bool:
    """A = 1, eps = 0.2: the gradient is exactly 0 at rho = 1.5 (outside, improving side) and -1 at rho = 1.1."""
    return grpo_ratio_gradient(1.5, 1.0) == 0.0 and grpo_ratio_gradient(1.1, 1.0) == pytest.approx(-1.0, abs=1e-12)


def test_grpo_gradient_is_exactly_zero_outside_the_clip_range():
    assert clip_masks_outside_the_range()
    # on the other side of the range with A < 0 the clip is also flat; inside it the gradient is -A
    assert grpo_ratio_gradient(0.5, -1.0) == 0.0 and grpo_ratio_gradient(0.9, -1.0) == pytest.approx(1.0)


def test_negative_control_unclipped_loss_is_caught(monkeypatch):
    monkeypatch.setattr(rl, "grpo_loss", lambda new, old, adv, mask, **kw: rl.reinforce_is_loss(new, old, adv, mask))
    assert not clip_masks_outside_the_range()


def stabiliser_reference_values() -> bool:
    """dL/drho = A - lambda (1 + ln rho): A = 1, rho = 1.5, lambda = 1 -> -0.405465 (down, toward rho_stat = 1);
    A = 1, rho = 1.3, lambda = 0.5 -> +0.368818 (up, toward rho_stat = e). By autograd through the objective, the
    closed form, and the sequence-level loss on log-probs (d loss / d logp = -rho dL/drho / N)."""
    ok = True
    for rho_value, lam, expected, stationary in ((1.5, 1.0, -0.405465, 1.0), (1.3, 0.5, 0.368818, math.e)):
        rho = torch.tensor(rho_value, dtype=F64, requires_grad=True)
        (auto,) = torch.autograd.grad(method.per_sample_objective(rho, torch.tensor(1.0, dtype=F64), lam), rho)
        closed = method.objective_grad_wrt_ratio(rho.detach(), torch.tensor(1.0, dtype=F64), lam)
        ok &= abs(float(auto) - expected) < 1e-6 and abs(float(closed) - expected) < 1e-6
        ok &= abs(float(method.stationary_ratio(torch.tensor(1.0, dtype=F64), lam)) - stationary) < 1e-12
        new = torch.tensor([[math.log(rho_value)], [0.0]], dtype=F64, requires_grad=True)
        loss, _ = method.quatro_loss(new, torch.zeros(2, 1, dtype=F64), torch.tensor([1.0, 0.0], dtype=F64),
                                     torch.ones(2, 1, dtype=torch.bool), torch.tensor([lam, lam], dtype=F64),
                                     stabiliser="rho_log_rho")
        (grad,) = torch.autograd.grad(loss, new)
        ok &= abs(float(grad[0, 0]) - (-rho_value * expected / 2)) < 1e-6
        ok &= abs(float(grad[1, 0]) - lam / 2) < 1e-12  # A = 0, rho = 1: -(0 - lam (1 + 0)) / 2
    return bool(ok)


def test_stabiliser_gradient_reference_values():
    assert stabiliser_reference_values()


def test_negative_control_dropped_stabiliser_is_caught(monkeypatch):
    monkeypatch.setattr(method, "stabiliser_term", lambda log_rho, stabiliser="rho_log_rho": 0 * log_rho)
    monkeypatch.setattr(method, "per_sample_objective", lambda ratio, adv, lam: ratio * adv)
    assert not stabiliser_reference_values()


def test_generalised_stabiliser_has_the_same_expectation_and_gradient_a_minus_lambda_log_rho():
    rho = torch.tensor([0.5, 1.0, 2.0], dtype=F64, requires_grad=True)
    literal = method.stabiliser_term(torch.log(rho), "rho_log_rho")
    general = method.stabiliser_term(torch.log(rho), "generalised")
    assert torch.allclose(general, literal - rho + 1, atol=1e-15)
    assert torch.allclose(general.detach(), torch.tensor([0.5 * math.log(0.5) + 0.5, 0.0, 2 * math.log(2) - 1],
                                                         dtype=F64), atol=1e-15)
    (grad,) = torch.autograd.grad(general.sum(), rho)
    assert torch.allclose(grad, torch.log(rho.detach()), atol=1e-15)
    # E_{p_old}[rho - 1] = 0 for any normalised p_new, so both forms have the same expectation (R2)
    p_old, p_new = torch.tensor([0.2, 0.5, 0.3], dtype=F64), torch.tensor([0.1, 0.3, 0.6], dtype=F64)
    ratio = torch.log(p_new / p_old)
    for form in ("rho_log_rho", "generalised"):
        assert float((p_old * method.stabiliser_term(ratio, form)).sum()) == pytest.approx(
            float(method.categorical_kl(p_new, p_old)), abs=1e-14)
    with pytest.raises(ValueError, match="stabiliser"):
        method.stabiliser_term(ratio, "other")


# ---------------------------------------------------------------------------------------------------------------
# C2: the per-query dual
# ---------------------------------------------------------------------------------------------------------------

def dual_solver_checks() -> bool:
    ok = True
    for rewards, expected in DUAL_VECTORS:
        adv = centred(rewards)
        lam = method.solve_dual_bisection(adv, DELTA)
        ok &= abs(lam - expected) / expected < 1e-4
        ok &= abs(float(method.tilted_kl(adv, lam)) - DELTA) < 1e-4
        g = float(method.dual_value(lam, adv, DELTA))
        ok &= all(float(method.dual_value(lam * f, adv, DELTA)) > g for f in (1.01, 0.99))
        ok &= float((method.tilted_weights(adv, lam) * adv).sum()) > 0
    return bool(ok)


def test_dual_solver_reference_vectors():
    assert dual_solver_checks()


def test_negative_control_wrong_sign_tilt_is_caught(monkeypatch):
    """exp(-A / lambda) still reaches KL = delta (the same lambda*) but gives sum_i w_i A_i < 0."""
    monkeypatch.setattr(method, "tilted_weights", lambda adv, lam: torch.softmax(-adv / lam, dim=-1))
    monkeypatch.setattr(method, "tilted_kl", lambda adv, lam: method.categorical_kl(
        torch.softmax(-adv / lam, dim=-1), torch.full_like(adv, 1 / adv.shape[-1])))
    assert not dual_solver_checks()


def test_negative_control_bisection_toward_the_wrong_side_is_caught(monkeypatch):
    real = method.tilted_kl
    monkeypatch.setattr(method, "tilted_kl", lambda adv, lam: 2 * DELTA - real(adv, lam))
    assert not dual_solver_checks()


def test_dual_value_closed_form_and_derivative():
    adv = centred((1, 0, 0, 0))
    lam = 0.7
    expected = lam * DELTA + lam * math.log((math.exp(0.75 / lam) + 3 * math.exp(-0.25 / lam)) / 4)
    assert float(method.dual_value(lam, adv, DELTA)) == pytest.approx(expected, abs=1e-14)
    h = 1e-6  # g'(lambda) = delta - KL(w || uniform)
    numeric = (float(method.dual_value(lam + h, adv, DELTA)) - float(method.dual_value(lam - h, adv, DELTA))) / (2 * h)
    assert numeric == pytest.approx(DELTA - float(method.tilted_kl(adv, lam)), abs=1e-8)
    # at lambda*, the dual value equals the tilted expected advantage sum_i w_i A_i
    star = method.solve_dual_bisection(adv, DELTA)
    assert float(method.dual_value(star, adv, DELTA)) == pytest.approx(
        float((method.tilted_weights(adv, star) * adv).sum()), abs=1e-10)


def test_tilted_kl_is_the_kl_to_uniform_and_weights_are_exact():
    adv = torch.tensor([0.5, -0.5], dtype=F64)
    w = method.tilted_weights(adv, 1.0)
    assert torch.allclose(w, torch.tensor([math.e, 1.0], dtype=F64) / (math.e + 1), atol=1e-15)
    assert float(method.tilted_kl(adv, 1.0)) == pytest.approx(
        float(method.categorical_kl(w, torch.tensor([0.5, 0.5], dtype=F64))), abs=1e-15)


def test_feasibility_limit_floor_ceiling_and_degenerate_groups():
    adv = centred((1, 1, 1, 0, 0, 0, 0, 0))
    assert method.kl_limit_as_lambda_to_zero(adv) == pytest.approx(math.log(8 / 3), abs=1e-15)
    assert float(method.tilted_kl(adv, 1e-3)) == pytest.approx(math.log(8 / 3), abs=1e-12)
    # delta at or above log(G / n_max): infeasible for every lambda, clamp to the floor
    assert method.solve_dual_bisection(adv, math.log(8 / 3), lam_min=0.01) == 0.01
    assert method.solve_dual_bisection(adv, 1.0, lam_min=0.01) == 0.01
    assert method.solve_dual_bisection(adv, 0.9, lam_min=0.01) > 0.01  # 0.9 < log(8/3): feasible
    # KL at the floor already below delta: floor; KL at the ceiling still above delta: ceiling
    assert method.solve_dual_bisection(centred((1, 0)), 0.5, lam_min=1.0) == 1.0  # KL(1.0) = 0.111 < 0.5 < log 2
    assert method.solve_dual_bisection(adv, 1e-6, lam_max=10.0) == 10.0
    assert method.solve_dual_bisection(torch.zeros(8, dtype=F64), DELTA) == 0.0
    assert method.is_degenerate(torch.ones(4)) and not method.is_degenerate(torch.tensor([1.0, 0.0]))
    with pytest.raises(ValueError, match="delta"):
        method.solve_dual_bisection(adv, 0.0)
    with pytest.raises(ValueError, match="lam_min"):
        method.solve_dual_bisection(adv, DELTA, lam_min=2.0, lam_max=1.0)


def test_group_duals_per_row_and_skipped_groups():
    adv = torch.cat([centred((1, 0, 0, 0, 0, 0, 0, 0)), torch.zeros(8, dtype=F64)])
    per_group = method.group_duals(adv, 8, DELTA)
    assert per_group[0] == pytest.approx(1.25489, rel=1e-4) and per_group[1] == 0.0
    rows = method.per_row(per_group, 8)
    assert rows.shape == (16,) and bool((rows[:8] == per_group[0]).all()) and bool((rows[8:] == 0).all())
    with pytest.raises(ValueError, match="groups of size"):
        method.group_duals(adv[:5], 2, DELTA)
    with pytest.raises(ValueError, match="groups of size"):
        method.group_duals(adv, 1, DELTA)


def test_dual_ascent_step_exact():
    assert method.dual_ascent_step(1.0, 0.1, 0.05, 2.0) == pytest.approx(1.1, abs=1e-15)
    assert method.dual_ascent_step(1.0, 0.0, 0.05, 2.0) == pytest.approx(0.9, abs=1e-15)
    assert method.dual_ascent_step(0.01, 0.0, 0.05, 1.0) == 1e-3
    assert method.dual_ascent_step(0.01, 0.0, 0.05, 1.0, floor=0.5) == 0.5


# ---------------------------------------------------------------------------------------------------------------
# R2: the KL identity; R6: the loss on log-probs
# ---------------------------------------------------------------------------------------------------------------

def kl_identity_holds() -> bool:
    gen = torch.Generator().manual_seed(0)
    ok = True
    for _ in range(20):
        p_new = torch.softmax(torch.randn(7, generator=gen, dtype=F64), -1)
        p_old = torch.softmax(torch.randn(7, generator=gen, dtype=F64), -1)
        reference = float(torch.distributions.kl_divergence(torch.distributions.Categorical(probs=p_new),
                                                            torch.distributions.Categorical(probs=p_old)))
        ok &= abs(float(method.expected_rho_log_rho(p_new, p_old)) - reference) < 1e-10
        ok &= abs(float(method.categorical_kl(p_new, p_old)) - reference) < 1e-10
    return bool(ok)


def test_kl_identity_on_random_categoricals():
    assert kl_identity_holds()
    p = torch.tensor([0.0, 1.0], dtype=F64)  # 0 log 0 = 0
    assert float(method.categorical_kl(p, torch.tensor([0.5, 0.5], dtype=F64))) == pytest.approx(math.log(2))
    assert float(method.expected_rho_log_rho(p, torch.tensor([0.5, 0.5], dtype=F64))) == pytest.approx(math.log(2))


def test_negative_control_kl_without_the_ratio_weight_is_caught(monkeypatch):
    monkeypatch.setattr(method, "expected_rho_log_rho",
                        lambda p_new, p_old: (p_old * torch.log(p_new / p_old)).sum(-1))
    assert not kl_identity_holds()


def test_sequence_log_ratios_per_query_kl_and_outside_clip_exact():
    new = torch.tensor([[-1.0, -2.0, 5.0], [-1.0, -1.0, -1.0]], dtype=F64)
    old = torch.tensor([[-1.5, -2.0, 0.0], [-1.0, -1.0 - math.log(2), -1.0]], dtype=F64)
    mask = torch.tensor([[True, True, False], [True, True, True]])
    log_rho = method.sequence_log_ratios(new, old, mask)
    assert torch.allclose(log_rho, torch.tensor([0.5, math.log(2)], dtype=F64), atol=1e-15)
    kl = method.per_query_kl(log_rho, 2)
    assert float(kl) == pytest.approx((math.exp(0.5) * 0.5 + 2 * math.log(2)) / 2, abs=1e-15)
    # token ratios: [e^0.5, 1, masked] and [1, 2, 1] -> 2 of 5 valid tokens outside [0.8, 1.2]
    assert method.outside_clip_fraction(new - old, mask) == pytest.approx(2 / 5)
    assert method.outside_clip_fraction(new - old, mask, eps_low=0.2, eps_high=0.7) == pytest.approx(1 / 5)
    assert method.outside_clip_fraction(torch.log(torch.tensor([[0.79, 0.81]])), torch.ones(1, 2)) == 0.5


def test_quatro_loss_exact_values_sequence_and_token_level():
    new = torch.tensor([[math.log(2.0), 0.0], [0.0, math.log(0.5)]], dtype=F64)
    old = torch.zeros(2, 2, dtype=F64)
    mask = torch.tensor([[True, True], [True, False]])
    adv, lam = torch.tensor([1.0, -1.0], dtype=F64), torch.tensor([0.5, 0.5], dtype=F64)
    # sequence: rho = (2, 1) -> -(1/2)[(2 - 0.5 * 2 ln 2) + (-1 - 0)]
    loss, stats = method.quatro_loss(new, old, adv, mask, lam, level="sequence", stabiliser="rho_log_rho")
    assert float(loss) == pytest.approx(-0.5 * (2 - math.log(2) - 1), abs=1e-15)
    assert stats["lambda_mean"] == 0.5 and stats["outside_clip_fraction"] == pytest.approx(1 / 3)
    assert stats["rho_log_rho"] == pytest.approx(math.log(2), abs=1e-15)
    gen, _ = method.quatro_loss(new, old, adv, mask, lam, level="sequence", stabiliser="generalised")
    assert float(gen) == pytest.approx(-0.5 * (2 - 0.5 * (2 * math.log(2) - 1) - 1), abs=1e-15)
    # token: valid tokens rho = (2, 1 | 1); the masked 0.5 never counts
    tok, _ = method.quatro_loss(new, old, adv, mask, lam, level="token", stabiliser="rho_log_rho")
    assert float(tok) == pytest.approx(-((2 - math.log(2)) + 1 - 1) / 3, abs=1e-15)
    # the safety bound clamps log rho (and so the gradient beyond it)
    clamped, _ = method.quatro_loss(new, old, adv, mask, lam, level="sequence", stabiliser="rho_log_rho",
                                    max_log_ratio=0.5)
    assert float(clamped) == pytest.approx(-0.5 * (math.exp(0.5) * (1 - 0.25) - 1), abs=1e-15)
    tok_clamped, _ = method.quatro_loss(new, old, adv, mask, lam, level="token", max_log_ratio=0.5)
    assert float(tok_clamped) == pytest.approx(-(math.exp(0.5) * (1 - 0.25) + 1 - 1) / 3, abs=1e-15)


def test_quatro_loss_skipped_groups_contribute_nothing_and_bad_inputs_fail():
    new = torch.tensor([[0.3], [-0.2], [0.1], [0.4]], dtype=F64, requires_grad=True)
    old = torch.zeros(4, 1, dtype=F64)
    mask = torch.ones(4, 1, dtype=torch.bool)
    adv = torch.tensor([0.5, -0.5, 0.0, 0.0], dtype=F64)
    lam = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=F64)
    loss, stats = method.quatro_loss(new, old, adv, mask, lam)
    (grad,) = torch.autograd.grad(loss, new)
    assert bool(torch.isfinite(grad).all()) and bool((grad[2:] == 0).all()) and bool((grad[:2] != 0).all())
    assert stats["lambda_mean"] == 1.0
    _, none_active = method.quatro_loss(new, old, torch.zeros(4, dtype=F64), mask, torch.zeros(4, dtype=F64))
    assert none_active["lambda_mean"] == 0.0
    with pytest.raises(ValueError, match="one advantage and one lambda"):
        method.quatro_loss(new, old, adv, mask, lam[:2])
    with pytest.raises(ValueError, match="level"):
        method.quatro_loss(new, old, adv, mask, lam, level="batch")


def test_nan_at_masked_positions_does_not_leak():
    new = torch.tensor([[0.1, float("nan")]], dtype=F64, requires_grad=True)
    old = torch.tensor([[0.0, float("inf")]], dtype=F64)
    mask = torch.tensor([[True, False]])
    for level in ("sequence", "token"):
        loss, _ = method.quatro_loss(new, old, torch.tensor([1.0], dtype=F64), mask, torch.tensor([0.5], dtype=F64),
                                     level=level)
        (grad,) = torch.autograd.grad(loss, new)
        assert bool(torch.isfinite(loss)) and bool(torch.isfinite(grad).all())


# ---------------------------------------------------------------------------------------------------------------
# Evaluation metrics
# ---------------------------------------------------------------------------------------------------------------

def test_pass_at_k_exact():
    assert method.pass_at_k(4, 1, 2) == pytest.approx(0.5)        # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert method.pass_at_k(5, 2, 2) == pytest.approx(0.7)        # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert method.pass_at_k(4, 0, 4) == 0.0 and method.pass_at_k(4, 3, 2) == 1.0 and method.pass_at_k(3, 1, 3) == 1.0
    assert method.pass_at_k(8, 2, 1) == pytest.approx(0.25)
    for n, c, k in ((4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)):
        with pytest.raises(ValueError):
            method.pass_at_k(n, c, k)


def test_unique_correct_count_and_entropy_exact():
    responses = [(1, 2), (1, 2), (2, 1), (3, 0), (0, 3)]
    assert method.unique_correct_count(responses, [True, True, True, False, True]) == 3
    assert method.unique_correct_count(responses, [False] * 5) == 0
    with pytest.raises(ValueError):
        method.unique_correct_count(responses, [True])
    logits = torch.zeros(1, 2, 4)
    logits[0, 1] = torch.tensor([100.0, 0.0, 0.0, 0.0])  # nearly deterministic, and masked out below
    assert method.mean_token_entropy(logits, torch.tensor([[True, False]])) == pytest.approx(math.log(4), abs=1e-12)
    both = method.mean_token_entropy(logits, torch.tensor([[True, True]]))
    assert both == pytest.approx(math.log(4) / 2, abs=1e-12)
    two = torch.log(torch.tensor([[[0.25, 0.75]]], dtype=F64))
    assert method.mean_token_entropy(two, torch.ones(1, 1)) == pytest.approx(
        -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-14)


def test_kl_functions_reduce_only_the_last_axis():
    """A batch of distributions gives one KL per row (the survivor of the sampled mutation run summed everything)."""
    p = torch.tensor([[0.5, 0.5], [0.25, 0.75]], dtype=F64)
    q = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=F64)
    expected = torch.tensor([0.0, 0.25 * math.log(0.5) + 0.75 * math.log(1.5)], dtype=F64)
    assert torch.allclose(method.categorical_kl(p, q), expected, atol=1e-15)
    assert torch.allclose(method.expected_rho_log_rho(p, q), expected, atol=1e-15)
    adv = torch.tensor([[0.5, -0.5], [0.0, 0.0]], dtype=F64)
    assert torch.allclose(method.tilted_kl(adv, 1.0), torch.tensor(
        [float(method.tilted_kl(adv[0], 1.0)), 0.0], dtype=F64), atol=1e-15)


def test_per_sample_objective_exact_with_a_non_unit_advantage():
    """rho = 2, A = 0.5, lambda = 0.25: value 1 - 0.5 ln 2, gradient 0.5 - 0.25 (1 + ln 2) (a mutation-run survivor
    divided by A, invisible at A = 1)."""
    rho = torch.tensor(2.0, dtype=F64, requires_grad=True)
    value = method.per_sample_objective(rho, torch.tensor(0.5, dtype=F64), 0.25)
    assert float(value) == pytest.approx(1 - 0.5 * math.log(2), abs=1e-15)
    (grad,) = torch.autograd.grad(value, rho)
    assert float(grad) == pytest.approx(0.5 - 0.25 * (1 + math.log(2)), abs=1e-15)
    assert float(method.objective_grad_wrt_ratio(rho.detach(), torch.tensor(0.5, dtype=F64), 0.25)) == pytest.approx(
        float(grad), abs=1e-15)


def exact_kl_checks() -> bool:
    p = torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.25, 0.25]], dtype=torch.float64)
    q = torch.tensor([[0.2, 0.3, 0.5], [0.25, 0.25, 0.5]], dtype=torch.float64)
    kl = method.exact_response_kl(p.log(), q.log())
    by_hand = [0.7 * math.log(3.5) + 0.2 * math.log(2 / 3) + 0.1 * math.log(0.2), 0.25 * math.log(2)]
    return all(abs(a - b) < 1e-12 for a, b in zip(kl.tolist(), by_hand, strict=True))


def test_exact_response_kl_hand_values_and_bad_inputs():
    assert exact_kl_checks()
    with pytest.raises(ValueError, match="complete distributions"):
        method.exact_response_kl(torch.log(torch.tensor([[0.5, 0.2]])), torch.log(torch.tensor([[0.5, 0.5]])))
    with pytest.raises(ValueError, match="shape"):
        method.exact_response_kl(torch.zeros(3), torch.zeros(3))


def test_negative_control_reversed_kl_is_caught(monkeypatch):
    monkeypatch.setattr(method, "exact_response_kl", lambda new, old: (old.exp() * (old - new)).sum(dim=1))
    assert not exact_kl_checks()


def test_exact_kl_sees_mass_moved_off_the_samples_where_the_sample_estimate_goes_negative():
    """The review's blocker in miniature: 4 responses, the group sampled responses 0 and 1 once each; training moved
    mass from them onto response 3. (1/G) sum rho log rho on the samples is negative, the exact KL is positive."""
    old = torch.tensor([[0.4, 0.4, 0.1, 0.1]], dtype=torch.float64)
    new = torch.tensor([[0.3, 0.3, 0.1, 0.3]], dtype=torch.float64)
    sample_log_rho = torch.log(torch.tensor([0.3 / 0.4, 0.3 / 0.4], dtype=torch.float64))
    assert float(method.per_query_kl(sample_log_rho, 2)) == pytest.approx(0.75 * math.log(0.75))  # < 0
    exact = float(method.exact_response_kl(new.log(), old.log()))
    assert exact == pytest.approx(0.6 * math.log(0.75) + 0.3 * math.log(3)) and exact > 0


def test_vectorised_group_duals_equal_the_scalar_bisection():
    gen = torch.Generator().manual_seed(5)
    rewards = (torch.rand(40, 8, generator=gen) < 0.3).double()
    rewards[0] = 1.0  # all correct: skipped
    rewards[1] = torch.tensor([1.0] * 7 + [0.0])  # feasibility limit log(8/7) = 0.134: above delta 0.05, below 0.2
    adv = (rewards - rewards.mean(dim=1, keepdim=True)).reshape(-1)
    vector = method.group_duals(adv, 8, DELTA)
    scalar = [method.solve_dual_bisection(g, DELTA) for g in adv.reshape(-1, 8)]
    assert vector.tolist() == pytest.approx(scalar, rel=1e-10, abs=1e-12)
    assert float(vector[0]) == 0.0 and float(vector[1]) == pytest.approx(0.728588645786732, rel=1e-9)
    assert float(method.group_duals(adv[8:16], 8, 0.2)[0]) == pytest.approx(1e-3)  # delta >= the limit: floor
    huge = torch.tensor([7e3] + [-1e3] * 7, dtype=torch.float64)  # KL at lam_max still above delta: ceiling
    assert float(method.group_duals(huge, 8, DELTA)[0]) == pytest.approx(1e3)
    assert method.solve_dual_bisection(huge, DELTA) == pytest.approx(1e3)


def test_negative_control_degenerate_groups_not_skipped_is_caught(monkeypatch):
    monkeypatch.setattr(method, "is_degenerate", lambda adv: False)
    assert method.solve_dual_bisection(torch.zeros(8, dtype=torch.float64), DELTA) != 0.0


def test_dual_solver_reference_vectors_scalar_and_vectorised():
    """C2: the scalar bisection's reference vectors, and the vectorised solver the runs use agreeing with it."""
    assert dual_solver_checks()
    test_vectorised_group_duals_equal_the_scalar_bisection()


def test_both_stabilisers_gradient_reference_values():
    """C3: the literal stabiliser's closed-form gradient and the generalised one's (A - lambda log rho)."""
    assert stabiliser_reference_values()
    test_generalised_stabiliser_has_the_same_expectation_and_gradient_a_minus_lambda_log_rho()
