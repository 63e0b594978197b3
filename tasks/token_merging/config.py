"""Parameters of one token_merging profile (the ``token_merging.<profile>`` section of params.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "token_merging: Token merging as statistical reconstruction (reconstructed)"


class SceneConfig(ProfileConfig):
    """Composed digit scenes (the >= 256-token test bed) on an ``image_size`` canvas.

    ``quadrants``: four digits upsampled to half the canvas fill its quadrants; the label is the top-left
    digit, the other three (drawn from the same split) are distractors. ``random``: ``digits_per_scene`` 8x8
    digits pasted at their raw resolution at random positions; one digit: the label is that digit; two (left
    and right half): the larger of the two. ``noise_std``: Gaussian pixel noise added everywhere."""

    layout: Literal["quadrants", "random"] = "quadrants"
    digits_per_scene: int = Field(default=1, ge=1, le=2, description="random layout only")
    noise_std: float = Field(default=0.0, ge=0, le=2.0)


class TextureConfig(ProfileConfig):
    """Digits drawn by texture CONTRAST (issue 18's lossy test bed): the digit, upsampled bilinearly to an
    ``image_size / cell`` grid, decides each cell's spread ``low + (high - low) (g + 1) / 2`` (g in [-1, 1]); the
    cell is a ``cell`` x ``cell`` block of random-sign pixels +-spread, so no two tokens are alike and the digit
    is in the second moment only. Training draws fresh signs every epoch and shifts the digit by up to
    ``max_shift`` cells; the fixed splits are drawn once from ``split_seed``."""

    cell: int = Field(default=4, ge=2, le=8, description="pixels per cell side; must equal vit.patch_size")
    low: float = Field(default=0.3, ge=0.0, description="spread of the background cells")
    high: float = Field(default=1.0, gt=0.0, le=4.0, description="spread of the full-ink cells")
    max_shift: int = Field(default=1, ge=0, le=3, description="training: +-shift of the digit, in cells")

    @model_validator(mode="after")
    def _low_below_high(self) -> TextureConfig:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low}) must be below high ({self.high})")
        return self


class DigitsDataConfig(ProfileConfig):
    """scikit-learn's bundled digits (8x8), a fixed stratified split, upsampled for the ViT, or (``scene``)
    pasted into larger composed scenes."""

    test_size: int = Field(default=360, ge=10, le=1000)
    split_seed: int = Field(default=0, ge=0, description="the split is fixed; run seeds change the model only")
    n_train: int | None = Field(default=None, ge=50, description="subsample the training split (smoke)")
    image_size: int = Field(default=16, ge=8, le=64, description="bilinear upsampling of the 8x8 digits, or the "
                            "scene canvas")
    scene: SceneConfig | None = Field(default=None, description="compose scenes instead of upsampling")
    texture: TextureConfig | None = Field(default=None, description="draw the digits by texture contrast")

    @model_validator(mode="after")
    def _scene_fits(self) -> DigitsDataConfig:
        if self.texture is not None:
            if self.scene is not None:
                raise ValueError("texture: excludes 'scene' (one test bed at a time)")
            if self.image_size % self.texture.cell or not 8 <= self.image_size // self.texture.cell <= 32:
                raise ValueError(f"image_size: a multiple of texture.cell ({self.texture.cell}) giving a grid of "
                                 f"8 to 32 cells, got {self.image_size}")
            return self
        if self.scene is None and self.image_size > 32:
            raise ValueError(f"image_size: at most 32 for upsampled digits, got {self.image_size}")
        if self.scene is not None and self.image_size < 16:
            raise ValueError(f"image_size: a scene canvas must be at least 16 (two 8x8 digits), got {self.image_size}")
        return self


class ViTConfig(ProfileConfig):
    """The small pre-LN ViT trained from scratch on digits."""

    patch_size: int = Field(ge=1)
    dim: int = Field(ge=8)
    depth: int = Field(ge=2, description="merging happens after blocks 0..depth-2")
    heads: int = Field(ge=1)
    mlp_ratio: int = Field(default=2, ge=1)
    pos_embed: Literal["learned", "sincos"] = Field(default="learned", description="learned (the committed "
                                                    "runs), or fixed 2-D sin-cos (faster training at many tokens)")

    @model_validator(mode="after")
    def _heads_divide(self) -> ViTConfig:
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        if self.pos_embed == "sincos" and self.dim % 4:
            raise ValueError(f"pos_embed: 'sincos' needs dim divisible by 4, got {self.dim}")
        return self


class TrainConfig(ProfileConfig):
    epochs: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0, le=1.0)
    weight_decay: float = Field(default=0.05, ge=0)
    max_shift: int = Field(default=1, ge=0, le=3, description="random +-shift augmentation in pixels")
    fused_attention: bool = Field(default=False, description="train through torch's fused attention "
                                  "(MergeViT.forward_fused: same function, float rounding differs)")
    warmup_fraction: float | None = Field(default=None, gt=0, le=0.5, description="share of the optimiser "
                                          "steps in linear warm-up; unset keeps total // 20 (the committed runs)")


class MergeSweepConfig(ProfileConfig):
    """Training-free merging sweep: retention values r, and M4's candidate value exponents."""

    retentions: list[float] = Field(min_length=2)
    value_exponents: list[float] = Field(default=[-1.0, 0.0, 1.0], min_length=1)
    calibration_size: int = Field(default=128, ge=8, description="training images for M4's energy matching")
    aggressive_retention: float = Field(default=0.25, gt=0, lt=1, description="r <= this is 'aggressive' (b1, b2)")
    shrink_singletons: bool = False
    eval_batch_size: int = Field(default=512, ge=1)
    fused_attention: bool = Field(default=False, description="evaluate through torch's fused attention "
                                  "(method.corrected_attention_fused: same function, float rounding differs)")

    @field_validator("retentions")
    @classmethod
    def _retentions(cls, values: list[float]) -> list[float]:
        if values[0] != 1.0:
            raise ValueError("must start with 1.0 (the unmerged reference)")
        if any(not 0 < r <= 1 for r in values):
            raise ValueError("every retention must be in (0, 1]")
        if any(a <= b for a, b in zip(values, values[1:])):
            raise ValueError("must be strictly decreasing")
        return values

    @model_validator(mode="after")
    def _has_aggressive(self) -> MergeSweepConfig:
        if not any(r <= self.aggressive_retention for r in self.retentions):
            raise ValueError(f"retentions need at least one value <= aggressive_retention "
                             f"({self.aggressive_retention}) for checks (b)1-2")
        return self


class IsotropicConfig(ProfileConfig):
    """Acceptance check (a)5: one pre-LN attention layer on isotropic Gaussian tokens."""

    dim: int = Field(default=64, ge=4)
    n_tokens: int = Field(default=192, ge=8)
    n_queries: int = Field(default=192, ge=1)
    retentions: list[float] = Field(default=[0.5, 0.25, 0.125], min_length=1)
    temperature: float = Field(default=1.0, gt=0)

    @model_validator(mode="after")
    def _sizes_divide(self) -> IsotropicConfig:
        for r in self.retentions:
            size = round(1 / r) if r > 0 else 0
            if r <= 0 or abs(size * r - 1) > 1e-9 or self.n_tokens % size:
                raise ValueError(f"retentions: 1/r must be an integer dividing n_tokens ({self.n_tokens}), got {r}")
        return self


class HubConfig(ProfileConfig):
    """Paper profile: a pretrained DeiT / ViT checkpoint on ImageNet-1k validation, merged training-free."""

    model: str = Field(min_length=1, description="e.g. facebook/deit-small-patch16-224")
    dataset: str = Field(default="ILSVRC/imagenet-1k", min_length=1)
    split: str = Field(default="validation", min_length=1)
    n_images: int = Field(ge=1, description="validation images per seed (each seed draws its own subset)")
    batch_size: int = Field(default=64, ge=1)
    dtype: str = Field(default="float32", pattern="^(float32|float64|bfloat16)$")


class TokenMergingConfig(PaperConfig):
    """smoke / cpu: ``data`` + ``vit`` + ``train`` (a digits ViT trained per seed); paper: ``hub``."""

    data: DigitsDataConfig | None = None
    vit: ViTConfig | None = None
    train: TrainConfig | None = None
    hub: HubConfig | None = None
    merge: MergeSweepConfig
    isotropic: IsotropicConfig = IsotropicConfig()

    @model_validator(mode="after")
    def _one_model_source(self) -> TokenMergingConfig:
        digits = (self.data, self.vit, self.train)
        if self.hub is None and any(part is None for part in digits):
            raise ValueError("without 'hub', 'data', 'vit' and 'train' are all required (the digits ViT)")
        if self.hub is not None and any(part is not None for part in digits):
            raise ValueError("'hub' (paper profile) excludes 'data', 'vit' and 'train'")
        texture = self.data.texture if self.data is not None else None
        if texture is not None and self.vit is not None and self.vit.patch_size != texture.cell:
            raise ValueError(f"vit.patch_size ({self.vit.patch_size}) must equal data.texture.cell ({texture.cell}): "
                             "one token per cell")
        if texture is not None and self.train is not None and self.train.max_shift:
            raise ValueError(f"train.max_shift: must be 0 with data.texture (a pixel shift breaks the cells; the "
                             f"digit is shifted by data.texture.max_shift cells), got {self.train.max_shift}")
        if self.vit is not None and self.data is not None and self.data.image_size % self.vit.patch_size:
            raise ValueError(f"vit.patch_size ({self.vit.patch_size}) must divide data.image_size "
                             f"({self.data.image_size})")
        return self


CONFIG = TokenMergingConfig
