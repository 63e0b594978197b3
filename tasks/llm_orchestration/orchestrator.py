"""The interaction layer of the cpu profile: executes control programs over the experts' text outputs, with
the text-centric memory, on the virtual clock of ``method.VirtualClock`` (Section 3.3 of the paper).

The experts are deterministic in evaluation mode, so their outputs are computed once per source in batches
(``ExpertTables``) and an *invocation* is a lookup that is counted and charged on the virtual clock; the wall
time of a call is the batch's wall time divided by its items. Baselines are switches: ``memory=False``
(every ``<MEM_READ>`` re-invokes the expert), sequential TTS (the reply as one chunk on one worker) and free
decoding (controller.decode_programs with ``constrained=False``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tasks.llm_orchestration import method
from tasks.llm_orchestration.config import ClockConfig, MemoryConfig
from tasks.llm_orchestration.method import ANSWER, MEM_READ, MEM_WRITE, TTS, VIDEO, VISION

TOPIC = {"image": "image objects", "video": "video motion"}
EXPERT_OF = {"image": "vision", "video": "video"}


@dataclass
class ExpertTables:
    """Each expert's text output per source id, and the source's content hash."""

    image_text: dict[str, str]
    video_text: dict[str, str]
    hashes: dict[str, str]


@dataclass
class SessionState:
    """What the layer tracks across a session's turns: the latest image and video, the memory, the counters."""

    memory: method.Memory | None
    latest: dict[str, str] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=lambda: {"vision": 0, "video": 0})
    reused: int = 0


@dataclass(frozen=True)
class TurnOutcome:
    answer: str
    latency_ms: float
    spent: dict[str, float]
    reply: str


def referenced_modality(question: str) -> str | None:
    """The modality a follow-up refers to: ``picture``/``image`` -> image, ``video`` -> video."""
    asked = set(method.words(question))
    if asked & {"picture", "image"}:
        return "image"
    if "video" in asked:
        return "video"
    return None


def reply_text(answer: str, modality: str | None) -> str:
    source = {"image": "picture", "video": "video"}.get(modality or "", "conversation")
    return f"The answer is {answer}. I looked at the {source} for you. Tell me if you need anything else."


def _invoke(modality: str, source: str, state: SessionState, tables: ExpertTables, clock: method.VirtualClock,
            cost: ClockConfig) -> str:
    state.calls[EXPERT_OF[modality]] += 1
    clock.charge(EXPERT_OF[modality], cost.vision_ms if modality == "image" else cost.video_ms)
    return (tables.image_text if modality == "image" else tables.video_text)[source]


def run_turn(program: list[str], question: str, turn: int, attached: dict[str, str], state: SessionState,
             tables: ExpertTables, cost: ClockConfig, memory_cfg: MemoryConfig, prompt_len: int, generated: int,
             spoken_words: int, parallel_tts: bool = True) -> TurnOutcome:
    """One turn: ASR (if spoken), the controller's decode, then the program's tokens in order.

    ``attached`` maps a modality to the source id attached this turn (it becomes the session's latest).
    An expert token with no source attached gathers no evidence (a routing error). ``<MEM_READ>`` retrieves
    the referenced modality's latest source from memory (reuse iff cosine >= tau); on a miss, or without
    memory, it invokes the expert; a miss's fresh output is recorded. ``<MEM_WRITE>`` records this turn's
    expert outputs. The answer is ``method.execute_answer`` over the evidence."""
    clock = method.VirtualClock()
    if spoken_words:
        clock.charge("asr", cost.asr_ms_per_word * spoken_words)
    clock.charge("controller",
                 cost.controller_ms_per_prompt_token * prompt_len + cost.controller_ms_per_token * generated)
    state.latest.update(attached)
    evidence: dict[str, str] = {}
    fresh: list[tuple[str, str]] = []
    answer, reply = method.UNKNOWN, ""
    for token in program:
        if token in (VISION, VIDEO):
            modality = "image" if token == VISION else "video"
            if modality in attached:
                evidence[modality] = _invoke(modality, attached[modality], state, tables, clock, cost)
                fresh.append((modality, attached[modality]))
        elif token == MEM_READ:
            modality = referenced_modality(question)
            if modality is None or modality not in state.latest:
                continue
            source = state.latest[modality]
            record = None
            if state.memory is not None:
                clock.charge("memory", cost.memory_ms)
                record = state.memory.retrieve(tables.hashes[source], TOPIC[modality])
            if record is not None:
                state.reused += 1
                evidence[modality] = record.summary
            else:
                evidence[modality] = _invoke(modality, source, state, tables, clock, cost)
                if state.memory is not None:
                    _write(state.memory, turn, modality, source, evidence[modality], tables, memory_cfg)
                    clock.charge("memory", cost.memory_ms)
        elif token == MEM_WRITE and state.memory is not None:
            for modality, source in fresh:
                _write(state.memory, turn, modality, source, evidence[modality], tables, memory_cfg)
            clock.charge("memory", cost.memory_ms)
        elif token == ANSWER:
            answer = method.execute_answer(question, evidence)
            reply = reply_text(answer, next(iter(evidence), None))
        elif token == TTS and reply:
            sentences = method.split_sentences(reply) if parallel_tts else [reply]
            workers = cost.tts_workers if parallel_tts else 1
            chunks = method.schedule_tts(sentences, clock.now, cost.tts_ms_per_char, cost.play_ms_per_char, workers,
                                         cost.tts_overhead_ms)
            clock.charge("tts_first_audio", method.time_to_first_audio(chunks, clock.now))
    return TurnOutcome(answer, clock.now, dict(clock.spent), reply)


def _write(memory: method.Memory, turn: int, modality: str, source: str, summary: str, tables: ExpertTables,
           memory_cfg: MemoryConfig) -> None:
    memory.write(method.make_record(turn, modality, tables.hashes[source], EXPERT_OF[modality], TOPIC[modality],
                                    summary, memory_cfg.bow_dim))
