"""Parameters of one diffdt profile (the ``diffdt.<profile>`` section of params.yaml).

smoke / cpu: ``cohort`` (the synthetic UKB-like generator of tasks/diffdt/cohort.py, with true counterfactuals).
paper: ``ukb`` (paths to local UK Biobank extracts under an approved application; nothing is downloaded).
``backbone``, ``diffusion`` and ``intervention`` are the model's knobs at every profile.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "diffdt: generative disease trajectories with SDoH tokens and geometric brain-network diffusion"


class CohortConfig(ProfileConfig):
    """The synthetic cohort (tasks/diffdt/cohort.py); every subject is followed from age 40."""

    n_subjects: int = Field(ge=50, le=1_000_000)
    n_codes: int = Field(ge=4, le=200, description="disease codes, death included (the last)")
    n_linked: int = Field(ge=1, description="codes with a direct SDoH effect (gamma != 0)")
    sdoh_effect: float = Field(ge=0, le=5, description="size of a direct SDoH log-hazard effect")
    rho: float = Field(ge=0, lt=1, description="loading of the organ axes on the deprivation D")
    baseline_low: float = Field(ge=41, le=100)
    baseline_high: float = Field(ge=41, le=100)
    follow_up: float = Field(gt=0, le=30, description="years after baseline")
    dt: float = Field(gt=0, le=1, description="hazard grid step (years)")
    test_share: float = Field(gt=0, lt=1)
    n_roi: int = Field(ge=2, le=64)
    eig_low: float = Field(gt=0, le=3, description="smallest eigenvalue of the population connectivity mean")
    brain_step_scale: float = Field(ge=0, le=2)
    brain_noise: float = Field(ge=0, le=2)
    follow_share: float = Field(gt=0, le=1, description="share of brain-imaged subjects with a follow-up scan")

    @model_validator(mode="after")
    def _consistent(self) -> CohortConfig:
        if self.baseline_low > self.baseline_high:
            raise ValueError(f"baseline_low ({self.baseline_low}) must be <= baseline_high ({self.baseline_high})")
        if self.n_linked >= self.n_codes:
            raise ValueError(f"n_linked ({self.n_linked}) must be < n_codes ({self.n_codes}): death is never linked")
        return self


class UKBConfig(ProfileConfig):
    """Local UK Biobank extracts (parquet, the layout of tasks/diffdt/ukb.py); paths, never downloads."""

    events_path: str = Field(min_length=1, description="one row per (eid, age, ICD-10 code)")
    participants_path: str = Field(min_length=1, description="eid, sex, baseline age (imaging visit)")
    imaging_path: str = Field(min_length=1, description="eid, organ IDPs (heart / liver / kidney columns)")
    connectome_path: str = Field(min_length=1, description="eid, visit, age, upper-triangular connectivity")
    n_codes: int = Field(ge=2, le=2000, description="most frequent disease codes kept (death added)")
    test_share: float = Field(gt=0, lt=1)
    n_roi: int = Field(ge=2, le=400)


class BackboneConfig(ProfileConfig):
    """The Delphi-style event GPT (method.EventBackbone), trained with AdamW on the event likelihood."""

    n_layer: int = Field(ge=1, le=48)
    n_head: int = Field(ge=1, le=64)
    n_embd: int = Field(ge=4, le=4096)
    epochs: int = Field(ge=1, le=1000)
    batch_size: int = Field(ge=1, le=65536)
    lr: float = Field(gt=0, le=1)

    @model_validator(mode="after")
    def _heads_divide(self) -> BackboneConfig:
        if self.n_embd % self.n_head or self.n_embd % 2:
            raise ValueError(f"n_embd ({self.n_embd}) must be even and divisible by n_head ({self.n_head})")
        return self


class DiffusionConfig(ProfileConfig):
    """Every organ's conditioned DDPM (method.Denoiser); ``guidance`` is w of classifier-free guidance."""

    steps: int = Field(ge=2, le=4000, description="diffusion steps T")
    hidden: int = Field(ge=4, le=4096)
    brain_hidden: int = Field(ge=4, le=4096, description="width of the brain models")
    brain_latent_dim: int = Field(ge=1, le=10000, description="whitened-PCA latent of the brain increments")
    n_layers: int = Field(ge=1, le=32)
    train_steps: int = Field(ge=1, le=1_000_000)
    batch_size: int = Field(ge=1, le=65536)
    lr: float = Field(gt=0, le=1)
    cond_dropout: float = Field(ge=0, lt=1)
    guidance: float = Field(ge=0, le=20)
    clip_x0: float = Field(default=5.0, gt=0, le=100, description="x0 clip of the sampler (standardised units)")


class InterventionConfig(ProfileConfig):
    """In-silico intervention: SDoH code j inserted at baseline; futures sampled for ``horizon`` years."""

    n_subjects: int = Field(ge=1, le=1_000_000, description="test subjects per intervention (without code j)")
    n_futures: int = Field(ge=1, le=1000, description="sampled futures per subject and arm")
    horizon: float = Field(gt=0, le=30)
    max_steps: int = Field(ge=1, le=1000, description="sampler steps (events + padding) per future")
    min_abs_effect: float = Field(ge=0, lt=1, description="pairs with |true delta| above this are scored")


class DiffdtConfig(PaperConfig):
    cohort: CohortConfig | None = None
    ukb: UKBConfig | None = None
    auc_horizon: float = Field(gt=0, le=30, description="years of the AUC label window after baseline")
    backbone: BackboneConfig
    diffusion: DiffusionConfig
    intervention: InterventionConfig

    @model_validator(mode="after")
    def _one_source(self) -> DiffdtConfig:
        if (self.cohort is None) == (self.ukb is None):
            raise ValueError("exactly one of cohort (synthetic) and ukb (local extracts) must be given")
        return self


CONFIG = DiffdtConfig
