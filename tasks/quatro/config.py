"""Parameters of one quatro profile (the ``quatro.<profile>`` section of params.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "quatro: QUATRO, query-adaptive trust-region policy optimisation (reconstructed)"

Algorithm = Literal["grpo", "gspo", "reinforce_is", "quatro", "quatro_rho_log_rho"]


class TaskConfig(ProfileConfig):
    """Sum-to-target: the prompt is a target T in [min_target, max_target]; reward 1 iff n_digits digits sum to T."""

    min_target: StrictInt = Field(ge=0, le=81)
    max_target: StrictInt = Field(ge=0, le=81)  # two decimal digits in the prompt
    n_digits: StrictInt = Field(ge=1, le=9)

    @model_validator(mode="after")
    def _range(self) -> TaskConfig:
        if not self.min_target < self.max_target <= 9 * self.n_digits:
            raise ValueError("need min_target < max_target <= 9 * n_digits")
        return self


class PolicyConfig(ProfileConfig):
    """Tiny GPT-2 policy and its supervised warm start on uniformly random digit strings."""

    n_layer: StrictInt = Field(ge=1, le=12)
    n_head: StrictInt = Field(ge=1, le=16)
    n_embd: StrictInt = Field(ge=8, le=1024)
    sft_steps: StrictInt = Field(ge=1, le=100_000)
    sft_batch: StrictInt = Field(ge=1, le=4096)
    sft_lr: float = Field(gt=0, le=1)


class RLConfig(ProfileConfig):
    """The staleness x learning-rate grid and the four policy losses."""

    steps: StrictInt = Field(ge=1, le=100_000)
    prompts_per_step: StrictInt = Field(ge=1, le=4096)
    group_size: StrictInt = Field(ge=2, le=256)
    cells: list[tuple[StrictInt, float]] = Field(min_length=1)  # (update epochs per rollout batch mu, learning rate)
    rollout_lag: StrictInt = Field(ge=0, le=64)            # behaviour policy this many updates behind (stale cells)
    algorithms: list[Algorithm] = Field(min_length=1)
    # the algorithms also run in on-policy cells (mu = 1); None: all of them. On-policy with equal response lengths
    # GSPO equals GRPO (tests/unit/test_quatro_steps.py), so running it there adds nothing
    on_policy_algorithms: list[Algorithm] | None = None
    clip_eps: float = Field(gt=0, lt=1)                    # GRPO's clip range and the "outside clip" statistic
    delta: float = Field(gt=0, le=10)                      # QUATRO's per-query KL bound (nats per sequence)
    level: Literal["sequence", "token"]
    dual_mode: Literal["bisection", "ascent"]
    dual_step_size: float = Field(gt=0, le=100)            # eta of dual ascent (dual_mode: ascent)
    lam_min: float = Field(gt=0, le=1)
    max_grad_norm: float = Field(gt=0, le=1000)

    @model_validator(mode="after")
    def _grid(self) -> RLConfig:
        if any(e < 1 or not 0 < lr <= 1 for e, lr in self.cells):
            raise ValueError("cells: epochs must be >= 1 and learning rates in (0, 1]")
        if len(set(self.cells)) != len(self.cells):
            raise ValueError("cells must be distinct")
        if len(set(self.algorithms)) != len(self.algorithms):
            raise ValueError("algorithms must be distinct")
        if self.on_policy_algorithms is not None and not set(self.on_policy_algorithms) <= set(self.algorithms):
            raise ValueError("on_policy_algorithms must be a subset of algorithms")
        return self


class EvalConfig(ProfileConfig):
    samples_per_prompt: StrictInt = Field(ge=1, le=4096)
    ks: list[StrictInt] = Field(min_length=1)

    @model_validator(mode="after")
    def _ks(self) -> EvalConfig:
        if any(not 1 <= k <= self.samples_per_prompt for k in self.ks):
            raise ValueError("every k must be in [1, samples_per_prompt]")
        return self


class HubConfig(ProfileConfig):
    """The paper profile: a Hugging Face policy and math datasets (tasks/quatro/hub.py)."""

    model: str
    train_dataset: str
    eval_datasets: list[str] = Field(min_length=1)
    max_new_tokens: StrictInt = Field(ge=1, le=32768)
    max_prompts: StrictInt = Field(ge=1, le=1_000_000)


class QuatroConfig(PaperConfig):
    task: TaskConfig
    policy: PolicyConfig
    rl: RLConfig
    eval: EvalConfig
    hub: HubConfig | None = None


CONFIG = QuatroConfig
