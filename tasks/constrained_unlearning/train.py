"""Training step of constrained_unlearning: every model of one seed, written to the seed's folder.

Stage B (README, "What is measured"): a small DDPM pretrained on q's samples, unlearned primal-dual twice per
formulation (density-free method and analytic reference; thresholds from the user's requested forget mass on the
Stage A grid, :func:`model.stage_optimum`), and the weight-based baselines
at every swept weight. Stage C: the pretrained model (the *retrain* reference, it never
saw the duplicates) fine-tuned with duplicated forget points (*memorised*), then unlearned by FU primal-dual.
File names: model.py. Every run draws from its own seeded generator, so no model depends on the order of the runs,
and evaluate.py's sampling generators are its own.

The toy runs on the CPU whatever ``device`` says: its 2-D MLP is too small to gain from an accelerator.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from tasks.common.io import save_state_dict, write_json
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.constrained_unlearning import baselines, data, diffusion, method
from tasks.constrained_unlearning.config import ConstrainedUnlearningConfig, UnlearnConfig
from tasks.constrained_unlearning.hub import refuse_unimplemented
from tasks.constrained_unlearning.mixture import GaussianMixture
from tasks.constrained_unlearning.model import (
    CONCEPT,
    DATA_FU,
    DATA_UNLEARNED,
    DUAL_VARIABLES,
    MEMORISED,
    PRETRAINED,
    BaselineJob,
    DuplicatedSet,
    baseline_jobs,
    duplicated_set,
    noise_schedule,
    proxy_radius,
    stage_optimum,
    unlearned_file,
)


def train(cfg: ConstrainedUnlearningConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    """Pretrain, unlearn (Stage B), baselines, data unlearning (Stage C), as far as the config's sections go;
    without a ``ddpm`` section nothing is trained (Stage A is exact: evaluate.py)."""
    refuse_unimplemented(cfg)
    result = SeedResult(seed)
    q, forget, _, train_points = data.load_seed_data(cfg, seed, data_dir)
    if cfg.ddpm is None:
        return result
    model_dir = Path(model_dir)
    schedule = noise_schedule(cfg.ddpm)
    pool = torch.as_tensor(train_points, dtype=torch.float32)
    with result.stage("pretrain"):
        pretrained, losses = pretrain(cfg, seed, pool, schedule, progress)
        save_state_dict(pretrained, model_dir / PRETRAINED)
    result.add(curves={"b_pretrain_loss": losses[:: max(1, len(losses) // 500)]})
    duals: dict[str, float] = {}
    if cfg.unlearn is not None:
        with result.stage("unlearn"):
            duals |= unlearn_each_formulation(cfg, seed, pretrained, pool, q, forget, schedule, model_dir, result,
                                              progress)
    if cfg.baselines is not None:
        with result.stage("baselines"):
            train_baselines(cfg, seed, pretrained, pool, forget, schedule, model_dir, progress)
    if cfg.data_unlearn is not None:
        with result.stage("data_unlearn"):
            duals[DATA_FU] = data_unlearning(cfg, seed, pretrained, q, train_points, schedule, model_dir, result,
                                             progress)
    if duals:
        write_json(model_dir / DUAL_VARIABLES, duals)
    return result


def clone(model: diffusion.EpsilonMLP) -> diffusion.EpsilonMLP:
    twin = diffusion.EpsilonMLP(model.net[0].out_features, (len(model.net) - 1) // 2, model.time_dim,
                                model.timesteps)
    twin.load_state_dict(model.state_dict())
    return twin


# ------------------------------------------------------------------------------------------------
# Stage B: DDPM pretraining, primal-dual unlearning, baselines
# ------------------------------------------------------------------------------------------------

def pretrain(cfg: ConstrainedUnlearningConfig, seed: int, pool: torch.Tensor, schedule: diffusion.NoiseSchedule,
             progress: Progress) -> tuple[diffusion.EpsilonMLP, list[float]]:
    """DSM on q's samples, Adam with a cosine-decayed learning rate; the model and its loss curve."""
    ddpm = cfg.ddpm
    model = diffusion.build_model(ddpm.hidden, ddpm.layers, ddpm.time_dim, ddpm.timesteps, seed)
    every = max(1, ddpm.pretrain_steps // 5)

    def loss(gen: torch.Generator) -> torch.Tensor:
        return diffusion.dsm_loss(model, pool[torch.randint(0, pool.shape[0], (ddpm.batch_size,), generator=gen)],
                                  schedule, gen)

    def on_step(step: int, value: float) -> None:
        if (step + 1) % every == 0:
            progress(0.3 * (step + 1) / ddpm.pretrain_steps,
                     f"seed {seed}: DDPM pretraining {step + 1}, loss {value:.3f}")

    losses = diffusion.train(model, loss, ddpm.pretrain_steps, ddpm.lr, torch.Generator().manual_seed(seed), on_step,
                             cosine_decay=True)
    return model, losses


def dual_schedule(formulation: str, un: UnlearnConfig, density_free: bool) -> tuple[int, int]:
    """(dual updates, primal steps per dual update) of one Stage B run. One normalised dual step s for all three
    formulations, so the number of updates to reach lambda_b at full violation is lambda_b*|g0|/s, which at the
    matched threshold is 2-4x larger for RU than for LU and FU: RU gets its own count (``ru_dual_updates``, set by
    the grid-only rule in the README) at ``ru_steps_per_dual``, for both its runs. The density-free LU run is
    on-policy (each primal step samples full chains) and takes ``lu_steps_per_dual``."""
    if formulation == "ru":
        return un.ru_dual_updates, un.ru_steps_per_dual
    if formulation == "lu" and density_free:
        return un.dual_updates, un.lu_steps_per_dual
    return un.dual_updates, un.steps_per_dual


def unlearn_each_formulation(cfg: ConstrainedUnlearningConfig, seed: int, pretrained: diffusion.EpsilonMLP,
                             pool: torch.Tensor, q: GaussianMixture, forget: GaussianMixture,
                             schedule: diffusion.NoiseSchedule, model_dir: Path, result: SeedResult,
                             progress: Progress) -> dict[str, float]:
    """Two primal-dual runs per formulation from the pretrained weights, both with the threshold set from the
    requested forget mass and the one normalised dual step: the density-free primal step (the method,
    :func:`density_free_unlearn`) and the analytic reference (importance-weighted DSM with the known densities).
    Returns the final lambda of each (keys ``<f>`` and ``<f>_analytic``)."""
    un = cfg.unlearn
    _, problem = data.grid_problem(q, forget, cfg.grid)
    pool_np = pool.numpy().astype(np.float64)
    log_masses = (q.log_density(pool_np), forget.log_density(pool_np))
    qu_samples = forget.sample(un.dual_samples, np.random.default_rng(2_000 + seed))
    forget_samples = torch.as_tensor(forget.sample(un.forget_samples, np.random.default_rng(3_000 + seed)),
                                     dtype=torch.float32)  # the user's data of the concept (q_u's samples)
    if un.ru_concept_score == "learned":
        concept = fit_concept_model(cfg, seed, pretrained, forget_samples, schedule)
        save_state_dict(concept, model_dir / CONCEPT)
    else:  # q_u's own score: the q_u of the dual step's constraint KL(p||q_u)
        concept = method.noised_score_epsilon(forget.noised_score_torch, schedule)
    duals = {}
    for i, f in enumerate(method.FORMULATIONS):
        optimum = stage_optimum(f, problem, cfg.grid)

        def constraint(points: np.ndarray, f: str = f) -> float:
            return method.sample_constraint_value(f, points, forget.log_density, qu_samples, un.knn_k)

        def report(fraction: float, f: str = f, i: int = i) -> None:
            progress(0.3 + 0.4 * (i + fraction) / 3, f"seed {seed}: primal-dual {f.upper()} {fraction:.0%}")

        reference = clone(pretrained)
        ref_updates, ref_steps = dual_schedule(f, un, density_free=False)
        ref_run = method.primal_dual_unlearn(
            f, reference, schedule, pool, *log_masses, optimum.bound, constraint, dual_updates=ref_updates,
            steps_per_dual=ref_steps, batch_size=un.batch_size, lr=un.lr,
            dual_lr=optimum.dual_lr(un.dual_step), dual_samples=un.dual_samples,
            generator=torch.Generator().manual_seed(10_000 * (seed + 1) + i))
        save_state_dict(reference, model_dir / unlearned_file(f, analytic=True))
        model = clone(pretrained)
        run = density_free_unlearn(f, cfg, model, pretrained, concept, pool, forget, forget_samples, schedule,
                                   optimum.bound,
                                   constraint, optimum.dual_lr(un.dual_step),
                                   torch.Generator().manual_seed(1_000_003 * (seed + 1) + i), report)
        save_state_dict(model, model_dir / unlearned_file(f))
        result.add({f"b_{f}_lambda": run.lam, f"b_{f}_final_slack": run.slacks[-1],
                    f"b_{f}_analytic_lambda": ref_run.lam, f"b_{f}_analytic_final_slack": ref_run.slacks[-1]},
                   curves={f"b_lambda_{f}": run.lambdas, f"b_lambda_{f}_analytic": ref_run.lambdas})
        duals[f] = run.lam
        duals[f"{f}_analytic"] = ref_run.lam
    return duals


def fit_concept_model(cfg: ConstrainedUnlearningConfig, seed: int, pretrained: diffusion.EpsilonMLP,
                      concept_data: torch.Tensor, schedule: diffusion.NoiseSchedule) -> diffusion.EpsilonMLP:
    """RU's network of q_u (the "concept" branch ESD takes from the conditional model): the pretrained weights
    fine-tuned by DSM on samples of q_u only, the data a user has of the concept to forget."""
    un = cfg.unlearn
    model = clone(pretrained)

    def loss(g: torch.Generator) -> torch.Tensor:
        batch = concept_data[torch.randint(0, concept_data.shape[0], (un.batch_size,), generator=g)]
        return diffusion.dsm_loss(model, batch, schedule, g)

    diffusion.train(model, loss, un.concept_steps, cfg.ddpm.lr, torch.Generator().manual_seed(4_000 + seed),
                    cosine_decay=True)
    return model.eval()


def density_free_unlearn(formulation: str, cfg: ConstrainedUnlearningConfig, model: diffusion.EpsilonMLP,
                         pretrained: diffusion.EpsilonMLP,
                         concept: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], pool: torch.Tensor,
                         forget: GaussianMixture, forget_samples: torch.Tensor, schedule: diffusion.NoiseSchedule,
                         bound: float,
                         constraint: Callable[[np.ndarray], float], dual_lr: float, generator: torch.Generator,
                         progress: Callable[[float], None] | None = None) -> method.UnlearnResult:
    """Primal-dual with a primal step that never evaluates the density of q (p0) or of p*_lambda: RU by score
    composition of the frozen pretrained network and ``concept`` (q_u's noise prediction: its own score, or a
    network fitted on its samples), FU by DSM_q - lambda DSM_{q_u} on q's training samples and q_u's samples, LU
    on-policy (:func:`method.lu_reinforce_loss`: REINFORCE on the current model's trajectories with reward
    q_u(x_0), plus the trajectory KL to the frozen pretrained model). ``forget`` is q_u (its density is the LU
    constraint's function); ``q`` is not an argument: nothing here can reach it."""
    un = cfg.unlearn
    frozen = clone(pretrained).eval()

    def likelihood(points: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(forget.density(points.numpy().astype(np.float64)), dtype=torch.float32)

    def primal_loss(lam: float) -> method.PrimalLoss:
        if formulation == "ru":
            return method.ru_composition_loss(model, frozen, concept, schedule, pool, lam, un.batch_size)
        if formulation == "fu":
            return method.fu_difference_loss(model, schedule, pool, forget_samples, lam, un.batch_size)
        return method.lu_reinforce_loss(model, frozen, schedule, likelihood, lam, un.lu_trajectories,
                                        un.lu_grad_steps)

    updates, steps = dual_schedule(formulation, un, density_free=True)
    return method.primal_dual_loop(formulation, model, schedule, primal_loss, bound, constraint,
                                   dual_updates=updates, steps_per_dual=steps, lr=un.lr,
                                   dual_lr=dual_lr, dual_samples=un.dual_samples, generator=generator,
                                   progress=progress)


def baseline_loss(job: BaselineJob, model: diffusion.EpsilonMLP, cfg: ConstrainedUnlearningConfig,
                  schedule: diffusion.NoiseSchedule, pool: torch.Tensor, forget: GaussianMixture,
                  pretrained: diffusion.EpsilonMLP) -> baselines.LossFn:
    """The loss of one sweep point (baselines.py); retain / forget split at the forget ball (radius 2 sigma)."""
    batch = cfg.baselines.batch_size
    inside = np.linalg.norm(pool.numpy() - forget.means[0][None, :], axis=1) < 2 * forget.sigma
    retain, forget_pool = pool[torch.as_tensor(~inside)], pool[torch.as_tensor(inside)]
    if job.kind == "loss_mixing":
        return baselines.loss_mixing_loss(model, schedule, retain, forget_pool, job.value, batch)
    if job.kind == "esd":
        return baselines.esd_loss(model, clone(pretrained).eval(), forget, schedule, pool, job.value, batch)
    reference = [p.detach().clone() for p in pretrained.parameters()]
    return baselines.weight_regularised_loss(model, reference, schedule, forget_pool, job.value, batch)


def train_baselines(cfg: ConstrainedUnlearningConfig, seed: int, pretrained: diffusion.EpsilonMLP,
                    pool: torch.Tensor, forget: GaussianMixture, schedule: diffusion.NoiseSchedule, model_dir: Path,
                    progress: Progress) -> None:
    """Every baseline at every swept weight, fine-tuned from the pretrained weights for the same step count."""
    bl = cfg.baselines
    jobs = baseline_jobs(bl)
    for job in jobs:
        model = clone(pretrained)
        loss = baseline_loss(job, model, cfg, schedule, pool, forget, pretrained)
        diffusion.train(model, loss, bl.steps, bl.lr, torch.Generator().manual_seed(20_000 * (seed + 1) + job.index))
        save_state_dict(model, model_dir / job.file)
        progress(0.7 + 0.3 * (job.index + 1) / len(jobs), f"seed {seed}: baseline {job.label}")


# ------------------------------------------------------------------------------------------------
# Stage C: data unlearning with FU
# ------------------------------------------------------------------------------------------------

def memorise(cfg: ConstrainedUnlearningConfig, seed: int, retrain: diffusion.EpsilonMLP, train_t: torch.Tensor,
             schedule: diffusion.NoiseSchedule) -> diffusion.EpsilonMLP:
    """The retrain reference fine-tuned (DSM, cosine-decayed Adam) on the pool plus the duplicated forget points."""
    du = cfg.data_unlearn
    model = clone(retrain)

    def memorise_loss(g: torch.Generator) -> torch.Tensor:
        index = torch.randint(0, train_t.shape[0], (du.batch_size,), generator=g)
        return diffusion.dsm_loss(model, train_t[index], schedule, g)

    diffusion.train(model, memorise_loss, du.memorise_steps, du.memorise_lr,
                    torch.Generator().manual_seed(30_000 + seed), cosine_decay=True)
    return model


def smoothed_forget_samples(cfg: ConstrainedUnlearningConfig, seed: int, dup: DuplicatedSet, radius: float
                            ) -> np.ndarray:
    """Samples of q_u~: the forget points smoothed by a Gaussian of width ``radius`` (the dual step's target)."""
    du = cfg.data_unlearn
    kernel_rng = np.random.default_rng(50_000 + seed)
    return (dup.forget_points[kernel_rng.integers(0, du.n_points, du.dual_samples)]
            + radius * kernel_rng.standard_normal((du.dual_samples, 2)))


def data_unlearning(cfg: ConstrainedUnlearningConfig, seed: int, retrain: diffusion.EpsilonMLP, q: GaussianMixture,
                    train_points: np.ndarray, schedule: diffusion.NoiseSchedule, model_dir: Path, result: SeedResult,
                    progress: Progress) -> float:
    """Stage C (README, "Stage C"): memorise, then FU primal-dual from the memorised model on the same training set.

    Primal loss DSM_q - lambda DSM_{q_u} (importance weights (q - lambda q_u)_+ / q on the training atoms,
    :func:`method.empirical_log_masses`); the dual step estimates KL(q_u~ || p) by k-NN from the model's samples.
    The bound b is that estimate for the retrain reference (forget as far as a model that never saw the
    duplicates). Returns the final lambda."""
    du = cfg.data_unlearn
    dup = duplicated_set(cfg, q, train_points, seed)
    train_t = torch.as_tensor(dup.points, dtype=torch.float32)
    model = memorise(cfg, seed, retrain, train_t, schedule)
    save_state_dict(model, model_dir / MEMORISED)
    progress(1.0, f"seed {seed}: data unlearning, memorised")
    qu_samples = smoothed_forget_samples(cfg, seed, dup, proxy_radius(cfg, q))
    k = cfg.unlearn.knn_k if cfg.unlearn is not None else 5

    def constraint(points: np.ndarray) -> float:
        return method.knn_kl(qu_samples, points, k)

    bound = constraint(diffusion.sample(retrain, schedule, du.dual_samples, torch.Generator().manual_seed(
        60_000 + seed)).numpy().astype(np.float64))
    run = method.primal_dual_unlearn(
        "fu", model, schedule, train_t, *method.empirical_log_masses(dup.is_forget), bound, constraint,
        dual_updates=du.dual_updates, steps_per_dual=du.steps_per_dual, batch_size=du.batch_size, lr=du.lr,
        dual_lr=du.dual_lr, dual_samples=du.dual_samples, generator=torch.Generator().manual_seed(70_000 + seed))
    save_state_dict(model, model_dir / DATA_UNLEARNED)
    result.add(c_fu_lambda=run.lam, c_fu_bound=bound, c_fu_final_slack=run.slacks[-1],
               curves={"c_lambda_fu": run.lambdas})
    return run.lam
