"""Baseline (a): a jointly trained end-to-end model on N paired multimodal QA examples (the paper's foil: an
omni model trained on paired data, here at toy scale along a budget curve).

Encoders of the same shapes as the experts' (experts.py): the vision encoder's 4 cell tokens, the video
encoder's 32 tokens, and the question as one token per word (a word embedding for typed requests, the ASR's
frame encoder over the spectrum for spoken ones), a learned [CLS] token, type and position embeddings, a
pre-norm transformer and a linear head over the answer classes. Absent media are masked out.
The other baselines (no memory, sequential TTS, free decoding) are switches of the orchestrator
(orchestrator.py), not separate models.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tasks.common.schedules import warmup_cosine
from tasks.common.seeding import torch_init_seed
from tasks.llm_orchestration.experts import AudioFrameEncoder, cell_tokens, video_tokens, vision_encoder
from tasks.llm_orchestration.method import DIRECTIONS

ANSWERS = ("0", "1", "2", "3", "4", *DIRECTIONS)
MAX_QUESTION = 16


class Block(nn.Module):
    """Pre-norm transformer block with explicit softmax attention (key padding mask); torch's fused CPU
    attention with a mask was 20x slower at these sizes (measured)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(pad[:, None, None, :], -math.inf)
        x = x + self.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class JointModel(nn.Module):
    def __init__(self, width: int, layers: int, heads: int, vocab_size: int) -> None:
        super().__init__()
        self.width = width
        self.vision = vision_encoder(width)
        self.video = vision_encoder(width)
        self.audio = AudioFrameEncoder(width)
        self.words = nn.Embedding(vocab_size, width)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.types = nn.Embedding(4, width)  # cls, image, video, question
        self.positions = nn.Parameter(torch.zeros(1, 1 + 4 + 32 + MAX_QUESTION, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, len(ANSWERS))
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        b = batch["images"].shape[0]
        image_tokens = _only_present(lambda x: cell_tokens(self.vision, x), batch["images"], batch["has_image"], 4,
                                     self.width)
        clip_tokens = _only_present(lambda x: video_tokens(self.video, x), batch["videos"], batch["has_video"], 32,
                                    self.width)
        spoken = batch["spoken"].view(b, 1, 1)
        question = torch.where(spoken, self.audio(batch["spectra"]), self.words(batch["word_ids"]))
        parts = [self.cls.expand(b, -1, -1), image_tokens, clip_tokens, question]
        kinds = torch.cat([torch.full((p.shape[1],), k) for k, p in enumerate(parts)])
        x = torch.cat(parts, dim=1) + self.types(kinds) + self.positions[:, :kinds.numel()]
        pad = torch.cat([torch.zeros(b, 1, dtype=torch.bool),
                         (~batch["has_image"]).view(b, 1).expand(b, image_tokens.shape[1]),
                         (~batch["has_video"]).view(b, 1).expand(b, clip_tokens.shape[1]),
                         ~batch["question_mask"]], dim=1)
        for block in self.blocks:
            x = block(x, pad)
        return self.head(self.norm(x[:, 0]))


def _only_present(encode, inputs: torch.Tensor, present: torch.Tensor, tokens: int, width: int) -> torch.Tensor:
    """Encode only the items that have this medium; the others get zero tokens (masked out anyway)."""
    out = torch.zeros(inputs.shape[0], tokens, width, dtype=inputs.dtype)
    if bool(present.any()):
        out = out.index_put((present.nonzero()[:, 0],), encode(inputs[present]))
    return out


def build_joint(width: int, layers: int, heads: int, vocab_size: int, seed: int) -> JointModel:
    with torch_init_seed(seed):
        return JointModel(width, layers, heads, vocab_size)


def joint_steps(n: int, epochs: int, batch_size: int, min_steps: int, max_steps: int) -> int:
    """ceil(epochs * n / batch_size) clamped to [min_steps, max_steps]."""
    return max(min_steps, min(max_steps, math.ceil(epochs * n / batch_size)))


def take(batch: dict[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]:
    return {k: v[index] for k, v in batch.items()}


def train_joint(model: JointModel, batch: dict[str, torch.Tensor], labels: torch.Tensor, steps: int,
                batch_size: int, lr: float, seed: int) -> list[float]:
    """AdamW with warm-up and cosine decay on minibatches drawn with replacement; per-step loss."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = warmup_cosine(optimizer, steps)
    model.train()
    losses = []
    n = labels.shape[0]
    for _ in range(steps):
        index = torch.randint(0, n, (min(batch_size, n),), generator=generator)
        loss = nn.functional.cross_entropy(model(take(batch, index)), labels[index])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


@torch.no_grad()
def joint_predict(model: JointModel, batch: dict[str, torch.Tensor], chunk: int = 512) -> torch.Tensor:
    n = batch["images"].shape[0]
    return torch.cat([model(take(batch, torch.arange(s, min(n, s + chunk)))).argmax(-1) for s in range(0, n, chunk)])
