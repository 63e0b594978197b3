"""Training step of covip: weak SFT warm start (stage A), then GRPO/GSPO on the caption reward (stage B),
and a step-matched SFT continuation (a control row)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch

from tasks.common import rl
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.schedules import warmup_cosine
from tasks.common.seeding import torch_init_seed
from tasks.common.tiny_vlm import TinyVLM, save_vlm
from tasks.covip import scoring
from tasks.covip.config import CovipConfig
from tasks.covip.data import Episode, Vocab, load_episodes, render_batch
from tasks.covip.policy import build_policy, greedy_captions, sample, sft_loss

MODELS = ("sft", "grpo", "sft_more")


def max_new_tokens(cfg: CovipConfig) -> int:
    """One past the length limit, so that a caption without EOS within the limit is penalised."""
    return cfg.reward.length_limit + 1


def caption_words(model: TinyVLM, eps: list[Episode], cfg: CovipConfig, vocab: Vocab,
                  blind: bool = False) -> list[list[str]]:
    out = []
    for start in range(0, len(eps), cfg.eval.batch_size):
        chunk = eps[start:start + cfg.eval.batch_size]
        batch = render_batch(chunk, cfg.data, vocab)
        ids = greedy_captions(model, batch.blinded() if blind else batch, max_new_tokens(cfg),
                               cfg.model.ground_dialogue)
        out += [vocab.decode(row) for row in ids]
    return out


def _sft_steps(model: TinyVLM, optimizer: torch.optim.Optimizer, train_eps: list[Episode], rng: np.random.Generator,
               steps: int, cfg: CovipConfig, vocab: Vocab, val_eps: list[Episode] | None,
               losses: list[float], val_acc: list[float],
               scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> int:
    """Up to ``steps`` SFT steps; with ``val_eps``, stop once validation GT-QA accuracy >= stop_gt_acc."""
    model.train()
    for step in range(1, steps + 1):
        idx = rng.choice(len(train_eps), size=cfg.sft.batch_size, replace=False)
        loss = sft_loss(model, render_batch([train_eps[i] for i in idx], cfg.data, vocab), cfg.model.ground_dialogue)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        losses.append(float(loss.detach()))
        if val_eps is not None and step % cfg.sft.check_every == 0:
            acc = scoring.gt_accuracy(caption_words(model, val_eps, cfg, vocab), val_eps)
            val_acc.append(acc)
            model.train()
            if acc >= cfg.sft.stop_gt_acc:
                return step
    return steps


def grpo_train(model: TinyVLM, train_eps: list[Episode], cfg: CovipConfig, vocab: Vocab, seed: int,
               progress: Progress) -> dict[str, list[float]]:
    """Stage B: per step, ``prompts_per_step`` episodes x G sampled captions, rewards from the judge,
    group advantages (eps = adv_eps), PPO-clip (``grpo``) or sequence-ratio (``gspo``) loss, KL to the
    SFT reference (beta). Only the GPT-2 is updated."""
    g = cfg.grpo
    ref = copy.deepcopy(model.lm).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.lm.parameters(), lr=g.lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng([seed, 7])
    curves: dict[str, list[float]] = {"grpo_reward": [], "grpo_kl": [], "grpo_penalty_rate": []}
    for step in range(g.steps):
        chunk = [train_eps[i] for i in rng.choice(len(train_eps), size=g.prompts_per_step, replace=False)]
        batch = render_batch(chunk, cfg.data, vocab)
        rollouts = sample(model, batch, g.group_size, max_new_tokens(cfg), generator, g.temperature,
                          cfg.model.ground_dialogue)
        rewards = []
        for row, (ids, mask) in enumerate(zip(rollouts.completion_ids, rollouts.completion_mask)):
            rewards.append(scoring.reward(vocab.decode(ids[mask].tolist()), chunk[row // g.group_size], cfg.reward))
        stats = rl.grpo_step(model.lm, optimizer, rollouts, [r.total for r in rewards], loss=g.loss,
                             loss_kwargs={"eps_low": g.clip_low, "eps_high": g.clip_high}, eps=g.adv_eps,
                             ref_model=ref, beta=g.beta, max_grad_norm=1.0)
        curves["grpo_reward"].append(stats["reward_mean"])
        curves["grpo_kl"].append(stats.get("kl_ref", 0.0))
        curves["grpo_penalty_rate"].append(float(np.mean([r.penalised for r in rewards])))
        if step % 25 == 0:
            progress(0.4 + 0.5 * step / g.steps, f"GRPO step {step}: reward {stats['reward_mean']:.3f}")
    return curves


def train(cfg: CovipConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        raise NotImplementedError("covip paper profile: LoRA GSPO training of Qwen3-VL is not built in this "
                                  "project; tasks/covip/hub.py holds the judge-backed reward and loaders")
    result = SeedResult(seed)
    vocab = Vocab(cfg.data)
    train_eps, val_eps = load_episodes(data_dir, "train", seed), load_episodes(data_dir, "val", seed)
    model = build_policy(cfg, len(vocab), seed)
    rng = np.random.default_rng([seed, 3])
    losses: list[float] = []
    val_acc: list[float] = []
    with result.stage("sft"), torch_init_seed(seed):
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.sft.lr, weight_decay=0.0)
        scheduler = warmup_cosine(optimizer, cfg.sft.max_steps) if cfg.sft.schedule == "warmup_cosine" else None
        sft_steps = _sft_steps(model, optimizer, train_eps, rng, cfg.sft.max_steps, cfg, vocab, val_eps, losses,
                               val_acc, scheduler)
        stop_lr = optimizer.param_groups[0]["lr"]
    save_vlm(model, Path(model_dir) / "sft")
    progress(0.3, f"SFT stopped after {sft_steps} steps (val GT-acc {val_acc[-1] if val_acc else float('nan'):.3f})")
    sft_more = copy.deepcopy(model)
    with result.stage("grpo"):
        curves = grpo_train(model, train_eps, cfg, vocab, seed, progress)
    save_vlm(model, Path(model_dir) / "grpo")
    more_losses: list[float] = []
    with result.stage("sft_more"):
        # The SFT optimiser state is not carried over: a fresh AdamW at the lr SFT had when it stopped
        # (the base lr under a constant schedule), flat, for extra_steps steps.
        optimizer = torch.optim.AdamW(sft_more.parameters(), lr=stop_lr, weight_decay=0.0)
        _sft_steps(sft_more, optimizer, train_eps, rng, cfg.sft.extra_steps, cfg, vocab, None, more_losses, [])
    save_vlm(sft_more, Path(model_dir) / "sft_more")
    progress(1.0, f"GRPO final reward {np.mean(curves['grpo_reward'][-20:]):.3f}")
    return result.add(sft_steps=sft_steps, sft_final_loss=float(np.mean(losses[-10:])),
                      sft_val_gt_acc=val_acc[-1] if val_acc else float("nan"),
                      grpo_reward_first=float(np.mean(curves["grpo_reward"][:20])),
                      grpo_reward_last=float(np.mean(curves["grpo_reward"][-20:])),
                      curves={"sft_loss": losses, "sft_val_gt_acc": val_acc, "sft_more_loss": more_losses, **curves})
