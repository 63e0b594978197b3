"""Parameters of one convex_gated_probing profile (the ``convex_gated_probing.<profile>`` section of params.yaml)."""

from __future__ import annotations

from pydantic import Field, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "convex_gated_probing: Better Audio Transformer guided by Convex Gated Probing"


class DataConfig(ProfileConfig):
    """Synthetic sound-event clips (10 classes) and the log-mel front end."""

    sample_rate: int = Field(ge=2000, le=48000, strict=True)
    clip_seconds: float = Field(gt=0.2, le=10)
    n_unlabelled: int = Field(ge=16, le=100_000, strict=True)
    n_train: int = Field(ge=16, le=100_000, strict=True)
    n_test: int = Field(ge=16, le=100_000, strict=True)
    n_fft: int = Field(ge=16, le=4096, strict=True)
    hop: int = Field(ge=1, le=4096, strict=True)
    n_mels: int = Field(ge=8, le=256, strict=True)
    n_frames: int = Field(ge=8, le=2048, strict=True)
    snr_db_low: float = Field(ge=-30, le=40)
    snr_db_high: float = Field(ge=-30, le=40)

    @model_validator(mode="after")
    def _snr_range(self) -> DataConfig:
        if self.snr_db_low > self.snr_db_high:
            raise ValueError(f"snr_db_low {self.snr_db_low} exceeds snr_db_high {self.snr_db_high}")
        return self


class EncoderConfig(ProfileConfig):
    """The tiny audio ViT and its MAE pretraining."""

    patch: int = Field(ge=2, le=32, strict=True)
    dim: int = Field(ge=8, le=1024, strict=True)
    depth: int = Field(ge=2, le=24, strict=True)
    heads: int = Field(ge=1, le=16, strict=True)
    gated_attention: bool
    decoder_dim: int = Field(ge=8, le=1024, strict=True)
    decoder_depth: int = Field(ge=0, le=12, strict=True)  # 0: a linear decoder (LayerNorm + Linear, SimMIM-style)
    mask_ratio: float = Field(gt=0, lt=1)
    ssl_steps: int = Field(ge=1, le=1_000_000, strict=True)
    ssl_batch: int = Field(ge=2, le=4096, strict=True)
    ssl_lr: float = Field(gt=0, le=1)
    cls_loss_weight: float = Field(ge=0, le=100)  # data2vec-2-style cls regression of the clip summary (0: MAE only)

    @model_validator(mode="after")
    def _heads_divide(self) -> EncoderConfig:
        if self.dim % self.heads or self.decoder_dim % self.heads:
            raise ValueError(f"heads {self.heads} must divide dim {self.dim} and decoder_dim {self.decoder_dim}")
        return self


class ProbeConfig(ProfileConfig):
    """Probe heads on frozen features (the official esc50_cgp_config.yaml, steps scaled down)."""

    n_prototypes: int = Field(ge=2, le=100_000, strict=True)
    steps: int = Field(ge=1, le=1_000_000, strict=True)
    warmup_steps: int = Field(ge=0, le=100_000, strict=True)
    batch: int = Field(ge=2, le=4096, strict=True)
    lr: float = Field(gt=0, le=1)
    weight_decay: float = Field(ge=0, le=10)
    dropout: float = Field(ge=0, lt=1)
    lp_l2: float = Field(gt=0, le=10)


class FineTuneConfig(ProfileConfig):
    """Full fine-tuning, the upper bound: AdamW, layer-wise lr decay."""

    steps: int = Field(ge=1, le=1_000_000, strict=True)
    batch: int = Field(ge=2, le=4096, strict=True)
    lr: float = Field(gt=0, le=1)
    layer_decay: float = Field(gt=0, le=1)
    weight_decay: float = Field(ge=0, le=10)


class PlantedConfig(ProfileConfig):
    """The planted-layer test: synthetic frozen features with class evidence in one layer only."""

    n_layers: int = Field(ge=2, le=48, strict=True)
    planted_layer: int = Field(ge=1, le=48, strict=True)  # 1-indexed, as in the acceptance check
    n_tokens: int = Field(ge=2, le=1024, strict=True)
    dim: int = Field(ge=4, le=1024, strict=True)
    n_classes: int = Field(ge=2, le=100, strict=True)
    n_train: int = Field(ge=16, le=100_000, strict=True)
    n_test: int = Field(ge=16, le=100_000, strict=True)
    signal: float = Field(gt=0, le=100)
    n_prototypes: int = Field(ge=2, le=10_000, strict=True)
    steps: int = Field(ge=1, le=100_000, strict=True)
    lr: float = Field(gt=0, le=1)
    n_seeds: int = Field(ge=1, le=100, strict=True)  # independent planted problems per run seed (binomial trials)

    @model_validator(mode="after")
    def _layer_in_range(self) -> PlantedConfig:
        if self.planted_layer > self.n_layers:
            raise ValueError(f"planted_layer {self.planted_layer} exceeds n_layers {self.n_layers}")
        return self


class ConvexGatedProbingConfig(PaperConfig):
    data: DataConfig
    encoder: EncoderConfig
    probe: ProbeConfig
    finetune: FineTuneConfig
    planted: PlantedConfig


CONFIG = ConvexGatedProbingConfig
