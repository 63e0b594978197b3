"""selfjudge method: exact values on hand-built inputs, identities on tiny GPT-2s, and negative controls that
break the library (monkeypatch) and show the same check fails."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.common import tiny_lm
from tasks.selfjudge import method

VOCAB, EOS = 12, 11


def gpt2(seed: int, n_layer: int = 1, n_embd: int = 16) -> torch.nn.Module:
    config = tiny_lm.tiny_gpt2_config(VOCAB, 64, n_layer=n_layer, n_head=2, n_embd=n_embd)
    # untied, wide initialisation: a default tiny GPT-2 just repeats its last token, so no mismatches arise
    config.tie_word_embeddings, config.initializer_range = False, 0.5
    return tiny_lm.build_tiny_gpt2(config, seed).eval()


def plain_greedy(model: torch.nn.Module, prompt: list[int], max_new: int) -> list[int]:
    """Reference greedy decoding: one full forward pass per token, no memo, no batching."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(max_new):
            token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            out.append(token)
            if token == EOS:
                break
    return out


# ---------------------------------------------------------------------------------------------------- diff_N

def table_orig() -> torch.Tensor:
    # 8 positions x 6 tokens; row maxima 5, 4, 7, 3, 6, 2, 8, 1 (row t predicts token t+1)
    rows = [[5, 0, 1, 2, 0, 1], [1, 4, 0, 0, 2, 1], [0, 1, 7, 3, -2, 0], [3, 1, 0, 0, 1, 2],
            [0, 6, 1, 1, 0, 0], [1, 1, 2, 0, 0, 0], [0, 0, 0, 8, 1, 1], [1, 0, 0, 0, 0, 0]]
    return torch.tensor(rows, dtype=torch.float64)


def table_sub() -> torch.Tensor:
    sub = table_orig().clone()
    sub[3:] -= torch.tensor([[0.5], [1.0], [2.0], [0.25], [0.0]], dtype=torch.float64)  # confidence drops after m=3
    return sub


def diff_table_check() -> bool:
    """m = 3, d = 4, N = 2: orig terms max rows 2, 3, 4 = 7, 3, 6 (mean 16/3); sub terms orig[2, 4] = -2,
    max sub rows 3, 4 = 2.5, 5 (mean 5.5/3): diff = 10.5/3 = 3.5.
    Truncated: m = 6, d = 0, N = 5 on L = 8: t in 6..6; orig max rows 5, 6 = 2, 8 (mean 5); sub orig[5, 0] = 1,
    max sub row 6 = 7.75 (mean 4.375): diff = 0.625."""
    a = method.diff_n(table_orig(), table_sub(), 3, 4, 2)
    b = method.diff_n(table_orig(), table_sub(), 6, 0, 5)
    return abs(a - 3.5) < 1e-9 and abs(b - 0.625) < 1e-9


def test_diff_n_on_a_hand_built_table():
    assert diff_table_check()


def test_negative_control_index_shift_breaks_diff_n(monkeypatch):
    original = method.diff_n
    monkeypatch.setattr(method, "diff_n", lambda lo, ls, m, d, n: original(lo, ls, m + 1, d, n))
    assert not diff_table_check()


def test_diff_n_at_the_ends_of_the_valid_range():
    # m = 1, d = 2, N = 1: orig max rows 0, 1 = 5, 4 (mean 4.5); sub orig[0, 2] = 1, max sub row 1 = 4 (mean 2.5)
    assert method.diff_n(table_orig(), table_sub(), 1, 2, 1) == pytest.approx(2.0)
    # m = 7 = L - 1: no continuation row is left (truncated window); orig max row 6 = 8 against orig[6, 4] = 1
    assert method.diff_n(table_orig(), table_sub(), 7, 4, 2) == pytest.approx(7.0)


def test_diff_n_rejects_positions_outside_the_sequence():
    with pytest.raises(ValueError, match="m must lie"):
        method.diff_n(table_orig(), table_sub(), 0, 1, 2)
    with pytest.raises(ValueError, match="m must lie"):
        method.diff_n(table_orig(), table_sub(), 8, 1, 2)


def mined_pair(window: int = 0) -> tuple[list[int], int, list[method.Mismatch], torch.nn.Module]:
    target, draft = gpt2(0, 2, 32), gpt2(7)
    prompt = [3, 1, 4, 1, 5]
    response = plain_greedy(target, prompt, 20)
    sequence = prompt + response
    return sequence, len(prompt), method.mine_mismatches(target, draft, sequence, len(prompt), window), target


def diff_zero_check() -> bool:
    """Every mined diff_0 equals log p_T(y_m | Y_<m) - log p_T(d_m | Y_<m), is >= 0, and sits in the response."""
    sequence, start, mismatches, target = mined_pair(0)
    assert len(mismatches) >= 3  # a random draft disagrees with the target
    with torch.no_grad():
        logp = torch.log_softmax(target(input_ids=torch.tensor([sequence])).logits[0].double(), dim=-1)
    ok = True
    for mm in mismatches:
        gap = float(logp[mm.position - 1, mm.original] - logp[mm.position - 1, mm.substitute])
        ok &= mm.diff == pytest.approx(gap, abs=1e-5)
        ok &= mm.diff >= 0  # y_m is the target's argmax
        ok &= start <= mm.position <= len(sequence) - 2
    return bool(ok)


def test_diff_zero_is_the_log_prob_gap():
    assert diff_zero_check()


def test_negative_control_swapped_diff_zero_is_caught(monkeypatch):
    # diff_N with original and substituted terms swapped (the sign flipped): the same check must fail
    diff_n = method.diff_n
    monkeypatch.setattr(method, "diff_n", lambda lo, ls, m, d, n: -diff_n(lo, ls, m, d, n))
    assert not diff_zero_check()


def recomputed_diffs(sequence: list[int], mismatches: list[method.Mismatch], target, window: int) -> list[float]:
    """Each mismatch scored alone against the ORIGINAL sequence, one unbatched forward pass per mismatch."""
    out = []
    with torch.no_grad():
        logp_orig = torch.log_softmax(target(input_ids=torch.tensor([sequence])).logits[0].float(), dim=-1)
        for mm in mismatches:
            alone = list(sequence)
            alone[mm.position] = mm.substitute
            logp_sub = torch.log_softmax(target(input_ids=torch.tensor([alone])).logits[0].float(), dim=-1)
            out.append(method.diff_n(logp_orig, logp_sub, mm.position, mm.substitute, window))
    return out


def mining_against_original_check() -> bool:
    sequence, start, mismatches, target = mined_pair(5)
    rows = method.substituted_sequences(torch.tensor(sequence), [m.position for m in mismatches],
                                        [m.substitute for m in mismatches])
    one_change = all(int((row != torch.tensor(sequence)).sum()) == 1 for row in rows)
    same = np.allclose([m.diff for m in mismatches], recomputed_diffs(sequence, mismatches, target, 5), atol=1e-5)
    return len(mismatches) >= 3 and one_change and same


def test_mining_scores_against_the_original_sequence():
    assert mining_against_original_check()


def test_negative_control_cumulative_substitution_is_caught(monkeypatch):
    def cumulative(sequence, positions, substitutes):  # Y updated between mismatches: the bug (a)5 guards against
        rows, current = [], sequence.clone()
        for m, d in zip(positions, substitutes):
            current = current.clone()
            current[m] = int(d)
            rows.append(current)
        return torch.stack(rows)

    monkeypatch.setattr(method, "substituted_sequences", cumulative)
    assert not mining_against_original_check()


def test_mining_records_hidden_states_of_both_sequences():
    sequence, _, mismatches, target = mined_pair(5)
    mm = mismatches[0]
    alone = list(sequence)
    alone[mm.position] = mm.substitute
    with torch.no_grad():
        h_sub = target(input_ids=torch.tensor([alone]), output_hidden_states=True).hidden_states[-1][0, mm.position]
        h_orig = target(input_ids=torch.tensor([sequence]), output_hidden_states=True).hidden_states[-1][0, mm.position]
    assert np.allclose(mm.hidden_sub, h_sub.numpy(), atol=1e-5)
    assert np.allclose(mm.hidden_orig, h_orig.numpy(), atol=1e-5)
    assert not np.allclose(mm.hidden_sub, mm.hidden_orig, atol=1e-3)


# --------------------------------------------------------------------------------------------- acceptance

class ScriptedLM:
    """A stand-in for MemoLM: next token and hidden state given by tables keyed on the prefix length."""

    def __init__(self, next_token: dict[int, int], hidden: dict[int, float] | None = None, top: int = 1):
        self.next_token, self.hidden, self.calls = next_token, hidden or {}, 0

    def run(self, ids) -> None:
        self.calls += 1

    def info(self, ids) -> method.PrefixInfo:
        n = len(ids)
        token = self.next_token.get(n, EOS)
        return method.PrefixInfo(token, (token, (token + 1) % VOCAB), np.array([self.hidden.get(n, -10.0)]))


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def scripted_window(p_head_at_3: float) -> method.DecodeTrace:
    """Prompt [0]; the draft proposes 1, 2, 3, 4; the target wants 1, 2, 9, 4, then 5. The hidden state where
    the draft's 3rd token is the input (prefix length 4) carries logit(p_head_at_3); head p = sigmoid(h)."""
    draft = ScriptedLM({1: 1, 2: 2, 3: 3, 4: 4, 5: EOS})
    target = ScriptedLM({1: 1, 2: 2, 3: 9, 4: 4, 5: 5, 6: EOS}, hidden={4: logit(p_head_at_3)})
    head = method.JudgeHead(np.zeros(1), np.ones(1), np.ones(1), 0.0)
    return method.speculative_generate(target, draft, [0], max_new_tokens=5, gamma=4, eos_id=EOS,
                                       rule=method.JudgeRule(head, 0.5))


def test_acceptance_rule_example():
    assert method.judge_accept_mask([1, 1, 0, 1], [0.1, 0.1, 0.9, 0.1], 0.5) == [True, True, False, True]
    assert method.accepted_length([True, True, False, True]) == 2
    assert method.accepted_length(method.judge_accept_mask([1, 1, 0, 1], [0.1, 0.1, 0.2, 0.1], 0.5)) == 4
    important = scripted_window(0.9)
    assert important.window_accepts[0] == 2 and important.tokens[:3] == [1, 2, 9]  # 2 drafted + the target's 9
    assert important.accepted_mismatches == 0
    unimportant = scripted_window(0.2)
    assert unimportant.window_accepts[0] == 4 and unimportant.tokens == [1, 2, 3, 4, 5]  # all 4 + bonus token
    assert unimportant.accepted_mismatches == 1 and unimportant.target_calls == 1


def test_negative_control_accepting_through_a_rejection_is_caught(monkeypatch):
    monkeypatch.setattr(method, "accepted_length", lambda mask: sum(bool(a) for a in mask))
    assert scripted_window(0.9).window_accepts[0] != 2


def test_judge_mask_rejects_length_mismatch():
    with pytest.raises(ValueError, match="differ in length"):
        method.judge_accept_mask([1, 0], [0.5], 0.5)


def test_topk_mask_exact_values():
    tops = [(4, 2, 7), (1, 0, 3), (5, 6, 8)]
    assert method.topk_accept_mask([2, 3, 5], tops, 2) == [True, False, True]
    assert method.topk_accept_mask([2, 3, 5], tops, 3) == [True, True, True]
    assert method.topk_accept_mask([2, 3, 5], tops, 1) == [False, False, True]
    with pytest.raises(ValueError):
        method.topk_accept_mask([2], tops, 0)


# --------------------------------------------------------------------------------------------- losslessness

def lossless_check() -> tuple[bool, bool]:
    """(exact rules reproduce plain greedy on every prompt, accept-all judge differs somewhere)."""
    target_model, draft_model = gpt2(1, 2, 32), gpt2(2)
    target = method.MemoLM(target_model, top_k=3, keep_hidden=True)
    draft = method.MemoLM(draft_model)
    head = method.JudgeHead(np.zeros(32), np.ones(32), np.full(32, 0.1), 0.0)
    # threshold 1e-12 runs the head on every mismatch (threshold 0 returns the match mask before the head)
    rules = [method.ExactRule(), method.JudgeRule(head, 0.0), method.JudgeRule(head, 1e-12), method.TopKRule(1)]
    same, lossy_differs = True, False
    for prompt in ([3, 1, 4], [2, 7, 1, 8, 2], [5], [9, 9, 8]):
        reference = plain_greedy(target_model, prompt, 16)
        for rule in rules:
            trace = method.speculative_generate(target, draft, prompt, 16, 4, EOS, rule)
            same &= trace.tokens == reference
        lossy = method.speculative_generate(target, draft, prompt, 16, 4, EOS, method.JudgeRule(head, 1.01))
        lossy_differs |= lossy.tokens != reference
    return same, lossy_differs


def test_exact_and_threshold_zero_are_lossless():
    same, lossy_differs = lossless_check()
    assert same
    assert lossy_differs  # the pair disagrees: the check is not vacuous


def test_negative_control_accepting_every_proposal_is_caught(monkeypatch):
    monkeypatch.setattr(method, "accepted_length", lambda mask: len(mask))
    same, _ = lossless_check()
    assert not same


def test_negative_control_inverted_head_comparison_is_caught(monkeypatch):
    # a judge that accepts a mismatch when p_head >= threshold (instead of <) breaks losslessness at 1e-12
    monkeypatch.setattr(method, "judge_accept_mask",
                        lambda match, probs, t: [bool(m) or p >= t for m, p in zip(match, probs)])
    same, _ = lossless_check()
    assert not same


def test_identical_draft_accepts_whole_windows_and_counts_calls():
    model = gpt2(3, 2, 32)
    target, draft = method.MemoLM(model), method.MemoLM(model)
    prompt = [1, 2, 3]
    reference = plain_greedy(model, prompt, 20)
    trace = method.speculative_generate(target, draft, prompt, 20, 4, EOS, method.ExactRule())
    assert trace.tokens == reference
    n = len(reference)
    assert trace.target_calls == math.ceil(n / 5)  # 4 drafted + 1 bonus per window; eos ends the last one
    assert trace.accepted_draft == trace.drafted and trace.accepted_mismatches == 0


def test_memo_matches_direct_forward_and_caches_prefixes():
    model = gpt2(4, 2, 32)
    lm = method.MemoLM(model, top_k=3, keep_hidden=True)
    ids = [1, 5, 2, 8]
    lm.run(ids)
    assert lm.forward_passes == 1 and len(lm.memo) == 4
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids[:3]]), output_hidden_states=True)
    info = lm.info(ids[:3])
    assert lm.forward_passes == 1  # served from the memo
    assert info.argmax == int(out.logits[0, -1].argmax())
    assert info.top == tuple(torch.topk(out.logits[0, -1], 3).indices.tolist())
    assert np.allclose(info.hidden, out.hidden_states[-1][0, -1].numpy(), atol=1e-5)


def test_batch_greedy_equals_unbatched_greedy():
    model = gpt2(5, 2, 32)
    prompts = [[1, 2, 3], [4, 5, 6], [7, 8], [3, 3, 3, 3]]
    assert method.batch_greedy(model, prompts, 12, EOS) == [plain_greedy(model, p, 12) for p in prompts]


def test_speculative_generate_rejects_bad_arguments():
    lm = method.MemoLM(gpt2(6))
    with pytest.raises(ValueError):
        method.speculative_generate(lm, lm, [1], 5, 0, EOS, method.ExactRule())


# ------------------------------------------------------------------------------------- AutoJudge labels

class CountingModel(torch.nn.Module):
    """next token = min(last + 1, EOS): sequence 0, 1, ..., 10, 11 (eos)."""

    def forward(self, input_ids):
        nxt = torch.clamp(input_ids + 1, max=EOS)
        return type("Out", (), {"logits": torch.nn.functional.one_hot(nxt, VOCAB).float()})()


def test_autojudge_labels_exact():
    sequence = list(range(EOS + 1))  # prompt [0], response 1..10, eos

    def last_before_eos(ids):
        body = ids[: ids.index(EOS)] if EOS in ids else ids
        return body[-1] if body else None

    items = [(sequence, 3, 6, 1), (sequence, 4, EOS, 1), (sequence, 5, 2, 1)]
    # 6 at 3 -> counting resumes, 10 is still the last number (0); eos at 4 -> answer 3 (1); 2 at 5 -> still 10 (0)
    assert method.autojudge_labels(CountingModel(), items, 20, EOS, last_before_eos) == [0, 1, 0]
    length = lambda ids: len(ids)  # noqa: E731
    # with the response length as the 'answer', a jump forward shortens the response
    assert method.autojudge_labels(CountingModel(), items, 20, EOS, length) == [1, 1, 1]
    # the original token put back: the regeneration stops at eos like the original, so the length is unchanged
    # (a regeneration that ran past eos to the token budget would change it)
    assert method.autojudge_labels(CountingModel(), [(sequence, 3, 3, 1)], 20, EOS, length) == [0]


class CountingLM(CountingModel):
    """CountingModel with the keyword MemoLM passes (no hidden states kept)."""

    def forward(self, input_ids, output_hidden_states=False):
        return super().forward(input_ids)


def test_greedy_generate_stops_at_eos():
    # counting from 7: 8, 9, 10, then eos (11) ends the generation within the budget of 20
    assert method.greedy_generate(method.MemoLM(CountingLM()), [5, 7], 20, EOS) == [8, 9, 10, EOS]
    assert method.greedy_generate(method.MemoLM(CountingLM()), [5, 7], 2, EOS) == [8, 9]  # the budget


# ------------------------------------------------------------------------------------------- labels, head

def test_auroc_exact_with_ties():
    # positives 0.9, 0.5; negatives 0.5, 0.1: pairs (0.9>0.5), (0.9>0.1), (0.5=0.5 tie), (0.5>0.1) -> 3.5 / 4
    assert method.auroc([0.9, 0.5, 0.5, 0.1], [1, 1, 0, 0]) == pytest.approx(0.875, abs=1e-12)
    assert method.auroc([0.1, 0.9], [1, 0]) == 0.0
    assert math.isnan(method.auroc([0.1, 0.2], [1, 1]))


def test_label_threshold_and_c_grid_exact():
    assert method.label_threshold(list(range(10)), 0.6) == pytest.approx(5.4, abs=1e-12)
    diffs = np.arange(100, dtype=float)
    tau = method.label_threshold(diffs, 0.6)
    assert np.mean(diffs > tau) == pytest.approx(0.4)
    assert method.c_grid(3) == pytest.approx([1.0, 10 ** -0.5, 0.1])


def test_head_probability_exact():
    head = method.JudgeHead(np.array([1.0, -1.0]), np.array([2.0, 0.5]), np.array([1.0, 2.0]), -0.5)
    # z = ((3-1)/2)*1 + ((0+1)/0.5)*2 - 0.5 = 1 + 4 - 0.5 = 4.5
    assert float(head.probability(np.array([3.0, 0.0]))) == pytest.approx(1 / (1 + math.exp(-4.5)), abs=1e-12)


def test_head_training_set_labels_and_extra_negatives():
    mk = lambda d, s: method.Mismatch(5, 1, 2, d, np.full(2, s), np.full(2, -s))  # noqa: E731
    x, y = method.head_training_set([mk(0.3, 1.0), mk(0.05, 2.0), mk(0.2, 3.0)], tau=0.1)
    assert y.tolist() == [1, 0, 1, 0, 0, 0]
    assert x[:, 0].tolist() == [1.0, 2.0, 3.0, -1.0, -2.0, -3.0]
    with pytest.raises(ValueError):
        method.head_training_set([], 0.1)


def test_fit_judge_head_matches_sklearn_and_separates():
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5)) * [1, 2, 3, 1, 1] + 4
    y = (x[:, 0] + 0.3 * rng.normal(size=400) > 4).astype(int)
    head = method.fit_judge_head(x, y, 0.25, method.c_grid(4), seed=0)
    assert head.val_auroc > 0.9 and head.c in method.c_grid(4)
    order = np.random.default_rng(0).permutation(400)
    train = order[100:]
    scaler = StandardScaler().fit(x[train])
    ref = LogisticRegression(C=head.c, max_iter=2000).fit(scaler.transform(x[train]), y[train])
    assert np.allclose(head.probability(x[:20]), ref.predict_proba(scaler.transform(x[:20]))[:, 1], atol=1e-9)
    with pytest.raises(ValueError, match="both classes"):
        method.fit_judge_head(x, np.zeros(400, dtype=int), 0.25, [1.0], 0)


def head_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 5)) * [1, 2, 3, 1, 1] + 4
    return x, (x[:, 0] + 0.3 * rng.normal(size=400) > 4).astype(int)


def sklearn_head(x: np.ndarray, y: np.ndarray, c: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    order = np.random.default_rng(0).permutation(len(y))
    val, train = order[:100], order[100:]
    scaler = StandardScaler().fit(x[train])
    model = LogisticRegression(C=c, max_iter=2000).fit(scaler.transform(x[train]), y[train])
    return scaler, model, method.auroc(model.decision_function(scaler.transform(x[val])), y[val])


def test_fit_judge_head_uses_the_given_c():
    # one strong regularisation: the head must be sklearn's at C = 1e-3, whose probabilities differ from C = 1's
    x, y = head_data()
    head = method.fit_judge_head(x, y, 0.25, [1e-3], seed=0)
    scaler, ref, _ = sklearn_head(x, y, 1e-3)
    _, unregularised, _ = sklearn_head(x, y, 1.0)
    z = scaler.transform(x[:20])
    assert head.c == 1e-3
    assert np.allclose(head.probability(x[:20]), ref.predict_proba(z)[:, 1], atol=1e-9)
    assert not np.allclose(ref.predict_proba(z)[:, 1], unregularised.predict_proba(z)[:, 1], atol=1e-3)


def test_fit_judge_head_keeps_the_first_best_c():
    # C chosen by the largest validation AUROC, the first one on ties; the grid's last C is not the choice
    x, y = head_data()
    grid = [1.0, 1e-2, 1e-6]
    scores = [sklearn_head(x, y, c)[2] for c in grid]
    expected = grid[int(np.argmax(scores))]  # argmax returns the first maximum
    assert expected != grid[-1]
    head = method.fit_judge_head(x, y, 0.25, grid, seed=0)
    assert head.c == expected and head.val_auroc == pytest.approx(max(scores))


def test_accuracy_at_speed_exact():
    points = [(1.0, 0.9), (3.0, 0.4), (2.0, 0.6), (2.0, 0.8)]  # equal speeds averaged: (2, 0.7)
    assert method.accuracy_at_speed(points, 1.5) == pytest.approx(0.8)
    assert method.accuracy_at_speed(points, 2.5) == pytest.approx(0.55)
    assert method.accuracy_at_speed(points, 3.0) == pytest.approx(0.4)
    assert math.isnan(method.accuracy_at_speed(points, 3.1)) and math.isnan(method.accuracy_at_speed(points, 0.5))
    assert math.isnan(method.accuracy_at_speed([], 1.0))
