"""The tiny GPT-2 of the smoke / cpu profiles and its label-token readout, shared by ``train.py`` (which
writes the checkpoint) and ``evaluate.py`` (which reads it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import GPT2Model

from tasks.common import tiny_lm
from tasks.common.io import load_state_dict, save_state_dict
from tasks.common.seeding import torch_init_seed
from tasks.order_sensitivity import data
from tasks.order_sensitivity.config import ProceduralDataConfig, TinyModelConfig

CHECKPOINT = "chunk_gpt2.safetensors"


class ChunkGPT2(torch.nn.Module):
    """A tiny GPT-2 (``transformers`` GPT2Model, learned absolute positions) over chunk positions.

    Position t < n holds chunk t as the sum of its entity, attribute and value embeddings; the last position
    holds the claim (the same sum plus a claim-role embedding). A linear head on the claim position gives
    the label logit gap logit("1") - logit("0"). One position per chunk keeps sequences short enough to
    train on CPU [project design: three tokens per chunk did not learn in the cpu budget; README,
    "Deviations"]; the value field is claim-relative (see :class:`data.Vocabulary`).
    """

    def __init__(self, model_cfg: TinyModelConfig, data_cfg: ProceduralDataConfig):
        super().__init__()
        d = model_cfg.n_embd
        self.entity = torch.nn.Embedding(data_cfg.n_entities, d)
        self.attribute = torch.nn.Embedding(data_cfg.n_attributes, d)
        self.value = torch.nn.Embedding(data.Vocabulary.value_fields, d)  # disagree / agree / mask [M]
        self.claim_role = torch.nn.Parameter(torch.zeros(d))
        config = tiny_lm.tiny_gpt2_config(1, data.sequence_length(data_cfg.max_chunks), model_cfg.n_layer,
                                          model_cfg.n_head, d)
        config.initializer_range = model_cfg.init_std
        self.transformer = GPT2Model(config)
        self.head = torch.nn.Linear(d, 1)
        for table in (self.entity, self.attribute, self.value):
            torch.nn.init.normal_(table.weight, std=config.initializer_range)

    def forward(self, triples: torch.Tensor) -> torch.Tensor:
        """(B, L, 3) index triples -> (B,) label logit gaps read at the last (claim) position."""
        embeds = self.entity(triples[..., 0]) + self.attribute(triples[..., 1]) + self.value(triples[..., 2])
        embeds[:, -1] = embeds[:, -1] + self.claim_role
        hidden = self.transformer(inputs_embeds=embeds).last_hidden_state[:, -1]
        return self.head(hidden).squeeze(-1)


def build_model(model_cfg: TinyModelConfig, data_cfg: ProceduralDataConfig, seed: int) -> ChunkGPT2:
    with torch_init_seed(seed):  # module init draws from torch's global generator
        return ChunkGPT2(model_cfg, data_cfg)


def save_model(model: ChunkGPT2, model_dir: Path) -> Path:
    """The trained weights as ``<model_dir>/chunk_gpt2.safetensors`` (model_dir: the seed's folder)."""
    return save_state_dict(model, Path(model_dir) / CHECKPOINT)


def load_model(model_cfg: TinyModelConfig, data_cfg: ProceduralDataConfig, seed: int, model_dir: Path,
               device: str = "cpu") -> ChunkGPT2:
    """The checkpoint ``save_model`` wrote, on ``device``, in eval mode."""
    path = Path(model_dir) / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"order_sensitivity: {path} is missing; run the train step first")
    model = load_state_dict(build_model(model_cfg, data_cfg, seed), path)
    return model.to(device).eval()


def label_logit_gap(model: torch.nn.Module, triples: torch.Tensor) -> torch.Tensor:
    """logit("1") - logit("0"): the two labels renormalised, q = sigmoid(gap)."""
    return model(triples)


def score_gaps(model: torch.nn.Module, ids: np.ndarray, batch_size: int, device: str = "cpu") -> np.ndarray:
    """Label logit gaps of every input in ``ids`` (..., L, 3), returned with the leading shape."""
    flat = torch.as_tensor(ids.reshape(-1, *ids.shape[-2:]), dtype=torch.long)
    out = []
    with torch.no_grad():
        for start in range(0, len(flat), batch_size):
            out.append(label_logit_gap(model, flat[start:start + batch_size].to(device)).double().cpu())
    return torch.cat(out).numpy().reshape(ids.shape[:-2])
