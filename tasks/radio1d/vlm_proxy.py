"""VLM proxy for C6 (report only): a tiny ``transformers`` GPT-2 reads k projected 1D tokens of a frozen encoder
through ``inputs_embeds`` (LLaVA layout: image tokens first, then the question) and answers "which digit (or
'empty') is in quadrant q?". One model is trained with k drawn per step from the evaluated k, then its accuracy is
measured at each k: the accuracy-vs-token-budget trade-off of one VLM over an elastic encoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tasks.common.seeding import torch_init_seed
from tasks.common.tiny_lm import build_tiny_gpt2, tiny_gpt2_config
from tasks.radio1d.config import VLMProxyConfig

ANSWERS = 11  # token ids 0..9 digits, 10 empty
QUESTIONS = 4  # ids 11..14: "what is in quadrant q"


def question_logits(gpt, projector: nn.Module, tokens: torch.Tensor, quadrant: torch.Tensor) -> torch.Tensor:
    """Answer logits ``(B, 11)`` at the question position after ``[projected tokens][question q]``."""
    question = gpt.get_input_embeddings()(ANSWERS + quadrant)[:, None]
    logits = gpt(inputs_embeds=torch.cat([projector(tokens), question], dim=1)).logits
    return logits[:, -1, :ANSWERS]


def vlm_accuracy_vs_k(cfg: VLMProxyConfig, tokens_train: torch.Tensor, layouts_train: torch.Tensor,
                      tokens_test: torch.Tensor, layouts_test: torch.Tensor, ks: tuple[int, ...],
                      seed: int) -> list[dict]:
    """Train one proxy VLM on random k in ``ks``; return the test accuracy (all 4 questions) at each k."""
    gpt = build_tiny_gpt2(tiny_gpt2_config(ANSWERS + QUESTIONS, max(ks) + 1, n_layer=cfg.layers, n_head=2,
                                           n_embd=cfg.width), seed)
    with torch_init_seed(seed):
        projector = nn.Sequential(nn.Linear(tokens_train.shape[-1], cfg.width), nn.GELU(),
                                  nn.Linear(cfg.width, cfg.width))
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW([*gpt.parameters(), *projector.parameters()], lr=cfg.lr)
    for _ in range(cfg.steps):
        index = torch.randint(len(tokens_train), (cfg.batch_size,), generator=generator)
        quadrant = torch.randint(QUESTIONS, (cfg.batch_size,), generator=generator)
        k = ks[int(torch.randint(len(ks), (1,), generator=generator))]
        logits = question_logits(gpt, projector, tokens_train[index, :k], quadrant)
        loss = F.cross_entropy(logits, layouts_train[index, quadrant])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    rows = []
    with torch.no_grad():
        for k in ks:
            correct = sum(int((question_logits(gpt, projector, tokens_test[:, :k], torch.full(
                (len(tokens_test),), q)).argmax(-1) == layouts_test[:, q]).sum()) for q in range(QUESTIONS))
            rows.append({"k": k, "vlm_accuracy": correct / (QUESTIONS * len(tokens_test))})
    return rows
