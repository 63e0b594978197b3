"""Probe of a candidate token_merging test bed (issue 18): digits drawn in texture CONTRAST.

Not part of the pipeline (no DVC stage, no report): the cheap one-seed check, run before adopting a test bed,
of whether (1) the unmerged ViT trains to a clear accuracy and (2) ToMe (M2) loses >= 3 points at r = 0.1.
It is scored on a VALIDATION split (300 of the 1,437 training digits, held out by ``numpy``'s generator
seeded 0), never on the 360 test images.

The bed: each 8x8 digit is upsampled bilinearly to a 16x16 grid of cells; cell (i, j) becomes a 4x4 block of
random pixels whose spread is ``low + (high - low) * (g_ij + 1) / 2`` (g in [-1, 1] the upsampled digit), so the
digit is drawn by contrast, not by intensity: a 64x64 image, 4x4 patches, 256 tokens, no two alike.
``--texture zero_mean``: Gaussian pixels, centred per cell; ``rademacher``: pixels +-spread (random signs, so
every cell's norm is exactly 4 x spread). Training draws fresh textures every epoch and shifts the digit by
+-1 cell; the validation textures are fixed (generator seeded 123).

    PYTHONPATH=. python bench/token_merging_texture_probe.py --texture zero_mean --epochs 12 --low 0.1
    PYTHONPATH=. python bench/token_merging_texture_probe.py --texture rademacher --epochs 20 --low 0.3

The results of the two probes of 2026-12-02 are in tasks/token_merging/README.md ("Probes for a lossy test bed").
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from tasks.token_merging import baselines, data, method, sweep
from tasks.token_merging.config import DigitsDataConfig, SceneConfig, TrainConfig, ViTConfig
from tasks.token_merging.model import build_vit
from tasks.token_merging.train import train_vit

CELL = 4
GRID = 16
N_VALIDATION = 300


def texture(glyphs: torch.Tensor, kind: str, low: float, high: float, generator: torch.Generator,
            shift: int = 0) -> torch.Tensor:
    """(B, 1, 16, 16) digits in [-1, 1] -> (B, 1, 64, 64) contrast textures (module docstring)."""
    if shift:
        glyphs = data.random_shift(glyphs, shift, generator)
    spread = low + (high - low) * (glyphs + 1) / 2
    spread = spread.repeat_interleave(CELL, 2).repeat_interleave(CELL, 3)
    if kind == "rademacher":
        pixels = torch.randint(0, 2, spread.shape, generator=generator).float() * 2 - 1
    else:
        pixels = torch.randn(spread.shape, generator=generator)
        cells = pixels.unfold(2, CELL, CELL).unfold(3, CELL, CELL)
        cells = cells - cells.mean((-1, -2), keepdim=True)
        pixels = cells.permute(0, 1, 2, 4, 3, 5).reshape(spread.shape)
    return spread * pixels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texture", choices=["zero_mean", "rademacher"], required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--low", type=float, required=True)
    parser.add_argument("--high", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    frames = data.digits_split(DigitsDataConfig(test_size=360, split_seed=0, image_size=GRID))
    glyphs, labels = data.digits_tensors(frames["train"], GRID)  # the training split only
    order = torch.tensor(np.random.default_rng(0).permutation(len(labels)))
    val_idx, train_idx = order[:N_VALIDATION], order[N_VALIDATION:]
    val_images = texture(glyphs[val_idx], args.texture, args.low, args.high, torch.Generator().manual_seed(123))
    val_labels = labels[val_idx]

    def epoch_images(generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return texture(glyphs[train_idx], args.texture, args.low, args.high, generator, shift=1), labels[train_idx]

    vit = ViTConfig(patch_size=CELL, dim=32, depth=4, heads=2, mlp_ratio=2, pos_embed="sincos")
    shape_cfg = DigitsDataConfig(test_size=360, split_seed=0, image_size=GRID * CELL, scene=SceneConfig())
    train_cfg = TrainConfig(epochs=args.epochs, batch_size=32, lr=3e-3, weight_decay=0.05, max_shift=0,
                            fused_attention=True, warmup_fraction=0.1)
    model = build_vit(vit, shape_cfg, args.seed)
    start = time.process_time()
    losses = train_vit(model, train_cfg, glyphs[train_idx], labels[train_idx], args.seed, compose=epoch_images)
    print("train loss per epoch", [round(loss, 3) for loss in losses], "train CPU s",
          round(time.process_time() - start, 1))
    for merge in (baselines.PROPORTIONAL, method.SQRT_R, method.PER_CLUSTER_KAPPA):
        for r in (1.0, 0.25, 0.1):
            schedule = method.merge_schedule(GRID * GRID, vit.depth, r)
            logits, _, _, _, kappa = sweep.batched_forward(model, val_images, merge, schedule, N_VALIDATION, True)
            accuracy = 100 * float((logits.argmax(-1) == val_labels).double().mean())
            print(f"{merge.name} r = {r:g}: validation accuracy {accuracy:.2f} %, mean kappa of merged tokens "
                  f"{kappa:.3f}")
    print("total CPU s", round(time.process_time() - start, 1))


if __name__ == "__main__":
    main()
