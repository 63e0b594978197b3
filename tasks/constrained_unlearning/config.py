"""Parameters of one constrained_unlearning profile (the ``constrained_unlearning.<profile>`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "constrained_unlearning: Unlearning in Diffusion Models with KL and Likelihood Constraints"


class MixtureConfig(ProfileConfig):
    """q: an 8-mode ring GMM plus a "close" mode just outside the forget mode (ring mode 0); q_u = that mode.

    Seeds draw the ring's phase and jitter the mode weights by +-``weight_jitter`` (relative)."""

    n_ring_modes: int = Field(ge=3, le=32)
    ring_radius: float = Field(gt=0)
    sigma: float = Field(gt=0)
    close_offset: float = Field(gt=0, description="distance of the close mode from the forget mode (outward)")
    weight_jitter: float = Field(ge=0, lt=1)
    n_train: int = Field(ge=100, description="training samples of q written by the data phase")

    @model_validator(mode="after")
    def _close_mode_outside_forget_region(self) -> MixtureConfig:
        # The forget region is the ball of radius 2 sigma around the forget mode; the close mode must
        # sit outside it, or "collateral damage" cannot be told from forgetting.
        if self.close_offset <= 2 * self.sigma:
            raise ValueError(f"close_offset ({self.close_offset}) must exceed 2 * sigma ({2 * self.sigma})")
        return self


class GridConfig(ProfileConfig):
    """Stage A: exact primal-dual on a 2-D density grid."""

    size: int = Field(ge=16, le=512)
    half_width: float = Field(gt=0)
    target_forget_mass: float = Field(gt=0, lt=1)
    iterations: int = Field(ge=1)
    primal_step: float = Field(gt=0, le=1)
    dual_step: float = Field(gt=0, description="one normalised dual step for RU, FU and LU (method.normalised_dual_lr)")
    ru_threshold: Literal["requested_mass", "lu_matched_mass"] = Field(
        description="RU's threshold: the constraint at the requested-mass reference, or at RU's closed-form target "
                    "whose forget mass equals LU's constrained optimum's (model.stage_optimum)")


class DDPMConfig(ProfileConfig):
    """Stage B: the MLP epsilon-network and its pretraining on q's samples."""

    timesteps: int = Field(ge=2)
    hidden: int = Field(ge=4)
    layers: int = Field(ge=1)
    time_dim: int = Field(ge=2)
    pretrain_steps: int = Field(ge=1)
    batch_size: int = Field(ge=8)
    lr: float = Field(gt=0)
    eval_samples: int = Field(ge=100, description="samples per model for every Stage B metric")
    histogram_bins: int = Field(ge=4, description="bins per axis of the retained-region histogram KL")

    @model_validator(mode="after")
    def _even_time_dim(self) -> DDPMConfig:
        if self.time_dim % 2:
            raise ValueError(f"time_dim must be even (sin and cos halves), got {self.time_dim}")
        return self


class UnlearnConfig(ProfileConfig):
    """Stage B: primal-dual unlearning of the pretrained DDPM, one run per formulation."""

    dual_updates: int = Field(ge=1)
    steps_per_dual: int = Field(ge=1)
    batch_size: int = Field(ge=8)
    lr: float = Field(gt=0)
    dual_samples: int = Field(ge=50)
    dual_step: float = Field(gt=0, description="one normalised dual step for RU, FU and LU (method.normalised_dual_lr)")
    knn_k: int = Field(ge=1, le=50)
    forget_samples: int = Field(ge=50, description="samples of q_u the density-free primal steps may use")
    concept_steps: int = Field(ge=1, description="DSM steps fitting RU's q_u network (from the pretrained weights)")
    ru_concept_score: Literal["analytic", "learned"] = Field(
        description="q_u's score in RU's composition: q_u's own (the one the dual step's constraint uses) or a "
                    "network fitted on q_u's samples (concept_steps)")
    lu_trajectories: int = Field(ge=8, description="model trajectories per on-policy LU primal step (REINFORCE)")
    lu_grad_steps: int = Field(ge=1, description="denoising steps per trajectory that carry the LU gradient")
    lu_steps_per_dual: int = Field(ge=1, description="on-policy LU primal steps per dual update (each samples "
                                                      "lu_trajectories full chains: the budget's largest cost)")
    ru_dual_updates: int = Field(ge=1, description="RU's dual updates (both runs), same normalised dual step: RU's "
                                                   "lambda_b*|g0|/s is 2-4x LU's/FU's (grid-only rule: README)")
    ru_steps_per_dual: int = Field(ge=1, description="RU's primal steps per dual update (both runs)")


class DataUnlearnConfig(ProfileConfig):
    """Stage C: data unlearning (FU) of duplicated forget points, memorisation measured by a near-sample proxy.

    The Stage B model (trained without duplicates: the retrain reference) is fine-tuned on its pool plus
    ``n_points`` forget points repeated ``duplicates`` times, then unlearned primal-dual with FU."""

    n_points: int = Field(ge=1, description="forget points, one per ring mode other than the forget mode")
    duplicates: int = Field(ge=2, description="copies of each forget point added to the training pool")
    offset_sigmas: float = Field(gt=0, description="distance of a forget point from its mode centre, in sigma")
    radius_sigmas: float = Field(gt=0, description="memorisation-proxy radius (and q_u kernel width), in sigma")
    memorise_steps: int = Field(ge=1)
    memorise_lr: float = Field(gt=0)
    dual_updates: int = Field(ge=1)
    steps_per_dual: int = Field(ge=1)
    batch_size: int = Field(ge=8)
    lr: float = Field(gt=0)
    dual_lr: float = Field(gt=0)
    dual_samples: int = Field(ge=50)

    @model_validator(mode="after")
    def _balls_disjoint(self) -> DataUnlearnConfig:
        # A forget point and its held-out twin are 2 * offset apart: their proxy balls must not overlap.
        if self.radius_sigmas >= self.offset_sigmas:
            raise ValueError(f"radius_sigmas ({self.radius_sigmas}) must be < offset_sigmas ({self.offset_sigmas})")
        return self


class BaselineConfig(ProfileConfig):
    """Stage B baselines with hand-set weights, each swept (loss mixing, ESD-style eta, weight reg.: baselines.py)."""

    steps: int = Field(ge=1)
    lr: float = Field(gt=0)
    batch_size: int = Field(ge=8)
    loss_mixing_w: list[float] = Field(min_length=1)
    esd_eta: list[float] = Field(min_length=1)
    weight_reg_mu: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _positive_sweeps(self) -> BaselineConfig:
        for name in ("loss_mixing_w", "esd_eta", "weight_reg_mu"):
            values = getattr(self, name)
            if any(v <= 0 for v in values):
                raise ValueError(f"{name}: every sweep value must be > 0, got {values}")
        return self


class PaperScaleConfig(ProfileConfig):
    """Paper profile: hub checkpoints (Stable Diffusion / DDPM), LoRA, CLIP scoring. Needs diffusers + peft."""

    concept_model: str = Field(min_length=1, description="RU / ESD-style concept unlearning")
    lu_model: str = Field(min_length=1, description="LU as in the official code")
    clip_model: str = Field(min_length=1)
    data_model: str = Field(min_length=1, description="FU data unlearning (DDPM)")
    concept: str = Field(min_length=1)
    lora_rank: int = Field(ge=1)
    lr: float = Field(gt=0)
    dual_lr: float = Field(gt=0)
    epochs: int = Field(ge=1)
    ddim_steps: int = Field(ge=1)


class ConstrainedUnlearningConfig(PaperConfig):
    """One profile: Stage A (mixture, grid) always; Stage B (ddpm, unlearn, baselines) and Stage C (data_unlearn)
    when their sections are present; ``hub`` (the paper-scale models) is refused before any compute."""

    mixture: MixtureConfig
    grid: GridConfig
    ddpm: DDPMConfig | None = None
    unlearn: UnlearnConfig | None = None
    baselines: BaselineConfig | None = None
    data_unlearn: DataUnlearnConfig | None = None
    hub: PaperScaleConfig | None = None

    @model_validator(mode="after")
    def _stage_b_complete(self) -> ConstrainedUnlearningConfig:
        if (self.unlearn is not None or self.baselines is not None) and self.ddpm is None:
            raise ValueError("unlearn and baselines need a ddpm section (the pretrained model they start from)")
        if self.data_unlearn is not None:
            if self.ddpm is None:
                raise ValueError("data_unlearn needs a ddpm section (the retrain reference it fine-tunes)")
            if self.data_unlearn.n_points > self.mixture.n_ring_modes - 1:
                raise ValueError(f"data_unlearn.n_points ({self.data_unlearn.n_points}) must be <= n_ring_modes - 1 "
                                 f"({self.mixture.n_ring_modes - 1}): one forget point per ring mode")
        if self.unlearn is not None and self.unlearn.lu_grad_steps > self.ddpm.timesteps:
            raise ValueError(f"unlearn.lu_grad_steps ({self.unlearn.lu_grad_steps}) must be <= ddpm.timesteps "
                             f"({self.ddpm.timesteps}): the steps are drawn without replacement from the trajectory")
        if self.grid.half_width <= self.mixture.ring_radius + self.mixture.close_offset + 3 * self.mixture.sigma:
            raise ValueError("grid.half_width must exceed ring_radius + close_offset + 3 sigma (the grid must hold q)")
        return self


CONFIG = ConstrainedUnlearningConfig
