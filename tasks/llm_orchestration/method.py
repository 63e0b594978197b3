"""Training-free LLM orchestration (Xie et al., ICML 2026, arXiv 2508.10016) as a pure library.

The paper's three components (abstract; Sections 3.1-3.3 of v3):

1. an LLM **controller** that emits explicit control tokens for expert selection, sequencing, speaking and
   memory, decoded under a protocol grammar so every routing decision is an inspectable token sequence;
2. a **text-centric cross-modal memory**: expert outputs become structured text records that later turns
   retrieve instead of re-invoking the expert ("memory-backed expert reuse");
3. an **interaction layer**: parallel sentence-level TTS with ordered playback (v1), full-duplex streaming
   and barge-in cancellation.

The paper gives neither the grammar, the record format, the retrieval rule nor the timing model; everything
below marked **[reconstructed]** is the project's reconstruction of those pieces:

- grammar (a finite automaton over control tokens)::

      [<ASR>] (<VISION:img> | <VIDEO:vid> | <MEM_READ>){0..max_evidence} [<MEM_WRITE>] <ANSWER> [<TTS>] <EOS>

  with ``<MEM_WRITE>`` legal only after an expert call (there is nothing new to write otherwise);
- record ``{turn, modality, source_hash, expert, topic, summary, bow_vector}``, ``bow_vector`` the hashed
  bag of words of the record's ``topic`` (stable ``hashlib`` hash, never Python's salted ``hash()``);
- retrieval: among records whose ``source_hash`` equals the referenced source, the one with the highest
  cos(a, b) = a.b / (|a| |b|) to the query's hashed bag of words, reused iff cos >= tau (inclusive);
- TTS on a virtual clock: a sentence of n characters costs ``ms_per_char * n`` to synthesise; sequential
  TTS synthesises the whole reply as one job (TTFA = c |text|), parallel TTS one job per sentence on W workers
  with ordered playback (TTFA = c |first sentence| + scheduling overhead);
- barge-in at time t cancels every synthesis job not finished and every chunk not yet started; the chunk that
  is playing stops at the next audio frame boundary, so audio ends by t + one frame.

Nothing here trains anything: the experts and the controller are separate models; the library only routes.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch

# --- control tokens and the protocol grammar (Section 3.1) ------------------------------------------------

ASR, VISION, VIDEO, MEM_READ = "<ASR>", "<VISION:img>", "<VIDEO:vid>", "<MEM_READ>"
MEM_WRITE, ANSWER, TTS, EOS = "<MEM_WRITE>", "<ANSWER>", "<TTS>", "<EOS>"
CONTROL_TOKENS = (ASR, VISION, VIDEO, MEM_READ, MEM_WRITE, ANSWER, TTS, EOS)
EXPERT_TOKENS = (VISION, VIDEO)
EVIDENCE_TOKENS = (VISION, VIDEO, MEM_READ)

# Automaton states: where the program is, and whether an expert has been called (MEM_WRITE needs one).
START, AFTER_ASR, EVIDENCE_MEMORY, EVIDENCE_EXPERT, WRITTEN, ANSWERED, SPOKEN, ACCEPTED = range(8)


@dataclass(frozen=True)
class GrammarState:
    """Automaton state plus the number of evidence tokens so far (bounded by ``max_evidence``)."""

    state: int = START
    evidence: int = 0


def allowed_next(state: GrammarState, max_evidence: int = 3) -> tuple[str, ...]:
    """The control tokens the grammar allows after ``state`` (empty once the program is accepted)."""
    evidence = EVIDENCE_TOKENS if state.evidence < max_evidence else ()
    if state.state == START:
        return (ASR, *evidence, ANSWER)
    if state.state in (AFTER_ASR, EVIDENCE_MEMORY):
        return (*evidence, ANSWER)
    if state.state == EVIDENCE_EXPERT:
        return (*evidence, MEM_WRITE, ANSWER)
    if state.state == WRITTEN:
        return (ANSWER,)
    if state.state == ANSWERED:
        return (TTS, EOS)
    if state.state == SPOKEN:
        return (EOS,)
    return ()


def advance(state: GrammarState, token: str, max_evidence: int = 3) -> GrammarState:
    """The state after ``token``; ``ValueError`` when the grammar does not allow it there."""
    if token not in allowed_next(state, max_evidence):
        raise ValueError(f"token {token} is not allowed in state {state}")
    if token == ASR:
        return GrammarState(AFTER_ASR, state.evidence)
    if token in EXPERT_TOKENS:
        return GrammarState(EVIDENCE_EXPERT, state.evidence + 1)
    if token == MEM_READ:
        kept = EVIDENCE_EXPERT if state.state == EVIDENCE_EXPERT else EVIDENCE_MEMORY
        return GrammarState(kept, state.evidence + 1)
    if token == MEM_WRITE:
        return GrammarState(WRITTEN, state.evidence)
    if token == ANSWER:
        return GrammarState(ANSWERED, state.evidence)
    if token == TTS:
        return GrammarState(SPOKEN, state.evidence)
    return GrammarState(ACCEPTED, state.evidence)


def accepts(program: Sequence[str], max_evidence: int = 3) -> bool:
    """True iff ``program`` is a complete legal control program (ends with ``<EOS>`` in the accepting state)."""
    state = GrammarState()
    for token in program:
        try:
            state = advance(state, token, max_evidence)
        except ValueError:
            return False
    return state.state == ACCEPTED


def grammar_mask(state: GrammarState, vocab: Mapping[str, int], vocab_size: int,
                 max_evidence: int = 3) -> torch.Tensor:
    """Boolean mask over the controller's vocabulary: True exactly at the ids of the allowed next tokens."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    for token in allowed_next(state, max_evidence):
        mask[vocab[token]] = True
    return mask


def masked_argmax(logits: torch.Tensor, mask: torch.Tensor) -> int:
    """argmax of ``logits`` over the ids where ``mask`` is True (constrained greedy decoding)."""
    if not bool(mask.any()):
        raise ValueError("the mask allows no token")
    return int(torch.where(mask, logits, torch.full_like(logits, -math.inf)).argmax())


def masked_sample(logits: torch.Tensor, mask: torch.Tensor, temperature: float, generator: torch.Generator) -> int:
    """One draw from softmax(logits / temperature) renormalised over the ids where ``mask`` is True (sampled
    decoding; an all-True mask is free sampling). Uses only ``generator``."""
    if not bool(mask.any()):
        raise ValueError("the mask allows no token")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    scaled = torch.where(mask, logits.double() / temperature, torch.full_like(logits, -math.inf, dtype=torch.double))
    return int(torch.multinomial(scaled.softmax(-1), 1, generator=generator))


# --- text-centric memory (Section 3.2) ----------------------------------------------------------------------

WORD = re.compile(r"[a-z0-9]+")


def words(text: str) -> list[str]:
    """Lower-case alphanumeric words of ``text`` (punctuation is a separator)."""
    return WORD.findall(text.lower())


def stable_bucket(word: str, dim: int) -> int:
    """Bucket of ``word`` in [0, dim): the first 8 bytes of its SHA-256, big-endian, modulo ``dim``."""
    return int.from_bytes(hashlib.sha256(word.encode("utf-8")).digest()[:8], "big") % dim


def hashed_bow(text: str, dim: int = 64) -> list[float]:
    """Hashed bag of words: entry b counts the words of ``text`` whose ``stable_bucket`` is b."""
    vector = [0.0] * dim
    for word in words(text):
        vector[stable_bucket(word, dim)] += 1.0
    return vector


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """cos(a, b) = a.b / (|a| |b|); 0 when either vector is zero."""
    if len(a) != len(b):
        raise ValueError(f"vectors of different lengths {len(a)} and {len(b)}")
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    if norm == 0.0:
        return 0.0
    return sum(x * y for x, y in zip(a, b, strict=True)) / norm


def source_hash(data: bytes) -> str:
    """SHA-256 of a source's bytes (an image, a video): the key that ties a record to what it describes."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class MemoryRecord:
    """One structured text record of an expert's output; ``to_json`` is what the controller's context sees."""

    turn: int
    modality: str
    source_hash: str
    expert: str
    topic: str
    summary: str
    bow_vector: tuple[float, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self) | {"bow_vector": list(self.bow_vector)}, sort_keys=True)


def make_record(turn: int, modality: str, source: str, expert: str, topic: str, summary: str,
                dim: int = 64) -> MemoryRecord:
    return MemoryRecord(turn, modality, source, expert, topic, summary, tuple(hashed_bow(topic, dim)))


@dataclass
class Memory:
    """Session memory: records in write order; ``retrieve`` implements memory-backed expert reuse."""

    tau: float = 0.6
    dim: int = 64
    records: list[MemoryRecord] = field(default_factory=list)

    def write(self, record: MemoryRecord) -> None:
        self.records.append(record)

    def retrieve(self, source: str, query: str) -> MemoryRecord | None:
        """The best record about ``source`` if its cosine to ``query``'s hashed BoW is >= tau, else None.

        Only records with the same ``source_hash`` are candidates: a perfect text match about another
        image is never reused. Ties go to the most recent record."""
        query_vector = hashed_bow(query, self.dim)
        best, best_cos = None, -1.0
        for record in self.records:
            if record.source_hash != source:
                continue
            cos = cosine(query_vector, record.bow_vector)
            if cos >= best_cos:
                best, best_cos = record, cos
        return best if best is not None and best_cos >= self.tau else None


# --- executor: answers from the experts' text (Section 3.3) -------------------------------------------------

COLOURS = ("red", "green", "blue")
SHAPES = ("circle", "square", "triangle")
DIRECTIONS = ("left", "right", "up", "down")
COUNT_WORDS = ("many", "count", "number")
DIRECTION_WORDS = ("way", "direction", "moving", "heading")
UNKNOWN = "unknown"


def parse_objects(summary: str) -> list[tuple[str, str]]:
    """``"objects: red circle; blue square"`` -> [("red", "circle"), ("blue", "square")]."""
    _, _, body = summary.partition(":")
    found = []
    for part in body.split(";"):
        tokens = words(part)
        colour = next((t for t in tokens if t in COLOURS), None)
        shape = next((t for t in tokens if t in SHAPES), None)
        if colour and shape:
            found.append((colour, shape))
    return found


def count_answer(question: str, summary: str) -> str:
    """Number of objects in ``summary`` matching every colour and shape word the question names."""
    asked = words(question)
    colours = [w for w in asked if w in COLOURS]
    shapes = [w.rstrip("s") for w in asked if w.rstrip("s") in SHAPES]
    n = sum(1 for colour, shape in parse_objects(summary)
            if all(c == colour for c in colours) and all(s == shape for s in shapes))
    return str(n)


def direction_answer(summary: str) -> str:
    """The direction word of a motion summary such as ``"red circle moving left"``."""
    return next((w for w in words(summary) if w in DIRECTIONS), UNKNOWN)


def question_kind(question: str) -> str:
    """``count``, ``direction`` or ``chat``, from the question's words."""
    asked = set(words(question))
    if asked & set(COUNT_WORDS):
        return "count"
    if asked & set(DIRECTION_WORDS):
        return "direction"
    return "chat"


def execute_answer(question: str, evidence: Mapping[str, str]) -> str:
    """The answer from the text evidence gathered by the program (``evidence[modality] = summary``).

    A count needs image evidence and a direction video evidence; without it the answer is ``unknown``."""
    kind = question_kind(question)
    if kind == "count":
        return count_answer(question, evidence["image"]) if "image" in evidence else UNKNOWN
    if kind == "direction":
        return direction_answer(evidence["video"]) if "video" in evidence else UNKNOWN
    return "hello"


# --- interaction layer on a virtual clock (Section 3.3) ------------------------------------------------------

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def split_sentences(text: str) -> list[str]:
    """Sentences of ``text`` split after ``.``, ``!`` or ``?`` followed by white space."""
    return [s for s in SENTENCE_END.split(text.strip()) if s]


@dataclass(frozen=True)
class Chunk:
    """One synthesised chunk on the virtual clock (milliseconds)."""

    index: int
    text: str
    synth_start: float
    synth_end: float
    play_start: float
    play_end: float


def schedule_tts(sentences: Sequence[str], start: float, ms_per_char: float, play_ms_per_char: float,
                 workers: int, overhead_ms: float = 0.0) -> list[Chunk]:
    """Synthesis of each chunk on the first free of ``workers`` (in chunk order), playback in chunk order.

    Chunk i's synthesis starts at max(start + overhead, first worker free) and lasts ms_per_char * |s_i|;
    its playback starts at max(its synthesis end, previous chunk's playback end) and lasts
    play_ms_per_char * |s_i|. ``sentences=[whole reply]`` with ``workers=1`` is sequential TTS."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    free = [start + overhead_ms] * workers
    chunks, last_play_end = [], -math.inf
    for index, sentence in enumerate(sentences):
        worker = min(range(workers), key=lambda w: (free[w], w))
        synth_start = free[worker]
        synth_end = synth_start + ms_per_char * len(sentence)
        free[worker] = synth_end
        play_start = max(synth_end, last_play_end)
        last_play_end = play_start + play_ms_per_char * len(sentence)
        chunks.append(Chunk(index, sentence, synth_start, synth_end, play_start, last_play_end))
    return chunks


def time_to_first_audio(chunks: Sequence[Chunk], start: float) -> float:
    """TTFA: playback start of the first chunk minus the time the reply was ready to speak."""
    return chunks[0].play_start - start


@dataclass(frozen=True)
class BargeIn:
    """What a barge-in at ``t`` leaves: chunks whose playback started, jobs cancelled, when audio stopped."""

    emitted: tuple[Chunk, ...]
    cancelled: tuple[int, ...]
    audio_end: float


def barge_in(chunks: Sequence[Chunk], t: float, frame_ms: float) -> BargeIn:
    """Cancel at ``t``: chunks whose playback had not started are cancelled (their synthesis too, finished or
    not); the chunk playing at ``t`` stops at the next frame boundary of its playback (at most ``frame_ms``)."""
    emitted = tuple(c for c in chunks if c.play_start < t)
    cancelled = tuple(c.index for c in chunks if c.play_start >= t)
    audio_end = max((c.play_end for c in emitted), default=t)
    playing = [c for c in emitted if c.play_end > t]
    if playing:
        c = playing[0]
        frames = math.ceil((t - c.play_start) / frame_ms)
        audio_end = min(c.play_end, c.play_start + frames * frame_ms)
    return BargeIn(emitted, cancelled, audio_end)


@dataclass
class VirtualClock:
    """Deterministic clock of the interaction layer: time moves only when a component charges its cost, and
    the time spent is booked per component (``spent``), so overhead shares are exact."""

    now: float = 0.0
    spent: dict[str, float] = field(default_factory=dict)

    def charge(self, component: str, ms: float) -> float:
        if ms < 0:
            raise ValueError(f"negative cost {ms} for {component}")
        self.now += ms
        self.spent[component] = self.spent.get(component, 0.0) + ms
        return self.now


# --- training-free integration (Section 3, "no gradient-based training") -----------------------------------


def parameter_hash(module: torch.nn.Module) -> str:
    """SHA-256 over every parameter and buffer (name, shape, dtype, bytes), in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(str(tuple(t.shape)).encode())
        digest.update(str(t.dtype).encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()
