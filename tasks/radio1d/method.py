"""RADIO1D as a pure library (no Prefect, no MLflow, no file layout).

Sources: the official code (NVlabs/RADIO, ``radio/radio1d.py``) and the C-RADIOv4-1D model card for the
architecture, the token-count samplers and the inference interface; the paper's own text and tables were not
available. Pieces that are the project's reconstruction are marked RECONSTRUCTED.

- Encoder: a ViT with cls + register prefix tokens; after ``depth_before`` blocks a PatchMerging layer
  (LayerNorm, Linear(4C -> 2C)) merges 2x2 patches (4x fewer tokens, 2x channels); the prefix tokens are
  projected linearly to the new width; ``depth_after`` more blocks and a final LayerNorm follow.
- 1D tokens: the first k spatial tokens after the final LayerNorm (prefix slicing).
- Training: k is drawn per sample (uniform, Beta, triangle, Gaussian mixture over modes).
- Decoder (training only): positions >= k of the merged grid are replaced by a learned filler token; the
  decoder has its own learned prefix tokens (nothing of the encoder's prefix reaches it); ViT blocks with a
  PatchSplitting layer (Linear(C -> 4 * C/2), one 2x2 block per token) restore the full grid and width.
- Loss (RECONSTRUCTED toy version of the multi-teacher agglomerative loss of the C-RADIOv4 recipe):
  L = (1 - cos(A_sum(dec_cls), t_sum)) + mean over grid locations of
  [||A_dense(dec_tok) - t_dense||^2 + (1 - cos(A_dense(dec_tok), t_dense))], unit weights, no PHI-S.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from tasks.common.tiny_vlm import _ViTBlock as ViTBlock  # the project's pre-norm ViT block (tiny_vlm.py)
from tasks.common.tiny_vlm import sincos_2d

SamplerKind = Literal["uniform", "triangle", "beta", "gaussian_mixture", "fixed"]


# ----------------------------------------------------------------------------- token-count samplers


def sample_num_tokens(kind: SamplerKind, n: int, k_max: int, generator: torch.Generator, *,
                      beta: tuple[float, float] = (1.0, 3.0), modes: tuple[float, ...] = (),
                      sigma: float = 1.0, fixed_k: int | None = None) -> torch.Tensor:
    """Per-sample token counts ``(n,)`` (long) in [1, k_max], the samplers of the official code.

    - ``uniform``: k = 1 + floor(u * k_max), u ~ U[0, 1) (each k has probability 1 / k_max);
    - ``triangle``: density decreasing linearly from k = 1 to k = k_max (mean at 1/3 of the range):
      k = 1 + round((k_max - 1) * (1 - sqrt(1 - u))) (inverse CDF of the density 2(1 - x) on [0, 1]);
    - ``beta``: k = 1 + round((k_max - 1) * x), x ~ Beta(a, b);
    - ``gaussian_mixture``: a mode m drawn uniformly from ``modes``, k = round(m + sigma * z), clipped;
    - ``fixed``: k = ``fixed_k`` for every sample (the fixed-k baselines).
    """
    if k_max < 1:
        raise ValueError(f"k_max must be >= 1, got {k_max}")
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    if kind == "uniform":
        k = 1 + torch.floor(u * k_max)
    elif kind == "triangle":
        k = 1 + torch.round((k_max - 1) * (1 - torch.sqrt(1 - u)))
    elif kind == "beta":
        a, b = (torch.tensor(v, dtype=torch.float64) for v in beta)
        x = torch.distributions.Beta(a, b).sample((n,)) if n else torch.zeros(0, dtype=torch.float64)
        k = 1 + torch.round((k_max - 1) * x)
    elif kind == "gaussian_mixture":
        if not modes:
            raise ValueError("gaussian_mixture needs at least one mode")
        pick = torch.floor(u * len(modes)).long().clamp(max=len(modes) - 1)
        z = torch.randn(n, generator=generator, dtype=torch.float64)
        k = torch.round(torch.tensor(modes, dtype=torch.float64)[pick] + sigma * z)
    elif kind == "fixed":
        if fixed_k is None or not 1 <= fixed_k <= k_max:
            raise ValueError(f"fixed sampler needs 1 <= fixed_k <= {k_max}, got {fixed_k}")
        k = torch.full((n,), float(fixed_k), dtype=torch.float64)
    else:
        raise ValueError(f"unknown sampler {kind!r}")
    return k.clamp(1, k_max).long()


# ----------------------------------------------------------------------------- merging and splitting


def merge_2x2(tokens: torch.Tensor, grid: int) -> torch.Tensor:
    """``(B, grid*grid, C)`` row-major tokens -> ``(B, (grid/2)^2, 4C)``: merged token (i, j) concatenates the
    tokens at (2i, 2j), (2i+1, 2j), (2i, 2j+1), (2i+1, 2j+1), in that order (Swin's PatchMerging order;
    the official radio1d.py was not read for this)."""
    batch, length, width = tokens.shape
    if length != grid * grid or grid % 2:
        raise ValueError(f"{length} tokens are not an even square grid of side {grid}")
    x = tokens.view(batch, grid, grid, width)
    parts = [x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]]
    return torch.cat(parts, dim=-1).reshape(batch, (grid // 2) ** 2, 4 * width)


def split_2x2(tokens: torch.Tensor, grid: int) -> torch.Tensor:
    """Inverse of ``merge_2x2``: ``(B, grid*grid, 4C)`` -> ``(B, (2 grid)^2, C)``; the four C-chunks of token
    (i, j) go to (2i, 2j), (2i+1, 2j), (2i, 2j+1), (2i+1, 2j+1)."""
    batch, length, width4 = tokens.shape
    if length != grid * grid or width4 % 4:
        raise ValueError(f"{length} tokens of width {width4} cannot be split on a grid of side {grid}")
    width = width4 // 4
    parts = tokens.view(batch, grid, grid, 4, width)
    out = tokens.new_empty(batch, 2 * grid, 2 * grid, width)
    out[:, 0::2, 0::2] = parts[:, :, :, 0]
    out[:, 1::2, 0::2] = parts[:, :, :, 1]
    out[:, 0::2, 1::2] = parts[:, :, :, 2]
    out[:, 1::2, 1::2] = parts[:, :, :, 3]
    return out.reshape(batch, 4 * grid * grid, width)


class PatchMerging(nn.Module):
    """2x2 merge, LayerNorm(4C), Linear(4C -> 2C) (official code: 4x fewer tokens, 2x channels)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(4 * width)
        self.reduce = nn.Linear(4 * width, 2 * width)

    def forward(self, tokens: torch.Tensor, grid: int) -> torch.Tensor:
        return self.reduce(self.norm(merge_2x2(tokens, grid)))


class PatchSplitting(nn.Module):
    """Linear(C -> 4 * C/2), then each token's four chunks fill one 2x2 block (4x more tokens, half the width)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        if width % 2:
            raise ValueError(f"width {width} must be even")
        self.expand = nn.Linear(width, 2 * width)

    def forward(self, tokens: torch.Tensor, grid: int) -> torch.Tensor:
        return split_2x2(self.expand(tokens), grid)


# ----------------------------------------------------------------------------- prefix slicing and filler


def keep_mask(num_tokens: torch.Tensor, length: int) -> torch.Tensor:
    """``(B, length)`` boolean: position j is kept iff j < k_b (the first k tokens form the 1D code)."""
    return torch.arange(length, device=num_tokens.device)[None, :] < num_tokens[:, None]


def fill_after_prefix(tokens: torch.Tensor, num_tokens: torch.Tensor, filler: torch.Tensor) -> torch.Tensor:
    """Positions >= k_b of sample b are replaced by ``filler`` ``(C,)``; ``torch.where`` so no gradient or value
    of a dropped token reaches the decoder."""
    keep = keep_mask(num_tokens, tokens.shape[1])[..., None]
    return torch.where(keep, tokens, filler.to(tokens.dtype).expand_as(tokens))


# ----------------------------------------------------------------------------- encoder / decoder


class Radio1D(nn.Module):
    """Encoder with patch merging + training-only decoder + per-teacher adaptor heads (official code layout).

    Image ``(B, 1, S, S)`` -> ``(S/p)^2`` patch tokens of width ``width`` (+ cls + registers) -> ``depth_before``
    blocks -> PatchMerging -> ``(S/2p)^2`` tokens of width ``2 width`` -> ``depth_after`` blocks -> LayerNorm.
    """

    def __init__(self, image_size: int, patch_size: int, width: int, heads: int, depth_before: int,
                 depth_after: int, registers: int, decoder_depth_before: int, decoder_depth_after: int,
                 summary_dim: int, dense_dim: int) -> None:
        super().__init__()
        if image_size % (2 * patch_size):
            raise ValueError(f"image_size {image_size} must be a multiple of 2 * patch_size {2 * patch_size}")
        self.grid = image_size // patch_size
        self.prefix = 1 + registers
        wide = 2 * width
        self.patchify = nn.Conv2d(1, width, patch_size, stride=patch_size)
        self.position = nn.Parameter(sincos_2d(self.grid, width)[None])
        self.enc_prefix = nn.Parameter(0.02 * torch.randn(1, self.prefix, width))
        self.blocks_before = nn.ModuleList(ViTBlock(width, heads, 0.0) for _ in range(depth_before))
        self.merge = PatchMerging(width)
        self.prefix_proj = nn.Linear(width, wide)
        self.blocks_after = nn.ModuleList(ViTBlock(wide, heads, 0.0) for _ in range(depth_after))
        self.norm = nn.LayerNorm(wide)
        # decoder: its own prefix, a filler token, its own positions on the merged grid
        self.dec_prefix = nn.Parameter(0.02 * torch.randn(1, self.prefix, wide))
        self.filler = nn.Parameter(0.02 * torch.randn(wide))
        self.dec_position = nn.Parameter(sincos_2d(self.grid // 2, wide)[None])
        self.dec_blocks_before = nn.ModuleList(ViTBlock(wide, heads, 0.0) for _ in range(decoder_depth_before))
        self.split = PatchSplitting(wide)
        self.dec_prefix_proj = nn.Linear(wide, width)
        self.dec_blocks_after = nn.ModuleList(ViTBlock(width, heads, 0.0) for _ in range(decoder_depth_after))
        self.dec_norm = nn.LayerNorm(width)
        self.adaptor_summary = mlp_adaptor(width, summary_dim)
        self.adaptor_dense = mlp_adaptor(width, dense_dim)

    @property
    def max_tokens(self) -> int:
        """Spatial tokens after merging: the largest k."""
        return (self.grid // 2) ** 2

    def encode(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefix ``(B, 1 + R, 2C)`` and merged spatial tokens ``(B, K_max, 2C)``, both after the final norm."""
        x = self.patchify(images).flatten(2).transpose(1, 2) + self.position
        x = torch.cat([self.enc_prefix.expand(x.shape[0], -1, -1), x], dim=1)
        for block in self.blocks_before:
            x = block(x)
        prefix, spatial = x[:, :self.prefix], x[:, self.prefix:]
        x = torch.cat([self.prefix_proj(prefix), self.merge(spatial, self.grid)], dim=1)
        for block in self.blocks_after:
            x = block(x)
        x = self.norm(x)
        return x[:, :self.prefix], x[:, self.prefix:]

    def forward_encoder(self, images: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Inference interface: the first ``num_tokens`` spatial tokens ``(B, k, 2C)`` (the 1D representation)."""
        if not 1 <= num_tokens <= self.max_tokens:
            raise ValueError(f"num_tokens must be in [1, {self.max_tokens}], got {num_tokens}")
        return self.encode(images)[1][:, :num_tokens]

    def decoder_inputs(self, spatial: torch.Tensor, num_tokens: torch.Tensor) -> torch.Tensor:
        """Decoder's first-stage input: its own prefix, then kept tokens / filler, plus its own positions."""
        body = fill_after_prefix(spatial, num_tokens, self.filler) + self.dec_position
        return torch.cat([self.dec_prefix.expand(spatial.shape[0], -1, -1), body], dim=1)

    def decode(self, spatial: torch.Tensor, num_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Decoder cls ``(B, C)`` and full-grid tokens ``(B, grid^2, C)`` from the first k_b tokens of each sample."""
        x = self.decoder_inputs(spatial, num_tokens)
        for block in self.dec_blocks_before:
            x = block(x)
        prefix, body = x[:, :self.prefix], x[:, self.prefix:]
        x = torch.cat([self.dec_prefix_proj(prefix), self.split(body, self.grid // 2)], dim=1)
        for block in self.dec_blocks_after:
            x = block(x)
        x = self.dec_norm(x)
        return x[:, 0], x[:, self.prefix:]

    def forward(self, images: torch.Tensor, num_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training path: adapted summary ``(B, summary_dim)`` and dense ``(B, grid^2, dense_dim)`` predictions."""
        _, spatial = self.encode(images)
        cls, dense = self.decode(spatial, num_tokens)
        return self.adaptor_summary(cls), self.adaptor_dense(dense)


def mlp_adaptor(in_width: int, out_width: int) -> nn.Module:
    """Per-teacher adaptor head (RADIO: a 2-layer MLP per teacher and output kind)."""
    return nn.Sequential(nn.Linear(in_width, 2 * in_width), nn.GELU(), nn.Linear(2 * in_width, out_width))


# ----------------------------------------------------------------------------- losses


def summary_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of 1 - cos(prediction, target) (summary distillation, RECONSTRUCTED weights)."""
    return (1 - F.cosine_similarity(prediction, target, dim=-1)).mean()


def dense_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over batch and grid locations of ||prediction - target||^2 + (1 - cos(prediction, target))."""
    squared = ((prediction - target) ** 2).sum(-1)
    return (squared + 1 - F.cosine_similarity(prediction, target, dim=-1)).mean()


def distillation_loss(summary_pred: torch.Tensor, summary_target: torch.Tensor, dense_pred: torch.Tensor,
                      dense_target: torch.Tensor) -> torch.Tensor:
    """Multi-teacher loss: summary teacher on the summary head + dense teacher on the dense head, unit weights."""
    return summary_loss(summary_pred, summary_target) + dense_loss(dense_pred, dense_target)


# ----------------------------------------------------------------------------- evaluation measures


def average_precision(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Non-interpolated AP of one label: mean over the positives of precision at their rank (scores sorted
    descending, ties in index order). NaN when there is no positive."""
    order = torch.argsort(scores, descending=True, stable=True)
    hits = labels[order].double()
    positives = float(hits.sum())
    if positives == 0:
        return math.nan
    precision = torch.cumsum(hits, 0) / torch.arange(1, len(hits) + 1, dtype=torch.float64)
    return float((precision * hits).sum() / positives)


def mean_average_precision(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean over labels (columns) holding at least one positive of ``average_precision``."""
    values = [average_precision(scores[:, j], labels[:, j]) for j in range(labels.shape[1])]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def precision_at_1(queries: torch.Tensor, gallery: torch.Tensor, query_keys: torch.Tensor,
                   gallery_keys: torch.Tensor) -> float:
    """Fraction of queries whose cosine-nearest gallery item has the same key row (composition retrieval:
    keys ``(N, 4)`` = digit or empty per quadrant)."""
    sims = F.normalize(queries, dim=-1) @ F.normalize(gallery, dim=-1).T
    nearest = sims.argmax(dim=1)
    return float((gallery_keys[nearest] == query_keys).all(dim=-1).double().mean())


def held_out_r2(x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor, y_test: torch.Tensor,
                ridge: float) -> float:
    """Held-out R^2 of the ridge map y ~ x W + b fitted on train: 1 - SSE / SST summed over output columns
    (SST about the train mean). Measures how far one teacher's features are a linear image of another's."""
    x_mean, y_mean = x_train.mean(0), y_train.mean(0)
    xc, yc = (x_train - x_mean).double(), (y_train - y_mean).double()
    gram = xc.T @ xc + ridge * len(xc) * torch.eye(xc.shape[1], dtype=torch.float64)
    weights = torch.linalg.solve(gram, xc.T @ yc)
    prediction = (x_test - x_mean).double() @ weights + y_mean.double()
    sse = ((y_test.double() - prediction) ** 2).sum()
    sst = ((y_test.double() - y_mean.double()) ** 2).sum()
    return float(1 - sse / sst)


def violations_of_non_increase(values: list[float]) -> int:
    """Number of consecutive pairs with values[i + 1] > values[i] (a curve that should fall with k)."""
    return sum(1 for a, b in zip(values, values[1:], strict=False) if b > a)


def log_k_area(ks: list[int], values: list[float]) -> float:
    """Trapezoid area under values against log2 k, divided by the log2 range: the mean level of the curve."""
    logs = [math.log2(k) for k in ks]
    if len(ks) < 2 or logs[-1] == logs[0]:
        raise ValueError("need at least two distinct k")
    area = sum((logs[i + 1] - logs[i]) * (values[i] + values[i + 1]) / 2 for i in range(len(ks) - 1))
    return area / (logs[-1] - logs[0])


def fit_linear_probe(x_train: torch.Tensor, y_train: torch.Tensor, x_test: torch.Tensor, steps: int,
                     lr: float) -> torch.Tensor:
    """Multi-label logistic-regression probe: features standardised on train, full-batch Adam on the mean
    binary cross-entropy from zero weights; returns the test logits ``(n_test, labels)``."""
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    xs, xt = (x_train - mean) / std, (x_test - mean) / std
    weight = torch.zeros(xs.shape[1], y_train.shape[1], requires_grad=True)
    bias = torch.zeros(y_train.shape[1], requires_grad=True)
    optimizer = torch.optim.Adam([weight, bias], lr=lr)
    for _ in range(steps):
        loss = F.binary_cross_entropy_with_logits(xs @ weight + bias, y_train)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return (xt @ weight + bias).detach()
