"""The stand-in encoder: a tiny audio ViT on (frames x mels) spectrograms, pretrained by MAE with a ViT decoder.

At CPU scale BAT's data2vec-2-style pretraining (400k steps on AudioSet-2M) is replaced by a small masked
autoencoder (He et al. 2022) on synthetic clips; the blocks may use BAT's sigmoid-gated attention
(``method.GatedSelfAttention``) and the decoder is a ViT, as in BAT (paper, Section 4). The probe under test
(``method.CGPHead``) is exact; this encoder is only the thing it probes.
"""

from __future__ import annotations

import torch
from torch import nn

from tasks.convex_gated_probing.method import GatedSelfAttention


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN x), then x + MLP(LN x)."""

    def __init__(self, dim: int, heads: int, gated: bool, mlp_ratio: int = 4):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = GatedSelfAttention(dim, heads, gated)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def patchify(spec: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, T, M) -> (B, (T/p) (M/p), p*p): non-overlapping p x p patches, time-major order."""
    batch, frames, mels = spec.shape
    x = spec.reshape(batch, frames // patch, patch, mels // patch, patch)
    return x.permute(0, 1, 3, 2, 4).reshape(batch, (frames // patch) * (mels // patch), patch * patch)


class AudioViT(nn.Module):
    """ViT with a cls token and learned positions over 8x8 spectrogram patches.

    The spectrogram is standardised with one dataset mean and std (buffers, set from the pretraining clips by
    ``set_input_statistics``) before patch embedding, as AudioMAE-style audio encoders do. Without it the per-clip
    min-max spectrograms (mean ~0.57, std ~0.12 per clip; cosine 0.99 between clips) share one dominant direction
    and every layer's tokens collapse onto it (cls cosine to the mean direction 1.0000 in the first cpu run).
    """

    def __init__(self, n_frames: int, n_mels: int, patch: int, dim: int, depth: int, heads: int, gated: bool):
        super().__init__()
        if n_frames % patch or n_mels % patch:
            raise ValueError(f"spectrogram {n_frames}x{n_mels} is not divisible into {patch}x{patch} patches")
        self.patch = patch
        self.n_tokens = (n_frames // patch) * (n_mels // patch)
        self.embed = nn.Linear(patch * patch, dim)
        self.cls = nn.Parameter(0.02 * torch.randn(1, 1, dim))
        self.pos = nn.Parameter(0.02 * torch.randn(1, self.n_tokens, dim))
        self.blocks = nn.ModuleList(Block(dim, heads, gated) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.register_buffer("input_mean", torch.tensor(0.0))
        self.register_buffer("input_std", torch.tensor(1.0))

    @torch.no_grad()
    def set_input_statistics(self, spec: torch.Tensor) -> None:
        """Dataset-level input standardisation: one mean and one std over every clip, frame and mel bin."""
        self.input_mean.copy_(spec.mean())
        self.input_std.copy_(spec.std().clamp_min(1e-6))

    def tokens(self, spec: torch.Tensor) -> torch.Tensor:
        standardised = (spec - self.input_mean) / self.input_std
        return self.embed(patchify(standardised, self.patch)) + self.pos

    def run_blocks(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Prepend cls, run every block; returns the final-normed output and every block's output."""
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        hidden = []
        for block in self.blocks:
            x = block(x)
            hidden.append(x)
        return self.norm(x), hidden

    def forward(self, spec: torch.Tensor) -> torch.Tensor:
        return self.run_blocks(self.tokens(spec))[0]

    @torch.no_grad()
    def layer_features(self, spec: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Frozen features of every block: patch tokens (B, L, N, D) and cls tokens (B, L, D)."""
        _, hidden = self.run_blocks(self.tokens(spec))
        stacked = torch.stack(hidden, dim=1)
        return stacked[:, :, 1:], stacked[:, :, 0]


def clip_summary_target(target: torch.Tensor) -> torch.Tensor:
    """The cls token's regression target: every clip's mean normalised patch (B, N, P) -> (B, P), standardised
    per component over the batch, so the part shared by all clips is removed and only what tells clips apart
    remains (data2vec 2.0 regresses the mean-pooled target with the cls token; here the targets are MAE's pixels)."""
    summary = target.mean(1)
    return (summary - summary.mean(0)) / (summary.std(0) + 1e-6)


class MAE(nn.Module):
    """Masked autoencoder: encode the visible patches, decode all positions with a small ViT decoder,
    regress the per-patch normalised pixels of the masked patches (He et al. 2022).

    With ``cls_loss_weight`` > 0 the final-normed cls token also regresses ``clip_summary_target`` through a
    linear head (data2vec 2.0's cls loss). Without it nothing trains the cls token: it became an attention sink
    pointing one way for every clip (cosine to its mean direction 0.9996 on the cpu encoder) and the deep patch
    tokens followed (0.97).

    ``decoder_depth`` 0 gives a linear decoder (LayerNorm + Linear on the encoder's patch tokens, as SimMIM): the
    encoder's own last blocks then do the pixel reconstruction, the light-decoder regime in which the paper finds
    the semantic peak inside the network rather than at its end (Section 5)."""

    def __init__(self, encoder: AudioViT, decoder_dim: int, decoder_depth: int, heads: int, mask_ratio: float,
                 cls_loss_weight: float = 0.0):
        super().__init__()
        self.encoder = encoder
        self.mask_ratio = mask_ratio
        self.cls_loss_weight = cls_loss_weight
        dim = encoder.embed.out_features
        self.to_decoder = nn.Linear(dim, decoder_dim)
        self.mask_token = nn.Parameter(0.02 * torch.randn(1, 1, decoder_dim))
        self.decoder_pos = nn.Parameter(0.02 * torch.randn(1, encoder.n_tokens, decoder_dim))
        self.decoder = nn.ModuleList(Block(decoder_dim, heads, gated=False) for _ in range(decoder_depth))
        self.decoder_norm = nn.LayerNorm(decoder_dim)
        self.predict = nn.Linear(decoder_dim, encoder.patch ** 2)
        self.cls_predict = nn.Linear(dim, encoder.patch ** 2)

    def loss(self, spec: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        target = patchify(spec, self.encoder.patch)
        target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6).sqrt()
        batch, n = target.shape[:2]
        keep = max(1, round(n * (1 - self.mask_ratio)))
        order = torch.rand(batch, n, generator=generator).argsort(dim=1)
        visible = order[:, :keep]
        tokens = self.encoder.tokens(spec)
        kept = torch.gather(tokens, 1, visible[..., None].expand(-1, -1, tokens.shape[-1]))
        encoded, _ = self.encoder.run_blocks(kept)
        latent = self.to_decoder(encoded[:, 1:])
        full = self.mask_token.expand(batch, n, -1).clone()
        full.scatter_(1, visible[..., None].expand(-1, -1, full.shape[-1]), latent)
        x = full + self.decoder_pos
        for block in self.decoder:
            x = block(x)
        prediction = self.predict(self.decoder_norm(x))
        masked = torch.ones(batch, n, dtype=torch.bool)
        masked.scatter_(1, visible, False)
        reconstruction = ((prediction - target) ** 2).mean(-1)[masked].mean()
        if self.cls_loss_weight == 0:
            return reconstruction
        summary = ((self.cls_predict(encoded[:, 0]) - clip_summary_target(target)) ** 2).mean()
        return reconstruction + self.cls_loss_weight * summary


class FineTuneModel(nn.Module):
    """Full fine-tuning: the encoder and a linear head on the final-normed cls token."""

    def __init__(self, encoder: AudioViT, n_classes: int):
        super().__init__()
        self.encoder = encoder
        self.head = nn.Linear(encoder.embed.out_features, n_classes)

    def forward(self, spec: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(spec)[:, 0])


def layer_decay_groups(model: FineTuneModel, lr: float, decay: float) -> list[dict]:
    """Layer-wise lr decay (BEiT/MAE fine-tuning): the head and final norm get lr, block i of L gets
    lr * decay^(L - i + 1), the patch embedding, positions and cls get lr * decay^(L + 1)."""
    depth = len(model.encoder.blocks)
    groups = [{"params": list(model.head.parameters()) + list(model.encoder.norm.parameters()), "lr": lr}]
    for i, block in enumerate(model.encoder.blocks, start=1):
        groups.append({"params": list(block.parameters()), "lr": lr * decay ** (depth - i + 1)})
    stem = list(model.encoder.embed.parameters()) + [model.encoder.cls, model.encoder.pos]
    groups.append({"params": stem, "lr": lr * decay ** (depth + 1)})
    return groups
