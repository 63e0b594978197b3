"""Parameters of one radio1d profile (the ``radio1d.<profile>`` section of params.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "radio1d: RADIO1D, elastic representations for condensed vision modeling"


class DataConfig(ProfileConfig):
    """Digit scenes: a 16x16 canvas whose four 8x8 quadrants hold a scikit-learn digit or nothing."""

    n_train: StrictInt = Field(ge=20, le=200_000)
    n_test: StrictInt = Field(ge=20, le=50_000)
    n_queries: StrictInt = Field(ge=10, le=50_000)
    min_digits: StrictInt = Field(ge=1, le=4)
    max_digits: StrictInt = Field(ge=1, le=4)
    digit_test_fraction: float = Field(gt=0, lt=1)
    split_seed: StrictInt = Field(ge=0)

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits {self.min_digits} > max_digits {self.max_digits}")
        if self.n_queries > self.n_test:
            raise ValueError(f"n_queries {self.n_queries} > n_test {self.n_test}")
        return self


class TeacherConfig(ProfileConfig):
    """Two toy teachers trained from scratch on different objectives, then frozen."""

    epochs: StrictInt = Field(ge=1, le=500)
    batch_size: StrictInt = Field(ge=8, le=4096)
    lr: float = Field(gt=0, le=1)
    summary_dim: StrictInt = Field(ge=4, le=1024)
    dense_dim: StrictInt = Field(ge=4, le=1024)


class StudentConfig(ProfileConfig):
    patch_size: StrictInt = Field(ge=1, le=8)
    width: StrictInt = Field(ge=8, le=1024)
    heads: StrictInt = Field(ge=1, le=32)
    depth_before: StrictInt = Field(ge=0, le=24)
    depth_after: StrictInt = Field(ge=1, le=24)
    registers: StrictInt = Field(ge=0, le=16)
    decoder_depth_before: StrictInt = Field(ge=0, le=24)
    decoder_depth_after: StrictInt = Field(ge=0, le=24)
    plain_depth: StrictInt = Field(ge=1, le=24)

    @model_validator(mode="after")
    def _check(self) -> StudentConfig:
        if self.width % 4 or self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of 4 and of heads {self.heads}")
        return self


class TrainConfig(ProfileConfig):
    epochs: StrictInt = Field(ge=1, le=1000)
    batch_size: StrictInt = Field(ge=8, le=4096)
    lr: float = Field(gt=0, le=1)
    weight_decay: float = Field(ge=0, le=1)
    warmup_fraction: float = Field(ge=0, lt=1)
    sampler: Literal["uniform", "triangle", "beta", "gaussian_mixture"]
    beta: tuple[float, float] = (1.0, 3.0)
    modes: tuple[float, ...] = ()
    sigma: float = Field(default=1.0, gt=0)
    fixed_ks: tuple[StrictInt, ...] = Field(min_length=1)


class EvalConfig(ProfileConfig):
    ks: tuple[StrictInt, ...] = Field(min_length=2)
    probe_steps: StrictInt = Field(ge=1, le=100_000)
    probe_lr: float = Field(gt=0, le=10)
    retrieval_k: StrictInt = Field(ge=1)
    ridge: float = Field(gt=0, le=100)


class VLMProxyConfig(ProfileConfig):
    """A tiny GPT-2 answering 'which digit is in quadrant q' from k projected 1D tokens (report only)."""

    steps: StrictInt = Field(ge=1, le=100_000)
    batch_size: StrictInt = Field(ge=8, le=4096)
    lr: float = Field(gt=0, le=1)
    width: StrictInt = Field(ge=8, le=1024)
    layers: StrictInt = Field(ge=1, le=12)


class HubConfig(ProfileConfig):
    """Paper profile: the released checkpoint by hub name and an image-classification set for kNN vs k."""

    model: str
    dataset: str
    split: str
    n_images: StrictInt = Field(ge=10)
    image_size: StrictInt = Field(ge=16, le=2048)
    batch_size: StrictInt = Field(ge=1, le=4096)
    knn_k: StrictInt = Field(ge=1, le=1000)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"


class Radio1DConfig(PaperConfig):
    data: DataConfig | None = None
    teacher: TeacherConfig | None = None
    student: StudentConfig | None = None
    train: TrainConfig | None = None
    eval: EvalConfig
    vlm: VLMProxyConfig | None = None
    hub: HubConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> Radio1DConfig:
        toy = (self.data, self.teacher, self.student, self.train)
        if self.hub is None and any(part is None for part in toy):
            raise ValueError("data, teacher, student and train are required unless hub is set")
        if self.student is not None and self.train is not None and self.data is not None:
            k_max = (16 // (2 * self.student.patch_size)) ** 2
            for name, values in (("train.fixed_ks", self.train.fixed_ks), ("eval.ks", self.eval.ks)):
                if any(not 1 <= k <= k_max for k in values):
                    raise ValueError(f"{name} {values}: every k must be in [1, {k_max}] (merged tokens)")
            if not 1 <= self.eval.retrieval_k <= k_max:
                raise ValueError(f"eval.retrieval_k {self.eval.retrieval_k} must be in [1, {k_max}]")
            if self.train.sampler == "gaussian_mixture" and not self.train.modes:
                raise ValueError("train.modes: the gaussian_mixture sampler needs at least one mode")
        if list(self.eval.ks) != sorted(set(self.eval.ks)):
            raise ValueError(f"eval.ks {self.eval.ks} must be strictly increasing")
        return self


CONFIG = Radio1DConfig
