"""Training step of quatro: a supervised warm start, then RL with each algorithm in each staleness x lr cell.

Per seed: one tiny GPT-2 is warm-started on uniformly random digit strings (the format, no knowledge of sums), then
each algorithm of ``rl.algorithms`` trains a copy of it in every cell (mu update epochs per rollout batch, learning
rate). A stale cell (mu > 1) also samples from a behaviour policy ``rollout_lag`` updates behind
(``tasks.common.rl.LaggedPolicy``). Every optimiser step is one full-batch update; epochs after the first (and any
lag) are off-policy, the importance ratios correcting for it. Checkpoints: ``sft/`` and ``<algorithm>_<cell>/``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2LMHeadModel

from tasks.common import rl
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.tiny_lm import build_tiny_gpt2, save_model, tiny_gpt2_config, train_causal_lm
from tasks.quatro import method
from tasks.quatro.baselines import ADVANTAGE_SCALE, is_quatro, policy_loss
from tasks.quatro.config import Algorithm, QuatroConfig, RLConfig
from tasks.quatro.data import (
    VOCAB_SIZE,
    all_responses,
    load_prompt_stream,
    prompt_ids,
    rewards,
    sequence_length,
    sft_batch,
)

SFT_DIR = "sft"
LAMBDA_INIT = 1.0  # dual ascent's starting lambda for a prompt seen for the first time
DRIFT_STEPS = 10  # the first steps over which the drift statistic (exact KL to the behaviour policy) is averaged
DRAWDOWN_WINDOW = 10  # steps of the moving mean whose best value the final reward is compared with


def cell_name(epochs: int, lr: float) -> str:
    return f"mu{epochs}_lr{lr:g}"


def run_name(algorithm: str, epochs: int, lr: float) -> str:
    return f"{algorithm}_{cell_name(epochs, lr)}"


def cells(rl_cfg: RLConfig) -> list[tuple[int, float]]:
    return [(int(e), float(lr)) for e, lr in rl_cfg.cells]


def cell_algorithms(rl_cfg: RLConfig, epochs: int) -> list[Algorithm]:
    """The algorithms run in a cell: all of them off-policy (mu > 1), ``on_policy_algorithms`` at mu = 1."""
    if epochs == 1 and rl_cfg.on_policy_algorithms is not None:
        return [a for a in rl_cfg.algorithms if a in rl_cfg.on_policy_algorithms]
    return list(rl_cfg.algorithms)


def planned_runs(rl_cfg: RLConfig) -> list[tuple[Algorithm, int, float]]:
    """(algorithm, epochs, lr) of every RL run of a seed, cell by cell."""
    return [(a, e, lr) for e, lr in cells(rl_cfg) for a in cell_algorithms(rl_cfg, e)]


@dataclass
class RunLog:
    """Per-step curves of one RL run and the per-query KLs of every active group."""

    reward: list[float] = field(default_factory=list)
    entropy: list[float] = field(default_factory=list)          # -mean log pi_old(y_t) over sampled tokens
    outside_clip: list[float] = field(default_factory=list)     # mean over the epochs of the batch
    median_kl: list[float] = field(default_factory=list)        # sample estimate (diagnostic), median of active groups
    lambda_mean: list[float] = field(default_factory=list)
    kl_values: list[float] = field(default_factory=list)        # sample estimate per active group (diagnostic)
    exact_kl_values: list[float] = field(default_factory=list)  # exact KL to the behaviour policy per active group
    exact_kl_mean: list[float] = field(default_factory=list)    # exact KL per step, mean over all the batch's prompts


def duals(advantages: torch.Tensor, group_size: int, keys: list[int], rl_cfg: RLConfig,
          ascent_state: dict[int, float]) -> torch.Tensor:
    """lambda per row: bisection (method.group_duals) or the prompt's current dual-ascent value (0 if skipped)."""
    if rl_cfg.dual_mode == "bisection":
        per_group = method.group_duals(advantages, group_size, rl_cfg.delta, lam_min=rl_cfg.lam_min)
    else:
        grouped = advantages.reshape(-1, group_size)
        per_group = torch.tensor([0.0 if method.is_degenerate(g) else ascent_state.get(k, LAMBDA_INIT)
                                  for g, k in zip(grouped, keys, strict=True)], dtype=torch.float64)
    return method.per_row(per_group, group_size)


@dataclass(frozen=True)
class PromptBatch:
    """One RL step's prompts: ids (B, P) left-padded with ``mask``, a key per prompt (dual ascent's state) and the
    verifier ``score(completion_ids (B * G, T)) -> rewards (B * G,)`` (rows of a prompt contiguous). ``responses``
    (R, T): the whole response space when it can be enumerated (then the exact per-query KL is logged), else None."""

    ids: torch.Tensor
    mask: torch.Tensor | None
    keys: list[int]
    score: Callable[[torch.Tensor], torch.Tensor]
    responses: torch.Tensor | None = None


@torch.no_grad()
def response_logprob_table(model: torch.nn.Module, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """log pi(y | x) of every response y (R, T) after every unpadded prompt x (B, P): (B, R) float64."""
    b, p = prompts.shape
    r, t = responses.shape
    ids = torch.cat([prompts.repeat_interleave(r, dim=0), responses.repeat(b, 1)], dim=1)
    logp = torch.log_softmax(model(input_ids=ids).logits[:, p - 1:p + t - 1].double(), dim=-1)
    return logp.gather(2, ids[:, p:].unsqueeze(2)).squeeze(2).sum(dim=1).reshape(b, r)


def digit_batches(stream: np.ndarray, cfg: QuatroConfig) -> list[PromptBatch]:
    """The sum-to-target prompt stream (steps, prompts_per_step) as PromptBatches."""
    g, task = cfg.rl.group_size, cfg.task
    space = all_responses(task)
    out = []
    for step_targets in stream:
        t = torch.tensor(step_targets)
        out.append(PromptBatch(prompt_ids(t, task), None, [int(v) for v in step_targets],
                               lambda ids, t=t: rewards(ids, t.repeat_interleave(g), task), space))
    return out


def rl_run(policy: torch.nn.Module, algorithm: Algorithm, epochs: int, lr: float, batches: list[PromptBatch],
           rl_cfg: RLConfig, max_new_tokens: int, seed: int, eos_token_id: int | None = None,
           pad_token_id: int | None = None, on_step: Callable[[int], None] | None = None) -> RunLog:
    """Train ``policy`` in place with ``algorithm``, one rollout batch per element of ``batches``; returns the log."""
    g = rl_cfg.group_size
    optimizer = torch.optim.Adam(policy.parameters(), lr=lr)
    lagged = rl.LaggedPolicy(policy, rl_cfg.rollout_lag if epochs > 1 else 0)
    generator = torch.Generator(device=batches[0].ids.device).manual_seed(seed)
    ascent_state: dict[int, float] = {}
    log = RunLog()
    policy.train()
    for step, batch in enumerate(batches):
        ro = rl.sample_group(lagged.behaviour, batch.ids, g, max_new_tokens, seed=generator, prompt_mask=batch.mask,
                             eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        reward = batch.score(ro.completion_ids).to(ro.old_logprobs.device)
        adv = rl.group_advantages(reward, g, scale=ADVANTAGE_SCALE[algorithm])
        lambdas = duals(adv, g, batch.keys, rl_cfg, ascent_state) if is_quatro(algorithm) else None
        mask = ro.completion_mask
        enumerable = batch.responses is not None and batch.mask is None
        behaviour_table = (response_logprob_table(lagged.behaviour, batch.ids, batch.responses) if enumerable
                           else None)
        outside, lam_stats = [], []
        for _ in range(epochs):
            new = rl.rollout_logprobs(policy, ro)
            loss, stats = policy_loss(algorithm, new, ro.old_logprobs, adv, mask, rl_cfg, lambdas)
            outside.append(method.outside_clip_fraction(new - ro.old_logprobs, mask, rl_cfg.clip_eps, rl_cfg.clip_eps))
            lam_stats.append(stats.get("lambda_mean", float("nan")))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), rl_cfg.max_grad_norm)
            optimizer.step()
            lagged.update()
        with torch.no_grad():
            seq_log_ratio = method.sequence_log_ratios(rl.rollout_logprobs(policy, ro), ro.old_logprobs, mask)
        kl = method.per_query_kl(seq_log_ratio, g).cpu()
        active = torch.tensor([not method.is_degenerate(a) for a in adv.reshape(-1, g)])
        if is_quatro(algorithm) and rl_cfg.dual_mode == "ascent":
            for key, k_val, lam, act in zip(batch.keys, kl.tolist(), lambdas.reshape(-1, g)[:, 0].tolist(),
                                            active.tolist(), strict=True):
                if act:
                    ascent_state[key] = method.dual_ascent_step(lam, k_val, rl_cfg.delta, rl_cfg.dual_step_size,
                                                                rl_cfg.lam_min)
        active_kl = kl[active].tolist()
        log.kl_values += active_kl
        if behaviour_table is not None:
            exact = method.exact_response_kl(response_logprob_table(policy, batch.ids, batch.responses),
                                             behaviour_table)
            log.exact_kl_values += exact[active].tolist()
            log.exact_kl_mean.append(float(exact.mean()))
        log.reward.append(float(reward.mean()))
        log.entropy.append(float(-ro.old_logprobs[mask].mean()))
        log.outside_clip.append(float(np.mean(outside)))
        log.median_kl.append(float(np.median(active_kl)) if active_kl else float("nan"))
        log.lambda_mean.append(float(np.nanmean(lam_stats)) if is_quatro(algorithm) else float("nan"))
        if on_step is not None:
            on_step(step)
    policy.eval()
    return log


def warm_start(cfg: QuatroConfig, seed: int) -> tuple[GPT2LMHeadModel, list[float]]:
    """Tiny GPT-2 trained by teacher forcing on [prompt, random digits]: the format, about chance success."""
    p = cfg.policy
    model_cfg = tiny_gpt2_config(VOCAB_SIZE, sequence_length(cfg.task), n_layer=p.n_layer, n_head=p.n_head,
                                 n_embd=p.n_embd)
    model = build_tiny_gpt2(model_cfg, seed)
    losses = train_causal_lm(model, lambda gen: sft_batch(cfg.task, p.sft_batch, gen), p.sft_steps, p.sft_lr, seed)
    return model, losses


def reward_drawdown(reward: list[float], window: int = DRAWDOWN_WINDOW) -> float:
    """Best ``window``-step moving mean of the training reward minus the final reward (mean of the last fifth):
    how far a run has fallen from its own best (>= 0 up to the window/tail difference; 0 = no fall)."""
    tail = max(1, len(reward) // 5)
    width = min(window, len(reward))
    moving = np.convolve(np.asarray(reward, dtype=float), np.ones(width) / width, mode="valid")
    return float(moving.max() - np.mean(reward[-tail:]))


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else float("nan")


def summarise(result: SeedResult, log: RunLog, name: str) -> SeedResult:
    """Add one run's summary metrics (final = mean of the last fifth of the steps), curves and per-query KLs."""
    tail = max(1, len(log.reward) // 5)
    drift = log.exact_kl_mean[:DRIFT_STEPS]
    return result.add({f"{name}_final_reward": float(np.mean(log.reward[-tail:])),
                       f"{name}_reward_drawdown": reward_drawdown(log.reward),
                       f"{name}_final_train_entropy": float(np.mean(log.entropy[-tail:])),
                       f"{name}_outside_clip": float(np.mean(log.outside_clip)),
                       f"{name}_median_kl": _quantile(log.kl_values, 0.5),
                       f"{name}_exact_kl_median": _quantile(log.exact_kl_values, 0.5),
                       f"{name}_exact_kl_p90": _quantile(log.exact_kl_values, 0.9),
                       f"{name}_drift_kl": float(np.mean(drift)) if drift else float("nan"),
                       f"{name}_active_groups": float(len(log.kl_values))},
                      curves={f"{name}_reward": log.reward, f"{name}_entropy": log.entropy,
                              f"{name}_outside_clip": log.outside_clip, f"{name}_median_kl": log.median_kl,
                              f"{name}_exact_kl_mean": log.exact_kl_mean, f"{name}_lambda_mean": log.lambda_mean},
                      tables={f"{name}_kl": [{"kl": v} for v in log.kl_values],
                              f"{name}_exact_kl": [{"kl": v} for v in log.exact_kl_values]})


def train(cfg: QuatroConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        from tasks.quatro import hub  # the paper profile (GPU, hub access)

        return hub.train_hub(cfg, seed, Path(data_dir), Path(model_dir), device, progress)
    result = SeedResult(seed)
    batches = digit_batches(load_prompt_stream(data_dir, seed), cfg)
    with result.stage("sft"):
        sft, sft_losses = warm_start(cfg, seed)
    save_model(sft, Path(model_dir) / SFT_DIR)
    result.add(curves={"sft_loss": sft_losses})
    runs = planned_runs(cfg.rl)
    for i, (algorithm, epochs, lr) in enumerate(runs):
        name = run_name(algorithm, epochs, lr)
        policy = copy.deepcopy(sft)
        with result.stage(name):
            log = rl_run(policy, algorithm, epochs, lr, batches, cfg.rl, cfg.task.n_digits, seed=seed * 1000 + 17)
        save_model(policy, Path(model_dir) / name)
        summarise(result, log, name)
        progress((i + 1) / len(runs), f"{name}: final reward {result.metrics[f'{name}_final_reward']:.3f}")
    return result
