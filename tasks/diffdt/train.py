"""Training step of diffdt: stage one, the three event backbones (Delphi-like, + SDoH tokens, DiffDT with SDoH and
sensor tokens); stage two, the diffusion models conditioned on the frozen SDoH backbone (conditional and
unconditional tabular DDPM per organ; geometric and Euclidean brain follow-up models)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from tasks.common.io import save_state_dict, write_with
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.diffdt import features, fit
from tasks.diffdt.config import DiffdtConfig
from tasks.diffdt.data import load_cohort
from tasks.diffdt.sequences import build_sequences, vocabulary

STATS = "stats.safetensors"
N_POSITIONS = 8  # position ids are all 0: order enters through age and causal attention (method.EventBackbone)


def backbone_file(name: str) -> str:
    return f"backbone_{name}.safetensors"


def denoiser_file(name: str) -> str:
    return f"ddpm_{name}.safetensors"


def follow_up_years(cfg: DiffdtConfig) -> float:
    return cfg.cohort.follow_up if cfg.cohort is not None else 10.0


def train(cfg: DiffdtConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    torch.set_num_threads(1)  # seeds run in parallel on 2 cores
    result = SeedResult(seed)
    model_dir = Path(model_dir)
    data = load_cohort(data_dir, seed, "train")
    vocab = vocabulary(data.sdoh_onset.shape[1], data.event_age.shape[1])
    follow_up = follow_up_years(cfg)
    stats = features.fit_stats(data, cfg.diffusion.brain_latent_dim)
    write_with(model_dir / STATS, lambda tmp: save_file({k: v.contiguous() for k, v in stats.items()}, str(tmp)))
    latents = features.organ_latents(data, stats)
    curves, backbones = {}, {}
    with result.stage("backbones"):
        for i, (name, (with_sdoh, with_sensors)) in enumerate(features.BACKBONES.items()):
            tokens, ages = build_sequences(data, vocab, follow_up, with_sdoh, with_sensors, cut_at_baseline=False)
            model = fit.build_backbone(vocab, features.sensor_dims(stats), cfg.backbone, N_POSITIONS, seed)
            losses = fit.train_backbone(model, tokens, ages, latents if with_sensors else None, cfg.backbone,
                                        seed + 100 * i)
            save_state_dict(model, model_dir / backbone_file(name))
            curves[f"loss_{name}"], backbones[name] = losses, model
            progress((i + 1) / 6, f"backbone {name}: final loss {losses[-1]:.4f}")
    cond = features.conditions(backbones[features.CONDITION_BACKBONE], data, follow_up, stats)
    with result.stage("diffusion"):
        for organ in features.TABULAR:
            rows = torch.from_numpy(data.imaged[organ])
            z0 = features.tabular_target(data, organ, stats)
            for kind, dropout in (("cond", cfg.diffusion.cond_dropout), ("uncond", 1.0)):
                model = fit.build_denoiser(z0.shape[1], cond.shape[1], cfg.diffusion, seed)
                curves[f"loss_{organ}_{kind}"] = fit.train_denoiser(model, z0, cond[rows], cfg.diffusion, seed,
                                                                    dropout)
                save_state_dict(model, model_dir / denoiser_file(f"{organ}_{kind}"))
        progress(4 / 6, "tabular diffusion trained")
        brain_cond = features.brain_conditions(cond, data, stats)
        for kind, z0 in (("geometric", features.geometric_target(data, stats)),
                         ("euclidean", features.euclidean_target(data, stats))):
            model = fit.build_denoiser(z0.shape[1], brain_cond.shape[1], cfg.diffusion, seed, brain=True)
            curves[f"loss_brain_{kind}"] = fit.train_denoiser(model, z0, brain_cond, cfg.diffusion, seed,
                                                              cfg.diffusion.cond_dropout)
            save_state_dict(model, model_dir / denoiser_file(f"brain_{kind}"))
    progress(1.0, "diffusion models trained")
    tail = max(1, len(curves["loss_diffdt"]) // 10)
    return result.add({f"final_{name}": sum(c[-tail:]) / len(c[-tail:]) for name, c in curves.items()},
                      curves=curves, n_train=data.n, n_brain_follow_train=int(data.brain_follow.sum()))
