"""The constrained_unlearning experiment, one seed at a time (plain functions: no Prefect, no MLflow).

Stage A (exact, every profile): the three formulations' closed-form targets and the primal-dual iterates on a
2-D density grid, plus the brief's 1-D reference problem and the RU/ESD and FU identities.
Stage B (smoke/cpu): a small DDPM pretrained on the mixture, unlearned primal-dual for each formulation and by
three weight-based baselines with hand-set weights (swept).
Stage C (smoke/cpu): data unlearning with FU: the Stage B model fine-tuned with duplicated forget points, unlearned
primal-dual, memorisation measured by a nearest-neighbour proxy (:func:`data_unlearning`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from tasks.common.io import save_state_dict, write_parquet
from tasks.common.results import Progress, SeedResult
from tasks.constrained_unlearning import baselines, data, diffusion, method
from tasks.constrained_unlearning.config import ConstrainedUnlearningConfig, GridConfig
from tasks.constrained_unlearning.mixture import GaussianMixture

SCATTER_POINTS = 600  # samples per model kept in the results for the before/after figure
DATA_SCATTER_POINTS = 2000  # samples per model kept for the data-unlearning figure (Stage C)


# ------------------------------------------------------------------------------------------------
# Data of one seed
# ------------------------------------------------------------------------------------------------

def load_seed_data(cfg: ConstrainedUnlearningConfig, seed: int, data_dir: Path
                   ) -> tuple[GaussianMixture, GaussianMixture, np.ndarray, np.ndarray]:
    """(q, q_u, close-mode centre, training samples), checked against the config before any compute."""
    mixture_file, samples_file = data_dir / f"mixture_seed{seed}.parquet", data_dir / f"train_seed{seed}.parquet"
    for path in (mixture_file, samples_file):
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: run the data phase first")
    stored = pl.read_parquet(mixture_file)
    expected = data.mixture_table(cfg.mixture, seed)
    if stored.shape != expected.shape or not np.allclose(stored.select("x", "y", "weight", "sigma").to_numpy(),
                                                         expected.select("x", "y", "weight", "sigma").to_numpy(),
                                                         rtol=0, atol=1e-12):
        raise ValueError(f"{mixture_file} does not match the config key `mixture` (n_ring_modes, ring_radius, sigma, "
                         "close_offset, weight_jitter): rerun the data phase")
    samples = pl.read_parquet(samples_file).select("x", "y").to_numpy().astype(np.float64)
    if samples.shape[0] != cfg.mixture.n_train:
        raise ValueError(f"{samples_file} holds {samples.shape[0]} samples but `mixture.n_train` is "
                         f"{cfg.mixture.n_train}: rerun the data phase")
    q, forget, close = data.mixture_from_table(stored)
    return q, forget, close, samples


HUB_NOT_IMPLEMENTED = ("constrained_unlearning.paper.hub: paper Stage B (Stable Diffusion / DDPM-CelebA-HQ + LoRA, "
                       "CLIP scoring) not implemented; remove the hub section to run the exact Stage A at this profile")


def refuse_unimplemented(cfg: ConstrainedUnlearningConfig) -> None:
    """A config naming the paper-scale models must not run the toy silently in their place: fail before any
    compute. The hub loaders (``data.load_diffusion_pipeline``, ``data.load_clip``) exist; the training does not."""
    if cfg.hub is not None:
        raise NotImplementedError(HUB_NOT_IMPLEMENTED)


def write_data(cfg: ConstrainedUnlearningConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase: the mixture's modes and its training samples, per seed."""
    refuse_unimplemented(cfg)
    written = []
    for seed in seeds:
        written.append(write_parquet(data.mixture_table(cfg.mixture, seed),
                                          data_dir / f"mixture_seed{seed}.parquet"))
        written.append(write_parquet(data.training_samples(cfg.mixture, seed),
                                          data_dir / f"train_seed{seed}.parquet"))
    return written


# ------------------------------------------------------------------------------------------------
# Stage A: exact checks
# ------------------------------------------------------------------------------------------------

def reference_1d() -> dict[str, float]:
    """The brief's 1-D reference numbers (seed-independent): lambda* and retained-region KL at 5% and 1%."""
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
            ) -> tuple[dict[str, float], dict[str, list[float]], dict[str, dict[str, float]]]:
    """Closed-form lambda* at the target forget mass, primal-dual from p = q, and the comparison at matched mass.

    Returns metrics, the lambda trajectories, and per formulation {lambda_star, bound} for Stage B."""
    q = method.normalise(problem.q, problem.cell)
    metrics: dict[str, float] = {}
    curves: dict[str, list[float]] = {}
    targets: dict[str, dict[str, float]] = {}
    for f in method.FORMULATIONS:
        lam_star = method.lambda_for_forget_mass(f, problem, grid_cfg.target_forget_mass)
        p_star = method.target(f, problem, lam_star)
        bound = method.constraint_value(f, p_star, problem)
        run = method.primal_dual_grid(f, problem, bound, grid_cfg.iterations, grid_cfg.primal_step,
                                      getattr(grid_cfg.dual_lr, f))
        targets[f] = {"lambda_star": lam_star, "bound": bound}
        metrics |= {
            f"a_lambda_star_{f}": lam_star,
            f"a_{f}_tv_to_closed_form": method.tv_distance(run.p, p_star, problem.cell),
            f"a_{f}_lambda_rel_error": abs(run.lam - lam_star) / lam_star,
            f"a_{f}_abs_slack": abs(run.slack),
            f"a_{f}_min_lambda": min(run.lambdas),
            f"a_{f}_retained_kl": method.retained_kl(run.p, q, problem.forget_mask, problem.cell),
            f"a_{f}_close_mass_change": method.mass(run.p, close_mask, problem.cell)
            - method.mass(q, close_mask, problem.cell),
        }
        curves[f"a_lambda_{f}"] = run.lambdas[: min(len(run.lambdas), 200)]
    metrics["a_lu_over_ru_retained_kl"] = metrics["a_lu_retained_kl"] / metrics["a_ru_retained_kl"]
    return metrics, curves, targets


# ------------------------------------------------------------------------------------------------
# Stage B: DDPM pretraining, primal-dual unlearning, baselines
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


def pretrain(cfg: ConstrainedUnlearningConfig, seed: int, pool: torch.Tensor, schedule: diffusion.NoiseSchedule,
             generator: torch.Generator, progress: Progress | None) -> tuple[torch.nn.Module, list[float]]:
    ddpm = cfg.ddpm
    model = diffusion.build_model(ddpm.hidden, ddpm.layers, ddpm.time_dim, ddpm.timesteps, seed)
    every = max(1, ddpm.pretrain_steps // 5)

    def loss(gen: torch.Generator) -> torch.Tensor:
        return diffusion.dsm_loss(model, pool[torch.randint(0, pool.shape[0], (ddpm.batch_size,), generator=gen)],
                                  schedule, gen)

    def on_step(step: int, value: float) -> None:
        if progress is not None and (step + 1) % every == 0:
            progress(0.3 * (step + 1) / ddpm.pretrain_steps,
                     f"seed {seed}: DDPM pretraining {step + 1}, loss {value:.3f}")

    losses = diffusion.train(model, loss, ddpm.pretrain_steps, ddpm.lr, generator, on_step, cosine_decay=True)
    return model, losses


def clone(model: torch.nn.Module) -> torch.nn.Module:
    twin = diffusion.EpsilonMLP(model.net[0].out_features, (len(model.net) - 1) // 2, model.time_dim,
                                model.timesteps)
    twin.load_state_dict(model.state_dict())
    return twin


def constrained_runs(cfg: ConstrainedUnlearningConfig, seed: int, pretrained: torch.nn.Module, pool: torch.Tensor,
                     q: GaussianMixture, forget: GaussianMixture, targets: dict[str, dict[str, float]],
                     evaluator: Evaluator, before: dict[str, float], model_dir: Path, progress: Progress | None
                     ) -> tuple[dict[str, float], dict[str, list[float]], list[dict], dict[str, np.ndarray]]:
    """One primal-dual unlearning run per formulation, from the pretrained weights, thresholds from Stage A."""
    un = cfg.unlearn
    pool_np = pool.numpy().astype(np.float64)
    log_q_pool, log_qu_pool = q.log_density(pool_np), forget.log_density(pool_np)
    qu_samples = forget.sample(un.dual_samples, np.random.default_rng(2_000 + seed))
    metrics: dict[str, float] = {}
    curves: dict[str, list[float]] = {}
    rows: list[dict] = []
    samples: dict[str, np.ndarray] = {}
    for i, f in enumerate(method.FORMULATIONS):
        model = clone(pretrained)
        generator = torch.Generator().manual_seed(10_000 * (seed + 1) + i)

        def constraint(points: np.ndarray, f: str = f) -> float:
            return method.sample_constraint_value(f, points, forget.log_density, qu_samples, un.knn_k)

        def report(fraction: float, f: str = f, i: int = i) -> None:
            if progress is not None:
                progress(0.3 + 0.4 * (i + fraction) / 3, f"seed {seed}: primal-dual {f.upper()} {fraction:.0%}")

        run = method.primal_dual_unlearn(
            f, model, evaluator.schedule, pool, log_q_pool, log_qu_pool, targets[f]["bound"], constraint,
            dual_updates=un.dual_updates, steps_per_dual=un.steps_per_dual, batch_size=un.batch_size, lr=un.lr,
            dual_lr=getattr(un.dual_lr, f), dual_samples=un.dual_samples, generator=generator, progress=report)
        save_state_dict(model, model_dir / f"seed{seed}" / f"unlearned_{f}.safetensors")
        samples[f] = evaluator.samples(model)
        scores = evaluator.metrics(samples[f])
        lam_star = targets[f]["lambda_star"]
        metrics |= {f"b_{f}_{k}": v for k, v in scores.items()} | {
            f"b_{f}_forget_count": forget_count(scores, samples[f]),
            f"b_{f}_lambda": run.lam,
            f"b_{f}_lambda_rel_error": abs(run.lam - lam_star) / lam_star,
            f"b_{f}_forget_mass_error": abs(scores["forget_mass"] - cfg.grid.target_forget_mass),
            f"b_{f}_final_slack": run.slacks[-1],
        }
        curves[f"b_lambda_{f}"] = run.lambdas
        rows.append({"method": f"{f.upper()} (constrained)", "family": "constrained", "param": run.lam} | scores)
    target_mass = cfg.grid.target_forget_mass
    for f in method.FORMULATIONS:
        metrics[f"b_{f}_retained_kl_at_target"] = retained_kl_at_mass(
            before, {"forget_mass": metrics[f"b_{f}_forget_mass"], "retained_kl": metrics[f"b_{f}_retained_kl"]},
            target_mass)
    floor = before["retained_kl"]
    lu_kl, ru_kl = metrics["b_lu_retained_kl_at_target"], metrics["b_ru_retained_kl_at_target"]
    metrics |= {
        # C4b: both runs' retained KL interpolated onto the target forget mass (matched mass); the sampling floor
        # is NOT subtracted (it inflates LU's small value more than RU's, so keeping it is the conservative side).
        "b_lu_over_ru_retained_kl": lu_kl / max(ru_kl, 1e-12),
        "b_lu_retained_kl_above_floor": lu_kl - floor,  # reported next to the ratio (a ratio of two
        "b_ru_retained_kl_above_floor": ru_kl - floor,  # differences near 0 would be meaningless)
        "b_lu_over_ru_retained_kl_unmatched": metrics["b_lu_retained_kl"] / max(metrics["b_ru_retained_kl"], 1e-12),
        "b_lu_ru_forget_mass_gap": abs(metrics["b_lu_forget_mass"] - metrics["b_ru_forget_mass"]),
    }
    return metrics, curves, rows, samples


def forget_count(scores: dict[str, float], samples: np.ndarray) -> float:
    """Number of evaluation samples inside the forget ball (the successes of the forget-mass rate, C5a-c):
    ``forget_mass`` is that count over the number of samples, so the product is an integer up to rounding."""
    return float(round(scores["forget_mass"] * samples.shape[0]))


def retained_kl_at_mass(before: dict[str, float], after: dict[str, float], target_mass: float) -> float:
    """Retained-region KL of an unlearning run read at ``target_mass``: linear in forget mass along the segment
    from the pretrained model (lambda = 0: its forget mass, and its retained KL, which is the sampling floor)
    to the run's end point. One run per formulation gives only these two points on its trade-off curve; the
    segment puts two runs that ended at different forget masses at the same mass (extrapolating when a run
    stopped short of the target). Equals the run's own value when it hit the target exactly."""
    m0, k0 = before["forget_mass"], before["retained_kl"]
    m1, k1 = after["forget_mass"], after["retained_kl"]
    if abs(m0 - m1) < 1e-9:  # the run did not move the forget mass: no segment to read from
        return k1
    return k0 + (k1 - k0) * (m0 - target_mass) / (m0 - m1)


def baseline_sweeps(cfg: ConstrainedUnlearningConfig, seed: int, pretrained: torch.nn.Module, pool: torch.Tensor,
                    forget: GaussianMixture, evaluator: Evaluator, progress: Progress | None) -> list[dict]:
    """Every baseline at every swept weight, fine-tuned from the pretrained weights for the same step count."""
    bl = cfg.baselines
    inside = np.linalg.norm(pool.numpy() - forget.means[0][None, :], axis=1) < 2 * forget.sigma
    retain, forget_pool = pool[torch.as_tensor(~inside)], pool[torch.as_tensor(inside)]
    reference = [p.detach().clone() for p in pretrained.parameters()]
    frozen = clone(pretrained).eval()
    schedule = evaluator.schedule
    jobs: list[tuple[str, float, Callable[[torch.nn.Module], baselines.LossFn]]] = []
    jobs += [("loss mixing", w, lambda m, w=w: baselines.loss_mixing_loss(m, schedule, retain, forget_pool, w,
                                                                          bl.batch_size)) for w in bl.loss_mixing_w]
    jobs += [("ESD-style", eta, lambda m, eta=eta: baselines.esd_loss(m, frozen, forget, schedule, pool, eta,
                                                                      bl.batch_size)) for eta in bl.esd_eta]
    jobs += [("weight reg.", mu, lambda m, mu=mu: baselines.weight_regularised_loss(m, reference, schedule,
                                                                                   forget_pool, mu, bl.batch_size))
             for mu in bl.weight_reg_mu]
    rows = []
    for j, (family, value, make_loss) in enumerate(jobs):
        model = clone(pretrained)
        generator = torch.Generator().manual_seed(20_000 * (seed + 1) + j)
        diffusion.train(model, make_loss(model), bl.steps, bl.lr, generator)
        rows.append({"method": f"{family} {value:g}", "family": family, "param": value}
                    | evaluator.metrics(evaluator.samples(model)))
        if progress is not None:
            progress(0.7 + 0.3 * (j + 1) / len(jobs), f"seed {seed}: baseline {family} {value:g}")
    return rows


def pareto_gap(rows: list[dict], point: dict) -> float:
    """Retained KL of the best baseline at the constrained point's forget mass (linear interpolation along
    each family's sweep, sorted by forget mass) minus the point's retained KL; NaN outside every sweep."""
    gaps = []
    for family in {r["family"] for r in rows if r["family"] != "constrained"}:
        sweep = sorted((r["forget_mass"], r["retained_kl"]) for r in rows if r["family"] == family)
        masses = [s[0] for s in sweep]
        if masses[0] <= point["forget_mass"] <= masses[-1]:
            gaps.append(float(np.interp(point["forget_mass"], masses, [s[1] for s in sweep])))
    return min(gaps) - point["retained_kl"] if gaps else float("nan")


def data_unlearning(cfg: ConstrainedUnlearningConfig, seed: int, retrain: torch.nn.Module, pool: np.ndarray,
                    q: GaussianMixture, schedule: diffusion.NoiseSchedule, reference: np.ndarray,
                    retrain_samples: np.ndarray, model_dir: Path, progress: Progress | None
                    ) -> tuple[dict[str, float], dict[str, list[float]], dict[str, np.ndarray]]:
    """Stage C, data unlearning with FU (brief: "pretrain with duplicated forget points, nearest-neighbour
    distance as an SSCD proxy").

    1. The Stage B model, trained on q's samples only, is the *retrain* reference (the model that never saw the
       duplicates). It is fine-tuned on the pool plus ``n_points`` forget points x ``duplicates`` copies: the
       *memorised* model.
    2. FU primal-dual from the memorised model on the same training set: primal loss DSM_q - lambda DSM_{q_u}
       (importance weights (q - lambda q_u)_+ / q on the atoms, :func:`method.empirical_log_masses`); the dual
       step estimates KL(q_u~ || p) by k-NN from the model's samples, q_u~ the forget points smoothed by a
       Gaussian of width radius. The bound b is that estimate for the retrain reference (fixed rule: forget as
       far as a model that never saw the duplicates).
    3. Memorisation proxy: fraction of samples within radius of a forget point vs of a held-out twin of the same
       q-density (:func:`method.near_fraction`); retained-region KL outside the forget balls vs the reference.
    """
    du, ddpm = cfg.data_unlearn, cfg.ddpm
    sigma = q.sigma
    radius = du.radius_sigmas * sigma
    forget_pts, heldout_pts = data.duplicated_forget_points(q, du.n_points, du.offset_sigmas * sigma, seed)
    train_np, is_forget = data.duplicated_training_set(pool, forget_pts, du.duplicates)
    train_t = torch.as_tensor(train_np, dtype=torch.float32)
    share = float(is_forget.mean())
    eval_gen = torch.Generator().manual_seed(40_000 + seed)
    n_eval = ddpm.eval_samples

    def proxies(samples: np.ndarray) -> dict[str, float]:
        near_f = method.near_fraction(samples, forget_pts, radius)
        near_h = method.near_fraction(samples, heldout_pts, radius)
        return {"forget_near": near_f, "heldout_near": near_h,
                "memorisation_ratio": method.memorisation_ratio(near_f, near_h, samples.shape[0]),
                "retained_kl": method.histogram_retained_kl(samples, reference, forget_pts, radius,
                                                            ddpm.histogram_bins, cfg.grid.half_width)}

    metrics = {f"c_retrain_{k}": v for k, v in proxies(retrain_samples).items()}
    metrics |= {"c_duplicate_share": share,
                "c_heldout_density_ratio": float(np.mean(q.density(forget_pts)) / np.mean(q.density(heldout_pts)))}

    # 1. memorisation: fine-tune the retrain reference on the duplicated training set
    model = clone(retrain)
    gen = torch.Generator().manual_seed(30_000 + seed)

    def memorise_loss(g: torch.Generator) -> torch.Tensor:
        index = torch.randint(0, train_t.shape[0], (du.batch_size,), generator=g)
        return diffusion.dsm_loss(model, train_t[index], schedule, g)

    diffusion.train(model, memorise_loss, du.memorise_steps, du.memorise_lr, gen, cosine_decay=True)
    save_state_dict(model, model_dir / f"seed{seed}" / "memorised.safetensors")
    memorised = diffusion.sample(model, schedule, n_eval, eval_gen).numpy().astype(np.float64)
    metrics |= {f"c_memorised_{k}": v for k, v in proxies(memorised).items()}
    if progress is not None:
        progress(1.0, f"seed {seed}: data unlearning, memorised ratio {metrics['c_memorised_memorisation_ratio']:.2f}")

    # 2. FU primal-dual from the memorised model
    kernel_rng = np.random.default_rng(50_000 + seed)
    qu_samples = (forget_pts[kernel_rng.integers(0, du.n_points, du.dual_samples)]
                  + radius * kernel_rng.standard_normal((du.dual_samples, 2)))
    k = cfg.unlearn.knn_k if cfg.unlearn is not None else 5

    def constraint(points: np.ndarray) -> float:
        return method.knn_kl(qu_samples, points, k)

    bound_samples = diffusion.sample(retrain, schedule, du.dual_samples, torch.Generator().manual_seed(
        60_000 + seed)).numpy().astype(np.float64)
    bound = constraint(bound_samples)
    log_q_atoms, log_qu_atoms = method.empirical_log_masses(is_forget)
    run = method.primal_dual_unlearn(
        "fu", model, schedule, train_t, log_q_atoms, log_qu_atoms, bound, constraint,
        dual_updates=du.dual_updates, steps_per_dual=du.steps_per_dual, batch_size=du.batch_size, lr=du.lr,
        dual_lr=du.dual_lr, dual_samples=du.dual_samples, generator=torch.Generator().manual_seed(70_000 + seed))
    save_state_dict(model, model_dir / f"seed{seed}" / "data_unlearned_fu.safetensors")
    unlearned = diffusion.sample(model, schedule, n_eval, eval_gen).numpy().astype(np.float64)
    fu = proxies(unlearned)
    metrics |= {f"c_fu_{k}": v for k, v in fu.items()} | {
        "c_fu_lambda": run.lam,
        "c_fu_lambda_over_share": run.lam / share,  # FU identity: lambda >= share <=> retain-only training
        "c_fu_bound": bound,
        "c_fu_final_slack": run.slacks[-1],
        # retained-region floor: a second draw of the retrain reference against its own reference samples
        "c_fu_retained_kl_over_floor": fu["retained_kl"] / max(metrics["c_retrain_retained_kl"], 1e-12),
    }
    curves = {"c_lambda_fu": run.lambdas}
    samples = {"forget_points": forget_pts, "heldout_points": heldout_pts, "memorised": memorised,
               "data-unlearned FU": unlearned}
    return metrics, curves, samples


def stage_b(cfg: ConstrainedUnlearningConfig, seed: int, q: GaussianMixture, forget: GaussianMixture,
            close: np.ndarray, train_points: np.ndarray, targets: dict[str, dict[str, float]], model_dir: Path,
            progress: Progress | None) -> tuple[dict[str, float], dict[str, list[float]], dict[str, list[dict]]]:
    ddpm = cfg.ddpm
    schedule = diffusion.NoiseSchedule.linear(ddpm.timesteps)
    pool = torch.as_tensor(train_points, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    model, losses = pretrain(cfg, seed, pool, schedule, generator, progress)
    save_state_dict(model, model_dir / f"seed{seed}" / "pretrained.safetensors")
    model.eval()
    sample_gen = torch.Generator().manual_seed(5_000 + seed)
    reference = diffusion.sample(model, schedule, 2 * ddpm.eval_samples, sample_gen).numpy().astype(np.float64)
    evaluator = Evaluator(cfg, forget, close, schedule, reference, sample_gen)
    before_samples = evaluator.samples(model)
    before = evaluator.metrics(before_samples)
    metrics = {f"b_pretrained_{k}": v for k, v in before.items()}
    metrics |= {"b_pretrained_forget_count": forget_count(before, before_samples),
                "b_eval_samples": float(before_samples.shape[0])}
    metrics["b_pretrained_off_mode_fraction"] = float(np.mean(
        np.min(np.linalg.norm(before_samples[:, None, :] - q.means[None], axis=2), axis=1) > 3 * q.sigma))
    rows = [{"method": "pretrained", "family": "pretrained", "param": 0.0} | before]
    curves: dict[str, list[float]] = {"b_pretrain_loss": losses[:: max(1, len(losses) // 500)]}
    scatter = {"pretrained": before_samples}
    if cfg.unlearn is not None:
        c_metrics, c_curves, c_rows, c_samples = constrained_runs(cfg, seed, model, pool, q, forget, targets,
                                                                  evaluator, before, model_dir, progress)
        metrics |= c_metrics
        curves |= c_curves
        rows += c_rows
        scatter |= c_samples
    if cfg.baselines is not None:
        b_rows = baseline_sweeps(cfg, seed, model, pool, forget, evaluator, progress)
        rows += b_rows
        for row in (r for r in rows if r["family"] == "constrained"):
            gap = pareto_gap(rows, row)
            if not np.isnan(gap):  # only when some baseline sweep spans the constrained point's forget mass
                metrics[f"b_{row['method'][:2].lower()}_pareto_gap"] = gap
    tables = {"tradeoff": rows,
              "samples": [{"method": name, "x": float(x), "y": float(y)}
                          for name, points in scatter.items() for x, y in points[:SCATTER_POINTS]]}
    if cfg.data_unlearn is not None:
        d_metrics, d_curves, d_samples = data_unlearning(cfg, seed, model, train_points, q, schedule, reference,
                                                         before_samples, model_dir, progress)
        metrics |= d_metrics
        curves |= d_curves
        tables["data_unlearning"] = [{"set": name, "x": float(x), "y": float(y)}
                                     for name, points in d_samples.items() for x, y in points[:DATA_SCATTER_POINTS]]
    return metrics, curves, tables


# ------------------------------------------------------------------------------------------------
# One seed, end to end
# ------------------------------------------------------------------------------------------------

def run_seed(cfg: ConstrainedUnlearningConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress | None = None) -> SeedResult:
    """Stage A (exact) and Stage B (DDPM) for one seed. The toy runs on the CPU whatever ``device`` says: its
    2-D MLP is too small to gain from an accelerator."""
    refuse_unimplemented(cfg)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    q, forget, close, train_points = load_seed_data(cfg, seed, data_dir)
    grid, problem = data.grid_problem(q, forget, cfg.grid)
    metrics = reference_1d() | identity_checks(grid, problem, q, forget)
    a_metrics, curves, targets = stage_a(cfg.grid, problem, grid.ball(close, 2 * forget.sigma))
    metrics |= a_metrics
    timings["stage_a"] = time.perf_counter() - start
    tables: dict[str, Any] = {}
    if cfg.ddpm is not None:
        b_metrics, b_curves, tables = stage_b(cfg, seed, q, forget, close, train_points, targets, model_dir, progress)
        metrics |= b_metrics
        curves |= b_curves
        timings["stage_b"] = time.perf_counter() - start - timings["stage_a"]
    metrics |= {f"seconds_{k}": v for k, v in timings.items()}
    return {"seed": seed, "metrics": metrics, "curves": curves, "tables": tables}
