"""selfjudge method: exact values where test_selfjudge_method.py's inputs could not tell a right formula from a wrong
one (issue 20, survivors of the full mutation run), each with a negative control that breaks the library."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tasks.selfjudge import method

EOS = 11


class ScriptedLM:
    """A stand-in for MemoLM: the next token and the hidden state depend only on the prefix length."""

    def __init__(self, next_token: dict[int, int], hidden: dict[int, float] | None = None):
        self.next_token, self.hidden = next_token, hidden or {}

    def run(self, ids) -> None:
        pass

    def info(self, ids) -> method.PrefixInfo:
        token = self.next_token.get(len(ids), EOS)
        return method.PrefixInfo(token, (token,), np.array([self.hidden.get(len(ids), -10.0)]))


def three_window_trace(max_new_tokens: int) -> method.DecodeTrace:
    """gamma = 2, prompt [0]; the head's p = sigmoid(hidden) (~0 by default: a mismatch is accepted).
    Window 1 (budget 6): draft [1, 2], target wants [1, 7] then 3; the mismatch 2 has p ~ 0: both accepted
    (1 accepted mismatch) + bonus 3. Window 2: draft [4, 5], target wants [9, 5]; p at the mismatch 4 is
    sigmoid(10) ~ 1: rejected, the target's 9 is emitted. Window 3, budget 2: one draft token 5 (budget - 1),
    accepted, + bonus 6 -> 6 tokens. With max_new_tokens = 5, window 2 (budget 2) drafts only 4 (rejected) and
    window 3 has budget 1: one draft token (5), accepted, no bonus (the budget is full) -> 5 tokens."""
    draft = ScriptedLM({1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6})
    target = ScriptedLM({1: 1, 2: 7, 3: 3, 4: 9, 5: 5, 6: 6}, hidden={5: 10.0})
    head = method.JudgeHead(np.zeros(1), np.ones(1), np.ones(1), 0.0)
    return method.speculative_generate(target, draft, [0], max_new_tokens=max_new_tokens, gamma=2, eos_id=EOS,
                                       rule=method.JudgeRule(head, 0.5))


def check_speculative_trace_counts_every_window() -> None:
    trace = three_window_trace(6)
    assert trace.tokens == [1, 2, 3, 9, 5, 6]
    assert (trace.target_calls, trace.drafted, trace.accepted_draft, trace.accepted_mismatches) == (3, 5, 3, 1)
    assert trace.window_accepts == [2, 0, 1]
    trace = three_window_trace(5)                  # window 2 has budget 2: one draft token (4), rejected
    assert trace.tokens == [1, 2, 3, 9, 5]
    assert (trace.target_calls, trace.drafted, trace.accepted_draft, trace.accepted_mismatches) == (3, 4, 3, 1)
    assert trace.window_accepts == [2, 0, 1]


def test_speculative_trace_counts_every_window():
    check_speculative_trace_counts_every_window()


def test_negative_control_counters_of_the_last_window_only_are_caught(monkeypatch):
    real = method.speculative_generate

    def last_window_only(*args, **kwargs):
        trace = real(*args, **kwargs)
        trace.target_calls, trace.drafted = 1, 1
        return trace
    monkeypatch.setattr(method, "speculative_generate", last_window_only)
    with pytest.raises(AssertionError):
        check_speculative_trace_counts_every_window()


def test_negative_control_bonus_beyond_the_budget_is_caught(monkeypatch):
    real = method.speculative_generate

    def no_budget(target, draft, prompt, max_new_tokens, gamma, eos_id, rule):
        trace = real(target, draft, prompt, max_new_tokens + 1, gamma, eos_id, rule)
        return trace
    monkeypatch.setattr(method, "speculative_generate", no_budget)
    with pytest.raises(AssertionError):
        check_speculative_trace_counts_every_window()


def check_one_token_windows_are_allowed() -> None:
    """gamma = 1 and max_new_tokens = 1 are valid (the check is >= 1): one draft token, accepted, no bonus."""
    draft, target = ScriptedLM({1: 1, 2: 2}), ScriptedLM({1: 1, 2: 2})
    trace = method.speculative_generate(target, draft, [0], 1, 1, EOS, method.ExactRule())
    assert trace.tokens == [1] and trace.drafted == 1
    trace = method.speculative_generate(target, draft, [0], 3, 1, EOS, method.ExactRule())
    assert trace.tokens == [1, 2, EOS] and trace.target_calls == 2     # window 1: 1 + bonus 2; window 2: 1 token


def test_one_token_windows_are_allowed():
    check_one_token_windows_are_allowed()


def test_negative_control_gamma_one_rejected_is_caught(monkeypatch):
    real = method.speculative_generate

    def strict(target, draft, prompt, max_new_tokens, gamma, eos_id, rule):
        if gamma < 2:
            raise ValueError("gamma")
        return real(target, draft, prompt, max_new_tokens, gamma, eos_id, rule)
    monkeypatch.setattr(method, "speculative_generate", strict)
    with pytest.raises(ValueError):
        check_one_token_windows_are_allowed()


def check_acceptance_boundaries() -> None:
    """Strict inequalities: p_head == threshold is not accepted; diff == tau labels 0; threshold 0 accepts
    exactly the matches."""
    assert method.judge_accept_mask([False, False], [0.5, 0.49], 0.5) == [False, True]
    mismatches = [SimpleNamespace(hidden_sub=np.array([1.0]), hidden_orig=np.array([0.0]), diff=d)
                  for d in (0.3, 0.2)]
    _, labels = method.head_training_set(mismatches, 0.2)
    assert labels.tolist() == [1, 0, 0, 0]
    head = method.JudgeHead(np.zeros(1), np.ones(1), np.ones(1), 0.0)
    window = method.Window([1, 2], [1, 3, 4], [(1,), (3,), (4,)], [None, None])
    assert method.JudgeRule(head, 0.0)(window) == [True, False]


def test_acceptance_boundaries():
    check_acceptance_boundaries()


def test_negative_control_non_strict_acceptance_is_caught(monkeypatch):
    monkeypatch.setattr(method, "judge_accept_mask",
                        lambda match, p_head, threshold: [bool(m) or p <= threshold for m, p in zip(match, p_head)])
    with pytest.raises(AssertionError):
        check_acceptance_boundaries()


def check_accuracy_at_the_slowest_swept_speed() -> None:
    """The range is closed: at the smallest swept speed the accuracy is that point's (mean) accuracy."""
    points = [(1.0, 0.5), (1.0, 0.7), (2.0, 0.9)]
    assert method.accuracy_at_speed(points, 1.0) == pytest.approx(0.6)
    assert method.accuracy_at_speed(points, 1.5) == pytest.approx(0.75)
    assert math.isnan(method.accuracy_at_speed(points, 0.99))


def test_accuracy_at_the_slowest_swept_speed():
    check_accuracy_at_the_slowest_swept_speed()


def test_negative_control_open_range_is_caught(monkeypatch):
    real = method.accuracy_at_speed
    monkeypatch.setattr(method, "accuracy_at_speed", lambda points, speed: (
        math.nan if speed <= min(s for s, _ in points) else real(points, speed)))
    with pytest.raises(AssertionError):
        check_accuracy_at_the_slowest_swept_speed()


class ArangeLM(torch.nn.Module):
    """Logits that rank every token: logit(v) = v, so the top-k are the k largest token ids."""

    def forward(self, input_ids, output_hidden_states=False):
        logits = torch.arange(12.0).expand(input_ids.shape[0], input_ids.shape[1], 12)
        return SimpleNamespace(logits=logits, hidden_states=None)


def check_memo_lm_keeps_top_k() -> None:
    """The default keeps the single best token; top_k = 3 keeps three, best first."""
    assert method.MemoLM(ArangeLM()).info([1, 2]).top == (11,)
    assert method.MemoLM(ArangeLM(), top_k=1).info([1, 2]).top == (11,)
    assert method.MemoLM(ArangeLM(), top_k=3).info([1, 2]).top == (11, 10, 9)


def test_memo_lm_keeps_top_k():
    check_memo_lm_keeps_top_k()


def test_negative_control_two_kept_tokens_are_caught(monkeypatch):
    real_init = method.MemoLM.__init__

    def init(self, model, top_k=1, keep_hidden=False, device="cpu"):
        real_init(self, model, max(2, top_k), keep_hidden, device)
    monkeypatch.setattr(method.MemoLM, "__init__", init)
    with pytest.raises(AssertionError):
        check_memo_lm_keeps_top_k()
