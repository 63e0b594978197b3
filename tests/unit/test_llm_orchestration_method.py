"""llm_orchestration library: exact values on hand-computed inputs, identities, and negative controls that break the
library through monkeypatch and show the same check fails (docs/testing.md)."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.common.tiny_lm import build_tiny_gpt2, tiny_gpt2_config
from tasks.llm_orchestration import baselines, claim_metrics, controller, experts, method, orchestrator
from tasks.llm_orchestration.config import ClockConfig, MemoryConfig
from tasks.llm_orchestration.method import ANSWER, ASR, EOS, MEM_READ, MEM_WRITE, TTS, VIDEO, VISION, GrammarState
from tasks.llm_orchestration.train import controller_vocab

# --- grammar -----------------------------------------------------------------------------------------------


def grammar_checks() -> bool:
    """Acceptance check (a)1: the two legal programs pass, the three illegal ones fail, and after <ANSWER>
    only <TTS> and <EOS> are allowed."""
    ok = method.accepts([ASR, VISION, MEM_WRITE, ANSWER, TTS, EOS]) and method.accepts([MEM_READ, ANSWER, EOS])
    ok &= not method.accepts([])
    ok &= not method.accepts([ANSWER, VISION, EOS])
    ok &= not method.accepts([VISION, MEM_WRITE, EOS])
    ok &= set(method.allowed_next(GrammarState(method.ANSWERED))) == {TTS, EOS}
    return ok


def test_grammar_accepts_and_rejects_the_acceptance_programs():
    assert grammar_checks()


def test_grammar_exact_transitions():
    assert method.allowed_next(GrammarState()) == (ASR, VISION, VIDEO, MEM_READ, ANSWER)
    assert method.allowed_next(GrammarState(method.AFTER_ASR)) == (VISION, VIDEO, MEM_READ, ANSWER)
    # MEM_WRITE only after an expert call; a memory read keeps the expert flag once set
    assert MEM_WRITE not in method.allowed_next(GrammarState(method.EVIDENCE_MEMORY, 1))
    state = method.advance(method.advance(GrammarState(), VISION), MEM_READ)
    assert state == GrammarState(method.EVIDENCE_EXPERT, 2)
    assert method.advance(GrammarState(), MEM_READ) == GrammarState(method.EVIDENCE_MEMORY, 1)
    assert method.allowed_next(GrammarState(method.WRITTEN)) == (ANSWER,)
    assert method.advance(GrammarState(method.EVIDENCE_EXPERT, 2), ANSWER) == GrammarState(method.ANSWERED, 2)
    assert method.advance(GrammarState(method.ANSWERED, 2), TTS) == GrammarState(method.SPOKEN, 2)
    assert method.allowed_next(GrammarState(method.SPOKEN)) == (EOS,)
    assert method.allowed_next(GrammarState(method.ACCEPTED)) == ()
    # the evidence bound: after max_evidence evidence tokens only MEM_WRITE / ANSWER remain
    assert method.allowed_next(GrammarState(method.EVIDENCE_EXPERT, 2), max_evidence=2) == (MEM_WRITE, ANSWER)
    assert method.accepts([VISION, VIDEO, ANSWER, EOS], max_evidence=2)
    assert not method.accepts([VISION, VIDEO, MEM_READ, ANSWER, EOS], max_evidence=2)
    assert not method.accepts([ASR, ASR, ANSWER, EOS])
    assert not method.accepts([ANSWER, TTS, TTS, EOS])
    assert not method.accepts([ANSWER, EOS, EOS])
    assert not method.accepts([ANSWER])  # no EOS: not accepted
    with pytest.raises(ValueError, match="not allowed"):
        method.advance(GrammarState(), EOS)


def test_negative_control_a_permissive_grammar_is_caught(monkeypatch):
    monkeypatch.setattr(method, "allowed_next", lambda state, max_evidence=3: method.CONTROL_TOKENS
                        if state.state != method.ACCEPTED else ())
    assert not grammar_checks()


def test_grammar_mask_and_masked_argmax_exact():
    vocab = {t: i for i, t in enumerate(["<pad>", *method.CONTROL_TOKENS])}
    mask = method.grammar_mask(GrammarState(method.ANSWERED), vocab, len(vocab))
    assert mask.tolist() == [t in (TTS, EOS) for t in vocab]
    logits = torch.tensor([9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 1.0, 2.0])  # EOS (id 8) beats TTS (id 7)
    assert method.masked_argmax(logits, mask) == vocab[EOS]
    assert int(logits.argmax()) == 0  # unconstrained argmax would pick the pad
    with pytest.raises(ValueError):
        method.masked_argmax(logits, torch.zeros(len(vocab), dtype=torch.bool))


def _random_controller(seed: int):
    vocab = controller_vocab()
    model = build_tiny_gpt2(tiny_gpt2_config(len(vocab), 64, n_layer=1, n_head=2, n_embd=16), seed)
    return model.eval(), vocab


def _decode_invalid_count(constrained: bool) -> int:
    model, vocab = _random_controller(0)
    prompts = [[controller.IMG, "how", "many", "red", "objects", controller.SEP],
               [controller.VID, controller.AUD, "which", "way", controller.SEP], ["hello", "there", controller.SEP]]
    prefixes = [[], [ASR], []]
    programs, generated = controller.decode_programs(model, vocab, prompts * 4, prefixes * 4, constrained)
    assert all(g >= 1 for g in generated)
    return sum(not method.accepts(p) for p in programs)


def test_constrained_decoding_never_leaves_the_grammar():
    """An untrained (random) controller: under the mask every program is legal; free decoding is not."""
    assert _decode_invalid_count(constrained=True) == 0
    assert _decode_invalid_count(constrained=False) > 0


def test_negative_control_a_mask_that_allows_everything_is_caught(monkeypatch):
    monkeypatch.setattr(method, "grammar_mask", lambda state, vocab, size, max_evidence=3: torch.ones(size, dtype=bool))
    monkeypatch.setattr(method, "advance", lambda state, token, max_evidence=3: state)
    assert _decode_invalid_count(constrained=True) > 0


# --- memory ------------------------------------------------------------------------------------------------


def test_cosine_exact_values():
    assert method.cosine([1.0, 2.0, 0.0], [1.0, 2.0, 0.0]) == pytest.approx(1.0, abs=1e-15)
    assert method.cosine([1.0, 0.0], [0.0, 3.0]) == 0.0
    assert method.cosine([3.0, 4.0], [1.0, 0.0]) == 0.6
    assert method.cosine([1.0, 1.0], [1.0, 0.0]) == pytest.approx(1 / math.sqrt(2), abs=1e-15)
    assert method.cosine([0.0, 0.0], [1.0, 0.0]) == 0.0
    with pytest.raises(ValueError):
        method.cosine([1.0], [1.0, 2.0])


def test_hashed_bow_counts_words_in_stable_buckets():
    text = "Red circle; red square."
    vector = method.hashed_bow(text, 8)
    assert sum(vector) == 4.0
    assert vector[method.stable_bucket("red", 8)] >= 2.0
    assert method.words(text) == ["red", "circle", "red", "square"]
    # SHA-256 of b"red" starts with b8 0b 1e 43 ... : the bucket is its first 8 bytes mod dim
    import hashlib

    assert method.stable_bucket("red", 97) == int.from_bytes(hashlib.sha256(b"red").digest()[:8], "big") % 97
    assert method.cosine(method.hashed_bow("image objects"), method.hashed_bow("objects image")) == pytest.approx(1.0)


def _record(source: str, bow: tuple[float, ...], summary: str = "image objects: red circle") -> method.MemoryRecord:
    return method.MemoryRecord(0, "image", source, "vision", "image objects", summary, bow)


def _bow_at(pairs: dict[int, float], dim: int = 64) -> tuple[float, ...]:
    vector = [0.0] * dim
    for index, value in pairs.items():
        vector[index] = value
    return tuple(vector)


def retrieval_checks(memory_cls=method.Memory) -> bool:
    """Acceptance check (a)2: cos 1 -> reuse; cos exactly 0.6 -> reuse (inclusive); a cos-1 record about another
    source is never reused; cos 0 -> no reuse."""
    word = "alpha"
    b = method.stable_bucket(word, 64)
    other = (b + 1) % 64
    memory = memory_cls(tau=0.6, dim=64)
    memory.write(_record("A", _bow_at({b: 1.0})))
    ok = memory.retrieve("A", word) is not None
    ok &= memory.retrieve("B", word) is None  # same text, another source hash
    exact = memory_cls(tau=0.6, dim=64)
    exact.write(_record("A", _bow_at({b: 3.0, other: 4.0})))  # cos = 3 / 5 = 0.6 exactly
    ok &= exact.retrieve("A", word) is not None
    below = memory_cls(tau=0.6, dim=64)
    below.write(_record("A", _bow_at({b: 2.9, other: 4.0})))  # cos < 0.6
    ok &= below.retrieve("A", word) is None
    return ok


def test_retrieval_threshold_is_inclusive_and_keyed_by_source():
    assert retrieval_checks()


def test_negative_control_retrieval_ignoring_the_source_is_caught(monkeypatch):
    def any_source(self, source, query):
        query_vector = method.hashed_bow(query, self.dim)
        best = max(self.records, key=lambda r: method.cosine(query_vector, r.bow_vector), default=None)
        return best if best and method.cosine(query_vector, best.bow_vector) >= self.tau else None

    monkeypatch.setattr(method.Memory, "retrieve", any_source)
    assert not retrieval_checks()


def test_retrieval_prefers_the_higher_cosine_and_the_latest_on_ties():
    b = method.stable_bucket("alpha", 64)
    memory = method.Memory(tau=0.0, dim=64)
    memory.write(_record("A", _bow_at({b: 1.0}), "first"))
    memory.write(_record("A", _bow_at({b: 1.0, (b + 1) % 64: 1.0}), "weaker"))
    memory.write(_record("A", _bow_at({b: 2.0}), "latest tie"))
    assert memory.retrieve("A", "alpha").summary == "latest tie"


def test_record_json_round_trips():
    record = method.make_record(3, "video", "h", "video", "video motion", "video motion: red object moving up", 8)
    import json

    data = json.loads(record.to_json())
    assert data["turn"] == 3 and data["source_hash"] == "h" and data["bow_vector"] == list(method.hashed_bow(
        "video motion", 8))
    short = method.MemoryRecord(1, "image", "h", "vision", "t", "s", (1.0, 0.0))
    assert short.to_json() == ('{"bow_vector": [1.0, 0.0], "expert": "vision", "modality": "image", '
                               '"source_hash": "h", "summary": "s", "topic": "t", "turn": 1}')
    assert method.source_hash(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


# --- executor ----------------------------------------------------------------------------------------------

SUMMARY = "objects: red circle; blue square; red square"


def executor_checks() -> bool:
    """Acceptance check (a)4."""
    return (method.execute_answer("how many red objects?", {"image": SUMMARY}) == "2"
            and method.execute_answer("how many squares?", {"image": SUMMARY}) == "2")


def test_executor_counts_and_directions_exact():
    assert executor_checks()
    assert method.count_answer("how many red square objects", SUMMARY) == "1"
    assert method.count_answer("how many objects", SUMMARY) == "3"
    assert method.count_answer("how many green objects", SUMMARY) == "0"
    assert method.parse_objects(SUMMARY) == [("red", "circle"), ("blue", "square"), ("red", "square")]
    assert method.parse_objects("image objects: ") == []
    assert method.execute_answer("which way is it moving", {"video": "video motion: red object moving left"}) == "left"
    assert method.execute_answer("which way is it moving", {"image": SUMMARY}) == method.UNKNOWN
    assert method.execute_answer("how many red objects", {"video": "x"}) == method.UNKNOWN
    assert method.execute_answer("hello there", {}) == "hello"
    assert method.direction_answer("video motion: nothing") == method.UNKNOWN
    assert [method.question_kind(q) for q in ("count the cubes", "where is it heading", "thank you")] == [
        "count", "direction", "chat"]


def test_negative_control_a_parser_that_drops_an_object_is_caught(monkeypatch):
    original = method.parse_objects
    monkeypatch.setattr(method, "parse_objects", lambda summary: original(summary)[:-1])
    assert not executor_checks()


# --- TTS and barge-in ---------------------------------------------------------------------------------------

SENTENCES = ["a" * 19 + ".", "b" * 19 + ".", "c" * 19 + "."]


def tts_checks() -> bool:
    """Acceptance check (a)5: 1 ms per character, 3 workers, three 20-character sentences: TTFA sequential 60 ms,
    parallel 20 ms, playback in sentence order."""
    sequential = method.schedule_tts(["".join(SENTENCES)], 0.0, 1.0, 10.0, 1)
    parallel = method.schedule_tts(SENTENCES, 0.0, 1.0, 10.0, 3)
    starts = [c.play_start for c in parallel]
    return (method.time_to_first_audio(sequential, 0.0) == 60.0 and method.time_to_first_audio(parallel, 0.0) == 20.0
            and [c.index for c in sorted(parallel, key=lambda c: c.play_start)] == [0, 1, 2]
            and starts == [20, 220, 420])


def test_tts_schedule_exact():
    assert tts_checks()
    assert method.split_sentences(" ".join(SENTENCES)) == SENTENCES
    # one worker, overhead 5: synthesis back to back; playback waits for synthesis
    chunks = method.schedule_tts(["ab.", "cdef."], 100.0, 2.0, 1.0, 1, overhead_ms=5.0)
    assert [(c.synth_start, c.synth_end, c.play_start, c.play_end) for c in chunks] == [
        (105.0, 111.0, 111.0, 114.0), (111.0, 121.0, 121.0, 126.0)]
    with pytest.raises(ValueError):
        method.schedule_tts(["a."], 0.0, 1.0, 1.0, 0)


def test_negative_control_tts_that_ignores_workers_is_caught(monkeypatch):
    original = method.schedule_tts
    monkeypatch.setattr(method, "schedule_tts", lambda s, start, c, p, workers, overhead_ms=0.0:
                        original(["".join(s)], start, c, p, 1, overhead_ms))
    assert not tts_checks()


def barge_in_checks(t: float = 250.0, frame: float = 20.0) -> bool:
    """Acceptance check (a)6: interrupt inside chunk 1's playback (220-420 ms): chunk 2 is cancelled, no chunk
    starts after t, audio ends within one frame of t (at 220 + 2 * 20 = 260 ms)."""
    chunks = method.schedule_tts(SENTENCES, 0.0, 1.0, 10.0, 3)
    cut = method.barge_in(chunks, t, frame)
    return (cut.cancelled == (2,) and [c.index for c in cut.emitted] == [0, 1]
            and all(c.play_start < t for c in cut.emitted) and cut.audio_end == 260.0 and cut.audio_end <= t + frame)


def test_barge_in_cancels_pending_and_stops_within_a_frame():
    assert barge_in_checks()
    chunks = method.schedule_tts(SENTENCES, 0.0, 1.0, 10.0, 3)
    before = method.barge_in(chunks, 10.0, 20.0)  # before any audio: everything cancelled, silence at t
    assert before.cancelled == (0, 1, 2) and before.emitted == () and before.audio_end == 10.0
    gap = method.barge_in(chunks, 220.0, 20.0)  # exactly at chunk 1's start: chunk 1 is cancelled too
    assert gap.cancelled == (1, 2) and gap.audio_end == 220.0
    assert [c.index for c in gap.emitted] == [0]


def test_negative_control_barge_in_that_lets_chunks_finish_is_caught(monkeypatch):
    monkeypatch.setattr(method, "barge_in", lambda chunks, t, frame: method.BargeIn(
        tuple(chunks), (), max(c.play_end for c in chunks)))
    assert not barge_in_checks()


def test_virtual_clock_books_costs_per_component():
    clock = method.VirtualClock()
    clock.charge("controller", 10.0)
    clock.charge("vision", 600.0)
    clock.charge("controller", 5.0)
    assert clock.now == 615.0 and clock.spent == {"controller": 15.0, "vision": 600.0}
    with pytest.raises(ValueError):
        clock.charge("x", -1.0)
    assert clock.charge("tiny", 0.5) == 615.5


# --- training-free integration ------------------------------------------------------------------------------


def test_parameter_hash_detects_any_change():
    model = experts.build_expert("vision", 8, 0)
    before = method.parameter_hash(model)
    assert method.parameter_hash(experts.build_expert("vision", 8, 0)) == before  # same seed, same hash
    with torch.no_grad():
        model.shape_head.bias[0] += 1e-7
    assert method.parameter_hash(model) != before
    norm = torch.nn.BatchNorm1d(2)
    h = method.parameter_hash(norm)
    norm.running_mean[0] = 0.5  # a buffer, not a parameter
    assert method.parameter_hash(norm) != h


def test_swapping_the_vision_expert_changes_only_its_hash():
    """Experts are separate modules selected by name: replacing the vision expert leaves the others' bytes alone."""
    available = {"vision_v1": experts.build_expert("vision", 8, 1), "vision_v2": experts.build_expert("vision", 8, 2),
                 "video": experts.build_expert("video", 8, 3), "asr": experts.build_expert("asr", 8, 4, vocab_size=5)}
    first = {"vision": "vision_v1", "video": "video", "asr": "asr"}
    second = first | {"vision": "vision_v2"}
    hashes = [{role: method.parameter_hash(available[name]) for role, name in choice.items()}
              for choice in (first, second)]
    assert [role for role in first if hashes[0][role] != hashes[1][role]] == ["vision"]


# --- the interaction layer (orchestrator) -------------------------------------------------------------------

CLOCK = ClockConfig(controller_ms_per_token=25.0, controller_ms_per_prompt_token=0.5, asr_ms_per_word=40.0,
                    vision_ms=600.0, video_ms=1200.0, memory_ms=2.0, tts_ms_per_char=3.0, play_ms_per_char=60.0,
                    tts_workers=3, tts_overhead_ms=5.0, frame_ms=20.0)
MEMORY = MemoryConfig(tau=0.6, bow_dim=64)


def _tables() -> orchestrator.ExpertTables:
    return orchestrator.ExpertTables(
        image_text={"a:image": "image objects: red circle; red square", "b:image": "image objects: blue circle"},
        video_text={"v:video": "video motion: red object moving up"},
        hashes={"a:image": "ha", "b:image": "hb", "v:video": "hv"})


def _session(memory: bool) -> tuple[list[str], orchestrator.SessionState]:
    state = orchestrator.SessionState(method.Memory(0.6, 64) if memory else None)
    answers = []
    turns = [([VISION, MEM_WRITE, ANSWER, EOS], "how many red objects are in the picture", {"image": "a:image"}),
             ([VIDEO, MEM_WRITE, ANSWER, EOS], "which way is the object moving in the video", {"video": "v:video"}),
             ([MEM_READ, ANSWER, EOS], "and how many circle objects were in that picture", {}),
             ([MEM_READ, ANSWER, EOS], "and which way was the object moving in that video", {})]
    for turn, (program, question, attached) in enumerate(turns):
        answers.append(orchestrator.run_turn(program, question, turn, attached, state, _tables(), CLOCK, MEMORY,
                                             10, len(program), 0).answer)
    return answers, state


def test_reuse_returns_the_record_of_the_same_source():
    """Memory-backed reuse gives the answers re-invocation gives, with fewer expert calls."""
    with_memory, state = _session(memory=True)
    without, plain = _session(memory=False)
    assert with_memory == without == ["2", "up", "1", "up"]
    assert state.calls == {"vision": 1, "video": 1} and state.reused == 2
    assert plain.calls == {"vision": 2, "video": 2} and plain.reused == 0


def test_negative_control_reuse_of_another_sources_record_is_caught(monkeypatch):
    """A memory that returns the latest record whatever the source: a follow-up about image a after image b was
    described gets b's objects."""
    monkeypatch.setattr(method.Memory, "retrieve",
                        lambda self, source, query: self.records[-1] if self.records else None)
    state = orchestrator.SessionState(method.Memory(0.6, 64))
    tables = _tables()
    orchestrator.run_turn([VISION, MEM_WRITE, ANSWER, EOS], "how many objects in the picture", 0, {"image": "a:image"},
                          state, tables, CLOCK, MEMORY, 5, 4, 0)
    state.memory.write(method.make_record(1, "image", "hb", "vision", "image objects", tables.image_text["b:image"]))
    out = orchestrator.run_turn([MEM_READ, ANSWER, EOS], "and how many red objects were in that picture", 2, {},
                                state, tables, CLOCK, MEMORY, 5, 3, 0)
    assert out.answer != "2"


def test_turn_latency_on_the_virtual_clock_exact():
    state = orchestrator.SessionState(method.Memory(0.6, 64))
    out = orchestrator.run_turn([ASR, VISION, MEM_WRITE, ANSWER, TTS, EOS], "how many red objects in the picture", 0,
                                {"image": "a:image"}, state, _tables(), CLOCK, MEMORY, prompt_len=10, generated=5,
                                spoken_words=7)
    reply = orchestrator.reply_text("2", "image")
    first = method.split_sentences(reply)[0]
    assert first == "The answer is 2."
    # asr 7 * 40 + controller 10 * 0.5 + 5 * 25 + vision 600 + memory 2 + TTFA (5 + 3 * 16)
    assert out.spent == {"asr": 280.0, "controller": 130.0, "vision": 600.0, "memory": 2.0,
                         "tts_first_audio": 53.0}
    assert out.latency_ms == 1065.0 and out.answer == "2"


def test_expert_token_without_an_attachment_gathers_no_evidence():
    state = orchestrator.SessionState(None)
    out = orchestrator.run_turn([VISION, ANSWER, EOS], "how many red objects", 0, {}, state, _tables(), CLOCK, MEMORY,
                                1, 3, 0)
    assert out.answer == method.UNKNOWN and state.calls == {"vision": 0, "video": 0}
    assert orchestrator.referenced_modality("that video") == "video"
    assert orchestrator.referenced_modality("that image") == "image"
    assert orchestrator.referenced_modality("hello") is None


# --- claim metrics and baselines ----------------------------------------------------------------------------


def test_crossing_budget_exact():
    assert claim_metrics.crossing_budget(0.9, {100: 0.5, 400: 0.95, 1600: 0.97}) == 400.0
    assert claim_metrics.crossing_budget(0.9, {100: 0.5, 400: 0.9}) == 400.0
    assert claim_metrics.crossing_budget(0.9, {1600: 0.89, 100: 0.95}) == 100.0
    assert claim_metrics.crossing_budget(0.9, {100: 0.5}) == math.inf


def test_check_every_exact():
    assert baselines.check_every(100, 64, 50) == 50
    assert baselines.check_every(6400, 64, 50) == 100
    assert baselines.check_every(6401, 64, 50) == 101
    assert baselines.check_every(100, 64, 1) == 2  # one check per epoch at small N (the cpu profile's setting)


def test_overhead_knob_at_share_exact():
    # overhead 130 ms = 25 ms x 4 tokens + 30 ms; total 2000 ms: (30 + 4x) / (1900 + 4x) = 0.1 at x = 160 / 3.6
    x = claim_metrics.overhead_knob_at_share(0.1, 130.0, 2000.0, 4.0, 25.0)
    assert x == pytest.approx(160.0 / 3.6)
    assert (30 + 4 * x) / (1900 + 4 * x) == pytest.approx(0.1)
    # the knob as configured reproduces the measured share: at x = 25 the formula is an identity
    assert claim_metrics.overhead_knob_at_share(130.0 / 2000.0, 130.0, 2000.0, 4.0, 25.0) == pytest.approx(25.0)


def test_oracle_tokens_are_the_true_scene():
    rows = [{"cells": ["red circle", "empty", "empty", "blue square"], "direction": "left", "colour": "green"}]
    inputs = {"has_image": torch.tensor([True]), "has_video": torch.tensor([False]),
              "spoken": torch.tensor([True]), "word_ids": torch.tensor([[3] * 16]),
              "question_mask": torch.ones(1, 16, dtype=torch.bool)}
    out = baselines.oracle_tokens(rows, inputs)
    shapes, colours = experts.SHAPE_OR_EMPTY, method.COLOURS
    expected = torch.zeros(4, baselines.ORACLE_CELL_DIM)
    expected[0, shapes.index("circle")] = expected[0, len(shapes) + colours.index("red")] = 1.0
    expected[1, 0] = expected[2, 0] = 1.0
    expected[3, shapes.index("square")] = expected[3, len(shapes) + colours.index("blue")] = 1.0
    assert torch.equal(out["image_tokens"][0], expected)
    motion = torch.zeros(baselines.ORACLE_MOTION_DIM)
    motion[method.DIRECTIONS.index("left")] = motion[len(method.DIRECTIONS) + colours.index("green")] = 1.0
    assert torch.equal(out["video_tokens"][0, 0], motion)
    assert not bool(out["spoken"][0])  # the oracle reads the true words, never audio


def test_expert_tokens_are_the_frozen_experts_features():
    torch.manual_seed(0)
    vision, video = experts.build_expert("vision", 8, 1), experts.build_expert("video", 8, 2)
    asr = experts.build_expert("asr", 8, 3, vocab_size=5)
    n = 3
    inputs = {"images": torch.rand(n, 3, 16, 16), "videos": torch.rand(n, 4, 3, 16, 16),
              "spectra": torch.rand(n, 16, experts.SPECTRUM_BINS), "has_image": torch.ones(n, dtype=torch.bool),
              "has_video": torch.ones(n, dtype=torch.bool), "spoken": torch.ones(n, dtype=torch.bool),
              "word_ids": torch.zeros(n, 16, dtype=torch.long), "question_mask": torch.ones(n, 16, dtype=torch.bool)}
    out = baselines.expert_tokens(inputs, vision, video, asr, chunk=2)
    with torch.no_grad():
        assert torch.allclose(out["image_tokens"], experts.cell_tokens(vision.encoder, inputs["images"]), atol=1e-5)
        clip = experts.video_tokens(video.encoder, inputs["videos"])
        assert torch.allclose(out["video_tokens"][:, 0], clip[:, :16].amax(dim=1), atol=1e-5)
        assert torch.allclose(out["video_tokens"][:, 1:], clip[:, 16:], atol=1e-5)
        assert torch.allclose(out["audio_tokens"], torch.nn.functional.gelu(asr.frame(inputs["spectra"])), atol=1e-5)
    assert out["image_tokens"].shape == (n, 4, 8) and out["video_tokens"].shape == (n, 17, 8)
    inputs["question_mask"][:, 5:] = False  # positions no item uses are dropped
    assert baselines.expert_tokens(inputs, vision, video, asr)["word_ids"].shape == (n, 5)


def _tiny_fusion_problem():
    """40 items with random labels (so the held-out loss soon rises) and a fresh fusion model."""
    shapes = baselines.TokenShapes(4, 3, 1, 2, 1)
    n = 40
    generator = torch.Generator().manual_seed(0)
    batch = {"image_tokens": torch.rand(n, 4, 3, generator=generator), "video_tokens": torch.rand(n, 1, 2),
             "audio_tokens": torch.zeros(n, 16, 1), "has_image": torch.ones(n, dtype=torch.bool),
             "has_video": torch.zeros(n, dtype=torch.bool), "spoken": torch.zeros(n, dtype=torch.bool),
             "word_ids": torch.randint(0, 5, (n, 16), generator=generator),
             "question_mask": torch.ones(n, 16, dtype=torch.bool)}
    labels = torch.randint(0, 3, (n,), generator=generator)
    return batch, labels, baselines.build_fusion(shapes, 8, 1, 2, 5, 0)


def _tiny_fit(monkeypatch=None):
    batch, labels, model = _tiny_fusion_problem()
    half = slice(0, 20), slice(20, 40)
    log = baselines.train_fusion(model, baselines.take(batch, half[0]), labels[half[0]], baselines.take(batch, half[1]),
                                 labels[half[1]], 8, 1e-2, 5, 2, 400, 0)
    return model, log, baselines.take(batch, half[1]), labels[half[1]]


def test_early_stopping_keeps_the_best_held_out_weights():
    model, log, val, val_labels = _tiny_fit()
    assert log.stopped_early and log.steps < 400  # memorising random labels: the held-out loss stops improving
    assert log.steps == 5 * len(log.val_losses)
    assert baselines.mean_loss(model, val, val_labels) == pytest.approx(min(log.val_losses), rel=1e-5)
    assert log.best_step == 5 * (1 + log.val_losses.index(min(log.val_losses)))


def test_negative_control_early_stopping_that_keeps_the_last_weights_is_caught(monkeypatch):
    monkeypatch.setattr(baselines.FusionModel, "load_state_dict", lambda self, state: None)
    model, log, val, val_labels = _tiny_fit()
    assert baselines.mean_loss(model, val, val_labels) != pytest.approx(min(log.val_losses), rel=1e-5)


def test_gold_programs_are_legal():
    for intent in controller.INTENTS:
        for spoken in (False, True):
            for speak in (False, True):
                program = controller.gold_program(controller.Request(intent, "x", spoken, speak))
                assert method.accepts(program), program


# --- the grammar mask's stress control (sampled decoding), the middle budget, the capacity check's budget ----


def test_masked_sample_draws_from_the_tempered_softmax_over_the_mask():
    logits = torch.tensor([2.0, 0.0, 1.0, 5.0])
    mask = torch.tensor([True, True, True, False])
    # softmax([2, 0, 1] / 2) over the mask, id 3 at probability 0
    probs = torch.softmax(torch.tensor([1.0, 0.0, 0.5], dtype=torch.double), -1).tolist() + [0.0]
    generator = torch.Generator().manual_seed(7)
    draws = [method.masked_sample(logits, mask, 2.0, generator) for _ in range(200)]
    assert 3 not in draws  # never outside the mask, though id 3 has the largest logit
    counts = [draws.count(i) for i in range(3)]
    # softmax([1, 0, 0.5]) = [0.506, 0.186, 0.307]: 200 draws land near 101 / 37 / 61
    assert counts[0] > counts[2] > counts[1] > 0
    single = torch.tensor([False, False, True, False])
    assert {method.masked_sample(logits, single, 1.0, generator) for _ in range(20)} == {2}
    with pytest.raises(ValueError):
        method.masked_sample(logits, torch.zeros(4, dtype=torch.bool), 1.0, generator)
    with pytest.raises(ValueError):
        method.masked_sample(logits, mask, 0.0, generator)
    # exact: from the same generator state, the draw equals multinomial on the hand-computed probabilities
    for seed in range(20):
        got = method.masked_sample(logits, mask, 2.0, torch.Generator().manual_seed(seed))
        want = int(torch.multinomial(torch.tensor(probs, dtype=torch.double), 1,
                                     generator=torch.Generator().manual_seed(seed)))
        assert got == want


def test_negative_control_sampling_without_temperature_or_mask_is_caught(monkeypatch):
    def unscaled(logits, mask, temperature, generator):  # forgets the temperature, keeps the input checks
        if not bool(mask.any()) or temperature <= 0:
            raise ValueError("empty mask or temperature <= 0")
        scaled = torch.where(mask, logits.double(), torch.full_like(logits, -math.inf, dtype=torch.double))
        return int(torch.multinomial(scaled.softmax(-1), 1, generator=generator))

    monkeypatch.setattr(method, "masked_sample", unscaled)
    with pytest.raises(AssertionError):  # the positive test's exact comparison catches it
        test_masked_sample_draws_from_the_tempered_softmax_over_the_mask()


def _sampled_invalid_count(constrained: bool, seed: int = 0) -> tuple[int, list[list[str]]]:
    model, vocab = _random_controller(0)
    prompts = [[controller.IMG, "how", "many", "red", "objects", controller.SEP],
               [controller.VID, controller.AUD, "which", "way", controller.SEP], ["hello", "there", controller.SEP]]
    prefixes = [[], [ASR], []]
    programs, _ = controller.decode_programs(model, vocab, prompts * 4, prefixes * 4, constrained, temperature=1.5,
                                             generator=torch.Generator().manual_seed(seed))
    return sum(not method.accepts(p) for p in programs), programs


def test_sampled_decoding_is_seeded_and_the_mask_holds_under_sampling():
    free_invalid, free = _sampled_invalid_count(constrained=False)
    constrained_invalid, constrained = _sampled_invalid_count(constrained=True)
    assert free_invalid > 0 and constrained_invalid == 0
    assert _sampled_invalid_count(constrained=True)[1] == constrained  # the same generator seed, the same programs
    assert _sampled_invalid_count(constrained=True, seed=1)[1] != constrained  # it samples
    model, vocab = _random_controller(0)
    with pytest.raises(ValueError, match="torch.Generator"):
        controller.decode_programs(model, vocab, [["hello", controller.SEP]], [[]], True, temperature=1.0)


def test_negative_control_sampling_that_ignores_the_mask_is_caught(monkeypatch):
    monkeypatch.setattr(method, "masked_sample", lambda logits, mask, temperature, generator: int(
        torch.multinomial((logits.double() / temperature).softmax(-1), 1, generator=generator)))
    with pytest.raises(ValueError, match="is not allowed"):  # the grammar's own check refuses the illegal draw
        test_sampled_decoding_is_seeded_and_the_mask_holds_under_sampling()


def test_middle_budget_exact():
    assert claim_metrics.middle_budget([100, 400, 1600, 6400]) == 400
    assert claim_metrics.middle_budget([100, 400, 1600]) == 400
    assert claim_metrics.middle_budget([50, 100]) == 50
    assert claim_metrics.middle_budget([7]) == 7


def test_negative_control_upper_middle_is_caught(monkeypatch):
    monkeypatch.setattr(claim_metrics, "middle_budget", lambda budgets: budgets[len(budgets) // 2])
    with pytest.raises(AssertionError):  # the positive test run under the upper-middle variant
        test_middle_budget_exact()


def test_oracle_budget_must_be_a_measured_budget():
    from pydantic import ValidationError

    from tasks.llm_orchestration.config import JointConfig

    base = {"budgets": [100, 400], "validation": 50, "width": 16, "layers": 1, "heads": 2, "check_min_steps": 5,
            "patience": 1, "smoothing": 0.0, "tolerance": 0.0, "safety_steps": 20, "batch_size": 32, "lr": 2e-3}
    assert JointConfig(**base, oracle_budget=100).oracle_budget == 100
    with pytest.raises(ValidationError, match="oracle_budget 200 must be one of budgets"):
        JointConfig(**base, oracle_budget=200)


def _stress_rows():
    rows = [{"intent": "count", "text": "how many red objects", "spoken": False, "speak": False},
            {"intent": "direction", "text": "which way", "spoken": True, "speak": True},
            {"intent": "chat", "text": "hello there", "spoken": False, "speak": False}] * 4
    return rows, [r["text"] for r in rows]


def test_stress_invalid_counts_are_the_sampled_decodes_invalid_programs():
    from tasks.llm_orchestration import evaluate

    model, vocab = _random_controller(0)
    rows, heard = _stress_rows()
    out = evaluate.stress_invalid_counts(model, rows, heard, 3, 1.5, seed=5)
    prompts = [controller.prompt_tokens(evaluate.request_of(r), t) for r, t in zip(rows, heard, strict=True)]
    prefixes = [[ASR] if r["spoken"] else [] for r in rows]
    free, _ = controller.decode_programs(model, vocab, prompts, prefixes, False, 3, temperature=1.5,
                                         generator=torch.Generator().manual_seed(5))
    want_free = float(sum(not method.accepts(p) for p in free))
    assert out == {"invalid_free_sampled": want_free, "invalid_constrained_sampled": 0.0}
    assert want_free > 0  # a random controller sampled freely leaves the grammar


def test_negative_control_stress_counts_with_the_mask_on_both_decodes_are_caught(monkeypatch):
    from tasks.llm_orchestration import evaluate

    original = evaluate.programs_for
    monkeypatch.setattr(evaluate, "programs_for", lambda c, rows, heard, constrained, *a: original(
        c, rows, heard, True, *a))
    with pytest.raises(AssertionError):  # the positive test run with the mask on both decodes
        test_stress_invalid_counts_are_the_sampled_decodes_invalid_programs()


# --- the joint reference's stopping rule and the fixed evaluation set (after the second review) -----------------


def test_smoothed_exact():
    assert baselines.smoothed([1.0, 0.0, 1.0], 0.5) == [1.0, 0.5, 0.75]
    assert baselines.smoothed([0.4, 0.2, 0.3], 0.0) == [0.4, 0.2, 0.3]
    assert baselines.smoothed([2.0, 1.0], 0.8) == pytest.approx([2.0, 1.8])
    assert baselines.smoothed([], 0.8) == []


def test_negative_control_smoothing_with_the_weights_swapped_is_caught(monkeypatch):
    monkeypatch.setattr(baselines, "smoothed", _swapped)
    with pytest.raises(AssertionError):
        test_smoothed_exact()


def _swapped(values, weight):  # weight on the new value instead of the past
    out = []
    for v in values:
        out.append(v if not out else (1.0 - weight) * out[-1] + weight * v)
    return out


def test_should_stop_exact():
    # best before the last 2 is 1.0; the last two (1.0, 1.2) do not go below it: stop (tolerance 0)
    assert baselines.should_stop([2.0, 1.0, 1.0, 1.2], 2, 0.0)
    # 0.99 is below 1.0: an improvement, no stop
    assert not baselines.should_stop([2.0, 1.0, 0.99, 1.2], 2, 0.0)
    # ... but not by more than the tolerance 0.05: stop
    assert baselines.should_stop([2.0, 1.0, 0.99, 1.2], 2, 0.05)
    # too few checks to judge
    assert not baselines.should_stop([2.0, 3.0], 2, 0.0)
    assert baselines.should_stop([2.0, 3.0, 4.0], 2, 0.0)
    # a loss still falling never stops, however long
    assert not baselines.should_stop([1.0 / (k + 1) for k in range(50)], 10, 0.0)


def test_negative_control_stopping_off_by_one_is_caught(monkeypatch):
    monkeypatch.setattr(baselines, "should_stop", lambda s, patience, tolerance: len(s) > patience - 1 and (
        min(s[-(patience - 1):]) >= min(s[:-(patience - 1)]) - tolerance))
    with pytest.raises(AssertionError):
        test_should_stop_exact()


def test_train_fusion_stops_by_the_smoothed_rule():
    batch, labels, model = _tiny_fusion_problem()
    val, val_labels = baselines.take(batch, slice(20, 40)), labels[20:40]
    log = baselines.train_fusion(model, baselines.take(batch, slice(0, 20)), labels[:20], val, val_labels, 8, 1e-2,
                                 5, 3, 2000, 0, smoothing=0.7, tolerance=0.01)
    assert log.stopped_early and log.smoothed_val_losses == baselines.smoothed(log.val_losses, 0.7)
    # it stopped at the first check where the rule (written out here) fires, not before and not after
    def rule(s):
        return len(s) > 3 and min(s[-3:]) >= min(s[:-3]) - 0.01

    fired = [rule(log.smoothed_val_losses[:k]) for k in range(1, len(log.val_losses) + 1)]
    assert fired[-1] and not any(fired[:-1])
    # and kept the weights of the best raw held-out loss
    assert baselines.mean_loss(model, val, val_labels) == pytest.approx(min(log.val_losses), rel=1e-5)


def test_negative_control_stopping_one_check_late_is_caught(monkeypatch):
    original = baselines.should_stop

    def late(s, patience, tolerance):  # judges the checks before the last one: stops one check late
        return len(s) > 1 and original(s[:-1], patience, tolerance)

    monkeypatch.setattr(baselines, "should_stop", late)
    with pytest.raises(AssertionError):
        test_train_fusion_stops_by_the_smoothed_rule()
