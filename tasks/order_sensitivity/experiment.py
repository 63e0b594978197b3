"""The order_sensitivity experiment: one seed = train a tiny GPT-2 on procedural evidence/claim items (or load
a hub model), score every test item under m uniform permutations and k skeletons, then measure dispersion
vs n (C1), the mixture's gains (C3, C4), the information budget and the ISR gate (C6, C7); plus the
per-seed Monte Carlo checks of the theorems (C2, C5).

Plain functions (no Prefect, no MLflow); the lead's generic flow calls ``write_data`` and ``run_seed``.

Hallucination (project definition, printed with every number): an item is a hallucination when it is
*answered* AND (it is a Control item OR the answered label is wrong). Rates "among answered" divide by the
answered items; the ungated model answers every item.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from scipy import optimize, stats
from torch.nn import functional as F
from transformers import GPT2Model

from tasks.common import tiny_lm
from tasks.common.io import save_state_dict, write_parquet
from tasks.common.results import Progress, SeedResult
from tasks.common.seeding import torch_init_seed
from tasks.order_sensitivity import baselines, data, method
from tasks.order_sensitivity.config import (
    EvaluationConfig,
    OrderSensitivityConfig,
    ProceduralDataConfig,
    TheoryConfig,
    TinyModelConfig,
)

HALLUCINATION_DEFINITION = "hallucination := answered AND (Control item OR wrong label)"


# ------------------------------------------------------------------------------------------------
# The tiny GPT-2 and its label-token readout
# ------------------------------------------------------------------------------------------------

class ChunkGPT2(torch.nn.Module):
    """A tiny GPT-2 (``transformers`` GPT2Model, learned absolute positions) over chunk positions.

    Position t < n holds chunk t as the sum of its entity, attribute and value embeddings; the last position
    holds the claim (the same sum plus a claim-role embedding). A linear head on the claim position gives
    the label logit gap logit("1") - logit("0"). One position per chunk keeps sequences short enough to
    train on CPU [project design: the brief's three-tokens-per-chunk format did not learn in budget]; the
    value field is claim-relative (see :class:`data.Vocabulary`).
    """

    def __init__(self, model_cfg: TinyModelConfig, data_cfg: ProceduralDataConfig):
        super().__init__()
        d = model_cfg.n_embd
        self.entity = torch.nn.Embedding(data_cfg.n_entities, d)
        self.attribute = torch.nn.Embedding(data_cfg.n_attributes, d)
        self.value = torch.nn.Embedding(data.Vocabulary.value_fields, d)  # disagree / agree / mask [M]
        self.claim_role = torch.nn.Parameter(torch.zeros(d))
        config = tiny_lm.tiny_gpt2_config(1, data.sequence_length(data_cfg.max_chunks), model_cfg.n_layer,
                                          model_cfg.n_head, d)
        config.initializer_range = model_cfg.init_std
        self.transformer = GPT2Model(config)
        self.head = torch.nn.Linear(d, 1)
        for table in (self.entity, self.attribute, self.value):
            torch.nn.init.normal_(table.weight, std=config.initializer_range)

    def forward(self, triples: torch.Tensor) -> torch.Tensor:
        """(B, L, 3) index triples -> (B,) label logit gaps read at the last (claim) position."""
        embeds = self.entity(triples[..., 0]) + self.attribute(triples[..., 1]) + self.value(triples[..., 2])
        embeds[:, -1] = embeds[:, -1] + self.claim_role
        hidden = self.transformer(inputs_embeds=embeds).last_hidden_state[:, -1]
        return self.head(hidden).squeeze(-1)


def build_model(model_cfg: TinyModelConfig, data_cfg: ProceduralDataConfig, seed: int) -> ChunkGPT2:
    with torch_init_seed(seed):  # module init draws from torch's global generator
        return ChunkGPT2(model_cfg, data_cfg)


def label_logit_gap(model: torch.nn.Module, triples: torch.Tensor) -> torch.Tensor:
    """logit("1") - logit("0"): the two labels renormalised, q = sigmoid(gap)."""
    return model(triples)


def score_gaps(model: torch.nn.Module, ids: np.ndarray, batch_size: int, device: str = "cpu") -> np.ndarray:
    """Label logit gaps of every input in ``ids`` (..., L, 3), returned with the leading shape."""
    flat = torch.as_tensor(ids.reshape(-1, *ids.shape[-2:]), dtype=torch.long)
    out = []
    with torch.no_grad():
        for start in range(0, len(flat), batch_size):
            out.append(label_logit_gap(model, flat[start:start + batch_size].to(device)).double().cpu())
    return torch.cat(out).numpy().reshape(ids.shape[:-2])


@dataclass(frozen=True)
class TrainingPool:
    """Training sequences grouped by chunk count (a batch never mixes lengths: no padding)."""

    ids: dict[int, torch.Tensor]
    targets: dict[int, torch.Tensor]


def training_pool(frame: pl.DataFrame, vocab: data.Vocabulary) -> TrainingPool:
    ids, targets = {}, {}
    for (n,), group in frame.group_by(["n_chunks"], maintain_order=True):
        items = data.item_arrays(group, vocab)
        chunks = data.mask_relevant_values(items, vocab, where=items.masked)
        ids[int(n)] = torch.as_tensor(data.render_ids(chunks, items.claim_tokens))
        targets[int(n)] = torch.tensor(items.target, dtype=torch.float32)
    return TrainingPool(ids, targets)


def train_model(model: torch.nn.Module, pool: TrainingPool, cfg: TinyModelConfig, seed: int,
                progress: Progress | None = None) -> list[float]:
    """AdamW on the label token's binary cross-entropy; warm-up then cosine decay. Returns the loss per step."""
    rng = np.random.default_rng([seed, 4_242])
    counts = sorted(pool.ids)
    optimiser = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = max(1, cfg.steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: min(1.0, (s + 1) / warmup)
                                                 * 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
    every = max(1, cfg.steps // 10)
    model.train()
    losses = []
    ramp = max(1, int(cfg.curriculum_fraction * cfg.steps))
    for step in range(cfg.steps):
        # Curriculum: the largest chunk count grows linearly over the first ``curriculum_fraction`` of
        # training; short items teach the value comparison before attention must find the relevant chunk.
        cap = counts[0] + (counts[-1] - counts[0]) * min(1.0, (step + 1) / ramp)
        allowed = [c for c in counts if c <= cap]
        n = allowed[int(rng.integers(len(allowed)))]
        index = torch.as_tensor(rng.integers(len(pool.targets[n]), size=cfg.batch_size))
        gap = label_logit_gap(model, pool.ids[n][index])
        loss = F.binary_cross_entropy_with_logits(gap, pool.targets[n][index])
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
        losses.append(float(loss.detach()))
        if progress is not None and (step + 1) % every == 0:
            progress(0.8 * (step + 1) / cfg.steps, f"step {step + 1}/{cfg.steps}, "
                                                   f"loss {np.mean(losses[-every:]):.3f}")
    model.eval()
    return losses


def fit_temperature(gaps: np.ndarray, labels: np.ndarray) -> float:
    """Temperature T minimising the NLL of sigmoid(gap / T) on validation items with a gold label."""
    if len(gaps) == 0:
        return 1.0

    def nll(log_t: float) -> float:
        return float(F.binary_cross_entropy_with_logits(torch.as_tensor(gaps / math.exp(log_t)),
                                                        torch.as_tensor(labels, dtype=torch.float64)))

    return float(math.exp(optimize.minimize_scalar(nll, bounds=(-3.0, 3.0), method="bounded").x))


# ------------------------------------------------------------------------------------------------
# Scoring items under permutations and skeletons
# ------------------------------------------------------------------------------------------------

@dataclass
class ScoredItems:
    """Label probabilities of items: full prompt under m permutations, skeletons of the first k, stored order."""

    q_full: np.ndarray        # (N, m)
    q_skeleton: np.ndarray    # (N, k)
    q_identity: np.ndarray    # (N,)
    label: np.ndarray         # gold label, data.NO_LABEL for controls
    is_control: np.ndarray
    n_chunks: np.ndarray
    dose: np.ndarray

    @staticmethod
    def concat(parts: Sequence[ScoredItems]) -> ScoredItems:
        return ScoredItems(*(np.concatenate([getattr(p, f) for p in parts]) for f in ScoredItems.__dataclass_fields__))


def score_procedural(model: torch.nn.Module, frame: pl.DataFrame, vocab: data.Vocabulary, ev: EvaluationConfig,
                     temperature: float, rng: np.random.Generator, device: str = "cpu") -> ScoredItems:
    """Every item of ``frame`` (any mix of chunk counts) under m uniform permutations and k skeletons."""
    parts = []
    for (n,), group in frame.group_by(["n_chunks"], maintain_order=True):
        items = data.item_arrays(group, vocab)
        orders = data.random_orders(group.height, ev.permutations, int(n), rng)
        full = data.render_ids(items.chunk_tokens, items.claim_tokens, orders)
        skeleton = data.render_ids(data.mask_relevant_values(items, vocab), items.claim_tokens,
                                   orders[:, :ev.skeletons])
        identity = data.render_ids(items.chunk_tokens, items.claim_tokens)
        q = [method.sigmoid(score_gaps(model, ids, ev.batch_size, device) / temperature)
             for ids in (full, skeleton, identity)]
        parts.append(ScoredItems(q[0], q[1], q[2], items.label, items.is_control,
                                 np.full(group.height, int(n)), items.dose))
    return ScoredItems.concat(parts)


# ------------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------------

def gold_probability(scored: ScoredItems) -> np.ndarray:
    """S_k(Y) of the gold label under each permutation (non-control items only)."""
    keep = ~scored.is_control
    return method.label_probability(scored.q_full[keep], scored.label[keep])


def dispersion_metrics(scored: ScoredItems, ev: EvaluationConfig, rng: np.random.Generator
                       ) -> tuple[dict[str, float], list[dict]]:
    """C1: E|R| and E_pair per n over all items (controls included), the a + b ln n fit and a bootstrap CI of b."""
    counts = sorted(set(scored.n_chunks.tolist()))
    abs_residual = method.mean_abs_residual(scored.q_full)
    pair = method.mean_pair_difference(scored.q_full)
    per_n = [abs_residual[scored.n_chunks == n] for n in counts]
    means = [float(v.mean()) for v in per_n]
    log_fit = method.fit_log_growth(counts, means)
    linear_fit = method.least_squares_fit(np.asarray(counts, float), np.asarray(means))
    slopes = method.bootstrap_log_slope(per_n, counts, ev.bootstrap_resamples, rng)
    low, high = np.percentile(slopes, [2.5, 97.5])
    rows = [{"n": n, "mean_abs_residual": m, "mean_pair_difference": float(pair[scored.n_chunks == n].mean()),
             "fit": log_fit.intercept + log_fit.slope * math.log(n)} for n, m in zip(counts, means)]
    metrics = {"dispersion_log_slope": log_fit.slope, "dispersion_log_intercept": log_fit.intercept,
               "dispersion_log_slope_ci_low": float(low), "dispersion_log_slope_ci_high": float(high),
               "dispersion_r2_log": log_fit.r2, "dispersion_r2_linear": linear_fit.r2,
               "abs_residual_over_pair_max": float(np.max(abs_residual / np.maximum(pair, 1e-300)))}
    metrics |= {f"dispersion_n{n}": m for n, m in zip(counts, means)}
    return metrics, rows


def mixture_metrics(scored: ScoredItems, ev: EvaluationConfig) -> dict[str, float]:
    """C3 (mixture vs single order, Jensen gap) and C4 (uniform vs EG mixture), on items with a gold label."""
    keep = ~scored.is_control
    gold = scored.label[keep]
    p_gold = gold_probability(scored)
    mixture_correct = (scored.q_full[keep].mean(axis=1) >= 0.5).astype(int) == gold
    single_correct = (scored.q_full[keep] >= 0.5).astype(int) == gold[:, None]
    identity_correct = (scored.q_identity[keep] >= 0.5).astype(int) == gold
    labels = scored.q_full[keep] >= 0.5
    flips = labels.any(axis=1) & ~labels.all(axis=1)  # the label changes between permutations
    return {
        # order sensitivity (C3a, C7a preconditions): |mixture - single accuracy| <= the share of items that flip
        "order_flip_count": float(flips.sum()),
        "order_flip_fraction": _mean_or_nan(flips),
        "mixture_accuracy": float(mixture_correct.mean()),
        "single_order_accuracy": float(single_correct.mean()),
        "identity_order_accuracy": float(identity_correct.mean()),
        "mixture_minus_single_acc_pp": 100.0 * float(mixture_correct.mean() - single_correct.mean()),
        "jensen_gap_mean": float(method.jensen_gap(p_gold).mean()),
        "eg_mixture_gap_nats": method.uniform_mixture_gap(p_gold, ev.eg_steps, ev.eg_lr),
    }


def hallucinated(answered: np.ndarray, decision: np.ndarray, scored: ScoredItems) -> np.ndarray:
    """The project's definition: answered AND (Control item OR wrong label)."""
    return answered & (scored.is_control | (decision != scored.label))


def rate_among_answered(events: np.ndarray, answered: np.ndarray) -> float:
    """Share of answered items with ``events``; NaN when nothing is answered (a gate that abstains on every
    item has no hallucination rate: NaN makes the claim inconclusive instead of a vacuous 0)."""
    return float(events.sum() / answered.sum()) if answered.any() else math.nan


def _mean_or_nan(values: np.ndarray) -> float:
    return float(np.mean(values)) if values.size else math.nan


def gate_metrics(scored: ScoredItems, ev: EvaluationConfig) -> tuple[dict[str, float], method.GatePlan]:
    """C7: the ISR gate against the ungated identity-order model and a confidence gate at equal abstention."""
    plan = method.plan_answers(scored.q_full, scored.q_skeleton, ev.h_star, ev.clip, ev.clip_mode, ev.margin)
    gated = hallucinated(plan.answer, plan.decision, scored)
    everyone = np.ones_like(plan.answer)
    identity_decision = (scored.q_identity >= 0.5).astype(int)
    abstention = 1.0 - float(plan.answer.mean())
    confident = baselines.confidence_gate(scored.q_full.mean(axis=1), abstention)
    correct_attempts = plan.answer & ~scored.is_control & (plan.decision == scored.label)
    wiring = method.plan_answers(scored.q_full, scored.q_full[:, :ev.skeletons], ev.h_star, ev.clip, ev.clip_mode)
    non_control = ~scored.is_control
    mixture_wrong = (plan.decision != scored.label) & non_control
    metrics = {
        "gate_hallucination_answered": rate_among_answered(gated, plan.answer),
        "gate_abstention": abstention,
        # counts of the binomial claims (C7a, C7b) and of C7a's precondition, pooled over seeds
        "gate_hallucinated_count": float(gated.sum()),
        "gate_answered_count": float(plan.answer.sum()),
        "gate_abstained_count": float((~plan.answer).sum()),
        "test_item_count": float(len(plan.answer)),
        "non_control_count": float(non_control.sum()),
        "ungated_mixture_wrong_label_count": float(mixture_wrong.sum()),
        "ungated_mixture_wrong_label_rate": _mean_or_nan(mixture_wrong[non_control]),
        "control_share": float(scored.is_control.mean()),
        "gate_accuracy_on_attempts": rate_among_answered(correct_attempts, plan.answer),
        "gate_control_abstention": _mean_or_nan(~plan.answer[scored.is_control]),
        "ungated_hallucination": float(hallucinated(everyone, identity_decision, scored).mean()),
        "ungated_wrong_label_rate": _mean_or_nan((identity_decision != scored.label)[~scored.is_control]),
        "ungated_mixture_hallucination": float(hallucinated(everyone, plan.decision, scored).mean()),
        "confidence_gate_hallucination_answered": rate_among_answered(
            hallucinated(confident, plan.decision, scored), confident),
        "confidence_gate_abstention": 1.0 - float(confident.mean()),
        "mean_delta_bar": float(plan.delta_bar.mean()),
        "mean_roh": float(plan.roh.mean()),
        "wiring_control_abstention": 1.0 - float(wiring.answer.mean()),
        "edfl_model_min_slack": edfl_model_min_slack(scored, ev),
    }
    # C7c: every Control the ungated model answers is a hallucination, so this is >= 0 by the definition
    metrics["ungated_hallucination_minus_control_share"] = metrics["ungated_hallucination"] - metrics["control_share"]
    return metrics, plan


def edfl_model_min_slack(scored: ScoredItems, ev: EvaluationConfig) -> float:
    """Theorem 5 on the model's own distributions: P = the k-permutation mixture of the full prompt, S_k the
    skeletons, A = {"1"}. min over items of mean_k KL(P || S_k) - KL(Ber(p) || Ber(q_bar)); must be >= 0."""
    p = scored.q_full[:, :ev.skeletons].mean(axis=1)
    delta_bar = method.bernoulli_kl(p[:, None], scored.q_skeleton).mean(axis=1)
    return float((delta_bar - method.bernoulli_kl(p, scored.q_skeleton.mean(axis=1))).min())


def gate_curve(scored: ScoredItems, plan: method.GatePlan) -> list[dict]:
    """Hallucination among answered vs abstention: ISR thresholds and confidence thresholds, for Figure 2."""
    rows = []
    confidence = np.maximum(scored.q_full.mean(axis=1), 1 - scored.q_full.mean(axis=1))
    for abstain in np.linspace(0.0, 0.9, 19):
        by_isr = baselines.abstain_lowest(plan.isr, abstain)
        by_confidence = baselines.abstain_lowest(confidence, abstain)
        rows.append({"abstention": float(abstain),
                     "isr_rank_hallucination": rate_among_answered(hallucinated(by_isr, plan.decision, scored),
                                                                   by_isr),
                     "confidence_hallucination": rate_among_answered(
                         hallucinated(by_confidence, plan.decision, scored), by_confidence)})
    return rows


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation; NaN when either side is constant (no ranking to correlate)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(stats.spearmanr(x, y).statistic)


def _ols_slope(x: np.ndarray, y: np.ndarray) -> float:
    """OLS slope of y on x; NaN when x or y is constant (e.g. no hallucination at all: nothing can fall)."""
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return method.least_squares_fit(x, y).slope


def dose_metrics(scored: ScoredItems, ev: EvaluationConfig) -> tuple[dict[str, float], list[dict]]:
    """C6: Delta_bar and hallucination against the number d of supporting chunks (d = 0: a Control item).

    Hallucination here is the ungated model's (it answers its mixture label on every item), so the
    OLS slope measures how hallucination falls as the information budget grows. Two versions: over all
    doses (the brief's statistic) and over the evidence items d >= 1 only. The all-dose version is nearly
    fixed by construction: a d = 0 Control has no relevant chunk to mask, so its skeleton is its prompt and
    Delta_bar = 0 exactly, and the ungated model hallucinates on it by definition; these points alone push
    the Spearman above 0.5 and the slope below 0 whenever evidence items get any positive budget. The d >= 1
    version (label 1 on every item, hallucination = answering 0) can fail.
    """
    plan = method.plan_answers(scored.q_full, scored.q_skeleton, ev.h_star, ev.clip, ev.clip_mode, ev.margin)
    ungated = hallucinated(np.ones_like(plan.answer), plan.decision, scored).astype(float)
    gated = hallucinated(plan.answer, plan.decision, scored).astype(float)
    evidence = scored.dose >= 1
    per_dose = method.least_squares_fit(scored.dose.astype(float), plan.delta_bar)
    rows = []
    for d in sorted(set(scored.dose.tolist())):
        at = scored.dose == d
        rows.append({"dose": d, "delta_bar": float(plan.delta_bar[at].mean()),
                     "ungated_hallucination": float(ungated[at].mean()), "gated_hallucination": float(gated[at].mean()),
                     "abstention": float(1 - plan.answer[at].mean()),
                     "accuracy": float(((plan.decision == scored.label) & ~scored.is_control)[at].mean())})
    dose1 = scored.dose == 1
    metrics = {"dose_spearman_delta": _spearman(scored.dose, plan.delta_bar),
               # C6a precondition: how sure the model already is with one supporting chunk (gold label 1)
               "dose1_gold_probability": _mean_or_nan(scored.q_full[dose1].mean(axis=1)),
               # C6b precondition: hallucinations on evidence items (answering 0 on a supported claim)
               "dose_evidence_hallucinated_count": float(ungated[evidence].sum()),
               "dose_evidence_count": float(evidence.sum()),
               "dose_evidence_hallucination_rate": _mean_or_nan(ungated[evidence]),
               "dose_ols_hallucination_per_nat": _ols_slope(plan.delta_bar, ungated),
               "dose_spearman_delta_evidence": _spearman(scored.dose[evidence], plan.delta_bar[evidence]),
               "dose_ols_hallucination_per_nat_evidence": _ols_slope(plan.delta_bar[evidence], ungated[evidence]),
               "dose_delta_per_dose": per_dose.slope,
               "dose_hallucination_drop_pp": 100.0 * (rows[0]["ungated_hallucination"]
                                                      - rows[-1]["ungated_hallucination"]),
               "dose_accuracy_gain_pp": 100.0 * (rows[-1]["accuracy"] - rows[0]["accuracy"])}
    return metrics, rows


# ------------------------------------------------------------------------------------------------
# Per-seed Monte Carlo checks of the theorems (C2, C5)
# ------------------------------------------------------------------------------------------------

def qmv_metrics(theory: TheoryConfig, seed: int) -> tuple[dict[str, float], list[dict]]:
    """Theorem 1 on Theorem 2's harmonic first-order model with Dirichlet weights: E|R| <= E_pair <= bound."""
    rng = np.random.default_rng([seed, 1_001])
    rows, violations = [], 0
    for n in theory.qmv_n:
        phi = method.harmonic_phi(n, theory.phi_scale)
        for _ in range(theory.qmv_draws):
            weights = rng.dirichlet(np.ones(n))
            abs_residual, pair = method.first_order_dispersion_mc(weights, phi, theory.qmv_permutations, rng)
            bound = method.qmv_bound(method.first_order_increments(weights, phi))
            violations += int(not abs_residual <= pair <= bound)
            rows.append({"n": n, "mean_abs_residual": abs_residual, "mean_pair_difference": pair, "bound": bound,
                         "harmonic_closed_form": method.qmv_regular_decay_bound(theory.phi_scale, n, 1.0)})
    key_chunk = [method.key_chunk_dispersion(n) for n in theory.qmv_n]
    metrics = {"qmv_violation_rate": violations / len(rows),
               "qmv_max_pair_over_bound": max(r["mean_pair_difference"] / r["bound"] for r in rows),
               "key_chunk_dispersion_increasing": float(all(a < b for a, b in zip(key_chunk, key_chunk[1:])))}
    return metrics, rows


def edfl_metrics(theory: TheoryConfig, seed: int) -> dict[str, float]:
    """Theorem 5 on random categorical draws, and the exponential tilt's equality."""
    rng = np.random.default_rng([seed, 2_002])
    slacks, tilt_errors = [], []
    for _ in range(theory.edfl_draws):
        support, m = int(rng.integers(2, 11)), int(rng.integers(1, 17))
        event = rng.random(support) < 0.5
        event[rng.integers(support)] = True
        if event.all():
            event[rng.integers(support)] = False
        slacks.append(method.edfl_slack(rng.dirichlet(np.ones(support)), rng.dirichlet(np.ones(support), size=m),
                                        event))
        prior = rng.dirichlet(np.ones(support))
        tilted = method.exponential_tilt(prior, event, float(rng.normal(scale=2.0)))
        tilt_errors.append(abs(method.edfl_slack(tilted, prior[None], event)))
    return {"edfl_violations": float(np.sum(np.asarray(slacks) < -1e-12)), "edfl_min_slack": float(min(slacks)),
            "edfl_tilt_error": float(max(tilt_errors))}


# ------------------------------------------------------------------------------------------------
# One seed, end to end
# ------------------------------------------------------------------------------------------------

def procedural_scores(cfg: OrderSensitivityConfig, frame: pl.DataFrame, seed: int, model_dir: Path, device: str,
                      progress: Progress | None) -> tuple[ScoredItems, ScoredItems, dict[str, float], dict]:
    """Train the tiny GPT-2 once, calibrate its temperature on val, score the test and dose items."""
    vocab = data.vocabulary(cfg.data)
    model = build_model(cfg.model, cfg.data, seed)
    losses = train_model(model, training_pool(frame.filter(pl.col("split") == "train"), vocab), cfg.model, seed,
                         progress)
    save_state_dict(model, Path(model_dir) / f"seed{seed}" / "chunk_gpt2.safetensors")
    model.to(device)
    val = frame.filter((pl.col("split") == "val") & ~pl.col("is_control"))
    val_gaps = np.concatenate([score_gaps(model, data.render_ids(a.chunk_tokens, a.claim_tokens),
                                          cfg.evaluation.batch_size, device)
                               for a in (data.item_arrays(g, vocab) for _, g in val.group_by(["n_chunks"],
                                                                                               maintain_order=True))])
    val_labels = np.concatenate([g["label"].to_numpy() for _, g in val.group_by(["n_chunks"], maintain_order=True)])
    temperature = fit_temperature(val_gaps, val_labels)
    rng = np.random.default_rng([seed, 3_003])
    if progress is not None:
        progress(0.85, f"scoring test items (T = {temperature:.2f})")
    test = score_procedural(model, frame.filter(pl.col("split") == "test"), vocab, cfg.evaluation, temperature,
                            rng, device)
    dose = score_procedural(model, frame.filter(pl.col("split") == "dose"), vocab, cfg.evaluation, temperature,
                            rng, device)
    val_accuracy = float(((val_gaps >= 0).astype(int) == val_labels).mean())
    extra = {"temperature": temperature, "val_accuracy": val_accuracy,
             "train_loss_final": float(np.mean(losses[-max(1, len(losses) // 20):]))}
    return test, dose, extra, {"train_loss": losses}


def run_seed(cfg: OrderSensitivityConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress | None = None) -> SeedResult:
    """Every measurement of one seed; the model is trained (or loaded) once and reused for every claim.

    The seed's items are read and validated against the config first, so stale or missing data fails
    with the key named before any compute.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    if cfg.hub is not None:
        from tasks.order_sensitivity import hub

        frame = hub.read_hub_items(cfg, seed, Path(data_dir))
    else:
        frame = data.read_procedural(cfg.data, Path(data_dir), seed)
    qmv, qmv_rows = qmv_metrics(cfg.theory, seed)
    metrics: dict[str, float] = qmv | edfl_metrics(cfg.theory, seed)
    timings["theory"] = time.perf_counter() - start
    if cfg.hub is not None:
        test, dose, extra, curves = hub.hub_scores(cfg, frame, seed, device, progress)
    else:
        test, dose, extra, curves = procedural_scores(cfg, frame, seed, Path(model_dir), device, progress)
    timings["model"] = time.perf_counter() - start - sum(timings.values())
    rng = np.random.default_rng([seed, 5_005])
    dispersion, dispersion_rows = dispersion_metrics(test, cfg.evaluation, rng)
    gate, plan = gate_metrics(test, cfg.evaluation)
    metrics |= extra | dispersion | mixture_metrics(test, cfg.evaluation) | gate
    tables: dict[str, Any] = {"dispersion_vs_n": dispersion_rows, "qmv_first_order": qmv_rows,
                              "gate_curve": gate_curve(test, plan)}
    if dose is not None:
        dose_values, dose_rows = dose_metrics(dose, cfg.evaluation)
        metrics |= dose_values
        tables["dose_response"] = dose_rows
    timings["measure"] = time.perf_counter() - start - sum(timings.values())
    metrics |= {f"seconds_{k}": v for k, v in timings.items()}
    if progress is not None:
        progress(1.0, f"done in {time.perf_counter() - start:.1f} s")
    return {"seed": seed, "metrics": {k: float(v) for k, v in metrics.items()}, "curves": curves,
            "tables": tables | {"definitions": [{"hallucination": HALLUCINATION_DEFINITION}]}}


def write_data(cfg: OrderSensitivityConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase: the procedural items per seed, or (paper profile) each seed's real evidence items."""
    data_dir = Path(data_dir)
    if cfg.hub is None:
        return data.write_procedural(cfg.data, seeds, data_dir)
    written = []
    for seed in seeds:
        frame = data.load_hub_items(cfg.hub, seed)
        written.append(write_parquet(frame, data.hub_items_path(data_dir, seed)))
    return written
