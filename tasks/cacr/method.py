"""CACR as a pure library (no Prefect, MLflow or file layout). [reconstructed]

Only the component list comes from the paper's abstract (Qi et al., ICML 2026, arXiv 2606.08436): VLP-based
candidate selection (VBCS) of K segments, a temporal-logic reasoning policy over the candidates, a rejection
reward, GRPO. The paper body is not available to the project; every formula below is the project's
reconstruction, following prior temporal-grounding RL (Time-R1 / TimeZero: tIoU reward) and GRPO (Shao et al.
2024). "Method step n" refers to the numbered steps of the reconstruction in ``tasks/cacr/README.md``.

Segments are inclusive integer frame pairs [s, e] (s <= e). The policy's action is factorised into three
decisions ("factors"), scored like the three tokens of a completion:

- accept candidate c:  (c, offset_start, offset_end), offsets in {-m, ..., m} refine the candidate's boundaries;
- reject (c = K):      (K, start, end), a dense start/end prediction over all frames.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tasks.common.rl import add_kl_penalty, group_advantages, grpo_loss

Segment = tuple[int, int]


# --------------------------------------------------------------------------------------------- temporal IoU

def tiou(a: Segment, b: Segment) -> float:
    """Temporal IoU of inclusive frame segments (Method step 5): inter = max(0, min(e1, e2) - max(s1, s2) + 1),
    union = (e1 - s1 + 1) + (e2 - s2 + 1) - inter."""
    inter = max(0, min(a[1], b[1]) - max(a[0], b[0]) + 1)
    union = (a[1] - a[0] + 1) + (b[1] - b[0] + 1) - inter
    return inter / union


def tiou_tensor(pred: Tensor, gt: Tensor) -> Tensor:
    """``tiou`` elementwise on (..., 2) integer tensors, broadcasting; float result."""
    inter = (torch.minimum(pred[..., 1], gt[..., 1]) - torch.maximum(pred[..., 0], gt[..., 0]) + 1).clamp_min(0)
    union = (pred[..., 1] - pred[..., 0] + 1) + (gt[..., 1] - gt[..., 0] + 1) - inter
    return inter.double() / union.double()


# --------------------------------------------------------------------------------------------- VBCS

def frame_question_similarity(frame_features: Tensor, question_embedding: Tensor) -> Tensor:
    """s_t = cos(f_t, q) for (T, D) frame features and a (D,) question embedding (Method step 1)."""
    f = frame_features / frame_features.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    q = question_embedding / question_embedding.norm().clamp_min(1e-12)
    return f @ q


def window_score(similarity: Tensor, start: int, end: int) -> float:
    """S(a, b) = mean_{t in [a, b]} s_t - mean_{t outside [a, b]} s_t (Method step 1); the outside mean is 0
    when the window covers the whole video."""
    inside = similarity[start:end + 1]
    outside = torch.cat([similarity[:start], similarity[end + 1:]])
    return float(inside.mean() - (outside.mean() if outside.numel() else 0.0))


def all_window_scores(similarity: Tensor, lengths: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Every window of each length at stride 1: (W, 2) long segments and (W,) scores S(a, b), from prefix sums."""
    total_frames = similarity.shape[0]
    prefix = torch.cat([similarity.new_zeros(1), similarity.double().cumsum(0)])
    total = prefix[-1]
    segments, scores = [], []
    for length in lengths:
        starts = torch.arange(0, total_frames - length + 1)
        inside = prefix[starts + length] - prefix[starts]
        outside_count = total_frames - length
        out_mean = (total - inside) / outside_count if outside_count else torch.zeros_like(inside)
        scores.append(inside / length - out_mean)
        segments.append(torch.stack([starts, starts + length - 1], dim=1))
    return torch.cat(segments), torch.cat(scores)


def temporal_nms(segments: Tensor, scores: Tensor, threshold: float, top_k: int) -> list[int]:
    """Greedy temporal non-maximum suppression: visit windows by decreasing score (ties: lower index first),
    keep one unless its tIoU with a kept window is >= ``threshold``; stop after ``top_k``. Returns indices."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    kept: list[int] = []
    for i in order:
        seg = (int(segments[i, 0]), int(segments[i, 1]))
        if all(tiou(seg, (int(segments[j, 0]), int(segments[j, 1]))) < threshold for j in kept):
            kept.append(i)
            if len(kept) == top_k:
                break
    return kept


def vbcs_candidates(similarity: Tensor, lengths: Sequence[int], nms_threshold: float, top_k: int
                    ) -> tuple[Tensor, Tensor]:
    """VBCS (Method step 1): the top-K windows after NMS, as (K, 2) long segments and (K,) scores, by rank."""
    segments, scores = all_window_scores(similarity, lengths)
    kept = temporal_nms(segments, scores, nms_threshold, top_k)
    if len(kept) < top_k:
        raise ValueError(f"NMS left {len(kept)} windows < top_k {top_k}: lower top_k or add window lengths")
    index = torch.tensor(kept)
    return segments[index], scores[index].float()


def window_overlaps(segments: Tensor) -> Tensor:
    """(W, W) pairwise tIoU of windows (the same for every video of one length: computed once)."""
    return tiou_tensor(segments[:, None, :], segments[None, :, :])


def batched_vbcs(similarity: Tensor, lengths: Sequence[int], nms_threshold: float, top_k: int
                 ) -> tuple[Tensor, Tensor]:
    """``vbcs_candidates`` for (Q, T) similarities at once: greedy NMS as K rounds of "take the best window
    not yet suppressed (ties: lowest index), suppress every window with tIoU >= threshold with it", which
    keeps the same windows as visiting them in score order. Returns (Q, K, 2) segments and (Q, K) scores."""
    per_question = [all_window_scores(s, lengths) for s in similarity]
    segments = per_question[0][0]
    scores = torch.stack([sc for _, sc in per_question])                       # (Q, W)
    suppress = window_overlaps(segments) >= nms_threshold                       # (W, W), diagonal True
    alive = torch.ones_like(scores, dtype=torch.bool)
    kept = []
    for _ in range(top_k):
        if not bool(alive.any(dim=1).all()):
            raise ValueError(f"NMS left fewer than top_k {top_k} windows: lower top_k or add window lengths")
        pick = torch.where(alive, scores, float("-inf")).argmax(dim=1)
        kept.append(pick)
        alive &= ~suppress[pick]
    index = torch.stack(kept, 1)                                                # (Q, K)
    return segments[index], scores.gather(1, index).float()


# --------------------------------------------------------------------------------------------- actions

def apply_offsets(candidate: Segment, offset_start: int, offset_end: int, frames: int) -> Segment:
    """Refine a candidate (Method step 2): shift each boundary, clip to [0, frames - 1], sort the boundaries."""
    a = min(max(candidate[0] + offset_start, 0), frames - 1)
    b = min(max(candidate[1] + offset_end, 0), frames - 1)
    return (min(a, b), max(a, b))


def decode_actions(actions: Tensor, candidates: Tensor, max_offset: int, frames: int) -> Tensor:
    """Predicted segments (N, 2) of actions (N, 3) = (choice, f1, f2) given (N, K, 2) candidates: choice < K
    refines candidate ``choice`` by offsets f - max_offset; choice == K (reject) predicts [min(f), max(f)]."""
    k = candidates.shape[1]
    rows = []
    for action, cands in zip(actions.tolist(), candidates.tolist()):
        choice, f1, f2 = action
        if choice < k:
            rows.append(apply_offsets(tuple(cands[choice]), f1 - max_offset, f2 - max_offset, frames))
        else:
            rows.append((min(f1, f2), max(f1, f2)))
    return torch.tensor(rows, dtype=torch.long).reshape(-1, 2)


def factor_logprobs(choice_logits: Tensor, offset_logits: Tensor, start_logits: Tensor, end_logits: Tensor,
                    actions: Tensor) -> Tensor:
    """Log-probabilities (N, 3) of the action factors; log pi(action) is their sum (Method step 2).

    choice_logits (N, K + 1) (last = reject); offset_logits (N, K, 2, 2m + 1) (per candidate: start, end);
    start_logits, end_logits (N, T). Factor 1 is log p(choice); factors 2-3 are log p(offset | choice) for an
    accepted candidate, log p(start), log p(end) for a reject.
    """
    k = offset_logits.shape[1]
    choice, f1, f2 = actions[:, 0], actions[:, 1], actions[:, 2]
    log_choice = torch.log_softmax(choice_logits, -1).gather(1, choice[:, None]).squeeze(1)
    picked = offset_logits[torch.arange(len(choice)), choice.clamp_max(k - 1)]          # (N, 2, 2m + 1)
    log_off = torch.log_softmax(picked, -1)
    n_off = log_off.shape[-1]
    off1 = log_off[:, 0].gather(1, f1.clamp(0, n_off - 1)[:, None]).squeeze(1)
    off2 = log_off[:, 1].gather(1, f2.clamp(0, n_off - 1)[:, None]).squeeze(1)
    dense1 = torch.log_softmax(start_logits, -1).gather(1, f1[:, None]).squeeze(1)
    dense2 = torch.log_softmax(end_logits, -1).gather(1, f2[:, None]).squeeze(1)
    rejected = choice == k
    return torch.stack([log_choice, torch.where(rejected, dense1, off1), torch.where(rejected, dense2, off2)], 1)


def sample_actions(choice_logits: Tensor, offset_logits: Tensor, start_logits: Tensor, end_logits: Tensor,
                   generator: torch.Generator) -> Tensor:
    """Draw one factorised action per row: choice ~ softmax, then offsets of that candidate or dense frames."""
    k = offset_logits.shape[1]
    draw = lambda logits: torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=generator).squeeze(1)
    choice = draw(choice_logits)
    picked = offset_logits[torch.arange(len(choice)), choice.clamp_max(k - 1)]
    off1, off2 = draw(picked[:, 0]), draw(picked[:, 1])
    dense1, dense2 = draw(start_logits), draw(end_logits)
    rejected = choice == k
    return torch.stack([choice, torch.where(rejected, dense1, off1), torch.where(rejected, dense2, off2)], 1)


def best_span(start_logits: Tensor, end_logits: Tensor) -> Tensor:
    """Greedy dense span (N, 2): argmax over s <= e of start_logits[s] + end_logits[e] (ties: first)."""
    frames = start_logits.shape[-1]
    joint = start_logits[:, :, None] + end_logits[:, None, :]
    valid = torch.ones(frames, frames, dtype=torch.bool).triu()
    flat = torch.where(valid, joint, float("-inf")).flatten(1).argmax(1)
    return torch.stack([flat // frames, flat % frames], 1)


def greedy_actions(choice_logits: Tensor, offset_logits: Tensor, start_logits: Tensor, end_logits: Tensor
                   ) -> Tensor:
    """Deterministic decoding: argmax choice, then argmax offsets of that candidate or ``best_span``."""
    k = offset_logits.shape[1]
    choice = choice_logits.argmax(1)
    picked = offset_logits[torch.arange(len(choice)), choice.clamp_max(k - 1)]
    span = best_span(start_logits, end_logits)
    rejected = choice == k
    f1 = torch.where(rejected, span[:, 0], picked[:, 0].argmax(1))
    f2 = torch.where(rejected, span[:, 1], picked[:, 1].argmax(1))
    return torch.stack([choice, f1, f2], 1)


# --------------------------------------------------------------------------------------------- reward

def candidate_hit(best_candidate_tiou: Tensor | float, tau: float) -> Tensor:
    """A question is answerable from its candidates iff max_k tIoU(cand_k, gt) >= tau (Method step 3)."""
    return torch.as_tensor(best_candidate_tiou) >= tau


def reject_reward(rejected: Tensor, best_candidate_tiou: Tensor, tau: float) -> Tensor:
    """r_reject = 1 iff the decision is correct: reject on a candidate miss, accept on a hit (Method step 3)."""
    return (rejected.bool() != candidate_hit(best_candidate_tiou, tau)).double()


def reward(pred: Tensor, gt: Tensor, rejected: Tensor, best_candidate_tiou: Tensor, alpha: float, tau: float
           ) -> Tensor:
    """R = tIoU(pred, gt) + alpha * r_reject (Method step 3; r_format = 0: a factorised action is always
    well-formed)."""
    return tiou_tensor(pred, gt) + alpha * reject_reward(rejected, best_candidate_tiou, tau)


# --------------------------------------------------------------------------------------------- GRPO

def grpo_objective(new_logprobs: Tensor, old_logprobs: Tensor, ref_logprobs: Tensor, rewards: Tensor,
                   group_size: int, clip_eps: float, beta: float) -> tuple[Tensor, dict[str, float]]:
    """GRPO on factorised actions (Method step 4): A_i = (R_i - mean_g R) / (std_g R + eps), the PPO-clip
    surrogate on each factor's ratio, averaged over the three factors of a sample then over samples, plus
    beta * k3 KL(pi || pi_ref). The three factors play the role of an LM completion's tokens; the losses are
    ``tasks.common.rl``'s."""
    mask = torch.ones_like(new_logprobs, dtype=torch.bool)
    advantages = group_advantages(rewards, group_size)
    loss, stats = grpo_loss(new_logprobs, old_logprobs, advantages, mask, eps_low=clip_eps, eps_high=clip_eps,
                            aggregation="sequence")
    return add_kl_penalty(loss, stats, new_logprobs, ref_logprobs, mask, beta, aggregation="sequence")


# --------------------------------------------------------------------------------------------- metrics

def recall_at(ious: Tensor, threshold: float) -> float:
    """R@1 at IoU ``threshold``: the fraction of questions whose prediction has tIoU >= threshold."""
    return float((ious >= threshold).double().mean())


def false_grounding_rate(rejected: Tensor, hit: Tensor) -> float:
    """On candidate misses (no candidate reaches tau), the fraction where the policy still accepted a
    candidate; NaN when there is no miss."""
    miss = ~hit.bool()
    if not bool(miss.any()):
        return float("nan")
    return float((~rejected.bool())[miss].double().mean())
