"""Evaluation step of constrained_unlearning: exact checks, then the models train.py wrote, measured by sampling.

Stage A (exact, every profile; README, "What is measured"): the three formulations' closed-form targets and the
primal-dual iterates on a 2-D density grid, the fixed 1-D reference problem, and the RU/ESD and FU identities.
Stage B: forget mass, close-mode mass and retained-region KL of the pretrained model, of each primal-dual run and
of each baseline, from their samples. Stage C: the memorisation proxy and retained-region KL of the retrain
reference, the memorised and the FU data-unlearned model. Derived claim numbers (ratios, errors, counts): see
claim_metrics.py.

Sampling draws from two generators per seed, in a fixed order: ``5_000 + seed`` for Stage B (the reference
samples, then the pretrained model, each primal-dual run, each baseline), ``40_000 + seed`` for Stage C (the
memorised, then the data-unlearned model). Runs on the CPU whatever ``device`` says (the 2-D MLP is tiny).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tasks.common.io import read_json
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.constrained_unlearning import data, diffusion, method
from tasks.constrained_unlearning.config import ConstrainedUnlearningConfig, GridConfig
from tasks.constrained_unlearning.hub import refuse_unimplemented
from tasks.constrained_unlearning.mixture import GaussianMixture
from tasks.constrained_unlearning.model import (
    DATA_UNLEARNED,
    DUAL_VARIABLES,
    MEMORISED,
    PRETRAINED,
    DuplicatedSet,
    baseline_jobs,
    duplicated_set,
    load_model,
    noise_schedule,
    proxy_radius,
    stage_optimum,
    unlearned_file,
)

SCATTER_POINTS = 600  # samples per model kept in the results for the before/after figure
DATA_SCATTER_POINTS = 2000  # samples per model kept for the data-unlearning figure (Stage C)


def evaluate(cfg: ConstrainedUnlearningConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    """Stage A always; Stage B and C from the seed's checkpoints when the config has their sections."""
    refuse_unimplemented(cfg)
    result = SeedResult(seed)
    q, forget, close, train_points = data.load_seed_data(cfg, seed, data_dir)
    with result.stage("stage_a"):
        grid, problem = data.grid_problem(q, forget, cfg.grid)
        metrics, curves = stage_a(cfg.grid, problem, grid.ball(close, 2 * forget.sigma))
        result.add(reference_1d() | identity_checks(grid, problem, q, forget) | metrics, curves=curves)
    progress(0.2, f"seed {seed}: Stage A (exact) done")
    if cfg.ddpm is None:
        return result
    model_dir = Path(model_dir)
    with result.stage("stage_b"):
        evaluator, before_samples = stage_b(cfg, q, forget, close, seed, model_dir, result)
    progress(0.8, f"seed {seed}: Stage B measured")
    if cfg.data_unlearn is not None:
        with result.stage("stage_c"):
            stage_c(cfg, seed, q, train_points, evaluator, before_samples, model_dir, result)
    progress(1.0, f"seed {seed}: evaluated")
    return result


# ------------------------------------------------------------------------------------------------
# Stage A: exact checks
# ------------------------------------------------------------------------------------------------

def reference_1d() -> dict[str, float]:
    """The fixed 1-D reference numbers (seed-independent): lambda* and retained-region KL at 5% and 1%."""
    problem, far = data.reference_problem_1d()
    q = method.normalise(problem.q, problem.cell)
    out: dict[str, float] = {}
    for forget_mass, tag in ((0.05, ""), (0.01, "_1pct")):
        for f in method.FORMULATIONS:
            lam = method.lambda_for_forget_mass(f, problem, forget_mass)
            p = method.target(f, problem, lam)
            out[f"ref1d_lambda_{f}{tag}"] = lam
            out[f"ref1d_retained_kl_{f}{tag}"] = method.retained_kl(p, q, problem.forget_mask, problem.cell)
            if f == "ru" and not tag:
                out["ref1d_far_mass_ru"] = method.mass(p, far, problem.cell)
    return out


def identity_checks(grid: method.Grid, problem: method.GridProblem, q: GaussianMixture,
                    forget: GaussianMixture) -> dict[str, float]:
    """C6 on this seed's grid: the RU score is ESD's guided score (finite differences, lambda = 2/3 <=> eta = 2),
    and FU with lambda = w recovers the retained distribution of q = (1 - w) q_r + w q_u exactly."""
    shape = grid.shape
    lam = 2 / 3
    log_p = method.ru_log_target(problem.log_q, problem.log_qu, lam)
    spacing = grid.points[1, 1] - grid.points[0, 1]
    d_log_p = np.stack(np.gradient(log_p.reshape(shape), spacing))
    composed = method.ru_score(np.stack(np.gradient(problem.log_q.reshape(shape), spacing)),
                               np.stack(np.gradient(problem.log_qu.reshape(shape), spacing)), lam)
    weights = q.weights
    forget_index = int(np.argmin(np.linalg.norm(q.means - forget.means[0], axis=1)))
    retained = GaussianMixture(np.delete(q.means, forget_index, 0),
                               np.delete(weights, forget_index) / (1 - weights[forget_index]), q.sigma)
    q_r = method.normalise(retained.density(grid.points), grid.cell)
    p_fu = method.fu_target(problem, float(weights[forget_index]))
    return {
        "c6_esd_eta_at_lambda_two_thirds": method.eta_from_lambda(lam),
        "c6_ru_score_identity_error": float(np.max(np.abs(d_log_p - composed))),
        "c6_fu_recovers_retained_tv": method.tv_distance(p_fu, q_r, grid.cell),
    }


def stage_a(grid_cfg: GridConfig, problem: method.GridProblem, close_mask: np.ndarray
            ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Per formulation: the threshold from the requested forget mass, the constrained optimum (lambda_b by
    bisection on the active constraint), the primal-dual iterates from p = q with the one normalised dual step,
    and their distance to that optimum (mechanism checks of the dual loop); the optimum's forget mass (what
    the threshold delivers of the request); the closed-form optima at exactly the requested mass (C4a's
    matched comparison). Metrics and the lambda trajectories (first 200 iterations)."""
    q = method.normalise(problem.q, problem.cell)
    metrics: dict[str, float] = {}
    curves: dict[str, list[float]] = {}
    for f in method.FORMULATIONS:
        optimum = stage_optimum(f, problem, grid_cfg)
        run = method.primal_dual_grid(f, problem, optimum.bound, grid_cfg.iterations, grid_cfg.primal_step,
                                      optimum.dual_lr(grid_cfg.dual_step))
        at_mass = method.target(f, problem, method.lambda_for_forget_mass(f, problem, grid_cfg.target_forget_mass))
        metrics |= {
            f"a_lambda_star_{f}": optimum.lam,
            f"a_{f}_bound": optimum.bound,
            f"a_{f}_forget_mass_at_bound": method.mass(optimum.p, problem.forget_mask, problem.cell),
            f"a_{f}_tv_to_closed_form": method.tv_distance(run.p, optimum.p, problem.cell),
            f"a_{f}_lambda_rel_error": abs(run.lam - optimum.lam) / optimum.lam,
            f"a_{f}_abs_slack": abs(run.slack),
            f"a_{f}_min_lambda": min(run.lambdas),
            f"a_{f}_retained_kl_at_bound": method.retained_kl(optimum.p, q, problem.forget_mask, problem.cell),
            f"a_{f}_retained_kl": method.retained_kl(at_mass, q, problem.forget_mask, problem.cell),
            f"a_{f}_close_mass_change": method.mass(optimum.p, close_mask, problem.cell)
            - method.mass(q, close_mask, problem.cell),
        }
        curves[f"a_lambda_{f}"] = run.lambdas[: min(len(run.lambdas), 200)]
    return metrics, curves


# ------------------------------------------------------------------------------------------------
# Stage B: the pretrained model, the primal-dual runs and the baselines, from their samples
# ------------------------------------------------------------------------------------------------

class Evaluator:
    """Stage B metrics of a model from its samples: forget mass, close-mode mass, retained-region KL."""

    def __init__(self, cfg: ConstrainedUnlearningConfig, forget: GaussianMixture, close: np.ndarray,
                 schedule: diffusion.NoiseSchedule, reference: np.ndarray, generator: torch.Generator) -> None:
        self.cfg, self.forget, self.close, self.schedule = cfg, forget, close, schedule
        self.reference, self.generator = reference, generator
        self.radius = 2 * forget.sigma
        self.close_before = method.ball_fraction(reference, close, self.radius)

    def samples(self, model: torch.nn.Module) -> np.ndarray:
        return diffusion.sample(model, self.schedule, self.cfg.ddpm.eval_samples, self.generator).numpy().astype(
            np.float64)

    def metrics(self, samples: np.ndarray) -> dict[str, float]:
        ddpm = self.cfg.ddpm
        return {
            "forget_mass": method.ball_fraction(samples, self.forget.means[0], self.radius),
            "close_mass_change": method.ball_fraction(samples, self.close, self.radius) - self.close_before,
            "retained_kl": method.histogram_retained_kl(samples, self.reference, self.forget.means[0], self.radius,
                                                        ddpm.histogram_bins, self.cfg.grid.half_width),
        }


def reference_evaluator(cfg: ConstrainedUnlearningConfig, seed: int, forget: GaussianMixture, close: np.ndarray,
                        pretrained: torch.nn.Module) -> Evaluator:
    """2 x ``eval_samples`` reference samples of the pretrained model (the retained-region KL's q), drawn first
    from the Stage B generator, which the evaluator then keeps drawing from."""
    ddpm = cfg.ddpm
    schedule = noise_schedule(ddpm)
    generator = torch.Generator().manual_seed(5_000 + seed)
    reference = diffusion.sample(pretrained, schedule, 2 * ddpm.eval_samples, generator).numpy().astype(np.float64)
    return Evaluator(cfg, forget, close, schedule, reference, generator)


def stage_b(cfg: ConstrainedUnlearningConfig, q: GaussianMixture, forget: GaussianMixture, close: np.ndarray,
            seed: int, model_dir: Path, result: SeedResult) -> tuple[Evaluator, np.ndarray]:
    """Every Stage B model measured, in the generator's order; tables ``tradeoff`` (one row per model) and
    ``samples`` (the pretrained and primal-dual models' samples). Returns the evaluator and the pretrained
    model's samples (Stage C's retrain reference)."""
    pretrained = load_model(cfg.ddpm, model_dir / PRETRAINED)
    evaluator = reference_evaluator(cfg, seed, forget, close, pretrained)
    before_samples = evaluator.samples(pretrained)
    before = evaluator.metrics(before_samples)
    off_mode = np.min(np.linalg.norm(before_samples[:, None, :] - q.means[None], axis=2), axis=1) > 3 * q.sigma
    result.add({f"b_pretrained_{k}": v for k, v in before.items()}, b_eval_samples=float(before_samples.shape[0]),
               b_pretrained_off_mode_fraction=float(np.mean(off_mode)))
    rows = [{"method": "pretrained", "family": "pretrained", "param": 0.0} | before]
    scatter = {"pretrained": before_samples}
    if cfg.unlearn is not None:
        duals = read_json(model_dir / DUAL_VARIABLES)
        for f in method.FORMULATIONS:
            scatter[f] = evaluator.samples(load_model(cfg.ddpm, model_dir / unlearned_file(f)))
            scores = evaluator.metrics(scatter[f])
            result.add({f"b_{f}_{k}": v for k, v in scores.items()})
            rows.append({"method": f"{f.upper()} (constrained)", "family": "constrained", "param": duals[f]} | scores)
        for f in method.FORMULATIONS:  # the analytic references, after every density-free run
            scores = evaluator.metrics(evaluator.samples(load_model(cfg.ddpm, model_dir / unlearned_file(f, True))))
            result.add({f"b_{f}_analytic_{k}": v for k, v in scores.items()})
    if cfg.baselines is not None:
        for job in baseline_jobs(cfg.baselines):
            scores = evaluator.metrics(evaluator.samples(load_model(cfg.ddpm, model_dir / job.file)))
            rows.append({"method": job.label, "family": job.family, "param": job.value} | scores)
    samples = [{"method": name, "x": float(x), "y": float(y)}
               for name, points in scatter.items() for x, y in points[:SCATTER_POINTS]]
    result.add(tables={"tradeoff": rows, "samples": samples})
    return evaluator, before_samples


# ------------------------------------------------------------------------------------------------
# Stage C: memorisation proxy of the retrain reference, the memorised and the data-unlearned model
# ------------------------------------------------------------------------------------------------

def memorisation_proxies(cfg: ConstrainedUnlearningConfig, dup: DuplicatedSet, radius: float, reference: np.ndarray,
                         samples: np.ndarray) -> dict[str, float]:
    """Fractions of samples within ``radius`` of a forget point and of a held-out twin (the proxy's two counts
    over the samples, :func:`method.near_fraction`), and the retained-region KL outside the forget balls."""
    return {"forget_near": method.near_fraction(samples, dup.forget_points, radius),
            "heldout_near": method.near_fraction(samples, dup.heldout_points, radius),
            "retained_kl": method.histogram_retained_kl(samples, reference, dup.forget_points, radius,
                                                        cfg.ddpm.histogram_bins, cfg.grid.half_width)}


def stage_c(cfg: ConstrainedUnlearningConfig, seed: int, q: GaussianMixture, train_points: np.ndarray,
            evaluator: Evaluator, retrain_samples: np.ndarray, model_dir: Path, result: SeedResult) -> None:
    """The retrain reference (its Stage B samples), then the memorised and the FU data-unlearned model, sampled in
    that order from the Stage C generator; table ``data_unlearning`` (the points and both models' samples)."""
    dup = duplicated_set(cfg, q, train_points, seed)
    radius = proxy_radius(cfg, q)

    def proxies(samples: np.ndarray) -> dict[str, float]:
        return memorisation_proxies(cfg, dup, radius, evaluator.reference, samples)

    generator = torch.Generator().manual_seed(40_000 + seed)
    sampled = {name: diffusion.sample(load_model(cfg.ddpm, model_dir / file), evaluator.schedule,
                                      cfg.ddpm.eval_samples, generator).numpy().astype(np.float64)
               for name, file in (("memorised", MEMORISED), ("data-unlearned FU", DATA_UNLEARNED))}
    result.add({f"c_retrain_{k}": v for k, v in proxies(retrain_samples).items()},
               c_duplicate_share=dup.share,
               c_heldout_density_ratio=float(np.mean(q.density(dup.forget_points))
                                             / np.mean(q.density(dup.heldout_points))))
    result.add({f"c_memorised_{k}": v for k, v in proxies(sampled["memorised"]).items()})
    result.add({f"c_fu_{k}": v for k, v in proxies(sampled["data-unlearned FU"]).items()})
    points = {"forget_points": dup.forget_points, "heldout_points": dup.heldout_points} | sampled
    result.add(tables={"data_unlearning": [{"set": name, "x": float(x), "y": float(y)} for name, values in
                                           points.items() for x, y in values[:DATA_SCATTER_POINTS]]})
