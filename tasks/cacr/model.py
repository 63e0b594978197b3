"""Networks of cacr's smoke/cpu profiles [reconstructed sizes]: the contrastive VLP encoder behind VBCS and
the candidate-aware reasoning policy (also used, without candidate tokens, as the dense span regressor).

The frame encoder is ``tasks.common.tiny_vlm.CNNEncoder`` on frame pairs (frames t and t+1 stacked as six
channels, so motion is visible), mean-pooled and projected; the text side is a bag of words over the object
and action words of a step description.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tasks.cacr.config import ACTIONS, OBJECTS, CacrConfig
from tasks.cacr.data import RELATION_WORDS
from tasks.common.seeding import torch_init_seed
from tasks.common.tiny_vlm import CNNEncoder, TinyVLMConfig, sincos_1d


def frame_pairs(frames: Tensor) -> Tensor:
    """(B, T, 3, S, S) uint8 -> (B, T, 6, S, S) float in [0, 1]: frame t with frame t + 1 (the last with itself)."""
    x = frames.float() / 255.0
    nxt = torch.cat([x[:, 1:], x[:, -1:]], dim=1)
    return torch.cat([x, nxt], dim=2)


class VLPEncoder(nn.Module):
    """Dual encoder: frame pair -> R^D and (object, action) description -> R^D, trained with InfoNCE."""

    def __init__(self, cfg: CacrConfig) -> None:
        super().__init__()
        v = cfg.vlp
        self.frames = CNNEncoder(TinyVLMConfig(vocab_size=2, image_size=cfg.data.image_size, channels=6, patch_size=4,
                                               encoder_kind="cnn", encoder_width=v.width, encoder_depth=1,
                                               lm_positions=(cfg.data.image_size // 4) ** 2 + 1))
        self.frame_head = nn.Linear(v.width, v.embed_dim)
        self.obj = nn.Embedding(len(OBJECTS), v.embed_dim)
        self.act = nn.Embedding(len(ACTIONS), v.embed_dim)
        self.text_head = nn.Linear(v.embed_dim, v.embed_dim)

    def encode_pairs(self, pairs: Tensor) -> Tensor:
        """(N, 6, S, S) -> (N, D) unnormalised frame-pair embeddings."""
        tokens, _ = self.frames(pairs)
        return self.frame_head(tokens.mean(dim=1))

    def encode_text(self, obj: Tensor, act: Tensor) -> Tensor:
        """Bag of words of (object, action) ids -> (N, D); words outside this vocabulary are not embedded."""
        return self.text_head(self.obj(obj) + self.act(act))

    def all_descriptions(self) -> Tensor:
        """(|O| * |A|, D) embeddings of every description, index obj * |A| + act."""
        obj = torch.arange(len(OBJECTS)).repeat_interleave(len(ACTIONS))
        act = torch.arange(len(ACTIONS)).repeat(len(OBJECTS))
        return self.encode_text(obj, act)

    def infonce_logits(self, pairs: Tensor, temperature: float) -> Tensor:
        """cos(frame pair, description) / temperature against all descriptions: (N, |O| * |A|)."""
        f = F.normalize(self.encode_pairs(pairs), dim=-1)
        t = F.normalize(self.all_descriptions(), dim=-1)
        return f @ t.T / temperature


@torch.no_grad()
def encode_videos(vlp: VLPEncoder, frames: Tensor, chunk: int = 64) -> Tensor:
    """(B, T, 3, S, S) uint8 videos -> (B, T, D) L2-normalised frame features."""
    out = []
    for i in range(0, frames.shape[0], chunk):
        pairs = frame_pairs(frames[i:i + chunk])
        b, t = pairs.shape[:2]
        out.append(F.normalize(vlp.encode_pairs(pairs.flatten(0, 1)), dim=-1).view(b, t, -1))
    return torch.cat(out)


class GroundingPolicy(nn.Module):
    """Bidirectional transformer over [frame tokens; question tokens; K candidate tokens; REJECT token].

    Heads: choice logits over the K candidates and REJECT; per-candidate start/end offset logits; dense start
    and end logits over the frames. With ``use_candidates=False`` it has no candidate or REJECT tokens and is
    the dense span regressor baseline (VSLNet-style) on the same features.
    """

    def __init__(self, cfg: CacrConfig, use_candidates: bool = True) -> None:
        super().__init__()
        p, width = cfg.policy, cfg.policy.width
        self.use_candidates, self.top_k, self.frames = use_candidates, cfg.vbcs.top_k, cfg.data.frames
        # unit-norm features have per-dimension scale D^-1/2: normalise them before they meet the time embedding
        self.frame_in = nn.Sequential(nn.LayerNorm(cfg.vlp.embed_dim), nn.Linear(cfg.vlp.embed_dim, width))
        self.register_buffer("time", sincos_1d(cfg.data.frames, width), persistent=False)
        self.relation = nn.Embedding(len(RELATION_WORDS), width)
        self.obj = nn.Embedding(len(OBJECTS), width)
        self.act = nn.Embedding(len(ACTIONS), width)
        self.segment = nn.Parameter(torch.zeros(4, width))       # token type: frame, question, candidate, reject
        self.cand_in = nn.Linear(4, width)
        self.rank = nn.Embedding(cfg.vbcs.top_k, width)
        self.reject_token = nn.Parameter(torch.zeros(width))
        layer = nn.TransformerEncoderLayer(width, p.heads, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, p.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.choice_head = nn.Linear(width, 1)
        self.offset_head = nn.Linear(width, 2 * (2 * p.max_offset + 1))
        self.dense_head = nn.Linear(width, 2)

    def forward(self, features: Tensor, question: Tensor, candidates: Tensor | None = None,
                cand_scores: Tensor | None = None, allow_reject: bool = True
                ) -> tuple[Tensor | None, Tensor | None, Tensor, Tensor]:
        """features (B, T, D); question (B, 3) = (relation, object, action) ids; candidates (B, K, 2) long and
        cand_scores (B, K). Returns (choice (B, K+1), offsets (B, K, 2, 2m+1), start (B, T), end (B, T));
        the first two are None for the dense regressor. ``allow_reject=False`` masks REJECT (the no-reject
        ablation)."""
        b, t = features.shape[:2]
        tokens = [self.frame_in(features) + self.time[:t] + self.segment[0],
                  torch.stack([self.relation(question[:, 0]), self.obj(question[:, 1]), self.act(question[:, 2])], 1)
                  + self.segment[1]]
        if self.use_candidates:
            s, e = candidates[..., 0], candidates[..., 1]
            geometry = torch.stack([s / t, e / t, (e - s + 1) / t, cand_scores], -1).float()
            ranks = torch.arange(candidates.shape[1], device=features.device)
            tokens.append(self.cand_in(geometry) + self.time[s] + self.time[e] + self.rank(ranks) + self.segment[2])
            tokens.append((self.reject_token + self.segment[3]).expand(b, 1, -1))
        h = self.norm(self.encoder(torch.cat(tokens, 1)))
        start, end = self.dense_head(h[:, :t]).unbind(-1)
        if not self.use_candidates:
            return None, None, start, end
        k = candidates.shape[1]
        choice = self.choice_head(h[:, t + 3:]).squeeze(-1)           # K candidates then REJECT
        if not allow_reject:
            choice = torch.cat([choice[:, :k], torch.full_like(choice[:, k:], float("-inf"))], 1)
        offsets = self.offset_head(h[:, t + 3:t + 3 + k]).view(b, k, 2, -1)
        return choice, offsets, start, end


def build(module: type[nn.Module], cfg: CacrConfig, seed: int, **kwargs) -> nn.Module:
    """A module initialised reproducibly from ``seed`` (thread-safe)."""
    with torch_init_seed(seed):
        return module(cfg, **kwargs)
