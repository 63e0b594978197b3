"""Convex Gated Probing (CGP) and the BAT recipe elements, as a pure library (no Prefect, MLflow or files).

Paper: Ghaffari, Rauch, Scholz, Devos, "Better Audio Transformer guided by Convex Gated Probing", ICML 2026
(arXiv 2602.16305). The CGP head follows the official code (``models/heads.py`` of
github.com/houtan-ghaffari/BAT_ICML2026, as described in the paper's Section 3 / Fig. 2):

1. every frozen token of every layer is L2-normalised:          z_hat = z / ||z||;
2. a convex layer gate alpha = softmax(a), a initialised to ones (uniform alpha = 1/L);
   z_bar_n = sum_l alpha_l z_hat_{l,n}, o_bar = sum_l alpha_l o_hat_l (the same alpha for patch and cls tokens),
   with no renormalisation after mixing, so ||z_bar|| <= 1 (convex combination of unit vectors);
3. K prototypes P, rows L2-normalised;
4. similarities s_z = z_bar P_hat^T (N x K), s_o = o_bar P_hat^T (K), both in [-1, 1];
5. features f = [min_n s_z || s_o || max_n s_z] (3K); without cls, [min || mean || max];
6. Dropout and Linear(3K -> C). The dropout (``GeneratorDropout``) draws its masks from an explicit
   ``torch.Generator`` that the training loop attaches, never from torch's process-wide generator: a run's
   seeds train on parallel threads of one process (tasks/common/seeding.py).

"Convex" names the gate (a convex combination of layers); the head's training objective is NOT convex in
(a, P, W). The linear probe below (binary cross-entropy + L2 on fixed features) is, and ``fit_linear_probe``
returns its unique minimiser (verified in the unit tests by a zero gradient and by agreement with sklearn).

BAT elements (paper text, Section 4): the dB + per-clip min-max [0, 1] front end, and sigmoid-gated attention
V_tilde = sigma(x W_G) * softmax(Q K^T / sqrt(d)) V.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

# LayerNorm epsilon of the official LinearCGP head (models/heads.py).
LCGP_NORM_EPS = 1e-6

# ---------------------------------------------------------------------------------------------- dropout


class GeneratorDropout(nn.Module):
    """Inverted dropout with an explicit random source: in training mode y = x * m / (1 - p) with
    m_i ~ Bernoulli(1 - p) i.i.d. (m_i = [u_i >= p], u_i ~ U[0, 1) drawn from ``self.generator``); in eval mode,
    or with p = 0, y = x. nn.Dropout's equation, but its mask never comes from torch's process-wide generator.

    ``generator`` is attached by the training loop (``attach_dropout_generator``); training with p > 0 and no
    generator raises instead of falling back to the global one."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout probability p must be in [0, 1), got {p}")
        self.p = p
        self.generator: torch.Generator | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.generator is None:
            raise RuntimeError("GeneratorDropout in training mode has no generator: attach one with "
                               "attach_dropout_generator(head, generator) before training")
        uniform = torch.rand(x.shape, generator=self.generator, dtype=x.dtype, device=self.generator.device)
        return x * (uniform.to(x.device) >= self.p).to(x.dtype) / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


def attach_dropout_generator(module: nn.Module, generator: torch.Generator) -> int:
    """Make every ``GeneratorDropout`` inside ``module`` draw its masks from ``generator``; returns how many."""
    dropouts = [m for m in module.modules() if isinstance(m, GeneratorDropout)]
    for dropout in dropouts:
        dropout.generator = generator
    return len(dropouts)


# --------------------------------------------------------------------------------------------- CGP head


def layer_gate(gate_logits: torch.Tensor) -> torch.Tensor:
    """alpha = softmax(a) over the layer axis (last dim): alpha >= 0 and sum(alpha) = 1 (Section 3)."""
    return torch.softmax(gate_logits, dim=-1)


def l2_normalise(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """x / max(||x||, eps) along the last dimension (step 1; F.normalize's convention)."""
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def cosine_to_mean(tokens: torch.Tensor) -> float:
    """Mean cosine of the rows of ``tokens`` (..., D) to their mean direction: (1/M) sum_i <x_i/||x_i||, m/||m||>,
    m = (1/M) sum_i x_i/||x_i||. 1 when every row points the same way (collapsed features); ~0 for isotropic rows."""
    rows = l2_normalise(tokens.reshape(-1, tokens.shape[-1]))
    return float((rows @ l2_normalise(rows.mean(dim=0))).mean())


def mix_layers(tokens: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """sum_l alpha_l * l2_normalise(tokens[:, l]) for tokens (B, L, ..., D): the convex mixture of step 2."""
    normalised = l2_normalise(tokens)
    shape = (1, alpha.shape[0]) + (1,) * (tokens.dim() - 2)
    return (normalised * alpha.reshape(shape)).sum(dim=1)


def cgp_features(patch: torch.Tensor, cls: torch.Tensor | None, gate_logits: torch.Tensor,
                 prototypes: torch.Tensor) -> torch.Tensor:
    """CGP pooled features (steps 1-5).

    patch: (B, L, N, D) frozen patch tokens of all L layers; cls: (B, L, D) or None; gate_logits: (L,);
    prototypes: (K, D), unnormalised. Returns (B, 3K): [min_n s_z, s_o, max_n s_z], or with cls None
    [min_n s_z, mean_n s_z, max_n s_z].
    """
    alpha = layer_gate(gate_logits)
    protos = l2_normalise(prototypes)
    sim_patch = mix_layers(patch, alpha) @ protos.T  # (B, N, K)
    centre = sim_patch.mean(dim=1) if cls is None else mix_layers(cls, alpha) @ protos.T
    return torch.cat([sim_patch.amin(dim=1), centre, sim_patch.amax(dim=1)], dim=-1)


class CGPHead(nn.Module):
    """The CGP probe: gate logits a (init ones), K prototypes (init N(0, 0.02^2)), Dropout (``GeneratorDropout``),
    Linear(3K -> C)."""

    def __init__(self, n_layers: int, dim: int, n_prototypes: int, n_classes: int, dropout: float = 0.2):
        super().__init__()
        self.gate_logits = nn.Parameter(torch.ones(n_layers))
        self.prototypes = nn.Parameter(0.02 * torch.randn(n_prototypes, dim))
        self.dropout = GeneratorDropout(dropout)
        self.classifier = nn.Linear(3 * n_prototypes, n_classes)

    def alpha(self) -> torch.Tensor:
        return layer_gate(self.gate_logits)

    def forward(self, patch: torch.Tensor, cls: torch.Tensor | None) -> torch.Tensor:
        return self.classifier(self.dropout(cgp_features(patch, cls, self.gate_logits, self.prototypes)))


class LCGPHead(nn.Module):
    """LCGP baseline as the official ``LinearCGP`` (models/heads.py; ``head_norm: true`` in esc50_lcgp_config.yaml):
    the softmax layer gate mixes the RAW cls tokens (no L2 normalisation), then LayerNorm(eps=1e-6), Dropout,
    Linear(D -> C). Without cls tokens the raw mean patch token of each layer is mixed instead."""

    def __init__(self, n_layers: int, dim: int, n_classes: int, dropout: float = 0.2):
        super().__init__()
        self.gate_logits = nn.Parameter(torch.ones(n_layers))
        self.norm = nn.LayerNorm(dim, eps=LCGP_NORM_EPS)
        self.dropout = GeneratorDropout(dropout)
        self.classifier = nn.Linear(dim, n_classes)

    def alpha(self) -> torch.Tensor:
        return layer_gate(self.gate_logits)

    def forward(self, patch: torch.Tensor, cls: torch.Tensor | None) -> torch.Tensor:
        tokens = patch.mean(dim=2) if cls is None else cls  # (B, L, D)
        pooled = (tokens * self.alpha().reshape(1, -1, 1)).sum(dim=1)
        return self.classifier(self.dropout(self.norm(pooled)))


def binarise(x: torch.Tensor) -> torch.Tensor:
    """(x >= 0) * 2 - 1, the official ProtoBin binarisation: +1 or -1 everywhere (0 maps to +1, unlike sign)."""
    return (x >= 0).to(x.dtype) * 2 - 1


class _SignSTE(torch.autograd.Function):
    """binarise(x) forward; identity backward (straight-through estimator, ProtoBin)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return binarise(x)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output


def sign_ste(x: torch.Tensor) -> torch.Tensor:
    """Binarise (``binarise``) in the forward pass; pass the gradient straight through in the backward pass."""
    return _SignSTE.apply(x)


class ProtoBinHead(nn.Module):
    """ProtoBin (Rauch et al., ICLR 2026): last layer only, sign-binarised prototypes (STE), cosine similarity,
    max over patch tokens, Linear(K -> C)."""

    def __init__(self, dim: int, n_prototypes: int, n_classes: int, dropout: float = 0.2):
        super().__init__()
        self.prototypes = nn.Parameter(0.02 * torch.randn(n_prototypes, dim))
        self.dropout = GeneratorDropout(dropout)
        self.classifier = nn.Linear(n_prototypes, n_classes)

    def forward(self, patch: torch.Tensor, cls: torch.Tensor | None) -> torch.Tensor:
        tokens = l2_normalise(patch[:, -1])  # (B, N, D), the last layer
        protos = l2_normalise(sign_ste(self.prototypes))
        return self.classifier(self.dropout((tokens @ protos.T).amax(dim=1)))


# ------------------------------------------------------------------------------ the convex linear probe


def linear_probe_objective(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                           l2: float) -> torch.Tensor:
    """Binary cross-entropy of sigmoid(x W^T + b) against multi-hot y, averaged over clips and classes, plus
    l2/2 ||W||^2 (the bias is not penalised).
    Convex in (W, b); strictly convex in W for l2 > 0."""
    logits = x @ weight.T + bias
    return F.binary_cross_entropy_with_logits(logits, y) + 0.5 * l2 * weight.pow(2).sum()


def fit_linear_probe(x: torch.Tensor, y: torch.Tensor, l2: float, max_iter: int = 500,
                     tolerance: float = 1e-9) -> tuple[torch.Tensor, torch.Tensor]:
    """Minimise ``linear_probe_objective`` by full-batch L-BFGS (strong Wolfe) from zero; returns (W, b).

    The problem is convex, so a point with zero gradient is the global minimum; the caller can check
    ``linear_probe_gradient_norm`` at the returned point."""
    weight = torch.zeros(y.shape[1], x.shape[1], dtype=x.dtype, requires_grad=True)
    bias = torch.zeros(y.shape[1], dtype=x.dtype, requires_grad=True)
    optimiser = torch.optim.LBFGS([weight, bias], lr=1.0, max_iter=max_iter, tolerance_grad=tolerance,
                                  tolerance_change=1e-14, history_size=20, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimiser.zero_grad()
        loss = linear_probe_objective(weight, bias, x, y, l2)
        loss.backward()
        return loss

    optimiser.step(closure)
    return weight.detach(), bias.detach()


def linear_probe_gradient_norm(weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
                               l2: float) -> float:
    """Largest absolute entry of the objective's gradient at (W, b): 0 exactly at the minimiser (KKT)."""
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    grads = torch.autograd.grad(linear_probe_objective(w, b, x, y, l2), (w, b))
    return float(max(g.abs().max() for g in grads))


def standardise(train: torch.Tensor, *others: torch.Tensor) -> list[torch.Tensor]:
    """Centre and scale every column by the training split's mean and standard deviation (the MAE
    linear-probe convention of a BatchNorm without affine parameters)."""
    mean = train.mean(dim=0)
    std = train.std(dim=0).clamp_min(1e-6)
    return [(t - mean) / std for t in (train, *others)]


# --------------------------------------------------------------------------------------------- metric


def average_precision(scores: np.ndarray, labels: np.ndarray) -> float:
    """Average precision of one class: mean over positives of the precision at each positive's rank
    (scores sorted descending; ties broken by order, stable). NaN when the class has no positive."""
    labels = np.asarray(labels, dtype=bool)
    if not labels.any():
        return float("nan")
    order = np.argsort(-np.asarray(scores), kind="stable")
    hits = labels[order]
    precision_at_rank = np.cumsum(hits) / np.arange(1, hits.size + 1)
    return float(precision_at_rank[hits].mean())


def macro_map(scores: np.ndarray, labels: np.ndarray) -> float:
    """Macro mean average precision over classes (columns) that have a positive, in percent."""
    per_class = [average_precision(scores[:, c], labels[:, c]) for c in range(labels.shape[1])]
    return 100.0 * float(np.nanmean(per_class))


def chance_map(labels: np.ndarray) -> float:
    """Macro mAP of a scorer that carries no information, in percent: the mean class prevalence (the expected AP
    of a random ranking of a class is its prevalence), over classes that have a positive."""
    prevalence = np.asarray(labels, dtype=float).mean(axis=0)
    return 100.0 * float(prevalence[prevalence > 0].mean())


def prior_entropy(labels: np.ndarray) -> float:
    """Binary cross-entropy (nats, averaged over classes) of the best constant predictor, sigmoid = prevalence:
    mean_c H(p_c), H(p) = -p log p - (1 - p) log(1 - p). A trained multi-label model's loss must go below it."""
    p = np.clip(np.asarray(labels, dtype=float).mean(axis=0), 1e-12, 1 - 1e-12)
    return float(np.mean(-p * np.log(p) - (1 - p) * np.log(1 - p)))


def middle_layer_gain(val_maps: np.ndarray, test_maps: np.ndarray) -> tuple[float, int, int]:
    """Held-out gain of the best NON-last layer's linear probe over the last layer's, with the layer chosen on a
    validation split (no selection on test data).

    ``val_maps`` and ``test_maps`` are (L, R) mAPs of per-layer probes (layers x readouts, e.g. cls and mean
    patch). The pair (l*, r*) = argmax over l < L and r of ``val_maps`` is chosen on validation only; the gain is
    test_maps[l*, r*] - test_maps[L, r*] (the last layer read the same way). Returns (gain, l* 1-indexed, r*)."""
    val, test = np.asarray(val_maps, dtype=float), np.asarray(test_maps, dtype=float)
    if val.shape != test.shape or val.ndim != 2 or val.shape[0] < 2:
        raise ValueError(f"val_maps {val.shape} and test_maps {test.shape} must be the same (layers >= 2, readouts)")
    layer, readout = np.unravel_index(int(np.argmax(val[:-1])), val[:-1].shape)
    return float(test[layer, readout] - test[-1, readout]), int(layer) + 1, int(readout)


def gap_closure(probe: float, linear: float, finetune: float) -> float:
    """(probe - LP) / (FT - LP): the fraction of the fine-tuning gap a probe closes (Table 5, derived)."""
    return (probe - linear) / (finetune - linear)


# ------------------------------------------------------------------------------------- BAT front end


def mel_filterbank(n_fft: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """Triangular HTK-mel filters, (n_fft // 2 + 1, n_mels), from 0 Hz to Nyquist; each filter peaks at 1."""
    def hz_to_mel(f: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def mel_to_hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(np.array(0.0)), hz_to_mel(np.array(sample_rate / 2)), n_mels + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (freqs[None] - lower) / (centre - lower)
    falling = (upper - freqs[None]) / (upper - centre)
    return torch.from_numpy(np.clip(np.minimum(rising, falling), 0.0, None).T.astype(np.float32))


def minmax_per_clip(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - min) / (max - min) per clip (over all but the batch axis): every clip spans [0, 1] (BAT front end)."""
    flat = x.reshape(x.shape[0], -1)
    low = flat.amin(dim=1).reshape((-1,) + (1,) * (x.dim() - 1))
    high = flat.amax(dim=1).reshape((-1,) + (1,) * (x.dim() - 1))
    return (x - low) / (high - low).clamp_min(eps)


def log_mel_frontend(waves: torch.Tensor, sample_rate: int, n_fft: int, hop: int, n_mels: int,
                     n_frames: int) -> torch.Tensor:
    """Waveforms (B, T) -> (B, n_frames, n_mels): |STFT|^2 (Hann) -> mel -> dB (10 log10, floor 1e-10)
    -> pad/crop to n_frames -> per-clip min-max to [0, 1]."""
    spec = torch.stft(waves, n_fft=n_fft, hop_length=hop, window=torch.hann_window(n_fft, device=waves.device),
                      return_complex=True, center=True).abs().pow(2)  # (B, F, T)
    mel = spec.transpose(1, 2) @ mel_filterbank(n_fft, n_mels, sample_rate).to(waves.device)  # (B, T, M)
    db = 10.0 * torch.log10(mel.clamp_min(1e-10))
    if db.shape[1] < n_frames:
        db = F.pad(db, (0, 0, 0, n_frames - db.shape[1]), value=float(db.min()))
    return minmax_per_clip(db[:, :n_frames])


# --------------------------------------------------------------------------------- gated attention


class GatedSelfAttention(nn.Module):
    """Multi-head self-attention with BAT's sigmoid output gate:
    V_tilde = sigma(x W_G) * softmax(Q K^T / sqrt(d_head)) V, then the output projection.
    With ``gated=False`` the gate is omitted (standard attention)."""

    def __init__(self, dim: int, heads: int, gated: bool):
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by heads {heads}")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.gate = nn.Linear(dim, dim) if gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).reshape(batch, tokens, 3, self.heads, dim // self.heads).permute(2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(dim // self.heads), dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, tokens, dim)
        if self.gate is not None:
            out = torch.sigmoid(self.gate(x)) * out
        return self.proj(out)
