"""Evaluation step of diffdt: reads the checkpoints and measures (derives no claim numbers).

- event prediction: age-stratified AUC at the baseline visit, per code, for the three backbones and the generator's
  true log-hazard (oracle);
- tabular traits: energy distance of conditional and unconditional DDPM samples to the test subjects' traits
  (joined with their standardised age and sex, so conditioning on the subject matters);
- brain follow-up: SPD validity of the geometric and Euclidean models' samples and their affine-invariant
  distance to the true follow-up C2 (Euclidean outputs projected to SPD first), with a no-change reference;
- intervention: SDoH code j inserted at baseline; delta incidence from sampled futures of the DiffDT backbone,
  against the generator's true counterfactual delta (synthetic cohort only).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from tasks.common.io import load_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.diffdt import cohort, features, fit, method
from tasks.diffdt.config import DiffdtConfig
from tasks.diffdt.data import Cohort, load_cohort, load_effects, load_linked
from tasks.diffdt.sequences import vocabulary
from tasks.diffdt.train import N_POSITIONS, STATS, backbone_file, denoiser_file, follow_up_years

AGE_EDGES = np.array([40.0, 55.0, 60.0, 65.0, 200.0])
INTERVENTION_BACKBONE = "diffdt"


def auc_table(scores: np.ndarray, data: Cohort, horizon: float) -> np.ndarray:
    """Age-stratified AUC (K,) of every disease code's score (N, K) at ``horizon`` years; subjects who had the code
    before baseline are excluded (not at risk)."""
    out = np.full(data.event_age.shape[1], np.nan)
    labels = cohort.incidence_after_baseline(data.event_age, data.baseline, horizon)
    for k in range(data.event_age.shape[1]):
        at_risk = ~(data.event_age[:, k] <= data.baseline)
        out[k] = method.age_stratified_auc(scores[at_risk, k], labels[at_risk, k], data.baseline[at_risk], AGE_EDGES)
    return out


def load_backbones(cfg: DiffdtConfig, model_dir: Path, vocab: method.Vocabulary, stats: dict[str, torch.Tensor]
                   ) -> dict[str, method.EventBackbone]:
    out = {}
    for name in features.BACKBONES:
        model = fit.build_backbone(vocab, features.sensor_dims(stats), cfg.backbone, N_POSITIONS, 0)
        out[name] = load_state_dict(model, Path(model_dir) / backbone_file(name)).eval()
    return out


def load_denoiser(cfg: DiffdtConfig, model_dir: Path, name: str, data_dim: int, cond_dim: int) -> method.Denoiser:
    model = fit.build_denoiser(data_dim, cond_dim, cfg.diffusion, 0, brain=name.startswith("brain_"))
    return load_state_dict(model, Path(model_dir) / denoiser_file(name)).eval()


def measure_auc(backbones, data: Cohort, cfg: DiffdtConfig, stats, n_sdoh: int) -> tuple[dict, list[dict]]:
    follow_up = follow_up_years(cfg)
    per_code = {name: auc_table(features.baseline_log_rates(m, data, name, follow_up, stats)[:, n_sdoh:]
                                .double().numpy(), data, cfg.auc_horizon) for name, m in backbones.items()}
    if np.isfinite(data.oracle_log_hazard).all():  # synthetic cohort: the generator's true hazards
        per_code["oracle"] = auc_table(data.oracle_log_hazard, data, cfg.auc_horizon)
        per_code["oracle_record"] = auc_table(data.oracle_record_log_hazard, data, cfg.auc_horizon)
        per_code["oracle_history"] = auc_table(data.oracle_history_log_hazard, data, cfg.auc_horizon)
    rows = [{"code": k, **{name: float(v[k]) for name, v in per_code.items()}}
            for k in range(data.event_age.shape[1])]
    return per_code, rows


def measure_tabular(cfg: DiffdtConfig, model_dir: Path, data: Cohort, cond: torch.Tensor, stats, seed: int
                    ) -> dict[str, float]:
    schedule = method.NoiseSchedule.linear(cfg.diffusion.steps)
    out = {}
    age = ((torch.from_numpy(data.baseline) - stats["age_mean"]) / stats["age_sd"]).float().unsqueeze(-1)
    male = torch.from_numpy(data.male).float().unsqueeze(-1)
    for i, organ in enumerate(features.TABULAR):
        rows = torch.from_numpy(data.imaged[organ])
        real = features.tabular_target(data, organ, stats)
        context = torch.cat([age[rows], male[rows]], dim=-1)
        for kind in ("cond", "uncond"):
            model = load_denoiser(cfg, model_dir, f"{organ}_{kind}", real.shape[1], cond.shape[1])
            gen = torch.Generator().manual_seed(seed * 1000 + i)
            sample = method.ddpm_sample(model, schedule, cond[rows], real.shape[1], cfg.diffusion.guidance, gen,
                                        conditional=kind == "cond", clip_x0=cfg.diffusion.clip_x0)
            out[f"energy_{organ}_{kind}"] = method.energy_distance(torch.cat([sample, context], -1),
                                                                   torch.cat([real, context], -1))
        half = real.shape[0] // 2  # two halves of the real test traits: the distance sampling noise alone gives
        out[f"energy_{organ}_real_halves"] = method.energy_distance(
            torch.cat([real[:half], context[:half]], -1), torch.cat([real[half:2 * half], context[half:2 * half]], -1))
    return out


def measure_brain(cfg: DiffdtConfig, model_dir: Path, data: Cohort, cond: torch.Tensor, stats, seed: int
                  ) -> tuple[dict[str, float], list[dict]]:
    schedule = method.NoiseSchedule.linear(cfg.diffusion.steps)
    brain_cond = features.brain_conditions(cond, data, stats)
    f = data.brain_follow
    c1, c2 = torch.from_numpy(data.brain_c1[f]), torch.from_numpy(data.brain_c2[f])
    out, samples = {}, {}
    for i, (kind, decode) in enumerate((("geometric", features.decode_geometric),
                                        ("euclidean", features.decode_euclidean))):
        model = load_denoiser(cfg, model_dir, f"brain_{kind}", int(stats[f"{kind[:3]}_basis"].shape[0]),
                              brain_cond.shape[1])
        gen = torch.Generator().manual_seed(seed * 1000 + 50 + i)
        z = method.ddpm_sample(model, schedule, brain_cond, int(stats[f"{kind[:3]}_basis"].shape[0]),
                               cfg.diffusion.guidance, gen,
                               clip_x0=cfg.diffusion.clip_x0)
        samples[kind] = decode(z, c1, stats)
        valid = method.is_spd(samples[kind])
        out[f"{kind}_spd_valid_count"] = int(valid.sum())
        repaired = torch.where(valid[:, None, None], samples[kind], method.project_spd(samples[kind],
                                                                                     float(stats["eig_floor"])))
        samples[kind] = repaired
        out[f"{kind}_frobenius_error"] = float(torch.linalg.matrix_norm(samples[kind] - c2).mean())
    out["brain_test_count"] = int(f.sum())
    # the latent encoders' own floor: the true increments encoded and decoded (no diffusion)
    floor = {"geometric": features.decode_geometric(features.geometric_target(data, stats), c1, stats),
             "euclidean": features.decode_euclidean(features.euclidean_target(data, stats), c1, stats)}
    for kind, mats in floor.items():
        repaired = method.project_spd(mats, float(stats["eig_floor"]))
        mats = torch.where(method.is_spd(mats)[:, None, None], mats, repaired)
        out[f"{kind}_latent_floor_airm"] = float(method.airm_distance(c2, mats).mean())
    airm = {kind: method.airm_distance(c2, s) for kind, s in samples.items()}
    airm["no_change"] = method.airm_distance(c2, c1)
    out.update({f"{kind}_airm_error": float(v.mean()) for kind, v in airm.items()})
    out["no_change_frobenius_error"] = float(torch.linalg.matrix_norm(c1 - c2).mean())
    rows = [{"subject": i, **{kind: float(v[i]) for kind, v in airm.items()}} for i in range(int(f.sum()))]
    return out, rows


def measure_intervention(cfg: DiffdtConfig, model: method.EventBackbone, data: Cohort, stats, true_delta: np.ndarray,
                         seed: int) -> tuple[dict[str, float], list[dict]]:
    """Model delta incidence (J, K) of 'SDoH j present from baseline on' among test subjects without j, from
    ``n_futures`` sampled futures per subject and arm (diseases and death only; SDoH held fixed)."""
    vocab = model.vocab
    icfg = cfg.intervention
    follow_up = follow_up_years(cfg)
    allowed = torch.zeros(vocab.n_events, dtype=torch.bool)
    allowed[vocab.n_sdoh:] = True
    n_sdoh = vocab.n_sdoh
    predicted = np.zeros_like(true_delta)
    latents = features.organ_latents(data, stats)
    gen = torch.Generator().manual_seed(seed * 1000 + 99)
    for j in range(n_sdoh):
        group = np.flatnonzero(~features.sdoh_at_baseline(data)[:, j])[:icfg.n_subjects]
        sub = data.rows(group)
        sensors = {o: v[group].repeat(icfg.n_futures, 1) for o, v in latents.items()}
        arms = []
        for insert in (None, j):
            tokens, ages = features.baseline_prefix(sub, vocab, INTERVENTION_BACKBONE, follow_up, insert_sdoh=insert)
            occurred = method.sample_incidence(model, tokens.repeat(icfg.n_futures, 1), ages.repeat(icfg.n_futures, 1),
                                               sensors, icfg.horizon, allowed, icfg.max_steps, gen,
                                               cohort.START_AGE, cohort.PAD_EVERY)
            arms.append(occurred[:, n_sdoh:].double().mean(dim=0).numpy())
        predicted[j] = arms[1] - arms[0]
    agree, trials = method.sign_agreement(predicted, true_delta, icfg.min_abs_effect)
    from scipy.stats import spearmanr

    rho = float(spearmanr(predicted.ravel(), true_delta.ravel()).statistic)
    rows = [{"sdoh": cohort.SDOH_CODES[j], "code": k, "true_delta": float(true_delta[j, k]),
             "model_delta": float(predicted[j, k])} for j in range(n_sdoh) for k in range(true_delta.shape[1])]
    scored = np.abs(true_delta) > icfg.min_abs_effect
    # pairs whose true delta is exactly 0 (no SDoH path to the code): the model's mean delta there is its bias
    null = true_delta == 0
    return {"intervention_agree_count": agree, "intervention_pair_count": trials,
            "intervention_true_positive_count": int((true_delta[scored] > 0).sum()),
            "intervention_spearman": rho,
            "intervention_null_pair_count": int(null.sum()),
            "intervention_null_model_delta_mean": float(predicted[null].mean()) if null.any() else float("nan"),
            "intervention_model_positive_share": float((predicted > 0).mean())}, rows


def evaluate(cfg: DiffdtConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    torch.set_num_threads(1)
    result = SeedResult(seed)
    data = load_cohort(data_dir, seed, "test")
    n_sdoh = data.sdoh_onset.shape[1]
    vocab = vocabulary(n_sdoh, data.event_age.shape[1])
    stats = load_file(str(Path(model_dir) / STATS))
    backbones = load_backbones(cfg, model_dir, vocab, stats)
    with result.stage("auc"):
        per_code, auc_rows = measure_auc(backbones, data, cfg, stats, n_sdoh)
    linked = load_linked(data_dir, seed) if cfg.cohort is not None else np.zeros(data.event_age.shape[1], bool)
    for name, values in per_code.items():
        result.add({f"auc_{name}_linked": float(np.nanmean(values[linked])) if linked.any() else float("nan"),
                    f"auc_{name}_other": float(np.nanmean(values[~linked]))})
    progress(0.3, "AUC measured")
    cond = features.conditions(backbones[features.CONDITION_BACKBONE], data, follow_up_years(cfg), stats)
    with result.stage("tabular"):
        result.add(measure_tabular(cfg, model_dir, data, cond, stats, seed))
    with result.stage("brain"):
        brain, airm_rows = measure_brain(cfg, model_dir, data, cond, stats, seed)
    result.add(brain)
    progress(0.6, "diffusion models measured")
    tables = {"auc_by_code": auc_rows, "brain_airm": airm_rows}
    if cfg.cohort is not None:
        with result.stage("intervention"):
            numbers, rows = measure_intervention(cfg, backbones[INTERVENTION_BACKBONE], data, stats,
                                                 load_effects(data_dir, seed), seed)
        result.add(numbers)
        tables["intervention"] = rows
    result.add(n_test=data.n, n_linked_codes=int(linked.sum()), tables=tables)
    progress(1.0, "evaluated")
    return result
