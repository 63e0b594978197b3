"""What train and evaluate compute the same way: standardisation statistics (fitted on the training split),
organ latents for the sensor tokens, the diffusion conditions and the brain models' targets."""

from __future__ import annotations

import numpy as np
import torch

from tasks.diffdt import cohort, method
from tasks.diffdt.data import Cohort
from tasks.diffdt.sequences import build_sequences, last_positions

BACKBONES = {"delphi": (False, False), "delphi_sdoh": (True, False), "diffdt": (True, True)}
"""(with SDoH tokens, with sensor tokens) of the Delphi-like baseline (i), the SDoH ablation (ii) and DiffDT."""
CONDITION_BACKBONE = "delphi_sdoh"
"""The frozen backbone whose state at the baseline visit conditions the diffusion models (stage two): the one
without sensor tokens, since the sensors are what the diffusion models generate."""
TABULAR = tuple(cohort.TRAIT_DIMS)


def _mean_sd(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return x.mean(dim=0), x.std(dim=0).clamp(min=1e-6)


def _pca(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, top-k principal directions (k, d) and their standard deviations (k,) of the rows of x."""
    mean = x.mean(dim=0)
    _, sing, vt = torch.linalg.svd(x - mean, full_matrices=False)
    k = min(k, vt.shape[0])
    return mean, vt[:k], (sing[:k] / max(1, x.shape[0] - 1) ** 0.5).clamp(min=1e-9)


def fit_stats(train: Cohort, brain_latent_dim: int) -> dict[str, torch.Tensor]:
    """Means and sds of every standardised quantity, the brain's reference point (log-Euclidean mean of the
    training baseline connectivity) and the linear encoders (whitened PCA, ``brain_latent_dim`` components) of the
    two brain follow-up targets: the tangent increment (geometric) and the Euclidean increment."""
    stats: dict[str, torch.Tensor] = {}
    for organ in TABULAR:
        x = torch.from_numpy(train.traits[organ][train.imaged[organ]])
        stats[f"{organ}_mean"], stats[f"{organ}_sd"] = _mean_sd(x)
    c1 = torch.from_numpy(train.brain_c1[train.imaged["brain"]])
    stats["brain_ref"] = method.log_euclidean_mean(c1)
    lat = method.vech(method.tangent_at(stats["brain_ref"], c1))
    stats["brain_mean"], stats["brain_sd"] = _mean_sd(lat)
    follow = train.brain_follow
    c1f, c2f = torch.from_numpy(train.brain_c1[follow]), torch.from_numpy(train.brain_c2[follow])
    for name, x in (("geo", method.vech(method.tangent_at(c1f, c2f))), ("euc", method.vech(c2f - c1f))):
        stats[f"{name}_mean"], stats[f"{name}_basis"], stats[f"{name}_scale"] = _pca(x, brain_latent_dim)
    stats["eig_floor"] = torch.linalg.eigvalsh(c2f)[:, 0].min().reshape(1)
    dt = torch.from_numpy(train.brain_dt[follow])
    stats["dt_mean"], stats["dt_sd"] = dt.mean().reshape(1), dt.std().clamp(min=1e-6).reshape(1)
    ages = torch.from_numpy(train.baseline)
    stats["age_mean"], stats["age_sd"] = ages.mean().reshape(1), ages.std().reshape(1)
    return stats


def organ_latents(data: Cohort, stats: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Standardised organ latents (N, d) per organ, zero where the organ was not imaged. The brain's is
    vech(logm(B^-1/2 C1 B^-1/2)) at the reference B (136 numbers at 16 ROIs)."""
    out = {}
    for organ in TABULAR:
        x = (torch.from_numpy(data.traits[organ]) - stats[f"{organ}_mean"]) / stats[f"{organ}_sd"]
        out[organ] = torch.where(torch.from_numpy(data.imaged[organ]).unsqueeze(-1), x, torch.zeros_like(x)).float()
    lat = method.vech(method.tangent_at(stats["brain_ref"], torch.from_numpy(data.brain_c1)))
    lat = (lat - stats["brain_mean"]) / stats["brain_sd"]
    out["brain"] = torch.where(torch.from_numpy(data.imaged["brain"]).unsqueeze(-1), lat, torch.zeros_like(lat)).float()
    return out


def sensor_dims(stats: dict[str, torch.Tensor]) -> dict[str, int]:
    return {**{o: int(stats[f"{o}_mean"].shape[0]) for o in TABULAR}, "brain": int(stats["brain_mean"].shape[0])}


def baseline_prefix(data: Cohort, vocab: method.Vocabulary, name: str, follow_up: float,
                    insert_sdoh: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    with_sdoh, with_sensors = BACKBONES[name]
    return build_sequences(data, vocab, follow_up, with_sdoh, with_sensors, cut_at_baseline=True,
                           insert_sdoh=insert_sdoh)


@torch.no_grad()
def baseline_log_rates(model: method.EventBackbone, data: Cohort, name: str, follow_up: float,
                       stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """Log-rates (N, n_events) at the last token known at the baseline visit."""
    tokens, ages = baseline_prefix(data, model.vocab, name, follow_up)
    sensors = organ_latents(data, stats) if BACKBONES[name][1] else None
    logits = model(tokens, ages, sensors)
    return logits[torch.arange(tokens.shape[0]), last_positions(tokens)]


@torch.no_grad()
def conditions(model: method.EventBackbone, data: Cohort, follow_up: float, stats: dict[str, torch.Tensor]
               ) -> torch.Tensor:
    """c = [backbone state at the baseline visit, SDoH multi-hot at baseline, standardised age, male]."""
    tokens, ages = baseline_prefix(data, model.vocab, CONDITION_BACKBONE, follow_up)
    hidden = model.hidden(tokens, ages)[torch.arange(tokens.shape[0]), last_positions(tokens)]
    sdoh = torch.from_numpy(data.sdoh_onset <= data.baseline[:, None]).float()
    age = ((torch.from_numpy(data.baseline) - stats["age_mean"]) / stats["age_sd"]).float().unsqueeze(-1)
    male = torch.from_numpy(data.male).float().unsqueeze(-1)
    return torch.cat([hidden, sdoh, age, male], dim=-1)


def brain_conditions(cond: torch.Tensor, data: Cohort, stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """Brain follow-up condition: [c, latent of C1, standardised dt] on the follow-up rows."""
    latents = organ_latents(data, stats)["brain"]
    dt = ((torch.from_numpy(data.brain_dt) - stats["dt_mean"]) / stats["dt_sd"]).float().unsqueeze(-1)
    rows = torch.from_numpy(data.brain_follow)
    return torch.cat([cond, latents, dt], dim=-1)[rows]


def encode(x: torch.Tensor, stats: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """Whitened PCA latent of a brain target (the latent of latent diffusion; a linear auto-encoder)."""
    return ((x - stats[f"{name}_mean"]) @ stats[f"{name}_basis"].T / stats[f"{name}_scale"]).float()


def decode(latent: torch.Tensor, stats: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return (latent.double() * stats[f"{name}_scale"]) @ stats[f"{name}_basis"] + stats[f"{name}_mean"]


def geometric_target(data: Cohort, stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """Latent of vech(logm(C1^-1/2 C2 C1^-1/2)) on the follow-up rows (the geometric model's data)."""
    f = data.brain_follow
    s = method.vech(method.tangent_at(torch.from_numpy(data.brain_c1[f]), torch.from_numpy(data.brain_c2[f])))
    return encode(s, stats, "geo")


def euclidean_target(data: Cohort, stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """Latent of vech(C2 - C1) on the follow-up rows (the Euclidean baseline's data)."""
    f = data.brain_follow
    return encode(method.vech(torch.from_numpy(data.brain_c2[f] - data.brain_c1[f])), stats, "euc")


def decode_geometric(sample: torch.Tensor, c1: torch.Tensor, stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """C2 = C1^1/2 expm(S) C1^1/2 with S decoded from the latent: SPD for any latent."""
    return method.exp_at(c1, method.unvech(decode(sample, stats, "geo"), c1.shape[-1]))


def decode_euclidean(sample: torch.Tensor, c1: torch.Tensor, stats: dict[str, torch.Tensor]) -> torch.Tensor:
    """C2 = C1 + unvech(decoded increment): SPD only if the increment happens to keep it so."""
    return c1 + method.unvech(decode(sample, stats, "euc"), c1.shape[-1])


def tabular_target(data: Cohort, organ: str, stats: dict[str, torch.Tensor]) -> torch.Tensor:
    rows = data.imaged[organ]
    x = torch.from_numpy(data.traits[organ][rows])
    return ((x - stats[f"{organ}_mean"]) / stats[f"{organ}_sd"]).float()


def sdoh_at_baseline(data: Cohort) -> np.ndarray:
    return data.sdoh_onset <= data.baseline[:, None]
