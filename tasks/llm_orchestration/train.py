"""Training step of llm_orchestration: each expert alone on its unimodal labels, the controller on text only,
and the jointly trained baseline at every paired-data budget. Nothing is trained for the integration itself.

Checkpoints (safetensors) in ``model_dir``: ``vision_v1``/``vision_v2`` (the weaker and the upgraded vision
expert of the swap test; v1 is the same run's snapshot after its first epoch), ``video``, ``asr``,
``controller/`` (GPT-2 ``save_pretrained``), ``joint_N<budget>`` (the fusion transformer over the frozen experts'
tokens) and ``oracle_N<oracle_budget>`` (the same transformer on true one-hot scene tokens: the capacity check).
Every stage records its wall seconds and the seed thread's CPU seconds (``cpu_seconds_<stage>``; each seed
computes with one torch thread on its own thread, so this is the seed's compute even when seeds overlap).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from tasks.common.io import save_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.tiny_lm import save_model
from tasks.llm_orchestration import baselines, experts
from tasks.llm_orchestration.baselines import ANSWERS
from tasks.llm_orchestration.config import LlmOrchestrationConfig
from tasks.llm_orchestration.controller import token_list, train_controller
from tasks.llm_orchestration.data import (
    SPEECH_VOCAB,
    gold_answer,
    images_of,
    joint_inputs,
    load_stream,
    spectra_of,
    videos_of,
)
from tasks.llm_orchestration.method import COLOURS, DIRECTIONS

EXPERT_FILES = {"vision_v1": "vision_v1.safetensors", "vision_v2": "vision_v2.safetensors",
                "video": "video.safetensors", "asr": "asr.safetensors"}
CONTROLLER_DIR = "controller"


def controller_vocab() -> dict[str, int]:
    return {t: i for i, t in enumerate(token_list(SPEECH_VOCAB))}


def word_index() -> dict[str, int]:
    return {w: i for i, w in enumerate(SPEECH_VOCAB)}


def joint_file(budget: int, kind: str = "joint") -> str:
    return f"{kind}_N{budget}.safetensors"


@contextmanager
def timed(result: SeedResult, name: str) -> Iterator[None]:
    """``result.stage`` (wall seconds) plus ``cpu_seconds_<name>``: CPU seconds of the calling thread."""
    start = time.thread_time()
    with result.stage(name):
        yield
    result.add({f"cpu_seconds_{name}": time.thread_time() - start})


def train_vision(cfg: LlmOrchestrationConfig, rows: list[dict], seed: int, snapshot_dir: Path
                 ) -> tuple[torch.nn.Module, list[float]]:
    """The upgraded vision expert (``vision_epochs``); the weaker v1 is the same run saved after
    ``vision_epochs_weak`` epochs (same seed, init and batches, so identical to training v1 on its own)."""
    e = cfg.experts
    images = images_of(rows, cfg.world.image_noise)
    labels = [experts.cell_labels(list(r["cells"])) for r in rows]
    shapes = torch.tensor([s for s, _ in labels])
    colours = torch.tensor([c for _, c in labels])
    model = experts.build_expert("vision", e.width, seed)

    def keep_weak(epoch: int) -> None:
        if epoch == e.vision_epochs_weak:
            model.eval()
            save_state_dict(model, snapshot_dir / EXPERT_FILES["vision_v1"])
            model.train()

    curve = experts.fit(model, lambda i: experts.vision_loss(model, images[i], shapes[i], colours[i]),
                        len(rows), e.vision_epochs, e.batch_size, e.lr, seed, keep_weak)
    return model, curve


def fit_budget_curve(cfg: LlmOrchestrationConfig, tokens: dict[str, torch.Tensor], labels: torch.Tensor,
                     shapes: baselines.TokenShapes, kind: str, budgets: list[int], seed: int, model_dir: Path,
                     progress: Progress = no_progress) -> tuple[dict[str, float], dict[str, list[float]]]:
    """One fusion transformer per budget on the first N pool items, early-stopped on the pool's held-out tail
    (the items after the largest budget)."""
    j, top = cfg.joint, max(cfg.joint.budgets)
    val_tokens, val_labels = baselines.take(tokens, slice(top, None)), labels[top:]
    metrics: dict[str, float] = {}
    curves: dict[str, list[float]] = {}
    for k, budget in enumerate(budgets):
        model = baselines.build_fusion(shapes, j.width, j.layers, j.heads, len(SPEECH_VOCAB), seed + 10 + k)
        log = baselines.train_fusion(model, baselines.take(tokens, slice(0, budget)), labels[:budget], val_tokens,
                                     val_labels, j.batch_size, j.lr, j.check_min_steps, j.patience, j.safety_steps,
                                     seed + 10 + k, j.smoothing, j.tolerance)
        save_state_dict(model, model_dir / joint_file(budget, kind))
        curves[f"{kind}_N{budget}"], curves[f"{kind}_val_N{budget}"] = log.losses, log.val_losses
        train_pred = baselines.fusion_predict(model, baselines.take(tokens, slice(0, budget)))
        metrics |= {f"{kind}_steps_N{budget}": float(log.steps), f"{kind}_best_step_N{budget}": float(log.best_step),
                    f"{kind}_stopped_early_N{budget}": float(log.stopped_early),
                    f"{kind}_converged_N{budget}": float(log.stopped_early),
                    f"{kind}_best_val_loss_N{budget}": min(log.val_losses),
                    f"{kind}_train_correct_N{budget}": float((train_pred == labels[:budget]).sum()),
                    f"{kind}_train_trials_N{budget}": float(budget)}
        progress(0.5, f"{kind} N={budget}: {log.steps} steps, best held-out loss {min(log.val_losses):.3g}")
    return metrics, curves


def train_video(cfg: LlmOrchestrationConfig, rows: list[dict], seed: int) -> tuple[torch.nn.Module, list[float]]:
    e = cfg.experts
    videos = videos_of(rows, cfg.world.image_noise)
    labels = {"direction": torch.tensor([DIRECTIONS.index(r["direction"]) for r in rows]),
              "colour": torch.tensor([COLOURS.index(r["colour"]) for r in rows])}
    model = experts.build_expert("video", e.width, seed + 1)
    curve = experts.fit(model, lambda i: experts.video_loss(model, videos[i], {k: v[i] for k, v in labels.items()}),
                        len(rows), e.video_epochs, e.batch_size, e.lr, seed + 1)
    return model, curve


def train_asr(cfg: LlmOrchestrationConfig, rows: list[dict], seed: int) -> tuple[torch.nn.Module, list[float]]:
    e, words = cfg.experts, word_index()
    spectra = torch.cat([spectra_of(r["text"], r["noise_seed"], cfg.world.speech_noise) for r in rows])
    ids = torch.tensor([words[w] for r in rows for w in r["text"].split()])
    model = experts.build_expert("asr", e.width, seed + 2, vocab_size=len(words))
    curve = experts.fit(model, lambda i: experts.asr_loss(model, spectra[i], ids[i]), len(ids), e.asr_epochs,
                        e.batch_size, e.lr, seed + 2)
    return model, curve


def train(cfg: LlmOrchestrationConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    if cfg.world is None:
        return result  # the paper profile trains nothing: the experts and the controller come from the hub
    model_dir = Path(model_dir)
    curves: dict[str, list[float]] = {}
    trained: dict[str, torch.nn.Module] = {}
    with timed(result, "experts"):
        images = [r for r in load_stream(data_dir, "images", seed) if r["split"] == "train"]
        trained["vision_v2"], curves["vision_v2"] = train_vision(cfg, images, seed, model_dir)
        curves["vision_v1"] = curves["vision_v2"][:cfg.experts.vision_epochs_weak]
        videos = [r for r in load_stream(data_dir, "videos", seed) if r["split"] == "train"]
        trained["video"], curves["video"] = train_video(cfg, videos, seed)
        utterances = [r for r in load_stream(data_dir, "utterances", seed) if r["split"] == "train"]
        trained["asr"], curves["asr"] = train_asr(cfg, utterances, seed)
        for name, model in trained.items():
            save_state_dict(model, model_dir / EXPERT_FILES[name])
    progress(0.3, "experts trained")
    with timed(result, "controller"):
        c = cfg.controller
        controller, curves["controller"] = train_controller(controller_vocab(), c.n_layer, c.n_head, c.n_embd, c.steps,
                                                            c.batch_size, c.lr, seed + 3)
        save_model(controller, model_dir / CONTROLLER_DIR)
    progress(0.45, "controller trained")
    with timed(result, "joint_tokens"):
        pool = load_stream(data_dir, "qa_train", seed)
        inputs = joint_inputs(pool, cfg.world.image_noise, cfg.world.speech_noise, word_index())
        labels = torch.tensor([ANSWERS.index(gold_answer(r)) for r in pool])
        tokens = baselines.expert_tokens(inputs, trained["vision_v2"], trained["video"], trained["asr"])
        oracle = baselines.oracle_tokens(pool, inputs)
    with timed(result, "joint"):
        metrics, joint_curves = fit_budget_curve(cfg, tokens, labels, baselines.expert_shapes(cfg.experts.width),
                                                 "joint", cfg.joint.budgets, seed, model_dir, progress)
        result.add(metrics)
        curves |= joint_curves
    progress(0.8, "joint models trained")
    with timed(result, "oracle"):
        # the capacity check at one budget only (oracle_budget): it asks whether this architecture can count at all
        metrics, oracle_curves = fit_budget_curve(cfg, oracle, labels, baselines.ORACLE_SHAPES, "oracle",
                                                  [cfg.joint.oracle_budget], seed + 100, model_dir, progress)
        result.add(metrics)
        curves |= oracle_curves
    progress(1.0, "capacity check trained")
    return result.add(curves=curves)
