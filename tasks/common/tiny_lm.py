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
    """A model ``save_model`` wrote, safe to call from the flow's seed threads at once.

    Not ``GPT2LMHeadModel.from_pretrained``: with transformers 5, models loaded that way on parallel threads
    can come back with the output layer untied from the token embedding and left randomly initialised (the
    "lm_head MISSING" message is printed in the healthy case too). Here the model is built from its saved
    config under the init lock (``build_tiny_gpt2``), the safetensors weights loaded, and the tie checked.
    """
    from safetensors.torch import load_file

    directory = Path(directory)
    model = build_tiny_gpt2(GPT2Config.from_pretrained(str(directory)), seed=0)
    state = load_file(str(directory / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # save_pretrained drops lm_head.weight, which GPT-2 ties to the token embedding (tie_word_embeddings).
    tied = model.lm_head.weight is model.transformer.wte.weight
    if set(missing) - {"lm_head.weight"} or unexpected or not tied:
        raise ValueError(f"{directory}: checkpoint does not match its config (missing {missing}, unexpected "
                         f"{unexpected}, output layer tied to the embedding: {tied})")
    return model.to(dtype).eval()
