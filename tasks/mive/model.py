"""The cpu experiment's models: the tiny VLM (pretrained, then frozen), its per-layer features, the edit DiT
variants, their training with rectified flow and the edit metrics. Shared by train.py and evaluate.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from tasks.common.schedules import warmup_cosine
from tasks.common.seeding import torch_init_seed
from tasks.common.tiny_vlm import TinyVLM, TinyVLMConfig, build_tiny_vlm, caption_loss
from tasks.mive import data, method
from tasks.mive.baselines import DecoupledEncoder
from tasks.mive.config import MiveConfig

PATCH = 4
RESIDUAL_SCALE = 2.0  # the edit residual x_tgt - x_src lies in [-1, 1]; x2 brings it near the noise's unit scale


def vlm_config(cfg: MiveConfig) -> TinyVLMConfig:
    v = cfg.vlm
    return TinyVLMConfig(vocab_size=len(data.VOCAB), image_size=cfg.data.image_size, patch_size=PATCH,
                         encoder_width=v.encoder_width, encoder_depth=1, encoder_heads=2, projector="mlp",
                         max_frames=2, time_embedding=True, lm_width=v.lm_width, lm_depth=v.lm_depth,
                         lm_heads=v.lm_heads, lm_positions=2 * cfg.data.image_size**2 // PATCH**2 + data.MAX_WORDS + 8)


def vlm_images(arrays: dict[str, np.ndarray]) -> torch.Tensor:
    """The VLM's visual input ``(N, 2, 3, H, W)``: the source's first frame, then the reference (the edited first
    frame). The source frame is needed to resolve "the red one" after the reference recoloured it."""
    return torch.from_numpy(np.stack([arrays["source"][:, 0], arrays["reference"]], 1)).permute(0, 1, 4, 2, 3)


def pretrain_vlm(cfg: MiveConfig, seed: int, images: torch.Tensor, ids: torch.Tensor, captions: torch.Tensor
                 ) -> tuple[TinyVLM, list[float]]:
    """Captioning pretraining: next-token loss on [side, new colour bin, <eos>] after [images][instruction]."""
    model = build_tiny_vlm(vlm_config(cfg), seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.vlm.lr, weight_decay=0.01)
    sched = warmup_cosine(opt, cfg.vlm.steps)
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones_like(captions[:1]).expand(cfg.vlm.batch_size, -1)
    losses = []
    model.train()
    for _ in range(cfg.vlm.steps):
        idx = torch.randint(len(ids), (cfg.vlm.batch_size,), generator=gen)
        loss = caption_loss(model, images[idx], ids[idx], captions[idx], mask)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return model.eval(), losses


@torch.no_grad()
def vlm_hidden_states(model: TinyVLM, images: torch.Tensor, ids: torch.Tensor, batch: int = 512
                      ) -> list[torch.Tensor]:
    """All ``lm_depth + 1`` hidden states of the frozen VLM over ``[source, reference patches][instruction]``
    (``hidden_states[0]`` = embeddings, ``[-1]`` = last block after GPT-2's final LayerNorm)."""
    chunks = []
    for start in range(0, len(ids), batch):
        embeds = model.embed_inputs(images[start:start + batch], ids[start:start + batch])
        chunks.append(model.lm.transformer(inputs_embeds=embeds, output_hidden_states=True).hidden_states)
    return [torch.cat([c[i] for c in chunks]) for i in range(len(chunks[0]))]


@torch.no_grad()
def caption_accuracy(model: TinyVLM, images: torch.Tensor, ids: torch.Tensor, captions: torch.Tensor) -> float:
    """Teacher-forced argmax accuracy on the semantic caption tokens (target side, new colour bin)."""
    logits = model(images, torch.cat([ids, captions], dim=1))
    start = model.num_image_tokens(images.shape[1]) + ids.shape[1] - 1
    predicted = logits[:, start:start + 2].argmax(-1)
    return float((predicted == captions[:, :2]).float().mean())


def variant_layers(variant: str, first: int) -> tuple[int, ...]:
    """Hidden-state indices a variant conditions on (decoupled: none, it has its own encoders)."""
    return {"first_last": (first, -1), "cross_attention": (first, -1), "last_only": (-1,),
            "first_only": (first,), "decoupled": ()}[variant]


class Editor(nn.Module):
    """A DiT variant and, for the decoupled baseline, its own trainable encoders."""

    def __init__(self, cfg: MiveConfig, variant: str, n_video_tokens: int) -> None:
        super().__init__()
        d = cfg.dit
        self.variant = variant
        layers = variant_layers(variant, d.first_layer)
        self.layers = method.resolve_layers(layers, cfg.vlm.lm_depth + 1) if layers else ()
        patch_dim = PATCH * PATCH * 3
        if variant == "decoupled":
            self.encoder = DecoupledEncoder(len(data.VOCAB), data.MAX_WORDS, cfg.data.image_size, PATCH, d.width)
            cond_width, n_layers = d.width, 1
        else:
            self.encoder = None
            cond_width, n_layers = cfg.vlm.lm_width, len(self.layers)
        attention = "joint" if variant in ("first_last", "last_only", "first_only") else "cross"
        # image-patch condition tokens: the VLM sees [source frame 0][reference], the decoupled encoder the reference
        self.dit = method.EditDiT(patch_dim, n_video_tokens, cond_width, n_layers, d.width, d.depth, d.heads,
                                  attention, grid=cfg.data.image_size // PATCH,
                                  cond_image_frames=1 if variant == "decoupled" else 2)

    def states(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        if self.encoder is not None:
            return [self.encoder(batch["reference"], batch["ids"])]
        return [batch[f"h{i}"] for i in self.layers]

    def forward(self, noisy: torch.Tensor, source: torch.Tensor, t: torch.Tensor,
                batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """x0_hat, the predicted clean (scaled) edit residual."""
        return self.dit(noisy, source, t, self.states(batch))

    def velocity(self, noisy: torch.Tensor, source: torch.Tensor, t: torch.Tensor,
                 batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Rectified-flow velocity (x_t - x0_hat) / max(t, 1e-3)."""
        return method.velocity_from_x0(noisy, self(noisy, source, t, batch), t)


@dataclass
class EditSet:
    """Tensors of one split in the DiT's layout: residual and source patches, edit-region weights, the
    reference, ids and the needed VLM states (``h<i>`` for each non-negative layer index)."""

    tensors: dict[str, torch.Tensor]

    def batch(self, idx: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v[idx] for k, v in self.tensors.items()}

    def __len__(self) -> int:
        return len(self.tensors["residual"])


def edit_set(arrays: dict[str, np.ndarray], states: list[torch.Tensor], layers: set[int]) -> EditSet:
    source = torch.from_numpy(arrays["source"])
    target = torch.from_numpy(arrays["target"])
    region = torch.from_numpy(arrays["masks"]).any(1)[..., None].float().expand(*source.shape[:4], 3)
    tensors = {"residual": method.patchify(target - source, PATCH) * RESIDUAL_SCALE,
               "source": method.patchify(source, PATCH), "region": method.patchify(region, PATCH),
               "reference": torch.from_numpy(arrays["reference"]), "ids": torch.from_numpy(arrays["ids"])}
    for i in layers:
        tensors[f"h{i}"] = states[i]
    return EditSet(tensors)


def warmup_constant(optimizer: torch.optim.Optimizer, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over 5% of the steps (at least 1), then the constant base rate: a cosine to 0 stopped the
    DiT while its loss was still falling."""
    warmup = max(1, total_steps // 20)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))


def train_editor(cfg: MiveConfig, variant: str, seed: int, train_set: EditSet,
                 progress: Callable[[int], None] | None = None) -> tuple[Editor, list[float]]:
    """Rectified-flow training of the x0-parameterised DiT: loss ||x0_hat(x_t, t, c) - x_0||^2 (the velocity loss
    with weight t^2) with x_0 the scaled edit residual, the patches of the two objects weighted ``region_weight``
    (the residual is zero elsewhere; without the weight the first hundreds of steps only learn to predict no
    change). Warm-up then constant learning rate."""
    d = cfg.dit
    with torch_init_seed(seed * 101 + 7):
        editor = Editor(cfg, variant, train_set.tensors["residual"].shape[1])
    opt = torch.optim.AdamW(editor.parameters(), lr=d.lr, weight_decay=0.0)
    sched = warmup_constant(opt, d.steps)
    gen = torch.Generator().manual_seed(seed * 7 + 1)
    losses = []
    for step in range(d.steps):
        batch = train_set.batch(torch.randint(len(train_set), (d.batch_size,), generator=gen))
        x0 = batch["residual"]
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.rand(x0.shape[0], generator=gen)
        pred = editor(method.interpolate(x0, noise, t), batch["source"], t, batch)
        loss = method.x0_matching_loss(pred, x0, 1 + (d.region_weight - 1) * batch["region"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if progress is not None and step % 50 == 0:
            progress(step)
    return editor.eval(), losses


def shuffled_conditions(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch with every condition input (VLM states ``h<i>``, reference, instruction ids) taken from the next
    clip (a cyclic shift by one), the video inputs unchanged: the conditioning of another clip."""
    conditions = [k for k in batch if k.startswith("h") or k in ("reference", "ids")]
    return batch | {k: batch[k].roll(1, dims=0) for k in conditions}


@torch.no_grad()
def validation_losses(editor: Editor, test_set: EditSet, batches: int, seed: int) -> dict[str, float]:
    """x0-matching loss on the test clips at fixed seeded (t, eps): all tokens (``full``), the objects' patches
    (``region``), and the objects' patches with every clip given another clip's conditions (``region_shuffled``,
    same t and eps). ``region_shuffled - region`` > 0 says the DiT uses its conditioning."""
    gen = torch.Generator().manual_seed(seed + 12345)
    out: dict[str, list[float]] = {"full": [], "region": [], "region_shuffled": []}
    batch = test_set.batch(torch.arange(len(test_set)))
    shuffled = shuffled_conditions(batch)
    x0 = batch["residual"]
    for _ in range(batches):
        noise = torch.randn(x0.shape, generator=gen)
        t = torch.rand(x0.shape[0], generator=gen)
        noisy = method.interpolate(x0, noise, t)
        pred = editor(noisy, batch["source"], t, batch)
        out["full"].append(float(method.x0_matching_loss(pred, x0)))
        out["region"].append(float(method.x0_matching_loss(pred, x0, batch["region"])))
        pred_shuffled = editor(noisy, batch["source"], t, shuffled)
        out["region_shuffled"].append(float(method.x0_matching_loss(pred_shuffled, x0, batch["region"])))
    return {k: float(np.mean(v)) for k, v in out.items()}


@torch.no_grad()
def sample_edits(editor: Editor, test_set: EditSet, steps: int, seed: int, frames: int, size: int) -> torch.Tensor:
    """Edited clips ``(N, T, S, S, 3)``: source + Euler-sampled residual, clipped to [0, 1]."""
    batch = test_set.batch(torch.arange(len(test_set)))
    noise = torch.randn(batch["residual"].shape, generator=torch.Generator().manual_seed(seed + 999))
    residual = method.euler_sample(lambda x, t: editor.velocity(x, batch["source"], t, batch), noise, steps)
    edited = batch["source"] + residual / RESIDUAL_SCALE
    return method.unpatchify(edited, frames, size, PATCH).clamp(0, 1)
