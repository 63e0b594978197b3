"""Parameters of one new_paper profile (the ``new_paper.<profile>`` section of params.yaml)."""

from __future__ import annotations

from pydantic import Field

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "new_paper: <paper title>"


class DataConfig(ProfileConfig):
    dim: int = Field(ge=1, le=4096)
    n_train: int = Field(ge=2, le=1_000_000)
    n_test: int = Field(ge=2, le=1_000_000)
    noise_sd: float = Field(gt=0, le=100)


class TrainConfig(ProfileConfig):
    steps: int = Field(ge=1, le=1_000_000)
    lr: float = Field(gt=0, le=10)
    ridge: float = Field(ge=0, le=1e6)


class NewPaperConfig(PaperConfig):
    data: DataConfig
    train: TrainConfig


CONFIG = NewPaperConfig
