"""The second round of issue 19's Stage B: LU's on-policy primal step (the paper's likelihood objective:
REINFORCE on the current model's trajectories plus the trajectory KL to the frozen model), RU composed with q_u's
own score, and RU's threshold matched to LU's optimum's forget mass. Exact values on non-degenerate inputs, each
with a negative control that breaks the library and shows the same check fails."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.common.params import params_section
from tasks.constrained_unlearning import data, diffusion, method, train
from tasks.constrained_unlearning import model as model_module
from tasks.constrained_unlearning.config import CONFIG
from tasks.constrained_unlearning.mixture import GaussianMixture, single_gaussian
from tasks.constrained_unlearning.model import lu_matched_ru_bound, stage_optimum
from tests.unit.test_constrained_unlearning_density_free import forbid_p0_and_target


class ShiftedGaussianEps(torch.nn.Module):
    """The exact noise prediction of N(m, I) with a learnable mean m: eps(x_t, t) = sqrt(1 - abar_t)
    (x_t - sqrt(abar_t) m) (a model whose ancestral samples are N(m, I), with one 2-D parameter)."""

    def __init__(self, schedule: diffusion.NoiseSchedule) -> None:
        super().__init__()
        self.m = torch.nn.Parameter(torch.zeros(2))
        self.abars = schedule.alpha_bars

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        abar = self.abars[t][:, None]
        return (1 - abar).sqrt() * (x_t - abar.sqrt() * self.m)


def config(profile: str):
    return CONFIG.model_validate(params_section("constrained_unlearning")[profile])


# ------------------------------------------------------------------------------------------------
# Pieces of the on-policy LU loss
# ------------------------------------------------------------------------------------------------

def check_gaussian_pieces() -> None:
    """log N((1, 2); 0, 0.5 I) = -(1 + 4) / 1 - log(2 pi 0.5) = -5 - log(pi); KL between N((1, 0), 0.25 I) and
    N((0, 2), 0.25 I) = (1 + 4) / 0.5 = 10."""
    x, mean = torch.tensor([[1.0, 2.0]], dtype=torch.float64), torch.zeros((1, 2), dtype=torch.float64)
    assert float(method.gaussian_log_prob(x, mean, 0.5)[0]) == pytest.approx(-5.0 - math.log(math.pi), rel=1e-12)
    kl = method.gaussian_step_kl(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]]), 0.25)
    assert float(kl[0]) == pytest.approx(10.0, rel=1e-6)


def test_gaussian_log_prob_and_step_kl_exact():
    check_gaussian_pieces()


def broken_log_prob(x, mean, var):
    """gaussian_log_prob with the standard deviation in place of the variance (a plausible slip)."""
    var = torch.as_tensor(var, dtype=x.dtype).sqrt()
    return -((x - mean) ** 2).sum(dim=1) / (2 * var) - 0.5 * x.shape[1] * torch.log(2 * math.pi * var)


def broken_step_kl(mean_p, mean_r, var):
    """gaussian_step_kl without the 1/2 (the KL of two equal-variance Gaussians has it)."""
    return ((mean_p - mean_r) ** 2).sum(dim=1) / torch.as_tensor(var, dtype=mean_p.dtype)


@pytest.mark.parametrize("name, broken", [("gaussian_log_prob", broken_log_prob),
                                          ("gaussian_step_kl", broken_step_kl)])
def test_gaussian_pieces_check_fails_with_a_broken_library(monkeypatch, name, broken):
    monkeypatch.setattr(method, name, broken)
    with pytest.raises(AssertionError):
        check_gaussian_pieces()


def test_lu_reinforce_surrogate_exact():
    """log-probs (1, 2, 3), KLs (0.5, 0, 1), likelihoods (0.2, 0.4, 0.9), lambda 2: mean reward 0.5, advantages
    2 (-0.3, -0.1, 0.4) = (-0.6, -0.2, 0.8); surrogate (-0.6 - 0.4 + 2.4 + 1.5) / 3 = 0.96667; its gradient in the
    log-probs is advantage / 3 and zero in the (detached) likelihoods. Negative control: the reward with the wrong
    sign (a surrogate that would raise q_u's likelihood) gives a different value and gradient."""
    log_probs = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    kls = torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64)
    likelihoods = torch.tensor([0.2, 0.4, 0.9], dtype=torch.float64, requires_grad=True)
    value = method.lu_reinforce_surrogate(log_probs, kls, likelihoods, 2.0)
    assert float(value.detach()) == pytest.approx(2.9 / 3, rel=1e-12)
    value.backward()
    np.testing.assert_allclose(log_probs.grad.numpy(), np.array([-0.6, -0.2, 0.8]) / 3, rtol=1e-12)
    assert likelihoods.grad is None or float(likelihoods.grad.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="lambda"):
        method.lu_reinforce_surrogate(log_probs, kls, likelihoods, -0.1)


def flipped_surrogate(log_probs, step_kls, likelihoods, lam):
    """The surrogate with the reward's sign flipped (it would raise q_u's likelihood)."""
    return (-lam * (likelihoods - likelihoods.mean()).detach() * log_probs + step_kls).mean()


def test_lu_reinforce_surrogate_check_fails_with_the_reward_sign_flipped(monkeypatch):
    monkeypatch.setattr(method, "lu_reinforce_surrogate", flipped_surrogate)
    with pytest.raises(AssertionError):
        test_lu_reinforce_surrogate_exact()


class TimeScaledEps(torch.nn.Module):
    """eps_theta(x_t, t) = c (t + 1), c a 2-D parameter: constant in x but different at every step, so an
    off-by-one in the timestep handed to the network changes every mean (used for the sampler's replay)."""

    def __init__(self, value: tuple[float, float]) -> None:
        super().__init__()
        self.c = torch.nn.Parameter(torch.tensor(value))

    def forward(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return self.c[None, :] * (t.to(self.c.dtype) + 1)[:, None]


def shifted_gaussian(schedule: diffusion.NoiseSchedule, m: tuple[float, float]) -> torch.nn.Module:
    model = ShiftedGaussianEps(schedule)
    with torch.no_grad():
        model.m.copy_(torch.tensor(m))
    return model


def hand_lu_loss(model_m: np.ndarray, frozen_m: np.ndarray, schedule: diffusion.NoiseSchedule, states: np.ndarray,
                 lam: float, likelihood, steps: list[int]) -> float:
    """The on-policy LU loss over ``steps`` (scaled by T / len(steps)), in float64 numpy, for the exact N(m, I)
    networks eps(x, t) = sqrt(1 - abar_t) (x - sqrt(abar_t) m) (t-dependent through abar_t): ancestral mean
    (x - beta_s / sqrt(1 - abar_s) eps(x, s)) / sqrt(1 - beta_s), Gaussian log-probability of the next state and
    the step KL to the frozen mean."""
    betas = schedule.betas.double().numpy()
    abars = schedule.alpha_bars.double().numpy()
    n = states.shape[1]
    log_probs, kls = np.zeros(n), np.zeros(n)

    def step_mean(x: np.ndarray, s: int, m: np.ndarray) -> np.ndarray:
        eps = math.sqrt(1 - abars[s]) * (x - math.sqrt(abars[s]) * m)
        return (x - betas[s] / math.sqrt(1 - abars[s]) * eps) / math.sqrt(1 - betas[s])

    for s in steps:
        mean, frozen = step_mean(states[s + 1], s, model_m), step_mean(states[s + 1], s, frozen_m)
        log_probs += -((states[s] - mean) ** 2).sum(1) / (2 * betas[s]) - math.log(2 * math.pi * betas[s])
        kls += ((mean - frozen) ** 2).sum(1) / (2 * betas[s])
    scale = schedule.timesteps / len(steps)
    rewards = likelihood(states[0])
    return float(np.mean(lam * (rewards - rewards.mean()) * scale * log_probs + scale * kls))


def _one_lu_loss(lam: float = 1.5, timesteps: int = 4, grad_steps: int = 4) -> tuple[float, float]:
    """The library's loss and the hand one on the same trajectories: the generator is replayed (T + 1 normal
    draws of sample_trajectory, then the randperm that picks the gradient-carrying steps). Model N((0.3, -0.2), I),
    frozen N((0.1, 0.4), I), reward the density of N((0.5, -0.5), 0.7^2 I): the rewards differ between trajectories,
    so both the REINFORCE and the KL part carry weight."""
    schedule = diffusion.NoiseSchedule.linear(timesteps)
    model, frozen = shifted_gaussian(schedule, (0.3, -0.2)), shifted_gaussian(schedule, (0.1, 0.4))
    forget = single_gaussian(np.array([0.5, -0.5]), 0.7)

    def likelihood(points: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(forget.density(points.numpy().astype(np.float64)))

    loss = method.lu_reinforce_loss(model, frozen, schedule, likelihood, lam, n_trajectories=6,
                                    grad_steps=grad_steps)
    value = float(loss(torch.Generator().manual_seed(7)).detach())
    replay = torch.Generator().manual_seed(7)
    states = diffusion.sample_trajectory(model, schedule, 6, replay).double().numpy()
    steps = torch.randperm(timesteps, generator=replay)[:grad_steps].tolist()
    hand = hand_lu_loss(np.array([0.3, -0.2]), np.array([0.1, 0.4]), schedule, states, lam,
                        lambda x: forget.density(x), steps)
    return value, hand


CASES = [(4, 4), (10, 3)]  # every step (grad_steps = T), and the cpu path's subsample (x T / grad_steps)


@pytest.mark.parametrize("timesteps, grad_steps", CASES)
def test_lu_reinforce_loss_exact_on_hand_trajectories(timesteps, grad_steps):
    """lu_reinforce_loss equals the float64 hand computation on the same trajectories, with every step carrying
    the gradient and with 3 of 10 steps (the replayed randperm draw, scaled by 10/3). Negative controls below:
    an ancestral mean without the 1 / sqrt(1 - beta) factor, the network given step + 1 instead of step, and the
    Gaussian pieces broken inside the library each make the value miss the hand one."""
    value, hand = _one_lu_loss(timesteps=timesteps, grad_steps=grad_steps)
    assert value == pytest.approx(hand, rel=1e-5)


def mean_without_the_variance_factor(model, schedule, x, step):
    eps = model(x, torch.full((x.shape[0],), step, dtype=torch.long))
    return x - schedule.betas[step] / (1 - schedule.alpha_bars[step]).sqrt() * eps


def mean_with_the_next_timestep(model, schedule, x, step):
    """An off-by-one in the timestep handed to the network (step + 1, clipped to the last one)."""
    eps = model(x, torch.full((x.shape[0],), min(step + 1, schedule.timesteps - 1), dtype=torch.long))
    return (x - schedule.betas[step] / (1 - schedule.alpha_bars[step]).sqrt() * eps) / (
        1 - schedule.betas[step]).sqrt()


@pytest.mark.parametrize("timesteps, grad_steps", CASES)
@pytest.mark.parametrize("module, name, broken", [
    (diffusion, "denoising_mean", mean_without_the_variance_factor),
    (diffusion, "denoising_mean", mean_with_the_next_timestep),
    (method, "gaussian_log_prob", broken_log_prob),
    (method, "gaussian_step_kl", broken_step_kl),
    (method, "lu_reinforce_surrogate", flipped_surrogate)])
def test_lu_reinforce_loss_check_fails_with_a_broken_library(monkeypatch, timesteps, grad_steps, module, name,
                                                            broken):
    monkeypatch.setattr(module, name, broken)
    with pytest.raises(AssertionError):
        test_lu_reinforce_loss_exact_on_hand_trajectories(timesteps, grad_steps)


def check_sample_trajectory() -> None:
    """Replaying the generator by hand (noise order: x_T, then steps T-1 ... 0, each mean (x - beta /
    sqrt(1 - abar) c (s + 1)) / sqrt(1 - beta) plus sqrt(beta) e) gives every state; and diffusion.sample, which
    draws the same noise except the last step's, ends at states[0] - sqrt(beta_0) e_0."""
    schedule = diffusion.NoiseSchedule.linear(4)
    model = TimeScaledEps((0.3, -0.2))
    states = diffusion.sample_trajectory(model, schedule, 5, torch.Generator().manual_seed(3))
    assert states.shape == (5, 5, 2)
    replay = torch.Generator().manual_seed(3)
    betas, abars = schedule.betas.double(), schedule.alpha_bars.double()
    c = torch.tensor([0.3, -0.2], dtype=torch.float64)
    x = torch.randn((5, 2), generator=replay).double()
    hand = {4: x}
    for s in reversed(range(4)):
        mean = (x - betas[s] / (1 - abars[s]).sqrt() * c * (s + 1)) / (1 - betas[s]).sqrt()
        last_noise = torch.randn((5, 2), generator=replay).double()
        x = mean + betas[s].sqrt() * last_noise
        hand[s] = x
    for s in range(5):
        np.testing.assert_allclose(states[s].double().numpy(), hand[s].numpy(), rtol=1e-5, atol=1e-6)
    sampled = diffusion.sample(model, schedule, 5, torch.Generator().manual_seed(3)).double()
    np.testing.assert_allclose(sampled.numpy(), (hand[0] - betas[0].sqrt() * last_noise).numpy(), rtol=1e-5,
                               atol=1e-6)


def test_sample_trajectory_ends_where_the_sampler_does():
    check_sample_trajectory()


def test_sample_trajectory_check_fails_without_the_last_step_noise(monkeypatch):
    """Negative control: a trajectory sampler that drops the last step's noise (as diffusion.sample does) misses
    the replayed states."""
    @torch.no_grad()
    def without_last_noise(model, schedule, n, generator):
        states = [torch.randn((n, 2), generator=generator)]
        for step in reversed(range(schedule.timesteps)):
            mean = diffusion.denoising_mean(model, schedule, states[-1], step)
            noise = torch.randn((n, 2), generator=generator) if step > 0 else torch.zeros((n, 2))
            states.append(mean + schedule.betas[step].sqrt() * noise)
        return torch.stack(states[::-1])

    monkeypatch.setattr(diffusion, "sample_trajectory", without_last_noise)
    with pytest.raises(AssertionError):
        check_sample_trajectory()


def _lu_learning(lam: float, steps: int = 60) -> tuple[float, float]:
    """E[q_u(x_0)] under N(m, I) (m learnable, from 0) before and after ``steps`` Adam steps on the on-policy loss."""
    schedule = diffusion.NoiseSchedule.linear(50)
    model, frozen = ShiftedGaussianEps(schedule), ShiftedGaussianEps(schedule).eval()
    forget = single_gaussian(np.array([0.8, 0.0]), 0.6)

    def likelihood(points: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(forget.density(points.numpy().astype(np.float64)), dtype=torch.float32)

    def mean_likelihood() -> float:
        x = diffusion.sample(model, schedule, 4000, torch.Generator().manual_seed(11))
        return float(likelihood(x).mean())

    before = mean_likelihood()
    loss = method.lu_reinforce_loss(model, frozen, schedule, likelihood, lam, n_trajectories=256, grad_steps=4)
    diffusion.train(model, loss, steps, 0.02, torch.Generator().manual_seed(5))
    return before, mean_likelihood()


def test_on_policy_lu_lowers_the_likelihood_of_the_forget_concept():
    """A few on-policy steps at lambda = 5 move N(m, I)'s samples away from q_u: E_p[q_u] drops
    by more than 10%. Negative control: the surrogate with the reward's sign flipped raises it instead."""
    before, after = _lu_learning(5.0)
    assert after < 0.9 * before


def test_on_policy_lu_check_fails_with_the_reward_sign_flipped(monkeypatch):
    def flipped(log_probs, step_kls, likelihoods, lam):
        return (-lam * (likelihoods - likelihoods.mean()).detach() * log_probs + step_kls).mean()

    monkeypatch.setattr(method, "lu_reinforce_surrogate", flipped)
    before, after = _lu_learning(5.0)
    assert not after < 0.9 * before


# ------------------------------------------------------------------------------------------------
# RU composed with q_u's own score
# ------------------------------------------------------------------------------------------------

def _hand_gaussian_epsilon(x: np.ndarray, mean: np.ndarray, sigma: float, abar: np.ndarray) -> np.ndarray:
    """eps = sqrt(1 - abar) (x - sqrt(abar) mu) / (abar sigma^2 + 1 - abar) for q_u = N(mu, sigma^2 I)."""
    return np.sqrt(1 - abar)[:, None] * (x - np.sqrt(abar)[:, None] * mean) / (abar * sigma**2 + 1 - abar)[:, None]


def test_noised_score_epsilon_exact_for_a_gaussian():
    """q_u = N((1, -1), 0.5^2 I), T = 4, steps (1, 3) at x = (0.2, 0.7), (-1.5, 2.0): the library's eps equals
    the hand formula. Negative control: sigma_t = 1 - abar (not its square root) in the hand formula misses."""
    schedule = diffusion.NoiseSchedule.linear(4)
    forget = single_gaussian(np.array([1.0, -1.0]), 0.5)
    eps_fn = method.noised_score_epsilon(forget.noised_score_torch, schedule)
    x = torch.tensor([[0.2, 0.7], [-1.5, 2.0]], dtype=torch.float64)
    t = torch.tensor([1, 3])
    abar = schedule.alpha_bars[t].double().numpy()
    got = eps_fn(x, t).numpy()
    np.testing.assert_allclose(got, _hand_gaussian_epsilon(x.numpy(), forget.means[0], 0.5, abar), rtol=1e-6)


def test_noised_score_epsilon_check_fails_with_sigma_squared(monkeypatch):
    """Negative control: the library's eps built with sigma_t^2 = 1 - abar in place of sigma_t misses."""
    def broken(noised_score, schedule):
        abars = schedule.alpha_bars
        return lambda x_t, t: -(1 - abars[t])[:, None] * noised_score(x_t, abars[t])

    monkeypatch.setattr(method, "noised_score_epsilon", broken)
    with pytest.raises(AssertionError):
        test_noised_score_epsilon_exact_for_a_gaussian()


def test_ru_run_composed_with_qu_score_never_evaluates_p0(monkeypatch):
    """The cpu choice (ru_concept_score: analytic): RU's density-free run composed with q_u's own score completes
    under the guards that make q's density, its noised score and every p* function raise, and the dual variable
    and the weights move. Negative control: composing with q's noised score instead raises under the guard."""
    cfg = config("smoke")
    q = GaussianMixture(np.array([[0.0, 0.0], [2.0, 0.0]]), np.array([0.5, 0.5]), 0.4)
    forget = single_gaussian(np.array([2.0, 0.0]), 0.4)
    pool = torch.as_tensor(q.sample(256, np.random.default_rng(0)), dtype=torch.float32)
    pretrained = diffusion.build_model(cfg.ddpm.hidden, cfg.ddpm.layers, cfg.ddpm.time_dim, cfg.ddpm.timesteps, 0)
    forget_samples = torch.as_tensor(forget.sample(64, np.random.default_rng(1)), dtype=torch.float32)
    schedule = diffusion.NoiseSchedule.linear(cfg.ddpm.timesteps)
    calls = forbid_p0_and_target(monkeypatch)
    model = train.clone(pretrained)
    before = [p.detach().clone() for p in model.parameters()]
    concept = method.noised_score_epsilon(forget.noised_score_torch, schedule)
    run = train.density_free_unlearn("ru", cfg, model, pretrained, concept, pool, forget, forget_samples, schedule,
                                     1.0, lambda s: 0.5, 0.1, torch.Generator().manual_seed(0))
    assert calls == [] and run.lambdas[0] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    cheat = method.noised_score_epsilon(q.noised_score_torch, schedule)
    with pytest.raises(AssertionError, match="noised_score_torch"):
        train.density_free_unlearn("ru", cfg, train.clone(pretrained), pretrained, cheat, pool, forget,
                                   forget_samples, schedule, 1.0, lambda s: 0.5, 0.1, torch.Generator().manual_seed(0))


# ------------------------------------------------------------------------------------------------
# RU's threshold matched to LU's optimum's forget mass (C4)
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_problem():
    cfg = config("cpu")
    q, forget, _ = data.mixture_from_table(data.mixture_table(cfg.mixture, seed=0))
    _, problem = data.grid_problem(q, forget, cfg.grid)
    return cfg, problem


def test_ru_threshold_matched_to_lu_optimum_mass(cpu_problem):
    """With grid.ru_threshold = lu_matched_mass, RU's constrained optimum (bisection on its active constraint at
    the matched threshold) has the forget mass of LU's optimum to 1e-6, and that mass is more than 0.02 below q's
    (the optimum unlearns). Negative control: the requested-mass rule (the previous round's) leaves RU's optimum
    at a different mass, more than 0.01 above LU's."""
    cfg, problem = cpu_problem
    assert cfg.grid.ru_threshold == "lu_matched_mass"

    def mass(p: np.ndarray) -> float:
        return method.mass(p, problem.forget_mask, problem.cell)

    lu = stage_optimum("lu", problem, cfg.grid)
    ru = stage_optimum("ru", problem, cfg.grid)
    assert mass(ru.p) == pytest.approx(mass(lu.p), abs=1e-6)
    assert mass(method.normalise(problem.q, problem.cell)) - mass(ru.p) > 0.02
    assert ru.bound == pytest.approx(lu_matched_ru_bound(problem, cfg.grid.target_forget_mass), rel=1e-12)
    requested = stage_optimum("ru", problem, cfg.grid.model_copy(update={"ru_threshold": "requested_mass"}))
    assert mass(requested.p) - mass(lu.p) > 0.01


def test_lu_matched_ru_bound_is_the_constraint_at_the_matched_target(cpu_problem):
    """The bound is KL(p_RU(lambda_m) || q_u) with lambda_m the closed-form lambda of LU's optimum's mass, checked
    by an independent sum over the grid cells. Negative control: the KL in the other direction (FU's) differs."""
    cfg, problem = cpu_problem
    lu_mass = method.mass(stage_optimum("lu", problem, cfg.grid).p, problem.forget_mask, problem.cell)
    p = method.target("ru", problem, method.lambda_for_forget_mass("ru", problem, lu_mass))
    positive = p > 0
    hand = float(np.sum(p[positive] * (np.log(p[positive]) - problem.log_qu[positive])) * problem.cell)
    bound = model_module.lu_matched_ru_bound(problem, cfg.grid.target_forget_mass)
    assert bound == pytest.approx(hand, rel=1e-9)


def test_lu_matched_ru_bound_check_fails_with_the_other_kl(monkeypatch, cpu_problem):
    """Negative control: the library's bound taken with FU's constraint (KL(q_u || p), the other direction) at the
    same target misses the hand sum."""
    real = method.constraint_value

    def other_direction(formulation, p, problem):
        return real("fu" if formulation == "ru" else formulation, p, problem)

    monkeypatch.setattr(method, "constraint_value", other_direction)
    with pytest.raises(AssertionError):
        test_lu_matched_ru_bound_is_the_constraint_at_the_matched_target(cpu_problem)


def test_config_refuses_more_gradient_steps_than_timesteps():
    section = dict(params_section("constrained_unlearning")["smoke"])
    section["unlearn"] = dict(section["unlearn"], lu_grad_steps=section["ddpm"]["timesteps"] + 1)
    with pytest.raises(ValueError, match="lu_grad_steps"):
        CONFIG.model_validate(section)
