"""Training step of edumirror: the Rater (bag-of-words logistic regression) on its synthetic corpus. The agents
have nothing to learn: their values are the configured needs, SVO angles and traits."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tasks.common.io import read_json, write_json, write_with
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.edumirror.config import EdumirrorConfig
from tasks.edumirror.data import load_corpus
from tasks.edumirror.measurement import Rater, train_rater

RATER_WEIGHTS = "rater.safetensors"
RATER_VOCABULARY = "rater_vocabulary.json"


def train(cfg: EdumirrorConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    texts, labels = load_corpus(data_dir, seed)
    m = cfg.measurement
    with result.stage("rater"):
        rater, losses = train_rater(texts, labels, m.rater_steps, m.rater_lr, m.rater_weight_decay, seed)
    accuracy = float((torch.from_numpy(rater.code(texts)) == torch.tensor(labels)).float().mean())
    write_with(Path(model_dir) / RATER_WEIGHTS,
               lambda tmp: save_file({"weight": rater.weight.contiguous(), "bias": rater.bias.contiguous()},
                                     str(tmp)))
    write_json(Path(model_dir) / RATER_VOCABULARY, rater.vocabulary)
    progress(1.0, f"Rater: loss {losses[-1]:.4f}, training accuracy {accuracy:.3f}")
    return result.add(rater_final_loss=losses[-1], rater_train_accuracy=accuracy,
                      rater_vocabulary_size=float(len(rater.vocabulary)), curves={"rater_loss": losses})


def load_rater(model_dir: Path) -> Rater:
    tensors = load_file(str(Path(model_dir) / RATER_WEIGHTS))
    vocabulary = read_json(Path(model_dir) / RATER_VOCABULARY)
    if tensors["weight"].shape[1] != len(vocabulary):
        raise ValueError(f"{model_dir}: Rater weights have {tensors['weight'].shape[1]} words, the vocabulary "
                         f"{len(vocabulary)}")
    return Rater(vocabulary, tensors["weight"], tensors["bias"])
