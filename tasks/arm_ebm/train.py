"""Training step of arm_ebm: every model a seed fits, saved in ``models/arm_ebm/seed<N>/`` (``model.py``).

- E2 / E4: the tiny GPT-2 ARM, next-token prediction on the population cross-entropy under p_R
  (README, "Training the GPT-2 ARM");
- E3 (neural): the MLP energy by exact-partition MLE (``method.train_neural_ebm``);
- E3 (tabular): the tabular ARM (teacher forcing) and tabular EBM (exact MLE) on the same samples.

Returns the training curves and the GPT-2's training summary. The paper profile trains nothing (E1, E4 and
the hub identity are evaluation only). Training runs on the CPU whatever ``device`` says: the models are
tiny and their numbers are those of CPU runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tasks.arm_ebm import data, method
from tasks.arm_ebm.config import ArmEbmConfig, TabularConfig
from tasks.arm_ebm.model import GPT2_DIR, gpt2_arm_config, save_neural_ebm, save_tabular, toy_rewards_and_target
from tasks.common import tiny_lm
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.schedules import warmup_cosine


def gpt2_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              schedule: torch.optim.lr_scheduler.LRScheduler, ids: np.ndarray, targets: np.ndarray,
              vocab_size: int) -> float:
    """One Adam step on the population cross-entropy of a batch of prefixes (clipped at norm 1)."""
    targets_t = torch.as_tensor(targets, dtype=torch.float32)
    loss = method.population_cross_entropy(model(input_ids=torch.as_tensor(ids)).logits, targets_t, vocab_size)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    return float(loss.detach())


def train_gpt2_arm(cfg: ArmEbmConfig, seed: int, target: np.ndarray, progress: Progress = no_progress
                   ) -> tuple[torch.nn.Module, list[float], dict[str, float]]:
    """Next-token prediction on the population cross-entropy E_{x, y ~ p_R}[-log p_q(y|x)].

    Every step draws ``batch_size`` prefixes y_<T from p_R and scores the model's next-token law at each of
    the T positions against the exact pi_R(.|s_t) (soft targets): an unbiased estimate of the population
    cross-entropy whose gradient vanishes on every prefix once p_q = p_R, so training is not held above the
    floor by label noise. The full enumeration (X V**(T-1) inputs per step) costs about 400 times a 64-prefix
    step. Adam, linear warm-up, cosine decay over ``steps`` (``warmup_cosine``); stops early once the mean
    training KL estimate (loss minus the targets' entropy, unbiased for KL(p_R || p_q)) of the last
    ``stop_window`` steps is <= ``stop_kl``.

    Returns (model, per-step training cross-entropy estimates, training summary metrics).
    """
    toy, g = cfg.toy, cfg.gpt2
    model = tiny_lm.build_tiny_gpt2(gpt2_arm_config(toy, g), seed=seed)
    rng = np.random.default_rng(30_000 + seed)
    target_log_pi = method.next_token_log_probs(target, toy.vocab_size)
    cdf = np.cumsum(np.exp(target), axis=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=g.lr, foreach=True)
    schedule = warmup_cosine(optimizer, g.steps, g.warmup_steps)
    every = max(1, g.steps // 10)
    losses: list[float] = []
    kl_estimates: list[float] = []
    model.train()
    for step in range(g.steps):
        samples = method.sample_sequences(target, g.batch_size, rng, toy.vocab_size, cdf=cdf)
        ids, targets = method.prefix_inputs_and_targets(samples, target_log_pi, toy.vocab_size)
        losses.append(gpt2_step(model, optimizer, schedule, ids, targets, toy.vocab_size))
        kl_estimates.append(losses[-1] - method.mean_target_entropy(targets))
        running = float(np.mean(kl_estimates[-g.stop_window:]))
        if (step + 1) % every == 0:
            progress((step + 1) / g.steps, f"seed {seed}: GPT-2 step {step + 1}/{g.steps}, KL estimate {running:.4f}")
        if g.stop_kl is not None and len(kl_estimates) >= g.stop_window and running <= g.stop_kl:
            break
    model.eval()
    summary = {"e2_gpt2_steps": float(len(losses)),
               "e2_gpt2_final_train_kl_estimate": float(np.mean(kl_estimates[-g.stop_window:])) if losses
               else float("nan")}
    return model, losses, summary


def final_train_nll(losses: list[float]) -> float:
    """Mean training cross-entropy estimate of the last 5% of the steps (NaN without steps)."""
    return float(np.mean(losses[-max(1, len(losses) // 20):])) if losses else float("nan")


def train_tabular(tab: TabularConfig, samples: np.ndarray, seed: int) -> tuple[method.Tables, np.ndarray, dict]:
    """E3 (tabular): ARM logit tables by teacher forcing and an EBM energy table by exact-partition MLE, on
    the same samples; returns (q tables, energy table, their NLL curves)."""
    q, arm_curve = method.fit_tabular_arm(samples, tab.vocab_size, tab.horizon, tab.n_prompts, tab.steps,
                                          tab.lr, seed)
    energy, ebm_curve = method.fit_tabular_ebm(samples, tab.vocab_size, tab.horizon, tab.n_prompts, tab.steps,
                                               tab.lr, seed)
    return q, energy, {"tabular_arm_nll": arm_curve, "tabular_ebm_nll": ebm_curve}


def train_gpt2_and_neural_ebm(cfg: ArmEbmConfig, seed: int, data_dir: Path, model_dir: Path, result: SeedResult,
                              progress: Progress) -> None:
    """E2's GPT-2 ARM on the data phase's toy, then (where configured) E3's MLP energy; both saved."""
    energy = data.read_toy_energy(data_dir, cfg.toy, seed)
    data.check_toy_energy(energy, cfg.toy, seed)
    with result.stage("e2_gpt2_train"):
        model, losses, summary = train_gpt2_arm(cfg, seed, method.ebm_log_probs(energy), progress)
        tiny_lm.save_model(model, Path(model_dir) / GPT2_DIR)
    result.add(summary, e2_gpt2_final_train_nll=final_train_nll(losses), curves={"gpt2_train_nll": losses})
    if cfg.neural_ebm is not None:
        n, toy = cfg.neural_ebm, cfg.toy
        _, target = toy_rewards_and_target(toy, seed)
        with result.stage("e3_neural_train"):
            energy_net, curve = method.train_neural_ebm(target, toy.vocab_size, toy.horizon, n.hidden, n.steps,
                                                        n.lr, seed, n.prompts_per_step)
            save_neural_ebm(energy_net, model_dir)
        result.add(curves={"neural_ebm_nll": curve})


def train(cfg: ArmEbmConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    """Every model of one seed, each saved in ``model_dir`` (= ``models/arm_ebm/seed<N>/``)."""
    result = SeedResult(seed)
    if cfg.gpt2 is not None:
        train_gpt2_and_neural_ebm(cfg, seed, data_dir, model_dir, result, progress)
    if cfg.tabular is not None:
        samples = data.read_tabular_samples(data_dir, seed)
        with result.stage("e3_tabular_train"):
            q, energy, curves = train_tabular(cfg.tabular, samples, seed)
            save_tabular(q, energy, model_dir)
        result.add(curves=curves)
    progress(1.0, f"seed {seed}: trained")
    return result
