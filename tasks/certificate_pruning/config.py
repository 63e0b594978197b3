"""Parameters of one certificate_pruning profile (the ``certificate_pruning.<profile>`` section of params.yaml)."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from tasks.common.params import PaperConfig, ProfileConfig

TITLE = "certificate_pruning: Certificate-Guided Pruning for Stochastic Lipschitz Optimization"

BASELINES = ("hoo", "zooming", "direct", "gp_ucb", "random")


class CertificateConfig(ProfileConfig):
    """CGP's own knobs (method.py, items 1-5)."""

    delta: float = Field(gt=0, lt=1, description="failure probability of the certificates")
    pool_size: int = Field(ge=16, le=65536, description="Sobol pool representing A_t (a power of two)")
    perturb_centres: int = Field(ge=0, description="top-U active points perturbed per query")
    perturb_per_centre: int = Field(ge=0)
    perturb_scale: float = Field(gt=0, le=1)
    stop_gap: float = Field(gt=0, description="stopping rule eps_t <= stop_gap (reported as a stopping time)")

    @field_validator("pool_size")
    @classmethod
    def _power_of_two(cls, value: int) -> int:
        if value & (value - 1):
            raise ValueError(f"must be a power of two (balanced Sobol pool), got {value}")
        return value


class BudgetConfig(ProfileConfig):
    """T per run: T = 150 (d <= 3) / 250 (d > 3) at the cpu profile (README.md, "How to run")."""

    low_dim: int = Field(ge=5, description="evaluations per run for d <= 3")
    high_dim: int = Field(ge=5, description="evaluations per run for d > 3")


class BaselinesConfig(ProfileConfig):
    methods: list[str] = Field(min_length=1)
    gp_refit_growth: float = Field(gt=1, description="refit GP hyperparameters when n grows by this factor")
    gp_candidates: int = Field(ge=8)
    gp_initial_points: int = Field(ge=2)

    @field_validator("methods")
    @classmethod
    def _known_methods(cls, methods: list[str]) -> list[str]:
        unknown = [m for m in methods if m not in BASELINES]
        if unknown:
            raise ValueError(f"unknown baseline(s) {unknown}; choose from {list(BASELINES)}")
        if len(set(methods)) != len(methods):
            raise ValueError("baselines must be distinct")
        return methods


class AdaptiveConfig(ProfileConfig):
    """CGP-Adaptive (item 7): L_hat starts at ``initial_lipschitz`` and doubles."""

    initial_lipschitz: float = Field(gt=0)


class NegativeControlConfig(ProfileConfig):
    """CGP with c_i = 0 on Needle-2D at a higher noise: coverage must break (acceptance check a4)."""

    runs: int = Field(ge=1)
    noise_sd: float = Field(gt=0)
    budget: int = Field(ge=5)


class SvmConfig(ProfileConfig):
    grid_size: int = Field(ge=3, le=64)
    n_samples: int = Field(ge=60, le=1797, description="subsample of load_digits (1797 images)")
    folds: int = Field(ge=2, le=10)
    log10_c: tuple[float, float]
    log10_gamma: tuple[float, float]

    @model_validator(mode="after")
    def _ordered(self) -> SvmConfig:
        for key in ("log10_c", "log10_gamma"):
            low, high = getattr(self, key)
            if not low < high:
                raise ValueError(f"{key}: need low < high, got {[low, high]}")
        return self


class TrustRegionConfig(ProfileConfig):
    """CGP-TR (item 8) against random search on high-dimensional functions (claim C4)."""

    functions: list[str] = Field(min_length=1)
    budget: int = Field(ge=5)
    local_points: int = Field(ge=8)


class HybridConfig(ProfileConfig):
    """CGP-Hybrid (item 9) on the main functions (claim C5)."""

    local_radius: float = Field(gt=0, le=2)
    check_every: int = Field(ge=1)


class TightConfig(ProfileConfig):
    """The tight test bed (issue 18): Needle-2D with its exact L = 1 / needle_width, lower noise, a longer
    horizon and a grid pool whose covering radius is exact, repeated ``runs`` times per seed (claims C1t,
    C7t, C7t+, C9a, C9b), with ``zero_radius_runs`` runs of CGP with c_i = 0 as their negative control."""

    runs: int = Field(ge=1, description="CGP runs per seed (each on a fresh needle)")
    zero_radius_runs: int = Field(ge=1, description="control runs per seed with c_i = 0")
    noise_sd: float = Field(gt=0, le=1)
    zero_radius_noise_sd: float = Field(gt=0, le=1, description="noise sd of the c_i = 0 control runs")
    budget: int = Field(ge=5, description="T of every tight run")
    grid_per_axis: int = Field(ge=2, le=256, description="grid pool of grid_per_axis^2 cell centres")
    stop_gap: float = Field(gt=0, description="stopping target of both rules (eps_t and eps_t^+)")


class CertificatePruningConfig(PaperConfig):
    functions: list[str] = Field(min_length=1, description="benchmarks of the main comparison")
    noise_sd: float = Field(gt=0, le=1, description="Gaussian noise on the [0, 1]-rescaled functions")
    needle_width: float = Field(gt=0, le=0.5)
    lipschitz_samples: int = Field(ge=100, description="uniform samples of the offline L estimate")
    lipschitz_safety: float = Field(ge=1.0, description="L = safety x the largest sampled slope")
    certificate: CertificateConfig
    budget: BudgetConfig
    baselines: BaselinesConfig
    adaptive: AdaptiveConfig
    negative_control: NegativeControlConfig
    svm: SvmConfig | None = None
    trust_region: TrustRegionConfig | None = None
    hybrid: HybridConfig | None = None
    tight: TightConfig | None = None

    @field_validator("functions")
    @classmethod
    def _known_functions(cls, functions: list[str]) -> list[str]:
        from tasks.certificate_pruning.data import FUNCTION_NAME

        unknown = [f for f in functions if not FUNCTION_NAME.fullmatch(f)]
        if unknown:
            raise ValueError(f"unknown benchmark(s) {unknown}: use needle2d, branin, hartmann3, hartmann6, svm, "
                             "rosenbrock<d>, levy<d> or ackley<d>")
        if len(set(functions)) != len(functions):
            raise ValueError("benchmarks must be distinct")
        return functions

    @model_validator(mode="after")
    def _consistent(self) -> CertificatePruningConfig:
        if "svm" in self.functions and self.svm is None:
            raise ValueError("functions lists 'svm': the svm section is required")
        if "needle2d" not in self.functions:
            raise ValueError("functions must include 'needle2d' (claims C2 and the negative control use it)")
        if self.trust_region is not None:
            from tasks.certificate_pruning.data import FUNCTION_NAME

            bad = [f for f in self.trust_region.functions if not FUNCTION_NAME.fullmatch(f) or f == "svm"]
            if bad:
                raise ValueError(f"trust_region.functions: unknown or unsupported benchmark(s) {bad}")
        return self


CONFIG = CertificatePruningConfig
