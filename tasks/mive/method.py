"""MiVE as a pure library (no Prefect, no MLflow, no file layout).

MiVE (arXiv 2605.14664) conditions a video DiT on the hidden states of a vision-language model fed the
instruction and the edited reference frame. From the paper text (abstract, Sec. 3): the **first-layer and the
last-layer** hidden states are the multiscale condition tokens; they are concatenated with the video latents
into ONE sequence processed by unified (joint) self-attention, no cross-attention. Reconstructed (not in the
text we have): the per-layer projector ``c_l = MLP_l(h_l) + e_l`` with a learned layer embedding ``e_l``, the
rectified-flow objective and the adaLN timestep conditioning.

Pieces:
- ``select_layers``: pick hidden states by index (default ``(1, -1)``), duplicates refused;
- ``ConditionTokens``: per-layer MLP + layer embedding, concatenated over the chosen layers;
- ``JointDiT``: adaLN transformer over ``[video tokens ; condition tokens]`` (variant A/B/C) or, with
  ``attention="cross"``, video self-attention followed by cross-attention to the condition tokens (variant D);
- rectified flow: ``x_t = (1 - t) x_0 + t eps``, velocity target ``eps - x_0``, Euler sampler from t = 1 to 0;
  the DiT is x0-parameterised (``velocity_from_x0``: v = (x_t - x0_hat) / max(t, 1e-3)) and trained on
  ||x0_hat - x_0||^2 (``x0_matching_loss``), both reconstructed;
- fixed 2-D sin-cos positions shared by video patches and the VLM's image-patch condition tokens (reconstructed);
- evaluation quantities: circular hue error, RGB -> hue, ridge probes on fit-standardised features (R^2,
  accuracy), the centred between-clip spread of a layer (collapse check).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------- layer selection


def resolve_layers(layers: Sequence[int], n_states: int) -> tuple[int, ...]:
    """Non-negative indices into a list of ``n_states`` hidden states (``hidden_states[0]`` is the embedding
    output, ``hidden_states[i]`` block i's output). Out-of-range or duplicate layers (after resolving negative
    indices, so ``(4, -1)`` on 5 states is a duplicate) raise ``ValueError``: the same layer twice would make a
    'multiscale' variant a single-scale one."""
    if not layers:
        raise ValueError("layers: at least one layer index is needed")
    resolved = []
    for index in layers:
        if not -n_states <= index < n_states:
            raise ValueError(f"layers: index {index} out of range for {n_states} hidden states")
        resolved.append(index % n_states)
    if len(set(resolved)) != len(resolved):
        raise ValueError(f"layers: {tuple(layers)} selects the same hidden state twice ({tuple(resolved)})")
    return tuple(resolved)


def select_layers(hidden_states: Sequence[torch.Tensor], layers: Sequence[int]) -> list[torch.Tensor]:
    """The hidden states at ``layers`` (MiVE: first and last layer, ``(1, -1)``), the tensors themselves."""
    return [hidden_states[i] for i in resolve_layers(layers, len(hidden_states))]


# ----------------------------------------------------------------------------- rectified flow


def interpolate(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Rectified-flow path x_t = (1 - t) x_0 + t eps; ``t`` has shape ``(B,)`` and broadcasts over the rest."""
    tb = t.reshape(-1, *([1] * (x0.dim() - 1)))
    return (1 - tb) * x0 + tb * noise


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """d x_t / d t = eps - x_0 (the regression target of rectified flow)."""
    return noise - x0


def flow_matching_loss(predicted: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor,
                       weight: torch.Tensor | None = None) -> torch.Tensor:
    """mean ||v_theta - (eps - x_0)||^2 over elements; with ``weight`` (broadcastable, e.g. an edit-region mask)
    the weighted mean sum(w * err^2) / sum(w * 1)."""
    err = (predicted - velocity_target(x0, noise)) ** 2
    if weight is None:
        return err.mean()
    w = torch.broadcast_to(weight, err.shape).to(err.dtype)
    return (w * err).sum() / w.sum().clamp_min(1e-12)


def euler_sample(velocity, noise: torch.Tensor, steps: int) -> torch.Tensor:
    """Integrate dx/dt = v(x, t) from t = 1 (x = eps) to t = 0 with ``steps`` equal Euler steps:
    x_{t - dt} = x_t - dt * v(x_t, t). ``velocity(x, t)`` takes ``t`` of shape ``(B,)``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1 (got {steps})")
    x = noise
    dt = 1.0 / steps
    for k in range(steps):
        t = torch.full((x.shape[0],), 1.0 - k * dt, dtype=x.dtype, device=x.device)
        x = x - dt * velocity(x, t)
    return x


# ----------------------------------------------------------------------------- colour


def rgb_to_hue(rgb: torch.Tensor) -> torch.Tensor:
    """Hue in degrees [0, 360) of RGB values in the last dimension (the HSV hexcone formula)."""
    r, g, b = rgb.unbind(-1)
    cmax, _ = rgb.max(-1)
    cmin, _ = rgb.min(-1)
    delta = (cmax - cmin).clamp_min(1e-12)
    hue = torch.where(cmax == r, ((g - b) / delta) % 6,
                      torch.where(cmax == g, (b - r) / delta + 2, (r - g) / delta + 4))
    return (60.0 * hue) % 360.0


def hue_to_rgb(hue: torch.Tensor, saturation: float = 1.0, value: float = 1.0) -> torch.Tensor:
    """RGB in [0, 1] of hues in degrees (HSV -> RGB), shape ``hue.shape + (3,)``."""
    h = (hue % 360.0) / 60.0
    c = value * saturation
    k = torch.stack([(5 + h) % 6, (3 + h) % 6, (1 + h) % 6], dim=-1)
    return value - c * torch.clamp(torch.minimum(k, 4 - k), 0, 1)


def circular_hue_error(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Smallest angle in degrees between two hues: min(|a - b| mod 360, 360 - |a - b| mod 360), in [0, 180]."""
    d = torch.remainder(a - b, 360.0)
    return torch.minimum(d, 360.0 - d)


# ----------------------------------------------------------------------------- probes


def ridge_fit(x: torch.Tensor, y: torch.Tensor, ridge: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Ridge regression with an unpenalised intercept: W = (Xc^T Xc + ridge I)^{-1} Xc^T Yc on centred data,
    b = mean(y) - mean(x) W. Returns (W, b)."""
    x64, y64 = x.double(), y.double()
    mx, my = x64.mean(0), y64.mean(0)
    xc, yc = x64 - mx, y64 - my
    gram = xc.T @ xc + ridge * torch.eye(x.shape[1], dtype=torch.float64)
    w = torch.linalg.solve(gram, xc.T @ yc)
    return w, my - mx @ w


def r_squared(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """Coefficient of determination 1 - SS_res / SS_tot, pooled over output columns."""
    ss_res = ((target - predicted) ** 2).sum()
    ss_tot = ((target - target.mean(0)) ** 2).sum()
    return float(1 - ss_res / ss_tot)


def standardise(x_fit: torch.Tensor, x_other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Z-score every feature with the mean and standard deviation of the FIT rows (float64): (x - mu_fit) / sd_fit,
    with sd_fit floored at 1e-12 relative to the largest sd so a constant feature maps to 0 instead of NaN. This makes
    a ridge probe invariant to a per-layer scale and shift of the features: with a fixed ridge on raw features, a
    layer whose features are small (e.g. after a final LayerNorm) is penalised more, which reads as 'less
    information' although none was lost."""
    x64, o64 = x_fit.double(), x_other.double()
    mu, sd = x64.mean(0), x64.std(0)
    sd = sd.clamp_min(1e-12 * float(sd.max().clamp_min(1e-300)))
    return (x64 - mu) / sd, (o64 - mu) / sd


def ridge_probe_r2(x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor, y_test: torch.Tensor,
                   ridge: float) -> float:
    """Held-out R^2 of a linear ridge probe on features standardised on the fit split (Sec. 3's layer-hierarchy
    analysis, reconstructed as probes); invariant to a scale and shift of the layer's features."""
    z_train, z_test = standardise(x_train, x_test)
    w, b = ridge_fit(z_train, y_train, ridge)
    return r_squared(z_test @ w + b, y_test.double())


def ridge_probe_accuracy(x_train: torch.Tensor, labels_train: torch.Tensor, x_test: torch.Tensor,
                         labels_test: torch.Tensor, n_classes: int, ridge: float) -> float:
    """Held-out accuracy of a ridge classifier on fit-standardised features: regress one-hot labels, predict the
    argmax."""
    z_train, z_test = standardise(x_train, x_test)
    w, b = ridge_fit(z_train, F.one_hot(labels_train, n_classes).double(), ridge)
    predicted = (z_test @ w + b).argmax(-1)
    return float((predicted == labels_test).double().mean())


def between_clip_spread(features: torch.Tensor, all_tokens: torch.Tensor) -> float:
    """Centred collapse measure of one layer: mean over dimensions of the across-row standard deviation of
    ``features`` (N, D) (one object patch per row), divided by the RMS of ``all_tokens`` (M, D) after removing each
    dimension's mean over those tokens. A shared offset cancels in both, a global scale cancels in the ratio; a
    layer whose object features are the same for every clip while its tokens still differ reads ~0."""
    spread = features.double().std(0).mean()
    centred = all_tokens.double() - all_tokens.double().mean(0)
    return float(spread / centred.pow(2).mean().sqrt().clamp_min(1e-300))


# ----------------------------------------------------------------------------- modules


def sincos_2d(grid: int, width: int) -> torch.Tensor:
    """Fixed 2-D sine-cosine position codes ``(grid * grid, width)`` (MAE / DiT convention): the first half of the
    channels encodes the row, the second half the column, each as [sin(p w_k), cos(p w_k)] with
    w_k = 10000^(-k / (width/4)), k = 0 .. width/4 - 1. Row-major patch order, as ``patchify``."""
    if width % 4:
        raise ValueError(f"width {width} must be a multiple of 4 for 2-D sin-cos positions")
    quarter = width // 4
    freqs = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float32) / quarter)
    rows, cols = torch.meshgrid(torch.arange(grid, dtype=torch.float32), torch.arange(grid, dtype=torch.float32),
                                indexing="ij")

    def code(p: torch.Tensor) -> torch.Tensor:
        angle = p.reshape(-1, 1) * freqs[None]
        return torch.cat([angle.sin(), angle.cos()], dim=1)

    return torch.cat([code(rows), code(cols)], dim=1)


def velocity_from_x0(noisy: torch.Tensor, x0_hat: torch.Tensor, t: torch.Tensor, t_min: float = 1e-3
                     ) -> torch.Tensor:
    """[reconstructed] x0-parameterised rectified-flow velocity: on x_t = (1 - t) x_0 + t eps the velocity
    eps - x_0 equals (x_t - x_0) / t, so a model predicting x0_hat gives v = (x_t - x0_hat) / max(t, t_min). With
    the Euler sampler the last step (t = dt) returns x0_hat exactly; a zero x0_hat gives the zero edit residual
    at every t (the unedited background is exact from the start)."""
    tb = t.clamp_min(t_min).reshape(-1, *([1] * (noisy.dim() - 1)))
    return (noisy - x0_hat) / tb


def x0_matching_loss(x0_hat: torch.Tensor, x0: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """mean ||x0_hat - x_0||^2 (the rectified-flow velocity loss ||v(x0_hat) - (eps - x_0)||^2 = ||x0_hat - x_0||^2
    / t^2 with the weight t^2); with ``weight`` the weighted mean sum(w err^2) / sum(w)."""
    err = (x0_hat - x0) ** 2
    if weight is None:
        return err.mean()
    w = torch.broadcast_to(weight, err.shape).to(err.dtype)
    return (w * err).sum() / w.sum().clamp_min(1e-12)


def timestep_embedding(t: torch.Tensor, width: int) -> torch.Tensor:
    """Sinusoidal embedding of t in [0, 1] (scaled by 1000, as in DiT): [cos(1000 t f_k), sin(1000 t f_k)]."""
    half = width // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    angle = 1000.0 * t.float()[:, None] * freqs[None]
    return torch.cat([angle.cos(), angle.sin()], dim=-1)


class ConditionTokens(nn.Module):
    """[reconstructed] c_l = MLP_l(h_l) + e_l for each selected layer l, concatenated along the sequence."""

    def __init__(self, in_width: int, width: int, n_layers: int) -> None:
        super().__init__()
        self.mlps = nn.ModuleList(nn.Sequential(nn.LayerNorm(in_width), nn.Linear(in_width, width), nn.GELU(),
                                                nn.Linear(width, width)) for _ in range(n_layers))
        self.layer_embedding = nn.Parameter(torch.randn(n_layers, width) * 0.5)

    def forward(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(states) != len(self.mlps):
            raise ValueError(f"expected {len(self.mlps)} layers of hidden states, got {len(states)}")
        return torch.cat([mlp(h) + self.layer_embedding[i] for i, (mlp, h) in enumerate(zip(self.mlps, states))],
                         dim=1)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """adaLN: x * (1 + scale) + shift, with per-sample (B, D) shift and scale."""
    return x * (1 + scale[:, None]) + shift[:, None]


class _MultiHeadAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.kv, self.out = nn.Linear(width, width), nn.Linear(width, 2 * width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        batch, n, width = x.shape
        head = width // self.heads
        q = self.q(x).view(batch, n, self.heads, head).transpose(1, 2)
        k, v = self.kv(context).view(batch, context.shape[1], 2, self.heads, head).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(batch, n, width))


class DiTBlock(nn.Module):
    """adaLN DiT block (Peebles & Xie 2023) with the adaLN projection zero-initialised, so at init the block
    is the plain pre-LN transformer block (gates 1 + g = 1), not the identity of adaLN-Zero. ``joint``: attention
    over the whole sequence (MiVE's unified self-attention). ``cross``: self-attention over the video tokens, then
    cross-attention from video to the condition tokens (the prior design MiVE argues against); the condition
    tokens pass unchanged."""

    def __init__(self, width: int, heads: int, attention: Literal["joint", "cross"]) -> None:
        super().__init__()
        self.attention = attention
        self.ln1 = nn.LayerNorm(width, elementwise_affine=False)
        self.ln2 = nn.LayerNorm(width, elementwise_affine=False)
        self.attn = _MultiHeadAttention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.ada = nn.Linear(width, 6 * width)
        nn.init.zeros_(self.ada.weight)
        nn.init.zeros_(self.ada.bias)
        if attention == "cross":
            self.ln_cross = nn.LayerNorm(width)
            self.cross = _MultiHeadAttention(width, heads)

    def forward(self, video: torch.Tensor, cond: torch.Tensor, time: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        s1, g1, b1, s2, g2, b2 = self.ada(F.silu(time)).chunk(6, dim=-1)
        if self.attention == "joint":
            n = video.shape[1]
            x = torch.cat([video, cond], dim=1)
            h = modulate(self.ln1(x), b1, s1)
            x = x + (1 + g1[:, None]) * self.attn(h, h)
            x = x + (1 + g2[:, None]) * self.mlp(modulate(self.ln2(x), b2, s2))
            return x[:, :n], x[:, n:]
        h = modulate(self.ln1(video), b1, s1)
        video = video + (1 + g1[:, None]) * self.attn(h, h)
        video = video + self.cross(self.ln_cross(video), cond)
        video = video + (1 + g2[:, None]) * self.mlp(modulate(self.ln2(video), b2, s2))
        return video, cond


class EditDiT(nn.Module):
    """The DiT of the cpu profile: predicts the clean edit residual x0_hat (x_tgt - x_src in patch space); the
    velocity of rectified flow is ``velocity_from_x0`` of it.

    Video tokens = Linear([noisy residual patch ; source patch]) + fixed 2-D sin-cos position of the patch (the same
    code in every frame). Condition tokens from an external ``ConditionTokens`` (or a baseline encoder), the first
    ``cond_image_frames * grid^2`` of them (the VLM's image patches) given the SAME position codes, so a video patch
    finds the reference patch at its place by matching positions. Timestep by adaLN; output = zero-initialised
    Linear on video tokens (x0_hat = 0, no edit, at init)."""

    def __init__(self, patch_dim: int, n_video_tokens: int, cond_width: int, n_cond_layers: int, width: int,
                 depth: int, heads: int, attention: Literal["joint", "cross"] = "joint", grid: int = 4,
                 cond_image_frames: int = 2) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of heads {heads}")
        if n_video_tokens % (grid * grid):
            raise ValueError(f"n_video_tokens {n_video_tokens} must be a multiple of grid^2 = {grid * grid}")
        self.width = width
        self.embed = nn.Linear(2 * patch_dim, width)
        codes = sincos_2d(grid, width)
        self.register_buffer("position", codes.repeat(n_video_tokens // (grid * grid), 1)[None], persistent=False)
        self.register_buffer("cond_position", codes.repeat(cond_image_frames, 1)[None], persistent=False)
        self.condition = ConditionTokens(cond_width, width, n_cond_layers)
        self.time_mlp = nn.Sequential(nn.Linear(width, width), nn.SiLU(), nn.Linear(width, width))
        self.blocks = nn.ModuleList(DiTBlock(width, heads, attention) for _ in range(depth))
        self.norm = nn.LayerNorm(width, elementwise_affine=False)
        self.head = nn.Linear(width, patch_dim)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def condition_positions(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """Position codes ``(1, sum_l L_l, width)`` of the condition sequence: each layer's image patches get the
        2-D codes, its text tokens zeros."""
        codes = []
        for h in states:
            n_image = min(self.cond_position.shape[1], h.shape[1])
            pad = self.cond_position.new_zeros(1, h.shape[1] - n_image, self.width)
            codes.append(torch.cat([self.cond_position[:, :n_image], pad], dim=1))
        return torch.cat(codes, dim=1)

    def forward(self, noisy: torch.Tensor, source: torch.Tensor, t: torch.Tensor,
                states: Sequence[torch.Tensor]) -> torch.Tensor:
        """x0_hat, the predicted clean residual patches."""
        video = self.embed(torch.cat([noisy, source], dim=-1)) + self.position
        cond = self.condition(states) + self.condition_positions(states)
        time = self.time_mlp(timestep_embedding(t, self.width))
        for block in self.blocks:
            video, cond = block(video, cond, time)
        return self.head(self.norm(video))


# ----------------------------------------------------------------------------- patches


def patchify(frames: torch.Tensor, patch: int) -> torch.Tensor:
    """``(B, T, H, W, C)`` -> ``(B, T * (H/p) * (W/p), p * p * C)`` (frame-major, then row-major patches)."""
    b, t, h, w, c = frames.shape
    x = frames.reshape(b, t, h // patch, patch, w // patch, patch, c).permute(0, 1, 2, 4, 3, 5, 6)
    return x.reshape(b, t * (h // patch) * (w // patch), patch * patch * c)


def unpatchify(tokens: torch.Tensor, frames: int, size: int, patch: int, channels: int = 3) -> torch.Tensor:
    """Inverse of ``patchify``."""
    b = tokens.shape[0]
    g = size // patch
    x = tokens.reshape(b, frames, g, g, patch, patch, channels).permute(0, 1, 2, 4, 3, 5, 6)
    return x.reshape(b, frames, size, size, channels)


# ----------------------------------------------------------------------------- edit metrics


def masked_mean_rgb(clips: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Mean RGB ``(N, 3)`` of ``clips`` ``(N, T, H, W, 3)`` over the pixels where ``masks`` ``(N, T, H, W)``."""
    w = masks.to(clips.dtype)[..., None]
    return (clips * w).sum((1, 2, 3)) / w.sum((1, 2, 3)).clamp_min(1)


def object_hue_error(edited: torch.Tensor, target: torch.Tensor, object_masks: torch.Tensor) -> torch.Tensor:
    """Per clip: circular error (degrees) between the hue of the edited object's mean colour in the edited clip
    and in the ground-truth clip (the pixels of the object's mask, all frames)."""
    return circular_hue_error(rgb_to_hue(masked_mean_rgb(edited, object_masks)),
                              rgb_to_hue(masked_mean_rgb(target, object_masks)))


def object_change(edited: torch.Tensor, source: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """Per clip and object: mean |edited - source| over the object's pixels; ``masks`` ``(N, K, T, H, W)`` ->
    ``(N, K)``."""
    diff = (edited - source).abs().mean(-1)
    w = masks.to(diff.dtype)
    return (diff[:, None] * w).sum((2, 3, 4)) / w.sum((2, 3, 4)).clamp_min(1)


def target_selected(edited: torch.Tensor, source: torch.Tensor, target: torch.Tensor, masks: torch.Tensor,
                    target_object: torch.Tensor) -> torch.Tensor:
    """Per-object pixel-change test: the intended object changed by at least half its true change, and every
    other object by less than that half. ``target_object`` ``(N,)`` indexes ``masks``' object axis."""
    change = object_change(edited, source, masks)
    true_change = object_change(target, source, masks).gather(1, target_object[:, None]).squeeze(1)
    tau = 0.5 * true_change
    hit = change.gather(1, target_object[:, None]).squeeze(1) >= tau
    others = torch.ones_like(change, dtype=torch.bool).scatter(1, target_object[:, None], False)
    spill = ((change >= tau[:, None]) & others).any(1)
    return hit & ~spill


def unedited_mse(edited: torch.Tensor, target: torch.Tensor, edit_masks: torch.Tensor) -> torch.Tensor:
    """Per clip: mean squared error over the pixels (and channels) outside the edited object's mask, where the
    ground truth equals the source."""
    keep = (~edit_masks).to(edited.dtype)[..., None]
    return (((edited - target) ** 2) * keep).sum((1, 2, 3, 4)) / (3 * keep.sum((1, 2, 3, 4))).clamp_min(1)


def change_centroid_drift(edited: torch.Tensor, source: torch.Tensor, edit_masks: torch.Tensor) -> torch.Tensor:
    """Per clip: mean over frames of the distance (pixels) between the centroid of the change mass |edited - source|
    and the centroid of the edited object's mask (motion preserved: the edit follows the object)."""
    change = (edited - source).abs().sum(-1)
    n, t, h, w = change.shape
    yy = torch.arange(h, dtype=change.dtype)[:, None].expand(h, w)
    xx = torch.arange(w, dtype=change.dtype)[None, :].expand(h, w)

    def centroid(weight: torch.Tensor) -> torch.Tensor:
        total = weight.sum((2, 3)).clamp_min(1e-12)
        return torch.stack([(weight * yy).sum((2, 3)) / total, (weight * xx).sum((2, 3)) / total], dim=-1)

    gap = centroid(change) - centroid(edit_masks.to(change.dtype))
    return gap.norm(dim=-1).mean(1)
