"""The density-free primal step of Stage B (issue 19): exact values of its losses and weights, and proof that a
run never evaluates the density of q (p0) or of the target p*_lambda. Each check has a negative control."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.common.params import params_section
from tasks.constrained_unlearning import diffusion, method, train
from tasks.constrained_unlearning.config import CONFIG
from tasks.constrained_unlearning.mixture import GaussianMixture, single_gaussian


class ConstantEps(torch.nn.Module):
    """A network that predicts the same noise everywhere (hand-computable targets)."""

    def __init__(self, value: tuple[float, float]) -> None:
        super().__init__()
        self.value = torch.tensor(value)

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.value.expand(x_t.shape[0], 2)


def test_ru_composed_epsilon_exact():
    """eps* = eps_q - eta (eps_u - eps_q), eta = lambda / (1 - lambda): at lambda = 2/3 (eta = 2) with
    eps_q = (1, 0), eps_u = (0, 2): (1, 0) - 2 (-1, 2) = (3, -4). Negative control: the sign of the guidance
    flipped (moving towards q_u) gives (-1, 4)."""
    eps_q, eps_u = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])
    got = method.ru_composed_epsilon(eps_q, eps_u, 2 / 3)
    torch.testing.assert_close(got, torch.tensor([[3.0, -4.0]]))
    flipped = eps_q + method.eta_from_lambda(2 / 3) * (eps_u - eps_q)
    assert not torch.allclose(flipped, got)
    torch.testing.assert_close(method.ru_composed_epsilon(eps_q, eps_u, 0.0), eps_q)


def test_ru_composition_loss_exact():
    """With constant networks the loss is ||c - eps*||^2 whatever x_t: model (0.5, 0.5), eps_q (1, 0), eps_u (0, 2),
    lambda = 2/3: eps* = (3, -4), loss = 2.5^2 + 4.5^2 = 26.5."""
    pool = torch.randn(16, 2, generator=torch.Generator().manual_seed(0))
    loss = method.ru_composition_loss(ConstantEps((0.5, 0.5)), ConstantEps((1.0, 0.0)), ConstantEps((0.0, 2.0)),
                                      diffusion.NoiseSchedule.linear(4), pool, 2 / 3, batch_size=8)
    assert float(loss(torch.Generator().manual_seed(1))) == pytest.approx(26.5, rel=1e-6)


class LinearEps(torch.nn.Module):
    """eps(x_t, t) = a x_t + b t (per coordinate): a network whose output depends on both inputs."""

    def __init__(self, a: float, b: float) -> None:
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.a * x_t + self.b * t.to(x_t.dtype)[:, None]


def ru_loss_at_one_point() -> tuple[float, float]:
    """(loss, hand value) at one (x_t, t): pool = {(1, 2)}, batch 1, model eps = 0, eps_q = x_t, eps_u = t,
    lambda = 2/3 (eta = 2): eps* = x_t - 2 (t - x_t) = 3 x_t - 2 t, loss = ||3 x_t - 2 t||^2, with x_t and t
    replayed from the same generator (batch index, then t, then eps)."""
    schedule = diffusion.NoiseSchedule.linear(4)
    x0 = torch.tensor([[1.0, 2.0]])
    loss = method.ru_composition_loss(LinearEps(0.0, 0.0), LinearEps(1.0, 0.0), LinearEps(0.0, 1.0), schedule, x0,
                                      2 / 3, 1)
    got = float(loss(torch.Generator().manual_seed(4)))  # seed 4 draws t = 2 (abar 0.21): x_t far from x_0
    g = torch.Generator().manual_seed(4)
    torch.randint(0, 1, (1,), generator=g)
    t = int(torch.randint(0, 4, (1,), generator=g))
    eps = torch.randn((1, 2), generator=g)
    abar = float(schedule.alpha_bars[t])
    x_t = math.sqrt(abar) * x0 + math.sqrt(1 - abar) * eps
    return got, float(((3 * x_t - 2 * t) ** 2).sum())


def test_ru_composition_loss_exact_at_one_noised_point():
    got, hand = ru_loss_at_one_point()
    assert hand > 1.0 and got == pytest.approx(hand, rel=1e-5)


def test_ru_composition_loss_check_fails_when_composing_at_x0(monkeypatch):
    """Negative control: a variant that feeds the frozen networks x_0 instead of x_t fails the same check."""
    def at_x0(model, frozen_q, frozen_u, schedule, pool, lam, batch_size):
        def loss(generator):
            x0 = pool[torch.randint(0, pool.shape[0], (batch_size,), generator=generator)]
            x_t, t, _ = diffusion.noise_batch(x0, schedule, generator)
            target = method.ru_composed_epsilon(frozen_q(x0, t), frozen_u(x0, t), lam)
            return ((model(x_t, t) - target) ** 2).sum(dim=1).mean()
        return loss

    monkeypatch.setattr(method, "ru_composition_loss", at_x0)
    got, hand = ru_loss_at_one_point()
    assert got != pytest.approx(hand, rel=1e-3)


def test_fu_difference_loss_is_dsm_q_minus_lambda_dsm_qu():
    """DSM_q - lambda DSM_{q_u} on the same draws (batch indices then noise, q first); negative control: the
    plus sign differs."""
    model = diffusion.build_model(hidden=8, layers=1, time_dim=4, timesteps=4, seed=0)
    schedule = diffusion.NoiseSchedule.linear(4)
    pool = torch.randn(32, 2, generator=torch.Generator().manual_seed(0))
    forget = torch.randn(20, 2, generator=torch.Generator().manual_seed(1)) + 3.0
    loss_fn = method.fu_difference_loss(model, schedule, pool, forget, 0.3, 8)
    got = float(loss_fn(torch.Generator().manual_seed(2)).detach())
    g = torch.Generator().manual_seed(2)
    x_q = pool[torch.randint(0, 32, (8,), generator=g)]
    x_u = forget[torch.randint(0, 20, (8,), generator=g)]
    dsm_q = float(diffusion.dsm_loss(model, x_q, schedule, g).detach())
    dsm_u = float(diffusion.dsm_loss(model, x_u, schedule, g).detach())
    assert got == pytest.approx(dsm_q - 0.3 * dsm_u, rel=1e-6)
    assert dsm_u > 0 and got != pytest.approx(dsm_q + 0.3 * dsm_u, rel=1e-3)


def test_lu_likelihood_weights_equal_the_analytic_density_ratio():
    """exp(-lambda q_u(x)), self-normalised, equals p*_LU / q on q's samples (the analytic importance weights,
    which need log q) without using q: hand value on two points, then the identity on a mixture's samples.
    Negative control: the tilt of the wrong sign exp(+lambda q_u) is not the density ratio."""
    w = method.lu_likelihood_weights(np.array([0.0, math.log(2.0)]), 1.0)
    np.testing.assert_allclose(w, [2 / 1.5, 1 / 1.5], rtol=1e-12)
    rng = np.random.default_rng(0)
    q = GaussianMixture(np.array([[0.0, 0.0], [3.0, 0.0]]), np.array([0.6, 0.4]), 0.5)
    forget = single_gaussian(np.array([3.0, 0.0]), 0.5)
    x = q.sample(400, rng)
    analytic = method.importance_weights("lu", q.log_density(x), forget.log_density(x), 2.5)
    np.testing.assert_allclose(method.lu_likelihood_weights(forget.density(x), 2.5), analytic, rtol=1e-10)
    wrong = np.exp(2.5 * forget.density(x))
    assert not np.allclose(wrong * len(x) / wrong.sum(), analytic, rtol=1e-2)


def smoke_config():
    return CONFIG.model_validate(params_section("constrained_unlearning")["smoke"])


@pytest.fixture()
def tiny_setup():
    cfg = smoke_config()
    q = GaussianMixture(np.array([[0.0, 0.0], [2.0, 0.0]]), np.array([0.5, 0.5]), 0.4)
    forget = single_gaussian(np.array([2.0, 0.0]), 0.4)
    pool = torch.as_tensor(q.sample(256, np.random.default_rng(0)), dtype=torch.float32)
    pretrained = diffusion.build_model(cfg.ddpm.hidden, cfg.ddpm.layers, cfg.ddpm.time_dim, cfg.ddpm.timesteps, 0)
    # A short DSM fit, so that the model's samples lie near q (an untrained one samples at |x| ~ 1e5, where q_u's
    # likelihood, LU's on-policy reward, is 0 for every trajectory and REINFORCE has no signal)
    schedule = diffusion.NoiseSchedule.linear(cfg.ddpm.timesteps)
    diffusion.train(pretrained, lambda g: diffusion.dsm_loss(pretrained, pool, schedule, g), 150, 5e-3,
                    torch.Generator().manual_seed(2))
    forget_samples = torch.as_tensor(forget.sample(64, np.random.default_rng(1)), dtype=torch.float32)
    return cfg, q, forget, pool, pretrained, forget_samples


def forbid_p0_and_target(monkeypatch) -> list[str]:
    """Make every way to the density of q (the mixture with more than one mode) and of p*_lambda raise: q's
    (log-)density, its per-component log-densities and its analytic noised score (the most natural cheat for RU's
    composition)."""
    calls: list[str] = []

    def guard(real, name):
        def wrapped(self, *args):
            if len(self.weights) > 1:
                calls.append(name)
                raise AssertionError(f"the density-free step evaluated p0 ({name})")
            return real(self, *args)
        return wrapped

    for name in ("log_density", "density", "component_log_densities", "noised_score_torch"):
        monkeypatch.setattr(GaussianMixture, name, guard(getattr(GaussianMixture, name), name))
    for name in ("target", "importance_weights", "log_target_unnormalised", "ru_log_target", "lu_log_target",
                 "fu_unnormalised", "ru_target", "fu_target", "lu_target"):
        def forbidden(*args, _name=name, **kwargs):
            calls.append(_name)
            raise AssertionError(f"the density-free step evaluated p* ({_name})")
        monkeypatch.setattr(method, name, forbidden)
    return calls


@pytest.mark.parametrize("formulation", method.FORMULATIONS)
def test_density_free_run_never_evaluates_p0_or_the_target(monkeypatch, tiny_setup, formulation):
    """A density-free primal-dual run (train.density_free_unlearn) with q's density and every p* function made
    to raise: it completes, the dual variable moves and the weights change. Negative control: the analytic
    reference (method.primal_dual_unlearn) under the same guards raises."""
    cfg, q, forget, pool, pretrained, forget_samples = tiny_setup
    schedule = diffusion.NoiseSchedule.linear(cfg.ddpm.timesteps)
    log_q_pool = q.log_density(pool.numpy().astype(np.float64))  # before the guards: only the reference uses it
    log_qu_pool = forget.log_density(pool.numpy().astype(np.float64))
    calls = forbid_p0_and_target(monkeypatch)
    with pytest.raises(AssertionError):
        q.log_density(pool.numpy())  # the guard is armed
    with pytest.raises(AssertionError, match="noised_score_torch"):
        q.noised_score_torch(pool[:4].double(), torch.full((4,), 0.5, dtype=torch.float64))
    with pytest.raises(AssertionError, match="component_log_densities"):
        q.component_log_densities(pool.numpy()[:4].astype(np.float64))
    forget.noised_score_torch(pool[:4].double(), torch.full((4,), 0.5, dtype=torch.float64))  # q_u is allowed
    calls.clear()
    model = train.clone(pretrained)
    before = [p.detach().clone() for p in model.parameters()]
    bound = 1.0 if formulation != "lu" else 0.0
    concept = diffusion.build_model(cfg.ddpm.hidden, cfg.ddpm.layers, cfg.ddpm.time_dim, cfg.ddpm.timesteps, 1)
    run = train.density_free_unlearn(formulation, cfg, model, pretrained, concept.eval(), pool,
                                     forget, forget_samples, schedule, bound, lambda s: 0.5, 0.1,
                                     torch.Generator().manual_seed(0))
    assert calls == []
    un = cfg.unlearn
    updates, steps = {"ru": (un.ru_dual_updates, un.ru_steps_per_dual),
                      "lu": (un.dual_updates, un.lu_steps_per_dual)}.get(formulation, (un.dual_updates,
                                                                                         un.steps_per_dual))
    assert run.lambdas[0] > 0 and len(run.losses) == updates * steps and len(run.lambdas) == updates
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(AssertionError, match="evaluated p"):
        method.primal_dual_unlearn(formulation, train.clone(pretrained), schedule, pool, log_q_pool, log_qu_pool,
                                   bound, lambda s: 0.5, dual_updates=1, steps_per_dual=1, batch_size=8, lr=1e-3,
                                   dual_lr=0.1, dual_samples=16, generator=torch.Generator().manual_seed(0))
