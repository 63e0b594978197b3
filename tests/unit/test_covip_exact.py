"""covip: exact values of the caption reward, the judge, set-F1, CAG F1 and the GRPO advantages, each with a
negative control that breaks the library (monkeypatch) and shows the same check fails."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.common import rl
from tasks.covip import method
from tasks.covip.data import BLANK, DISTRACTOR, Episode, qas

LIMIT = 17


def episode() -> Episode:
    """K = 4, present {c0, c1} (cells 0 and 1), absent {c2, c3}; every fact distinct."""
    return Episode(identities=(0, 30, 60, 90), names=(0, 1, 2, 3), places=(0, 1, 2, 3), events=(0, 1, 2, 3),
                   cells=(0, 1, DISTRACTOR, BLANK), distractor=120, render_seed=0, option_seed=5)


def reward(words: list[str]) -> method.RewardBreakdown:
    present, absent = qas(episode())
    return method.caption_reward(words, present, absent, length_limit=LIMIT, min_sentences=2, ngram_n=3)


CORRECT = "n0 p0 e0 ; n1 p1 e1 ;".split()
RECITE = "n0 p0 e0 ; n1 p1 e1 ; n2 p2 e2 ; n3 p3 e3 ;".split()


def reward_vector() -> list[float]:
    return [reward(CORRECT).total, reward(RECITE).total, reward([]).total, reward("n0 p0 e0 ;".split()).total,
            reward("n0 p9 e0 ;".split()).total, reward([*CORRECT, *"n2 p2 e2 ;".split()]).total]


def test_reward_exact_vectors():
    """Acceptance (a)1: 2, 1 (r_pos 2, r_neg -1), 0, 1, 1/3 (Q1 -> D, Q2 -> D, Q3 right), 2 - 3/6."""
    assert reward_vector() == pytest.approx([2.0, 1.0, 0.0, 1.0, 1 / 3, 1.5], abs=1e-12)
    assert (reward(RECITE).r_pos, reward(RECITE).r_neg) == pytest.approx((2.0, -1.0))
    assert not reward(RECITE).penalised


def test_penalties_are_minus_one_regardless_of_content():
    twice = reward([*CORRECT, *CORRECT])
    assert twice.penalised and twice.total == -1.0 and twice.r_pos == pytest.approx(2.0)
    long = [*CORRECT, *(f"e{i}" for i in range(10, 20))]  # 18 distinct-enough words > 17
    assert len(long) > LIMIT and reward(long).total == -1.0
    at_limit = [*RECITE, "n9"]  # 17 words, no repetition: not penalised
    assert len(at_limit) == LIMIT and not reward(at_limit).penalised


def test_negative_control_flipped_r_neg_sign_lets_recite_all_win(monkeypatch):
    """Acceptance (a)3: with r_neg's sign flipped, recite-all (3.0) out-scores the correct caption (2.0)."""
    assert reward(CORRECT).total > reward(RECITE).total
    original = method.negative_reward
    monkeypatch.setattr(method, "negative_reward", lambda words, absent: -original(words, absent))
    assert reward(RECITE).total == pytest.approx(3.0)
    assert not reward(CORRECT).total > reward(RECITE).total


def test_negative_control_dropped_penalty_is_caught(monkeypatch):
    monkeypatch.setattr(method, "has_heavy_repetition", lambda words, **kw: False)
    assert reward([*CORRECT, *CORRECT]).total != -1.0


def test_official_repetition_rules():
    """Sentence rule at the official threshold (4 sentences, 30% duplicates), n-gram and chunk rules."""
    four = "a b . c d . a b . e f .".split()  # 4 sentences, 1 duplicate: 0.25 < 0.3
    assert not method.has_heavy_repetition(four, ngram_n=5)
    five = "a b . c d . a b . e f . a b .".split()  # 5 sentences, 2 duplicates: 0.4
    assert method.has_heavy_repetition(five)
    words = [f"w{i}" for i in range(15)]
    # 20 words, 16 five-grams, one duplicate (w0..w4 again): 1/16 < 0.3
    assert not method.has_heavy_repetition(words + words[:5], min_sentences=100, chunk_sizes=())
    block = [f"w{i}" for i in range(10)]
    # block twice: grams i and i + 10 agree for i <= 5: 6 duplicates of 16 = 0.375 >= 0.3
    assert method.has_heavy_repetition(block * 2, min_sentences=100, chunk_sizes=())
    # chunk rule alone (n-gram rule off): block twice = 11 chunks of 10, one seen twice: 2/11 < 0.2;
    # block three times = 21 chunks, all repeated: 21/21
    assert not method.has_heavy_repetition(block * 2, min_sentences=100, ngram_n=50)
    assert method.has_heavy_repetition(block * 3, min_sentences=100, ngram_n=50)


def test_set_f1_exact():
    """Acceptance (a)4."""
    assert method.set_f1({0, 3}, {0, 1}) == 0.5
    assert method.set_f1(set(), {0}) == 0.0
    assert method.set_f1({0, 1}, {1, 0}) == 1.0
    assert method.set_f1({0, 1, 2}, {0}) == pytest.approx(0.5)  # P 1/3, R 1


def test_token_set_f1_exact():
    assert method.token_set_f1(["a", "b", "c"], ["a", "d"]) == pytest.approx(2 * (1 / 3) * 0.5 / (1 / 3 + 0.5))
    assert method.token_set_f1([], ["a"]) == 0.0
    assert method.token_set_f1(["a", "a"], ["a"]) == 1.0


def test_judge_parser():
    """Acceptance (a)5: absent NAME or PLACE keys give D; on 'N1 P1 E1 ; N2 P2 E2 ;' Q2 for N2 gives P2's letter."""
    qa_name = method.QA("name", "n2", "place", ("p5", "p2", "p1"), "B", 2)
    assert method.judge_answer("n1 p1 e1 ; n2 p2 e2 ;".split(), qa_name) == "B"
    assert method.judge_answer("n1 p1 e1 ;".split(), qa_name) == "D"
    qa_place = method.QA("place", "p7", "name", ("n1", "n2", "n3"), "A", 1)
    assert method.judge_answer("n1 p1 e1 ; n2 p2 e2 ;".split(), qa_place) == "D"
    assert method.judge_answer("n3 p7 ;".split(), qa_place) == "C"
    # first matching sentence wins; a value outside the options is D
    assert method.judge_answer("n2 p1 ; n2 p2 ;".split(), qa_name) == "C"
    assert method.judge_answer("n2 p9 ;".split(), qa_name) == "D"


def test_parse_triples_keeps_first_word_per_field():
    assert method.parse_triples("n1 n2 p3 ; ; e4 ;".split()) == [method.Triple("n1", "p3", None),
                                                                   method.Triple(None, None, "e4")]
    assert method.field_of("p12") == "place" and method.field_of("px") is None and method.field_of(";") is None


def test_cag_and_binding_follow_exact():
    caption = "n1 p1 e1 ; n2 e2 ;".split()
    assert method.cag_answer(caption, "last_seen") == ["n1", "p1", "n2"]
    assert method.cag_answer(caption, "last_action") == ["n1", "e1", "n2", "e2"]
    assert method.binding_follow_counts("n1 p1 e1 ; n2 p2 ;".split(), ["n1", "p1", "e1"], ["n2", "p2", "e1"]) == (2, 2)


def test_capeval_counts_exact():
    present, absent = qas(episode())
    counts = method.capeval_counts([*CORRECT, *"n2 p2 e2 ;".split()], present, absent)
    assert counts == method.CapEvalCounts(6, 6, 3, 6)


def advantages_are_pinned() -> bool:
    """Acceptance (a)6: equal rewards -> zeros; [1, 0, 0, 1], unbiased std, eps 1e-4 -> +-0.5/(0.57735+1e-4)."""
    zeros = torch.equal(rl.group_advantages(torch.tensor([0.5, 0.5, 0.5, 0.5]), 4, eps=1e-4), torch.zeros(4))
    adv = rl.group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, eps=1e-4)
    value = 0.5 / (3 ** -0.5 + 1e-4)
    return zeros and torch.allclose(adv, torch.tensor([value, -value, -value, value]), atol=1e-6)


def test_grpo_advantages_pinned():
    assert 0.5 / (3 ** -0.5 + 1e-4) == pytest.approx(0.8659, abs=1e-4)
    assert advantages_are_pinned()


def test_negative_control_population_std_breaks_the_pinned_advantages(monkeypatch):
    """The biased std (divisor G, 0.5 here) gives +-0.9998 instead of +-0.8659: the pinned check must fail."""
    def biased(rewards, group_size, *, scale="std", eps=1e-6):
        grouped = rewards.reshape(-1, group_size).float()
        centred = grouped - grouped.mean(dim=1, keepdim=True)
        return (centred / (grouped.std(dim=1, unbiased=False, keepdim=True) + eps)).reshape(-1)
    monkeypatch.setattr(rl, "group_advantages", biased)
    assert not advantages_are_pinned()


def test_caption_reward_passes_its_repetition_thresholds():
    """min_sentences and ngram_n reach the repetition check: a one-concept caption written twice (2 sentences)
    is penalised at min_sentences 2 but not at the official 4; 12 words of a repeated trigram (7 of 10 trigrams
    duplicated) are penalised at ngram_n 3 and not at the official 5 (fewer than 20 words)."""
    twice = "n0 p0 e0 ; n0 p0 e0 ;".split()
    assert method.caption_reward(twice, [], [], length_limit=50, min_sentences=2, ngram_n=50).penalised
    assert not method.caption_reward(twice, [], [], length_limit=50, min_sentences=4, ngram_n=50).penalised
    trigram = "n0 p0 e0 " * 4
    assert method.caption_reward(trigram.split(), [], [], length_limit=50, min_sentences=100, ngram_n=3).total == -1.0
    assert method.caption_reward(trigram.split(), [], [], length_limit=50, min_sentences=100, ngram_n=5).total == 0.0


def test_sentence_markers_are_not_counted_as_words():
    """11 words + '.': below the 4 x 3 = 12 words the trigram rule needs, so no repetition is found; counting
    the '.' as a word would reach 12 words with 6 of 10 trigrams duplicated."""
    words = "a b c a b c a b c a b .".split()
    assert not method.has_heavy_repetition(words, min_sentences=100, ngram_n=3)
    assert method.has_heavy_repetition([*words[:-1], "z"], min_sentences=100, ngram_n=3)


def test_letters_formula_and_empty_sets():
    assert method.negative_from_letters([]) == 0.0
    assert method.negative_from_letters(["D", "A", "D", "C"]) == -0.5
    assert method.positive_from_letters(["A", "B", "D"], ["A", "C", "D"]) == pytest.approx(2 / 3)
    assert method.caption_reward("n0 p0 e0 ;".split(), [], [], length_limit=17, min_sentences=2, ngram_n=3).total == 0.0
    assert method.mean_or_nan([1.0, 2.0, 6.0]) == 3.0 and math.isnan(method.mean_or_nan([]))


def test_repetition_thresholds_are_inclusive_and_defaults_are_official():
    """Exact thresholds (>= 0.3 sentences, >= 0.3 n-grams, >= 0.2 chunks) and the official defaults
    (511 tokens, 4 sentences, 5-grams), each on an input that sits on the boundary."""
    # 10 sentences, 3 duplicates: exactly 0.3
    assert method.has_heavy_repetition("a . a . a . a . b . c . d . e . f . g .".split(), ngram_n=50, chunk_sizes=())
    # 10 trigrams, 3 duplicates: exactly 0.3
    assert method.has_heavy_repetition("a b c a b c a b d e f g".split(), min_sentences=100, ngram_n=3, chunk_sizes=())
    # 10 chunks of 3, 2 positions repeated: exactly 0.2
    assert method.has_heavy_repetition("a b c d e f g a b c h i".split(), min_sentences=100, ngram_n=50,
                                       chunk_sizes=(3,))
    # exactly 2 x size words: the chunk rule applies (abc, bca, cab, abc: 2 of 4 repeated)
    assert method.has_heavy_repetition("a b c a b c".split(), min_sentences=100, ngram_n=50, chunk_sizes=(3,))
    # a size too long for the text is skipped, the next size still checked
    assert method.has_heavy_repetition("a b c a b c".split(), min_sentences=100, ngram_n=50, chunk_sizes=(50, 3))
    # defaults: 4 sentences with 2 duplicates -> repeated; a 9-word segment twice + 2 words -> 5 of 16 five-grams
    four = "a . a . a . b .".split()
    assert method.has_heavy_repetition(four) and method.caption_reward(four, [], []).penalised
    nine = [f"w{i}" for i in range(9)]
    assert method.has_heavy_repetition([*nine, *nine, "x", "y"], min_sentences=100, chunk_sizes=())
    assert method.caption_reward([*nine, *nine, "x", "y"], [], []).penalised
    distinct = [f"w{i}" for i in range(512)]
    assert method.caption_reward(distinct, [], []).penalised
    assert not method.caption_reward(distinct[:511], [], []).penalised


def test_other_sentence_marks_split_sentences_and_are_not_words():
    assert method.has_heavy_repetition("a ! b ? a".split(), min_sentences=2, ngram_n=50, chunk_sizes=())
    assert not method.has_heavy_repetition("a ! b ? c".split(), min_sentences=2, ngram_n=50, chunk_sizes=())
    for mark in ("!", "?"):
        words = f"a b c a b c a b c a b {mark}".split()
        assert not method.has_heavy_repetition(words, min_sentences=100, ngram_n=3)


def test_set_f1_with_empty_gold_and_letter_length_mismatch():
    assert method.set_f1({0}, set()) == 0.0 and method.set_f1(set(), set()) == 0.0
    with pytest.raises(ValueError):
        method.positive_from_letters(["A", "B"], ["A"])


def test_ngram_rule_counts_only_full_ngrams():
    """12 words, 10 trigrams, 2 duplicates (0.2 < 0.3): not repeated; counting padded or empty n-grams past the
    end would add duplicates and cross 0.3."""
    assert not method.has_heavy_repetition("a b c a b c a e f g h i".split(), min_sentences=100, ngram_n=3,
                                           chunk_sizes=())


def check_repetition_compares_lowercased_sentence_text() -> None:
    """The official rule compares the caption's lower-cased text. str.lower() keeps 'ß' apart from 'ss' and 'ς'
    apart from 'σ' (upper() would merge them into 'SS' and 'Σ'), in both the sentence and the n-gram rule; and a
    sentence is its words joined by one space, so the same text tokenised differently ('a b' + 'c' against
    'a' + 'b c', one sentence closed by ';', the other at the end) is a repeated sentence."""
    # sentence rule: 2 sentences, distinct after lower() (0 duplicates), equal after upper() (1 of 2)
    assert not method.has_heavy_repetition(["ß", ";", "ss"], min_sentences=2, ngram_n=50, chunk_sizes=())
    assert method.has_heavy_repetition(["Ab", ";", "aB"], min_sentences=2, ngram_n=50, chunk_sizes=())
    # 1-gram rule: 4 words, 4 distinct after lower(); 'A a B b' has 2 duplicates of 4 after lower()
    assert not method.has_heavy_repetition(["ß", "ss", "ς", "σ"], min_sentences=100, ngram_n=1, chunk_sizes=())
    assert method.has_heavy_repetition(["A", "a", "B", "b"], min_sentences=100, ngram_n=1, chunk_sizes=())
    # the same text "a b c" twice, split into words differently: 1 duplicate of 2 sentences
    assert method.has_heavy_repetition(["a b", "c", ";", "a", "b c"], min_sentences=2, ngram_n=50, chunk_sizes=())


def test_repetition_compares_lowercased_sentence_text():
    check_repetition_compares_lowercased_sentence_text()


def test_negative_control_upper_case_folding_is_caught(monkeypatch):
    original = method.has_heavy_repetition
    # upper() first: 'ß' -> 'SS' -> (lower) 'ss' merges with 'ss', as folding with upper() would
    monkeypatch.setattr(method, "has_heavy_repetition", lambda words, **kw: original([w.upper() for w in words], **kw))
    with pytest.raises(AssertionError):
        check_repetition_compares_lowercased_sentence_text()


def test_negative_control_sentences_as_word_tuples_are_caught(monkeypatch):
    """Comparing sentences as word lists (here joined by '|', which no word holds) misses the re-tokenised repeat."""
    def sentences_of_words(words):
        text, current = [], []
        for word in [*words, ";"]:
            if word in (method.SEPARATOR, ".", "!", "?"):
                if current:
                    text.append("|".join(current))
                current = []
            else:
                current.append(word.lower())
        return text

    monkeypatch.setattr(method, "_sentences", sentences_of_words)
    with pytest.raises(AssertionError):
        check_repetition_compares_lowercased_sentence_text()
