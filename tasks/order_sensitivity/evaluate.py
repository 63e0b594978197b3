"""Evaluation step of order_sensitivity: the per-seed theorem checks (C2, C5a-b), then the trained tiny GPT-2
(or, at the paper profile, a hub model) scores every test and dose item under m uniform permutations and k
skeletons, and ``measures.py`` measures dispersion vs n (C1), the mixture's gains (C3, C4), the information
budget and the ISR gate (C5c, C6, C7). Raw measurements only; ``claim_metrics.py`` derives the claims' numbers.

Random streams, one ``numpy`` generator each, seeded by (seed, purpose): QMV draws (seed, 1001), EDFL draws
(seed, 2002), permutations of the test then the dose items (seed, 3003), the bootstrap of C1 (seed, 5005).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import torch
from scipy import optimize
from torch.nn import functional as F

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.order_sensitivity import data, method
from tasks.order_sensitivity.config import EvaluationConfig, OrderSensitivityConfig
from tasks.order_sensitivity.measures import (
    HALLUCINATION_DEFINITION,
    ScoredItems,
    dispersion_metrics,
    dose_metrics,
    edfl_metrics,
    gate_curve,
    gate_metrics,
    mixture_metrics,
    qmv_metrics,
)
from tasks.order_sensitivity.model import load_model, score_gaps


def read_items(cfg: OrderSensitivityConfig, seed: int, data_dir: Path) -> pl.DataFrame:
    """The seed's items, validated against the config (stale or missing data fail naming the key)."""
    if cfg.hub is not None:
        from tasks.order_sensitivity import hub

        return hub.read_hub_items(cfg, seed, Path(data_dir))
    return data.read_procedural(cfg.data, Path(data_dir), seed)


def fit_temperature(gaps: np.ndarray, labels: np.ndarray) -> float:
    """Temperature T minimising the NLL of sigmoid(gap / T) on validation items with a gold label."""
    if len(gaps) == 0:
        return 1.0

    def nll(log_t: float) -> float:
        return float(F.binary_cross_entropy_with_logits(torch.as_tensor(gaps / math.exp(log_t)),
                                                        torch.as_tensor(labels, dtype=torch.float64)))

    return float(math.exp(optimize.minimize_scalar(nll, bounds=(-3.0, 3.0), method="bounded").x))


def validation_gaps(model: torch.nn.Module, frame: pl.DataFrame, vocab: data.Vocabulary, batch_size: int,
                    device: str) -> tuple[np.ndarray, np.ndarray]:
    """Label logit gaps and gold labels of the validation items with a gold label, in their stored order."""
    val = frame.filter((pl.col("split") == "val") & ~pl.col("is_control"))
    groups = [g for _, g in val.group_by(["n_chunks"], maintain_order=True)]
    gaps = [score_gaps(model, data.render_ids(a.chunk_tokens, a.claim_tokens), batch_size, device)
            for a in (data.item_arrays(g, vocab) for g in groups)]
    return np.concatenate(gaps), np.concatenate([g["label"].to_numpy() for g in groups])


def score_procedural(model: torch.nn.Module, frame: pl.DataFrame, vocab: data.Vocabulary, ev: EvaluationConfig,
                     temperature: float, rng: np.random.Generator, device: str = "cpu") -> ScoredItems:
    """Every item of ``frame`` (any mix of chunk counts) under m uniform permutations and k skeletons."""
    parts = []
    for (n,), group in frame.group_by(["n_chunks"], maintain_order=True):
        items = data.item_arrays(group, vocab)
        orders = data.random_orders(group.height, ev.permutations, int(n), rng)
        full = data.render_ids(items.chunk_tokens, items.claim_tokens, orders)
        skeleton = data.render_ids(data.mask_all_values(items, vocab), items.claim_tokens,
                                   orders[:, :ev.skeletons])
        identity = data.render_ids(items.chunk_tokens, items.claim_tokens)
        q = [method.sigmoid(score_gaps(model, ids, ev.batch_size, device) / temperature)
             for ids in (full, skeleton, identity)]
        parts.append(ScoredItems(q[0], q[1], q[2], items.label, items.is_control,
                                 np.full(group.height, int(n)), items.dose))
    return ScoredItems.concat(parts)


def procedural_scores(cfg: OrderSensitivityConfig, frame: pl.DataFrame, seed: int, model_dir: Path, device: str,
                      progress: Progress) -> tuple[ScoredItems, ScoredItems, dict[str, float]]:
    """The trained tiny GPT-2: calibrate its temperature on val, then score the test and dose items."""
    vocab = data.vocabulary(cfg.data)
    model = load_model(cfg.model, cfg.data, seed, model_dir, device)
    val_gaps, val_labels = validation_gaps(model, frame, vocab, cfg.evaluation.batch_size, device)
    temperature = fit_temperature(val_gaps, val_labels)
    progress(0.2, f"scoring test items (T = {temperature:.2f})")
    rng = np.random.default_rng([seed, 3_003])  # one stream: the test items' permutations, then the dose items'
    test = score_procedural(model, frame.filter(pl.col("split") == "test"), vocab, cfg.evaluation, temperature,
                            rng, device)
    dose = score_procedural(model, frame.filter(pl.col("split") == "dose"), vocab, cfg.evaluation, temperature,
                            rng, device)
    val_accuracy = float(((val_gaps >= 0).astype(int) == val_labels).mean())
    return test, dose, {"temperature": temperature, "val_accuracy": val_accuracy}


def theory_checks(cfg: OrderSensitivityConfig, seed: int, result: SeedResult) -> None:
    """C2 (QMV, Theorems 1-2) and C5a-b (EDFL, Theorem 5) on synthetic draws; no model involved."""
    qmv, qmv_rows = qmv_metrics(cfg.theory, seed)
    result.add(qmv, tables={"qmv_first_order": qmv_rows})
    result.add(edfl_metrics(cfg.theory, seed))


def measure(cfg: OrderSensitivityConfig, seed: int, test: ScoredItems, dose: ScoredItems | None,
            result: SeedResult) -> None:
    """Every measurement on the scored test items (C1, C3, C4, C5c, C7) and dose items (C6)."""
    ev = cfg.evaluation
    dispersion, dispersion_rows = dispersion_metrics(test, ev, np.random.default_rng([seed, 5_005]))
    gate, plan = gate_metrics(test, ev)
    result.add(dispersion, tables={"dispersion_vs_n": dispersion_rows, "gate_curve": gate_curve(test, plan)})
    result.add(mixture_metrics(test, ev))
    result.add(gate)
    if dose is not None:
        dose_values, dose_rows = dose_metrics(dose, ev)
        result.add(dose_values, tables={"dose_response": dose_rows})
    result.add(tables={"definitions": [{"hallucination": HALLUCINATION_DEFINITION}]})


def evaluate(cfg: OrderSensitivityConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    """Every raw measurement of one seed from the checkpoint ``train`` wrote in ``model_dir`` (the seed's folder;
    at the paper profile the hub model named in the config). The items are read and validated first, so stale
    or missing data fail with the key named before any compute."""
    frame = read_items(cfg, seed, data_dir)
    result = SeedResult(seed)
    with result.stage("theory"):
        theory_checks(cfg, seed, result)
    progress(0.1, "theory checks done")
    with result.stage("score"):
        if cfg.hub is not None:
            from tasks.order_sensitivity import hub

            test, dose, extra = hub.hub_scores(cfg, frame, seed, device, progress)
        else:
            test, dose, extra = procedural_scores(cfg, frame, seed, Path(model_dir), device, progress)
    result.add(extra)
    with result.stage("measure"):
        measure(cfg, seed, test, dose, result)
    progress(1.0, f"measured {len(result.metrics)} metrics")
    return result
