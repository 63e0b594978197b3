"""Tiny GPT-2-style causal LMs built from ``transformers`` configs and trained from scratch.

Used by the smoke and cpu profiles, where no weights can be downloaded. Sizes are chosen per paper
by measuring (DESIGN.md section 5); the cost of a step is about 6 x parameters x tokens FLOPs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from tasks.common.io import write_dir_with
from tasks.common.schedules import warmup_cosine
from tasks.common.seeding import torch_init_seed


def tiny_gpt2_config(vocab_size: int, n_positions: int, n_layer: int = 2, n_head: int = 2,
                     n_embd: int = 32, dropout: float = 0.0) -> GPT2Config:
    """A GPT-2 config with no special tokens beyond the procedural vocabulary."""
    return GPT2Config(vocab_size=vocab_size, n_positions=n_positions, n_layer=n_layer, n_head=n_head,
                      n_embd=n_embd, n_inner=4 * n_embd, resid_pdrop=dropout, embd_pdrop=dropout,
                      attn_pdrop=dropout, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def build_tiny_gpt2(config: GPT2Config, seed: int, dtype: torch.dtype = torch.float32) -> GPT2LMHeadModel:
    """Randomly initialised model, reproducible from ``seed`` even when seeds build on parallel threads."""
    with torch_init_seed(seed):
        model = GPT2LMHeadModel(config)
    return model.to(dtype)


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def sequence_nll(model: GPT2LMHeadModel, input_ids: torch.Tensor, label_vocab: int | None = None
                 ) -> torch.Tensor:
    """Per-sequence teacher-forcing NLL, sum over positions 1..L-1 of -log p(x_t | x_<t).

    ``label_vocab`` restricts the softmax to the first ``label_vocab`` entries (a procedural
    vocabulary whose remaining ids are prompt/control tokens that are never predicted).
    """
    logits = model(input_ids=input_ids).logits[:, :-1]
    if label_vocab is not None:
        logits = logits[..., :label_vocab]
    logp = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, 1:]
    return -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1).sum(dim=-1)


def train_causal_lm(model: GPT2LMHeadModel, sample_batch: Callable[[torch.Generator], torch.Tensor],
                    steps: int, lr: float, seed: int, label_vocab: int | None = None,
                    on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """Adam with a linear warm-up and cosine decay; returns the mean per-sequence NLL of each step.

    ``sample_batch(generator)`` returns a (B, L) batch of token ids: fresh exact samples or a
    minibatch of a fixed dataset, as the caller decides.
    """
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = warmup_cosine(optimizer, steps)
    model.train()
    losses = []
    for step in range(steps):
        batch = sample_batch(generator)
        loss = sequence_nll(model, batch, label_vocab).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses


def save_model(model: GPT2LMHeadModel, directory: str | Path) -> Path:
    """Atomic ``save_pretrained`` (safetensors): write a sibling temp folder, then rename it."""
    return write_dir_with(directory, lambda tmp: model.save_pretrained(tmp, safe_serialization=True))


def load_model(directory: str | Path, dtype: torch.dtype = torch.float32) -> GPT2LMHeadModel:
    return GPT2LMHeadModel.from_pretrained(str(directory), dtype=dtype).eval()
