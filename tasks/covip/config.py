"""Parameters of one covip profile (the ``covip.<profile>`` section of params.yaml)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "covip: contextualized visual personalization (RL-trained personalized captioning)"


class DataConfig(ProfileConfig):
    """Procedural sprite episodes: K context identities with re-bound facts, a 2x2 query grid."""

    n_context: StrictInt = Field(ge=3, le=6)
    max_present: StrictInt = Field(ge=1, le=3)
    n_train: StrictInt = Field(ge=16, le=200_000)
    n_test: StrictInt = Field(ge=16, le=20_000)
    n_names: StrictInt = Field(ge=6, le=200)
    n_places: StrictInt = Field(ge=6, le=200)
    n_events: StrictInt = Field(ge=6, le=200)
    jitter: StrictInt = Field(ge=0, le=2)
    noise_sd: float = Field(ge=0, le=0.5)

    @model_validator(mode="after")
    def _check(self) -> DataConfig:
        if self.max_present >= self.n_context:
            raise ValueError(f"max_present {self.max_present} must be < n_context {self.n_context} (absent QAs needed)")
        if self.max_present + 1 > 4:
            raise ValueError("the 2x2 query grid holds at most 3 present concepts plus the distractor")
        if min(self.n_names, self.n_places, self.n_events) < self.n_context:
            raise ValueError("each fact vocabulary needs at least n_context entries (facts are distinct per episode)")
        return self


class ModelConfig(ProfileConfig):
    """Tiny VLM (tasks/common/tiny_vlm.py): one ViT token per 16x16 cell feeding GPT-2 via inputs_embeds."""

    encoder_width: StrictInt = Field(ge=8, le=512)
    encoder_depth: StrictInt = Field(ge=1, le=8)
    lm_width: StrictInt = Field(ge=8, le=1024)
    lm_depth: StrictInt = Field(ge=1, le=12)
    lm_heads: StrictInt = Field(ge=1, le=16)
    ground_dialogue: bool = False

    @model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.encoder_width % 4 or self.lm_width % self.lm_heads:
            raise ValueError("encoder_width must be a multiple of 4 and lm_width a multiple of lm_heads")
        return self


class SFTConfig(ProfileConfig):
    """Stage A: teacher-forced captions, stopped early at a validation GT-QA accuracy (a weak base)."""

    max_steps: StrictInt = Field(ge=1, le=100_000)
    batch_size: StrictInt = Field(ge=2, le=1024)
    lr: float = Field(gt=0, le=1)
    stop_gt_acc: float = Field(gt=0, le=1)
    check_every: StrictInt = Field(ge=1, le=10_000)
    n_val: StrictInt = Field(ge=8, le=5000)
    extra_steps: StrictInt = Field(ge=0, le=100_000)
    # "warmup_cosine": linear warm-up over 5% of max_steps, then cosine decay to 0 at max_steps
    # (tasks/common/schedules.py); "constant": a flat lr.
    schedule: Literal["constant", "warmup_cosine"] = "constant"


class GRPOConfig(ProfileConfig):
    """Stage B: group-relative RL on the caption reward, no reference captions."""

    steps: StrictInt = Field(ge=1, le=100_000)
    prompts_per_step: StrictInt = Field(ge=1, le=512)
    group_size: StrictInt = Field(ge=2, le=64)
    temperature: float = Field(gt=0, le=5)
    lr: float = Field(gt=0, le=1)
    loss: Literal["grpo", "gspo"]
    clip_low: float = Field(gt=0, lt=1)
    clip_high: float = Field(gt=0, lt=1)
    beta: float = Field(ge=0, le=10)
    adv_eps: float = Field(gt=0, le=1)


class RewardConfig(ProfileConfig):
    """Caption reward: the length limit and repetition detector of the official code, scaled to toy captions."""

    length_limit: StrictInt = Field(ge=4, le=4096)
    min_sentences: StrictInt = Field(ge=2, le=100)
    ngram_n: StrictInt = Field(ge=2, le=20)


class EvalConfig(ProfileConfig):
    n_episodes: StrictInt = Field(ge=16, le=20_000)
    batch_size: StrictInt = Field(ge=1, le=4096)


class HubConfig(ProfileConfig):
    """Paper profile: the real policy, judge and benchmark by hub name (tasks/covip/hub.py)."""

    policy_model: str
    judge_model: str
    judge_base_url: str
    dataset: str
    downstream_datasets: tuple[str, ...]
    lora_r: StrictInt = Field(ge=1, le=1024)
    lora_alpha: StrictInt = Field(ge=1, le=4096)
    lora_dropout: float = Field(ge=0, lt=1)
    generations: StrictInt = Field(ge=2, le=64)
    max_completion_tokens: StrictInt = Field(ge=16, le=8192)
    judge_temperature: float = Field(ge=0, le=2)
    judge_top_p: float = Field(gt=0, le=1)
    judge_top_k: StrictInt = Field(ge=1, le=1000)


class CovipConfig(PaperConfig):
    data: DataConfig | None = None
    model: ModelConfig | None = None
    sft: SFTConfig | None = None
    grpo: GRPOConfig | None = None
    reward: RewardConfig
    eval: EvalConfig | None = None
    hub: HubConfig | None = None

    @model_validator(mode="after")
    def _check(self) -> CovipConfig:
        toy = (self.data, self.model, self.sft, self.grpo, self.eval)
        if self.hub is None and any(part is None for part in toy):
            raise ValueError("a profile without hub needs data, model, sft, grpo and eval")
        if self.data is not None and self.reward.length_limit < 4 * self.data.max_present:
            raise ValueError(f"reward.length_limit {self.reward.length_limit} is below a correct caption's "
                             f"length 4 * max_present = {4 * self.data.max_present}")
        return self


CONFIG = CovipConfig
