"""Paper profile of coda (claims C4a-c): CoDA blocks in place of an LFM2 model's gated short-convolution operators.

RECONSTRUCTED: the paper's "LFM-1.2B" is guessed as ``LiquidAI/LFM2-1.2B``, whose sequence mixers are gated
short convolutions and grouped-query attention, not LTC ODEs; what CoDA replaces there is unverified. Here each
``Lfm2ShortConv`` becomes a ``CodaTokenMixer`` (a CoDA block over tokens, Delta = 1 per token), distilled
layer-wise on the original operator's inputs and outputs, then fine-tuned jointly with the LM loss
(``train_student``, the training step); tokens/s (training and inference) and perplexity are measured against
the original (``evaluate_student``, the evaluation step). The hub loaders (model, texts, token blocks) live here
too. Exercised in tests only with a tiny randomly initialised ``Lfm2Config`` model (no network).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path

import numpy as np
import polars as pl
import torch
from torch import nn

from tasks.coda import method
from tasks.coda.config import LfmConfig
from tasks.common.io import write_parquet, write_with
from tasks.common.results import Progress, no_progress
from tasks.common.seeding import torch_init_seed


class CodaTokenMixer(nn.Module):
    """Drop-in for ``Lfm2ShortConv``: same call signature, full-sequence only (no decode cache)."""

    def __init__(self, hidden_size: int, gru_hidden: int, rank: int):
        super().__init__()
        self.block = method.CodaBlock(hidden_size, hidden_size, gru_hidden, rank)

    def forward(self, hidden_states: torch.Tensor, cache=None, attention_mask=None, **kwargs) -> torch.Tensor:
        if cache is not None and hidden_states.shape[1] == 1:
            raise NotImplementedError("CodaTokenMixer: cached single-token decoding is not implemented")
        # the block runs in float32 (the matrix exponential series needs it) whatever the model's dtype
        dt = torch.ones(hidden_states.shape[:2], device=hidden_states.device)
        return self.block(hidden_states.float(), dt).to(hidden_states.dtype)


def conv_layers(model: nn.Module) -> list[nn.Module]:
    layers = [layer for layer in model.model.layers if hasattr(layer, "conv")]
    if not layers:
        raise ValueError("coda.lfm.model: no gated short-convolution layers (layer.conv) found in this model")
    return layers


def replace_short_convs(model: nn.Module, gru_hidden: int, rank: int, seed: int) -> nn.Module:
    """A copy of ``model`` with every ``layer.conv`` replaced by a fresh ``CodaTokenMixer``."""
    student = copy.deepcopy(model)
    hidden = student.config.hidden_size
    param = next(student.parameters())
    for i, layer in enumerate(conv_layers(student)):
        with torch_init_seed(seed + i):
            layer.conv = CodaTokenMixer(hidden, gru_hidden, rank).to(device=param.device, dtype=torch.float32)
    return student


def capture_conv_io(model: nn.Module, blocks: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Inputs and outputs of every short-convolution operator on ``blocks`` (teacher activations)."""
    captured: list[tuple[torch.Tensor, torch.Tensor]] = []
    handles = [layer.conv.register_forward_hook(
        lambda _m, args, kwargs, out: captured.append((kwargs.get("hidden_states", args[0] if args else None)
                                                       .detach().float(), out.detach().float())),
        with_kwargs=True) for layer in conv_layers(model)]
    try:
        with torch.no_grad():
            model(input_ids=blocks, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return captured


def distill_mixers(teacher: nn.Module, student: nn.Module, blocks: torch.Tensor, cfg: LfmConfig,
                   generator: torch.Generator) -> list[float]:
    mixers = [layer.conv for layer in conv_layers(student)]
    optimiser = torch.optim.Adam([p for m in mixers for p in m.parameters()], lr=cfg.lr * 10)
    losses = []
    for _ in range(cfg.distill_steps):
        batch = blocks[torch.randint(len(blocks), (cfg.batch_size,), generator=generator)]
        pairs = capture_conv_io(teacher, batch.to(next(teacher.parameters()).device))
        loss = sum(nn.functional.mse_loss(mixer(x), y) for mixer, (x, y) in zip(mixers, pairs))
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    return losses


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(input_ids=batch, labels=batch, use_cache=False).loss


def finetune(model: nn.Module, blocks: torch.Tensor, cfg: LfmConfig, generator: torch.Generator) -> list[float]:
    optimiser = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    device = next(model.parameters()).device
    losses = []
    model.train()
    for _ in range(cfg.finetune_steps):
        batch = blocks[torch.randint(len(blocks), (cfg.batch_size,), generator=generator)].to(device)
        loss = lm_loss(model, batch)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def perplexity(model: nn.Module, blocks: torch.Tensor, batch_size: int) -> float:
    device = next(model.parameters()).device
    with torch.no_grad():
        losses = [float(lm_loss(model, blocks[i:i + batch_size].to(device))) for i in range(0, len(blocks), batch_size)]
    return math.exp(float(np.mean(losses)))


def tokens_per_second(model: nn.Module, batch: torch.Tensor, steps: int, train: bool) -> float:
    """Tokens per second over ``steps`` repeats after one warm-up (GPU synchronised)."""
    def once() -> None:
        if train:
            lm_loss(model, batch).backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                model(input_ids=batch, use_cache=False)

    once()
    if batch.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        once()
    if batch.is_cuda:
        torch.cuda.synchronize()
    return steps * batch.numel() / (time.perf_counter() - start)


# ------------------------------------------------------------------------------------------------
# Hub loaders (tested with local stand-ins only)
# ------------------------------------------------------------------------------------------------

def load_lfm(name_or_path: str, dtype: str = "bfloat16"):
    """The LFM2 causal LM and its tokenizer (``LiquidAI/LFM2-1.2B`` is the guess for the paper's "LFM-1.2B")."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    return model, tokenizer


def load_texts(dataset: str, config_name: str | None, split: str, n_texts: int, min_chars: int = 200) -> list[str]:
    """The first ``n_texts`` non-trivial texts of a split (wikitext has many empty lines)."""
    from datasets import load_dataset

    rows = load_dataset(dataset, config_name, split=split)
    texts = [t for t in rows["text"] if len(t.strip()) >= min_chars]
    if len(texts) < n_texts:
        raise ValueError(f"coda.lfm: {dataset}/{split} holds {len(texts)} texts of >= {min_chars} chars, "
                         f"{n_texts} requested")
    return texts[:n_texts]


def token_blocks(tokenizer, texts: list[str], seq_len: int) -> np.ndarray:
    """Concatenate the tokenised texts and cut them into (n_blocks, seq_len) token-id blocks."""
    ids = [i for text in texts for i in tokenizer(text)["input_ids"]]
    n_blocks = len(ids) // seq_len
    if n_blocks == 0:
        raise ValueError(f"coda.lfm.seq_len: {len(ids)} tokens do not fill one block of {seq_len}")
    return np.asarray(ids[:n_blocks * seq_len], dtype=np.int64).reshape(n_blocks, seq_len)


def text_blocks_path(data_dir: Path, split: str) -> Path:
    return Path(data_dir) / f"lfm_{split}_blocks.parquet"


def write_text_blocks(cfg: LfmConfig, data_dir: Path) -> list[Path]:
    """Data phase of the LFM study: tokenised train / eval blocks, shared by every seed."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model)
    paths = []
    for split, n_texts in ((cfg.train_split, cfg.n_train_texts), (cfg.eval_split, cfg.n_eval_texts)):
        blocks = token_blocks(tokenizer, load_texts(cfg.dataset, cfg.dataset_config, split, n_texts), cfg.seq_len)
        paths.append(write_parquet(pl.DataFrame({"input_ids": blocks}), text_blocks_path(data_dir, split)))
    return paths


def read_blocks(cfg: LfmConfig, data_dir: Path, split: str) -> torch.Tensor:
    path = text_blocks_path(data_dir, split)
    if not path.exists():
        raise FileNotFoundError(f"coda.lfm: {path} is missing; run the data phase first")
    blocks = pl.read_parquet(path)["input_ids"].to_numpy()
    if blocks.shape[1] != cfg.seq_len:
        raise ValueError(f"coda.lfm.seq_len: {path.name} holds blocks of {blocks.shape[1]} tokens, the config says "
                         f"{cfg.seq_len}; rerun the data phase")
    return torch.as_tensor(blocks)


def read_train_eval_blocks(cfg: LfmConfig, data_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Both splits' token blocks, checked against the config (``train`` calls this before any compute)."""
    return read_blocks(cfg, data_dir, cfg.train_split), read_blocks(cfg, data_dir, cfg.eval_split)


STUDENT = "lfm_student.safetensors"


def load_teacher(cfg: LfmConfig, device: str) -> nn.Module:
    teacher, _ = load_lfm(cfg.model, cfg.dtype)
    return teacher.to(device).eval()


def convert_and_finetune(teacher: nn.Module, train_blocks: torch.Tensor, cfg: LfmConfig, seed: int,
                         progress: Progress = no_progress) -> tuple[nn.Module, list[float], list[float]]:
    """The CoDA student of ``teacher``, distilled then fine-tuned; the teacher is left unchanged. Returns the
    student and its distillation and fine-tuning losses (one generator draws both steps' batches)."""
    generator = torch.Generator().manual_seed(seed)
    student = replace_short_convs(teacher, cfg.gru_hidden, cfg.rank, seed)
    distill = distill_mixers(teacher, student, train_blocks, cfg, generator)
    progress(0.5, f"lfm: distilled {len(distill)} steps")
    losses = finetune(student, train_blocks, cfg, generator)
    return student, distill, losses


def save_student(student: nn.Module, model_dir: Path) -> Path:
    """The whole student (fine-tuning updates every weight); ``save_model`` stores tied weights once."""
    from safetensors.torch import save_model

    return write_with(Path(model_dir) / STUDENT, lambda tmp: save_model(student, str(tmp)))


def load_student(teacher: nn.Module, cfg: LfmConfig, seed: int, model_dir: Path) -> nn.Module:
    """The student ``save_student`` wrote, rebuilt on the teacher's architecture."""
    from safetensors.torch import load_model

    student = replace_short_convs(teacher, cfg.gru_hidden, cfg.rank, seed)
    load_model(student, str(Path(model_dir) / STUDENT))
    return student.eval()


def train_student(cfg: LfmConfig, seed: int, train_blocks: torch.Tensor, model_dir: Path, device: str,
                  progress: Progress = no_progress) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Training step of the LFM study: the converted, fine-tuned student saved in ``model_dir``; returns the
    final fine-tuning loss and both loss curves."""
    teacher = load_teacher(cfg, device)
    student, distill, losses = convert_and_finetune(teacher, train_blocks, cfg, seed, progress)
    save_student(student, model_dir)
    return ({"lfm_final_finetune_loss": losses[-1] if losses else math.nan},
            {"lfm_distill_loss": distill, "lfm_finetune_loss": losses})


def measure_models(teacher: nn.Module, student: nn.Module, train_blocks: torch.Tensor, eval_blocks: torch.Tensor,
                   cfg: LfmConfig) -> list[dict]:
    """Perplexity on ``eval_blocks``, training and inference tokens/s and parameter count of the original and
    the CoDA model (rows ``original``, ``coda``)."""
    device = next(teacher.parameters()).device
    timing = train_blocks[:cfg.batch_size].to(device)
    return [{"model": name, "perplexity": perplexity(model, eval_blocks, cfg.batch_size),
             "train_tokens_per_s": tokens_per_second(model, timing, cfg.timing_steps, train=True),
             "inference_tokens_per_s": tokens_per_second(model, timing, cfg.timing_steps, train=False),
             "parameters": sum(p.numel() for p in model.parameters())}
            for name, model in (("original", teacher), ("coda", student))]


def evaluate_student(cfg: LfmConfig, seed: int, blocks: tuple[torch.Tensor, torch.Tensor], model_dir: Path,
                     device: str) -> list[dict]:
    """Evaluation step of the LFM study. ``blocks``: the (train, eval) token blocks from
    ``read_train_eval_blocks``."""
    teacher = load_teacher(cfg, device)
    return measure_models(teacher, load_student(teacher, cfg, seed, model_dir), blocks[0], blocks[1], cfg)
