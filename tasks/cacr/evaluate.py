"""Evaluation step of cacr: every method's greedy prediction on the test questions, and the raw measurements
(per method and question type; candidate recall) that the claims read. Derives no claim numbers."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from tasks.cacr import baselines, method
from tasks.cacr.config import QUESTION_TYPES, CacrConfig
from tasks.cacr.data import load_split
from tasks.cacr.train import VARIANTS, Split, frame_accuracy, load_models, prepare_split
from tasks.common.results import Progress, SeedResult, no_progress

POLICIES = ("sft", *(f"grpo_{v}" for v in VARIANTS))
METHODS = ("top1", "dense", *POLICIES)


@torch.no_grad()
def predictions(cfg: CacrConfig, models: dict, split: Split) -> dict[str, tuple[Tensor, Tensor]]:
    """method -> ((Q, 2) predicted segments, (Q,) rejected flags). top1 never rejects; dense always predicts
    densely (counted as rejecting, since it never grounds on a candidate)."""
    everything = torch.arange(len(split.gt))
    rows = split.rows(everything)
    q = len(split.gt)
    out = {"top1": (baselines.top1_retrieval(split.candidates), torch.zeros(q, dtype=torch.bool)),
           "dense": (baselines.dense_regression(models["dense"], split.features, split.question),
                     torch.ones(q, dtype=torch.bool))}
    for name in POLICIES:
        allow = not name.endswith("no_action")
        logits = models[name](*rows, allow_reject=allow)
        actions = method.greedy_actions(*logits)
        pred = method.decode_actions(actions, split.candidates, cfg.policy.max_offset, cfg.data.frames)
        out[name] = (pred, actions[:, 0] == cfg.vbcs.top_k)
    return out


def method_metrics(cfg: CacrConfig, name: str, pred: Tensor, rejected: Tensor, split: Split) -> dict[str, float]:
    """mIoU, R@1 at each IoU threshold, mIoU on candidate misses / hits, rejection and false grounding counts."""
    ious = method.tiou_tensor(pred, split.gt)
    hit = method.candidate_hit(split.best_cand_tiou, cfg.grpo.tau)
    miss = ~hit
    correct_decision = method.reject_reward(rejected, split.best_cand_tiou, cfg.grpo.tau)
    m = {f"{name}_miou": float(ious.mean()),
         f"{name}_miou_miss": float(ious[miss].mean()) if bool(miss.any()) else float("nan"),
         f"{name}_miou_hit": float(ious[hit].mean()) if bool(hit.any()) else float("nan"),
         f"{name}_reject_rate": float(rejected.double().mean()),
         f"{name}_reject_correct_count": float(correct_decision.sum()),
         f"{name}_false_grounding_count": float((~rejected & miss).sum()),
         f"{name}_accept_on_hit_count": float((~rejected & hit).sum())}
    for thr in cfg.iou_thresholds:
        m[f"{name}_r1_{thr:g}"] = method.recall_at(ious, thr)
        m[f"{name}_r1_{thr:g}_count"] = float((ious >= thr).sum())
    for qtype in QUESTION_TYPES:
        sel = torch.tensor([t == qtype for t in split.qtype])
        m[f"{name}_miou_{qtype}"] = float(ious[sel].mean()) if bool(sel.any()) else float("nan")
    return m


def candidate_metrics(cfg: CacrConfig, split: Split) -> dict[str, float]:
    """Candidate recall@K (a candidate reaches tIoU >= threshold; at tau it defines a hit), the oracle pick's mIoU
    (the best a pick-without-refinement policy can do), and the counts behind them, per question type too."""
    best = split.best_cand_tiou
    q = len(best)
    m = {"test_questions": float(q), "candidate_oracle_miou": float(best.mean()),
         "candidate_hit_count": float(method.candidate_hit(best, cfg.grpo.tau).sum()),
         "candidate_miss_count": float((~method.candidate_hit(best, cfg.grpo.tau)).sum())}
    m["candidate_recall_tau"] = m["candidate_hit_count"] / q
    m["candidate_miss_rate"] = m["candidate_miss_count"] / q
    for thr in cfg.iou_thresholds:
        m[f"candidate_recall_{thr:g}"] = float((best >= thr).double().mean())
    for qtype in QUESTION_TYPES:
        sel = torch.tensor([t == qtype for t in split.qtype])
        m[f"questions_{qtype}"] = float(sel.sum())
        m[f"candidate_recall_tau_{qtype}"] = (float(method.candidate_hit(best[sel], cfg.grpo.tau).double().mean())
                                              if bool(sel.any()) else float("nan"))
    return m


RANDOM_SCORE_DRAWS = 3


def random_score_vbcs_metrics(cfg: CacrConfig, split: Split, seed: int) -> dict[str, float]:
    """The same VBCS pipeline (windows, S(a, b), NMS, top-K) run on uniform-random frame scores instead of the
    VLP's similarities, on the same test questions (seed-matched draws): the recall@K a diverse set of K windows
    reaches whatever the scores are, i.e. the reference the trained VBCS must beat (mean over draws)."""
    gen = torch.Generator().manual_seed(seed * 1000 + 2606)
    recall = {thr: 0.0 for thr in cfg.iou_thresholds}
    top1 = 0.0
    for _ in range(RANDOM_SCORE_DRAWS):
        noise = torch.rand(split.features.shape[:2], generator=gen)
        candidates, _ = method.batched_vbcs(noise, cfg.vbcs.window_lengths, cfg.vbcs.nms_threshold, cfg.vbcs.top_k)
        ious = method.tiou_tensor(candidates, split.gt[:, None, :])
        best = ious.max(dim=1).values
        for thr in cfg.iou_thresholds:
            recall[thr] += float((best >= thr).double().mean()) / RANDOM_SCORE_DRAWS
        top1 += method.recall_at(ious[:, 0], 0.5) / RANDOM_SCORE_DRAWS
    return {**{f"random_vbcs_candidate_recall_{thr:g}": v for thr, v in recall.items()},
            "random_vbcs_top1_r1_0.5": top1}


def timeline_rows(cfg: CacrConfig, split: Split, preds: dict[str, tuple[Tensor, Tensor]], count: int = 4
                  ) -> list[dict]:
    """Segments of the first test questions that are candidate misses (for the timeline figure)."""
    miss = (~method.candidate_hit(split.best_cand_tiou, cfg.grpo.tau)).nonzero().flatten()[:count].tolist()
    rows = []
    for i in miss:
        rows.append({"question": i, "qtype": split.qtype[i], "kind": "ground truth", "start": int(split.gt[i, 0]),
                     "end": int(split.gt[i, 1])})
        rows += [{"question": i, "qtype": split.qtype[i], "kind": f"candidate {k + 1}", "start": int(c[0]),
                  "end": int(c[1])} for k, c in enumerate(split.candidates[i].tolist())]
        rows += [{"question": i, "qtype": split.qtype[i], "kind": name, "start": int(p[i, 0]), "end": int(p[i, 1])}
                 for name, (p, _) in preds.items() if name in ("top1", "dense", "grpo_full", "grpo_no_action")]
    return rows


def evaluate(cfg: CacrConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    models = load_models(cfg, model_dir)
    videos, questions = load_split(data_dir, "test", seed)
    with result.stage("evaluate"):
        split, video_features, labels = prepare_split(cfg, models["vlp"], videos, questions)
        preds = predictions(cfg, models, split)
    result.add(random_score_vbcs_metrics(cfg, split, seed))
    result.add(candidate_metrics(cfg, split),
               vlp_test_frame_accuracy=frame_accuracy(models["vlp"], video_features.flatten(0, 1), labels.flatten()),
               vlp_feature_std=float(video_features.flatten(0, 1).std(0).mean()))
    for name, (pred, rejected) in preds.items():
        result.add(method_metrics(cfg, name, pred, rejected, split))
    result.add(tables={"timeline": timeline_rows(cfg, split, preds)})
    progress(1.0, f"full mIoU {result.metrics['grpo_full_miou']:.3f}, top-1 {result.metrics['top1_miou']:.3f}")
    return result
