"""select_to_think method: exact values on non-degenerate inputs, each computed by hand (plain Python
on small lists) beside the library, with a negative control that monkeypatches a broken variant into
`method` and shows the same check fails (issue 20: S2T-Local's selection, its loss composition,
`frozen_token_kl`'s positions, `collect_groups`' teacher probabilities)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch

from tasks.select_to_think import method

TOL = 1e-5


def softmax(row: list[float]) -> list[float]:
    top = max(row)
    exps = [math.exp(x - top) for x in row]
    return [e / sum(exps) for e in exps]


def close(a: torch.Tensor, b: list | float, tol: float = TOL) -> bool:
    return torch.allclose(a.double(), torch.tensor(b, dtype=torch.float64), atol=tol, rtol=0)


# S2T-Local's selection: the candidate with the highest score, not the first, not the lowest ----------

SCORES = torch.tensor([[0.2, 0.9, 0.4], [0.7, 0.1, 0.3], [0.3, 0.5, 0.8]])
CANDIDATES = torch.tensor([[11, 5, 7], [2, 9, 4], [6, 3, 13]])


def local_select_check() -> bool:
    return method.local_select(SCORES, CANDIDATES).tolist() == [5, 2, 13]


def test_local_select_takes_the_highest_scoring_candidate():
    assert local_select_check()


def test_negative_control_local_select_lowest_fails(monkeypatch):
    monkeypatch.setattr(method, "local_select",
                        lambda s, c: c.gather(-1, s.argmin(-1, keepdim=True)).squeeze(-1))
    assert not local_select_check()


# The four-part loss: each part by hand, then total = ce + hinge + w_kl kl + w_frozen frozen --------

LOSS_SCORES = torch.tensor([[0.3, 1.2, -0.4, 0.8], [0.5, -0.1, 0.9, 0.2]], dtype=torch.float64)
TEACHER = torch.tensor([[0.1, 0.5, 0.05, 0.15], [0.3, 0.1, 0.2, 0.1]], dtype=torch.float64)  # rows sum 0.8, 0.7
FROZEN = torch.tensor([0.25, 0.75], dtype=torch.float64)
WEIGHTS = method.LocalLossWeights(kl_weight=0.3, frozen_kl_weight=0.7, hinge_margin=1.5)


def loss_by_hand() -> dict[str, float]:
    ce, hinge, kl = [], [], []
    for scores, teacher in zip(LOSS_SCORES.tolist(), TEACHER.tolist()):
        best = teacher.index(max(teacher))
        q = softmax(scores)
        ce.append(-math.log(q[best]))
        negatives = [s for i, s in enumerate(scores) if i != best]
        hinge.append(max(0.0, WEIGHTS.hinge_margin - (scores[best] - max(negatives))))
        target = [t / sum(teacher) for t in teacher]
        kl.append(sum(t * (math.log(t) - math.log(qi)) for t, qi in zip(target, q)))
    parts = {"ce": sum(ce) / 2, "hinge": sum(hinge) / 2, "teacher_kl": sum(kl) / 2, "frozen_kl": 0.5}
    parts["total"] = parts["ce"] + parts["hinge"] + 0.3 * parts["teacher_kl"] + 0.7 * parts["frozen_kl"]
    return parts


def local_loss_check() -> bool:
    got = method.local_loss(LOSS_SCORES, TEACHER, WEIGHTS, FROZEN)
    want = loss_by_hand()
    return set(got) == set(want) and all(abs(float(got[k]) - want[k]) < 1e-9 for k in want)


def test_local_loss_parts_and_total_exact():
    # Non-degenerate: hinge active in row 0 (1.2 - 0.8 < 1.5) and row 1 (0.3 - 0.9 < 0), teacher rows not
    # normalised, weights distinct from 1 and from each other.
    want = loss_by_hand()
    assert want["hinge"] > 0 and want["teacher_kl"] > 0
    assert local_loss_check()


def test_local_loss_without_frozen_kl_is_zero_there():
    got = method.local_loss(LOSS_SCORES, TEACHER, WEIGHTS, None)
    want = loss_by_hand()
    assert float(got["frozen_kl"]) == 0.0
    assert abs(float(got["total"]) - (want["ce"] + want["hinge"] + 0.3 * want["teacher_kl"])) < 1e-9


def _total_with_swapped_weights(scores, teacher, weights, frozen_kl=None):
    parts = ORIGINAL_LOCAL_LOSS(scores, teacher, weights, frozen_kl)
    parts["total"] = (parts["ce"] + parts["hinge"] + weights.frozen_kl_weight * parts["teacher_kl"]
                      + weights.kl_weight * parts["frozen_kl"])
    return parts


ORIGINAL_LOCAL_LOSS = method.local_loss
BROKEN_LOSS_PARTS: dict[str, Callable] = {
    "hardest_negative": lambda s, b: s.scatter(-1, b[:, None], float("inf")).min(-1).values,
    "selection_ce": lambda s, b: torch.nn.functional.cross_entropy(-s, b, reduction="none"),
    "teacher_kl": lambda s, t: (t * (torch.log(t) - torch.log_softmax(s, -1))).sum(-1),  # not renormalised
    "local_loss": _total_with_swapped_weights,
}


@pytest.mark.parametrize("name", sorted(BROKEN_LOSS_PARTS))
def test_negative_control_broken_loss_part_fails(monkeypatch, name):
    monkeypatch.setattr(method, name, BROKEN_LOSS_PARTS[name])
    assert not local_loss_check()


def test_hinge_loss_exact_with_margin():
    best = torch.tensor([1, 2])
    got = method.hinge_loss(LOSS_SCORES, best, margin=0.7)
    # row 0: 0.7 - (1.2 - 0.8) = 0.3; row 1: 0.7 - (0.9 - 0.5) = 0.3 -> clamp keeps both
    assert close(got, [0.3, 0.3], 1e-12)
    assert close(method.hinge_loss(LOSS_SCORES, best, margin=0.2), [0.0, 0.0], 1e-12)


# Loss (iv): KL(p_frozen || p_model) averaged over positions p < length, reserved rows masked ------

VOCAB, RESERVED = 5, [3]
FROZEN_LOGITS = torch.tensor([[[0.1, 0.5, -0.3, 4.0, 0.2], [1.0, 0.0, 0.3, 4.0, -0.5], [0.2, 0.2, 0.9, 4.0, 0.0]],
                              [[0.4, -0.2, 0.0, 4.0, 0.6], [0.0, 0.8, 0.1, 4.0, 0.3], [2.0, 0.1, 0.1, 4.0, -1.0]]])
MODEL_LOGITS = torch.tensor([[[0.3, 0.1, 0.2, -2.0, 0.0], [0.2, 0.4, 0.3, -2.0, 0.1], [0.9, 0.0, 0.1, 5.0, 0.4]],
                             [[0.0, 0.5, 0.3, -2.0, 0.1], [0.7, 0.2, 0.0, 3.0, 0.6], [0.1, 0.1, 1.5, 0.0, 0.2]]])
LENGTHS = torch.tensor([2, 3])


def kl_by_hand(p_logits: list[float], q_logits: list[float]) -> float:
    keep = [i for i in range(VOCAB) if i not in RESERVED]
    p = softmax([p_logits[i] for i in keep])
    q = softmax([q_logits[i] for i in keep])
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))


def frozen_kl_by_hand() -> list[float]:
    out = []
    for g, length in enumerate(LENGTHS.tolist()):
        kls = [kl_by_hand(FROZEN_LOGITS[g, p].tolist(), MODEL_LOGITS[g, p].tolist()) for p in range(length)]
        out.append(sum(kls) / length)
    return out


def frozen_token_kl_check() -> bool:
    return close(method.frozen_token_kl(MODEL_LOGITS, FROZEN_LOGITS, LENGTHS, RESERVED), frozen_kl_by_hand())


def test_frozen_token_kl_covers_exactly_the_prefix_positions():
    assert frozen_token_kl_check()


BROKEN_FROZEN_KL: dict[str, Callable] = {
    # direction swapped: KL(p_model || p_frozen)
    "reverse": lambda logits, frozen, lengths, reserved: ORIGINAL_FROZEN_KL(frozen, logits, lengths, reserved),
    # one position too many (reads the position of the action token)
    "off_by_one": lambda logits, frozen, lengths, reserved: ORIGINAL_FROZEN_KL(logits, frozen, lengths + 1, reserved),
    # reserved rows not masked
    "unmasked": lambda logits, frozen, lengths, reserved: ORIGINAL_FROZEN_KL(logits, frozen, lengths, []),
}
ORIGINAL_FROZEN_KL = method.frozen_token_kl


@pytest.mark.parametrize("variant", sorted(BROKEN_FROZEN_KL))
def test_negative_control_frozen_token_kl_variants_fail(monkeypatch, variant):
    monkeypatch.setattr(method, "frozen_token_kl", BROKEN_FROZEN_KL[variant])
    assert not frozen_token_kl_check()


# collect_groups: the SLM's top-k ids, the LLM's absolute (not renormalised) probabilities on them --

SLM = torch.tensor([[0.1, 2.0, -1.0, 1.5, 0.3], [1.2, 0.0, 0.4, -0.5, 2.2]])
LLM = torch.tensor([[0.5, 0.2, 1.1, -0.3, 0.9], [0.0, 1.3, 0.6, 0.2, -0.4]])
PREFIXES = torch.tensor([[4, 1, 2], [0, 3, 3]])


def collect_groups_check() -> bool:
    groups = method.collect_groups(PREFIXES, SLM, LLM, k=3)
    want_ids = [[1, 3, 4], [4, 0, 2]]
    want_probs = [[softmax(LLM[r].tolist())[i] for i in ids] for r, ids in enumerate(want_ids)]
    return (groups.candidates.tolist() == want_ids and close(groups.teacher_probs, want_probs)
            and groups.lengths.tolist() == [3, 3] and torch.equal(groups.prefixes, PREFIXES))


def test_collect_groups_exact():
    assert collect_groups_check()


def test_collect_groups_copies_the_prefixes():
    groups = method.collect_groups(PREFIXES, SLM, LLM, k=2)
    assert groups.prefixes.data_ptr() != PREFIXES.data_ptr()


def test_negative_control_collect_groups_renormalised_teacher_fails(monkeypatch):
    original = method.collect_groups

    def renormalised(prefixes, slm_logits, llm_logits, k):
        groups = original(prefixes, slm_logits, llm_logits, k)
        groups.teacher_probs = groups.teacher_probs / groups.teacher_probs.sum(-1, keepdim=True)
        return groups

    monkeypatch.setattr(method, "collect_groups", renormalised)
    assert not collect_groups_check()


def test_negative_control_collect_groups_slm_probabilities_fail(monkeypatch):
    monkeypatch.setattr(method, "top_k_candidates", lambda logits, k: logits.topk(k + 0, dim=-1).indices.flip(-1))
    assert not collect_groups_check()


def test_concat_groups_pads_to_the_longest_prefix():
    a = method.CandidateGroups(torch.tensor([[1, 2]]), torch.tensor([2]), torch.tensor([[3, 4]]),
                               torch.tensor([[0.2, 0.1]]))
    b = method.CandidateGroups(torch.tensor([[5, 6, 7, 8]]), torch.tensor([4]), torch.tensor([[9, 1]]),
                               torch.tensor([[0.3, 0.4]]))
    joined = method.concat_groups([a, b], pad_id=99)
    assert joined.prefixes.tolist() == [[1, 2, 99, 99], [5, 6, 7, 8]]
    assert joined.lengths.tolist() == [2, 4] and joined.candidates.tolist() == [[3, 4], [9, 1]]
    assert close(joined.teacher_probs, [[0.2, 0.1], [0.3, 0.4]])
    assert len(joined) == 2 and joined.subset(torch.tensor([1])).prefixes.tolist() == [[5, 6, 7, 8]]
    empty = method.concat_groups([])
    assert len(empty) == 0 and empty.prefixes.shape == (0, 1) and empty.candidates.shape == (0, 1)
    assert empty.prefixes.dtype == empty.lengths.dtype == empty.candidates.dtype == torch.long
    assert empty.teacher_probs.dtype.is_floating_point


# Triggers, candidate sets, bins -----------------------------------------------------------------

def test_kl_and_entropy_on_a_support_smaller_than_the_vocabulary():
    support = [1, 3, 4]  # SLM row 0's top-3
    p = softmax([SLM[0, i].item() for i in support])
    q = softmax([LLM[0, i].item() for i in support])
    kl = sum(pi * math.log(pi / qi) for pi, qi in zip(p, q))
    entropy = -sum(pi * math.log(pi) for pi in p)
    assert close(method.kl_on_support(SLM[:1], LLM[:1], support_size=3), [kl])
    assert close(method.entropy_on_support(SLM[:1], support_size=3), [entropy])
    masked = SLM[:1].clone()
    masked[0, 1] = float("-inf")  # support clipped to the 4 finite logits
    p4 = softmax([masked[0, i].item() for i in (0, 2, 3, 4)])
    assert close(method.entropy_on_support(masked, support_size=10), [-sum(x * math.log(x) for x in p4)])


def test_threshold_trigger_fires_strictly_above_after_warmup():
    scores = torch.tensor([0.2, 0.5, 0.7])
    assert method.threshold_trigger(scores, 0.5, step=3, warmup_steps=3).tolist() == [False, False, True]
    assert method.threshold_trigger(scores, 0.1, step=2, warmup_steps=3).tolist() == [False, False, False]


def test_random_trigger_rate_and_warmup():
    on = method.random_trigger(4000, 0.25, step=5, warmup_steps=5, generator=torch.Generator().manual_seed(0))
    assert abs(on.float().mean().item() - 0.25) < 0.03
    off = method.random_trigger(10, 0.9, step=4, warmup_steps=5, generator=torch.Generator().manual_seed(0))
    assert not off.any()


def test_calibrate_threshold_is_the_quantile():
    assert method.calibrate_threshold([0.0, 1.0, 2.0, 3.0, 4.0], 0.75) == pytest.approx(3.0)
    assert method.calibrate_threshold(torch.tensor([[4.0, 0.0], [2.0, 1.0]]), 0.5) == pytest.approx(1.5)


def test_ratio_candidates_threshold_is_relative_to_the_max():
    probs = softmax(SLM[0].tolist())
    want = [p > 0.3 * max(probs) for p in probs]
    assert method.ratio_candidates(SLM[:1], 0.3)[0].tolist() == want
    assert sum(want) not in (1, len(want))  # non-degenerate: some but not all


def test_s2t_select_and_takeover_on_a_row_where_they_differ():
    mask = method.ids_to_mask(torch.tensor([[1, 3, 4]]), VOCAB)
    assert mask.tolist() == [[False, True, False, True, True]]
    assert method.s2t_select(LLM[:1], mask).tolist() == [4]  # LLM's best among {1, 3, 4}
    assert method.takeover_select(LLM[:1]).tolist() == [2]


def test_hit_at_k_exact():
    hits = method.hit_at_k(SLM, LLM, ks=[1, 3, 5])
    # LLM argmax: row 0 -> 2 (SLM rank 5), row 1 -> 1 (SLM rank 4)
    assert hits[1].tolist() == [False, False] and hits[3].tolist() == [False, False]
    assert hits[5].tolist() == [True, True]
    assert method.hit_at_k(SLM, LLM, ks=[4])[4].tolist() == [False, True]


def test_bin_score_exact_on_unequal_logits():
    logits = torch.tensor([0.3, -0.2, 1.1, 0.4])
    p = softmax(logits.tolist())
    assert close(method.bin_score(logits), sum(pi * b / 3 for b, pi in enumerate(p)))
    assert method.bin_ids(7, 3) == [7, 8, 9]


def test_cut_and_mask_keeps_only_in_vocabulary_reserved_rows():
    logits = torch.arange(12.0).reshape(2, 6)
    cut = method.cut_and_mask(logits, [2, 7], vocab_size=4)
    assert cut.shape == (2, 4) and torch.isinf(cut[:, 2]).all()
    assert cut[:, [0, 1, 3]].tolist() == [[0.0, 1.0, 3.0], [6.0, 7.0, 9.0]]
    assert torch.isinf(method.cut_and_mask(logits, [5], None)[:, 5]).all()


def test_candidate_inputs_exact_rows_and_positions():
    prefixes = torch.tensor([[3, 4, 5], [6, 7, 8]])
    rows, at = method.candidate_inputs(prefixes, torch.tensor([2, 3]), torch.tensor([[1, 2], [9, 0]]), pad_id=0)
    assert rows.tolist() == [[3, 4, 1, 0], [3, 4, 2, 0], [6, 7, 8, 9], [6, 7, 8, 0]]
    assert at.tolist() == [2, 2, 3, 3]


def test_frozen_rows_change_reads_only_the_non_reserved_rows():
    before = torch.zeros(4, 2)
    after = before.clone()
    after[1] = torch.tensor([0.5, -2.0])  # reserved: ignored
    after[2] = torch.tensor([-0.25, 0.125])
    assert method.frozen_rows_change(before, after, reserved=[1]) == pytest.approx(0.25)


# Survivors of `make mutation SLUG=select_to_think` ---------------------------------------------------

def test_local_select_with_leading_batch_dimensions():
    scores = torch.stack([SCORES, SCORES.flip(-1)])  # (2, 3, 3): two batches of three groups
    candidates = torch.stack([CANDIDATES, CANDIDATES])
    assert method.local_select(scores, candidates).tolist() == [[5, 2, 13], [5, 4, 6]]


def _tiny_model():
    from tasks.common import tiny_lm

    config = tiny_lm.tiny_gpt2_config(12, 16, n_layer=1, n_head=2, n_embd=8)
    config.tie_word_embeddings = False
    return tiny_lm.build_tiny_gpt2(config, seed=3).eval()


def candidate_scores_check() -> bool:
    model, reserved = _tiny_model(), [8, 9, 10, 11]
    prefixes = torch.tensor([[1, 2, 3], [4, 5, 0]])
    lengths = torch.tensor([3, 2])
    candidates = torch.tensor([[6, 7], [2, 1]])
    with torch.no_grad():
        got = method.candidate_scores(model, prefixes, lengths, candidates, reserved)
    want = []
    for g, length in enumerate(lengths.tolist()):
        row = []
        for c in candidates[g].tolist():
            ids = torch.tensor([prefixes[g, :length].tolist() + [c]])
            with torch.no_grad():
                bins = model(input_ids=ids).logits[0, -1, reserved].tolist()
            p = softmax(bins)
            row.append(sum(pi * b / 3 for b, pi in enumerate(p)))
        want.append(row)
    return close(got, want, 1e-5)


def test_candidate_scores_read_the_reserved_bins_at_the_candidate_position():
    assert candidate_scores_check()


def test_negative_control_candidate_scores_on_the_wrong_rows_fail(monkeypatch):
    original = method.candidate_scores
    monkeypatch.setattr(method, "candidate_scores",
                        lambda model, p, lengths, c, reserved, pad_id=0, return_logits=False:
                        original(model, p, lengths, c, [r - 1 for r in reserved], pad_id, return_logits))
    assert not candidate_scores_check()


def test_train_s2t_local_reports_every_step():
    model = _tiny_model()
    g = torch.Generator().manual_seed(0)
    groups = method.CandidateGroups(torch.randint(0, 8, (5, 4), generator=g), torch.tensor([4, 3, 4, 2, 4]),
                                    torch.tensor([[1, 2], [3, 4], [5, 6], [7, 1], [2, 3]]),
                                    torch.tensor([[0.6, 0.2], [0.1, 0.5], [0.3, 0.3], [0.2, 0.1], [0.4, 0.4]]))
    seen: list[tuple[int, int]] = []
    log = method.train_s2t_local(model, groups, [8, 9, 10, 11], epochs=2, batch_groups=2, lr=1e-2,
                                 weight_decay=0.0, weights=method.LocalLossWeights(), seed=0,
                                 on_step=lambda step, total: seen.append((step, total)))
    assert seen == [(step, 6) for step in range(1, 7)]  # ceil(5 / 2) = 3 steps per epoch, 2 epochs
    assert len(log.total) == 6 and not model.training


# Fourth pass (2026-12-02): the chance level of hit@k (C1b) by enumeration, its correction, and the frozen-body
# helpers of S2T-Local (issue 18), checked here so that `method exact` covers them ------------------------------

def hit_probability_by_enumeration(valid: set[int], target: int, k: int, vocab: int) -> float:
    """Every order that lists the valid tokens first (each block uniformly permuted), counted."""
    import itertools

    inside, outside = sorted(valid), sorted(set(range(vocab)) - valid)
    hits = total = 0
    for a in itertools.permutations(inside):
        for b in itertools.permutations(outside):
            hits += target in (a + b)[:k]
            total += 1
    return hits / total


def check_chance_level() -> None:
    vocab = 5
    for n in range(1, vocab + 1):
        valid = set(range(n))
        for target in (0, vocab - 1):
            if target not in valid and n == vocab:
                continue
            for k in range(0, vocab + 2):
                want = hit_probability_by_enumeration(valid, target, k, vocab)
                assert method.random_ranking_hit_probability(n, target in valid, k, vocab) == pytest.approx(
                    want, abs=1e-12), (n, target, k)
    for bad in ((0, True, 1, 5), (6, True, 1, 5), (3, True, -1, 5), (5, False, 1, 5)):
        with pytest.raises(ValueError):
            method.random_ranking_hit_probability(*bad)
    assert method.random_ranking_hit_probability(5, True, 0, 5) == 0.0
    # the correction: (hit - chance) / (1 - chance); chance 0 leaves hit; no headroom (chance 1) is NaN
    assert method.chance_corrected_hit(0.9, 0.6) == pytest.approx(0.75, abs=1e-15)
    assert method.chance_corrected_hit(0.3, 0.0) == 0.3
    assert math.isnan(method.chance_corrected_hit(1.0, 1.0))


def test_chance_level_of_hit_at_k_by_enumeration():
    check_chance_level()


@pytest.mark.parametrize("broken", ["invalid_target_uniform_over_vocab", "k_minus_one", "headroom_ignored",
                                    "accepts_k_negative"])
def test_negative_control_chance_level_variants_are_caught(monkeypatch, broken):
    real = method.random_ranking_hit_probability
    if broken == "invalid_target_uniform_over_vocab":
        monkeypatch.setattr(method, "random_ranking_hit_probability",
                            lambda n, valid, k, v: real(n, valid, k, v) if valid else min(k, v) / v)
    elif broken == "k_minus_one":
        monkeypatch.setattr(method, "random_ranking_hit_probability",
                            lambda n, valid, k, v: real(n, valid, max(k - 1, 0), v))
    elif broken == "headroom_ignored":
        monkeypatch.setattr(method, "chance_corrected_hit", lambda hit, chance: hit - chance)
    else:
        monkeypatch.setattr(method, "random_ranking_hit_probability",
                            lambda n, valid, k, v: real(n, valid, max(k, 0), v))
    with pytest.raises((AssertionError, pytest.fail.Exception, ValueError)):
        check_chance_level()


def check_frozen_body_helpers() -> None:
    model = _tiny_model()
    head = method.output_layer(model)
    model.transformer.wpe.weight.requires_grad_(False)        # already frozen: not returned, left frozen
    frozen = method.freeze_body(model)
    head_ids = {id(p) for p in head.parameters()}
    body = [p for p in model.parameters() if id(p) not in head_ids]
    assert {id(p) for p in frozen} == {id(p) for p in body} - {id(model.transformer.wpe.weight)}
    assert all(not p.requires_grad for p in body) and all(p.requires_grad for p in head.parameters())
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    assert method.body_change(before, model) == 0.0
    with torch.no_grad():
        model.transformer.h[0].mlp.c_fc.weight[1, 2] += 0.25
        model.transformer.ln_f.bias[3] -= 0.5
        head.weight[0, 0] += 10.0                               # the head's change does not count
    assert method.body_change(before, model) == pytest.approx(0.5, abs=1e-7)

    class HeadOnly(torch.nn.Module):  # every parameter is the head's: no body at all
        def __init__(self):
            super().__init__()
            self.lm_head, self._embedding = torch.nn.Linear(2, 3), [torch.nn.Embedding(3, 2)]

        def get_output_embeddings(self):
            return self.lm_head

        def get_input_embeddings(self):
            return self._embedding[0]
    head_only = HeadOnly()
    assert method.body_change({n: p.detach().clone() for n, p in head_only.named_parameters()}, head_only) == 0.0


def test_freeze_body_and_body_change_exact():
    check_frozen_body_helpers()


@pytest.mark.parametrize("broken", ["head_counted", "first_change_only", "head_frozen_too"])
def test_negative_control_frozen_body_variants_are_caught(monkeypatch, broken):
    real_change, real_freeze = method.body_change, method.freeze_body
    if broken == "head_counted":
        monkeypatch.setattr(method, "body_change", lambda before, model: max(
            float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters()))
    elif broken == "first_change_only":
        monkeypatch.setattr(method, "body_change", lambda before, model: next(
            (float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters()
             if float((p.detach() - before[n]).abs().max()) > 0), 0.0) * 0.5 if real_change(before, model) else 0.0)
    else:
        def everything(model):
            out = real_freeze(model)
            for p in method.output_layer(model).parameters():
                p.requires_grad_(False)
            return out
        monkeypatch.setattr(method, "freeze_body", everything)
    with pytest.raises(AssertionError):
        check_frozen_body_helpers()


def check_defaults_boundaries_and_actions() -> None:
    gen = torch.Generator().manual_seed(7)
    slm = torch.randn(3, 100, generator=gen)
    llm = torch.randn(3, 100, generator=gen)
    # the support defaults to 64 tokens (vocabulary 100)
    assert torch.equal(method.kl_on_support(slm, llm), method.kl_on_support(slm, llm, 64))
    assert not torch.equal(method.kl_on_support(slm, llm, 65), method.kl_on_support(slm, llm, 64))
    assert torch.equal(method.entropy_on_support(slm), method.entropy_on_support(slm, 64))
    assert not torch.equal(method.entropy_on_support(slm, 65), method.entropy_on_support(slm, 64))
    # ratio candidates: default r = 0.1, strictly above r * p_max, per row of a (2, 3) batch
    logits = torch.log(torch.tensor([[0.5, 0.04, 0.46], [0.2, 0.7, 0.1]]))
    assert method.ratio_candidates(logits).tolist() == [[True, False, True], [True, True, True]]
    assert method.ratio_candidates(logits, 1.0).tolist() == [[False] * 3] * 2
    # calibration: a float32 tensor's quantile is taken in float64; quantiles 0 and 1 are refused
    scores = torch.tensor([0.1, 0.7, 0.2, 0.35])
    assert method.calibrate_threshold(scores, 0.9) == float(np.quantile(scores.numpy().astype(np.float64), 0.9))
    for q in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match="quantile"):
            method.calibrate_threshold(scores, q)
    # the random trigger draws from the given generator, and fires strictly below the rate
    draws = torch.rand(4, generator=torch.Generator().manual_seed(11))
    fired = method.random_trigger(4, 0.5, 5, 3, torch.Generator().manual_seed(11))
    assert fired.tolist() == (draws < 0.5).tolist()
    tie = float(torch.rand(1, generator=torch.Generator().manual_seed(12))[0])
    assert method.random_trigger(1, tie, 5, 3, torch.Generator().manual_seed(12)).tolist() == [False]
    # actions at a trigger on a batch of two rows
    prefixes = torch.tensor([[1, 2, 3], [4, 5, 6]])
    slm2, llm2 = torch.randn(2, 12, generator=gen), torch.randn(2, 12, generator=gen)
    greedy = method.act_at_trigger(None, prefixes, slm2, None, method.DecodePolicy(), [], 0)
    assert greedy.tolist() == slm2.argmax(-1).tolist()
    ratio = method.DecodePolicy(action="s2t", ratio_to_max=0.3)
    probs = torch.softmax(slm2, -1)
    mask = probs > 0.3 * probs.max(-1, keepdim=True).values
    assert method.act_at_trigger(None, prefixes, slm2, llm2, ratio, [], 0).tolist() == (
        llm2.masked_fill(~mask, -math.inf).argmax(-1).tolist())
    model, reserved = _tiny_model(), [8, 9, 10, 11]
    slm8, local = slm2[:, :8], method.DecodePolicy(action="local", k=3)
    candidates = slm8.topk(3, -1).indices
    scores = method.candidate_scores(model, prefixes, torch.tensor([3, 3]), candidates, reserved)
    want = candidates.gather(1, scores.argmax(-1, keepdim=True)).squeeze(1)
    assert method.act_at_trigger(model, prefixes, slm8, None, local, reserved, 0).tolist() == want.tolist()
    # concatenation pads with 0 by default; no parts give empty tensors of the documented shapes
    a = method.CandidateGroups(torch.tensor([[1, 2]]), torch.tensor([2]), torch.tensor([[3, 4]]),
                               torch.tensor([[0.5, 0.25]]))
    b = method.CandidateGroups(torch.tensor([[5, 6, 7]]), torch.tensor([3]), torch.tensor([[8, 9]]),
                               torch.tensor([[0.1, 0.2]]))
    assert method.concat_groups([a, b]).prefixes.tolist() == [[1, 2, 0], [5, 6, 7]]
    empty = method.concat_groups([])
    assert [tuple(t.shape) for t in (empty.prefixes, empty.lengths, empty.candidates, empty.teacher_probs)] == [
        (0, 1), (0,), (0, 1), (0, 1)]
    # next-token logits cut to the given vocabulary
    out = method.next_token_logits(model, prefixes, [9], vocab_size=10)
    assert out.shape == (2, 10) and bool(torch.isinf(out[:, 9]).all())


def test_defaults_boundaries_and_actions_exact():
    check_defaults_boundaries_and_actions()


@pytest.mark.parametrize("broken", ["support_65", "ratio_inclusive", "calibrate_float32", "unseeded_trigger",
                                    "local_as_greedy", "pad_one"])
def test_negative_control_default_and_action_variants_are_caught(monkeypatch, broken):
    if broken == "support_65":
        real = method.kl_on_support
        monkeypatch.setattr(method, "kl_on_support", lambda s, q, support_size=65: real(s, q, support_size))
    elif broken == "ratio_inclusive":
        monkeypatch.setattr(method, "ratio_candidates", lambda s, ratio=0.1: (lambda p: p >= ratio * p.max(
            -1, keepdim=True).values)(torch.softmax(s, -1)))
    elif broken == "calibrate_float32":
        monkeypatch.setattr(method, "calibrate_threshold", lambda s, q: float(np.quantile(
            np.asarray(s, dtype=np.float32), q)))
    elif broken == "unseeded_trigger":
        real_trigger = method.random_trigger
        monkeypatch.setattr(method, "random_trigger", lambda b, r, s, w, g: real_trigger(
            b, r, s, w, torch.Generator().manual_seed(99)))
    elif broken == "local_as_greedy":
        real_act = method.act_at_trigger
        monkeypatch.setattr(method, "act_at_trigger", lambda slm, p, sl, ll, policy, res, pad: sl.argmax(-1)
                            if policy.action == "local" else real_act(slm, p, sl, ll, policy, res, pad))
    else:
        real_concat = method.concat_groups
        monkeypatch.setattr(method, "concat_groups", lambda parts, pad_id=1: real_concat(parts, pad_id))
    with pytest.raises((AssertionError, pytest.fail.Exception, ValueError)):
        check_defaults_boundaries_and_actions()


def check_choice_and_trigger_mask() -> None:
    gen = torch.Generator().manual_seed(21)
    slm, llm = torch.randn(3, 100, generator=gen), torch.randn(3, 100, generator=gen)
    sample = method.DecodePolicy(action="sample", temperature=0.5)
    drawn = method.slm_choice(slm, sample, torch.Generator().manual_seed(5))
    want = torch.multinomial(torch.softmax(slm / 0.5, -1), 1, generator=torch.Generator().manual_seed(5)).squeeze(-1)
    assert drawn.tolist() == want.tolist()
    assert method.slm_choice(slm, method.DecodePolicy(), gen).tolist() == slm.argmax(-1).tolist()
    active = torch.tensor([True, False, True])
    # no trigger: nothing fires and no score is recorded
    record: list[float] = []
    none = method.trigger_mask(slm, llm, method.DecodePolicy(warmup_steps=0), 4, active, gen, record)
    assert none.tolist() == [False] * 3 and record == []
    # the KL trigger on the policy's support (5 of 100 tokens), recorded from the warm-up step on, in place
    kl = method.DecodePolicy(trigger="kl", support_size=5, warmup_steps=2, threshold=0.0)
    record = [-1.0]
    fired = method.trigger_mask(slm, llm, kl, 2, active, gen, record)
    scores = method.kl_on_support(slm, llm, 5)
    assert record[0] == -1.0 and record[1:] == pytest.approx(scores[active].tolist(), abs=1e-7)
    assert fired.tolist() == ((scores > 0.0) & active).tolist()
    entropy = method.DecodePolicy(trigger="entropy", support_size=5, warmup_steps=2)
    record = []
    method.trigger_mask(slm, llm, entropy, 3, active, gen, record)
    assert record == pytest.approx(method.entropy_on_support(slm, 5)[active].tolist(), abs=1e-7)
    # the random trigger draws from the decoder's generator
    rand = method.DecodePolicy(trigger="random", random_rate=0.5, warmup_steps=0)
    got = method.trigger_mask(slm, llm, rand, 1, active, torch.Generator().manual_seed(8), [])
    assert got.tolist() == ((torch.rand(3, generator=torch.Generator().manual_seed(8)) < 0.5) & active).tolist()
    # hit@K needs the LLM even without a collection
    with pytest.raises(ValueError, match="needs the LLM"):
        method.decode(_tiny_model(), torch.tensor([[1, 2]]), 1, method.DecodePolicy(), hit_ks=(1,))


def test_slm_choice_and_trigger_mask_exact():
    check_choice_and_trigger_mask()


@pytest.mark.parametrize("broken", ["hot_sampling", "records_before_warmup_end", "default_support", "copy_record"])
def test_negative_control_choice_and_trigger_variants_are_caught(monkeypatch, broken):
    real_choice, real_mask = method.slm_choice, method.trigger_mask
    if broken == "hot_sampling":
        monkeypatch.setattr(method, "slm_choice", lambda s, p, g: real_choice(s * p.temperature ** 2, p, g))
    elif broken == "records_before_warmup_end":
        monkeypatch.setattr(method, "trigger_mask", lambda s, q, p, step, a, g, r: real_mask(
            s, q, p, step - 1 if step == p.warmup_steps else step, a, g, r))
    elif broken == "default_support":
        import dataclasses

        monkeypatch.setattr(method, "trigger_mask", lambda s, q, p, step, a, g, r: real_mask(
            s, q, dataclasses.replace(p, support_size=64), step, a, g, r))
    else:
        monkeypatch.setattr(method, "trigger_mask", lambda s, q, p, step, a, g, r: real_mask(
            s, q, p, step, a, g, list(r)))
    with pytest.raises((AssertionError, pytest.fail.Exception, ValueError)):
        check_choice_and_trigger_mask()


def _tiny_pair():
    from tasks.common import tiny_lm

    models = []
    for seed in (3, 4):
        config = tiny_lm.tiny_gpt2_config(12, 16, n_layer=1, n_head=2, n_embd=8)
        config.tie_word_embeddings = False
        models.append(tiny_lm.build_tiny_gpt2(config, seed=seed).eval())
    return models


def check_decode_bookkeeping() -> None:
    slm, llm = _tiny_pair()
    prompts = torch.tensor([[1, 2, 3], [4, 5, 6]])
    # S2T at random triggers, hit@K and collection: the LLM runs at every step on every row; one hit per fired
    # row and k; one group per step with a fire; tokens inside the cut vocabulary of 10
    policy = method.DecodePolicy(action="s2t", trigger="random", random_rate=0.5, warmup_steps=0, k=3)
    trace = method.decode(slm, prompts, 6, policy, llm=llm, vocab_size=10, generator=torch.Generator().manual_seed(2),
                          hit_ks=(1, 2), collect_k=2)
    fired = int(trace.fired.sum())
    assert 0 < fired < 12 and trace.llm_row_evaluations == 12
    assert [len(trace.hits[k]) for k in (1, 2)] == [fired, fired]
    assert len(trace.groups) == int(trace.fired.any(0).sum()) and int(trace.tokens.max()) < 10
    assert sum(len(g) for g in trace.groups) == fired and all(g.candidates.shape[1] == 2 for g in trace.groups)
    assert trace.scores == []                                  # a random trigger records no score
    # an end-of-sequence id: a finished row emits it from then on, and decoding stops once every row has
    greedy = method.DecodePolicy()
    free = method.decode(slm, prompts, 6, greedy, vocab_size=10).tokens
    eos = int(free[0, 1])
    want = free.clone()
    ends = []
    for row in range(2):
        hit = (free[row] == eos).nonzero()
        if len(hit):
            want[row, int(hit[0]):] = eos
            ends.append(int(hit[0]))
    stop = max(ends) + 1 if len(ends) == 2 else 6
    assert torch.equal(method.decode(slm, prompts, 6, greedy, vocab_size=10, eos_id=eos).tokens, want[:, :stop])
    assert not torch.equal(want, free)                          # non-degenerate: the eos changed row 0
    same = torch.tensor([[7, 2, 3], [7, 2, 3]])                   # both rows end at the same step: decoding stops
    twin = method.decode(slm, same, 6, greedy, vocab_size=10).tokens
    first = int((twin[0] == int(twin[0, 1])).nonzero()[0])
    stopped = method.decode(slm, same, 6, greedy, vocab_size=10, eos_id=int(twin[0, 1])).tokens
    assert stopped.shape == (2, first + 1) and torch.equal(stopped, twin[:, :first + 1])
    # hit@K alone (no collection) also runs the LLM at every step on every row
    hits_only = method.decode(slm, prompts, 6, policy, llm=llm, vocab_size=10,
                              generator=torch.Generator().manual_seed(2), hit_ks=(1,))
    assert hits_only.llm_row_evaluations == 12 and len(hits_only.hits[1]) == int(hits_only.fired.sum())
    # without hit@K the LLM runs only at the fired rows
    plain = method.decode(slm, prompts, 6, policy, llm=llm, vocab_size=10, generator=torch.Generator().manual_seed(2))
    assert plain.llm_row_evaluations == int(plain.fired.sum()) > 1
    # sampling draws only from the given generator (the default one is seeded 0), never from torch's global one
    sample = method.DecodePolicy(action="sample", trigger="random", random_rate=0.5, warmup_steps=0)
    first = method.decode(slm, prompts, 6, sample, generator=torch.Generator().manual_seed(9))
    torch.manual_seed(1234)
    second = method.decode(slm, prompts, 6, sample, generator=torch.Generator().manual_seed(9))
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.fired, second.fired)
    default = method.decode(slm, prompts, 6, sample)
    assert torch.equal(default.tokens, method.decode(slm, prompts, 6, sample,
                                                     generator=torch.Generator().manual_seed(0)).tokens)


def test_decode_bookkeeping_exact():
    check_decode_bookkeeping()


@pytest.mark.parametrize("broken", ["evaluations_of_last_step", "global_generator", "no_vocab_cut"])
def test_negative_control_decode_variants_are_caught(monkeypatch, broken):
    real = method.decode

    def variant(slm, prompts, steps, policy, **kw):
        if broken == "global_generator":
            kw["generator"] = torch.Generator().manual_seed(int(torch.randint(0, 1000, (1,))))
        if broken == "no_vocab_cut":
            kw["vocab_size"] = None
        trace = real(slm, prompts, steps, policy, **kw)
        if broken == "evaluations_of_last_step":
            trace.llm_row_evaluations = int(trace.fired[:, -1].sum()) if not kw.get("hit_ks") else 2
        return trace
    monkeypatch.setattr(method, "decode", variant)
    with pytest.raises((AssertionError, ValueError, RuntimeError)):
        check_decode_bookkeeping()


def check_training_pieces() -> None:
    model, reserved = _tiny_model(), [8, 9, 10, 11]
    # AdamW groups: the body first with the given decay, the head without decay, both at the given lr
    opt = method.local_optimizer(model, 0.05, 0.3)
    head_ids = {id(p) for p in method.output_layer(model).parameters()}
    assert [g["weight_decay"] for g in opt.param_groups] == [0.3, 0.0]
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.05]
    assert {id(p) for p in opt.param_groups[1]["params"]} == head_ids
    # the gradient hook keeps exactly the reserved rows' gradient
    weight = method.output_layer(model).weight
    hook = method.restrict_output_rows(model, reserved)
    coeff = torch.arange(weight.numel(), dtype=weight.dtype).reshape(weight.shape) / 100
    (weight * coeff).sum().backward()
    hook.remove()
    want = torch.zeros_like(coeff)
    want[reserved] = coeff[reserved]
    assert torch.equal(weight.grad, want)
    # the frozen copy needs no gradient
    assert not any(p.requires_grad for p in method.frozen_copy(model).parameters())
    # cached next-token logits equal a full forward at every step, cut to the vocabulary
    cached = method.CachedLogits(model, [9], vocab_size=10)
    seqs = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for token in (7, 2):
        got = cached(seqs)
        assert got.shape == (2, 10) and torch.allclose(got, method.next_token_logits(model, seqs, [9], 10),
                                                       atol=1e-5)
        seqs = torch.cat([seqs, torch.full((2, 1), token)], dim=1)
    # one group is enough to train; with the body frozen the body does not move, gets its gradient back, loss (iv)
    # is not used, and the first step's loss is the local loss of the whole batch
    g = torch.Generator().manual_seed(0)
    groups = method.CandidateGroups(torch.randint(0, 8, (3, 4), generator=g), torch.tensor([4, 3, 4]),
                                    torch.tensor([[1, 2], [3, 4], [5, 6]]),
                                    torch.tensor([[0.6, 0.2], [0.1, 0.5], [0.3, 0.3]]))
    one = method.train_s2t_local(_tiny_model(), groups.subset(torch.tensor([0])), reserved, epochs=1,
                                 batch_groups=1, lr=1e-2, weight_decay=0.0, weights=method.LocalLossWeights(), seed=0)
    assert len(one.total) == 1
    body_model = _tiny_model()
    before = {name: p.detach().clone() for name, p in body_model.named_parameters()}
    weights = method.LocalLossWeights(kl_weight=0.7, frozen_kl_weight=0.5, hinge_margin=0.4)
    expected = method.local_step(body_model, None, groups, reserved, method.LocalLossWeights(0.7, 0.0, 0.4), 0)
    f64 = method.CandidateGroups(groups.prefixes, groups.lengths, groups.candidates, groups.teacher_probs.double())
    assert method.local_step(body_model, None, f64, reserved, method.LocalLossWeights(0.7, 0.0, 0.4),
                             0)["total"].dtype == torch.float32      # the teacher is cast to the scores' dtype
    log = method.train_s2t_local(body_model, groups, reserved, epochs=2, batch_groups=3, lr=5e-2,
                                 weight_decay=0.1, weights=weights, seed=0, train_body=False)
    assert method.body_change(before, body_model) == 0.0 and all(p.requires_grad for p in body_model.parameters())
    assert log.frozen_kl == [0.0, 0.0]
    assert log.total[0] == pytest.approx(float(expected["total"]), abs=1e-6)
    # the batch order comes from the seed only (not torch's global generator); progress steps are ints
    runs, seen = [], []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        runs.append(method.train_s2t_local(_tiny_model(), groups, reserved, epochs=2, batch_groups=1, lr=5e-2,
                                           weight_decay=0.0, weights=method.LocalLossWeights(), seed=4,
                                           on_step=lambda step, total: seen.append(step)).total)
    assert runs[0] == runs[1] and seen == [1, 2, 3, 4, 5, 6] * 2 and all(type(step) is int for step in seen)


def test_optimizer_hook_cache_and_frozen_body_training_exact():
    check_training_pieces()


@pytest.mark.parametrize("broken", ["decay_on_head", "hook_doubles", "body_trained", "frozen_weight_kept"])
def test_negative_control_training_variants_are_caught(monkeypatch, broken):
    if broken == "decay_on_head":
        real = method.local_optimizer
        monkeypatch.setattr(method, "local_optimizer", lambda model, lr, wd: (lambda opt: (
            opt.param_groups[1].__setitem__("weight_decay", wd), opt)[1])(real(model, lr, wd)))
    elif broken == "hook_doubles":
        real_hook = method.restrict_output_rows

        def doubled(model, reserved):
            handle = real_hook(model, reserved)
            extra = method.output_layer(model).weight.register_hook(lambda grad: 2 * grad)
            return type("Both", (), {"remove": lambda self: (handle.remove(), extra.remove())})()
        monkeypatch.setattr(method, "restrict_output_rows", doubled)
    elif broken == "body_trained":
        real_train = method.train_s2t_local
        monkeypatch.setattr(method, "train_s2t_local", lambda *a, **kw: real_train(*a, **(kw | {"train_body": True})))
    else:
        real_train = method.train_s2t_local
        monkeypatch.setattr(method, "train_s2t_local", lambda *a, **kw: real_train(
            *a, **(kw | {"weights": method.LocalLossWeights(kw["weights"].kl_weight, 1.0, 0.0)}
                   if kw.get("train_body") is False else kw)))
    with pytest.raises((AssertionError, ValueError, RuntimeError)):
        check_training_pieces()


def check_loss_parts_boundaries() -> None:
    # bins in float64: levels b / (B - 1) in float64 and the expected bin computed in float64
    assert method.bin_levels(4, torch.float64).tolist() == [0.0, 1 / 3, 2 / 3, 1.0]   # thirds: not exact in float32
    logits = torch.tensor([[0.3, -1.2, 0.7, 2.0]], dtype=torch.float64)
    p = softmax(logits[0].tolist())
    assert float(method.bin_score(logits)) == pytest.approx(sum(pi * b / 3 for b, pi in enumerate(p)), abs=1e-15)
    assert method.bin_score(logits).dtype == torch.float64
    # reserved ids given as an int32 tensor
    masked = method.mask_reserved(torch.zeros(1, 4), torch.tensor([1, 3], dtype=torch.int32))
    assert masked.tolist() == [[0.0, -math.inf, 0.0, -math.inf]]
    # (i) per group; (ii) margin 1 by default; (iii) a zero teacher probability adds nothing
    scores = torch.tensor([[0.2, 0.9, 0.4], [0.7, 0.1, 0.3]])
    best = torch.tensor([1, 0])
    ce = method.selection_ce(scores, best)
    assert ce.shape == (2,) and close(ce, [-math.log(softmax(r)[b]) for r, b in zip(scores.tolist(), [1, 0])])
    assert torch.equal(method.hinge_loss(scores, best), method.hinge_loss(scores, best, 1.0))
    assert close(method.hinge_loss(scores, best), [1 - (0.9 - 0.4), 1 - (0.7 - 0.3)])
    teacher = torch.tensor([[0.0, 0.6, 0.2], [0.5, 0.0, 0.5]])
    want = []
    for r, t in zip(scores.tolist(), teacher.tolist()):
        q, tt = softmax(r), [x / sum(t) for x in t]
        want.append(sum(ti * math.log(ti / qi) for ti, qi in zip(tt, q) if ti > 0))
    assert close(method.teacher_kl(scores, teacher), want)
    # (iv) a prefix of one position is averaged over one position, not two
    one = method.frozen_token_kl(MODEL_LOGITS[:1], FROZEN_LOGITS[:1], torch.tensor([1]), RESERVED)
    assert close(one, [kl_by_hand(FROZEN_LOGITS[0, 0].tolist(), MODEL_LOGITS[0, 0].tolist())])


def test_loss_parts_on_their_boundaries():
    check_loss_parts_boundaries()


@pytest.mark.parametrize("broken", ["float32_levels", "ce_mean", "margin_two", "zero_teacher_counts"])
def test_negative_control_loss_part_variants_are_caught(monkeypatch, broken):
    if broken == "float32_levels":
        real = method.bin_levels
        monkeypatch.setattr(method, "bin_levels", lambda n, dtype=torch.float32, device=None: real(n, torch.float32))
    elif broken == "ce_mean":
        monkeypatch.setattr(method, "selection_ce", lambda s, b: torch.nn.functional.cross_entropy(s, b))
    elif broken == "margin_two":
        real_hinge = method.hinge_loss
        monkeypatch.setattr(method, "hinge_loss", lambda s, b, margin=2.0: real_hinge(s, b, margin))
    else:
        real_kl = method.teacher_kl
        monkeypatch.setattr(method, "teacher_kl", lambda s, t: real_kl(s, t) + (t == 0).sum(-1))
    with pytest.raises(AssertionError):
        check_loss_parts_boundaries()
