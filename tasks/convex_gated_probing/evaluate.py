"""Evaluation step of convex_gated_probing: frozen features of the SSL encoder, every probe, fine-tuning's test
mAP, the learned gate, and the planted-layer test. Measures only; claim numbers are in claim_metrics.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from scipy import stats
from torch.nn import functional as F

from tasks.common.io import load_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.seeding import torch_init_seed
from tasks.convex_gated_probing import baselines, method
from tasks.convex_gated_probing.config import ConvexGatedProbingConfig, PlantedConfig, ProbeConfig
from tasks.convex_gated_probing.data import N_CLASSES, load_split, planted_layer_features
from tasks.convex_gated_probing.encoder import FineTuneModel
from tasks.convex_gated_probing.train import ENCODER, FINETUNED, new_encoder

# Gate logits of the frozen-gate control: alpha puts 1 - 5e-13 on the last layer (softmax of a 30-logit gap).
FROZEN_LAST_LOGIT = 30.0
# Head2Toe-lite: group-lasso strength and proximal-gradient steps (project choices, not tuned on test data).
HEAD2TOE_GROUP_L2 = 1e-3
HEAD2TOE_STEPS = 300
HEAD2TOE_LR = 0.5
# A planted problem passes when CGP beats the last-layer LP by this many mAP points (acceptance check (a)5).
PLANTED_MARGIN = 20.0
# middle_layer_lp_gain chooses its layer on a validation split: the last quarter of the training clips (clips are
# i.i.d. draws, so the tail is a random subset); the per-layer test mAPs come from probes fitted on the whole
# training split.
VALIDATION_FRACTION = 0.25


def frozen_last_gate(n_layers: int) -> torch.Tensor:
    logits = torch.zeros(n_layers)
    logits[-1] = FROZEN_LAST_LOGIT
    return logits


def train_probe(head: torch.nn.Module, probe: ProbeConfig, patch: torch.Tensor, cls: torch.Tensor | None,
                labels: torch.Tensor, seed: int, frozen: tuple[str, ...] = ()) -> list[float]:
    return baselines.train_head(head, patch, cls, labels, steps=probe.steps, batch=probe.batch, lr=probe.lr,
                                warmup_steps=probe.warmup_steps, weight_decay=probe.weight_decay,
                                generator=torch.Generator().manual_seed(seed), frozen=frozen)


def cgp_heads(n_layers: int, dim: int, n_prototypes: int, n_classes: int, dropout: float, seed: int
              ) -> tuple[method.CGPHead, method.CGPHead]:
    """A CGP head with a learned gate and one whose gate is frozen on the last layer (same initial weights)."""
    with torch_init_seed(seed):
        learned = method.CGPHead(n_layers, dim, n_prototypes, n_classes, dropout)
    with torch_init_seed(seed):
        frozen = method.CGPHead(n_layers, dim, n_prototypes, n_classes, dropout)
    with torch.no_grad():
        frozen.gate_logits.copy_(frozen_last_gate(n_layers))
    return learned, frozen


def planted_layer_test(cfg: PlantedConfig, probe: ProbeConfig, seed: int, planted_seed: int = 0,
                       frozen_control: bool = True) -> dict[str, float]:
    """Acceptance check (a)5 at run time: CGP (learned gate) vs the last-layer cls LP and, with ``frozen_control``,
    the frozen-gate CGP, on planted problem ``planted_seed`` of run seed ``seed`` (independent draws)."""
    rng = np.random.default_rng([seed, 5, planted_seed])
    train_patch, train_cls, train_y = planted_layer_features(cfg, cfg.n_train, rng)
    test_patch, test_cls, test_y = planted_layer_features(cfg, cfg.n_test, rng)
    head_seed = seed * 1000 + planted_seed
    learned, frozen = cgp_heads(cfg.n_layers, cfg.dim, cfg.n_prototypes, cfg.n_classes, probe.dropout, head_seed)
    short = probe.model_copy(update={"steps": cfg.steps, "lr": cfg.lr,
                                     "warmup_steps": min(probe.warmup_steps, cfg.steps // 10)})
    train_probe(learned, short, train_patch, train_cls, train_y, head_seed)
    lp_map, _ = baselines.linear_probe_map(train_cls[:, -1], train_y, test_cls[:, -1], test_y, probe.lp_l2)
    alpha = learned.alpha().detach()
    result = {"planted_cgp_map": method.macro_map(baselines.head_scores(learned, test_patch, test_cls),
                                                  test_y.numpy()),
              "planted_lp_map": lp_map, "planted_argmax_layer": float(int(alpha.argmax()) + 1),
              "planted_alpha_on_layer": float(alpha[cfg.planted_layer - 1])}
    if frozen_control:
        train_probe(frozen, short, train_patch, train_cls, train_y, head_seed, frozen=("gate_logits",))
        result["planted_frozen_gate_map"] = method.macro_map(baselines.head_scores(frozen, test_patch, test_cls),
                                                             test_y.numpy())
    return result


def planted_passed(result: dict[str, float], planted_layer: int, margin: float = PLANTED_MARGIN) -> bool:
    """One planted problem passes when the gate's argmax is the planted layer AND CGP beats the last-layer LP by
    >= ``margin`` mAP points (both fixed before any run)."""
    return (result["planted_argmax_layer"] == planted_layer
            and result["planted_cgp_map"] - result["planted_lp_map"] >= margin)


def planted_layer_trials(cfg: PlantedConfig, probe: ProbeConfig, seed: int) -> dict[str, float]:
    """``cfg.n_seeds`` independent planted problems: the first one's numbers (with the frozen-gate control) and
    the pass count over all of them (the binomial trials of the mechanism claim)."""
    trials = [planted_layer_test(cfg, probe, seed, k, frozen_control=k == 0) for k in range(cfg.n_seeds)]
    passed = sum(planted_passed(t, cfg.planted_layer) for t in trials)
    margins = [t["planted_cgp_map"] - t["planted_lp_map"] for t in trials]
    return {**trials[0], "planted_passed_count": float(passed), "planted_trials": float(len(trials)),
            "planted_min_margin": float(min(margins))}


def feature_sanity(train_patch: torch.Tensor, train_cls: torch.Tensor) -> dict[str, float]:
    """Largest (over layers) mean cosine to the mean direction of the cls and the patch tokens: near 1 means
    every clip's features point the same way (collapsed), and probes that L2-normalise see one input."""
    n_layers = train_cls.shape[1]
    return {"max_cls_cosine_to_mean": max(method.cosine_to_mean(train_cls[:, layer]) for layer in range(n_layers)),
            "max_patch_cosine_to_mean": max(method.cosine_to_mean(train_patch[:, layer])
                                            for layer in range(n_layers))}


def evaluate(cfg: ConvexGatedProbingConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    probe = cfg.probe
    train_spec, train_y = load_split(cfg.data, data_dir, "train", seed)
    test_spec, test_y = load_split(cfg.data, data_dir, "test", seed)
    # Module init draws from torch's global generator (the checkpoint then overwrites the weights): seeded and
    # restored, so other seeds' threads never see the draw.
    with torch_init_seed(seed):
        encoder, finetuned = new_encoder(cfg), FineTuneModel(new_encoder(cfg), N_CLASSES)
    encoder = load_state_dict(encoder, Path(model_dir) / ENCODER).eval()
    with result.stage("features"):
        train_patch, train_cls = encoder.layer_features(train_spec)
        test_patch, test_cls = encoder.layer_features(test_spec)
    sanity = feature_sanity(train_patch, train_cls)
    n_layers, dim = train_cls.shape[1], train_cls.shape[2]
    labels = test_y.numpy()

    with result.stage("linear_probes"):
        per_layer, gradients = [], []
        for layer in range(n_layers):
            cls_map, g_cls = baselines.linear_probe_map(train_cls[:, layer], train_y, test_cls[:, layer], test_y,
                                                        probe.lp_l2)
            mean_map, g_mean = baselines.linear_probe_map(train_patch[:, layer].mean(1), train_y,
                                                          test_patch[:, layer].mean(1), test_y, probe.lp_l2)
            n_fit = train_y.shape[0] - int(round(VALIDATION_FRACTION * train_y.shape[0]))
            val_cls_map, _ = baselines.linear_probe_map(train_cls[:n_fit, layer], train_y[:n_fit],
                                                        train_cls[n_fit:, layer], train_y[n_fit:], probe.lp_l2)
            val_mean_map, _ = baselines.linear_probe_map(train_patch[:n_fit, layer].mean(1), train_y[:n_fit],
                                                         train_patch[n_fit:, layer].mean(1), train_y[n_fit:],
                                                         probe.lp_l2)
            per_layer.append({"layer": layer + 1, "lp_cls_map": cls_map, "lp_mean_map": mean_map,
                              "val_lp_cls_map": val_cls_map, "val_lp_mean_map": val_mean_map,
                              "cls_cosine_to_mean": method.cosine_to_mean(train_cls[:, layer]),
                              "patch_cosine_to_mean": method.cosine_to_mean(train_patch[:, layer])})
            gradients += [g_cls, g_mean]
    progress(0.2, f"LP last layer {per_layer[-1]['lp_cls_map']:.1f} mAP")

    maps = {}
    with result.stage("probe_heads"):
        learned, frozen = cgp_heads(n_layers, dim, probe.n_prototypes, N_CLASSES, probe.dropout, seed)
        curve = train_probe(learned, probe, train_patch, train_cls, train_y, seed)
        train_probe(frozen, probe, train_patch, train_cls, train_y, seed, frozen=("gate_logits",))
        maps["cgp"] = method.macro_map(baselines.head_scores(learned, test_patch, test_cls), labels)
        maps["cgp_frozen_last_gate"] = method.macro_map(baselines.head_scores(frozen, test_patch, test_cls), labels)
        with torch_init_seed(seed):
            lcgp = method.LCGPHead(n_layers, dim, N_CLASSES, probe.dropout)
            protobin = method.ProtoBinHead(dim, probe.n_prototypes, N_CLASSES, probe.dropout)
        train_probe(lcgp, probe, train_patch, train_cls, train_y, seed)
        train_probe(protobin, probe, train_patch, train_cls, train_y, seed)
        maps["lcgp"] = method.macro_map(baselines.head_scores(lcgp, test_patch, test_cls), labels)
        maps["protobin"] = method.macro_map(baselines.head_scores(protobin, test_patch, test_cls), labels)
        maps["head2toe"], group_norms = baselines.head2toe_map(train_patch, train_cls, train_y, test_patch, test_cls,
                                                               test_y, HEAD2TOE_GROUP_L2, HEAD2TOE_STEPS, HEAD2TOE_LR)
    progress(0.7, f"CGP {maps['cgp']:.1f} mAP")

    with result.stage("finetuned"):
        model = load_state_dict(finetuned, Path(model_dir) / FINETUNED).eval()
        with torch.no_grad():
            maps["finetune"] = method.macro_map(model(test_spec).numpy(), labels)
            ft_train_loss = float(F.binary_cross_entropy_with_logits(model(train_spec), train_y))

    with result.stage("planted_layer"):
        planted = planted_layer_trials(cfg.planted, probe, seed)

    alpha = learned.alpha().detach().numpy()
    lp_cls = np.array([row["lp_cls_map"] for row in per_layer])
    middle_gain, middle_layer, middle_readout = method.middle_layer_gain(
        np.array([[row["val_lp_cls_map"], row["val_lp_mean_map"]] for row in per_layer]),
        np.array([[row["lp_cls_map"], row["lp_mean_map"]] for row in per_layer]))
    for row, a, g in zip(per_layer, alpha, group_norms, strict=True):
        row.update(cgp_alpha=float(a), lcgp_alpha=float(lcgp.alpha()[row["layer"] - 1]), head2toe_group_norm=g)
    progress(1.0, f"FT {maps['finetune']:.1f}, CGP {maps['cgp']:.1f}, LP {per_layer[-1]['lp_cls_map']:.1f} mAP")
    return result.add(
        {f"{name}_map": value for name, value in maps.items()},
        lp_map=per_layer[-1]["lp_cls_map"], lp_mean_map=per_layer[-1]["lp_mean_map"],
        middle_layer_lp_gain=middle_gain, best_middle_layer=float(middle_layer),
        best_middle_readout_is_mean=float(middle_readout),
        lp_max_gradient=float(max(gradients)), cgp_argmax_layer=float(int(alpha.argmax()) + 1),
        gate_lp_spearman=float(stats.spearmanr(alpha, lp_cls).statistic),
        ft_train_loss=ft_train_loss, prior_entropy=method.prior_entropy(train_y.numpy()),
        chance_map=method.chance_map(labels), **sanity, **planted, curves={"cgp_train_loss": curve},
        tables={"per_layer": per_layer})
