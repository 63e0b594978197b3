"""Parameters of one order_sensitivity profile (the ``order_sensitivity.<profile>`` section of params.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "order_sensitivity: Predictable Compression Failures (order sensitivity, information budgeting)"


class ProceduralDataConfig(ProfileConfig):
    """Evidence/claim items over a procedural vocabulary (entities, attributes, values).

    A chunk is the triple ``(e, a, v)`` (one position of the model), the claim ``(e*, a*, v*)`` the last
    position, where the label is read. Relevant chunks share (e*, a*) and support (v = v*) or refute
    (v != v*) the claim; the other chunks are distractors about other entities. Control items have no relevant chunk.
    """

    n_entities: int = Field(default=40, ge=2, le=500)
    n_attributes: int = Field(default=8, ge=1, le=100)
    n_values: int = Field(default=12, ge=2, le=100)
    relevant_min: int = Field(default=1, ge=1)
    relevant_max: int = Field(default=3, ge=1)
    control_fraction: float = Field(default=0.25, ge=0, lt=1, description="items with no relevant chunk")
    train_n_min: int = Field(default=2, ge=1)
    train_n_max: int = Field(default=24, ge=1)
    n_train: int = Field(ge=64, description="training pool (batches are drawn from it per chunk count)")
    n_val: int = Field(ge=16, description="validation items for temperature calibration")
    primacy_fraction: float = Field(default=0.7, ge=0, le=1, description=(
        "training items whose relevant chunks sit in the first third (the primacy-bias knob: it sets "
        "the size of the dispersion)"))
    masked_train_fraction: float = Field(default=0.1, ge=0, lt=1, description=(
        "training items whose chunk values are ALL masked, with a random label: they teach the tiny model "
        "what a skeleton (evidence erased) means [project design]"))
    test_n: list[int] = Field(min_length=2, description="chunk counts of the test items")
    test_items_per_n: int = Field(ge=4)
    dose_chunks: int = Field(default=4, ge=2, description="L: chunks of a dose-study item")
    dose_items_per_level: int = Field(ge=2, description="items per dose d = 0..L-1 supporting chunks")

    @field_validator("test_n")
    @classmethod
    def _test_n(cls, values: list[int]) -> list[int]:
        if any(n < 1 for n in values) or any(a >= b for a, b in zip(values, values[1:])):
            raise ValueError("must be strictly increasing chunk counts >= 1")
        return values

    @model_validator(mode="after")
    def _consistent(self) -> ProceduralDataConfig:
        if self.relevant_min > self.relevant_max:
            raise ValueError(f"relevant_min ({self.relevant_min}) must be <= relevant_max ({self.relevant_max})")
        if self.train_n_min > self.train_n_max:
            raise ValueError(f"train_n_min ({self.train_n_min}) must be <= train_n_max ({self.train_n_max})")
        if self.test_n[-1] > self.train_n_max:
            raise ValueError(f"test_n: the largest test chunk count ({self.test_n[-1]}) exceeds train_n_max "
                             f"({self.train_n_max}); positions beyond the trained chunk counts carry untrained "
                             f"position embeddings, so dispersion there measures initialisation, not order")
        if self.train_n_min < self.relevant_max or self.test_n[0] < self.relevant_max:
            raise ValueError(f"every item needs room for relevant_max ({self.relevant_max}) chunks: train_n_min "
                             f"and test_n must be >= it")
        return self

    @property
    def max_chunks(self) -> int:
        return max(self.train_n_max, self.test_n[-1], self.dose_chunks)


class TinyModelConfig(ProfileConfig):
    """The tiny GPT-2 (learned absolute positions) trained from scratch on the label token."""

    n_layer: int = Field(ge=1)
    n_head: int = Field(ge=1)
    n_embd: int = Field(ge=4)
    steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0, le=1.0)
    weight_decay: float = Field(default=0.01, ge=0)
    init_std: float = Field(default=0.02, gt=0, le=1, description="std of the initial weights (GPT-2: 0.02)")
    curriculum_fraction: float = Field(default=0.5, ge=0, le=1, description=(
        "the largest training chunk count ramps from train_n_min to train_n_max over this fraction of steps"))

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self


class EvaluationConfig(ProfileConfig):
    """Algorithm 1 and the measurements on the test and dose items."""

    permutations: int = Field(ge=2, description="m uniform permutations per item")
    skeletons: int = Field(ge=1, description=(
        "skeleton priors: the first k permutations with every chunk value masked (no gold relevance)"))
    h_star: float = Field(default=0.05, gt=0, lt=1, description="target hallucination rate of B2T")
    clip: float = Field(default=6.0, gt=0, description="B of the clipped information lift, nats")
    clip_mode: Literal["symmetric", "one_sided"] = Field(default="symmetric", description=(
        "paper: symmetric [-B, B]; official code: one-sided [0, B]"))
    margin: float = Field(default=0.0, ge=0, description="official code's option: also ask Delta_bar >= B2T + margin")
    bootstrap_resamples: int = Field(default=1000, ge=10)
    eg_steps: int = Field(default=200, ge=1)
    eg_lr: float = Field(default=0.5, gt=0)
    batch_size: int = Field(default=512, ge=1, description="sequences per forward pass")

    @model_validator(mode="after")
    def _skeletons_fit(self) -> EvaluationConfig:
        if self.skeletons > self.permutations:
            raise ValueError(f"skeletons ({self.skeletons}) must be <= permutations ({self.permutations})")
        return self


class TheoryConfig(ProfileConfig):
    """Per-seed Monte Carlo checks of the theorems (QMV on the first-order model, EDFL on random draws)."""

    qmv_n: list[int] = Field(default=[3, 4, 6, 8, 12, 16, 24, 32], min_length=1)
    qmv_draws: int = Field(default=5, ge=1, description="Dirichlet weight draws per n")
    qmv_permutations: int = Field(default=2000, ge=100)
    phi_scale: float = Field(default=1.0, gt=0, description="C of phi(r) = C ln r")
    edfl_draws: int = Field(default=2000, ge=1)

    @field_validator("qmv_n")
    @classmethod
    def _qmv_n(cls, values: list[int]) -> list[int]:
        if any(n < 2 for n in values):
            raise ValueError("every n must be >= 2")
        return values


class HubConfig(ProfileConfig):
    """Paper profile: a real instruction model scoring label-token probabilities on real evidence items."""

    model: str = Field(min_length=1, description="e.g. google/gemma-2-9b-it")
    dtype: str = Field(default="bfloat16", pattern="^(float32|float16|bfloat16)$")
    load_in_4bit: bool = Field(default=False, description="NF4 through bitsandbytes (GPU only)")
    fever_dataset: str = Field(default="copenlu/fever_gold_evidence", min_length=1)
    fever_split: str = Field(default="validation", min_length=1)
    hotpot_dataset: str = Field(default="hotpotqa/hotpot_qa", min_length=1)
    hotpot_config: str | None = Field(default="distractor", description="dataset config name (None: a local folder)")
    hotpot_split: str = Field(default="validation", min_length=1)
    items_per_source: int = Field(ge=2, description="items drawn from each source per seed")
    control_fraction: float = Field(default=0.25, ge=0, lt=1)
    max_chunks: int = Field(default=60, ge=3)
    max_chunk_words: int = Field(default=36, ge=4, description="a chunk is cut to this many words (~48 tokens)")


class OrderSensitivityConfig(PaperConfig):
    """smoke / cpu: ``data`` + ``model`` (a tiny GPT-2 trained per seed); paper: ``hub``."""

    data: ProceduralDataConfig | None = None
    model: TinyModelConfig | None = None
    hub: HubConfig | None = None
    evaluation: EvaluationConfig
    theory: TheoryConfig = TheoryConfig()

    @model_validator(mode="after")
    def _one_model_source(self) -> OrderSensitivityConfig:
        procedural = (self.data, self.model)
        if self.hub is None and any(part is None for part in procedural):
            raise ValueError("without 'hub', both 'data' and 'model' are required (the tiny GPT-2)")
        if self.hub is not None and any(part is not None for part in procedural):
            raise ValueError("'hub' (paper profile) excludes 'data' and 'model'")
        if self.hub is not None and self.evaluation.batch_size != 1:
            # The hub scorer reads one prompt at a time (no padding); a larger batch would be silently ignored.
            raise ValueError(f"evaluation.batch_size: batched hub scoring is not implemented (prompts are scored "
                             f"one at a time); set 1, got {self.evaluation.batch_size}")
        return self


CONFIG = OrderSensitivityConfig
