"""What train.py and evaluate.py share: the seed folder's file names, the DDPM built from the config, the
thresholds of Stage A (from the requested forget mass), the baseline sweep and the duplicated training set of Stage C.

Files of ``models/constrained_unlearning/seed<N>/`` (safetensors via ``tasks.common.io.save_state_dict``):
``pretrained``, ``unlearned_{ru,fu,lu}`` (Stage B primal-dual), ``baseline<j>_<kind>_<value>`` (Stage B
baselines, in the sweep order of :func:`baseline_jobs`), ``memorised`` and ``data_unlearned_fu`` (Stage C), and
``dual_variables.json``: the final lambda of every primal-dual run (the dual half of its iterate).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.common.io import load_state_dict
from tasks.constrained_unlearning import data, diffusion, method
from tasks.constrained_unlearning.config import BaselineConfig, ConstrainedUnlearningConfig, DDPMConfig, GridConfig
from tasks.constrained_unlearning.mixture import GaussianMixture

PRETRAINED = "pretrained.safetensors"
MEMORISED = "memorised.safetensors"
DATA_UNLEARNED = "data_unlearned_fu.safetensors"
DUAL_VARIABLES = "dual_variables.json"
DATA_FU = "data_fu"  # key of the Stage C run in DUAL_VARIABLES (the Stage B runs use their formulation)


CONCEPT = "concept_qu.safetensors"  # RU's network of q_u (density-free score composition)


def unlearned_file(formulation: str, analytic: bool = False) -> str:
    """Checkpoint of a Stage B primal-dual run: the density-free method, or its analytic reference."""
    return f"unlearned_{formulation}{'_analytic' if analytic else ''}.safetensors"


def noise_schedule(ddpm: DDPMConfig) -> diffusion.NoiseSchedule:
    return diffusion.NoiseSchedule.linear(ddpm.timesteps)


def load_model(ddpm: DDPMConfig, path: Path) -> diffusion.EpsilonMLP:
    """An epsilon-network of the config's shape with the weights of ``path`` (written by train.py)."""
    model = diffusion.build_model(ddpm.hidden, ddpm.layers, ddpm.time_dim, ddpm.timesteps, seed=0)
    return load_state_dict(model, path).eval()


@dataclass(frozen=True)
class ConstrainedOptimum:
    """One formulation's constrained problem on the Stage A grid, from the user's requested forget mass: the
    threshold b / eps (:func:`method.bound_for_forget_mass`), the optimal dual variable lambda_b and the optimum
    p*_b (:func:`method.lambda_for_bound`), and the violation at p = q (the dual step's normaliser)."""

    bound: float
    lam: float
    p: np.ndarray
    start_violation: float

    def dual_lr(self, dual_step: float) -> float:
        return method.normalised_dual_lr(dual_step, self.start_violation)


def constrained_optimum(formulation: str, problem: method.GridProblem, forget_mass: float) -> ConstrainedOptimum:
    return optimum_at_bound(formulation, problem, method.bound_for_forget_mass(formulation, problem, forget_mass))


def lu_matched_ru_bound(problem: method.GridProblem, forget_mass: float) -> float:
    """RU's threshold matched to LU's request: LU's constrained optimum at the requested mass has forget mass m_LU;
    RU's closed-form target with that forget mass (:func:`method.lambda_for_forget_mass`) gives RU's threshold, its
    constraint value there. Both optima then remove the same forget mass (the comparison C4 needs)."""
    lu_mass = method.mass(constrained_optimum("lu", problem, forget_mass).p, problem.forget_mask, problem.cell)
    lam = method.lambda_for_forget_mass("ru", problem, lu_mass)
    return method.constraint_value("ru", method.target("ru", problem, lam), problem)


def stage_optimum(formulation: str, problem: method.GridProblem, grid: GridConfig) -> ConstrainedOptimum:
    """The constrained problem every stage solves for ``formulation``: threshold from the requested forget mass,
    except RU under ``grid.ru_threshold == "lu_matched_mass"`` (:func:`lu_matched_ru_bound`)."""
    if formulation == "ru" and grid.ru_threshold == "lu_matched_mass":
        return optimum_at_bound("ru", problem, lu_matched_ru_bound(problem, grid.target_forget_mass))
    return constrained_optimum(formulation, problem, grid.target_forget_mass)


def optimum_at_bound(formulation: str, problem: method.GridProblem, bound: float) -> ConstrainedOptimum:
    lam = method.lambda_for_bound(formulation, problem, bound)
    q = method.normalise(problem.q, problem.cell)
    start = method.violation(formulation, method.constraint_value(formulation, q, problem), bound)
    return ConstrainedOptimum(bound, lam, method.target(formulation, problem, lam), start)


@dataclass(frozen=True)
class BaselineJob:
    """One point of a baseline sweep (baselines.py): ``family`` as the results name it, ``kind`` its loss."""

    index: int
    family: str
    kind: str
    value: float

    @property
    def file(self) -> str:
        return f"baseline{self.index:02d}_{self.kind}_{self.value:g}.safetensors"

    @property
    def label(self) -> str:
        return f"{self.family} {self.value:g}"


def baseline_jobs(bl: BaselineConfig) -> list[BaselineJob]:
    """Every baseline at every swept weight: loss mixing w, then ESD-style eta, then weight regularisation mu."""
    sweeps = [("loss mixing", "loss_mixing", bl.loss_mixing_w), ("ESD-style", "esd", bl.esd_eta),
              ("weight reg.", "weight_reg", bl.weight_reg_mu)]
    jobs = [(family, kind, value) for family, kind, values in sweeps for value in values]
    return [BaselineJob(j, family, kind, value) for j, (family, kind, value) in enumerate(jobs)]


@dataclass(frozen=True)
class DuplicatedSet:
    """Stage C's training set: q's samples plus every forget point repeated ``duplicates`` times, and each forget
    point's held-out twin (:func:`data.duplicated_forget_points`)."""

    forget_points: np.ndarray
    heldout_points: np.ndarray
    points: np.ndarray
    is_forget: np.ndarray

    @property
    def share(self) -> float:
        """Fraction of the training set that is forget copies (FU with lambda >= share trains on the rest only)."""
        return float(self.is_forget.mean())


def duplicated_set(cfg: ConstrainedUnlearningConfig, q: GaussianMixture, pool: np.ndarray, seed: int
                   ) -> DuplicatedSet:
    du = cfg.data_unlearn
    forget_pts, heldout_pts = data.duplicated_forget_points(q, du.n_points, du.offset_sigmas * q.sigma, seed)
    points, is_forget = data.duplicated_training_set(pool, forget_pts, du.duplicates)
    return DuplicatedSet(forget_pts, heldout_pts, points, is_forget)


def proxy_radius(cfg: ConstrainedUnlearningConfig, q: GaussianMixture) -> float:
    """Stage C's memorisation-proxy radius, also the width of the Gaussian smoothing q_u~ of the forget points."""
    return cfg.data_unlearn.radius_sigmas * q.sigma
