"""Parameters of one llm_orchestration profile (the ``llm_orchestration.<profile>`` section of params.yaml).

smoke / cpu: ``world`` (the procedural omni-world, world.py), ``experts`` (vision, video, ASR, trained
independently on unimodal labels), ``controller`` (tiny GPT-2 trained on text only), ``joint`` (the jointly
trained baseline over a paired-data budget curve), ``memory`` and ``clock`` (the virtual clock's cost model).
paper: ``hub`` (the controller behind an OpenAI-compatible server or in process, experts by hub name, hub.py),
with the same ``memory`` and ``clock``.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "llm_orchestration: Training-free multimodal LLM orchestration (reconstructed toy omni-world)"


class WorldConfig(ProfileConfig):
    n_images: int = Field(ge=16, le=200_000, description="vision expert's training images (unimodal labels)")
    n_videos: int = Field(ge=16, le=200_000, description="video expert's training clips (unimodal labels)")
    n_utterances: int = Field(ge=16, le=200_000, description="ASR training utterances (word labels)")
    n_expert_test: int = Field(ge=16, le=100_000, description="held-out items per expert for its own accuracy")
    n_qa_eval: int = Field(ge=16, le=100_000, description="single-turn QA items of the joint-vs-orchestration test")
    n_sessions: int = Field(ge=4, le=100_000, description="4-turn evaluation sessions")
    image_noise: float = Field(ge=0, le=5)
    speech_noise: float = Field(ge=0, le=20)
    spoken_fraction: float = Field(ge=0, le=1, description="requests given as audio only")
    speak_fraction: float = Field(ge=0, le=1, description="requests that ask for a spoken reply")
    held_out_fraction: float = Field(ge=0, le=1, description="evaluation requests from held-out paraphrases")


class ExpertsConfig(ProfileConfig):
    width: int = Field(ge=4, le=512)
    vision_epochs: int = Field(ge=1, le=500, description="the upgraded vision expert v2")
    vision_epochs_weak: int = Field(ge=1, le=500, description="the weaker vision expert v1 (swap test)")
    video_epochs: int = Field(ge=1, le=500)
    asr_epochs: int = Field(ge=1, le=500)
    batch_size: int = Field(ge=1, le=4096)
    lr: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _weaker(self) -> ExpertsConfig:
        if self.vision_epochs_weak >= self.vision_epochs:
            raise ValueError("vision_epochs_weak must be < vision_epochs (v1 is the weaker expert)")
        return self


class ControllerConfig(ProfileConfig):
    n_layer: int = Field(ge=1, le=12)
    n_head: int = Field(ge=1, le=16)
    n_embd: int = Field(ge=8, le=1024)
    steps: int = Field(ge=1, le=100_000)
    batch_size: int = Field(ge=1, le=4096)
    lr: float = Field(gt=0, le=1)
    max_evidence: int = Field(ge=1, le=3, description="evidence tokens a program may hold (programs fit 8 tokens)")
    stress_temperature: float = Field(gt=0, le=10, description="the grammar mask's stress control: programs "
                                      "sampled at this temperature, free and constrained")


class JointConfig(ProfileConfig):
    budgets: list[int] = Field(min_length=1, description="paired multimodal QA examples N, increasing")
    oracle_budget: int = Field(ge=8, description="the capacity check's budget (one of budgets)")
    validation: int = Field(ge=16, le=1_000_000, description="held-out paired items for early stopping")
    width: int = Field(ge=8, le=512)
    layers: int = Field(ge=1, le=12)
    heads: int = Field(ge=1, le=16)
    check_min_steps: int = Field(ge=1, le=100_000, description="steps between held-out checks, at least")
    patience: int = Field(ge=1, le=1000, description="held-out checks without improvement before stopping")
    smoothing: float = Field(ge=0, lt=1, description="weight of the past in the held-out loss's moving average "
                             "that the stopping rule reads (0: the raw loss)")
    tolerance: float = Field(ge=0, le=1, description="an improvement of the smoothed held-out loss smaller than this "
                             "does not reset the patience")
    safety_steps: int = Field(ge=1, le=10_000_000, description="guard against a run that never stops")
    batch_size: int = Field(ge=1, le=4096)
    lr: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _budgets(self) -> JointConfig:
        if any(b < 8 for b in self.budgets) or self.budgets != sorted(set(self.budgets)):
            raise ValueError(f"budgets must be increasing, distinct and >= 8, got {self.budgets}")
        if self.oracle_budget not in self.budgets:
            raise ValueError(f"oracle_budget {self.oracle_budget} must be one of budgets {self.budgets}")
        if self.width % self.heads:
            raise ValueError(f"joint.width {self.width} must be divisible by joint.heads {self.heads}")
        return self


class MemoryConfig(ProfileConfig):
    tau: float = Field(ge=0, le=1, description="reuse a record iff cosine >= tau")
    bow_dim: int = Field(ge=4, le=65536)


class ClockConfig(ProfileConfig):
    """Virtual costs in ms, scaled to the paper profile's models (README, 'Virtual clock')."""

    controller_ms_per_token: float = Field(ge=0, le=10_000)
    controller_ms_per_prompt_token: float = Field(ge=0, le=10_000)
    asr_ms_per_word: float = Field(ge=0, le=10_000)
    vision_ms: float = Field(ge=0, le=100_000)
    video_ms: float = Field(ge=0, le=100_000)
    memory_ms: float = Field(ge=0, le=10_000)
    tts_ms_per_char: float = Field(ge=0, le=10_000)
    play_ms_per_char: float = Field(gt=0, le=10_000)
    tts_workers: int = Field(ge=1, le=64)
    tts_overhead_ms: float = Field(ge=0, le=10_000)
    frame_ms: float = Field(gt=0, le=10_000)


class HubConfig(ProfileConfig):
    controller_model: str = Field(min_length=1)
    server_url: str | None = None
    vision_model: str = Field(min_length=1)
    asr_model: str = Field(min_length=1)
    tts_model: str = Field(min_length=1)
    dataset: str = Field(min_length=1)
    split: str = Field(min_length=1)
    n_items: int = Field(ge=1, le=1_000_000)
    max_new_tokens: int = Field(ge=1, le=4096)
    dtype: str = Field(pattern="^(float32|bfloat16|float16)$")


class LlmOrchestrationConfig(PaperConfig):
    world: WorldConfig | None = None
    experts: ExpertsConfig | None = None
    controller: ControllerConfig | None = None
    joint: JointConfig | None = None
    memory: MemoryConfig
    clock: ClockConfig
    hub: HubConfig | None = None

    @model_validator(mode="after")
    def _sections(self) -> LlmOrchestrationConfig:
        toy = (self.world, self.experts, self.controller, self.joint)
        if self.hub is None and any(s is None for s in toy):
            raise ValueError("a toy profile needs world, experts, controller and joint (or give hub)")
        return self


CONFIG = LlmOrchestrationConfig
