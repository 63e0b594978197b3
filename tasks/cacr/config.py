"""Parameters of one cacr profile (the ``cacr.<profile>`` section of params.yaml).

The method is reconstructed from the paper's abstract (VBCS candidates, a reasoning policy, a rejection reward,
GRPO); every size below is the project's choice, not the paper's.
"""

from __future__ import annotations

from pydantic import Field, StrictInt, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "cacr: candidate-aware causal reasoning for temporal answer grounding (reconstructed)"

# The pinned vocabulary of the procedural videos: an object is a coloured square, an action one of six motions.
OBJECTS = ("red", "green", "blue", "yellow", "magenta", "cyan")
ACTIONS = ("left", "right", "up", "down", "grow", "blink")
QUESTION_TYPES = ("direct", "after", "before", "ordinal")


class DataConfig(ProfileConfig):
    """Procedural step videos: ``frames`` frames of ``image_size``^2 pixels made of consecutive steps."""

    frames: StrictInt = Field(ge=16, le=256)
    image_size: StrictInt = Field(ge=8, le=64)
    min_steps: StrictInt = Field(ge=2, le=32)
    max_steps: StrictInt = Field(ge=2, le=32)
    min_step_len: StrictInt = Field(ge=1, le=64)
    max_step_len: StrictInt = Field(ge=1, le=64)
    objects_per_video: StrictInt = Field(ge=1, le=len(OBJECTS))   # a small palette makes steps repeat
    actions_per_video: StrictInt = Field(ge=1, le=len(ACTIONS))
    n_train_videos: StrictInt = Field(ge=4, le=100_000)
    n_test_videos: StrictInt = Field(ge=4, le=100_000)
    questions_per_video: StrictInt = Field(ge=1, le=8)

    @model_validator(mode="after")
    def _composable(self) -> DataConfig:
        if self.min_steps > self.max_steps or self.min_step_len > self.max_step_len:
            raise ValueError("need min_steps <= max_steps and min_step_len <= max_step_len")
        if not (self.min_steps * self.min_step_len <= self.frames <= self.max_steps * self.max_step_len):
            raise ValueError(f"frames {self.frames} cannot be split into {self.min_steps}-{self.max_steps} steps "
                             f"of {self.min_step_len}-{self.max_step_len} frames")
        if self.objects_per_video * self.actions_per_video < 2:
            raise ValueError("need at least two distinct (object, action) steps per video")
        return self


class VLPConfig(ProfileConfig):
    """The contrastive frame-pair / text encoder behind VBCS (trained, then frozen)."""

    width: StrictInt = Field(ge=4, le=512)           # CNN width (multiple of 4)
    embed_dim: StrictInt = Field(ge=4, le=512)
    steps: StrictInt = Field(ge=1, le=100_000)
    batch_size: StrictInt = Field(ge=2, le=8192)
    lr: float = Field(gt=0, le=1)
    temperature: float = Field(gt=0, le=10)

    @model_validator(mode="after")
    def _width(self) -> VLPConfig:
        if self.width % 4:
            raise ValueError(f"vlp.width {self.width} must be a multiple of 4")
        return self


class VBCSConfig(ProfileConfig):
    """Multi-scale sliding windows, temporal NMS, top-K (Method step 1, reconstructed)."""

    window_lengths: list[StrictInt] = Field(min_length=1)
    nms_threshold: float = Field(gt=0, le=1)
    top_k: StrictInt = Field(ge=1, le=32)


class PolicyConfig(ProfileConfig):
    """The reasoning policy (a small bidirectional transformer) and its supervised cold start."""

    width: StrictInt = Field(ge=8, le=1024)
    layers: StrictInt = Field(ge=1, le=12)
    heads: StrictInt = Field(ge=1, le=16)
    max_offset: StrictInt = Field(ge=0, le=16)        # boundary refinement in {-m, ..., m}
    sft_steps: StrictInt = Field(ge=1, le=100_000)
    dense_steps: StrictInt = Field(ge=1, le=100_000)   # the dense regressor's steps (more: a converged reference)
    batch_size: StrictInt = Field(ge=1, le=4096)
    lr: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _heads(self) -> PolicyConfig:
        if self.width % self.heads:
            raise ValueError(f"policy.width {self.width} must be a multiple of policy.heads {self.heads}")
        return self


class GRPOConfig(ProfileConfig):
    """Stage 2: GRPO with R = tIoU + alpha * 1[reject decision correct] (Method steps 3-4, reconstructed)."""

    steps: StrictInt = Field(ge=0, le=100_000)
    questions_per_step: StrictInt = Field(ge=1, le=4096)
    group_size: StrictInt = Field(ge=2, le=256)
    epochs_per_batch: StrictInt = Field(ge=1, le=16)
    lr: float = Field(gt=0, le=1)
    alpha: float = Field(ge=0, le=10)                 # weight of the rejection reward
    tau: float = Field(gt=0, le=1)                    # a candidate "hits" when its tIoU with the answer >= tau
    clip_eps: float = Field(gt=0, lt=1)
    beta: float = Field(ge=0, le=10)                  # k3 KL to the SFT policy
    max_grad_norm: float = Field(gt=0, le=1000)


class HubConfig(ProfileConfig):
    """The paper profile [reconstructed]: a CLIP-family encoder for VBCS, a Qwen2.5-VL policy, the benchmarks."""

    encoder_model: str = Field(min_length=1)
    policy_model: str = Field(min_length=1)
    datasets: list[str] = Field(min_length=1)
    split: str = Field(min_length=1)
    frames_per_video: StrictInt = Field(ge=8, le=1024)   # uniformly sampled frames of each untrimmed video
    max_questions: StrictInt = Field(ge=1, le=1_000_000)
    max_new_tokens: StrictInt = Field(ge=1, le=8192)
    dtype: str = Field(pattern="^(float32|bfloat16|float16)$")


class CacrConfig(PaperConfig):
    hub: HubConfig | None = None
    data: DataConfig
    vlp: VLPConfig
    vbcs: VBCSConfig
    policy: PolicyConfig
    grpo: GRPOConfig
    iou_thresholds: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _fits(self) -> CacrConfig:
        if max(self.vbcs.window_lengths) > self.data.frames:
            raise ValueError("vbcs.window_lengths: a window is longer than the video (data.frames)")
        if self.vlp.embed_dim % 2:
            raise ValueError("vlp.embed_dim must be even")
        return self


CONFIG = CacrConfig
