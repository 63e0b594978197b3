"""Training step of llm_orchestration: each expert alone on its unimodal labels, the controller on text only,
and the jointly trained baseline at every paired-data budget. Nothing is trained for the integration itself.

Checkpoints (safetensors) in ``model_dir``: ``vision_v1``/``vision_v2`` (the weaker and the upgraded vision
expert of the swap test), ``video``, ``asr``, ``controller/`` (GPT-2 ``save_pretrained``), ``joint_N<budget>``.
"""

from __future__ import annotations

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


def joint_file(budget: int) -> str:
    return f"joint_N{budget}.safetensors"


def train_vision(cfg: LlmOrchestrationConfig, rows: list[dict], epochs: int, seed: int
                 ) -> tuple[torch.nn.Module, list[float]]:
    e = cfg.experts
    images = images_of(rows, cfg.world.image_noise)
    labels = [experts.cell_labels(list(r["cells"])) for r in rows]
    shapes = torch.tensor([s for s, _ in labels])
    colours = torch.tensor([c for _, c in labels])
    model = experts.build_expert("vision", e.width, seed)
    curve = experts.fit(model, lambda i: experts.vision_loss(model, images[i], shapes[i], colours[i]),
                        len(rows), epochs, e.batch_size, e.lr, seed)
    return model, curve


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
    with result.stage("experts"):
        images = [r for r in load_stream(data_dir, "images", seed) if r["split"] == "train"]
        for name, epochs in (("vision_v1", cfg.experts.vision_epochs_weak), ("vision_v2", cfg.experts.vision_epochs)):
            model, curves[name] = train_vision(cfg, images, epochs, seed)
            save_state_dict(model, model_dir / EXPERT_FILES[name])
        videos = [r for r in load_stream(data_dir, "videos", seed) if r["split"] == "train"]
        model, curves["video"] = train_video(cfg, videos, seed)
        save_state_dict(model, model_dir / EXPERT_FILES["video"])
        utterances = [r for r in load_stream(data_dir, "utterances", seed) if r["split"] == "train"]
        model, curves["asr"] = train_asr(cfg, utterances, seed)
        save_state_dict(model, model_dir / EXPERT_FILES["asr"])
    progress(0.3, "experts trained")
    with result.stage("controller"):
        c = cfg.controller
        controller, curves["controller"] = train_controller(controller_vocab(), c.n_layer, c.n_head, c.n_embd, c.steps,
                                                            c.batch_size, c.lr, seed + 3)
        save_model(controller, model_dir / CONTROLLER_DIR)
    progress(0.45, "controller trained")
    with result.stage("joint"):
        j, pool = cfg.joint, load_stream(data_dir, "qa_train", seed)
        batch = joint_inputs(pool, cfg.world.image_noise, cfg.world.speech_noise, word_index())
        labels = torch.tensor([ANSWERS.index(gold_answer(r)) for r in pool])
        for k, budget in enumerate(j.budgets):
            index = torch.arange(budget)
            model = baselines.build_joint(j.width, j.layers, j.heads, len(SPEECH_VOCAB), seed + 10 + k)
            steps = baselines.joint_steps(budget, j.epochs, j.batch_size, j.min_steps, j.max_steps)
            losses = baselines.train_joint(model, baselines.take(batch, index), labels[index], steps, j.batch_size,
                                           j.lr, seed + 10 + k)
            curves[f"joint_N{budget}"] = losses
            save_state_dict(model, model_dir / joint_file(budget))
            progress(0.45 + 0.55 * (k + 1) / len(j.budgets), f"joint model N={budget}: final loss {losses[-1]:.3g}")
    return result.add(curves=curves)
