"""Parameters of one edumirror profile (the ``edumirror.<profile>`` section of params.yaml).

``agent``: the value-driven agent's knobs (need dynamics, planner, theory of mind, reflection); ``effects``: the
effect vector of every action on its actor and target and its detection probability (all effect sizes live here);
``teacher``: the effect sizes of the teacher's goal-driven actions; ``scenario``: the experiments' sizes (E1-E4);
``measurement``: the Rater's corpus and training, the Surveyor's response model. ``hub`` (paper profile only): an
LLM-backed agent policy, Rater and Surveyor through a local OpenAI-compatible server. None of beta, tau, the
priorities, the need baseline, the effect sizes or the public-goods multiplier is given by the paper: they are
project choices, recorded with every run.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictInt, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "edumirror: EduMirror, value-driven multi-agent simulation of educational social dynamics (reconstructed)"

NeedVector = Annotated[list[float], Field(min_length=5, max_length=5)]
ACTIONS = ("exclude", "rumour", "confront", "help", "comfort", "socialise", "report", "withdraw", "study")


class AgentConfig(ProfileConfig):
    """Need dynamics (D2A-style decay toward a baseline), deficit weighting, planner and reflection."""

    need_target: float = Field(ge=0, le=10, description="target e_k of every need")
    need_baseline: float = Field(ge=0, le=10, description="b: needs decay toward it (0: deplete unless satisfied)")
    decay_rate: float = Field(ge=0, le=1, description="need change per tick toward the baseline")
    priorities: NeedVector = Field(description="Maslow-order priorities of safety, belonging, esteem, meaning, health")
    beta: float = Field(gt=0, le=20, description="inverse temperature of the deficit weights")
    temperature: float = Field(gt=0, le=10, description="tau of the planner's softmax selection")
    proposals: StrictInt = Field(ge=1, le=50, description="m feasible actions proposed per step")
    tom_noise_sd: float = Field(ge=0, le=5, description="noise of theory-of-mind need estimates")
    affinity_rate: float = Field(ge=0, le=1, description="reflection: R_ij step per tanh(effect)")
    retaliation_threshold: float = Field(ge=-1, le=0, description="retaliate against j when R_ij is below it")
    retaliation_bonus: float = Field(ge=0, le=10, description="utility bonus of aggression toward a disliked agent")
    aggression_bonus: float = Field(ge=0, le=10, description="utility of aggression per unit of aggression trait")
    retaliation_risk: float = Field(ge=0, le=10, description="perceived cost of attacking a target with healthy "
                                    "safety and esteem (scaled by their estimate / 10)")
    memory_size: StrictInt = Field(ge=1, le=100)


class ActionEffect(ProfileConfig):
    actor: NeedVector
    target: NeedVector = Field(default_factory=lambda: [0.0] * 5)
    detection: float = Field(ge=0, le=1, description="probability the teacher notices the act")


class EffectsConfig(ProfileConfig):
    exclude: ActionEffect
    rumour: ActionEffect
    confront: ActionEffect
    help: ActionEffect
    comfort: ActionEffect
    socialise: ActionEffect
    report: ActionEffect
    withdraw: ActionEffect
    study: ActionEffect


class TeacherConfig(ProfileConfig):
    """Effect sizes of the teacher's actions; the branches change the teacher's goal only."""

    punish: NeedVector = Field(description="effect of a punishment on the punished student")
    punish_public_cost: float = Field(ge=0, le=10, description="belonging lost by the victim of a punished act "
                                      "(publicly named) and the punished agent's affinity drop toward them")
    punish_memory: float = Field(ge=0, le=1, description="per punishment, rise of the perceived punishment risk")
    counsel: NeedVector = Field(description="effect of counselling on the counselled student")
    norm_help: float = Field(ge=0, le=10, description="class meeting: perceived belonging gain added to help")
    norm_exclude: float = Field(ge=0, le=10, description="class meeting: perceived status gain removed from "
                                "exclusion and rumours")
    meeting_period: StrictInt = Field(ge=1, le=1000, description="ticks between class meetings")
    norm_decay: float = Field(ge=0, le=1, description="fraction of a meeting's norm lost per tick")


class RoleConfig(ProfileConfig):
    theta: float = Field(ge=-90, le=90, description="SVO angle in degrees")
    aggression: float = Field(ge=0, le=1)
    initial_needs: float = Field(ge=0, le=10)


class ScenarioConfig(ProfileConfig):
    ticks: StrictInt = Field(ge=2, le=1000)
    branch_tick: StrictInt = Field(ge=1, le=1000)
    slope_window: StrictInt = Field(ge=2, le=1000, description="E1: need slope over ticks 0..window")
    replicates: StrictInt = Field(ge=2, le=1000, description="classrooms per seed in E1 and E2")
    healthy_needs: float = Field(ge=0, le=10)
    vulnerable_needs: float = Field(ge=0, le=10)
    bully: RoleConfig
    follower: RoleConfig
    victim: RoleConfig
    bystander: RoleConfig
    sweep_scales: list[float] = Field(min_length=1, description="effect-size scales of the sensitivity sweep")
    sweep_replicates: StrictInt = Field(ge=2, le=1000)
    class_sizes: list[StrictInt] = Field(min_length=1, description="E4: agents including the teacher")
    size_replicates: StrictInt = Field(ge=2, le=1000)
    pg_thetas: list[float] = Field(min_length=3, description="E3: SVO angles swept")
    pg_agents: StrictInt = Field(ge=2, le=100)
    pg_rounds: StrictInt = Field(ge=1, le=1000)
    pg_multiplier: float = Field(gt=1, le=100)
    pg_replicates: StrictInt = Field(ge=1, le=1000)
    pg_affinity_rate: float = Field(ge=0, le=1, description="reflection step after each round")

    @model_validator(mode="after")
    def _consistent(self) -> ScenarioConfig:
        if self.branch_tick >= self.ticks:
            raise ValueError(f"branch_tick ({self.branch_tick}) must be < ticks ({self.ticks})")
        if self.slope_window > self.ticks:
            raise ValueError(f"slope_window ({self.slope_window}) must be <= ticks ({self.ticks})")
        if any(n < 5 for n in self.class_sizes):
            raise ValueError("class_sizes must be >= 5 (bully, two followers, victim, teacher)")
        if self.pg_multiplier >= self.pg_agents:
            raise ValueError("pg_multiplier must be < pg_agents (a social dilemma: contributing costs the giver)")
        return self


class MeasurementConfig(ProfileConfig):
    corpus_size: StrictInt = Field(ge=10, le=1_000_000, description="Rater training narrations")
    train_paraphrases: StrictInt = Field(ge=1, le=6, description="paraphrases per action the Rater sees; the "
                                         "simulation narrates with all 6")
    rater_steps: StrictInt = Field(ge=1, le=100_000)
    rater_lr: float = Field(gt=0, le=10)
    rater_weight_decay: float = Field(ge=0, le=1)
    survey_noise_sd: float = Field(ge=0, le=10, description="Surveyor: response noise in scale points")
    acquiescence_sd: float = Field(ge=0, le=10, description="Surveyor: per-respondent agreement bias")
    survey_noise_grid: list[float] = Field(min_length=1, description="response noise values of the validity sweep")


class HubConfig(ProfileConfig):
    """Paper profile: an open instruct model drives the agents, codes narrations and answers scale items."""

    agent_model: str = Field(min_length=1)
    server_url: str | None = None
    temperature: float = Field(ge=0, le=2)
    max_new_tokens: StrictInt = Field(ge=1, le=4096)
    dtype: Literal["float32", "float16", "bfloat16"] = "bfloat16"
    replicates: StrictInt = Field(ge=1, le=100, description="classrooms per seed driven by the LLM")
    rater_sample: StrictInt = Field(ge=10, le=100_000, description="narrations coded by the LLM Rater")


class EdumirrorConfig(PaperConfig):
    agent: AgentConfig
    effects: EffectsConfig
    teacher: TeacherConfig
    scenario: ScenarioConfig
    measurement: MeasurementConfig
    hub: HubConfig | None = None


CONFIG = EdumirrorConfig
