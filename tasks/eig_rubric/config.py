"""Parameters of one eig_rubric profile (the ``eig_rubric.<profile>`` section of params.yaml).

smoke / cpu: ``world`` (the simulated items, human scores and question pool of simulator.py) and ``judge``
(rubric size, re-judgings, baselines). paper: ``hub`` (an open instruct model as question generator and evaluator
on MT-Bench human judgments, hub.py) with the same ``judge`` knobs.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "eig_rubric: Beyond Drift, EIG-selected rubrics for consistent subjective evaluation (reconstructed)"


class WorldConfig(ProfileConfig):
    """Simulated items with latent attributes z ~ N(0, I), a human score on a few relevant dimensions, and a pool
    of yes/no questions a_j = 1[z_{d_j} + eps > tau_j], eps ~ N(0, sigma_j^2) (simulator.py)."""

    n_items: int = Field(ge=20, le=1_000_000)
    n_calibration: int = Field(ge=10, description="labelled items that fit the likelihoods (variant A)")
    n_dims: int = Field(ge=2, le=64)
    n_relevant: int = Field(ge=1, description="dimensions the human score weighs; the others are irrelevant")
    n_levels: int = Field(ge=2, le=10, description="human score levels K (quantile bins)")
    human_noise_sd: float = Field(ge=0, le=10)
    questions_per_dim: int = Field(ge=1, le=64)
    thresholds: list[float] = Field(min_length=1, description="tau grid a question's threshold is drawn from")
    noise_levels: list[float] = Field(min_length=1, description="sigma grid a question's answer noise is drawn from")

    @model_validator(mode="after")
    def _consistent(self) -> WorldConfig:
        if self.n_relevant >= self.n_dims:
            raise ValueError(f"n_relevant ({self.n_relevant}) must be < n_dims ({self.n_dims}): the pool needs "
                             "irrelevant dimensions")
        if self.n_calibration > self.n_items - 20:
            raise ValueError(f"n_calibration ({self.n_calibration}) must leave >= 20 evaluation items of "
                             f"n_items ({self.n_items})")
        if any(s <= 0 for s in self.noise_levels):
            raise ValueError("noise_levels must be > 0")
        return self


class JudgeConfig(ProfileConfig):
    """Rubric size, the stopping threshold, re-judgings and the baselines' knobs. ``fixed_noise_sd`` and the
    ``cot_*`` knobs shape the simulated baselines only; at the paper profile the LLM answers and reasons itself."""

    k: int = Field(ge=1, le=16, description="questions per rubric in the decisive comparison (equal k)")
    k_sweep_max: int = Field(ge=1, le=16, description="the figure sweeps k = 1..k_sweep_max")
    epsilon: float = Field(ge=0, le=1, description="stop when the best conditional EIG (nats) is below it")
    n_rejudgings: int = Field(ge=2, le=100, description="R re-judgings of each item (test-retest)")
    n_random_draws: int = Field(ge=1, le=1000, description="random-k rubrics averaged per seed")
    fixed_noise_sd: float = Field(gt=0, le=10, description="answer noise of the fixed questionnaire's questions")
    cot_noise_sd: float = Field(ge=0, le=10, description="noise of the chain-of-thought judge's raw score")
    cot_relevant_picked: int = Field(ge=1, description="relevant dimensions a CoT judging attends to")
    cot_irrelevant_weight: float = Field(ge=0, le=10, description="total weight drift puts on irrelevant dims")

    @model_validator(mode="after")
    def _consistent(self) -> JudgeConfig:
        if self.k > self.k_sweep_max:
            raise ValueError(f"k ({self.k}) must be <= k_sweep_max ({self.k_sweep_max})")
        return self


class HubConfig(ProfileConfig):
    """Paper profile: an open instruct model through ``LLMPolicy`` (in process, or a local OpenAI-compatible
    server at ``server_url``) on MT-Bench human judgments (hub.py)."""

    evaluator_model: str = Field(min_length=1)
    server_url: str | None = None
    dataset: str = Field(min_length=1)
    split: str = Field(min_length=1)
    n_items: int = Field(ge=20, le=100_000)
    n_calibration: int = Field(ge=10)
    pool_size: int = Field(ge=2, le=200, description="questions the model generates per task")
    temperature: float = Field(ge=0, le=2, description="sampling temperature of every judging (R re-judgings)")
    max_new_tokens: int = Field(ge=1, le=8192)
    dtype: str = Field(default="bfloat16", pattern="^(float32|float16|bfloat16)$")

    @model_validator(mode="after")
    def _calibration_leaves_items(self) -> HubConfig:
        if self.n_calibration > self.n_items - 20:
            raise ValueError(f"n_calibration ({self.n_calibration}) must leave >= 20 evaluation items of "
                             f"n_items ({self.n_items})")
        return self


class EigRubricConfig(PaperConfig):
    world: WorldConfig | None = None
    hub: HubConfig | None = None
    judge: JudgeConfig

    @model_validator(mode="after")
    def _one_source(self) -> EigRubricConfig:
        if (self.world is None) == (self.hub is None):
            raise ValueError("give exactly one of 'world' (simulated, smoke/cpu) and 'hub' (paper profile)")
        if self.world is not None:
            if self.judge.cot_relevant_picked > self.world.n_relevant:
                raise ValueError(f"judge.cot_relevant_picked ({self.judge.cot_relevant_picked}) must be <= "
                                 f"world.n_relevant ({self.world.n_relevant})")
            if self.judge.k_sweep_max > self.world.n_dims * self.world.questions_per_dim:
                raise ValueError("judge.k_sweep_max exceeds the question pool size")
        return self


CONFIG = EigRubricConfig
