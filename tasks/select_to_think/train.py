"""Training step of select_to_think: the tiny GPT-2 'LLM' and 'SLM' (from scratch, on procedural addition with
a chain of thought), then S2T-Local: groups collected along S2T paths on the collection split and the SLM
trained on them with the four-part loss. Writes ``llm/``, ``slm/`` and ``slm_local/`` into the seed's folder.

Paper profile: hub.train_hub (the hub pair is not retrained; only S2T-Local is written)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

from tasks.common import tiny_lm
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.schedules import warmup_cosine
from tasks.select_to_think import baselines, data, hub, method
from tasks.select_to_think.config import SelectToThinkConfig, TinyLMConfig
from tasks.select_to_think.model import (
    LLM,
    LOCAL,
    LOCAL_FROZEN,
    SLM,
    AdditionTask,
    Setup,
    build_lm,
    calibrate,
    load_setup,
    policy_for,
)


def train(config: SelectToThinkConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    """Train the pair, collect S2T-Local groups, train S2T-Local; every model is written once, for every claim."""
    if config.hub is not None:
        return hub.train_hub(config, seed, Path(data_dir), Path(model_dir), device, progress)
    setup = load_setup(config, seed, data_dir)
    result = SeedResult(seed)
    with result.stage("train_pair"):
        llm, slm = train_pair(config, seed, setup, result, progress)
    with result.stage("collect"):
        groups = collect_local_groups(config, llm, slm, setup)
    progress(0.7, f"{len(groups)} S2T-Local groups collected")
    with result.stage("local_train"):
        local_model = train_local(config, seed, slm, groups, setup.reserved, result, progress)
    models = {LLM: llm, SLM: slm, LOCAL: local_model}
    if config.local.frozen_body_lr is not None:
        with result.stage("local_frozen_train"):
            models[LOCAL_FROZEN] = train_local_frozen(config, seed, slm, groups, setup.reserved, result)
    with result.stage("save"):
        for name, model in models.items():
            tiny_lm.save_model(model, Path(model_dir) / name)
    progress(1.0, "trained")
    return result


# ------------------------------------------------------------------------------------------------
# The tiny GPT-2 pair
# ------------------------------------------------------------------------------------------------

def train_pair(config: SelectToThinkConfig, seed: int, setup: Setup, result: SeedResult, progress: Progress
               ) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The LLM never uses the bins but shares the vocabulary, so logits line up. Both stop at their target
    accuracy on the calibration split (never the test split)."""
    llm = build_lm(config.llm, setup.vocab, setup.width, seed=2 * seed, untied=False)
    llm_curve, llm_steps = train_lm(llm, config.llm, setup.train, setup.prompt_len, seed,
                                    lambda: calibration_accuracy(llm, setup.calibration, setup.reserved),
                                    lambda f, m: progress(0.4 * f, m), name="LLM")
    slm = build_lm(config.slm, setup.vocab, setup.width, seed=2 * seed + 1, untied=True)
    slm_curve, slm_steps = train_lm(slm, config.slm, setup.train, setup.prompt_len, seed + 10_000,
                                    lambda: calibration_accuracy(slm, setup.calibration, setup.reserved),
                                    lambda f, m: progress(0.4 + 0.25 * f, m), name="SLM")
    result.add(llm_train_steps=float(llm_steps), slm_train_steps=float(slm_steps),
               curves={"llm_train_loss": llm_curve, "slm_train_loss": slm_curve})
    return llm, slm


def generated_loss(model: torch.nn.Module, batch: torch.Tensor, prompt_len: int, base_vocab: int) -> torch.Tensor:
    """Cross-entropy on the generated part only (the prompt digits are random: nothing to learn), softmax over
    the unreserved vocabulary (bins are never data)."""
    logits = model(input_ids=batch).logits[:, prompt_len - 1:-1, :base_vocab]
    return F.cross_entropy(logits.reshape(-1, base_vocab), batch[:, prompt_len:].reshape(-1))


def lm_schedule(optimizer: torch.optim.Optimizer, lm: TinyLMConfig, stop_early: bool
                ) -> torch.optim.lr_scheduler.LambdaLR:
    """A 5% linear warm-up, then a cosine decay over ``lm.steps`` (tasks.common.schedules.warmup_cosine), or,
    when training stops at a target accuracy, a constant rate after the warm-up."""
    if not stop_early:
        return warmup_cosine(optimizer, lm.steps)
    warmup = max(1, lm.steps // 20)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup))


def train_lm(model: torch.nn.Module, lm: TinyLMConfig, sequences: torch.Tensor, prompt_len: int, seed: int,
             accuracy_check: Callable[[], float] | None = None, progress: Progress = no_progress, name: str = "lm"
             ) -> tuple[list[float], int]:
    """AdamW (no weight decay), gradient clip 1.0, ``lm_schedule``; with ``lm.target_accuracy`` it stops as soon
    as ``accuracy_check()`` reaches it (checked every ``lm.check_every`` steps). Returns the loss curve and the
    number of steps taken."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lm.lr, weight_decay=0.0)
    stop_early = lm.target_accuracy is not None and accuracy_check is not None
    schedule = lm_schedule(optimizer, lm, stop_early)
    losses: list[float] = []
    model.train()
    for step in range(lm.steps):
        batch = sequences[torch.randint(0, len(sequences), (lm.batch_size,), generator=generator)]
        loss = generated_loss(model, batch, prompt_len, data.BASE_VOCAB)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if stop_early and (step + 1) % lm.check_every == 0 and reached_target(model, accuracy_check, lm):
            break
        if (step + 1) % max(1, lm.steps // 5) == 0:
            progress((step + 1) / lm.steps, f"{name} step {step + 1}/{lm.steps}, loss {losses[-1]:.3f}")
    model.eval()
    return losses, len(losses)


def reached_target(model: torch.nn.Module, accuracy_check: Callable[[], float], lm: TinyLMConfig) -> bool:
    """The stopping check of ``train_lm``, run in eval mode."""
    model.eval()
    reached = accuracy_check() >= lm.target_accuracy
    model.train()
    return reached


def calibration_accuracy(model: torch.nn.Module, task: AdditionTask, reserved: list[int]) -> float:
    """Greedy accuracy on the calibration problems: the stopping check of ``train_lm`` (never the test split)."""
    return task.accuracy(baselines.greedy_answers(model, task.prompts, task.steps, task.parse, reserved))


# ------------------------------------------------------------------------------------------------
# S2T-Local
# ------------------------------------------------------------------------------------------------

def collect_local_groups(config: SelectToThinkConfig, llm: torch.nn.Module, slm: torch.nn.Module, setup: Setup
                         ) -> method.CandidateGroups:
    """S2T-Local's training data: trigger steps of S2T paths (KL trigger, threshold calibrated on the calibration
    split) on the collection split, each with the SLM's top-``k_collect`` and the LLM's probabilities on them;
    at most ``local.max_groups``."""
    s2t, local = config.s2t, config.local
    kl_threshold = calibrate(slm, setup.calibration, s2t, "kl", setup.reserved, llm)
    collection = setup.collection
    collected = method.decode(slm, collection.prompts, collection.steps, policy_for(s2t, "s2t", "kl", kl_threshold),
                              llm=llm, reserved=setup.reserved, collect_k=s2t.k_collect)
    groups = method.concat_groups(collected.groups)
    if local.max_groups is not None and len(groups) > local.max_groups:
        groups = groups.subset(torch.arange(local.max_groups))
    return groups


def train_local(config: SelectToThinkConfig, seed: int, slm: torch.nn.Module, groups: method.CandidateGroups,
                reserved: list[int], result: SeedResult, progress: Progress) -> torch.nn.Module:
    """A copy of the SLM trained on the groups; records how far the non-reserved rows of lm_head moved (C8)."""
    local = config.local
    local_model = copy.deepcopy(slm)
    head_before = local_model.get_output_embeddings().weight.detach().clone()
    weights = method.LocalLossWeights(local.kl_weight, local.frozen_kl_weight, local.hinge_margin)

    def on_step(i: int, n: int) -> None:
        if i % max(1, n // 5) == 0:
            progress(0.7 + 0.25 * i / n, f"S2T-Local step {i}/{n}")

    log = method.train_s2t_local(local_model, groups, reserved, local.epochs, local.batch_groups, local.lr,
                                 local.weight_decay, weights, seed, on_step=on_step)
    result.add(local_groups=float(len(groups)),
               local_frozen_rows_max_change=method.frozen_rows_change(
                   head_before, local_model.get_output_embeddings().weight.detach(), reserved),
               curves={"local_train_loss": log.total, "local_ce": log.ce, "local_hinge": log.hinge})
    return local_model


def train_local_frozen(config: SelectToThinkConfig, seed: int, slm: torch.nn.Module, groups: method.CandidateGroups,
                       reserved: list[int], result: SeedResult) -> torch.nn.Module:
    """S2T-Local with the body frozen: a copy of the SLM whose reserved rows alone are trained (rate
    ``local.frozen_body_lr``, the other settings as the full fine-tune), on the same groups in the same order.
    Records how far the body and the non-reserved rows moved (both 0 by construction, checked per seed)."""
    local = config.local
    frozen_model = copy.deepcopy(slm)
    head_before = frozen_model.get_output_embeddings().weight.detach().clone()
    body_before = {name: p.detach().clone() for name, p in frozen_model.named_parameters()}
    weights = method.LocalLossWeights(local.kl_weight, local.frozen_kl_weight, local.hinge_margin)
    log = method.train_s2t_local(frozen_model, groups, reserved, local.epochs, local.batch_groups,
                                 local.frozen_body_lr, local.weight_decay, weights, seed, train_body=False)
    result.add(local_frozen_body_max_change=method.body_change(body_before, frozen_model),
               local_frozen_rows_max_change_frozen_body=method.frozen_rows_change(
                   head_before, frozen_model.get_output_embeddings().weight.detach(), reserved),
               curves={"local_frozen_train_loss": log.total, "local_frozen_ce": log.ce})
    return frozen_model
