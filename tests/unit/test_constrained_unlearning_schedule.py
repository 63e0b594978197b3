"""Stage B's per-formulation dual schedule (train.dual_schedule): RU's own number of dual updates at the same
normalised dual step (README, "Round 4 budgets"), and that every run of unlearn_each_formulation receives it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.common.params import params_section
from tasks.constrained_unlearning import data, diffusion, method, train
from tasks.constrained_unlearning.config import CONFIG
from tasks.constrained_unlearning.model import noise_schedule


def distinct_config():
    """The smoke config with every count distinct, so that no mix-up of keys can give the right numbers."""
    cfg = CONFIG.model_validate(params_section("constrained_unlearning")["smoke"])
    un = cfg.unlearn.model_copy(update={"dual_updates": 3, "steps_per_dual": 2, "lu_steps_per_dual": 1,
                                        "ru_dual_updates": 5, "ru_steps_per_dual": 4, "lu_trajectories": 8,
                                        "lu_grad_steps": 2, "dual_samples": 50, "forget_samples": 50})
    return cfg.model_copy(update={"unlearn": un})


def test_dual_schedule_exact():
    un = distinct_config().unlearn
    assert train.dual_schedule("ru", un, density_free=True) == (5, 4)
    assert train.dual_schedule("ru", un, density_free=False) == (5, 4)
    assert train.dual_schedule("fu", un, density_free=True) == (3, 2)
    assert train.dual_schedule("fu", un, density_free=False) == (3, 2)
    assert train.dual_schedule("lu", un, density_free=True) == (3, 1)
    assert train.dual_schedule("lu", un, density_free=False) == (3, 2)


def test_cpu_ru_dual_updates_follow_the_grid_only_rule():
    """The README's rule, stated before the round-4 run: RU's dual updates >= 2 x max over the cpu seeds of
    lambda_b*|g0|/s (the updates a full-violation ramp needs), and grid.iterations >= 20 x the same maximum.
    Negative control: the round-3 budget (40 updates, 300 iterations) breaks the rule."""
    from tasks.constrained_unlearning.model import stage_optimum
    section = params_section("constrained_unlearning")
    cfg = CONFIG.model_validate(section["cpu"])
    needed = []
    for seed in section["seeds"]["cpu"]:
        q, forget, _ = data.mixture_from_table(data.mixture_table(cfg.mixture, seed))
        _, problem = data.grid_problem(q, forget, cfg.grid)
        optimum = stage_optimum("ru", problem, cfg.grid)
        needed.append(optimum.lam * abs(optimum.start_violation) / cfg.unlearn.dual_step)
    worst = max(needed)
    assert 60 < worst < 70  # seed 1: 69.6 (README's table)
    assert cfg.unlearn.ru_dual_updates >= 2 * worst and cfg.grid.iterations >= 20 * worst
    assert not (40 >= 2 * worst) and not (300 >= 20 * worst)


def record_runs(monkeypatch) -> list[tuple[str, str, int, int]]:
    """Replace both primal-dual loops by recorders: (formulation, which run, dual updates, steps per update)."""
    calls: list[tuple[str, str, int, int]] = []

    def fake(kind):
        def run(formulation, *args, dual_updates, steps_per_dual, **kwargs):
            calls.append((formulation, kind, dual_updates, steps_per_dual))
            return method.UnlearnResult(0.1, [0.1] * dual_updates, [0.0] * dual_updates, [])
        return run

    monkeypatch.setattr(method, "primal_dual_unlearn", fake("analytic"))
    monkeypatch.setattr(method, "primal_dual_loop", fake("density_free"))
    return calls


def run_each_formulation(cfg, tmp_path):
    from tasks.common.results import SeedResult
    rng = np.random.default_rng(0)
    frame = data.mixture_table(cfg.mixture, 0)
    q, forget, _ = data.mixture_from_table(frame)
    pool = torch.as_tensor(q.sample(200, rng), dtype=torch.float32)
    pretrained = diffusion.build_model(cfg.ddpm.hidden, cfg.ddpm.layers, cfg.ddpm.time_dim, cfg.ddpm.timesteps, 0)
    result = SeedResult(0)
    train.unlearn_each_formulation(cfg, 0, pretrained, pool, q, forget, noise_schedule(cfg.ddpm), tmp_path, result,
                                   lambda fraction, message: None)
    return result


def expected_runs(un) -> set[tuple[str, str, int, int]]:
    return {("ru", "analytic", un.ru_dual_updates, un.ru_steps_per_dual),
            ("ru", "density_free", un.ru_dual_updates, un.ru_steps_per_dual),
            ("fu", "analytic", un.dual_updates, un.steps_per_dual),
            ("fu", "density_free", un.dual_updates, un.steps_per_dual),
            ("lu", "analytic", un.dual_updates, un.steps_per_dual),
            ("lu", "density_free", un.dual_updates, un.lu_steps_per_dual)}


def test_every_stage_b_run_gets_its_formulations_schedule(monkeypatch, tmp_path):
    cfg = distinct_config()
    calls = record_runs(monkeypatch)
    result = run_each_formulation(cfg, tmp_path)
    assert len(calls) == 6 and set(calls) == expected_runs(cfg.unlearn)
    assert len(result.curves["b_lambda_ru"]) == 5 and len(result.curves["b_lambda_fu_analytic"]) == 3


def test_every_stage_b_run_control_a_formulation_blind_schedule_fails(monkeypatch, tmp_path):
    """Negative control: the round-3 library (one count for all formulations) gives RU 3 updates, not 5."""
    cfg = distinct_config()
    calls = record_runs(monkeypatch)
    monkeypatch.setattr(train, "dual_schedule", lambda f, un, density_free: (
        un.dual_updates, un.lu_steps_per_dual if f == "lu" and density_free else un.steps_per_dual))
    run_each_formulation(cfg, tmp_path)
    with pytest.raises(AssertionError):
        assert set(calls) == expected_runs(cfg.unlearn)
