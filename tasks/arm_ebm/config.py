"""Parameters of one arm_ebm profile (the ``arm_ebm.<profile>`` section of params.yaml)."""

from __future__ import annotations

from pydantic import Field, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "arm_ebm: Autoregressive LMs are secretly EBMs"


class ToyConfig(ProfileConfig):
    """The enumerable target EBM (README, "Test bed"): R = sum_t a*score(y_t) + b*1[y_T=y_1] + c*1[sum y = x mod V]."""

    vocab_size: int = Field(ge=2, le=8)
    horizon: int = Field(ge=2, le=8)
    n_prompts: int = Field(ge=1, le=16)
    a: float = 1.0
    b: float = 4.0
    c: float = 4.0

    @model_validator(mode="after")
    def _enumerable(self) -> ToyConfig:
        if self.n_prompts * self.vocab_size**self.horizon > 2_000_000:
            raise ValueError("n_prompts * vocab_size**horizon must be <= 2e6 to enumerate")
        return self


class BoundConfig(ProfileConfig):
    """E4: perturb q* by Uniform[-eps, eps] and compare KL with the 2*T*eps bound."""

    eps: list[float] = Field(min_length=1)
    horizons: list[int] = Field(min_length=2)
    draws: int = Field(ge=1)
    vocab_size: int = Field(ge=2)
    n_prompts: int = Field(ge=1)

    @model_validator(mode="after")
    def _positive(self) -> BoundConfig:
        if any(e <= 0 for e in self.eps) or any(t < 1 for t in self.horizons):
            raise ValueError("eps must be > 0 and horizons >= 1")
        return self


class TinyGPT2Config(ProfileConfig):
    """The tiny GPT-2 ARM (vocabulary: V sequence tokens + one prompt token per prompt), trained on the
    population cross-entropy under p_R: prefixes sampled from p_R, the exact next-token law as the target."""

    n_layer: int = Field(ge=1)
    n_head: int = Field(ge=1)
    n_embd: int = Field(ge=4)
    steps: int = Field(ge=0, description="most Adam steps (0: no training); cosine decay over this many")
    batch_size: int = Field(ge=1, description="prefixes sampled from p_R per step")
    lr: float = Field(gt=0)
    warmup_steps: int = Field(default=100, ge=0, description="linear warm-up of the learning rate")
    init_std: float = Field(default=0.02, gt=0, description="GPT2Config.initializer_range (GPT-2's own is 0.02)")
    stop_kl: float | None = Field(
        default=None, gt=0,
        description="stop once the mean training KL estimate of the last `stop_window` steps is <= this "
                    "(converged to the entropy floor); None: always run `steps`")
    stop_window: int = Field(default=100, ge=1)

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyGPT2Config:
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        return self


class TabularConfig(ProfileConfig):
    """E3 (tabular): ARM logit tables vs an EBM energy table fitted to the same samples."""

    vocab_size: int = Field(ge=2)
    horizon: int = Field(ge=1)
    n_prompts: int = Field(ge=1)
    n_samples: int = Field(ge=10)
    steps: int = Field(ge=1)
    lr: float = Field(gt=0)


class NeuralEBMConfig(ProfileConfig):
    """E3 (neural): an MLP energy on one-hot (prompt, y), trained by exact-partition MLE (cosine decay)."""

    hidden: int = Field(ge=1)
    steps: int = Field(ge=0)
    lr: float = Field(gt=0)
    prompts_per_step: int | None = Field(
        default=None, ge=1, description="prompts per step, drawn without replacement (None: every prompt); "
                                        "each prompt's term keeps its exact partition")


class PaperProfileConfig(ProfileConfig):
    """Paper profile: the telescoping identity on a real Hugging Face causal LM."""

    hf_model: str = Field(min_length=1)
    prompts: list[str] = Field(min_length=1)
    new_tokens: int = Field(ge=1)
    samples_per_prompt: int = Field(ge=1)
    dtype: str = Field(pattern="^(float32|float64|bfloat16)$")


class ArmEbmConfig(PaperConfig):
    """One profile of arm_ebm: E1 and E4 always; the GPT-2 (E2, E4), tabular and neural EBM (E3) studies at
    smoke and cpu; the hub model (paper profile)."""

    toy: ToyConfig
    bound: BoundConfig
    gpt2: TinyGPT2Config | None = None
    tabular: TabularConfig | None = None
    neural_ebm: NeuralEBMConfig | None = None
    hub: PaperProfileConfig | None = None


CONFIG = ArmEbmConfig
