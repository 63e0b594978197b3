"""Data step of llm_orchestration: the specs of every item of the procedural omni-world, per seed, as parquet.

Pixels and waveforms are rendered from a spec and its ``noise_seed`` when a step needs them (world.py), so
the files stay small and every rendering is reproducible. Streams (one per file):

- ``images`` / ``videos`` / ``utterances``: the experts' unimodal training sets and held-out test sets;
- ``qa_train``: the joint model's paired multimodal QA pool (its budgets are prefixes of it);
- ``qa_eval``: single-turn QA items answered by both the orchestrator and the joint model;
- ``sessions``: 4-turn sessions (image question, video question, then follow-ups, chat or a new image).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

from tasks.common.io import write_parquet
from tasks.llm_orchestration import world
from tasks.llm_orchestration.baselines import MAX_QUESTION
from tasks.llm_orchestration.config import LlmOrchestrationConfig
from tasks.llm_orchestration.controller import Request, sample_request
from tasks.llm_orchestration.experts import SPECTRUM_BINS, as_tensor, scene_text
from tasks.llm_orchestration.method import count_answer, question_kind

STREAMS = ("images", "videos", "utterances", "qa_train", "qa_eval", "sessions")
SPEECH_VOCAB = world.vocabulary()
TONES = world.word_tones(SPEECH_VOCAB)
VIDEO_NOISE_SCALE = 1.0


def _image_rows(rng: np.random.Generator, n: int, split: str) -> list[dict]:
    return [{"split": split, "cells": world.sample_cells(rng), "noise_seed": int(rng.integers(2**31))}
            for _ in range(n)]


def _video_rows(rng: np.random.Generator, n: int, split: str) -> list[dict]:
    rows = []
    for _ in range(n):
        colour, shape, direction = world.sample_motion(rng)
        rows.append({"split": split, "colour": colour, "shape": shape, "direction": direction,
                     "noise_seed": int(rng.integers(2**31))})
    return rows


def _utterance_rows(rng: np.random.Generator, n: int, split: str) -> list[dict]:
    rows = []
    for _ in range(n):
        kind = ("count", "direction", "followup_count", "followup_direction", "chat")[rng.integers(5)]
        text = world.request_text(kind, rng, bool(rng.random() < 0.5), bool(rng.random() < 0.5))
        rows.append({"split": split, "text": text, "noise_seed": int(rng.integers(2**31))})
    return rows


def _qa_row(rng: np.random.Generator, intent: str, held_out: bool, spoken_fraction: float,
            speak_fraction: float) -> dict:
    request = sample_request(rng, intent, held_out, spoken_fraction, speak_fraction)
    colour, shape, direction = world.sample_motion(rng)
    return {"intent": request.intent, "text": request.text, "spoken": request.spoken, "speak": request.speak,
            "cells": world.sample_cells(rng), "colour": colour, "shape": shape, "direction": direction,
            "noise_seed": int(rng.integers(2**31))}


def _qa_rows(rng: np.random.Generator, n: int, held_out_fraction: float, spoken_fraction: float) -> list[dict]:
    return [_qa_row(rng, ("count", "direction")[i % 2], bool(rng.random() < held_out_fraction), spoken_fraction, 0.0)
            for i in range(n)]


def _session_rows(rng: np.random.Generator, n: int, cfg: LlmOrchestrationConfig) -> list[dict]:
    w = cfg.world
    rows = []
    for session in range(n):
        intents = ["count", "direction"]
        for _ in range(2):
            intents.append(str(rng.choice(["followup_count", "followup_direction", "chat", "count"],
                                          p=[0.4, 0.3, 0.15, 0.15])))
        for turn, intent in enumerate(intents):
            row = _qa_row(rng, intent, bool(rng.random() < w.held_out_fraction), w.spoken_fraction, w.speak_fraction)
            rows.append(row | {"session": session, "turn": turn})
    return rows


def make_streams(cfg: LlmOrchestrationConfig, seed: int) -> dict[str, pl.DataFrame]:
    # the paired pool: the largest budget, then the held-out part the joint model stops early on. Each part has
    # its own generator, so changing the budgets never redraws the evaluation items, the sessions or the
    # validation split, and a budget's training items are a prefix of any larger budget's
    w = cfg.world
    rng = np.random.default_rng([seed, 1])
    pool_rng, val_rng, eval_rng, session_rng = (np.random.default_rng([seed, k]) for k in (2, 3, 4, 5))
    return {
        "images": pl.DataFrame(_image_rows(rng, w.n_images, "train") + _image_rows(rng, w.n_expert_test, "test")),
        "videos": pl.DataFrame(_video_rows(rng, w.n_videos, "train") + _video_rows(rng, w.n_expert_test, "test")),
        "utterances": pl.DataFrame(_utterance_rows(rng, w.n_utterances, "train")
                                   + _utterance_rows(rng, w.n_expert_test, "test")),
        "qa_train": pl.DataFrame(
            _qa_rows(pool_rng, max(cfg.joint.budgets), w.held_out_fraction, w.spoken_fraction)
            + _qa_rows(val_rng, cfg.joint.validation, w.held_out_fraction, w.spoken_fraction)),
        "qa_eval": pl.DataFrame(_qa_rows(eval_rng, w.n_qa_eval, w.held_out_fraction, w.spoken_fraction)),
        "sessions": pl.DataFrame(_session_rows(session_rng, w.n_sessions, cfg)),
    }


def write_data(cfg: LlmOrchestrationConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    if cfg.world is None:  # the paper profile reads its benchmarks from the hub (hub.py)
        return []
    written = []
    for seed in seeds:
        for name, frame in make_streams(cfg, seed).items():
            written.append(write_parquet(frame, Path(data_dir) / f"{name}_seed{seed}.parquet"))
    return written


def load_stream(data_dir: Path, name: str, seed: int) -> list[dict]:
    return pl.read_parquet(Path(data_dir) / f"{name}_seed{seed}.parquet").to_dicts()


# --- rendering ---------------------------------------------------------------------------------------------


def image_of(row: dict, noise: float) -> np.ndarray:
    return world.render_image(list(row["cells"]), np.random.default_rng([row["noise_seed"], 0]), noise)


def video_of(row: dict, noise: float) -> np.ndarray:
    return world.render_video(row["colour"], row["shape"], row["direction"],
                              np.random.default_rng([row["noise_seed"], 1]), noise * VIDEO_NOISE_SCALE)


def spectra_of(text: str, noise_seed: int, noise: float) -> torch.Tensor:
    frames = world.render_speech(text, TONES, np.random.default_rng([noise_seed, 2]), noise)
    return torch.from_numpy(world.spectrum(frames))


def images_of(rows: list[dict], noise: float) -> torch.Tensor:
    return as_tensor([image_of(r, noise) for r in rows])


def videos_of(rows: list[dict], noise: float) -> torch.Tensor:
    return as_tensor([video_of(r, noise) for r in rows])


def request_of(row: dict) -> Request:
    return Request(row["intent"], row["text"], bool(row["spoken"]), bool(row["speak"]))


def gold_answer(row: dict, image_row: dict | None = None, video_row: dict | None = None) -> str:
    """The true answer of a request: counts from the true cells, directions from the true motion, computed
    with the executor's own question parser on the true text (``image_row``/``video_row``: the source a
    follow-up refers to; by default the row's own)."""
    kind = question_kind(row["text"])
    if kind == "count":
        return count_answer(row["text"], scene_text(list((image_row or row)["cells"])))
    if kind == "direction":
        return (video_row or row)["direction"]
    return "hello"


def joint_inputs(rows: list[dict], image_noise: float, speech_noise: float, words: dict[str, int]
                 ) -> dict[str, torch.Tensor]:
    """The joint model's batch: the attached image or video (zeros when absent), the question as word ids
    (typed) or word spectra (spoken), padded to ``MAX_QUESTION`` with a mask."""
    n = len(rows)
    batch = {"images": torch.zeros(n, 3, world.IMAGE_SIZE, world.IMAGE_SIZE),
             "videos": torch.zeros(n, world.FRAMES, 3, world.IMAGE_SIZE, world.IMAGE_SIZE),
             "has_image": torch.zeros(n, dtype=torch.bool), "has_video": torch.zeros(n, dtype=torch.bool),
             "spoken": torch.zeros(n, dtype=torch.bool), "word_ids": torch.zeros(n, MAX_QUESTION, dtype=torch.long),
             "spectra": torch.zeros(n, MAX_QUESTION, SPECTRUM_BINS),
             "question_mask": torch.zeros(n, MAX_QUESTION, dtype=torch.bool)}
    for i, row in enumerate(rows):
        if row["intent"] == "count":
            batch["images"][i] = torch.from_numpy(image_of(row, image_noise))
            batch["has_image"][i] = True
        elif row["intent"] == "direction":
            batch["videos"][i] = torch.from_numpy(video_of(row, image_noise))
            batch["has_video"][i] = True
        tokens = row["text"].split()[:MAX_QUESTION]
        batch["question_mask"][i, :len(tokens)] = True
        batch["word_ids"][i, :len(tokens)] = torch.tensor([words[t] for t in tokens])
        if row["spoken"]:
            batch["spoken"][i] = True
            batch["spectra"][i, :len(tokens)] = spectra_of(" ".join(tokens), row["noise_seed"], speech_noise)
    return batch
