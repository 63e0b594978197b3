"""cacr method: exact values on hand-computed inputs, identities, and negative controls that break the library
(monkeypatch) and show the same check fails."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.cacr import method

# ------------------------------------------------------------------------------------------------ tIoU


def tiou_check() -> bool:
    """By hand: [0,9] vs [5,14]: inter 5, union 10 + 10 - 5 = 15 -> 1/3; [0,4] vs [1,5]: 4 / 6 = 2/3."""
    return (math.isclose(method.tiou((0, 9), (5, 14)), 1 / 3) and method.tiou((0, 4), (5, 9)) == 0
            and method.tiou((7, 7), (7, 7)) == 1 and math.isclose(method.tiou((0, 4), (1, 5)), 2 / 3))


def test_tiou_exact_values():
    assert tiou_check()
    pred = torch.tensor([[0, 9], [0, 4], [7, 7], [0, 4]])
    gt = torch.tensor([[5, 14], [5, 9], [7, 7], [1, 5]])
    assert torch.allclose(method.tiou_tensor(pred, gt), torch.tensor([1 / 3, 0, 1, 2 / 3], dtype=torch.float64))


def test_tiou_tensor_broadcasts_like_the_scalar():
    a = torch.tensor([[[2, 6], [0, 20], [9, 9]]])
    b = torch.tensor([[4, 12]])
    expect = [method.tiou((2, 6), (4, 12)), method.tiou((0, 20), (4, 12)), method.tiou((9, 9), (4, 12))]
    assert torch.allclose(method.tiou_tensor(a, b[:, None, :])[0], torch.tensor(expect, dtype=torch.float64))
    assert expect == [3 / 11, 9 / 21, 1 / 9]


def test_negative_control_exclusive_end_tiou_is_caught(monkeypatch):
    def exclusive(a, b):  # continuous-time / exclusive-end convention: 4/14 on the first pair
        inter = max(0, min(a[1], b[1]) - max(a[0], b[0]))
        return inter / ((a[1] - a[0]) + (b[1] - b[0]) - inter)
    assert math.isclose(exclusive((0, 9), (5, 14)), 4 / 14)
    monkeypatch.setattr(method, "tiou", exclusive)
    assert not tiou_check()


# ------------------------------------------------------------------------------------------------ VBCS

SIM = torch.tensor([0, 0, 1, 1, 1, 0, 0, 0], dtype=torch.float64)


def window_check() -> bool:
    """S(2,4) = 1 - 0 and S(1,4) = 0.75 - 0 on SIM; with ones outside, [1,0,1,1,1,0,0,1]: S(2,4) = 1 - 2/5."""
    other = torch.tensor([1, 0, 1, 1, 1, 0, 0, 1], dtype=torch.float64)
    return (method.window_score(SIM, 2, 4) == 1.0 and method.window_score(SIM, 1, 4) == 0.75
            and math.isclose(method.window_score(other, 2, 4), 0.6))


def test_window_score_exact_values():
    assert window_check()
    assert method.window_score(SIM, 0, 7) == pytest.approx(3 / 8)  # no outside frames: outside mean is 0
    assert method.window_score(torch.tensor([1.0, 3.0, 2.0]), 0, 0) == pytest.approx(1 - 2.5)


def test_negative_control_window_score_without_the_outside_term(monkeypatch):
    monkeypatch.setattr(method, "window_score", lambda s, a, b: float(s[a:b + 1].mean()))
    assert not window_check()


def test_all_window_scores_match_the_definition():
    sim = torch.tensor([0.1, -0.3, 0.8, 0.5, 0.9, 0.0, -0.2, 0.4])
    segments, scores = method.all_window_scores(sim, [3, 5, 8])
    assert segments.tolist()[:2] == [[0, 2], [1, 3]] and segments.tolist()[-1] == [0, 7]
    assert len(segments) == 6 + 4 + 1
    for (a, b), score in zip(segments.tolist(), scores.tolist()):
        assert score == pytest.approx(method.window_score(sim.double(), a, b), abs=1e-12)


NMS_SEGMENTS = torch.tensor([[0, 4], [1, 5], [10, 14], [3, 7]])
NMS_SCORES = torch.tensor([0.9, 0.8, 0.7, 0.6])


def nms_check() -> bool:
    kept = method.temporal_nms(NMS_SEGMENTS, NMS_SCORES, 0.5, top_k=4)
    return NMS_SEGMENTS[kept].tolist() == [[0, 4], [10, 14], [3, 7]]


def test_temporal_nms_exact():
    assert nms_check()
    assert method.temporal_nms(NMS_SEGMENTS, NMS_SCORES, 0.5, top_k=2) == [0, 2]
    # tIoU([1,5],[0,4]) = 2/3: kept when the threshold is above it
    assert method.temporal_nms(NMS_SEGMENTS, NMS_SCORES, 0.7, top_k=4) == [0, 1, 2, 3]
    # ties: the lower index first
    assert method.temporal_nms(torch.tensor([[0, 2], [5, 7]]), torch.tensor([0.5, 0.5]), 0.5, 1) == [0]


def test_negative_control_nms_without_suppression(monkeypatch):
    monkeypatch.setattr(method, "tiou", lambda a, b: 0.0)
    assert not nms_check()


def test_batched_vbcs_equals_greedy_nms():
    gen = torch.Generator().manual_seed(3)
    sims = torch.rand(20, 32, generator=gen)
    lengths = [3, 5, 8]
    cands, scores = method.batched_vbcs(sims, lengths, 0.5, 5)
    for i in range(20):
        c, s = method.vbcs_candidates(sims[i], lengths, 0.5, 5)
        assert torch.equal(cands[i], c) and torch.allclose(scores[i], s)
    # the window score at every kept window is its S(a, b)
    a, b = cands[0, 0].tolist()
    assert scores[0, 0].item() == pytest.approx(method.window_score(sims[0].double(), a, b), abs=1e-6)
    # hand case: [2,4] scores 1 - 0; [1,3] and [3,5] (tIoU 1/2 with it) are suppressed; [0,2] and [4,6] tie at
    # 1/3 - 2/5 and the lower index wins
    c, s = method.batched_vbcs(SIM[None], [3], 0.5, 2)
    assert c[0].tolist() == [[2, 4], [0, 2]]
    assert s[0].tolist() == pytest.approx([1.0, 1 / 3 - 2 / 5])


def test_batched_vbcs_raises_when_nms_leaves_too_few():
    with pytest.raises(ValueError, match="top_k"):
        method.batched_vbcs(torch.rand(1, 6), [6], 0.5, 2)
    with pytest.raises(ValueError, match="top_k"):
        method.vbcs_candidates(torch.rand(6), [6], 0.5, 2)


def test_frame_question_similarity_is_cosine():
    f = torch.tensor([[3.0, 4.0], [0.0, 2.0], [-1.0, 0.0]])
    q = torch.tensor([0.0, 5.0])
    assert torch.allclose(method.frame_question_similarity(f, q), torch.tensor([0.8, 1.0, 0.0]))


# ------------------------------------------------------------------------------------------------ actions


def offsets_check() -> bool:
    return (method.apply_offsets((10, 15), -2, 1, 64) == (8, 16) and method.apply_offsets((0, 3), -2, 0, 64) == (0, 3)
            and method.apply_offsets((5, 5), 2, -2, 64) == (3, 7))


def test_apply_offsets_exact():
    assert offsets_check()
    assert method.apply_offsets((60, 63), 1, 2, 64) == (61, 63)


def test_negative_control_unsorted_offsets(monkeypatch):
    monkeypatch.setattr(method, "apply_offsets",
                        lambda c, a, b, t: (min(max(c[0] + a, 0), t - 1), min(max(c[1] + b, 0), t - 1)))
    assert not offsets_check()


def test_decode_actions():
    cands = torch.tensor([[[10, 15], [30, 40]], [[0, 3], [5, 5]]])
    actions = torch.tensor([[1, 0, 4], [2, 9, 4]])  # refine candidate 1 by (-2, +2); reject with frames 9, 4
    assert method.decode_actions(actions, cands, 2, 64).tolist() == [[28, 42], [4, 9]]


def logits_example():
    choice = torch.tensor([[0.0, 1.0, 2.0], [0.5, 0.0, -1.0]])           # K = 2 candidates + reject
    offsets = torch.zeros(2, 2, 2, 3)
    offsets[0, 1, 0] = torch.tensor([1.0, 0.0, 0.0])
    offsets[1, 0, 1] = torch.tensor([0.0, 0.0, 2.0])
    start = torch.tensor([[0.0, 1.0, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    end = torch.tensor([[0.0, 0.0, 0.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    return choice, offsets, start, end


def test_factor_logprobs_exact():
    choice, offsets, start, end = logits_example()
    actions = torch.tensor([[2, 1, 3], [0, 1, 2]])                        # row 0 rejects, row 1 accepts cand 0
    lp = method.factor_logprobs(choice, offsets, start, end, actions)
    lse = lambda *v: math.log(sum(math.exp(x) for x in v))
    expect = [[2 - lse(0, 1, 2), 1 - lse(0, 1, 0, 0), 3 - lse(0, 0, 0, 3)],
              [0.5 - lse(0.5, 0, -1), 0 - lse(0, 0, 0), 2 - lse(0, 0, 2)]]
    assert torch.allclose(lp, torch.tensor(expect), atol=1e-6)


def test_greedy_actions_and_best_span():
    choice, offsets, start, end = logits_example()
    assert method.greedy_actions(choice, offsets, start, end).tolist() == [[2, 1, 3], [0, 0, 2]]  # offset tie: first
    # best span respects s <= e: start peaks at 3, end at 0; the best valid pair is s = e = 3 or s = 0 ...
    s = torch.tensor([[0.0, 0.0, 0.0, 5.0]])
    e = torch.tensor([[4.0, 0.0, 0.0, 0.5]])
    assert method.best_span(s, e).tolist() == [[3, 3]]          # 5 + 0.5 beats 0 + 4 (s = 0, e = 0)
    assert method.best_span(torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 0.0, 2.0]])).tolist() == [[0, 2]]


def test_sample_actions_follow_the_factorised_distribution():
    choice = torch.tensor([[0.0, math.log(3.0), -1e9]]).repeat(4000, 1)  # p(cand 0) = 1/4, p(cand 1) = 3/4
    offsets = torch.full((4000, 2, 2, 3), -1e9)
    offsets[:, 0, :, 0] = 0.0          # candidate 0: offset class 0 surely
    offsets[:, 1, :, 2] = 0.0          # candidate 1: offset class 2 surely
    start, end = torch.zeros(4000, 5), torch.zeros(4000, 5)
    acts = method.sample_actions(choice, offsets, start, end, torch.Generator().manual_seed(0))
    frac = (acts[:, 0] == 1).double().mean().item()
    assert abs(frac - 0.75) < 0.03
    assert torch.all(acts[:, 1][acts[:, 0] == 0] == 0) and torch.all(acts[:, 2][acts[:, 0] == 1] == 2)
    reject = torch.tensor([[-1e9, -1e9, 0.0]]).repeat(500, 1)
    acts = method.sample_actions(reject, offsets[:500], start[:500], end[:500], torch.Generator().manual_seed(1))
    assert torch.all(acts[:, 0] == 2) and acts[:, 1].unique().numel() == 5


# ------------------------------------------------------------------------------------------------ reward


def reward_check() -> bool:
    hit_gt = torch.tensor([[0, 9]])
    best_miss = method.tiou_tensor(torch.tensor([[0, 4], [40, 44]]), torch.tensor([[20, 29]])).max()
    exact_tau = method.tiou_tensor(torch.tensor([7, 9]), torch.tensor([0, 9]))
    reject_on_miss = method.reward(torch.tensor([[50, 55]]), torch.tensor([[20, 29]]), torch.tensor([True]),
                                   best_miss[None], 0.5, 0.3)
    accept_on_miss = method.reward(torch.tensor([[0, 4]]), torch.tensor([[20, 29]]), torch.tensor([False]),
                                   best_miss[None], 0.5, 0.3)
    accept_hit = method.reward(hit_gt, hit_gt, torch.tensor([False]), exact_tau[None], 0.5, 0.3)
    reject_hit = method.reward(torch.tensor([[30, 40]]), hit_gt, torch.tensor([True]), exact_tau[None], 0.5, 0.3)
    return (float(exact_tau) == 0.3 and reject_on_miss.tolist() == [0.5] and accept_on_miss.tolist() == [0.0]
            and accept_hit.tolist() == [1.5] and reject_hit.tolist() == [0.0])


def test_reward_exact_values():
    assert reward_check()
    # alpha scales only the decision term: tIoU 1/3 plus 0.2 for a correct accept
    r = method.reward(torch.tensor([[0, 9]]), torch.tensor([[5, 14]]), torch.tensor([False]), torch.tensor([0.5]),
                      0.2, 0.3)
    assert r.item() == pytest.approx(1 / 3 + 0.2)


def test_negative_control_inverted_reject_reward(monkeypatch):
    monkeypatch.setattr(method, "reject_reward",
                        lambda rejected, best, tau: (rejected.bool() == method.candidate_hit(best, tau)).double())
    assert not reward_check()


def test_negative_control_strict_tau_is_caught(monkeypatch):
    monkeypatch.setattr(method, "candidate_hit", lambda best, tau: torch.as_tensor(best) > tau)
    assert not reward_check()


# ------------------------------------------------------------------------------------------------ GRPO


def test_grpo_objective_zero_cases():
    torch.manual_seed(0)
    lp = torch.randn(8, 3)
    loss, stats = method.grpo_objective(lp, lp, lp, torch.full((8,), 0.7), 4, 0.2, 0.04)
    assert loss.item() == 0.0 and stats["kl_ref"] == 0.0
    # zero advantages but pi != pi_ref: only the k3 KL, beta * mean(exp(d) - d - 1)
    ref = lp + 0.3
    loss, _ = method.grpo_objective(lp, lp, ref, torch.full((8,), 0.7), 4, 0.2, 0.5)
    assert loss.item() == pytest.approx(0.5 * (math.exp(0.3) - 0.3 - 1), rel=1e-5)


def test_grpo_objective_policy_gradient_value():
    """On policy (ratio 1), beta = 0: loss = -mean_i A_i, gradient d/d logp_ij = -A_i / (3 N)."""
    lp = torch.zeros(4, 3, requires_grad=True)
    rewards = torch.tensor([1.0, 0.0, 2.0, 2.0])       # groups of 2: A = (+1/sqrt(.5), -..), (0, 0)
    loss, _ = method.grpo_objective(lp, lp.detach(), lp.detach(), rewards, 2, 0.2, 0.0)
    loss.backward()
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert loss.item() == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(lp.grad[:, 0], torch.tensor([-a, a, 0.0, 0.0]) / 12, atol=1e-6)


def test_negative_control_grpo_without_centring(monkeypatch):
    monkeypatch.setattr(method, "group_advantages", lambda r, g: r)
    lp = torch.zeros(8, 3)
    loss, _ = method.grpo_objective(lp, lp, lp, torch.full((8,), 0.7), 4, 0.2, 0.04)
    assert loss.item() != 0.0


# ------------------------------------------------------------------------------------------------ metrics


def test_recall_and_false_grounding():
    ious = torch.tensor([0.2, 0.5, 0.7, 0.9])
    assert method.recall_at(ious, 0.5) == 0.75 and method.recall_at(ious, 0.7) == 0.5
    rejected = torch.tensor([True, False, False, True, False])
    hit = torch.tensor([False, False, True, True, False])
    assert method.false_grounding_rate(rejected, hit) == pytest.approx(2 / 3)
    assert math.isnan(method.false_grounding_rate(rejected, torch.ones(5, dtype=torch.bool)))
    assert method.reject_reward(rejected, torch.tensor([0.1, 0.1, 0.5, 0.5, 0.1]), 0.3).tolist() == [1, 0, 1, 0, 0]
