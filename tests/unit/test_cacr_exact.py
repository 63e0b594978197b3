"""cacr method: exact values where test_cacr_method.py's inputs could not tell a right formula from a wrong one
(issue 20, found by mutation testing), each with a negative control that breaks the library."""

from __future__ import annotations

import pytest
import torch

from tasks.cacr import method


def check_decode_actions_returns_long_segments() -> None:
    """Segments are frame indices: (N, 2) long, also for an empty batch (torch.tensor([]) alone would be float32)."""
    empty = method.decode_actions(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 2, 2, dtype=torch.long), 2, 64)
    assert empty.shape == (0, 2) and empty.dtype == torch.long
    segments = method.decode_actions(torch.tensor([[0, 3, 2]]), torch.tensor([[[10, 15], [1, 2]]]), 2, 64)
    assert segments.dtype == torch.long and segments.tolist() == [[11, 15]]  # candidate 0 refined by (+1, 0)


def test_decode_actions_returns_long_segments():
    check_decode_actions_returns_long_segments()


def test_negative_control_inferred_dtype_is_caught(monkeypatch):
    real = method.decode_actions
    monkeypatch.setattr(method, "decode_actions", lambda actions, candidates, max_offset, frames: torch.tensor(
        real(actions, candidates, max_offset, frames).tolist()).reshape(-1, 2))
    with pytest.raises(AssertionError):
        check_decode_actions_returns_long_segments()


# ------------------------------------------------------------------ issue 20, third pass (full-run survivors)

def check_apply_offsets_clips_each_boundary_to_the_video() -> None:
    """A boundary shifted past the last frame stops at frames - 1; one shifted below 0 stops at 0 (then sorted)."""
    assert method.apply_offsets((60, 62), 5, 0, 64) == (62, 63)    # start 65 -> 63, then sorted
    assert method.apply_offsets((0, 1), 2, -3, 64) == (0, 2)       # end -2 -> 0, start 2, sorted
    assert method.apply_offsets((10, 20), -1, 1, 64) == (9, 21)    # inside: plain shifts


def test_apply_offsets_clips_each_boundary_to_the_video():
    check_apply_offsets_clips_each_boundary_to_the_video()


def test_negative_control_clip_to_frames_is_caught(monkeypatch):
    def clip_to_frames(candidate, offset_start, offset_end, frames):
        a = min(max(candidate[0] + offset_start, 0), frames)
        b = min(max(candidate[1] + offset_end, 0), frames)
        return (min(a, b), max(a, b))
    monkeypatch.setattr(method, "apply_offsets", clip_to_frames)
    with pytest.raises(AssertionError):
        check_apply_offsets_clips_each_boundary_to_the_video()


def check_batched_vbcs_needs_top_k_windows_for_every_question() -> None:
    """Windows of lengths 2 and 4 in 4 frames at NMS threshold 0.5. Question B = [0, 1, 1, 0] picks [1, 2]
    (score 1), which suppresses [0, 3] (tIoU 2/4) but not [0, 1] or [2, 3] (tIoU 1/3), then [0, 1] (tie at 0
    with [2, 3], lower index). Question A = [1, 1, 1, 1] picks [0, 3] (score 1; every length-2 window scores 0),
    which suppresses everything: a second window for A does not exist, even though B has one."""
    a, b = [1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]
    segments, scores = method.batched_vbcs(torch.tensor([b]), [2, 4], 0.5, 2)
    assert segments.tolist() == [[[1, 2], [0, 1]]] and scores.tolist() == [[1.0, 0.0]]
    segments, _ = method.batched_vbcs(torch.tensor([a]), [2, 4], 0.5, 1)
    assert segments.tolist() == [[[0, 3]]]
    with pytest.raises(ValueError, match="fewer than top_k"):
        method.batched_vbcs(torch.tensor([a, b]), [2, 4], 0.5, 2)


def test_batched_vbcs_needs_top_k_windows_for_every_question():
    check_batched_vbcs_needs_top_k_windows_for_every_question()


def test_negative_control_nms_exhausted_for_one_question_is_caught(monkeypatch):
    real = method.batched_vbcs

    def lenient(similarity, lengths, nms_threshold, top_k):      # pads a question that ran out by repeating
        try:
            return real(similarity, lengths, nms_threshold, top_k)
        except ValueError:
            return torch.zeros(len(similarity), top_k, 2, dtype=torch.long), torch.zeros(len(similarity), top_k)
    monkeypatch.setattr(method, "batched_vbcs", lenient)
    with pytest.raises(pytest.fail.Exception):
        check_batched_vbcs_needs_top_k_windows_for_every_question()


def check_decode_actions_with_three_candidates() -> None:
    """K = 3 (not the 2 boundaries of a segment): choice 2 refines the third candidate, choice 3 rejects."""
    candidates = torch.tensor([[[10, 15], [20, 25], [30, 35]]] * 2)
    actions = torch.tensor([[2, 3, 1], [3, 7, 4]])
    assert method.decode_actions(actions, candidates, 2, 64).tolist() == [[31, 34], [4, 7]]


def test_decode_actions_with_three_candidates():
    check_decode_actions_with_three_candidates()


def test_negative_control_k_from_the_segment_axis_is_caught(monkeypatch):
    real = method.decode_actions
    monkeypatch.setattr(method, "decode_actions", lambda actions, candidates, max_offset, frames: real(
        actions, candidates[:, :2], max_offset, frames))
    with pytest.raises(AssertionError):
        check_decode_actions_with_three_candidates()


def _factor_inputs():
    """N = 3 rows, K = 3 candidates, m = 1 (3 offsets), T = 6 frames, generic logits."""
    g = torch.Generator().manual_seed(20)
    choice_logits = torch.randn(3, 4, generator=g, dtype=torch.float64)
    offset_logits = torch.randn(3, 3, 2, 3, generator=g, dtype=torch.float64)
    start_logits = torch.randn(3, 6, generator=g, dtype=torch.float64)
    end_logits = torch.randn(3, 6, generator=g, dtype=torch.float64)
    return choice_logits, offset_logits, start_logits, end_logits


def check_factor_logprobs_by_hand() -> None:
    """Row 0 accepts the last candidate (2) with offsets (0, 2); row 1 candidate 0 with offsets (2, 0); row 2
    rejects with frames (5, 4), beyond the 3 offsets. Each factor is logit - logsumexp of its own row."""
    choice_logits, offset_logits, start_logits, end_logits = _factor_inputs()
    actions = torch.tensor([[2, 0, 2], [0, 2, 0], [3, 5, 4]])
    got = method.factor_logprobs(choice_logits, offset_logits, start_logits, end_logits, actions)

    def log_p(logits, index):
        return float(logits[index] - torch.logsumexp(logits, 0))
    expected = [
        [log_p(choice_logits[0], 2), log_p(offset_logits[0, 2, 0], 0), log_p(offset_logits[0, 2, 1], 2)],
        [log_p(choice_logits[1], 0), log_p(offset_logits[1, 0, 0], 2), log_p(offset_logits[1, 0, 1], 0)],
        [log_p(choice_logits[2], 3), log_p(start_logits[2], 5), log_p(end_logits[2], 4)],
    ]
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)


def test_factor_logprobs_by_hand():
    check_factor_logprobs_by_hand()


def test_negative_control_offsets_of_the_wrong_candidate_are_caught(monkeypatch):
    real = method.factor_logprobs
    monkeypatch.setattr(method, "factor_logprobs", lambda c, o, s, e, a: real(c, o.roll(1, dims=1), s, e, a))
    with pytest.raises(AssertionError):
        check_factor_logprobs_by_hand()


def _peaked(n: int, index: list[int]) -> torch.Tensor:
    """Logits (len(index), n): 0 at index, -1e4 elsewhere (softmax is one-hot in float32: a draw is certain)."""
    logits = torch.full((len(index), n), -1e4)
    logits[torch.arange(len(index)), torch.tensor(index)] = 0.0
    return logits


def _peaked_inputs():
    """Rows: 0 chooses the last candidate (2), 1 candidate 0, 2 rejects (choice 3). Each candidate's start and
    end offsets peak at different places; dense start peaks at frame 1 or 2, dense end at 4 or 3."""
    choice_logits = _peaked(4, [2, 0, 3])
    offset_logits = torch.full((3, 3, 2, 3), -1e4)
    peaks = {0: (2, 1), 1: (0, 0), 2: (1, 2)}                   # candidate -> (start offset, end offset)
    for cand, (s, e) in peaks.items():
        offset_logits[:, cand, 0, s] = 0.0
        offset_logits[:, cand, 1, e] = 0.0
    offset_logits[1, 0, 0] = torch.tensor([-1e4, -1e4, 0.0])   # row 1, candidate 0: start offset 2 (as above)
    offset_logits[1, 0, 1] = torch.tensor([-1e4, 0.0, -1e4])   # row 1, candidate 0: end offset 1 (differs)
    start_logits, end_logits = _peaked(6, [1, 1, 1]), _peaked(6, [4, 4, 4])
    return choice_logits, offset_logits, start_logits, end_logits


def check_greedy_and_sampled_actions_on_peaked_logits() -> None:
    """With one-hot softmaxes the sample equals the argmax: [choice, start offset, end offset] of the chosen
    candidate (row 0: candidate 2 -> (1, 2); row 1: candidate 0 -> (2, 1)), dense frames for the reject
    (row 2: start 1, end 4)."""
    inputs = _peaked_inputs()
    expected = [[2, 1, 2], [0, 2, 1], [3, 1, 4]]
    assert method.greedy_actions(*inputs).tolist() == expected
    assert method.sample_actions(*inputs, generator=torch.Generator().manual_seed(0)).tolist() == expected


def test_greedy_and_sampled_actions_on_peaked_logits():
    check_greedy_and_sampled_actions_on_peaked_logits()


@pytest.mark.parametrize("name", ["greedy_actions", "sample_actions"])
def test_negative_control_swapped_offset_factors_are_caught(monkeypatch, name):
    real = getattr(method, name)
    monkeypatch.setattr(method, name, lambda c, o, s, e, **kw: real(c, o.flip(2), s, e, **kw))
    with pytest.raises(AssertionError):
        check_greedy_and_sampled_actions_on_peaked_logits()


def check_sample_actions_depends_only_on_its_generator() -> None:
    """Two draws with equally seeded generators agree whatever the global RNG did in between."""
    g = torch.Generator().manual_seed(3)
    choice_logits, offset_logits = torch.randn(64, 4, generator=g), torch.randn(64, 3, 2, 5, generator=g)
    start_logits, end_logits = torch.randn(64, 9, generator=g), torch.randn(64, 9, generator=g)
    draws = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        draws.append(method.sample_actions(choice_logits, offset_logits, start_logits, end_logits,
                                           torch.Generator().manual_seed(7)))
    assert torch.equal(draws[0], draws[1])


def test_sample_actions_depends_only_on_its_generator():
    check_sample_actions_depends_only_on_its_generator()


def test_negative_control_global_rng_is_caught(monkeypatch):
    real = method.sample_actions
    monkeypatch.setattr(method, "sample_actions", lambda c, o, s, e, generator: real(
        c, o, s, e, torch.Generator().manual_seed(int(torch.randint(0, 2**31, (1,))))))
    with pytest.raises(AssertionError):
        check_sample_actions_depends_only_on_its_generator()


def check_frame_question_similarity_of_short_vectors() -> None:
    """Cosines of vectors with norms below 1 (0.5, 0.2, 0.5): the normalisation divides by the norm itself."""
    features = torch.tensor([[0.3, 0.4], [0.0, 0.2]], dtype=torch.float64)
    question = torch.tensor([0.3, 0.4], dtype=torch.float64)
    assert method.frame_question_similarity(features, question).tolist() == pytest.approx([1.0, 0.8], abs=1e-12)


def test_frame_question_similarity_of_short_vectors():
    check_frame_question_similarity_of_short_vectors()


def test_negative_control_unnormalised_question_is_caught(monkeypatch):
    monkeypatch.setattr(method, "frame_question_similarity", lambda f, q: (
        f / f.norm(dim=-1, keepdim=True)) @ (q / q.norm().clamp_min(1.0)))
    with pytest.raises(AssertionError):
        check_frame_question_similarity_of_short_vectors()


def check_grpo_objective_clips_at_clip_eps() -> None:
    """clip_eps = 0.1 (not the library default 0.2) on both sides. One group of 2, rewards (1, 0): A = (+a, -a),
    a = 0.5 / (std + 1e-6), std = sqrt(0.5). Every factor of row 0 has ratio e^0.15 = 1.162 > 1.1, clipped to
    1.1; of row 1 e^-0.15 = 0.861 < 0.9, clipped to 0.9 (A < 0: min picks -0.9 a). Loss = -(1.1 a - 0.9 a) / 2."""
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = torch.tensor([[0.15] * 3, [-0.15] * 3], dtype=torch.float64)
    loss, stats = method.grpo_objective(new, old, new, torch.tensor([1.0, 0.0], dtype=torch.float64), 2, 0.1, 0.0)
    a = 0.5 / (0.5 ** 0.5 + 1e-6)
    assert float(loss) == pytest.approx(-(1.1 * a - 0.9 * a) / 2, rel=1e-9)
    assert stats["clip_fraction"] == 1.0


def test_grpo_objective_clips_at_clip_eps():
    check_grpo_objective_clips_at_clip_eps()


def test_negative_control_default_clip_range_is_caught(monkeypatch):
    real = method.grpo_objective
    monkeypatch.setattr(method, "grpo_objective",
                        lambda n, o, r, rw, g, clip_eps, beta: real(n, o, r, rw, g, 0.2, beta))
    with pytest.raises(AssertionError):
        check_grpo_objective_clips_at_clip_eps()
