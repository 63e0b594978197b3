"""Parameters of one coda profile (the ``coda.<profile>`` section of params.yaml)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "coda: Continuous-depth acceleration (GRU + one linear ODE + dense), reconstructed"

TASKS = ("lotka_volterra", "lorenz", "van_der_pol", "glucose_insulin", "oscillator_regimes", "occupancy")
BASELINES = ("cfc", "odernn", "gru")
MODEL_KINDS = ("ltc", "coda", "gru_dense", *BASELINES)  # every model kind trained from scratch (model.build_layer)


def _known_tasks(values: list[str]) -> list[str]:
    unknown = [v for v in values if v not in TASKS]
    if unknown:
        raise ValueError(f"unknown task(s) {unknown} (known: {', '.join(TASKS)})")
    if len(set(values)) != len(values):
        raise ValueError(f"tasks must be distinct, got {values}")
    return values


class DataConfig(ProfileConfig):
    """Six procedural, irregularly sampled stand-ins for the LTC applications (README, "Data")."""

    tasks: list[str] = Field(min_length=1)
    n_train: int = Field(ge=16)
    n_val: int = Field(ge=8, description="validation sequences (early stopping, convergence check)")
    n_test: int = Field(ge=16)
    seq_len: int = Field(ge=4, le=1000)
    dt_low: float = Field(default=0.05, gt=0)
    dt_high: float = Field(default=0.15, gt=0)
    dt_resolution: float = Field(default=1e-3, gt=0, description="timestamps are logged on this grid")
    noise: float = Field(default=0.02, ge=0, description="observation noise, in units of the signal scale")
    forecast_horizon: int = Field(default=10, ge=1, description="Lorenz: free-run steps scored at the end")

    @field_validator("tasks")
    @classmethod
    def _tasks(cls, values: list[str]) -> list[str]:
        return _known_tasks(values)

    @model_validator(mode="after")
    def _consistent(self) -> DataConfig:
        if self.dt_low >= self.dt_high:
            raise ValueError(f"dt_low ({self.dt_low}) must be < dt_high ({self.dt_high})")
        if self.dt_resolution > self.dt_high - self.dt_low:
            raise ValueError(f"dt_resolution ({self.dt_resolution}) must be <= dt_high - dt_low")
        if self.forecast_horizon >= self.seq_len - 1:
            raise ValueError(f"forecast_horizon ({self.forecast_horizon}) must be < seq_len - 1 ({self.seq_len - 1})")
        return self


class ModelConfig(ProfileConfig):
    """Sizes of every model (README, "Method": LTC 32 units and 6 unfolds, CoDA r = 8, a compact GRU)."""

    ltc_units: int = Field(default=32, ge=2)
    ode_unfolds: int = Field(default=6, ge=1)
    coda_gru_hidden: int = Field(default=16, ge=2)
    coda_rank: int = Field(default=8, ge=1)
    coda_eps: float = Field(default=1e-2, gt=0, description="stability margin: max Re eig(K) <= -eps")
    baseline_hidden: int = Field(default=32, ge=2, description="hidden size of CfC, ODE-RNN and GRU")
    odernn_rk4_steps: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _low_dimensional(self) -> ModelConfig:
        if self.coda_rank >= self.ltc_units:
            raise ValueError(f"coda_rank ({self.coda_rank}) must be < ltc_units ({self.ltc_units}): r << N")
        return self


class TrainConfig(ProfileConfig):
    """Adam with early stopping on the validation split (README, "Training"): from epoch ``min_epochs`` on,
    training stops once ``patience`` epochs in a row have not lowered the validation loss below
    ``(1 - min_rel_improvement)`` x the last improving epoch's, or at ``max_epochs``; the model of the best
    validation loss is kept. A model has converged when it stopped by the rule (its validation loss stayed within
    ``min_rel_improvement`` of its own best for ``patience`` epochs), ran at least ``min_epochs`` epochs and its
    best validation loss is at least ``min_initial_drop`` below its first epoch's (it left the initial plateau);
    one stopped by ``max_epochs`` while still improving has not."""

    max_epochs: int = Field(ge=1)
    patience: int = Field(ge=1)
    min_rel_improvement: float = Field(default=0.01, ge=0, lt=1)
    min_epochs: int = Field(default=1, ge=1, description="warm-up: early stopping cannot fire before this epoch, so "
                                                         "a model is not stopped on its initial plateau")
    min_initial_drop: float = Field(default=0.0, ge=0, lt=1, description="converged also needs the best validation "
                                    "loss <= (1 - this) x the first epoch's: a model that never left its initial "
                                    "plateau has not converged")
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0, le=1.0, description="Adam's learning rate of every model kind not in lr_by_model")
    lr_by_model: dict[str, float] = Field(default={}, description="per model kind (ltc, coda, gru_dense, cfc, "
                                          "odernn, gru), chosen on a validation split (README, 'Learning rates')")
    grad_clip: float = Field(default=1.0, gt=0)

    @field_validator("lr_by_model")
    @classmethod
    def _known_kinds(cls, values: dict[str, float]) -> dict[str, float]:
        unknown = [k for k in values if k not in MODEL_KINDS]
        if unknown:
            raise ValueError(f"lr_by_model: unknown model kind(s) {unknown} (known: {', '.join(MODEL_KINDS)})")
        bad = {k: v for k, v in values.items() if not 0 < v <= 1.0}
        if bad:
            raise ValueError(f"lr_by_model: learning rates must be in (0, 1], got {bad}")
        return values

    @model_validator(mode="after")
    def _patience_fits(self) -> TrainConfig:
        if self.patience >= self.max_epochs:
            raise ValueError(f"patience ({self.patience}) must be < max_epochs ({self.max_epochs}): "
                             "otherwise no model can stop by the rule, so none can be shown converged")
        if self.min_epochs >= self.max_epochs:
            raise ValueError(f"min_epochs ({self.min_epochs}) must be < max_epochs ({self.max_epochs}): "
                             "otherwise early stopping can never fire")
        return self

    def lr_for(self, kind: str) -> float:
        """Adam's learning rate of one model kind: its ``lr_by_model`` entry, else ``lr``."""
        return self.lr_by_model.get(kind, self.lr)


class StudyConfig(ProfileConfig):
    """Which comparisons run, and the parity tolerances of claims C3a-e (README, "Claims")."""

    baselines: list[str] = Field(default=list(BASELINES))
    ablation: bool = Field(default=True, description="train CoDA without its linear ODE (GRU + dense, matched "
                                                      "parameter count) on every task")
    two_layer_tasks: list[str] = Field(default=[], description="tasks also run with 2-layer LTC and CoDA stacks")
    cost_tasks: list[str] = Field(default=[], description="tasks whose 1- and 2-layer LTC and CoDA are costed "
                                                          "(FLOPs, paired timings) untrained, for claim C3c")
    convert_tasks: list[str] = Field(default=[], description="tasks where a trained LTC is converted to CoDA")
    distill_epochs: int = Field(default=5, ge=1)
    finetune_max_epochs: int = Field(default=5, ge=2, description="cap of the early-stopped fine-tuning")
    parity_mse_ratio: float = Field(default=1.1, ge=1.0, description="CoDA MSE <= this x LTC MSE is parity")
    parity_accuracy_points: float = Field(default=2.0, ge=0, description="CoDA accuracy >= LTC's - this")
    timing_batch: int = Field(default=256, ge=1, description="inference timing batch (reported, not asserted)")
    timing_repeats: int = Field(default=3, ge=1)

    @field_validator("baselines")
    @classmethod
    def _known_baselines(cls, values: list[str]) -> list[str]:
        unknown = [v for v in values if v not in BASELINES]
        if unknown:
            raise ValueError(f"unknown baseline(s) {unknown} (known: {', '.join(BASELINES)})")
        return values

    @field_validator("two_layer_tasks", "convert_tasks", "cost_tasks")
    @classmethod
    def _study_tasks(cls, values: list[str]) -> list[str]:
        return _known_tasks(values)


class LfmConfig(ProfileConfig):
    """Paper profile: replace the gated short-convolution operators of an LFM2 checkpoint by CoDA mixers."""

    model: str = Field(min_length=1, description="e.g. LiquidAI/LFM2-1.2B")
    dataset: str = Field(default="Salesforce/wikitext", min_length=1)
    dataset_config: str | None = Field(default="wikitext-103-raw-v1")
    train_split: str = Field(default="train", min_length=1)
    eval_split: str = Field(default="validation", min_length=1)
    n_train_texts: int = Field(ge=1)
    n_eval_texts: int = Field(ge=1)
    seq_len: int = Field(ge=8)
    batch_size: int = Field(ge=1)
    distill_steps: int = Field(ge=0)
    finetune_steps: int = Field(ge=0)
    lr: float = Field(default=1e-4, gt=0)
    gru_hidden: int = Field(default=256, ge=1)
    rank: int = Field(default=32, ge=1)
    timing_steps: int = Field(default=5, ge=1)
    dtype: str = Field(default="bfloat16", pattern="^(float32|bfloat16|float16)$")


class CodaConfig(PaperConfig):
    """smoke / cpu: the six synthetic tasks; paper: the same at the reconstruction's full sizes plus ``lfm``."""

    data: DataConfig
    model: ModelConfig = ModelConfig()
    train: TrainConfig
    study: StudyConfig = StudyConfig()
    lfm: LfmConfig | None = None

    @model_validator(mode="after")
    def _study_tasks_are_run(self) -> CodaConfig:
        for key in ("two_layer_tasks", "convert_tasks", "cost_tasks"):
            missing = [t for t in getattr(self.study, key) if t not in self.data.tasks]
            if missing:
                raise ValueError(f"study.{key}: {missing} not in data.tasks ({self.data.tasks})")
        return self


CONFIG = CodaConfig
