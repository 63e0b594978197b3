"""Data of constrained_unlearning.

smoke / cpu: a procedural 2-D Gaussian mixture per seed (ring of modes, a "close" mode next to the forget
mode), its parameters and its training samples as parquet. paper: hub checkpoints loaded by name with
``diffusers`` (not installed in this project's environment: a clear error says so) and CLIP with
``transformers``; tests use local stand-ins only.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from tasks.constrained_unlearning import method
from tasks.constrained_unlearning.config import GridConfig, MixtureConfig
from tasks.constrained_unlearning.mixture import GaussianMixture, single_gaussian

FORGET_MODE = 0  # index of the ring mode to unlearn
ROLES = ("forget", "ring", "close")


def mixture_table(cfg: MixtureConfig, seed: int) -> pl.DataFrame:
    """One row per mode: role, centre, weight. The seed draws the ring phase and the weight jitter."""
    rng = np.random.default_rng(seed)
    phase = rng.uniform(0, 2 * np.pi)
    angles = phase + 2 * np.pi * np.arange(cfg.n_ring_modes) / cfg.n_ring_modes
    ring = cfg.ring_radius * np.stack([np.cos(angles), np.sin(angles)], axis=1)
    close = (cfg.ring_radius + cfg.close_offset) * np.array([np.cos(angles[FORGET_MODE]),
                                                             np.sin(angles[FORGET_MODE])])
    centres = np.vstack([ring, close])
    raw = 1 + cfg.weight_jitter * rng.uniform(-1, 1, size=len(centres))
    roles = ["forget" if i == FORGET_MODE else "ring" for i in range(cfg.n_ring_modes)] + ["close"]
    return pl.DataFrame({"role": roles, "x": centres[:, 0], "y": centres[:, 1], "weight": raw / raw.sum(),
                         "sigma": np.full(len(centres), cfg.sigma)})


def mixture_from_table(frame: pl.DataFrame) -> tuple[GaussianMixture, GaussianMixture, np.ndarray]:
    """(q, q_u, close-mode centre) from :func:`mixture_table`'s rows."""
    means = frame.select("x", "y").to_numpy().astype(np.float64)
    sigma = float(frame["sigma"][0])
    roles = frame["role"].to_list()
    q = GaussianMixture(means, frame["weight"].to_numpy().astype(np.float64), sigma)
    forget = single_gaussian(means[roles.index("forget")], sigma)
    return q, forget, means[roles.index("close")]


def training_samples(cfg: MixtureConfig, seed: int) -> pl.DataFrame:
    """``n_train`` samples of q (the pretraining data; also the pool the unlearning reweights)."""
    q, _, _ = mixture_from_table(mixture_table(cfg, seed))
    points = q.sample(cfg.n_train, np.random.default_rng(1_000 + seed))
    return pl.DataFrame({"x": points[:, 0], "y": points[:, 1]})


def duplicated_forget_points(q: GaussianMixture, n_points: int, offset: float, seed: int
                             ) -> tuple[np.ndarray, np.ndarray]:
    """(forget points, held-out points), each (n_points, 2), for the data-unlearning variant.

    Point i sits at ``offset`` from the centre of ring mode i + 1 (the Stage B forget mode 0 and the close mode
    are skipped) in a seeded random direction u_i; its held-out twin is the reflection mu - offset u_i through
    the same centre, so both have the same density under the mode's isotropic Gaussian (the other modes add
    a negligible, reported difference: ``heldout_density_ratio``)."""
    ring = q.means[:-1]  # mixture_table puts the close mode last
    if not 1 <= n_points <= len(ring) - 1:
        raise ValueError(f"n_points must be in [1, {len(ring) - 1}] (one per ring mode other than the forget mode), "
                         f"got {n_points}")
    rng = np.random.default_rng(3_000 + seed)
    angles = rng.uniform(0, 2 * np.pi, size=n_points)
    u = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    centres = ring[FORGET_MODE + 1: FORGET_MODE + 1 + n_points]
    return centres + offset * u, centres - offset * u


def duplicated_training_set(pool: np.ndarray, forget_points: np.ndarray, duplicates: int
                            ) -> tuple[np.ndarray, np.ndarray]:
    """(training points, is_forget): the pool of q-samples plus every forget point repeated ``duplicates`` times."""
    if duplicates < 1:
        raise ValueError(f"duplicates must be >= 1, got {duplicates}")
    copies = np.repeat(np.atleast_2d(forget_points), duplicates, axis=0)
    points = np.vstack([pool, copies])
    is_forget = np.zeros(points.shape[0], dtype=bool)
    is_forget[pool.shape[0]:] = True
    return points, is_forget


def grid_problem(q: GaussianMixture, forget: GaussianMixture, grid_cfg: GridConfig
                 ) -> tuple[method.Grid, method.GridProblem]:
    """q and q_u on the 2-D grid, with the forget region |x - mu_forget| < 2 sigma."""
    grid = method.Grid.regular(-grid_cfg.half_width, grid_cfg.half_width, grid_cfg.size, 2)
    problem = method.GridProblem(q.log_density(grid.points), forget.log_density(grid.points), grid.cell,
                                 grid.ball(forget.means[0], 2 * forget.sigma))
    return grid, problem


# ------------------------------------------------------------------------------------------------
# Paper profile: hub checkpoints (never called at smoke/cpu; tests use local stand-ins)
# ------------------------------------------------------------------------------------------------


def load_diffusion_pipeline(name_or_path: str, dtype: str = "float16"):
    """A Stable Diffusion / DDPM pipeline by hub name (``CompVis/stable-diffusion-v1-4``,
    ``nota-ai/bk-sdm-tiny``, ``google/ddpm-celebahq-256``) or a local folder."""
    try:
        import diffusers
    except ImportError as err:
        raise ImportError("the paper profile of constrained_unlearning needs `diffusers` (and `peft` for LoRA): "
                          "pip install diffusers peft") from err
    import torch

    return diffusers.DiffusionPipeline.from_pretrained(name_or_path, torch_dtype=getattr(torch, dtype))


def load_clip(name_or_path: str):
    """CLIP model and processor (``openai/clip-vit-base-patch32``) for the concept score."""
    from transformers import CLIPModel, CLIPProcessor

    return CLIPModel.from_pretrained(name_or_path).eval(), CLIPProcessor.from_pretrained(name_or_path)


def clip_concept_score(model, processor, images, concept: str) -> np.ndarray:
    """Cosine similarity between each image and the text ``concept`` (the paper's unlearning score)."""
    import torch

    inputs = processor(text=[concept], images=images, return_tensors="pt", padding=True)
    with torch.no_grad():
        image = model.get_image_features(pixel_values=inputs["pixel_values"])
        text = model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    image = image / image.norm(dim=-1, keepdim=True)
    text = text / text.norm(dim=-1, keepdim=True)
    return (image @ text.T)[:, 0].numpy()


# ------------------------------------------------------------------------------------------------
# The brief's 1-D reference problem (fixed; acceptance check (a)5)
# ------------------------------------------------------------------------------------------------

REFERENCE_1D = {"modes": (-6.0, -2.0, 2.0, 6.0), "sigma": 0.7, "forget": 2.0, "far": -6.0, "half_width": 12.0}


def reference_problem_1d(points: int = 24_001) -> tuple[method.GridProblem, np.ndarray]:
    """4-mode GMM at +-2, +-6 (sigma 0.7, equal weights) on [-12, 12], forget the +2 mode; the forget region
    is |x - 2| < 2 sigma. Returns the problem and the far-mode mask |x + 6| < 2 sigma."""
    ref = REFERENCE_1D
    grid = method.Grid.regular(-ref["half_width"], ref["half_width"], points, 1)
    n_modes = len(ref["modes"])
    q = GaussianMixture(np.array(ref["modes"])[:, None], np.full(n_modes, 1 / n_modes), ref["sigma"])
    forget = single_gaussian(np.array([ref["forget"]]), ref["sigma"])
    problem = method.GridProblem(q.log_density(grid.points), forget.log_density(grid.points), grid.cell,
                                 grid.ball(forget.means[0], 2 * ref["sigma"]))
    return problem, grid.ball(np.array([ref["far"]]), 2 * ref["sigma"])
