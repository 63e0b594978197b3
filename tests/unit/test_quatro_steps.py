"""quatro's steps: the sum-to-target task, config errors, the loss dispatch, the RL loop (both dual modes), the
claim metrics on a hand-built result, and train -> evaluate on a tiny config."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import yaml
from pydantic import ValidationError

from tasks.common.results import SeedResult
from tasks.quatro import baselines, claim_metrics, data, evaluate, train
from tasks.quatro.config import QuatroConfig
from tests.conftest import REPO

SMOKE = yaml.safe_load((REPO / "params.yaml").read_text())["quatro"]["smoke"]


@pytest.fixture(autouse=True)
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def config(**sections) -> QuatroConfig:
    raw = copy.deepcopy(SMOKE)
    for key, value in sections.items():
        raw[key] = raw[key] | value
    return QuatroConfig(**raw)


def rewards_are_exact() -> bool:
    task = config().task
    ids = torch.tensor([[3, 4], [4, 3], [10, 7], [9, 9], [0, 7], [7, 10]])
    targets = torch.tensor([7, 7, 7, 18, 8, 17])
    return data.rewards(ids, targets, task).tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_prompt_ids_and_rewards_exact():
    task = config().task
    assert data.prompt_ids(torch.tensor([7, 14]), task).tolist() == [[0, 7, 10], [1, 4, 10]]
    assert rewards_are_exact()  # "=" (id 10) is no digit even where 10 + 7 would hit a target
    with pytest.raises(ValueError, match="n_digits"):
        data.rewards(torch.zeros(2, 3, dtype=torch.long), torch.tensor([0, 0]), task)


def test_negative_control_reward_that_accepts_the_separator_is_caught(monkeypatch):
    monkeypatch.setattr(data, "rewards", lambda ids, t, task: (ids.sum(dim=1) == t).float())
    assert not rewards_are_exact()


def test_sft_batches_and_prompt_streams(tmp_path):
    cfg = config()
    batch = data.sft_batch(cfg.task, 64, torch.Generator().manual_seed(0))
    assert batch.shape == (64, data.sequence_length(cfg.task)) and bool((batch[:, 2] == data.SEP).all())
    assert bool((batch[:, 3:] < 10).all())
    targets = batch[:, 0] * 10 + batch[:, 1]
    assert int(targets.min()) >= cfg.task.min_target and int(targets.max()) <= cfg.task.max_target
    stream = data.prompt_stream(cfg, 3)
    assert stream.shape == (cfg.rl.steps, cfg.rl.prompts_per_step)
    assert np.array_equal(stream, data.prompt_stream(cfg, 3)) and not np.array_equal(stream, data.prompt_stream(cfg, 4))
    data.write_data(cfg, (3,), tmp_path)
    assert np.array_equal(data.load_prompt_stream(tmp_path, 3), stream)
    assert data.load_eval_targets(tmp_path) == list(range(cfg.task.min_target, cfg.task.max_target + 1))


@pytest.mark.parametrize(("section", "value", "match"), [
    ("task", {"min_target": 20, "max_target": 10}, "min_target"),
    ("task", {"max_target": 19}, "9 \\* n_digits"),
    ("rl", {"cells": [[0, 1e-2]]}, "epochs"),
    ("rl", {"cells": [[1, 2.0]]}, "learning rates"),
    ("rl", {"cells": [[1, 1e-2], [1, 1e-2]]}, "distinct"),
    ("rl", {"algorithms": ["grpo", "grpo"]}, "distinct"),
    ("rl", {"algorithms": ["ppo"]}, "algorithms"),
    ("rl", {"delta": 0.0}, "delta"),
    ("eval", {"ks": [16]}, "samples_per_prompt"),
])
def test_bad_params_name_the_problem(section, value, match):
    with pytest.raises(ValidationError, match=match):
        config(**{section: value})


def test_policy_loss_dispatch():
    cfg = config().rl
    new = torch.tensor([[0.1, -0.2], [0.0, 0.3]], dtype=torch.float64)
    old = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    lam = torch.tensor([0.5, 0.5], dtype=torch.float64)
    literal, _ = baselines.policy_loss("quatro_rho_log_rho", new, old, adv, mask, cfg, lam)
    general, _ = baselines.policy_loss("quatro", new, old, adv, mask, cfg, lam)
    # sequence level: the two stabilisers differ by lambda * mean(rho - 1)
    rho = torch.exp(new.sum(dim=1))
    assert float(literal - general) == pytest.approx(float((0.5 * (rho - 1)).mean()), abs=1e-14)
    with pytest.raises(ValueError, match="dual variable"):
        baselines.policy_loss("quatro", new, old, adv, mask, cfg)
    with pytest.raises(ValueError, match="unknown algorithm"):
        baselines.policy_loss("ppo", new, old, adv, mask, cfg)
    for name in ("grpo", "gspo", "reinforce_is"):
        loss, _ = baselines.policy_loss(name, new, old, adv, mask, cfg)
        assert bool(torch.isfinite(loss))


def lambda0_ablation_is_quatro_without_the_stabiliser() -> bool:
    cfg = config().rl
    new = torch.tensor([[0.1, -0.2], [0.0, 0.3]], dtype=torch.float64)
    old = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([0.5, -0.5], dtype=torch.float64)
    ablation, _ = baselines.policy_loss("reinforce_is", new, old, adv, mask, cfg)
    zero_lambda, _ = baselines.policy_loss("quatro", new, old, adv, mask, cfg, torch.zeros(2, dtype=torch.float64))
    # sequence level: -(1/N) sum_i rho_i A_i with rho = exp(-0.1), exp(0.3)
    by_hand = -0.5 * (math.exp(-0.1) * 0.5 - math.exp(0.3) * 0.5)
    return (abs(float(ablation) - by_hand) < 1e-14 and abs(float(zero_lambda) - by_hand) < 1e-14
            and baselines.ADVANTAGE_SCALE["reinforce_is"] == baselines.ADVANTAGE_SCALE["quatro"])


def test_reinforce_is_is_quatro_with_lambda_zero():
    assert lambda0_ablation_is_quatro_without_the_stabiliser()


def test_negative_control_token_level_std_reinforce_is_caught(monkeypatch):
    from tasks.common import rl

    original = baselines.policy_loss

    def old_reinforce(algorithm, new, old, adv, mask, rl_cfg, lambdas=None):
        if algorithm == "reinforce_is":
            return rl.reinforce_is_loss(new, old, adv, mask, aggregation="token")
        return original(algorithm, new, old, adv, mask, rl_cfg, lambdas)

    monkeypatch.setattr(baselines, "policy_loss", old_reinforce)
    assert not lambda0_ablation_is_quatro_without_the_stabiliser()


def test_gspo_equals_grpo_on_policy_with_equal_lengths():
    """Why the cpu profile runs only GRPO and QUATRO at mu = 1: on-policy (rho = 1) with equal response lengths the
    GSPO and GRPO gradients are identical (both (1/N) sum_i A_i (1/|y|) sum_t grad log pi), so their runs are too."""
    cfg = config().rl
    torch.manual_seed(3)
    logits = torch.randn(4, 3, requires_grad=True, dtype=torch.float64)
    old = logits.detach().clone()
    mask = torch.ones(4, 3, dtype=torch.bool)
    adv = torch.tensor([1.2, -0.4, 0.3, -1.1], dtype=torch.float64)
    grads = []
    for name in ("grpo", "gspo"):
        loss, _ = baselines.policy_loss(name, logits, old, adv, mask, cfg)
        grads.append(torch.autograd.grad(loss, logits)[0])
    assert torch.allclose(grads[0], grads[1], atol=1e-14)
    # off-policy they differ (the check can fail)
    loss_a, _ = baselines.policy_loss("grpo", logits, old - 0.3 * torch.arange(3.0, dtype=torch.float64), adv, mask,
                                      cfg)
    loss_b, _ = baselines.policy_loss("gspo", logits, old - 0.3 * torch.arange(3.0, dtype=torch.float64), adv, mask,
                                      cfg)
    assert not torch.allclose(torch.autograd.grad(loss_a, logits)[0], torch.autograd.grad(loss_b, logits)[0])


def test_duals_bisection_and_ascent_state():
    adv = torch.tensor([0.875] + [-0.125] * 7 + [0.0] * 8, dtype=torch.float64)
    bis = train.duals(adv, 8, [5, 6], config(rl={"delta": 0.05}).rl, {})
    assert float(bis[0]) == pytest.approx(1.25489, rel=1e-4) and bool((bis[8:] == 0).all())
    asc = train.duals(adv, 8, [5, 6], config(rl={"dual_mode": "ascent"}).rl, {5: 0.3, 6: 0.7})
    assert bool((asc[:8] == 0.3).all()) and bool((asc[8:] == 0).all())  # prompt 6's group is skipped
    fresh = train.duals(adv, 8, [9, 6], config(rl={"dual_mode": "ascent"}).rl, {})
    assert bool((fresh[:8] == train.LAMBDA_INIT).all())


@pytest.mark.parametrize("dual_mode", ["bisection", "ascent"])
def test_rl_run_logs_every_step_for_every_algorithm(dual_mode):
    cfg = config(rl={"steps": 3, "dual_mode": dual_mode, "cells": [[2, 1e-2]], "rollout_lag": 1})
    sft, _ = train.warm_start(cfg, 0)
    batches = train.digit_batches(data.prompt_stream(cfg, 0), cfg)
    for algorithm in ("grpo", "gspo", "reinforce_is", "quatro", "quatro_rho_log_rho"):
        policy = copy.deepcopy(sft)
        log = train.rl_run(policy, algorithm, 2, 1e-2, batches, cfg.rl, cfg.task.n_digits, seed=1)
        assert len(log.reward) == len(log.entropy) == len(log.outside_clip) == 3
        assert all(0.0 <= v <= 1.0 for v in log.reward + log.outside_clip)
        assert any(not torch.equal(a, b) for a, b in zip(policy.parameters(), sft.parameters(), strict=True))
        # the exact KL to the behaviour policy: one per step, never negative
        assert len(log.exact_kl_mean) == 3 and min(log.exact_kl_mean + log.exact_kl_values) >= -1e-9
        lam = np.array(log.lambda_mean)
        assert np.isnan(lam).all() == (algorithm not in baselines.STABILISER)


def synthetic_result(cfg: QuatroConfig) -> SeedResult:
    """Every metric claim_metrics reads, with distinct values per algorithm and cell (only the planned runs)."""
    metrics = {}
    order = {a: i for i, a in enumerate(cfg.rl.algorithms)}
    cell_index = {c: i for i, c in enumerate(train.cells(cfg.rl))}
    for algorithm, epochs, lr in train.planned_runs(cfg.rl):
        name = train.run_name(algorithm, epochs, lr)
        base = 0.1 * order[algorithm] + 0.01 * cell_index[(epochs, lr)]
        metrics |= {f"{name}_eval_pass_at_{k}": base + 0.001 * k for k in cfg.eval.ks}
        metrics |= {f"{name}_eval_unique_correct": base + 1, f"{name}_eval_entropy": base + 2,
                    f"{name}_exact_kl_median": base + 3, f"{name}_outside_clip": base + 4,
                    f"{name}_final_reward": base + 5, f"{name}_exact_kl_p90": base + 6, f"{name}_median_kl": base + 7,
                    f"{name}_drift_kl": base + 8, f"{name}_reward_drawdown": base + 9}
    metrics |= {f"sft_eval_pass_at_{k}": 0.05 * k for k in cfg.eval.ks} | {"sft_eval_entropy": 2.3}
    return SeedResult(0).add(metrics)


FULL_GRID = {"algorithms": ["grpo", "gspo", "reinforce_is", "quatro", "quatro_rho_log_rho"],
             "on_policy_algorithms": ["grpo", "quatro"], "cells": [[1, 3e-3], [1, 1e-2], [8, 1e-2]]}


def test_claim_metrics_exact_on_a_hand_built_result():
    cfg = config(rl=FULL_GRID)
    out = claim_metrics.claim_metrics(cfg, synthetic_result(cfg))
    # cells: fresh (1, 3e-3) index 0, aggressive (1, 1e-2) index 1, stale (8, 1e-2) index 2; quatro is a_i = 3
    assert out["stale_quatro_pass8"] == pytest.approx(0.3 + 0.02 + 0.008)
    assert out["fresh_grpo_pass8"] == pytest.approx(0.008)
    assert out["stale_pass8_gap_grpo"] == pytest.approx(0.3)
    assert out["stale_kl_gap_gspo"] == pytest.approx(0.1 - 0.3)
    assert out["stale_entropy_gap_reinforce_is"] == pytest.approx(0.1)
    assert out["stale_quatro_kl_over_delta"] == pytest.approx((0.32 + 3) / cfg.rl.delta)
    assert out["stale_quatro_kl_p90_over_delta"] == pytest.approx((0.32 + 6) / cfg.rl.delta)
    assert out["stale_grpo_kl_over_delta"] == pytest.approx((0.02 + 3) / cfg.rl.delta)
    assert out["stale_quatro_sample_kl_over_delta"] == pytest.approx((0.32 + 7) / cfg.rl.delta)
    # drift pooled over the five stale-cell algorithms: mean of 0.1 a_i + 0.02 + 8
    assert out["stale_drift_kl_over_delta"] == pytest.approx((0.2 + 0.02 + 8) / cfg.rl.delta)
    assert out["grpo_stale_pass8_drop"] == pytest.approx(-0.02)
    assert out["quatro_stale_pass8_drop"] == pytest.approx(-0.02)
    assert out["quatro_aggressive_pass8_drop"] == pytest.approx(-0.01)
    assert out["grpo_aggressive_pass8_drop"] == pytest.approx(-0.01)
    assert "gspo_stale_pass8_drop" not in out and "fresh_gspo_pass8" not in out  # gspo not run on-policy
    assert out["stale_grpo_entropy_drop"] == pytest.approx(2.3 - 2.02)
    assert out["stale_large_k_gain_grpo"] == pytest.approx(0.0)  # equal gaps at k = 1 and k = 8
    assert out["stale_grpo_outside_clip"] == pytest.approx(4.02)
    assert out["stale_pass8_gap_literal"] == pytest.approx(-0.1)
    assert out["stale_literal_pass8_gap_grpo"] == pytest.approx(0.4)
    assert out["sft_pass8"] == pytest.approx(0.4)
    # strongest GRPO-style baseline per seed: GSPO (a_i = 1) is closer to QUATRO than GRPO
    assert out["stale_entropy_gap_strongest"] == pytest.approx(0.2)
    assert out["stale_unique_correct_gap_strongest"] == pytest.approx(0.2)
    assert out["stale_pass1_gap_strongest"] == pytest.approx(0.2)
    assert out["stale_quatro_pass1_gain_over_sft"] == pytest.approx(0.321 - 0.05)
    assert out["stale_entropy_below_sft"] == pytest.approx(2.3 - 2.32)
    assert out["stale_pass8_gap_sft"] == pytest.approx(0.328 - 0.4)
    assert out["stale_reinforce_is_reward_drawdown"] == pytest.approx(0.22 + 9)


def test_negative_control_strongest_baseline_reading_grpo_only_is_caught(monkeypatch):
    cfg = config(rl=FULL_GRID)
    monkeypatch.setattr(claim_metrics, "GRPO_STYLE", ("grpo",))
    out = claim_metrics.claim_metrics(cfg, synthetic_result(cfg))
    assert out["stale_entropy_gap_strongest"] != pytest.approx(0.2)


def test_planned_runs_and_aggressive_cell():
    cfg = config(rl=FULL_GRID)
    runs = train.planned_runs(cfg.rl)
    assert runs[:4] == [("grpo", 1, 3e-3), ("quatro", 1, 3e-3), ("grpo", 1, 1e-2), ("quatro", 1, 1e-2)]
    assert [a for a, e, _ in runs if e == 8] == cfg.rl.algorithms
    assert claim_metrics.aggressive_cell(cfg) == (1, 1e-2)
    assert claim_metrics.aggressive_cell(config(rl={"cells": [[1, 1e-2], [2, 1e-2]]})) is None
    with pytest.raises(ValidationError, match="subset"):
        config(rl={"algorithms": ["grpo"], "on_policy_algorithms": ["quatro"]})


def test_reward_drawdown_exact():
    # 10 steps: best 10-step window mean = 5.6 / 10 (the only window), final (last 2) = 0.1 -> 0.46
    reward = [0.2, 0.6, 0.8, 0.9, 1.0, 0.9, 0.5, 0.5, 0.1, 0.1]
    assert train.reward_drawdown(reward) == pytest.approx(0.56 - 0.1)
    # window 2 on 5 steps: moving means 0.5, 1.0, 0.5, 0.0; final (last 1) = 0.0 -> 1.0
    assert train.reward_drawdown([0.0, 1.0, 1.0, 0.0, 0.0], window=2) == pytest.approx(1.0)


def test_response_logprob_table_is_a_distribution_and_matches_a_direct_forward():
    cfg = config()
    torch.manual_seed(0)
    model, _ = train.warm_start(cfg, 0)
    prompts = data.prompt_ids(torch.tensor([7, 12]), cfg.task)
    space = data.all_responses(cfg.task)
    table = train.response_logprob_table(model, prompts, space)
    assert table.shape == (2, 121)
    assert torch.logsumexp(table, dim=1).exp().tolist() == pytest.approx([1.0, 1.0], abs=1e-5)
    row = space.tolist().index([3, 4])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, data.SEP, 3, 4]])).logits.double()
    logp = torch.log_softmax(logits, dim=-1)
    direct = float(logp[0, 2, 3] + logp[0, 3, 4])
    assert float(table[1, row]) == pytest.approx(direct, abs=1e-6)
    # the exact KL of a policy to itself is 0
    assert method_kl_zero(table)


def method_kl_zero(table: torch.Tensor) -> bool:
    from tasks.quatro import method

    return bool(torch.allclose(method.exact_response_kl(table, table), torch.zeros(2, dtype=torch.float64)))


def test_train_then_evaluate_on_a_tiny_config(tmp_path):
    cfg = config(rl={"steps": 2})
    data.write_data(cfg, (0,), tmp_path / "data")
    trained = train.train(cfg, 0, tmp_path / "data", tmp_path / "models")
    names = [train.run_name(a, e, lr) for a, e, lr in train.planned_runs(cfg.rl)]
    assert all((tmp_path / "models" / n / "model.safetensors").is_file() for n in [train.SFT_DIR, *names])
    assert all(len(trained.curves[f"{n}_reward"]) == 2 for n in names)
    measured = evaluate.evaluate(cfg, 0, tmp_path / "data", tmp_path / "models")
    n_targets = cfg.task.max_target - cfg.task.min_target + 1
    for n in [train.SFT_DIR, *names]:
        assert measured.metrics[f"{n}_eval_sample_count"] == n_targets * cfg.eval.samples_per_prompt
        values = [measured.metrics[f"{n}_eval_pass_at_{k}"] for k in cfg.eval.ks]
        assert values == sorted(values) and 0.0 <= values[0] and values[-1] <= 1.0
    merged = trained.merged(measured)
    out = claim_metrics.claim_metrics(cfg, merged)
    assert np.isfinite(out["stale_pass8_gap_grpo"]) and np.isfinite(out["stale_quatro_kl_over_delta"])
    assert out["stale_drift_kl_over_delta"] >= 0 and out["stale_quatro_kl_p90_over_delta"] >= 0
