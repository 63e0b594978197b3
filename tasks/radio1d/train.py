"""Training step of radio1d: the two teachers, then the elastic student, the fixed-k students and the plain
ViT distilled from them; one safetensors checkpoint each in ``model_dir``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from tasks.common.io import save_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.schedules import warmup_cosine
from tasks.common.seeding import torch_init_seed
from tasks.radio1d import method
from tasks.radio1d.baselines import DenseTeacher, PlainViT, SummaryTeacher
from tasks.radio1d.config import Radio1DConfig, TrainConfig
from tasks.radio1d.data import CANVAS, load_scenes

TEACHERS = "teachers.safetensors"
ELASTIC = "student_elastic.safetensors"
PLAIN = "plain_vit.safetensors"


def fixed_checkpoint(k: int) -> str:
    return f"student_fixed{k}.safetensors"


class Teachers(nn.Module):
    """Both frozen teachers and the train-set standardisation of their features: t -> (t - mean) / scale with
    scale^2 = E||t - mean||^2, so both targets have unit total variance per vector (a scalar stand-in for
    the C-RADIOv4 recipe's PHI-S balancing; RECONSTRUCTED)."""

    def __init__(self, summary_dim: int, dense_dim: int) -> None:
        super().__init__()
        self.summary, self.dense = SummaryTeacher(summary_dim), DenseTeacher(dense_dim)
        self.register_buffer("summary_mean", torch.zeros(summary_dim))
        self.register_buffer("dense_mean", torch.zeros(dense_dim))
        self.register_buffer("scales", torch.ones(2))

    def raw(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.summary.features(images), self.dense.features(images)

    @torch.no_grad()
    def fit_standardisation(self, images: torch.Tensor) -> None:
        summary, dense = self.raw(images)
        self.summary_mean.copy_(summary.mean(0))
        self.dense_mean.copy_(dense.mean((0, 1)))
        self.scales.copy_(torch.stack([((summary - self.summary_mean) ** 2).sum(-1).mean().sqrt(),
                                       ((dense - self.dense_mean) ** 2).sum(-1).mean().sqrt()]))

    @torch.no_grad()
    def targets(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        summary, dense = self.raw(images)
        return (summary - self.summary_mean) / self.scales[0], (dense - self.dense_mean) / self.scales[1]


def build_student(cfg: Radio1DConfig, seed: int) -> method.Radio1D:
    s, t = cfg.student, cfg.teacher
    with torch_init_seed(seed):
        return method.Radio1D(CANVAS, s.patch_size, s.width, s.heads, s.depth_before, s.depth_after, s.registers,
                              s.decoder_depth_before, s.decoder_depth_after, t.summary_dim, t.dense_dim)


def build_plain(cfg: Radio1DConfig, seed: int) -> PlainViT:
    s, t = cfg.student, cfg.teacher
    with torch_init_seed(seed):
        return PlainViT(CANVAS, s.patch_size, s.width, s.heads, s.plain_depth, t.summary_dim, t.dense_dim)


def build_teachers(cfg: Radio1DConfig, seed: int) -> Teachers:
    with torch_init_seed(seed):
        return Teachers(cfg.teacher.summary_dim, cfg.teacher.dense_dim)


def batches(n: int, batch_size: int, epochs: int, generator: torch.Generator):
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator)
        for start in range(0, n - batch_size + 1, batch_size):
            yield order[start:start + batch_size]


def fit(model: nn.Module, loss_of, n: int, batch_size: int, epochs: int, lr: float, weight_decay: float,
        warmup_fraction: float, generator: torch.Generator) -> list[float]:
    """AdamW + warm-up cosine over ``epochs`` passes; returns the mean loss per epoch."""
    steps_per_epoch = max(1, n // batch_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    schedule = warmup_cosine(optimizer, steps_per_epoch * epochs, round(warmup_fraction * steps_per_epoch * epochs))
    losses, running = [], []
    model.train()
    for step, index in enumerate(batches(n, batch_size, epochs, generator)):
        loss = loss_of(index)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        running.append(float(loss.detach()))
        if (step + 1) % steps_per_epoch == 0:
            losses.append(sum(running) / len(running))
            running = []
    model.eval()
    return losses


def train_teachers(cfg: Radio1DConfig, teachers: Teachers, images: torch.Tensor, layouts: torch.Tensor,
                   presence: torch.Tensor, generator: torch.Generator) -> dict[str, list[float]]:
    """Summary teacher: BCE on presence; dense teacher: cross-entropy on the digit-or-empty of each quadrant."""
    t = cfg.teacher
    summary_curve = fit(teachers.summary, lambda i: F.binary_cross_entropy_with_logits(
        teachers.summary(images[i]), presence[i]), len(images), t.batch_size, t.epochs, t.lr, 0.0, 0.05, generator)
    dense_curve = fit(teachers.dense, lambda i: F.cross_entropy(
        teachers.dense(images[i]).flatten(0, 1), layouts[i].flatten()), len(images), t.batch_size, t.epochs, t.lr,
        0.0, 0.05, generator)
    teachers.requires_grad_(False)
    teachers.fit_standardisation(images)
    return {"teacher_summary_loss": summary_curve, "teacher_dense_loss": dense_curve}


def distill(model: nn.Module, tc: TrainConfig, images: torch.Tensor, summary_t: torch.Tensor,
            dense_t: torch.Tensor, generator: torch.Generator, fixed_k: int | None) -> list[float]:
    """Agglomerative distillation of ``model``; k per sample from the configured sampler, or ``fixed_k``."""
    k_max = getattr(model, "max_tokens", 1)

    def loss_of(index: torch.Tensor) -> torch.Tensor:
        k = method.sample_num_tokens("fixed" if fixed_k else tc.sampler, len(index), k_max, generator,
                                     beta=tc.beta, modes=tc.modes, sigma=tc.sigma, fixed_k=fixed_k)
        summary, dense = model(images[index], k)
        return method.distillation_loss(summary, summary_t[index], dense, dense_t[index])

    return fit(model, loss_of, len(images), tc.batch_size, tc.epochs, tc.lr, tc.weight_decay, tc.warmup_fraction,
               generator)


@dataclass(frozen=True)
class StudentSpec:
    name: str
    checkpoint: str
    fixed_k: int | None
    plain: bool = False


def student_specs(cfg: Radio1DConfig) -> list[StudentSpec]:
    specs = [StudentSpec("elastic", ELASTIC, None)]
    specs += [StudentSpec(f"fixed{k}", fixed_checkpoint(k), k) for k in cfg.train.fixed_ks]
    return specs + [StudentSpec("plain", PLAIN, None, plain=True)]


def train(cfg: Radio1DConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    if cfg.hub is not None:  # paper profile: the released checkpoint is evaluated, nothing is trained
        return result
    scenes = load_scenes(data_dir, "train", seed)
    generator = torch.Generator().manual_seed(seed)
    teachers = build_teachers(cfg, seed)
    with result.stage("teachers"):
        curves = train_teachers(cfg, teachers, scenes.images, scenes.layouts, scenes.presence, generator)
    save_state_dict(teachers, Path(model_dir) / TEACHERS)
    summary_t, dense_t = teachers.targets(scenes.images)
    specs = student_specs(cfg)
    for i, spec in enumerate(specs):
        model = build_plain(cfg, seed) if spec.plain else build_student(cfg, seed)
        with result.stage(f"student_{spec.name}"):
            curves[f"loss_{spec.name}"] = distill(model, cfg.train, scenes.images, summary_t, dense_t, generator,
                                                  spec.fixed_k)
        save_state_dict(model, Path(model_dir) / spec.checkpoint)
        progress((i + 1) / len(specs), f"{spec.name}: final loss {curves[f'loss_{spec.name}'][-1]:.4f}")
    return result.add({f"final_loss_{s.name}": curves[f"loss_{s.name}"][-1] for s in specs}, curves=curves)
