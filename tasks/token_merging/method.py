"""Token merging as statistical reconstruction, with sqrt(r) corrections [reconstructed].

Pure library (torch + numpy/scipy); no pipeline or tracking imports. The paper's text was not
available: every rule here is reconstructed from its abstract and from the prior work it names
(README.md, "Method summary" and "What is reconstructed"). Notation: ``N`` tokens of width ``d`` per image, cls
token at index 0 (never merged), ``s_c`` the number of original patch tokens a token stands for,
``r = n_l / n_0`` the retention of patch tokens at layer ``l``.

Implemented
-----------
* Radial-angular decomposition (exact identity):
  ``||y - y_hat||^2 = (||y|| - ||y_hat||)^2 + 2 ||y|| ||y_hat|| (1 - cos(y, y_hat))``.
* ToMe bipartite soft matching with size tracking (Bolya et al. 2023): alternate tokens into sets A
  and B, each A token's most similar B token (cosine of the keys), merge the top-k edges, cls protected;
  size-weighted means ``x_c = (s_a x_a + s_b x_b) / (s_a + s_b)``.
* Per-cluster energy ratio (the energy drift of averaging): ``kappa_c^2 = ||x_bar_c||^2 / mean_j ||x_j||^2``,
  tracked through nested merges from member energies combined size-weighted [project choice].
* Corrected attention (logit correction, its per-cluster variant, value correction):
  logits ``l_c = a_c * q.k_c / sqrt(d) + log s_c`` with ``a_c`` = 1 (proportional attention, ToMe),
  ``sqrt(r)`` (M3), ``kappa_c`` (M5); merged values scaled by ``r^(e/2)`` (M4).
* MLERP merging (ToFu, Kim et al. 2023; prior-art baseline): the size-weighted mean's direction with
  the size-weighted mean of the member norms, so averaging does not shrink the norm.
* A pre-LN ViT whose forward pass merges tokens training-free (``MergeViT``), loadable from a Hugging
  Face ``ViTForImageClassification`` (the paper profile's DeiT / ViT checkpoints).
* Fixed 2-D sin-cos positional embeddings (MAE, He et al. 2022) as an option of the from-scratch ViT: they
  train faster at 256 one-pixel tokens than learned ones; merging itself does not depend on them.
* The isotropic Gaussian study of the logit-shrink rule (acceptance check (a)5, claims C4a-b).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from scipy.optimize import minimize_scalar
from torch import nn
from torch.nn import functional as F

LogitMode = Literal["none", "prop", "sqrt_r", "kappa"]
MergeMode = Literal["average", "mlerp"]
PosEmbed = Literal["learned", "sincos"]
LOGIT_MODES = ("none", "prop", "sqrt_r", "kappa")
MERGE_MODES = ("average", "mlerp")

# ----------------------------------------------------------------------------------------------------
# Radial-angular decomposition (C3)
# ----------------------------------------------------------------------------------------------------


def radial_angular_decomposition(y: torch.Tensor, y_hat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                   torch.Tensor]:
    """Split ``||y - y_hat||^2`` (over the last dimension) into a radial and an angular part.

    radial  = (||y|| - ||y_hat||)^2                   energy (magnitude) distortion
    angular = 2 ||y|| ||y_hat|| (1 - cos(y, y_hat))   distributional (direction) distortion
    Returns ``(total, radial, angular)``; ``total == radial + angular`` holds exactly in exact
    arithmetic because ``||y - y_hat||^2 = ||y||^2 + ||y_hat||^2 - 2 y.y_hat``.
    """
    norm_y, norm_hat = y.norm(dim=-1), y_hat.norm(dim=-1)
    total = (y - y_hat).pow(2).sum(-1)
    radial = (norm_y - norm_hat).pow(2)
    # 2 ||y|| ||y_hat|| (1 - cos) = 2 (||y|| ||y_hat|| - y.y_hat): no division, so zero vectors are fine.
    angular = 2.0 * (norm_y * norm_hat - (y * y_hat).sum(-1))
    return total, radial, angular


# ----------------------------------------------------------------------------------------------------
# Energy ratio kappa
# ----------------------------------------------------------------------------------------------------


def kappa_of_members(members: torch.Tensor) -> torch.Tensor:
    """kappa = ||mean_j x_j|| / sqrt(mean_j ||x_j||^2) for members along dim -2 (energy drift)."""
    mean = members.mean(dim=-2)
    return mean.norm(dim=-1) / members.pow(2).sum(-1).mean(-1).sqrt()


def kappa_formula(size: float, mean_cosine: float) -> float:
    """kappa = sqrt(1/s + (1 - 1/s) rho) for s equal-norm members with mean pairwise cosine rho."""
    return math.sqrt(1.0 / size + (1.0 - 1.0 / size) * mean_cosine)


# ----------------------------------------------------------------------------------------------------
# Bipartite soft matching and merging (ToMe, with size and energy tracking)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeState:
    """Per-token bookkeeping carried through the merged forward pass.

    ``x``: (B, N, d) token features; ``sizes``: (B, N) original patch tokens per token (float);
    ``kappa_sq``: (B, N) energy ratio ``||x_c||^2 / mean member energy`` (1 for unmerged tokens).
    """

    x: torch.Tensor
    sizes: torch.Tensor
    kappa_sq: torch.Tensor

    @staticmethod
    def unmerged(x: torch.Tensor) -> MergeState:
        ones = torch.ones(x.shape[:2], dtype=x.dtype, device=x.device)
        return MergeState(x, ones, ones.clone())


@dataclass(frozen=True)
class MergePlan:
    """One round of bipartite matching: A = even positions, B = odd positions.

    ``src``: (B, k) indices into A merged away; ``dst``: (B, k) their partners' indices into B;
    ``keep``: (B, |A| - k) indices into A kept, in ascending position (cls stays first).
    """

    src: torch.Tensor
    dst: torch.Tensor
    keep: torch.Tensor


def bipartite_soft_matching(metric: torch.Tensor, k: int, protect_cls: bool = True) -> MergePlan:
    """ToMe's bipartite soft matching (Bolya et al. 2023, section 3): the top-``k`` most similar
    (A, B) edges by cosine similarity of ``metric`` (B, N, c); ties break by position (stable sort)."""
    n_a = (metric.shape[1] + 1) // 2
    n_b = metric.shape[1] // 2
    limit = n_a - int(protect_cls)
    if not 0 <= k <= min(limit, n_b):
        raise ValueError(f"k: one matching round merges at most {min(limit, n_b)} of {metric.shape[1]} tokens, "
                         f"got {k}")
    unit = F.normalize(metric, dim=-1)
    scores = unit[:, ::2] @ unit[:, 1::2].transpose(1, 2)
    if protect_cls:
        scores[:, 0, :] = -math.inf
    best, partner = scores.max(dim=-1)
    order = torch.sort(best, dim=-1, descending=True, stable=True).indices
    src = order[:, :k]
    keep = torch.sort(order[:, k:], dim=-1).values
    return MergePlan(src=src, dst=partner.gather(1, src), keep=keep)


def _gather_tokens(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    if t.dim() == 2:
        return t.gather(1, index)
    return t.gather(1, index[..., None].expand(-1, -1, t.shape[-1]))


def _scatter_add_tokens(base: torch.Tensor, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    if base.dim() == 2:
        return base.scatter_add(1, index, src)
    return base.scatter_add(1, index[..., None].expand(-1, -1, base.shape[-1]), src)


def merge_tokens(state: MergeState, plan: MergePlan, mode: MergeMode = "average") -> MergeState:
    """Apply one matching round. Sizes add; ``average``: size-weighted mean (preserves sum_c s_c x_c);
    ``mlerp``: the same direction with the size-weighted mean member norm (ToFu's MLERP).

    Member energies combine size-weighted: with ``e_t = ||x_t||^2 / kappa_t^2`` the mean member energy
    of token t, the merged token has ``kappa_c^2 = s_c ||x_c||^2 / sum_t s_t e_t``.
    """
    if mode not in MERGE_MODES:
        raise ValueError(f"merge mode: must be one of {MERGE_MODES}, got {mode!r}")
    x, sizes = state.x, state.sizes
    x_a, x_b = x[:, ::2], x[:, 1::2]
    s_a, s_b = sizes[:, ::2], sizes[:, 1::2]
    energy = sizes * x.pow(2).sum(-1) / state.kappa_sq  # total member energy of each token
    norm_mass = sizes * x.norm(dim=-1)  # sum of member norms (MLERP's target norm times size)
    src_size = s_a.gather(1, plan.src)
    merged_size = s_b.scatter_add(1, plan.dst, src_size)
    weighted_sum = _scatter_add_tokens(s_b[..., None] * x_b, plan.dst,
                                       src_size[..., None] * _gather_tokens(x_a, plan.src))
    merged_x = weighted_sum / merged_size[..., None]
    if mode == "mlerp":
        merged_norm_mass = norm_mass[:, 1::2].scatter_add(1, plan.dst, norm_mass[:, ::2].gather(1, plan.src))
        target_norm = merged_norm_mass / merged_size
        merged_x = F.normalize(merged_x, dim=-1) * target_norm[..., None]
    merged_energy = energy[:, 1::2].scatter_add(1, plan.dst, energy[:, ::2].gather(1, plan.src))
    merged_kappa_sq = merged_size * merged_x.pow(2).sum(-1) / merged_energy.clamp_min(torch.finfo(x.dtype).tiny)
    return MergeState(
        x=torch.cat([_gather_tokens(x_a, plan.keep), merged_x], dim=1),
        sizes=torch.cat([s_a.gather(1, plan.keep), merged_size], dim=1),
        kappa_sq=torch.cat([state.kappa_sq[:, ::2].gather(1, plan.keep), merged_kappa_sq], dim=1),
    )


def merge_k_tokens(state: MergeState, metric: torch.Tensor, k: int, mode: MergeMode = "average",
                   protect_cls: bool = True) -> MergeState:
    """Remove ``k`` tokens by as many bipartite rounds as needed (one round merges at most half).

    Between rounds the metric is merged like the features (size-weighted mean), as in ToMe."""
    while k > 0:
        n_a, n_b = (metric.shape[1] + 1) // 2, metric.shape[1] // 2
        step = min(k, n_a - int(protect_cls), n_b)
        if step <= 0:
            raise ValueError(f"k: cannot merge {k} more tokens out of {metric.shape[1]}")
        plan = bipartite_soft_matching(metric, step, protect_cls)
        metric = merge_tokens(MergeState(metric, state.sizes, torch.ones_like(state.sizes)), plan, "average").x
        state = merge_tokens(state, plan, mode)
        k -= step
    return state


def merge_schedule(n_patches: int, n_blocks: int, retention: float) -> list[int]:
    """Tokens to remove after the attention of each block so that ``round(r * n_patches)`` patch tokens
    reach the last block; spread evenly over blocks 0..L-2 (ToMe's constant k, remainder first)."""
    if not 0 < retention <= 1:
        raise ValueError(f"retention: must be in (0, 1], got {retention}")
    if n_blocks < 2:
        raise ValueError(f"n_blocks: merging needs at least 2 blocks, got {n_blocks}")
    keep = max(1, round(retention * n_patches))
    total = n_patches - keep
    steps = n_blocks - 1
    return [total // steps + (1 if i < total % steps else 0) for i in range(steps)] + [0]


# ----------------------------------------------------------------------------------------------------
# Corrected attention (M2-M5)
# ----------------------------------------------------------------------------------------------------


def key_logit_scale(sizes: torch.Tensor, retention: float, logit_mode: LogitMode,
                    kappa: torch.Tensor | None = None, shrink_singletons: bool = False) -> torch.Tensor:
    """Per-key multiplier a_c of the logit q.k_c/sqrt(d): 1 (none, prop), sqrt(r) (M3) or kappa_c (M5).

    By default only merged keys (s_c > 1) are shrunk; ``shrink_singletons`` applies sqrt(r) to every key
    (the abstract does not settle which)."""
    if logit_mode in ("none", "prop"):
        return torch.ones_like(sizes)
    if logit_mode == "sqrt_r":
        if not 0 < retention <= 1:
            raise ValueError(f"retention: must be in (0, 1], got {retention}")
        shrink = torch.full_like(sizes, math.sqrt(retention))
        return shrink if shrink_singletons else torch.where(sizes > 1, shrink, torch.ones_like(sizes))
    if logit_mode == "kappa":
        if kappa is None:
            raise ValueError("logit_mode 'kappa' needs the per-token kappa")
        return kappa
    raise ValueError(f"logit_mode: must be one of {LOGIT_MODES}, got {logit_mode!r}")


def value_scale(sizes: torch.Tensor, retention: float, value_exp: float) -> torch.Tensor:
    """M4: merged values (s_c > 1) multiplied by r^(e/2); e = 0 leaves them unchanged."""
    factor = torch.full_like(sizes, retention ** (value_exp / 2.0))
    return torch.where(sizes > 1, factor, torch.ones_like(sizes))


def corrected_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sizes: torch.Tensor, retention: float,
                        logit_mode: LogitMode, kappa: torch.Tensor | None = None, value_exp: float = 0.0,
                        shrink_singletons: bool = False) -> torch.Tensor:
    """Attention over (possibly merged) keys; q, k, v: (B, H, N, d_h), sizes and kappa: (B, N).

    logits = a_c * q.k_c / sqrt(d_h) + log s_c   (the log-size prior is dropped for ``none``, M1)
    With s = 1 everywhere and a_c = 1 every mode is plain softmax attention, bit for bit."""
    logits = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if logit_mode != "none":
        scale = key_logit_scale(sizes, retention, logit_mode, kappa, shrink_singletons)
        logits = logits * scale[:, None, None, :] + sizes.log()[:, None, None, :]
    if value_exp != 0.0:
        v = v * value_scale(sizes, retention, value_exp)[:, None, :, None]
    return torch.softmax(logits, dim=-1) @ v


def corrected_attention_fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sizes: torch.Tensor,
                              retention: float, logit_mode: LogitMode, kappa: torch.Tensor | None = None,
                              value_exp: float = 0.0, shrink_singletons: bool = False) -> torch.Tensor:
    """``corrected_attention`` through torch's fused scaled-dot-product kernel, equal up to float rounding:
    the per-key logit scale is folded into the keys (a_c q.k_c = q.(a_c k_c)), the log-size prior is an
    additive mask and M4's scale multiplies the values. Every mode takes the same kernel with a mask (zeros for
    ``none``), so at r = 1 (all sizes 1, every scale exactly 1) every method gives bit-identical outputs."""
    scale = key_logit_scale(sizes, retention, logit_mode, kappa, shrink_singletons)
    prior = torch.zeros_like(sizes) if logit_mode == "none" else sizes.log()
    if value_exp != 0.0:
        v = v * value_scale(sizes, retention, value_exp)[:, None, :, None]
    return F.scaled_dot_product_attention(q, k * scale[:, None, :, None], v, attn_mask=prior[:, None, None, :])


# ----------------------------------------------------------------------------------------------------
# Merging methods (M1-M6)
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeMethod:
    """How tokens are merged and how attention treats merged tokens."""

    name: str
    merge_mode: MergeMode
    logit_mode: LogitMode
    value_exp: float = 0.0
    shrink_singletons: bool = False

    def with_value_exp(self, value_exp: float) -> MergeMethod:
        return replace(self, value_exp=value_exp)


SQRT_R = MergeMethod("M3", "average", "sqrt_r")
"""M3: ToMe merging + proportional attention + the sqrt(r) logit shrink toward the size prior."""
VALUE_CORRECTED = MergeMethod("M4", "average", "sqrt_r", value_exp=0.0)
"""M4: M3 + merged values scaled by r^(e/2); e is chosen by energy matching (``choose_value_exponent``)."""
PER_CLUSTER_KAPPA = MergeMethod("M5", "average", "kappa")
"""M5: M3 with the per-cluster kappa_c instead of the global sqrt(r)."""


# ----------------------------------------------------------------------------------------------------
# A pre-LN ViT with training-free merging
# ----------------------------------------------------------------------------------------------------


class Block(nn.Module):
    """Pre-LN transformer block with the layout of Hugging Face's ViTLayer (q, k, v, out, fc1, fc2)."""

    def __init__(self, dim: int, heads: int, mlp_dim: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.fc1, self.fc2 = nn.Linear(dim, mlp_dim), nn.Linear(mlp_dim, dim)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        b, n, d = t.shape
        return t.view(b, n, self.heads, d // self.heads).transpose(1, 2)

    def attend(self, state: MergeState, method: MergeMethod, retention: float, fused: bool = False
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual after attention, and the keys (mean over heads) used as ToMe's matching metric; ``fused``
        computes the same attention through ``corrected_attention_fused`` (cheaper at many tokens)."""
        h = self.norm1(state.x)
        q, k, v = (self.split_heads(layer(h)) for layer in (self.query, self.key, self.value))
        attention = corrected_attention_fused if fused else corrected_attention
        out = attention(q, k, v, state.sizes, retention, method.logit_mode, state.kappa_sq.sqrt(),
                        method.value_exp, method.shrink_singletons)
        out = out.transpose(1, 2).reshape(state.x.shape)
        return state.x + self.out(out), k.mean(dim=1)

    def attend_fused(self, x: torch.Tensor) -> torch.Tensor:
        """Residual after plain (unmerged) attention through torch's fused scaled-dot-product kernel: the
        function of ``attend`` with every size 1 and mode "none", up to float rounding (training only)."""
        h = self.norm1(x)
        q, k, v = (self.split_heads(layer(h)) for layer in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(x.shape)
        return x + self.out(out)

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


@dataclass(frozen=True)
class ViTShape:
    image_size: int
    patch_size: int
    channels: int
    dim: int
    depth: int
    heads: int
    mlp_dim: int
    n_classes: int
    eps: float = 1e-6
    pos_embed: PosEmbed = "learned"

    @property
    def n_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


def sincos_pos_embed_2d(grid: int, dim: int) -> torch.Tensor:
    """Fixed 2-D sin-cos positional embedding (MAE, He et al. 2022, its ``get_2d_sincos_pos_embed``) for a
    ``grid`` x ``grid`` patch grid plus a zero row for the cls token: (1 + grid^2, dim). Patch (row i, column j)
    in row-major order gets ``[sin(j w), cos(j w), sin(i w), cos(i w)]`` with ``w_m = 10000^(-m / (dim/4))``,
    m = 0..dim/4-1 (the first half encodes the column, the second the row)."""
    if dim % 4:
        raise ValueError(f"dim: the 2-D sin-cos embedding needs a multiple of 4, got {dim}")
    quarter = dim // 4
    omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    rows, cols = torch.meshgrid(torch.arange(grid, dtype=torch.float64), torch.arange(grid, dtype=torch.float64),
                                indexing="ij")
    col_angle = cols.reshape(-1, 1) * omega
    row_angle = rows.reshape(-1, 1) * omega
    patches = torch.cat([col_angle.sin(), col_angle.cos(), row_angle.sin(), row_angle.cos()], dim=1)
    return torch.cat([torch.zeros(1, dim, dtype=torch.float64), patches]).float()


@dataclass
class MergedForward:
    """Outputs of one merged forward pass: logits, the final cls residual (before the last LayerNorm),
    the size-weighted RMS of the patch tokens entering each block, the realised retention and the mean
    kappa of merged tokens reaching the last block (NaN when nothing was merged)."""

    logits: torch.Tensor
    cls_residual: torch.Tensor
    rms_per_block: list[float]
    realised_retention: float
    mean_merged_kappa: float


class MergeViT(nn.Module):
    """A pre-LN ViT (Dosovitskiy et al. 2021) whose forward pass merges tokens after each block's
    attention (ToMe's placement) with a given ``MergeMethod``; no merging reproduces the plain ViT."""

    def __init__(self, shape: ViTShape) -> None:
        super().__init__()
        self.shape = shape
        patch_dim = shape.channels * shape.patch_size**2
        self.patch_embed = nn.Linear(patch_dim, shape.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, shape.dim))
        if shape.pos_embed == "sincos":  # fixed and not saved: a checkpoint of the other kind fails a strict load
            grid = shape.image_size // shape.patch_size
            self.register_buffer("pos_embed", sincos_pos_embed_2d(grid, shape.dim).unsqueeze(0), persistent=False)
        else:
            self.pos_embed = nn.Parameter(torch.zeros(1, shape.n_patches + 1, shape.dim))
        self.blocks = nn.ModuleList(Block(shape.dim, shape.heads, shape.mlp_dim, shape.eps)
                                    for _ in range(shape.depth))
        self.norm = nn.LayerNorm(shape.dim, eps=shape.eps)
        self.head = nn.Linear(shape.dim, shape.n_classes)
        if shape.pos_embed == "learned":
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.trunc_normal_(self.cls_token, std=0.02)

    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, n_patches, C*p*p), row-major patches, each flattened as (C, p, p) like a
        stride-p convolution's weight."""
        p = self.shape.patch_size
        b, c, _, _ = images.shape
        patches = images.unfold(2, p, p).unfold(3, p, p)  # (B, C, H/p, W/p, p, p)
        return patches.permute(0, 2, 3, 1, 4, 5).reshape(b, -1, c * p * p)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(self.patchify(images))
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        return torch.cat([cls, tokens], dim=1) + self.pos_embed

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Plain (unmerged) logits, for training."""
        state = MergeState.unmerged(self.embed(images))
        for block in self.blocks:
            x, _ = block.attend(state, PLAIN, 1.0)
            state = replace(state, x=block.feed_forward(x))
        return self.head(self.norm(state.x[:, 0]))

    def forward_fused(self, images: torch.Tensor) -> torch.Tensor:
        """``forward`` with fused attention (equal up to float rounding): about 4x cheaper attention at 256
        tokens on a CPU, for training the scene ViT. Evaluation always uses ``forward_merged``."""
        x = self.embed(images)
        for block in self.blocks:
            x = block.feed_forward(block.attend_fused(x))
        return self.head(self.norm(x[:, 0]))

    def forward_merged(self, images: torch.Tensor, method: MergeMethod, schedule: list[int],
                       fused: bool = False) -> MergedForward:
        """Training-free merging: after block l's attention, remove ``schedule[l]`` tokens (``fused``: the
        attention through ``corrected_attention_fused``, equal up to float rounding)."""
        if len(schedule) != self.shape.depth:
            raise ValueError(f"schedule: needs one entry per block ({self.shape.depth}), got {len(schedule)}")
        state = MergeState.unmerged(self.embed(images))
        n0 = self.shape.n_patches
        rms = []
        for block, k in zip(self.blocks, schedule):
            rms.append(size_weighted_rms(state))
            retention = (state.x.shape[1] - 1) / n0
            x, metric = block.attend(state, method, retention, fused)
            state = replace(state, x=x)
            if k:
                state = merge_k_tokens(state, metric, k, method.merge_mode)
            state = replace(state, x=block.feed_forward(state.x))
        merged = state.sizes > 1
        mean_kappa = float(state.kappa_sq.sqrt()[merged].mean()) if merged.any() else math.nan
        return MergedForward(logits=self.head(self.norm(state.x[:, 0])), cls_residual=state.x[:, 0],
                             rms_per_block=rms, realised_retention=(state.x.shape[1] - 1) / n0,
                             mean_merged_kappa=mean_kappa)


PLAIN = MergeMethod("plain", "average", "none")


def size_weighted_rms(state: MergeState) -> float:
    """RMS of the patch tokens' features, each token weighted by the patches it stands for (cls excluded):
    the statistic LayerNorm and the MLP see shift when merging shrinks norms (covariate shift, C1)."""
    sizes = state.sizes[:, 1:]
    energy = state.x[:, 1:].pow(2).mean(-1)
    return float(((sizes * energy).sum() / sizes.sum()).sqrt())


# Hugging Face ViT parameter names -> MergeViT names, for the transformers 5 layout and the 4.x layout.
_HF_LAYER_NAMES = {
    "layernorm_before": "norm1", "layernorm_after": "norm2",
    "attention.q_proj": "query", "attention.k_proj": "key", "attention.v_proj": "value",
    "attention.o_proj": "out", "mlp.fc1": "fc1", "mlp.fc2": "fc2",
    "attention.attention.query": "query", "attention.attention.key": "key",
    "attention.attention.value": "value", "attention.output.dense": "out",
    "intermediate.dense": "fc1", "output.dense": "fc2",
}
_HF_TOP_NAMES = {
    "vit.embeddings.cls_token": "cls_token", "vit.embeddings.position_embeddings": "pos_embed",
    "vit.embeddings.patch_embeddings.projection.bias": "patch_embed.bias",
    "vit.layernorm.weight": "norm.weight", "vit.layernorm.bias": "norm.bias",
    "classifier.weight": "head.weight", "classifier.bias": "head.bias",
}


def _hf_key_to_ours(key: str) -> str:
    if key in _HF_TOP_NAMES:
        return _HF_TOP_NAMES[key]
    for prefix in ("vit.layers.", "vit.encoder.layer."):
        if key.startswith(prefix):
            index, rest = key[len(prefix):].split(".", 1)
            module, param = rest.rsplit(".", 1)
            if module in _HF_LAYER_NAMES:
                return f"blocks.{index}.{_HF_LAYER_NAMES[module]}.{param}"
    raise KeyError(f"unexpected Hugging Face ViT parameter {key!r}")


def vit_from_hf(hf_model: nn.Module) -> MergeViT:
    """Copy a Hugging Face ``ViTForImageClassification`` (ViT, DeiT checkpoints) into a ``MergeViT``.

    Same computation: conv patch embedding as a linear map on (C, p, p) patches, pre-LN layers with
    exact GELU, classifier on the final LayerNorm of the cls token."""
    cfg = hf_model.config
    if getattr(cfg, "hidden_act", "gelu") != "gelu":
        raise ValueError(f"hidden_act: only exact 'gelu' is supported, got {cfg.hidden_act!r}")
    shape = ViTShape(image_size=cfg.image_size, patch_size=cfg.patch_size, channels=cfg.num_channels,
                     dim=cfg.hidden_size, depth=cfg.num_hidden_layers, heads=cfg.num_attention_heads,
                     mlp_dim=cfg.intermediate_size, n_classes=cfg.num_labels, eps=cfg.layer_norm_eps)
    model = MergeViT(shape)
    state = {}
    for key, tensor in hf_model.state_dict().items():
        if key == "vit.embeddings.patch_embeddings.projection.weight":
            state["patch_embed.weight"] = tensor.reshape(shape.dim, -1)  # (d, C, p, p) -> (d, C*p*p)
        elif not key.startswith("vit.pooler"):
            state[_hf_key_to_ours(key)] = tensor
    model.load_state_dict(state, strict=True)  # strict: a missing or extra tensor is an error
    return model.to(dtype=next(hf_model.parameters()).dtype).eval()


# ----------------------------------------------------------------------------------------------------
# Value exponent by energy matching (M4)
# ----------------------------------------------------------------------------------------------------


def energy_mismatch(reference: torch.Tensor, merged: torch.Tensor) -> float:
    """|log(mean ||y_hat|| / mean ||y||)| over a batch of output vectors: 0 when energies match."""
    return abs(math.log(float(merged.norm(dim=-1).mean()) / float(reference.norm(dim=-1).mean())))


def choose_value_exponent(mismatch_by_exponent: dict[float, float]) -> float:
    """The exponent e whose merged outputs match the unmerged energy best; ties go to the smaller |e|
    (the least intervention)."""
    if not mismatch_by_exponent:
        raise ValueError("value exponents: need at least one candidate")
    return min(mismatch_by_exponent, key=lambda e: (round(mismatch_by_exponent[e], 12), abs(e), e))


# ----------------------------------------------------------------------------------------------------
# Isotropic Gaussian study of the logit shrink (acceptance check (a)5)
# ----------------------------------------------------------------------------------------------------


def layer_norm_rows(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """LayerNorm without affine parameters: zero mean, unit variance per row (norm sqrt(d))."""
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt(centred.var(axis=-1, keepdims=True) + eps)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


@dataclass(frozen=True)
class IsotropicResult:
    retention: float
    optimal_scale: float
    kl_optimal: float
    kl_sqrt_r: float
    kl_prop: float
    mean_kappa: float


def isotropic_cluster_mass_study(dim: int, n_tokens: int, retention: float, n_queries: int, seed: int,
                                 temperature: float = 1.0, reinflate_keys: bool = True) -> IsotropicResult:
    """One pre-LN attention layer on isotropic Gaussian tokens, merged into random equal-size clusters.

    Unmerged: keys k_j = LN(x_j), logits q.k_j / (sqrt(d) T), cluster mass P_c = sum_{j in c} p_j.
    Merged: k_c = LN(mean_{j in c} x_j) (LayerNorm re-inflates the shrunk mean; ``reinflate_keys=False``
    averages the keys instead, the control without energy drift), logits a * q.k_c / (sqrt(d) T) + log s.
    Returns the scale a minimising mean_q KL(P || Q_a) and the KL at a = sqrt(r) and a = 1 (proportional
    attention). Float64; queries q ~ N(0, I_d)."""
    size = round(1.0 / retention)
    if abs(size * retention - 1.0) > 1e-9 or n_tokens % size:
        raise ValueError(f"retention: 1/r must be an integer dividing n_tokens={n_tokens}, got r={retention}")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_tokens, dim))
    queries = rng.standard_normal((n_queries, dim))
    clusters = rng.permutation(n_tokens).reshape(-1, size)
    keys = layer_norm_rows(x)
    target = np.exp(_log_softmax(queries @ keys.T / (math.sqrt(dim) * temperature)))
    cluster_mass = target[:, clusters].sum(axis=-1)
    mean_x = x[clusters].mean(axis=1)
    merged_keys = layer_norm_rows(mean_x) if reinflate_keys else keys[clusters].mean(axis=1)
    base_logits = queries @ merged_keys.T / (math.sqrt(dim) * temperature)
    log_target = np.log(cluster_mass)

    def kl(scale: float) -> float:
        log_q = _log_softmax(scale * base_logits + math.log(size))
        return float((cluster_mass * (log_target - log_q)).sum(axis=-1).mean())

    best = minimize_scalar(kl, bounds=(0.0, 2.0), method="bounded", options={"xatol": 1e-5})
    kappas = kappa_of_members(torch.from_numpy(x[clusters]))
    return IsotropicResult(retention=retention, optimal_scale=float(best.x), kl_optimal=float(best.fun),
                           kl_sqrt_r=kl(math.sqrt(retention)), kl_prop=kl(1.0), mean_kappa=float(kappas.mean()))
