"""Baseline (a): a jointly trained model on N paired multimodal QA examples (the paper's foil: an omni model
trained on paired data, here at toy scale along a budget curve).

The joint model starts from the trained experts' encoders, as the paper's omni baselines start from pretrained
encoders: the vision expert's cell tokens (4 per image), the 17 tokens the video expert's heads read (its
appearance token and the 16 last-minus-first difference tokens), and for a spoken question the ASR expert's
frame features (one per word); a typed question is one learned word embedding per word. The encoders are
frozen, so their tokens are computed once per item (``expert_tokens``) and only the fusion transformer is
trained on the N paired answers: a learned projection per modality, a [CLS] token, type and position
embeddings, a pre-norm transformer, a linear head over the answer classes. Absent media are masked out.
Training stops early on the loss of a held-out part of the paired pool (``train_fusion``), with no fixed step
count.

``oracle_tokens``: the capacity check. The same fusion transformer fed the true scene as one-hot cell tokens
(shape or empty, colour), the true motion as one token and the true question words: if it cannot learn to count
from N answers, the architecture or the optimiser, not the encoders, limits the joint model.

The other baselines (no memory, sequential TTS, free decoding) are switches of the orchestrator
(orchestrator.py), not separate models.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import torch
from torch import nn

from tasks.common.seeding import torch_init_seed
from tasks.llm_orchestration.experts import SHAPE_OR_EMPTY, cell_labels, cell_tokens, motion_tokens
from tasks.llm_orchestration.method import COLOURS, DIRECTIONS

ANSWERS = ("0", "1", "2", "3", "4", *DIRECTIONS)
MAX_QUESTION = 16
ORACLE_CELL_DIM = len(SHAPE_OR_EMPTY) + len(COLOURS)
ORACLE_MOTION_DIM = len(DIRECTIONS) + len(COLOURS)


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


@dataclass(frozen=True)
class TokenShapes:
    """Tokens per item and feature size of each medium given to the fusion transformer."""

    image_tokens: int
    image_dim: int
    video_tokens: int
    video_dim: int
    audio_dim: int


def expert_shapes(width: int) -> TokenShapes:
    return TokenShapes(4, width, 17, width, width)


ORACLE_SHAPES = TokenShapes(4, ORACLE_CELL_DIM, 1, ORACLE_MOTION_DIM, 1)


class FusionModel(nn.Module):
    """The trained part of the joint model: [CLS; image tokens; video tokens; question tokens] -> answer class."""

    def __init__(self, shapes: TokenShapes, width: int, layers: int, heads: int, vocab_size: int) -> None:
        super().__init__()
        self.image_in = nn.Linear(shapes.image_dim, width)
        self.video_in = nn.Linear(shapes.video_dim, width)
        self.audio_in = nn.Linear(shapes.audio_dim, width)
        self.words = nn.Embedding(vocab_size, width)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.types = nn.Embedding(4, width)  # cls, image, video, question
        self.positions = nn.Parameter(torch.zeros(1, 1 + shapes.image_tokens + shapes.video_tokens + MAX_QUESTION,
                                                  width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, len(ANSWERS))
        nn.init.normal_(self.positions, std=0.02)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        b = batch["image_tokens"].shape[0]
        spoken = batch["spoken"].view(b, 1, 1)
        question = torch.where(spoken, self.audio_in(batch["audio_tokens"]), self.words(batch["word_ids"]))
        image, video = self.image_in(batch["image_tokens"]), self.video_in(batch["video_tokens"])
        parts = [self.cls.expand(b, -1, -1), image, video, question]
        kinds = torch.cat([torch.full((p.shape[1],), k) for k, p in enumerate(parts)])
        x = torch.cat(parts, dim=1) + self.types(kinds) + self.positions[:, :kinds.numel()]
        pad = torch.cat([torch.zeros(b, 1, dtype=torch.bool),
                         (~batch["has_image"]).view(b, 1).expand(b, image.shape[1]),
                         (~batch["has_video"]).view(b, 1).expand(b, video.shape[1]),
                         ~batch["question_mask"]], dim=1)
        for block in self.blocks:
            x = block(x, pad)
        return self.head(self.norm(x[:, 0]))


def build_fusion(shapes: TokenShapes, width: int, layers: int, heads: int, vocab_size: int, seed: int
                 ) -> FusionModel:
    with torch_init_seed(seed):
        return FusionModel(shapes, width, layers, heads, vocab_size)


def _question_fields(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: inputs[k] for k in ("has_image", "has_video", "spoken", "word_ids", "question_mask")}


def trim_questions(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the question positions no item uses (padding is masked out anyway; shorter sequences cost less)."""
    used = max(1, int(batch["question_mask"].sum(1).max()))
    return batch | {k: batch[k][:, :used] for k in ("word_ids", "question_mask", "audio_tokens")}


@torch.no_grad()
def expert_tokens(inputs: dict[str, torch.Tensor], vision: nn.Module, video: nn.Module, asr: nn.Module,
                  chunk: int = 256) -> dict[str, torch.Tensor]:
    """The frozen experts' tokens of a ``data.joint_inputs`` batch: the vision expert's cell tokens, the video
    expert's 17 head-input tokens, the ASR expert's per-word features (its hidden layer, the input of its word
    head); question positions no item uses are dropped."""
    n = inputs["images"].shape[0]
    parts: dict[str, list[torch.Tensor]] = {"image_tokens": [], "video_tokens": [], "audio_tokens": []}
    for s in range(0, n, chunk):
        part = slice(s, min(n, s + chunk))
        parts["image_tokens"].append(cell_tokens(vision.encoder, inputs["images"][part]))
        parts["video_tokens"].append(motion_tokens(video.encoder, inputs["videos"][part]))
        parts["audio_tokens"].append(nn.functional.gelu(asr.frame(inputs["spectra"][part])))
    return trim_questions({k: torch.cat(v) for k, v in parts.items()} | _question_fields(inputs))


def oracle_tokens(rows: list[dict], inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The true scene as one-hot cell tokens (shape or empty, then colour), the true motion as one one-hot token
    (direction, then colour), the question as its true words (every question typed)."""
    n = len(rows)
    image = torch.zeros(n, 4, ORACLE_CELL_DIM)
    motion = torch.zeros(n, 1, ORACLE_MOTION_DIM)
    for i, row in enumerate(rows):
        shapes, colours = cell_labels(list(row["cells"]))
        for c, (s, col) in enumerate(zip(shapes, colours, strict=True)):
            image[i, c, s] = 1.0
            if s > 0:
                image[i, c, len(SHAPE_OR_EMPTY) + col] = 1.0
        motion[i, 0, DIRECTIONS.index(row["direction"])] = 1.0
        motion[i, 0, len(DIRECTIONS) + COLOURS.index(row["colour"])] = 1.0
    fields = _question_fields(inputs) | {"spoken": torch.zeros(n, dtype=torch.bool)}
    return trim_questions({"image_tokens": image, "video_tokens": motion,
                           "audio_tokens": torch.zeros(n, MAX_QUESTION, 1)} | fields)


def take(batch: dict[str, torch.Tensor], index: torch.Tensor | slice) -> dict[str, torch.Tensor]:
    return {k: v[index] for k, v in batch.items()}


@dataclass
class FitLog:
    """``stopped_early`` is the convergence flag: the stopping rule ended the run, not ``safety_steps``."""

    losses: list[float]
    val_losses: list[float]
    steps: int
    best_step: int
    stopped_early: bool
    smoothed_val_losses: list[float] = field(default_factory=list)


def smoothed(values: list[float], weight: float) -> list[float]:
    """Exponential moving average: s_0 = v_0, s_t = weight * s_(t-1) + (1 - weight) * v_t (weight 0: the values)."""
    out: list[float] = []
    for v in values:
        out.append(v if not out else weight * out[-1] + (1.0 - weight) * v)
    return out


def should_stop(smoothed_losses: list[float], patience: int, tolerance: float) -> bool:
    """True once none of the last ``patience`` values is more than ``tolerance`` below the best value before them
    (tolerance 0 on raw losses: no improvement in ``patience`` checks)."""
    if len(smoothed_losses) <= patience:
        return False
    return min(smoothed_losses[-patience:]) >= min(smoothed_losses[:-patience]) - tolerance


def check_every(n: int, batch_size: int, min_interval: int) -> int:
    """Steps between validation checks: one pass over the N examples, at least ``min_interval`` steps."""
    return max(min_interval, math.ceil(n / batch_size))


@torch.no_grad()
def mean_loss(model: nn.Module, batch: dict[str, torch.Tensor], labels: torch.Tensor, chunk: int = 1024) -> float:
    n = labels.shape[0]
    total = sum(float(nn.functional.cross_entropy(model(take(batch, slice(s, s + chunk))), labels[s:s + chunk],
                                                  reduction="sum")) for s in range(0, n, chunk))
    return total / n


def train_fusion(model: nn.Module, batch: dict[str, torch.Tensor], labels: torch.Tensor,
                 val_batch: dict[str, torch.Tensor], val_labels: torch.Tensor, batch_size: int, lr: float,
                 min_interval: int, patience: int, safety_steps: int, seed: int, smoothing: float = 0.0,
                 tolerance: float = 0.0) -> FitLog:
    """AdamW on minibatches drawn with replacement; the held-out loss is checked every ``check_every`` steps and
    training stops once its moving average (``smoothed``, weight ``smoothing``) has not improved by more than
    ``tolerance`` for ``patience`` checks (``should_stop``), keeping the weights of the best raw held-out loss.
    ``safety_steps`` only guards against a run that never stops (``FitLog.stopped_early`` says which ended it)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    interval = check_every(labels.shape[0], batch_size, min_interval)
    n = labels.shape[0]
    log = FitLog([], [], 0, 0, False)
    best, best_state = math.inf, copy.deepcopy(model.state_dict())
    while log.steps < safety_steps:
        model.train()
        for _ in range(interval):
            index = torch.randint(0, n, (min(batch_size, n),), generator=generator)
            loss = nn.functional.cross_entropy(model(take(batch, index)), labels[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            log.losses.append(float(loss.detach()))
        log.steps += interval
        model.eval()
        val = mean_loss(model, val_batch, val_labels)
        log.val_losses.append(val)
        log.smoothed_val_losses = smoothed(log.val_losses, smoothing)
        if val < best:
            best, best_state, log.best_step = val, copy.deepcopy(model.state_dict()), log.steps
        if should_stop(log.smoothed_val_losses, patience, tolerance):
            log.stopped_early = True
            break
    model.load_state_dict(best_state)
    model.eval()
    return log


@torch.no_grad()
def fusion_predict(model: nn.Module, batch: dict[str, torch.Tensor], chunk: int = 1024) -> torch.Tensor:
    n = batch["image_tokens"].shape[0]
    return torch.cat([model(take(batch, slice(s, s + chunk))).argmax(-1) for s in range(0, n, chunk)])
