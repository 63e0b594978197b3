"""CoViP's verifiable caption reward, its diagnostics and caption-augmented generation, as a pure library.

Captions are sequences of words. A personalized caption lists, per recognised concept, a fact triple
``NAME PLACE EVENT ;`` (names start with ``n``, places with ``p``, events with ``e``; ``;`` ends a
sentence). The paper's pieces implemented here (section numbers of arXiv 2602.03454 are not available to
the project; sources are the abstract and the official code, oyt9306/CoViP, ``vlm_modules/qwen_module.py``):

- the vision-free judge (``judge_answer``): answers a multiple-choice QA (options A/B/C plus
  D = "cannot be determined") from the caption alone. The paper's judge is an LLM; this one is a
  deterministic parser (a project design: exactly verifiable, stricter than an LLM).
- the caption reward (``caption_reward``, official ``yes_no_reward_caps``):
  r = r_pos + r_neg, r_pos = sum over present-concept QAs of (1/3) 1[judge = answer],
  r_neg = -(1/|neg|) sum over absent-concept QAs of 1[judge != D]; r = -1 when the caption repeats
  heavily (``has_heavy_repetition``, official ``has_heavy_repetition``) or is longer than the limit.
- the set-recognition reward (``set_f1``, official ``yes_no_reward_multi_vis``).
- the diagnostic CapEval accuracies (``capeval_counts``): GT-concept QAs and noisy (absent-concept) QAs.
- caption-augmented generation (``cag_answer``) scored by token-set F1 (``token_set_f1``), and the
  binding-swap diagnostic (``binding_follow_counts``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

SEPARATOR = ";"
CANNOT_DETERMINE = "D"
LETTERS = ("A", "B", "C")
FIELDS = ("name", "place", "event")
FIELD_PREFIX = {"name": "n", "place": "p", "event": "e"}
Field = Literal["name", "place", "event"]


@dataclass(frozen=True)
class Triple:
    """One caption sentence's facts; a field the sentence does not state is None."""

    name: str | None
    place: str | None
    event: str | None

    def get(self, field: str) -> str | None:
        return getattr(self, field)


@dataclass(frozen=True)
class QA:
    """A multiple-choice question about one context concept: find the caption sentence whose ``key_field``
    equals ``key`` and read its ``target_field``. ``options`` are A, B, C; ``answer`` is a letter or D."""

    key_field: Field
    key: str
    target_field: Field
    options: tuple[str, str, str]
    answer: str
    concept: int


@dataclass(frozen=True)
class RewardBreakdown:
    """r = r_pos + r_neg unless a penalty applies (then r = -1 and ``penalised`` is True)."""

    r_pos: float
    r_neg: float
    total: float
    penalised: bool


def field_of(word: str) -> str | None:
    """The fact field a word belongs to by its prefix, or None (separators, other words)."""
    for field, prefix in FIELD_PREFIX.items():
        if word.startswith(prefix) and word[len(prefix):].isdigit():
            return field
    return None


def parse_triples(words: Sequence[str]) -> list[Triple]:
    """Split the caption at ``;`` and keep, per sentence, the first word of each field (None if absent).

    Sentences with no fact word at all are dropped."""
    sentences: list[list[str]] = [[]]
    for word in words:
        if word == SEPARATOR:
            sentences.append([])
        else:
            sentences[-1].append(word)
    triples = []
    for sentence in sentences:
        first: dict[str, str] = {}
        for word in sentence:
            field = field_of(word)
            if field is not None and field not in first:
                first[field] = word
        if first:
            triples.append(Triple(first.get("name"), first.get("place"), first.get("event")))
    return triples


def judge_answer(words: Sequence[str], qa: QA) -> str:
    """The vision-free judge: the first sentence whose ``key_field`` is ``qa.key`` gives the value of
    ``qa.target_field``; the option letter holding that value, else D (the key or value is not stated,
    or the stated value is none of the options)."""
    for triple in parse_triples(words):
        if triple.get(qa.key_field) == qa.key:
            value = triple.get(qa.target_field)
            if value in qa.options:
                return LETTERS[qa.options.index(value)]
            return CANNOT_DETERMINE
    return CANNOT_DETERMINE


def _sentences(words: Sequence[str]) -> list[str]:
    text, current = [], []
    for word in words:
        if word in (SEPARATOR, ".", "!", "?"):
            if current:
                text.append(" ".join(current))
            current = []
        else:
            current.append(word.lower())
    if current:
        text.append(" ".join(current))
    return text


def has_heavy_repetition(words: Sequence[str], *, min_sentences: int = 4, sent_dup_ratio: float = 0.3,
                         ngram_n: int = 5, ngram_dup_ratio: float = 0.3, chunk_sizes: Iterable[int] = (10, 20, 30),
                         chunk_dup_ratio: float = 0.2) -> bool:
    """Port of the official ``has_heavy_repetition`` (defaults = the official values; ``min_sentences``
    and ``ngram_n`` are parameters so that toy captions of a few words can trip it):

    1. sentences (split at ``;``/``.``/``!``/``?``): with >= ``min_sentences`` of them, repeated when
       (total - unique) / total >= ``sent_dup_ratio``;
    2. word n-grams: with >= 4 n words, repeated when (total - unique) / total >= ``ngram_dup_ratio``;
    3. chunks of ``size`` words (for each size with >= 2 size words): the occurrences of chunks seen more
       than once, over all chunks, >= ``chunk_dup_ratio``.
    """
    sentences = _sentences(words)
    if len(sentences) >= min_sentences and (len(sentences) - len(set(sentences))) / len(sentences) >= sent_dup_ratio:
        return True
    plain = [w.lower() for w in words if w not in (SEPARATOR, ".", "!", "?")]
    if len(plain) >= ngram_n * 4:
        grams = [tuple(plain[i:i + ngram_n]) for i in range(len(plain) - ngram_n + 1)]
        if (len(grams) - len(set(grams))) / len(grams) >= ngram_dup_ratio:
            return True
    for size in chunk_sizes:
        if len(plain) < size * 2:
            continue
        chunks = Counter(tuple(plain[i:i + size]) for i in range(len(plain) - size + 1))
        repeated = sum(count for count in chunks.values() if count > 1)
        if repeated / sum(chunks.values()) >= chunk_dup_ratio:
            return True
    return False


def positive_from_letters(letters: Sequence[str], answers: Sequence[str]) -> float:
    """r_pos = sum over present-concept QAs of (1/3) 1[judged letter = answer] (official ``vr_pos``)."""
    return sum(1 / 3 for letter, answer in zip(letters, answers, strict=True) if letter == answer)


def negative_from_letters(letters: Sequence[str]) -> float:
    """r_neg = -(1/|neg|) sum over absent-concept QAs of 1[judged letter != D] (official ``vr_neg``), in [-1, 0];
    0 when there are no absent-concept QAs."""
    if not letters:
        return 0.0
    return -sum(1 for letter in letters if letter != CANNOT_DETERMINE) / len(letters)


def positive_reward(words: Sequence[str], present_qas: Sequence[QA]) -> float:
    """r_pos of a caption under the deterministic judge (maximum: number of present concepts)."""
    return positive_from_letters([judge_answer(words, qa) for qa in present_qas], [qa.answer for qa in present_qas])


def negative_reward(words: Sequence[str], absent_qas: Sequence[QA]) -> float:
    """r_neg of a caption under the deterministic judge."""
    return negative_from_letters([judge_answer(words, qa) for qa in absent_qas])


def caption_reward(words: Sequence[str], present_qas: Sequence[QA], absent_qas: Sequence[QA], *,
                   length_limit: int = 511, min_sentences: int = 4, ngram_n: int = 5) -> RewardBreakdown:
    """The caption reward of ``yes_no_reward_caps``: -1 for heavy repetition or more than ``length_limit``
    words (tokens), else r_pos + r_neg."""
    r_pos, r_neg = positive_reward(words, present_qas), negative_reward(words, absent_qas)
    penalised = has_heavy_repetition(words, min_sentences=min_sentences, ngram_n=ngram_n) or len(words) > length_limit
    return RewardBreakdown(r_pos, r_neg, -1.0 if penalised else r_pos + r_neg, penalised)


def set_f1(predicted: Iterable[int], true: Iterable[int]) -> float:
    """F1 of predicted against true index sets (official ``yes_no_reward_multi_vis``): precision and recall
    are 0 when their denominator is 0, and F1 = 0 when both are 0."""
    pred, gold = set(predicted), set(true)
    tp = len(pred & gold)
    precision = tp / len(pred) if pred else 0.0
    recall = tp / len(gold) if gold else 0.0
    return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0


def token_set_f1(predicted: Iterable[str], gold: Iterable[str]) -> float:
    """Token-set F1 of a downstream answer: |P & G| over |P| and |G| (0 when either set is empty)."""
    pred, ref = set(predicted), set(gold)
    common = len(pred & ref)
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class CapEvalCounts:
    """Correct answers and totals of the diagnostic QAs: present-concept (GT) and absent-concept (noisy)."""

    gt_correct: int
    gt_total: int
    noisy_correct: int
    noisy_total: int


def capeval_counts(words: Sequence[str], present_qas: Sequence[QA], absent_qas: Sequence[QA]) -> CapEvalCounts:
    """GT QAs are correct when the judge's letter is the answer; noisy QAs when it is D."""
    gt = sum(judge_answer(words, qa) == qa.answer for qa in present_qas)
    noisy = sum(judge_answer(words, qa) == CANNOT_DETERMINE for qa in absent_qas)
    return CapEvalCounts(gt, len(present_qas), noisy, len(absent_qas))


DownstreamTask = Literal["last_seen", "last_action"]
DOWNSTREAM_FIELD: dict[str, Field] = {"last_seen": "place", "last_action": "event"}


def cag_answer(caption: Sequence[str], task: DownstreamTask) -> list[str]:
    """Caption-augmented generation with a fixed text-only extractor: the answer to "who is in the query
    image, and where were they last seen (``last_seen``) / what did they last do (``last_action``)?" is
    the name and the task's field of every sentence of the caption."""
    field = DOWNSTREAM_FIELD[task]
    answer = []
    for triple in parse_triples(caption):
        answer += [value for value in (triple.name, triple.get(field)) if value is not None]
    return answer


def binding_follow_counts(caption: Sequence[str], new_facts: Iterable[str],
                          old_facts: Iterable[str]) -> tuple[int, int]:
    """Binding-swap diagnostic: how many fact words of the caption belong to the dialogues now paired with
    the query's images (``new_facts``) and how many to the dialogues they were paired with before
    (``old_facts``). Words in both sets count for neither."""
    new, old = set(new_facts), set(old_facts)
    words = [w for w in caption if field_of(w) is not None]
    return sum(w in new and w not in old for w in words), sum(w in old and w not in new for w in words)


def mean_or_nan(values: Sequence[float]) -> float:
    """Arithmetic mean; NaN for an empty sequence."""
    return sum(values) / len(values) if values else math.nan
