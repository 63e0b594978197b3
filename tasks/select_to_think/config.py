"""Parameters of one select_to_think profile (the ``select_to_think.<profile>`` section of params.yaml).

smoke / cpu: ``data`` (procedural addition), ``llm`` and ``slm`` (tiny GPT-2s trained from scratch).
paper: ``hub`` (the Qwen2.5 pair and the MATH / GSM8K loaders). ``s2t`` and ``local`` hold the
method's hyperparameters (official code's values at the paper profile).
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "select_to_think: Select to Think, local sufficiency of a small model's top-K"

BASE_VOCAB = 14  # tasks.select_to_think.data.BASE_VOCAB: digits, '+', '=', 'A', '<eos>'


class AdditionDataConfig(ProfileConfig):
    """Procedural multi-digit addition with a written chain of thought (data.py)."""

    min_digits: int = Field(ge=1, le=6)
    max_digits: int = Field(ge=1, le=6, description="operands are zero-padded to this width")
    n_train: int = Field(ge=100)
    n_calibration: int = Field(ge=10, description="trigger calibration and the SLM's stopping check")
    n_collection: int = Field(ge=10, description="problems on which S2T-Local groups are collected")
    n_test: int = Field(ge=10)

    @model_validator(mode="after")
    def _digit_range(self) -> AdditionDataConfig:
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits ({self.min_digits}) must be <= max_digits ({self.max_digits})")
        return self


class TinyLMConfig(ProfileConfig):
    """A tiny GPT-2 trained from scratch with AdamW (loss on the generated part only).

    ``target_accuracy``: stop as soon as greedy accuracy on the calibration problems reaches it
    (checked every ``check_every`` steps, constant learning rate after warm-up) - how the weak SLM of the cpu
    profile ("about 50-70%", README) is obtained reproducibly. ``None``: a fixed number of steps with a cosine
    decay."""

    n_layer: int = Field(ge=1)
    n_head: int = Field(ge=1)
    n_embd: int = Field(ge=4)
    steps: int = Field(ge=1, description="maximum number of AdamW steps")
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0, le=1.0)
    target_accuracy: float | None = Field(default=None, gt=0, le=1)
    check_every: int = Field(default=25, ge=1)

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyLMConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self


class S2TConfig(ProfileConfig):
    """Triggers and candidate sets (official code: top-64 support, quantile 0.99, K 8 / 16, 3 warm-up steps)."""

    support_size: int = Field(default=64, ge=2, description="KL / entropy are computed on the SLM's top-S")
    quantile: float = Field(gt=0, lt=1, description="trigger when the score exceeds this calibration quantile")
    warmup_steps: int = Field(default=3, ge=0, description="no trigger in the first generated steps")
    k_eval: int = Field(default=8, ge=1)
    k_collect: int = Field(default=16, ge=2)
    hit_ks: list[int] = Field(default=[1, 2, 4, 8], min_length=1)
    ratio_to_max: float | None = Field(default=None, gt=0, lt=1,
                                       description="S2T candidates p > r * p_max instead of the top-k_eval "
                                                   "(official alternative, r = 0.1); None: top-k_eval")
    maj_samples: int = Field(default=8, ge=1)
    maj_temperature: float = Field(default=0.7, gt=0)

    @field_validator("hit_ks")
    @classmethod
    def _increasing(cls, values: list[int]) -> list[int]:
        if any(k < 1 for k in values) or any(a >= b for a, b in zip(values, values[1:])):
            raise ValueError("must be positive and strictly increasing")
        return values


class LocalConfig(ProfileConfig):
    """S2T-Local: reserved score bins in the SLM's output layer and the four-part loss."""

    n_bins: int = Field(default=16, ge=2)
    epochs: int = Field(ge=1)
    batch_groups: int = Field(ge=1, description="candidate groups per AdamW step")
    lr: float = Field(gt=0, le=1.0)
    weight_decay: float = Field(default=0.01, ge=0, description="body only: lm_head gets 0 (acceptance a3)")
    kl_weight: float = Field(default=0.1, ge=0, description="loss (iii): KL(teacher on candidates || softmax(scores))")
    frozen_kl_weight: float = Field(default=0.1, ge=0, description="loss (iv): token KL to the frozen SLM")
    hinge_margin: float = Field(default=1.0, gt=0)
    max_groups: int | None = Field(default=None, ge=1, description="cap on collected groups used for training")
    frozen_body_lr: float | None = Field(default=None, gt=0, le=1.0,
                                         description="also train S2T-Local with the body frozen (only the reserved "
                                                     "rows, a linear read-out) at this rate, beside full "
                                                     "fine-tuning (C5b / C6b); None: not run")


class HubConfig(ProfileConfig):
    """Paper profile: a pair of causal LMs by hub name and the math datasets (official code's loaders)."""

    slm: str = Field(min_length=1)
    llm: str = Field(min_length=1)
    collect_dataset: str = Field(default="EleutherAI/hendrycks_math", min_length=1)
    collect_config: str | None = "algebra"
    collect_split: str = "train"
    n_collect: int = Field(ge=1)
    eval_dataset: str = Field(default="openai/gsm8k", min_length=1)
    eval_config: str | None = "main"
    eval_split: str = "test"
    n_eval: int = Field(ge=1)
    n_calibration: int = Field(default=20, ge=1)
    max_new_tokens: int = Field(ge=1)
    max_prefix_tokens: int = Field(default=512, ge=8)
    dtype: str = Field(default="bfloat16", pattern="^(float32|float16|bfloat16)$")


class SelectToThinkConfig(PaperConfig):
    data: AdditionDataConfig | None = None
    llm: TinyLMConfig | None = None
    slm: TinyLMConfig | None = None
    hub: HubConfig | None = None
    s2t: S2TConfig
    local: LocalConfig

    @model_validator(mode="after")
    def _one_model_source(self) -> SelectToThinkConfig:
        tiny = (self.data, self.llm, self.slm)
        if self.hub is None and any(part is None for part in tiny):
            raise ValueError("without 'hub', 'data', 'llm' and 'slm' are all required (the tiny GPT-2 pair)")
        if self.hub is not None and any(part is not None for part in tiny):
            raise ValueError("'hub' (paper profile) excludes 'data', 'llm' and 'slm'")
        if self.hub is None:
            if self.s2t.k_collect > BASE_VOCAB or self.s2t.k_eval > BASE_VOCAB:
                raise ValueError(f"s2t.k_eval / s2t.k_collect must be <= the addition vocabulary ({BASE_VOCAB})")
            if self.s2t.hit_ks[-1] > BASE_VOCAB:
                raise ValueError(f"s2t.hit_ks must be <= the addition vocabulary ({BASE_VOCAB})")
        if self.s2t.k_eval > self.s2t.k_collect:
            raise ValueError(f"s2t.k_eval ({self.s2t.k_eval}) must be <= s2t.k_collect ({self.s2t.k_collect})")
        return self


CONFIG = SelectToThinkConfig
