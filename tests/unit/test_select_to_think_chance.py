"""Issue 18 pieces of select_to_think: the exact chance level of hit@K (C1b) and S2T-Local with the body frozen
(C5b / C6b / C8b). Exact values on hand-computed cases, brute-force enumeration of the ranker's definition, and
negative controls that break the library."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from tasks.common import tiny_lm
from tasks.common.results import SeedResult
from tasks.select_to_think import claim_metrics, method, model
from tasks.select_to_think.config import CONFIG

BASE, N_BINS = 14, 16
RESERVED = method.bin_ids(BASE, N_BINS)


# ------------------------------------------------------------------------------------------------
# C1b: the chance level of hit@K
# ------------------------------------------------------------------------------------------------

def enumerated_hit_probability(valid: list[int], target: int, k: int, vocab: int) -> float:
    """The ranker's definition, enumerated: every order of the valid tokens followed by every order of the others
    is equally likely; the share of those orders with the target in the first k positions."""
    others = [t for t in range(vocab) if t not in valid]
    orders = [list(a) + list(b) for a in itertools.permutations(valid) for b in itertools.permutations(others)]
    return sum(target in order[:k] for order in orders) / len(orders)


def chance_matches_enumeration() -> bool:
    """method.random_ranking_hit_probability against the enumeration on a 6-token vocabulary, every class size,
    target inside and outside the class, every k (exact, as fractions of the same integers)."""
    vocab = 6
    for n in range(1, vocab + 1):
        valid = list(range(n))
        for target in ([0] if n == vocab else [0, vocab - 1]):
            for k in range(vocab + 1):
                exact = method.random_ranking_hit_probability(n, target in valid, k, vocab)
                if not math.isclose(exact, enumerated_hit_probability(valid, target, k, vocab), abs_tol=1e-12):
                    return False
    return True


def test_chance_hit_probability_equals_the_enumerated_ranker():
    assert chance_matches_enumeration()


def test_negative_control_uniform_chance_that_ignores_the_format_fails(monkeypatch):
    """A chance level that ignores the format (k / V, the paper profile's) is not this ranker's."""
    monkeypatch.setattr(method, "random_ranking_hit_probability",
                        lambda n, inside, k, vocab: min(k, vocab) / vocab)
    assert not chance_matches_enumeration()


def test_chance_hit_probability_exact_values_on_the_addition_format():
    p = method.random_ranking_hit_probability
    assert p(10, True, 8, 14) == 0.8  # a digit step: 8 of the 10 digits
    assert p(10, True, 2, 14) == 0.2
    assert p(2, True, 1, 14) == 0.5 and p(2, True, 8, 14) == 1.0  # a carry step
    assert p(1, True, 1, 14) == 1.0  # a marker ('A', '<eos>')
    assert p(10, False, 8, 14) == 0.0 and p(10, False, 12, 14) == 0.5  # a target outside its class
    assert p(14, True, 8, 14) == 8 / 14  # no format known: K / |V|
    for bad in ((0, True, 1, 14), (15, True, 1, 14), (14, False, 1, 14)):
        with pytest.raises(ValueError):
            p(*bad)


def test_exact_chance_hits_sum_the_step_probabilities():
    """Four trigger steps: a digit, a carry, a marker, a digit whose LLM token is outside the digits."""
    hits = model.exact_chance_hits([10, 2, 1, 10], [True, True, True, False], [1, 2, 8, 12], 14)
    assert hits == {"chance_hit_at_1_expected": pytest.approx(0.1 + 0.5 + 1 + 0),
                    "chance_hit_at_2_expected": pytest.approx(0.2 + 1 + 1 + 0),
                    "chance_hit_at_8_expected": pytest.approx(0.8 + 1 + 1 + 0),
                    "chance_hit_at_12_expected": pytest.approx(1 + 1 + 1 + 0.5)}


def test_exact_chance_is_the_mean_of_the_sampled_ranker():
    """The sampled class-only ranker (C1's precondition) hits at the exact rate: within 5 standard errors."""
    sizes, inside = [10, 2, 1, 10] * 5_000, [True, True, True, False] * 5_000
    sampled = model.class_chance_counts(sizes, inside, [1, 2, 8, 12], 14, np.random.default_rng(3))
    exact = model.exact_chance_hits(sizes, inside, [1, 2, 8, 12], 14)
    n = len(sizes)
    for k in (1, 2, 8, 12):
        rate = exact[f"chance_hit_at_{k}_expected"] / n
        assert sampled[f"class_chance_hit_at_{k}_count"] / n == pytest.approx(
            rate, abs=5 * math.sqrt(rate * (1 - rate) / n) + 1e-9)


def test_class_chance_at_triggers_reports_the_exact_chance_at_the_fired_steps():
    classes = [tuple(range(10)), (0, 1), (12,)]
    fired = torch.tensor([[False, True, True], [True, False, False]])
    targets = torch.tensor([[5, 1, 12], [11, 3, 3]])  # fired: carry 1 (in), marker 12 (in), digit step 11 (out)
    out = model.class_chance_at_triggers(fired, targets, classes, [1, 8], 14, np.random.default_rng(0))
    assert out["chance_hit_at_1_expected"] == pytest.approx(0.5 + 1 + 0)
    assert out["chance_hit_at_8_expected"] == pytest.approx(1 + 1 + 0)


def corrected_check() -> bool:
    """C1b's metric on hand values: hit@8 0.9 and exact chance 6 / 8 = 0.75 -> (0.9 - 0.75) / 0.25 = 0.6,
    excess 0.15; hit@1 0.5 at chance 0.5 -> 0."""
    result = SeedResult(0).add(slm_greedy_accuracy=0.5, local_entropy_accuracy=0.5, s2t_accuracy=0.5,
                               takeover_accuracy=0.5, hit_at_1=0.5, hit_at_8=0.9, trigger_count=8.0,
                               hit_at_1_count=4.0, chance_hit_at_1_expected=4.0, chance_hit_at_8_expected=6.0)
    out = claim_metrics.claim_metrics(CONFIG.model_validate(smoke_section()), result)
    return (math.isclose(out["hit_at_8_over_chance"], 0.6) and math.isclose(out["hit_at_8_minus_chance"], 0.15)
            and out["chance_hit_at_8"] == 0.75 and out["hit_at_1_over_chance"] == 0.0
            and "hit_at_2_over_chance" not in out)


def smoke_section() -> dict:
    from tasks.common.params import params_section

    return params_section("select_to_think")["smoke"]


def test_chance_corrected_hit_exact():
    assert corrected_check()
    assert method.chance_corrected_hit(0.95, 0.0) == 0.95  # no chance: the paper's hit@8 unchanged
    assert method.chance_corrected_hit(0.7, 0.8) == pytest.approx(-0.5)  # worse than chance
    assert math.isnan(method.chance_corrected_hit(1.0, 1.0))


def test_negative_control_an_uncorrected_excess_fails(monkeypatch):
    monkeypatch.setattr(method, "chance_corrected_hit", lambda hit, chance: hit - chance)
    assert not corrected_check()


# ------------------------------------------------------------------------------------------------
# C5b / C6b / C8b: S2T-Local with the body frozen
# ------------------------------------------------------------------------------------------------

def tiny_model(seed: int = 0):
    config = tiny_lm.tiny_gpt2_config(BASE + N_BINS, 24, n_layer=1, n_head=2, n_embd=16)
    config.tie_word_embeddings = False
    return tiny_lm.build_tiny_gpt2(config, seed=seed).eval()


def learnable_groups(n: int, k: int = 4, liked: int = 3, seed: int = 0) -> method.CandidateGroups:
    """Groups whose teacher always prefers token ``liked`` (placed at a random candidate slot): a read-out of
    the candidate's own embedding can learn it, a scorer that learns nothing finds it 1 time in k."""
    g = torch.Generator().manual_seed(seed)
    prefixes = torch.randint(0, BASE, (n, 8), generator=g)
    lengths = torch.randint(4, 9, (n,), generator=g)
    others = [t for t in range(10) if t != liked]
    candidates, teacher = [], torch.full((n, k), 0.05)
    for i in range(n):
        row = [others[j] for j in torch.randperm(len(others), generator=g)[:k].tolist()]
        slot = int(torch.randint(0, k, (1,), generator=g))
        row[slot] = liked
        candidates.append(row)
        teacher[i, slot] = 0.8
    return method.CandidateGroups(prefixes, lengths, torch.tensor(candidates), teacher)


def train_frozen(model_: torch.nn.Module, groups: method.CandidateGroups, lr: float = 3e-2
                 ) -> method.LocalTrainingLog:
    return method.train_s2t_local(model_, groups, RESERVED, epochs=4, batch_groups=8, lr=lr, weight_decay=0.01,
                                  weights=method.LocalLossWeights(), seed=0, train_body=False)


def frozen_body_check() -> bool:
    """C8b: training with the body frozen moves the reserved rows and nothing else (every body parameter and
    every other row of lm_head bitwise unchanged), gives the parameters their gradient back, and its loss (iv)
    is 0 (not computed)."""
    net = tiny_model()
    head = net.get_output_embeddings().weight
    head_before = head.detach().clone()
    body_before = {name: p.detach().clone() for name, p in net.named_parameters()}
    log = train_frozen(net, learnable_groups(32))
    assert not torch.equal(head.detach()[RESERVED], head_before[RESERVED])  # it trained something
    assert all(p.requires_grad for p in net.parameters())
    assert log.frozen_kl and all(v == 0.0 for v in log.frozen_kl)
    return method.body_change(body_before, net) == 0.0 and method.frozen_rows_change(
        head_before, head.detach(), RESERVED) == 0.0


def test_frozen_body_training_moves_only_the_reserved_rows():
    assert frozen_body_check()


def test_negative_control_a_freeze_that_forgets_a_layer_fails_c8b(monkeypatch):
    original = method.freeze_body

    def leaky_freeze(net):
        frozen = original(net)
        leaked = net.transformer.h[0].mlp.c_fc.weight  # forgotten: it keeps its gradient
        leaked.requires_grad_(True)
        return [p for p in frozen if p is not leaked]

    monkeypatch.setattr(method, "freeze_body", leaky_freeze)
    assert not frozen_body_check()


def frozen_readout_learns_check() -> bool:
    """The frozen-body read-out is a real scorer: trained on groups whose teacher always likes one token, its
    held-out selection rate (model.scorer_teacher_count) beats the 1 / k of a random pick by a wide margin."""
    net = tiny_model(seed=1)
    train_frozen(net, learnable_groups(96, seed=0))
    heldout = learnable_groups(64, seed=1)
    rate = model.scorer_teacher_count(net, heldout, RESERVED, batch_groups=16) / len(heldout)
    return rate >= 0.75


def test_frozen_body_read_out_learns_a_learnable_scorer():
    assert frozen_readout_learns_check()


def test_negative_control_a_hook_that_freezes_every_row_learns_nothing(monkeypatch):
    def freeze_all_rows(net, reserved):
        return method.output_layer(net).weight.register_hook(lambda grad: grad * 0.0)

    monkeypatch.setattr(method, "restrict_output_rows", freeze_all_rows)
    assert not frozen_readout_learns_check()


def test_body_change_exact():
    net = tiny_model()
    before = {name: p.detach().clone() for name, p in net.named_parameters()}
    with torch.no_grad():
        net.get_output_embeddings().weight[0, 0] += 5.0  # the head is not the body
        assert method.body_change(before, net) == 0.0
        net.transformer.h[0].mlp.c_fc.weight[0, 0] += 0.25
    assert method.body_change(before, net) == pytest.approx(0.25)


def test_full_fine_tune_is_unchanged_by_the_frozen_option():
    """train_body=True (C5's full fine-tune) trains the body as before: the same loss curve and weights whether
    or not the option is passed (the frozen variant does not disturb the existing checkpoints)."""
    first, second = tiny_model(), tiny_model()
    groups = learnable_groups(16)
    weights = method.LocalLossWeights()
    log_a = method.train_s2t_local(first, groups, RESERVED, 1, 8, 1e-2, 0.01, weights, 0)
    log_b = method.train_s2t_local(second, groups, RESERVED, 1, 8, 1e-2, 0.01, weights, 0, train_body=True)
    assert log_a.total == log_b.total and any(v > 0 for v in log_a.frozen_kl)
    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))


def scorer_seed_result(frozen_scorer_teacher_count: float) -> SeedResult:
    """One seed's measurements for the scorer preconditions: 20 held-out groups, full scorer 5, SLM top-1 10,
    chance 2 expected; only the frozen-body scorer's count varies between the tests."""
    return SeedResult(0).add(slm_greedy_accuracy=0.5, local_entropy_accuracy=0.5, s2t_accuracy=0.5,
                             takeover_accuracy=0.5, slm_maj_accuracy=0.375, trigger_count=4.0,
                             hit_at_1_count=2.0, heldout_group_count=20.0,
                             local_scorer_teacher_count=5.0, slm_top1_teacher_count=10.0,
                             scorer_chance_expected=2.0, local_frozen_scorer_teacher_count=frozen_scorer_teacher_count,
                             local_frozen_entropy_accuracy=0.625)


def test_scorer_chance_and_frozen_scorer_metrics_exact():
    """C5/C6/C5b/C6b preconditions: scorer rate minus 1 / K, for the full and the frozen-body scorer."""
    result = scorer_seed_result(frozen_scorer_teacher_count=1.0)
    out = claim_metrics.claim_metrics(CONFIG.model_validate(smoke_section()), result)
    assert out["scorer_chance_rate"] == 0.1
    assert out["local_scorer_minus_chance"] == pytest.approx(0.15)
    assert out["local_frozen_scorer_teacher_rate"] == 0.05
    assert out["local_frozen_scorer_minus_chance"] == pytest.approx(-0.05)  # below chance: precondition not met
    assert out["local_frozen_entropy_over_greedy"] == 1.25 and out["local_frozen_entropy_minus_maj"] == 0.25


class _LikedTokenBins(torch.nn.Module):
    """Score bins that say 1 for token ``liked`` and 0 for any other candidate (all tied when it is absent)."""

    def __init__(self, liked: int):
        super().__init__()
        self.liked = liked

    def forward(self, input_ids):
        logits = torch.zeros(*input_ids.shape, BASE + N_BINS)
        top = torch.where(input_ids == self.liked, BASE + N_BINS - 1, BASE)
        logits.scatter_(-1, top[..., None], 50.0)
        return type("Out", (), {"logits": logits})()


def tie_check() -> bool:
    """Three groups of 3 candidates; the teacher prefers slot 0, 1, 0. A scorer that likes an absent token ties
    every candidate: 1/3 per group (1.0 in all), not the 2 groups argmax-on-ties (slot 0, the SLM's top-1) would
    give. A scorer that likes token 4 picks slot 1 in group 2 (the teacher's: 1) and ties the others (1/3 each)."""
    candidates = torch.tensor([[3, 5, 7], [3, 4, 7], [5, 3, 7]])
    teacher = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.5, 0.4, 0.1]])
    groups = method.CandidateGroups(torch.ones(3, 4, dtype=torch.long), torch.tensor([2, 3, 4]), candidates, teacher)
    collapsed = model.scorer_teacher_count(_LikedTokenBins(9), groups, RESERVED, batch_groups=2)
    liked = model.scorer_teacher_count(_LikedTokenBins(4), groups, RESERVED, batch_groups=2)
    return math.isclose(collapsed, 1.0) and math.isclose(liked, 1 + 2 / 3)


def test_scorer_teacher_count_breaks_ties_at_random():
    assert tie_check()


def test_negative_control_argmax_on_ties_favours_the_slm_top1(monkeypatch):
    def argmax_count(net, groups, reserved, batch_groups, pad_id=0):
        with torch.no_grad():
            scores = method.candidate_scores(net, groups.prefixes, groups.lengths, groups.candidates, reserved, pad_id)
        return float((scores.argmax(-1) == groups.teacher_probs.argmax(-1)).sum())

    monkeypatch.setattr(model, "scorer_teacher_count", argmax_count)
    assert not tie_check()


# ------------------------------------------------------------------------------------------------
# Fix round of the 12-02 review: C5b / C6b carry C5's top-1 bar; C8b's metric covers the non-reserved rows
# ------------------------------------------------------------------------------------------------

def frozen_top1_check() -> bool:
    """Held-out groups 20, frozen scorer 6 of them (0.3), SLM top-1 10 (0.5), chance 2 (0.1): the frozen scorer is
    above chance (+0.2) but below the top-1 (-0.2), the case of the 12-02 run, where C5b must read undecided."""
    result = scorer_seed_result(frozen_scorer_teacher_count=6.0)
    out = claim_metrics.claim_metrics(CONFIG.model_validate(smoke_section()), result)
    return (math.isclose(out["local_frozen_scorer_minus_top1"], -0.2)
            and math.isclose(out["local_frozen_scorer_minus_chance"], 0.2))


def test_frozen_scorer_minus_top1_exact():
    assert frozen_top1_check()


def test_negative_control_frozen_bar_against_chance_only_fails(monkeypatch):
    """The omission the review found: the frozen scorer compared with chance where the top-1 is asked."""
    def chance_only(frozen_count, groups, chance, top1):
        frozen = frozen_count / groups
        return {"local_frozen_scorer_teacher_rate": frozen, "local_frozen_scorer_minus_chance": frozen - chance,
                "local_frozen_scorer_minus_top1": frozen - chance}

    monkeypatch.setattr(claim_metrics, "frozen_scorer_rates", chance_only)
    assert not frozen_top1_check()


def outside_reserved_check() -> bool:
    """Body unchanged (0) but a non-reserved row of lm_head moved by 0.25: C8b's metric is 0.25, not 0; both
    unchanged: 0; a lost measurement (NaN): NaN."""
    def metric(body: float, rows: float) -> float:
        result = SeedResult(0).add(slm_greedy_accuracy=0.5, local_entropy_accuracy=0.5, s2t_accuracy=0.5,
                                   takeover_accuracy=0.5, trigger_count=4.0, hit_at_1_count=2.0,
                                   local_frozen_body_max_change=body, local_frozen_rows_max_change_frozen_body=rows)
        return claim_metrics.claim_metrics(CONFIG.model_validate(smoke_section()), result)[
            "local_frozen_max_change_outside_reserved"]

    return (metric(0.0, 0.25) == 0.25 and metric(0.125, 0.0) == 0.125 and metric(0.0, 0.0) == 0.0
            and math.isnan(metric(0.0, math.nan)))


def test_c8b_metric_is_the_larger_of_body_and_rows_change():
    assert outside_reserved_check()


def test_negative_control_c8b_metric_on_the_body_only_fails(monkeypatch):
    """The metric before this fix: the body's change alone misses a moved non-reserved row."""
    monkeypatch.setattr(claim_metrics, "outside_reserved_change", lambda body, rows: body)
    assert not outside_reserved_check()
