"""Parameters of one multi_model_curation profile (the ``multi_model_curation.<profile>`` section)."""

from __future__ import annotations

from pydantic import Field, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "multi_model_curation: When and How Human Curation Backfires (multi-model self-consuming loop)"

COUPLED_CONFIGS = ("dampen", "cross_invert", "self_invert")


def _strictly_increasing(values: list[float]) -> bool:
    return all(a < b for a, b in zip(values, values[1:]))


class AnalyticConfig(ProfileConfig):
    """The K -> infinity recursion: reference fixed points, convergence, influence heat map."""

    rounds: int = Field(ge=10, description="iterations of F for a fixed point (the reference values: 2000)")
    divergent_rounds: int = Field(ge=10, description="rounds of the divergent config before it is judged")
    jacobian_step: float = Field(gt=0, le=1e-2)
    influence_step: float = Field(gt=0, le=0.5)
    isolated_betas: list[float] = Field(min_length=3, description="C2 beta grid of the isolated loop")
    coupling_grid: list[float] = Field(min_length=2, description="W_12 = W_21 of the heat map (lambda = 0.2)")
    heatmap_betas: list[float] = Field(min_length=2, description="beta_1 axis of the heat map")

    @model_validator(mode="after")
    def _grids(self) -> AnalyticConfig:
        if not _strictly_increasing(self.isolated_betas) or self.isolated_betas[0] < 0:
            raise ValueError(f"isolated_betas must be >= 0 and strictly increasing, got {self.isolated_betas}")
        if not _strictly_increasing(self.coupling_grid) or self.coupling_grid[0] != 0 or self.coupling_grid[-1] > 0.8:
            # C5a measures the cross-influence of the uncoupled row, so the grid starts at 0.
            raise ValueError("coupling_grid must start at 0 and increase strictly up to at most 0.8 (= 1 - lambda, "
                             f"lambda = 0.2), got {self.coupling_grid}")
        if not _strictly_increasing(self.heatmap_betas) or self.heatmap_betas[0] < 0:
            raise ValueError(f"heatmap_betas must be >= 0 and strictly increasing, got {self.heatmap_betas}")
        return self


class SampledConfig(ProfileConfig):
    """The sample-based loop: finite-K Bradley-Terry curation and Gaussian MLE refits (1-D)."""

    n_samples: int = Field(ge=100, description="curated samples per model per round")
    real_pool: int = Field(ge=100, description="size of the finite real data set (data phase)")
    rounds: int = Field(ge=2)
    burn_in: int = Field(ge=0, description="rounds dropped before averaging A_i(t) into a fixed point")
    k_small: int = Field(ge=2, description="the small K of the sampled loops (cpu: 16)")
    k_large: int = Field(ge=2, description="the large K (cpu: 64; claim C1e, agreement with K -> infinity)")
    isolated_betas: list[float] = Field(min_length=2, description="C2 beta grid, sampled at k_large")
    divergent_replicates: int = Field(ge=1, description="C1d: independent sampled loops of the divergent config "
                                                        "per seed (the trials of its binomial count)")

    @model_validator(mode="after")
    def _sizes(self) -> SampledConfig:
        if self.burn_in >= self.rounds - 1:
            raise ValueError(f"burn_in ({self.burn_in}) must be < rounds - 1 ({self.rounds - 1})")
        if self.real_pool < self.n_samples:
            raise ValueError(f"real_pool ({self.real_pool}) must be >= n_samples ({self.n_samples})")
        if self.k_small >= self.k_large:
            raise ValueError(f"k_small ({self.k_small}) must be < k_large ({self.k_large})")
        if not _strictly_increasing(self.isolated_betas) or self.isolated_betas[0] < 0:
            raise ValueError(f"isolated_betas must be >= 0 and strictly increasing, got {self.isolated_betas}")
        return self


class NeuralConfig(ProfileConfig):
    """Conditional linear-Gaussian task (phi(x) = x in R^dim) with 2-layer MLP generators."""

    coupled_config: str = Field(pattern="^(dampen|cross_invert|self_invert)$")
    dim: int = Field(ge=1, le=64)
    hidden: int = Field(ge=2)
    n_samples: int = Field(ge=100)
    real_pool: int = Field(ge=100)
    rounds: int = Field(ge=2)
    burn_in: int = Field(ge=0)
    k: int = Field(ge=2)
    steps_per_round: int = Field(ge=1)
    lr: float = Field(gt=0)

    @model_validator(mode="after")
    def _sizes(self) -> NeuralConfig:
        if self.burn_in >= self.rounds - 1:
            raise ValueError(f"burn_in ({self.burn_in}) must be < rounds - 1 ({self.rounds - 1})")
        if self.real_pool < self.n_samples:
            raise ValueError(f"real_pool ({self.real_pool}) must be >= n_samples ({self.n_samples})")
        return self


class SurveyConfig(ProfileConfig):
    """Configurations drawn from the fixed prior ``method.ConfigPrior`` (README, "Design of the survey"):
    the K -> infinity self-inversion rate on ``analytic_configs`` draws per seed, and sampled loops (K =
    sampled.k_small and k_large) on the first ``sampled_random`` draws and on the first ``sampled_inverting``
    draws that self-invert at K -> infinity."""

    analytic_configs: int = Field(ge=10, description="configurations drawn per seed for the K -> inf rate")
    analytic_rounds: int = Field(ge=50, description="rounds of the batched K -> inf recursion")
    converged_tol: float = Field(gt=0, le=1e-3, description="a configuration whose state still moves more than "
                                                              "this in the last round is not counted")
    sampled_random: int = Field(ge=0, description="the first draws of the seed, sampled at both K")
    sampled_inverting: int = Field(ge=0, description="the first K -> inf self-inverting draws, sampled at both K")
    n_samples: int = Field(ge=100, description="curated samples per model per round of the survey's loops")
    rounds: int = Field(ge=2)
    burn_in: int = Field(ge=0)

    @model_validator(mode="after")
    def _sizes(self) -> SurveyConfig:
        if self.burn_in >= self.rounds - 1:
            raise ValueError(f"burn_in ({self.burn_in}) must be < rounds - 1 ({self.rounds - 1})")
        if self.sampled_random + self.sampled_inverting == 0:
            raise ValueError("sampled_random + sampled_inverting must be >= 1 (the finite-K rates need trials)")
        if self.sampled_random > self.analytic_configs:
            raise ValueError(f"sampled_random ({self.sampled_random}) must be <= analytic_configs "
                             f"({self.analytic_configs})")
        return self


class MixtureConfig(ProfileConfig):
    """Gaussian-mixture generators refit by EM on the self-invert config (README, "Design of the mixture test")."""

    components: int = Field(ge=2, le=8, description="Gaussians per generator (1 would be the single-Gaussian loop)")
    em_iterations: int = Field(ge=1, description="EM steps per refit (warm start from the previous round)")
    k: int = Field(ge=2, description="Bradley-Terry candidates per prompt")
    n_samples: int = Field(ge=100)
    rounds: int = Field(ge=2)
    burn_in: int = Field(ge=0)

    @model_validator(mode="after")
    def _sizes(self) -> MixtureConfig:
        if self.burn_in >= self.rounds - 1:
            raise ValueError(f"burn_in ({self.burn_in}) must be < rounds - 1 ({self.rounds - 1})")
        return self


class HubConfig(ProfileConfig):
    """Paper profile: chat LMs fine-tuned on each other's curated generations (the project's proposal)."""

    generators: list[str] = Field(min_length=2, description="hub names of the N generators")
    reward_models: list[str] = Field(min_length=1, description="one shared, or one per generator")
    prompts_dataset: str = Field(min_length=1)
    prompts_split: str = Field(min_length=1)
    prompt_column: str = Field(min_length=1)
    response_column: str = Field(min_length=1, description="the real (human) responses: the lambda share")
    n_prompts: int = Field(ge=2)
    n_eval_prompts: int = Field(ge=1)
    k: int = Field(ge=2)
    rounds: int = Field(ge=1)
    beta: list[float] = Field(min_length=2)
    mixing: list[list[float]] = Field(min_length=2)
    real_share: float = Field(ge=0, le=1)
    max_new_tokens: int = Field(ge=1)
    sft_steps: int = Field(ge=1)
    batch_size: int = Field(ge=1)
    lr: float = Field(gt=0)
    dtype: str = Field(pattern="^(float32|bfloat16|float16)$")

    @model_validator(mode="after")
    def _shapes(self) -> HubConfig:
        n = len(self.generators)
        if len(self.reward_models) not in (1, n):
            raise ValueError(f"reward_models must have 1 or {n} entries, got {len(self.reward_models)}")
        if len(self.beta) != n or any(b < 0 for b in self.beta):
            raise ValueError(f"beta must have {n} non-negative entries, got {self.beta}")
        if len(self.mixing) != n or any(len(row) != n for row in self.mixing):
            raise ValueError(f"mixing must be {n} x {n}, got {self.mixing}")
        for i, row in enumerate(self.mixing):
            if any(w < 0 for w in row) or abs(sum(row) - (1 - self.real_share)) > 1e-6:
                raise ValueError(f"mixing[{i}] must be >= 0 and sum to 1 - real_share = {1 - self.real_share:g},"
                                 f" got {row}")
        if self.n_eval_prompts >= self.n_prompts:
            raise ValueError(f"n_eval_prompts ({self.n_eval_prompts}) must be < n_prompts ({self.n_prompts})")
        return self


class MultiModelCurationConfig(PaperConfig):
    analytic: AnalyticConfig
    sampled: SampledConfig | None = None
    neural: NeuralConfig | None = None
    survey: SurveyConfig | None = None
    mixture: MixtureConfig | None = None
    hub: HubConfig | None = None

    @model_validator(mode="after")
    def _needs_sampled(self) -> MultiModelCurationConfig:
        # The survey's sampled loops use sampled.k_small / k_large and the real data set of the sampled loops.
        for name in ("survey", "mixture"):
            if getattr(self, name) is not None and self.sampled is None:
                raise ValueError(f"{name} needs the sampled section (its K values and real data set)")
        if self.sampled is not None:
            for name in ("survey", "mixture"):
                section = getattr(self, name)
                if section is not None and section.n_samples > self.sampled.real_pool:
                    raise ValueError(f"{name}.n_samples ({section.n_samples}) must be <= sampled.real_pool "
                                     f"({self.sampled.real_pool})")
        return self


CONFIG = MultiModelCurationConfig
