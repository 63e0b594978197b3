"""Parameters of one mive profile (the ``mive.<profile>`` section of params.yaml).

smoke / cpu: ``data`` (procedural edit triplets, data.py), ``vlm`` (the tiny VLM pretrained then frozen),
``dit`` (the edit DiT and its variants), ``probe``. paper: ``hub`` (Qwen3-VL and a Wan-family DiT by name).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "mive: MiVE, first- and last-layer VLM features for reference-guided video editing"

VARIANTS = ("first_last", "last_only", "first_only", "cross_attention", "decoupled")


class DataConfig(ProfileConfig):
    frames: int = Field(ge=1, le=16)
    image_size: int = Field(ge=12, le=64)
    noise_sd: float = Field(ge=0, le=0.2)
    n_vlm: int = Field(ge=16, le=200_000, description="VLM pretraining clips (all 8 phrasings)")
    n_train: int = Field(ge=16, le=200_000, description="DiT training clips (phrasings 0-4)")
    n_test: int = Field(ge=8, le=20_000, description="test clips (held-out phrasings 5-7)")

    @field_validator("image_size")
    @classmethod
    def _multiple_of_four(cls, v: int) -> int:
        if v % 4:
            raise ValueError(f"must be a multiple of the patch size 4 (got {v})")
        return v


class VLMConfig(ProfileConfig):
    encoder_width: int = Field(ge=8, le=512)
    lm_width: int = Field(ge=8, le=1024)
    lm_depth: int = Field(ge=2, le=24, description="GPT-2 blocks; at least 2 so first and last layers differ")
    lm_heads: int = Field(ge=1, le=16)
    steps: int = Field(ge=1, le=100_000)
    batch_size: int = Field(ge=1, le=4096)
    lr: float = Field(gt=0, le=1)


class DiTConfig(ProfileConfig):
    variants: tuple[Literal["first_last", "last_only", "first_only", "cross_attention", "decoupled"], ...]
    first_layer: int = Field(ge=0, description="index into hidden_states of the 'first layer' (1: block 1)")
    width: int = Field(ge=8, le=1024)
    depth: int = Field(ge=1, le=24)
    heads: int = Field(ge=1, le=16)
    steps: int = Field(ge=1, le=100_000)
    batch_size: int = Field(ge=1, le=4096)
    lr: float = Field(gt=0, le=1)
    region_weight: float = Field(ge=1, le=1000, description="loss weight of the objects' patches")
    sample_steps: int = Field(ge=1, le=1000)
    val_batches: int = Field(ge=1, le=1000)

    @model_validator(mode="after")
    def _check(self) -> DiTConfig:
        if "first_last" not in self.variants:
            raise ValueError("variants: must include first_last (MiVE itself)")
        if len(set(self.variants)) != len(self.variants):
            raise ValueError(f"variants: duplicate entries in {self.variants}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads {self.heads}")
        return self


class ProbeConfig(ProfileConfig):
    n_fit: int = Field(ge=16, le=100_000, description="training clips the probes are fitted on")
    ridge: float = Field(gt=0, le=1e6)


class HubConfig(ProfileConfig):
    vlm: str = Field(min_length=3)
    dit: str = Field(min_length=3)
    reference_editor: str = Field(min_length=3)
    layers: tuple[int, ...] = Field(min_length=1)
    alt_layers: tuple[int, ...] = Field(min_length=1)
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"


class MiveConfig(PaperConfig):
    data: DataConfig
    vlm: VLMConfig
    dit: DiTConfig
    probe: ProbeConfig
    hub: HubConfig | None = None

    @model_validator(mode="after")
    def _first_layer_in_range(self) -> MiveConfig:
        if self.dit.first_layer >= self.vlm.lm_depth:
            raise ValueError(f"dit.first_layer {self.dit.first_layer} must be below the last layer "
                             f"(vlm.lm_depth {self.vlm.lm_depth})")
        return self


CONFIG = MiveConfig
