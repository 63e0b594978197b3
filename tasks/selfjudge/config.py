"""Parameters of one selfjudge profile (the ``selfjudge.<profile>`` section of params.yaml).

smoke / cpu: ``data`` (procedural word problems and object descriptions, data.py), ``target`` and ``draft``
(tiny GPT-2s trained from scratch). paper: ``hub`` (a Llama / Qwen draft-target pair and the benchmark
loaders by hub name, hub.py). ``mining``, ``head`` and ``decoding`` hold the method's hyperparameters.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "selfjudge: SelfJudge, self-supervised judge verification for speculative decoding"


class ToyDataConfig(ProfileConfig):
    """Procedural corpus (data.py): half arithmetic word problems, half object descriptions."""

    n_train: int = Field(ge=100, le=1_000_000, description="training sequences (both tasks)")
    n_mine: int = Field(ge=10, le=100_000, description="prompts per task mined for judge labels")
    n_autojudge: int = Field(ge=0, le=100_000, description="arithmetic prompts also labelled AutoJudge-style")
    n_eval: int = Field(ge=10, le=100_000, description="held-out prompts per task for decoding")
    min_steps: int = Field(default=2, ge=1, le=4)
    max_steps: int = Field(default=4, ge=1, le=4)

    @model_validator(mode="after")
    def _step_range(self) -> ToyDataConfig:
        if self.min_steps > self.max_steps:
            raise ValueError(f"min_steps ({self.min_steps}) must be <= max_steps ({self.max_steps})")
        if self.n_autojudge > self.n_mine:
            raise ValueError(f"n_autojudge ({self.n_autojudge}) must be <= n_mine ({self.n_mine})")
        return self


class TinyLMConfig(ProfileConfig):
    """A tiny GPT-2 trained from scratch (Adam, warm-up + cosine; tasks/common/tiny_lm.py)."""

    n_layer: int = Field(ge=1, le=48)
    n_head: int = Field(ge=1, le=64)
    n_embd: int = Field(ge=4, le=8192)
    steps: int = Field(ge=1, le=1_000_000)
    batch_size: int = Field(ge=1, le=4096)
    lr: float = Field(gt=0, le=1.0)

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyLMConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self


class MiningConfig(ProfileConfig):
    """Mismatch mining (method.mine_mismatches): window N of diff_N and the label quantile."""

    window: int = Field(ge=0, le=64, description="N of diff_N (official default 20; 5 on the short toy)")
    positive_quantile: float = Field(gt=0, lt=1, description="tau_N = this quantile of diff_N (0.6: 40% positives)")


class HeadConfig(ProfileConfig):
    """StandardScaler + LogisticRegression(C), C on the official grid (10^0.5)^-k, k = 0..c_grid_size-1."""

    c_grid_size: int = Field(default=10, ge=1, le=20)
    validation_fraction: float = Field(default=0.25, gt=0, lt=1)
    max_iter: int = Field(default=2000, ge=10, le=100_000)


class DecodingConfig(ProfileConfig):
    """Judge decoding (method.speculative_generate): window gamma, threshold sweep, top-K baselines."""

    gamma: int = Field(ge=1, le=64, description="draft tokens per window (official code 16)")
    max_new_tokens: int = Field(ge=1, le=4096)
    thresholds: list[float] = Field(min_length=2, description="head thresholds swept; 0 = exact decoding")
    decision_threshold: float = Field(gt=0, le=1, description="the pre-registered threshold the claims read")
    top_ks: list[int] = Field(min_length=1)

    @field_validator("thresholds")
    @classmethod
    def _thresholds(cls, values: list[float]) -> list[float]:
        if any(not 0 <= v <= 1 for v in values) or any(a >= b for a, b in zip(values, values[1:])):
            raise ValueError("must lie in [0, 1] and be strictly increasing")
        return values

    @field_validator("top_ks")
    @classmethod
    def _top_ks(cls, values: list[int]) -> list[int]:
        if any(k < 2 for k in values) or any(a >= b for a, b in zip(values, values[1:])):
            raise ValueError("must be >= 2 (K = 1 is exact decoding) and strictly increasing")
        return values

    @model_validator(mode="after")
    def _decision_in_sweep(self) -> DecodingConfig:
        if self.decision_threshold not in self.thresholds:
            raise ValueError(f"decision_threshold ({self.decision_threshold}) must be one of thresholds")
        return self


class HubConfig(ProfileConfig):
    """Paper profile: draft / target by hub name and the benchmarks (hub.py)."""

    draft: str
    target: str
    mine_datasets: list[str] = Field(min_length=1)
    eval_datasets: list[str] = Field(min_length=1)
    n_mine: int = Field(ge=1, le=100_000)
    n_eval: int = Field(ge=1, le=100_000)
    dtype: str = Field(default="bfloat16", pattern="^(float32|float16|bfloat16)$")


class SelfJudgeConfig(PaperConfig):
    data: ToyDataConfig | None = None
    target: TinyLMConfig | None = None
    draft: TinyLMConfig | None = None
    hub: HubConfig | None = None
    mining: MiningConfig
    head: HeadConfig = HeadConfig()
    decoding: DecodingConfig

    @model_validator(mode="after")
    def _toy_or_hub(self) -> SelfJudgeConfig:
        toy = (self.data, self.target, self.draft)
        if self.hub is None and any(part is None for part in toy):
            raise ValueError("a profile without 'hub' needs 'data', 'target' and 'draft'")
        if self.hub is not None and any(part is not None for part in toy):
            raise ValueError("'hub' excludes 'data', 'target' and 'draft' (the paper profile loads its pair)")
        return self


CONFIG = SelfJudgeConfig
