"""Experiment-level negative control of cacr (run by hand, not a pipeline stage): retrain the full policy's
GRPO stage of one cpu seed with a deliberately broken piece, evaluate it with the correct functions, and report
the claim metrics next to the correct run's, so one can see which claim checks a broken method fails.

Variants: ``unbroken_retrain`` (the same retraining with the correct functions: the reference, since the
retrained policy need not match the stored one bit for bit), ``inverted_reject_reward`` (r_reject = 1 on a
WRONG reject/accept decision) and ``exclusive_end_tiou`` (tIoU with exclusive ends, [0,9] vs [5,14] -> 4/14,
used for the training split's hit/miss labels and the GRPO reward). The VLP, SFT, dense and ablation
checkpoints of the seed are reused (trained with the correct functions), so only the GRPO stage of the full
policy sees the broken piece.

Usage: python -m tasks.cacr.negative_control [--seed 0] [--out negative_control.json]"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from tasks.cacr import method, train
from tasks.cacr.claim_metrics import claim_metrics
from tasks.cacr.data import load_split
from tasks.cacr.evaluate import evaluate
from tasks.common.io import load_state_dict, save_state_dict
from tasks.common.params import read_params, validate_paper_section

REPORTED = ("full_minus_top1_miou", "full_minus_no_action_miou_miss", "full_minus_no_action_miou",
            "full_minus_no_action_miou_hit", "full_minus_no_reward_miou_miss", "full_reject_balanced_accuracy",
            "full_minus_sft_reject_balanced_accuracy", "full_minus_sft_miou")


def inverted_reject_reward(rejected: Tensor, best_candidate_tiou: Tensor, tau: float) -> Tensor:
    """Broken on purpose: 1 iff the reject/accept decision is WRONG."""
    return (rejected.bool() == method.candidate_hit(best_candidate_tiou, tau)).double()


def exclusive_end_tiou(pred: Tensor, gt: Tensor) -> Tensor:
    """Broken on purpose: segments read as [s, e) (ends exclusive), so [0,9] vs [5,14] gives 4/14."""
    inter = (torch.minimum(pred[..., 1], gt[..., 1]) - torch.maximum(pred[..., 0], gt[..., 0])).clamp_min(0)
    union = (pred[..., 1] - pred[..., 0]) + (gt[..., 1] - gt[..., 0]) - inter
    return inter.double() / union.double().clamp_min(1e-9)


BROKEN: dict[str, tuple[str, Callable]] = {"unbroken_retrain": ("reject_reward", method.reject_reward),
                                           "inverted_reject_reward": ("reject_reward", inverted_reject_reward),
                                           "exclusive_end_tiou": ("tiou_tensor", exclusive_end_tiou)}


def retrain_full(cfg, seed: int, data_dir: Path, model_dir: Path, out_dir: Path, broken: str) -> None:
    """Copy the seed's checkpoints to ``out_dir`` and replace grpo_full by one trained with ``broken``."""
    shutil.copytree(model_dir, out_dir, dirs_exist_ok=True)
    vlp = load_state_dict(train.VLPEncoder(cfg), model_dir / train.VLP_FILE).eval()
    sft = load_state_dict(train.GroundingPolicy(cfg), model_dir / train.SFT_FILE).eval()
    name, fn = BROKEN[broken]
    original = getattr(method, name)
    setattr(method, name, fn)
    try:
        videos, questions = load_split(data_dir, "train", seed)
        split, _, _ = train.prepare_split(cfg, vlp, videos, questions)
        policy, _ = train.grpo_train(cfg, seed, sft, split, cfg.grpo.alpha, True)
    finally:
        setattr(method, name, original)
    save_state_dict(policy, out_dir / train.grpo_file("full"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="negative_control.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = validate_paper_section("cacr", read_params()["cacr"])["cpu"]
    data_dir, model_dir = Path("data/cacr"), Path(f"models/cacr/seed{args.seed}")
    rows = {}
    start = time.process_time()
    correct = claim_metrics(cfg, evaluate(cfg, args.seed, data_dir, model_dir))
    rows["correct (stored run)"] = {k: correct[k] for k in REPORTED}
    for broken in BROKEN:
        with tempfile.TemporaryDirectory() as tmp:
            retrain_full(cfg, args.seed, data_dir, model_dir, Path(tmp), broken)
            got = claim_metrics(cfg, evaluate(cfg, args.seed, data_dir, Path(tmp)))
        rows[broken] = {k: got[k] for k in REPORTED}
        print(broken, json.dumps(rows[broken]), flush=True)
    rows["cpu_seconds"] = time.process_time() - start
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
