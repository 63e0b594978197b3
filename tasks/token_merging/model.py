"""The digits ViT of token_merging (smoke / cpu profiles), shared by training and evaluation: its shape
from the config, seeded construction, and the checkpoint in ``models/token_merging/seed<N>/``."""

from __future__ import annotations

from pathlib import Path

from tasks.common.io import load_state_dict
from tasks.common.seeding import torch_init_seed
from tasks.token_merging import method
from tasks.token_merging.config import DigitsDataConfig, ViTConfig

CHECKPOINT = "vit.safetensors"


def vit_shape(vit: ViTConfig, data_cfg: DigitsDataConfig) -> method.ViTShape:
    return method.ViTShape(image_size=data_cfg.image_size, patch_size=vit.patch_size, channels=1, dim=vit.dim,
                           depth=vit.depth, heads=vit.heads, mlp_dim=vit.dim * vit.mlp_ratio, n_classes=10,
                           pos_embed=vit.pos_embed)


def build_vit(vit: ViTConfig, data_cfg: DigitsDataConfig, seed: int) -> method.MergeViT:
    with torch_init_seed(seed):  # module init draws from torch's global generator
        return method.MergeViT(vit_shape(vit, data_cfg))


def load_vit(vit: ViTConfig, data_cfg: DigitsDataConfig, model_dir: Path) -> method.MergeViT:
    """The trained ViT from ``model_dir`` (strict: every parameter must match the config's shape)."""
    path = Path(model_dir) / CHECKPOINT
    if not path.is_file():
        raise FileNotFoundError(f"token_merging: {path} is missing; run the train step first")
    return load_state_dict(build_vit(vit, data_cfg, seed=0), path).eval()
