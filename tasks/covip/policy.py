"""The tiny VLM policy of covip: interleaved context -> personalized caption.

Built on ``tasks.common.tiny_vlm`` (ViT encoder with one 16x16 patch per cell, MLP projector, GPT-2 fed
through ``inputs_embeds``). The LM reads the interleaved sequence
``[img_1] N P E ... [img_K] N P E [cell_1..cell_4] <cap>`` and writes the caption;
rollouts and GRPO updates go through ``tasks.common.rl`` with the context as ``prefix_embeds`` and
``<cap>`` as the prompt, so RL updates the GPT-2 only (the vision encoder and projector are frozen in
RL, as the paper freezes the vision tower).
"""

from __future__ import annotations

import torch

from tasks.common import rl
from tasks.common.tiny_vlm import TinyVLM, TinyVLMConfig, build_tiny_vlm
from tasks.covip.config import CovipConfig
from tasks.covip.data import CAPTION, CELL, EOS, GRID_CELLS, PAD, EpisodeBatch


def vlm_config(cfg: CovipConfig, vocab_size: int) -> TinyVLMConfig:
    m, d = cfg.model, cfg.data
    positions = d.n_context * 4 + GRID_CELLS + 1 + cfg.reward.length_limit + 2
    return TinyVLMConfig(vocab_size=vocab_size, image_size=CELL, patch_size=CELL, encoder_kind="vit",
                         encoder_width=m.encoder_width, encoder_depth=m.encoder_depth, encoder_heads=1,
                         lm_width=m.lm_width, lm_depth=m.lm_depth, lm_heads=m.lm_heads, lm_positions=positions)


def build_policy(cfg: CovipConfig, vocab_size: int, seed: int) -> TinyVLM:
    return build_tiny_vlm(vlm_config(cfg, vocab_size), seed)


def context_prefix(model: TinyVLM, batch: EpisodeBatch, grounded: bool = False) -> torch.Tensor:
    """(B, K * 4 + 4, D) embeddings: each context image's token followed by its dialogue, then the query cells."""
    b, k = batch.dialogue_ids.shape[:2]
    images = model.image_embeds(batch.context_images.flatten(0, 1)).view(b, k, 1, -1)
    dialogues = model.token_embeds(batch.dialogue_ids)
    if grounded:  # each dialogue token also carries its turn's image embedding (a segment embedding)
        dialogues = dialogues + images
    cells = model.image_embeds(batch.query_cells.flatten(0, 1)).view(b, GRID_CELLS, -1)
    return torch.cat([torch.cat([images, dialogues], dim=2).flatten(1, 2), cells], dim=1)


def prompt_ids(batch_size: int) -> torch.Tensor:
    return torch.full((batch_size, 1), CAPTION, dtype=torch.long)


def sft_loss(model: TinyVLM, batch: EpisodeBatch, grounded: bool = False) -> torch.Tensor:
    """Teacher-forced cross-entropy of the target caption (EOS included) after ``[context] <cap>``."""
    b = batch.caption_ids.shape[0]
    inputs = torch.cat([prompt_ids(b), batch.caption_ids[:, :-1]], dim=1)
    embeds = torch.cat([context_prefix(model, batch, grounded), model.token_embeds(inputs)], dim=1)
    logits = model.lm(inputs_embeds=embeds).logits[:, -batch.caption_ids.shape[1]:]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.caption_ids.flatten(), reduction="none")
    mask = batch.caption_mask.flatten().float()
    return (loss * mask).sum() / mask.sum()


def sample(model: TinyVLM, batch: EpisodeBatch, group_size: int, max_new_tokens: int, generator: torch.Generator | int,
           temperature: float, grounded: bool = False) -> rl.Rollouts:
    """``group_size`` captions per episode (temperature 0: greedy) with the context as a fixed prefix."""
    with torch.no_grad():
        prefix = context_prefix(model, batch, grounded)
    return rl.sample_group(model.lm, prompt_ids(prefix.shape[0]), group_size, max_new_tokens, seed=generator,
                           temperature=temperature, eos_token_id=EOS, pad_token_id=PAD, prefix_embeds=prefix)


def greedy_captions(model: TinyVLM, batch: EpisodeBatch, max_new_tokens: int,
                    grounded: bool = False) -> list[list[int]]:
    """Greedy caption ids per episode (up to and including EOS)."""
    was_training = model.training
    model.eval()
    rollouts = sample(model, batch, 1, max_new_tokens, 0, 0.0, grounded)
    model.train(was_training)
    return [row[mask].tolist() for row, mask in zip(rollouts.completion_ids, rollouts.completion_mask)]
