"""Training step of cacr [reconstructed recipe]: the VLP encoder (InfoNCE), VBCS candidates, the supervised
cold start of the reasoning policy and of the dense span regressor, then GRPO for three reward/action variants
(full: rejection reward; no_reward: alpha = 0 with the REJECT action kept; no_action: no REJECT action and no
rejection reward). One seed; checkpoints in ``model_dir``."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tasks.cacr import method
from tasks.cacr.config import CacrConfig
from tasks.cacr.data import RELATION_WORDS, load_split, render_split
from tasks.cacr.model import GroundingPolicy, VLPEncoder, build, encode_videos, frame_pairs
from tasks.common.io import load_state_dict, save_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.schedules import warmup_cosine

VLP_FILE, SFT_FILE, DENSE_FILE = "vlp.safetensors", "sft.safetensors", "dense.safetensors"
# GRPO variants: name -> (rejection-reward weight is the config's alpha?, REJECT action allowed?)
VARIANTS = {"full": (True, True), "no_reward": (False, True), "no_action": (False, False)}


def grpo_file(variant: str) -> str:
    return f"grpo_{variant}.safetensors"


@dataclass
class Split:
    """Tensors of one split's questions: frozen frame features, question ids, ground truth, VBCS candidates."""

    features: Tensor        # (Q, T, D) frame features of each question's video
    question: Tensor        # (Q, 3) relation, object, action ids
    gt: Tensor              # (Q, 2)
    candidates: Tensor      # (Q, K, 2)
    cand_scores: Tensor     # (Q, K)
    best_cand_tiou: Tensor  # (Q,)
    qtype: list[str]

    def rows(self, index: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        return self.features[index], self.question[index], self.candidates[index], self.cand_scores[index]


def train_vlp(cfg: CacrConfig, seed: int, frames: Tensor, labels: Tensor) -> tuple[VLPEncoder, list[float]]:
    """InfoNCE between frame pairs and all (object, action) descriptions, Adam with warm-up + cosine."""
    vlp = build(VLPEncoder, cfg, seed)
    opt = torch.optim.Adam(vlp.parameters(), lr=cfg.vlp.lr)
    sched = warmup_cosine(opt, cfg.vlp.steps)
    gen = torch.Generator().manual_seed(seed)
    n, t = labels.shape
    losses = []
    for _ in range(cfg.vlp.steps):
        vid = torch.randint(n, (cfg.vlp.batch_size,), generator=gen)
        frm = torch.randint(t, (cfg.vlp.batch_size,), generator=gen)
        nxt = (frm + 1).clamp_max(t - 1)
        pairs = frame_pairs(torch.stack([frames[vid, frm], frames[vid, nxt]], 1))[:, 0]
        loss = F.cross_entropy(vlp.infonce_logits(pairs, cfg.vlp.temperature), labels[vid, frm])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return vlp.eval().requires_grad_(False), losses


def frame_accuracy(vlp: VLPEncoder, features: Tensor, labels: Tensor) -> float:
    """Zero-shot frame classification by the nearest description (a check that features are not collapsed)."""
    with torch.no_grad():
        text = F.normalize(vlp.all_descriptions(), dim=-1)
    return float(((features @ text.T).argmax(-1) == labels).double().mean())


def prepare_split(cfg: CacrConfig, vlp: VLPEncoder, videos, questions) -> tuple[Split, Tensor, Tensor]:
    """Render, encode with the frozen VLP, and run VBCS for every question. Returns the split, the per-video
    features and the frame labels."""
    frames, labels = render_split(videos, cfg.data.image_size)
    video_features = encode_videos(vlp, torch.from_numpy(frames))
    q = questions.to_dicts()
    with torch.no_grad():
        q_embed = vlp.encode_text(torch.tensor([r["obj"] for r in q]), torch.tensor([r["act"] for r in q]))
    vids = torch.tensor([r["video"] for r in q])
    features = video_features[vids]
    gt = torch.tensor([[r["gt_start"], r["gt_end"]] for r in q], dtype=torch.long)
    similarity = torch.stack([method.frame_question_similarity(f, e) for f, e in zip(features, q_embed)])
    candidates, scores = method.batched_vbcs(similarity, cfg.vbcs.window_lengths, cfg.vbcs.nms_threshold,
                                             cfg.vbcs.top_k)
    best = method.tiou_tensor(candidates, gt[:, None, :]).max(dim=1).values
    question = torch.tensor([[RELATION_WORDS.index(r["relation"]), r["obj"], r["act"]] for r in q])
    split = Split(features, question, gt, candidates, scores, best, [r["qtype"] for r in q])
    return split, video_features, torch.from_numpy(labels)


def sft_targets(split: Split, max_offset: int, tau: float) -> tuple[Tensor, Tensor]:
    """Cold-start targets: the best candidate (or REJECT, index K, on a miss) and its clipped boundary offsets
    toward the ground truth, as offset-class indices."""
    k = split.candidates.shape[1]
    ious = method.tiou_tensor(split.candidates, split.gt[:, None, :])
    best = ious.argmax(1)
    choice = torch.where(method.candidate_hit(split.best_cand_tiou, tau), best, k)
    picked = split.candidates[torch.arange(len(best)), best]
    offsets = (split.gt - picked).clamp(-max_offset, max_offset) + max_offset
    return choice, offsets


def supervised_loss(model: GroundingPolicy, split: Split, index: Tensor, choice: Tensor | None,
                    offsets: Tensor | None) -> Tensor:
    """Cross-entropy of the dense start/end heads toward the ground truth, plus (policy) the choice and the
    offsets of accepted targets."""
    c, o, start, end = model(*split.rows(index))
    gt = split.gt[index]
    loss = F.cross_entropy(start, gt[:, 0]) + F.cross_entropy(end, gt[:, 1])
    if choice is not None:
        target = choice[index]
        loss = loss + F.cross_entropy(c, target)
        accepted = target < o.shape[1]
        if bool(accepted.any()):
            picked = o[accepted, target[accepted]]                       # (n, 2, 2m + 1)
            loss = loss + F.cross_entropy(picked.flatten(0, 1), offsets[index][accepted].flatten())
    return loss


def fit_supervised(cfg: CacrConfig, seed: int, model: GroundingPolicy, split: Split, choice: Tensor | None,
                   offsets: Tensor | None, steps: int) -> list[float]:
    opt = torch.optim.Adam(model.parameters(), lr=cfg.policy.lr)
    sched = warmup_cosine(opt, steps)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        index = torch.randint(len(split.gt), (cfg.policy.batch_size,), generator=gen)
        loss = supervised_loss(model, split, index, choice, offsets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return losses


def grpo_train(cfg: CacrConfig, seed: int, sft: GroundingPolicy, split: Split, alpha: float, allow_reject: bool
               ) -> tuple[GroundingPolicy, dict[str, list[float]]]:
    """GRPO from the SFT policy (Method step 4): per step, G factorised actions for each of Q questions drawn
    from the policy, R = tIoU + alpha * r_reject, ``epochs_per_batch`` PPO-clip updates with k3 KL to SFT."""
    g = cfg.grpo
    policy, ref = copy.deepcopy(sft).train(), copy.deepcopy(sft).eval().requires_grad_(False)
    opt = torch.optim.Adam(policy.parameters(), lr=g.lr)
    gen = torch.Generator().manual_seed(seed + 7919)
    curves: dict[str, list[float]] = {"reward": [], "tiou": [], "reject_rate": []}
    for _ in range(g.steps):
        unique = torch.randint(len(split.gt), (g.questions_per_step,), generator=gen)
        index = unique.repeat_interleave(g.group_size)
        rows = split.rows(unique)
        # one forward per question; its G samples share the question's logits
        group = lambda logits: tuple(x.repeat_interleave(g.group_size, dim=0) for x in logits)
        with torch.no_grad():
            logits = group(policy(*rows, allow_reject=allow_reject))
            actions = method.sample_actions(*logits, generator=gen)
            old = method.factor_logprobs(*logits, actions)
            ref_lp = method.factor_logprobs(*group(ref(*rows, allow_reject=allow_reject)), actions)
        pred = method.decode_actions(actions, split.candidates[index], cfg.policy.max_offset, cfg.data.frames)
        rejected = actions[:, 0] == cfg.vbcs.top_k
        rewards = method.reward(pred, split.gt[index], rejected, split.best_cand_tiou[index], alpha, g.tau)
        for _ in range(g.epochs_per_batch):
            new = method.factor_logprobs(*group(policy(*rows, allow_reject=allow_reject)), actions)
            loss, _ = method.grpo_objective(new, old, ref_lp, rewards.float(), g.group_size, g.clip_eps, g.beta)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(policy.parameters(), g.max_grad_norm)
            opt.step()
        curves["reward"].append(float(rewards.mean()))
        curves["tiou"].append(float(method.tiou_tensor(pred, split.gt[index]).mean()))
        curves["reject_rate"].append(float(rejected.double().mean()))
    return policy.eval(), curves


def plateau_ratio(losses: list[float]) -> float:
    """mean loss over the last 10% of steps / mean over steps 60-70%: near 1 when training has flattened."""
    n = len(losses)
    last = np.mean(losses[int(0.9 * n):]) if n >= 10 else np.mean(losses)
    mid = np.mean(losses[int(0.6 * n):max(int(0.7 * n), int(0.6 * n) + 1)])
    return float(last / mid)


def train(cfg: CacrConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        raise NotImplementedError("cacr paper profile: GRPO of a Qwen2.5-VL policy is not implemented in this "
                                  "project; tasks/cacr/hub.py holds its encoder, loaders, prompt and reward")
    result = SeedResult(seed)
    model_dir = Path(model_dir)
    videos, questions = load_split(data_dir, "train", seed)
    with result.stage("vlp"):
        frames, labels = render_split(videos, cfg.data.image_size)
        vlp, vlp_losses = train_vlp(cfg, seed, torch.from_numpy(frames), torch.from_numpy(labels))
    save_state_dict(vlp, model_dir / VLP_FILE)
    progress(0.2, f"VLP InfoNCE {vlp_losses[-1]:.3f}")
    with result.stage("vbcs"):
        split, video_features, frame_labels = prepare_split(cfg, vlp, videos, questions)
    with result.stage("sft"):
        choice, offsets = sft_targets(split, cfg.policy.max_offset, cfg.grpo.tau)
        sft = build(GroundingPolicy, cfg, seed + 1)
        sft_losses = fit_supervised(cfg, seed, sft, split, choice, offsets, cfg.policy.sft_steps)
        dense = build(GroundingPolicy, cfg, seed + 2, use_candidates=False)
        dense_losses = fit_supervised(cfg, seed + 1, dense, split, None, None, cfg.policy.dense_steps)
    sft.eval()
    save_state_dict(sft, model_dir / SFT_FILE)
    save_state_dict(dense.eval(), model_dir / DENSE_FILE)
    progress(0.5, f"SFT loss {sft_losses[-1]:.3f}, dense loss {dense_losses[-1]:.3f}")
    curves = {"vlp_loss": vlp_losses, "sft_loss": sft_losses, "dense_loss": dense_losses}
    for name, (with_reward, allow_reject) in VARIANTS.items():
        with result.stage(f"grpo_{name}"):
            policy, grpo_curves = grpo_train(cfg, seed, sft, split, cfg.grpo.alpha if with_reward else 0.0,
                                             allow_reject)
        save_state_dict(policy, model_dir / grpo_file(name))
        curves.update({f"grpo_{name}_{k}": v for k, v in grpo_curves.items()})
    progress(1.0, "GRPO variants trained")
    return result.add(vlp_final_loss=vlp_losses[-1], sft_final_loss=sft_losses[-1],
                      dense_final_loss=dense_losses[-1], sft_loss_plateau=plateau_ratio(sft_losses),
                      dense_loss_plateau=plateau_ratio(dense_losses),
                      vlp_train_frame_accuracy=frame_accuracy(vlp, video_features.flatten(0, 1),
                                                              frame_labels.flatten()),
                      train_candidate_recall=float(method.candidate_hit(split.best_cand_tiou, cfg.grpo.tau)
                                                   .double().mean()),
                      curves=curves)


def load_models(cfg: CacrConfig, model_dir: Path) -> dict[str, nn.Module]:
    """Every checkpoint of one seed: vlp, sft, dense and grpo_<variant>."""
    model_dir = Path(model_dir)
    models: dict[str, nn.Module] = {"vlp": load_state_dict(VLPEncoder(cfg), model_dir / VLP_FILE).eval(),
                                    "sft": load_state_dict(GroundingPolicy(cfg), model_dir / SFT_FILE).eval(),
                                    "dense": load_state_dict(GroundingPolicy(cfg, use_candidates=False),
                                                             model_dir / DENSE_FILE).eval()}
    for name in VARIANTS:
        models[f"grpo_{name}"] = load_state_dict(GroundingPolicy(cfg), model_dir / grpo_file(name)).eval()
    return models
