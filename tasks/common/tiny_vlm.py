"""A tiny vision-language model trained from scratch: image/frame encoder -> projector -> GPT-2.

The design is LLaVA's (Liu et al. 2023, "Visual Instruction Tuning"): a vision encoder turns an
image into patch tokens, a projector (linear, or LLaVA-1.5's 2-layer GELU MLP) maps them to the
language model's embedding width, and a causal LM reads the sequence
``[image tokens][prompt token embeddings][caption token embeddings]`` through ``inputs_embeds``.
Here the encoder is a small ViT (or a small CNN) and the LM is a ``transformers`` GPT-2 built by
``tasks.common.tiny_lm``, so the whole model is a few tens of thousands of parameters and trains
on CPU in seconds.

Conventions:

- images are ``(B, C, H, W)``; video is ``(B, T, C, H, W)``, frames encoded independently and
  their tokens concatenated in time order (an image is a one-frame video);
- within a batch, prompts have one length (no prompt padding); captions and generated
  continuations are right-padded, with a boolean mask marking real tokens. Right padding needs no
  attention mask: a causal model never lets later (pad) positions influence earlier ones;
- log-probabilities are over the full vocabulary at temperature 1.
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, model_validator
from safetensors.torch import load_model as load_safetensors_model
from safetensors.torch import save_model as save_safetensors_model
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from tasks.common.io import write_dir_with
from tasks.common.seeding import torch_init_seed
from tasks.common.tiny_lm import tiny_gpt2_config

CONFIG_FILE = "vlm_config.json"
WEIGHTS_FILE = "model.safetensors"
IGNORE_INDEX = -100

# transformers renamed GPT-2's ``past_key_values`` argument/output to ``cache`` during 5.x.
_CACHE_NAME = "cache" if "cache" in inspect.signature(GPT2LMHeadModel.forward).parameters else "past_key_values"


class TinyVLMConfig(BaseModel):
    """Every size of the model; ``TinyVLM(config)`` is fully determined by it and a seed.

    ``lm_init_std`` is GPT-2's ``initializer_range``; ``None`` means ``lm_width ** -0.5`` (fan-in
    scale). GPT-2's 0.02 suits width 768; at width 32 it is 9x below fan-in scale and the
    text-to-image attention sat on a plateau for ~650 steps on the square task of the unit tests,
    against < 150 steps at fan-in scale (measured).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int
    image_size: int = 16
    channels: int = 3
    patch_size: int = 4
    encoder_kind: Literal["vit", "cnn"] = "vit"
    encoder_width: int = 32
    encoder_depth: int = 2
    encoder_heads: int = 2
    max_frames: int = 1
    time_embedding: bool = False
    projector: Literal["linear", "mlp"] = "mlp"
    lm_width: int = 32
    lm_depth: int = 1
    lm_heads: int = 2
    lm_positions: int = 64
    lm_init_std: float | None = None
    dropout: float = 0.0

    @model_validator(mode="after")
    def _check_sizes(self) -> TinyVLMConfig:
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.encoder_width % self.encoder_heads or self.lm_width % self.lm_heads:
            raise ValueError("encoder_width and lm_width must be multiples of their head counts")
        if self.encoder_width % 4:
            raise ValueError(f"encoder_width {self.encoder_width} must be a multiple of 4 (2D sin-cos init)")
        if self.lm_positions <= self.tokens_per_frame * self.max_frames:
            raise ValueError(f"lm_positions {self.lm_positions} leaves no room for text after "
                             f"{self.tokens_per_frame * self.max_frames} image tokens")
        return self

    @property
    def tokens_per_frame(self) -> int:
        """Patch tokens per frame: (H / p) * (W / p)."""
        return (self.image_size // self.patch_size) ** 2


@dataclass
class EncoderOutput:
    """Encoder tokens ``(B, T*N, D_enc)`` and the per-layer states (embedding output first, then one
    per layer), each ``(B, T*N, D_enc)``; states are per frame, before the time embedding."""

    tokens: torch.Tensor
    hidden_states: list[torch.Tensor]


@dataclass
class GenerationOutput:
    """Generated ids ``(B, n)`` (after a sequence's EOS: ``pad_token_id``), ``mask`` ``(B, n)`` true
    for generated tokens including the EOS, and the logits each token was chosen from ``(B, n, V)``."""

    tokens: torch.Tensor
    mask: torch.Tensor
    logits: torch.Tensor


def sincos_1d(length: int, width: int) -> torch.Tensor:
    """``(length, width)`` sin-cos table (Vaswani et al. 2017): sines of ``width // 2`` frequencies, then cosines."""
    if width % 2:
        raise ValueError(f"width {width} must be even")
    frequency = 1.0 / 10000 ** (torch.arange(width // 2, dtype=torch.float64) / (width // 2))
    angle = torch.arange(length, dtype=torch.float64)[:, None] * frequency[None]
    return torch.cat([angle.sin(), angle.cos()], dim=1).float()


def sincos_2d(grid: int, width: int) -> torch.Tensor:
    """``(grid * grid, width)`` 2D sin-cos table in row-major patch order (MAE, He et al. 2022): the first
    half of the channels encodes the row, the second half the column."""
    if width % 4:
        raise ValueError(f"width {width} must be a multiple of 4")
    axis = sincos_1d(grid, width // 2)
    return torch.cat([axis.repeat_interleave(grid, dim=0), axis.repeat(grid, 1)], dim=1)


class _Attention(nn.Module):
    """Bidirectional multi-head self-attention (the encoder sees the whole frame)."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.out(y.transpose(1, 2).reshape(batch, length, width))


class _ViTBlock(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = _Attention(width, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ViTEncoder(nn.Module):
    """Patchify convolution + learned position embeddings (initialised to MAE's 2D sin-cos table) +
    pre-norm transformer blocks + final norm."""

    def __init__(self, config: TinyVLMConfig) -> None:
        super().__init__()
        width = config.encoder_width
        self.patchify = nn.Conv2d(config.channels, width, config.patch_size, stride=config.patch_size)
        grid = config.image_size // config.patch_size
        self.position = nn.Parameter(sincos_2d(grid, width)[None])
        self.blocks = nn.ModuleList(_ViTBlock(width, config.encoder_heads, config.dropout)
                                    for _ in range(config.encoder_depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(B, C, H, W)`` -> tokens ``(B, N, D)`` and ``depth + 1`` hidden states."""
        x = self.patchify(frames).flatten(2).transpose(1, 2) + self.position
        states = [x]
        for block in self.blocks:
            x = block(x)
            states.append(x)
        return self.norm(x), states


class _ConvBlock(nn.Module):
    """Residual block on the patch grid: x + conv(gelu(conv(groupnorm(x))))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.GroupNorm(1, width), nn.Conv2d(width, width, 3, padding=1), nn.GELU(),
                                  nn.Conv2d(width, width, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class CNNEncoder(nn.Module):
    """Small-CNN alternative with the same token grid as the ViT: a stride-p stem, then residual 3x3
    conv blocks. Position comes from zero padding and the LM's own position embeddings."""

    def __init__(self, config: TinyVLMConfig) -> None:
        super().__init__()
        width = config.encoder_width
        self.patchify = nn.Conv2d(config.channels, width, config.patch_size, stride=config.patch_size)
        self.blocks = nn.ModuleList(_ConvBlock(width) for _ in range(config.encoder_depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(B, C, H, W)`` -> tokens ``(B, N, D)`` and ``depth + 1`` hidden states."""
        x = self.patchify(frames)
        states = [x.flatten(2).transpose(1, 2)]
        for block in self.blocks:
            x = block(x)
            states.append(x.flatten(2).transpose(1, 2))
        return self.norm(states[-1]), states


def build_projector(kind: str, in_width: int, out_width: int) -> nn.Module:
    """LLaVA's projector: ``linear`` (LLaVA) or ``mlp`` = Linear-GELU-Linear (LLaVA-1.5)."""
    if kind == "linear":
        return nn.Linear(in_width, out_width)
    return nn.Sequential(nn.Linear(in_width, out_width), nn.GELU(), nn.Linear(out_width, out_width))


class TinyVLM(nn.Module):
    """Encoder -> projector -> GPT-2 over ``inputs_embeds`` (LLaVA layout: image tokens first)."""

    def __init__(self, config: TinyVLMConfig) -> None:
        super().__init__()
        self.config = config
        self.encoder = ViTEncoder(config) if config.encoder_kind == "vit" else CNNEncoder(config)
        self.time = nn.Parameter(sincos_1d(config.max_frames, config.encoder_width)) if config.time_embedding else None
        self.projector = build_projector(config.projector, config.encoder_width, config.lm_width)
        self.lm = GPT2LMHeadModel(lm_config(config))

    def num_image_tokens(self, frames: int = 1) -> int:
        """Image positions at the start of the LM sequence: (H/p) * (W/p) * T."""
        return self.config.tokens_per_frame * frames

    def encode(self, images: torch.Tensor) -> EncoderOutput:
        """Encode ``(B, C, H, W)`` images or ``(B, T, C, H, W)`` frames (each frame independently)."""
        video = images[:, None] if images.dim() == 4 else images
        if video.dim() != 5:
            raise ValueError(f"expected (B, C, H, W) or (B, T, C, H, W), got shape {tuple(images.shape)}")
        batch, frames = video.shape[:2]
        if frames > self.config.max_frames:
            raise ValueError(f"{frames} frames > max_frames {self.config.max_frames}")
        dtype = self.encoder.patchify.weight.dtype
        tokens, states = self.encoder(video.flatten(0, 1).to(dtype))
        tokens = tokens.view(batch, frames, *tokens.shape[1:])
        if self.time is not None:
            tokens = tokens + self.time[:frames, None, :]
        join = lambda t: t.reshape(batch, frames * t.shape[1], t.shape[2])
        return EncoderOutput(join(tokens.flatten(0, 1)), [join(s) for s in states])

    def image_embeds(self, images: torch.Tensor) -> torch.Tensor:
        """Projected image tokens ``(B, N_img, lm_width)``: the LM's first ``N_img`` input embeddings."""
        return self.projector(self.encode(images).tokens)

    def token_embeds(self, input_ids: torch.Tensor) -> torch.Tensor:
        """GPT-2 word embeddings of ``(B, L)`` ids (positions are added inside GPT-2)."""
        return self.lm.get_input_embeddings()(input_ids)

    def embed_inputs(self, images: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """``inputs_embeds`` of the sequence ``[image tokens][input_ids]``, ``(B, N_img + L, lm_width)``."""
        length = self.num_image_tokens(_frames(images)) + input_ids.shape[1]
        if length > self.config.lm_positions:
            raise ValueError(f"sequence of {length} positions > lm_positions {self.config.lm_positions}")
        return torch.cat([self.image_embeds(images), self.token_embeds(input_ids)], dim=1)

    def forward(self, images: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, N_img + L, V)`` over ``[image tokens][input_ids]`` (``input_ids`` = prompt + caption)."""
        return self.lm(inputs_embeds=self.embed_inputs(images, input_ids)).logits


def lm_config(config: TinyVLMConfig) -> GPT2Config:
    """The GPT-2 config of the language model (``tiny_lm.tiny_gpt2_config`` with the VLM's init scale)."""
    gpt2 = tiny_gpt2_config(config.vocab_size, config.lm_positions, n_layer=config.lm_depth,
                            n_head=config.lm_heads, n_embd=config.lm_width, dropout=config.dropout)
    gpt2.initializer_range = config.lm_init_std if config.lm_init_std is not None else config.lm_width ** -0.5
    return gpt2


def build_tiny_vlm(config: TinyVLMConfig, seed: int, dtype: torch.dtype = torch.float32) -> TinyVLM:
    """Randomly initialised model, reproducible from ``seed`` even when seeds build on parallel threads."""
    with torch_init_seed(seed):
        model = TinyVLM(config)
    return model.to(dtype)


# ----------------------------------------------------------------------------- losses and log-probs


def build_labels(num_image_tokens: int, prompt_ids: torch.Tensor, caption_ids: torch.Tensor,
                 caption_mask: torch.Tensor) -> torch.Tensor:
    """Labels ``(B, N_img + L_p + L_c)`` aligned with the input sequence: caption ids where
    ``caption_mask``, ``IGNORE_INDEX`` at image, prompt and padding positions (unshifted)."""
    batch = caption_ids.shape[0]
    prefix = torch.full((batch, num_image_tokens + prompt_ids.shape[1]), IGNORE_INDEX,
                        dtype=torch.long, device=caption_ids.device)
    caption = torch.where(caption_mask.bool(), caption_ids, torch.full_like(caption_ids, IGNORE_INDEX))
    return torch.cat([prefix, caption], dim=1)


def token_logprobs(model: TinyVLM, images: torch.Tensor, prompt_ids: torch.Tensor, caption_ids: torch.Tensor,
                   caption_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token log-probs of the labelled tokens and their mask, both ``(B, S - 1)``.

    Position ``t`` of the result is ``log p(label_{t+1} | sequence_{<=t})`` (the one-step shift of a
    causal LM); it is 0 where the label is ``IGNORE_INDEX``.
    """
    logits = model(images, torch.cat([prompt_ids, caption_ids], dim=1))
    labels = build_labels(model.num_image_tokens(_frames(images)), prompt_ids, caption_ids, caption_mask)
    targets, valid = labels[:, 1:], labels[:, 1:] != IGNORE_INDEX
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, targets.clamp_min(0).unsqueeze(-1)).squeeze(-1)
    return picked * valid, valid


def caption_loss(model: TinyVLM, images: torch.Tensor, prompt_ids: torch.Tensor, caption_ids: torch.Tensor,
                 caption_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over real caption tokens (image/prompt/pad labels are -100)."""
    logp, valid = token_logprobs(model, images, prompt_ids, caption_ids, caption_mask)
    return -logp.sum() / valid.sum().clamp_min(1)


def sequence_logprob(model: TinyVLM, images: torch.Tensor, prompt_ids: torch.Tensor,
                     continuation_ids: torch.Tensor, continuation_mask: torch.Tensor) -> torch.Tensor:
    """``(B,)`` sum of ``log p(continuation token | image, prompt, earlier tokens)`` over masked tokens
    (the policy log-likelihood an RL objective differentiates); differentiable."""
    logp, _ = token_logprobs(model, images, prompt_ids, continuation_ids, continuation_mask)
    return logp.sum(dim=-1)


def _frames(images: torch.Tensor) -> int:
    return 1 if images.dim() == 4 else images.shape[1]


# ----------------------------------------------------------------------------- generation


@torch.no_grad()
def generate(model: TinyVLM, images: torch.Tensor, prompt_ids: torch.Tensor, max_new_tokens: int,
             eos_token_id: int | None = None, pad_token_id: int | None = None, do_sample: bool = False,
             temperature: float = 1.0, top_k: int | None = None, generator: torch.Generator | None = None,
             use_cache: bool = True) -> GenerationOutput:
    """Greedy (default) or sampled continuation of ``[image][prompt]``, stopping when every sequence
    has emitted ``eos_token_id`` or after ``max_new_tokens``.

    Sampling draws only from ``generator`` (required), so a seed fixes the output. ``use_cache``
    feeds one new embedding per step against GPT-2's KV cache; ``False`` re-runs the whole sequence
    each step (same tokens, logits within 1e-5; measured on one CPU thread, batch 32: 2.1x slower for
    16 image tokens and 7 new tokens, 5.3x for 64 image tokens and 32 new tokens). The
    returned logits are before temperature and top-k, i.e. what ``sequence_logprob`` scores. The
    caller sets train/eval mode (dropout).
    """
    if do_sample and generator is None:
        raise ValueError("sampling needs an explicit torch.Generator")
    if do_sample and temperature <= 0:
        raise ValueError("temperature must be positive; use do_sample=False for greedy decoding")
    pad = pad_token_id if pad_token_id is not None else (eos_token_id if eos_token_id is not None else 0)
    if model.num_image_tokens(_frames(images)) + prompt_ids.shape[1] + max_new_tokens - 1 > model.config.lm_positions:
        raise ValueError(f"{max_new_tokens} new tokens overrun lm_positions {model.config.lm_positions}")
    embeds = model.embed_inputs(images, prompt_ids)
    batch = embeds.shape[0]
    done = torch.zeros(batch, dtype=torch.bool, device=embeds.device)
    tokens, masks, step_logits = [], [], []
    cache = None
    for _ in range(max_new_tokens):
        if use_cache:  # after the first step ``embeds`` holds only the newest token
            out = model.lm(inputs_embeds=embeds, use_cache=True, logits_to_keep=1, **{_CACHE_NAME: cache})
            cache = getattr(out, _CACHE_NAME)
        else:
            out = model.lm(inputs_embeds=embeds, use_cache=False, logits_to_keep=1)
        logits = out.logits[:, -1].float()
        token = _choose(logits, do_sample, temperature, top_k, generator)
        token = torch.where(done, torch.full_like(token, pad), token)
        tokens.append(token)
        masks.append(~done)
        step_logits.append(logits)
        if eos_token_id is not None:
            done = done | (token == eos_token_id)
        new = model.token_embeds(token[:, None])
        embeds = new if use_cache else torch.cat([embeds, new], dim=1)
        if bool(done.all()):
            break
    vocab = model.config.vocab_size
    if not tokens:
        empty = prompt_ids.new_zeros((batch, 0))
        return GenerationOutput(empty, empty.bool(), embeds.new_zeros((batch, 0, vocab)))
    return GenerationOutput(torch.stack(tokens, 1), torch.stack(masks, 1), torch.stack(step_logits, 1))


def _choose(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int | None,
            generator: torch.Generator | None) -> torch.Tensor:
    """Next token ``(B,)``: argmax, or a draw from softmax(logits / temperature) restricted to the top k."""
    if not do_sample:
        return logits.argmax(dim=-1)
    scaled = logits / temperature
    if top_k is not None and top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, -math.inf)
    return torch.multinomial(torch.softmax(scaled, dim=-1), 1, generator=generator).squeeze(-1)


# ----------------------------------------------------------------------------- save / load


def save_vlm(model: TinyVLM, directory: str | Path) -> Path:
    """Write ``vlm_config.json`` and ``model.safetensors`` into a folder, atomically (temp folder +
    rename). safetensors' ``save_model`` stores GPT-2's tied embedding/head weight once."""

    def writer(tmp: Path) -> None:
        (tmp / CONFIG_FILE).write_text(json.dumps(_config_record(model), indent=2, sort_keys=True) + "\n",
                                       encoding="utf-8")
        save_safetensors_model(model, str(tmp / WEIGHTS_FILE))

    return write_dir_with(directory, writer)


def load_vlm(directory: str | Path, device: str | torch.device = "cpu") -> TinyVLM:
    """Rebuild the model saved by ``save_vlm`` (strict: every tensor must match), in eval mode."""
    record = json.loads((Path(directory) / CONFIG_FILE).read_text(encoding="utf-8"))
    model = build_tiny_vlm(TinyVLMConfig(**record["config"]), seed=0, dtype=getattr(torch, record["dtype"]))
    load_safetensors_model(model, str(Path(directory) / WEIGHTS_FILE), strict=True)
    return model.to(device).eval()


def _config_record(model: TinyVLM) -> dict[str, Any]:
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    return {"config": model.config.model_dump(), "dtype": dtype}
