"""llm_orchestration method: exact values where test_llm_orchestration_method.py's inputs could not tell a right
formula from a wrong one (issue 20, survivors of the full mutation run), each with a negative control that breaks
the library."""

from __future__ import annotations

import pytest
import torch

from tasks.llm_orchestration import method
from tasks.llm_orchestration.method import (
    AFTER_ASR,
    ANSWER,
    ANSWERED,
    ASR,
    EOS,
    EVIDENCE_EXPERT,
    MEM_READ,
    MEM_WRITE,
    VIDEO,
    VISION,
    GrammarState,
)

VOCAB = {token: i for i, token in enumerate(method.CONTROL_TOKENS)}


def check_default_evidence_budget_is_three() -> None:
    """Without max_evidence the grammar allows 3 evidence steps; a 4th is refused by every entry point."""
    full = GrammarState(AFTER_ASR, 3)
    assert method.allowed_next(full) == (ANSWER,)
    with pytest.raises(ValueError):
        method.advance(full, VISION)
    assert method.accepts([ASR, VISION, VIDEO, MEM_READ, ANSWER, EOS])
    assert not method.accepts([ASR, VISION, VIDEO, MEM_READ, MEM_READ, ANSWER, EOS])
    assert method.grammar_mask(full, VOCAB, 10).nonzero().flatten().tolist() == [VOCAB[ANSWER]]
    # an explicit budget reaches allowed_next through grammar_mask
    assert method.grammar_mask(full, VOCAB, 10, max_evidence=4).nonzero().flatten().tolist() == sorted(
        VOCAB[t] for t in (VISION, VIDEO, MEM_READ, ANSWER))


def test_default_evidence_budget_is_three():
    check_default_evidence_budget_is_three()


def test_negative_control_budget_of_four_is_caught(monkeypatch):
    real = method.allowed_next
    monkeypatch.setattr(method, "allowed_next", lambda state, max_evidence=4: real(state, max_evidence))
    with pytest.raises((AssertionError, pytest.fail.Exception)):
        check_default_evidence_budget_is_three()


def check_advance_keeps_the_evidence_count() -> None:
    """Writing memory and ending the program keep the number of evidence steps taken."""
    assert method.advance(GrammarState(EVIDENCE_EXPERT, 2), MEM_WRITE) == GrammarState(method.WRITTEN, 2)
    assert method.advance(GrammarState(ANSWERED, 2), EOS) == GrammarState(method.ACCEPTED, 2)


def test_advance_keeps_the_evidence_count():
    check_advance_keeps_the_evidence_count()


def test_negative_control_evidence_reset_is_caught(monkeypatch):
    real = method.advance
    monkeypatch.setattr(method, "advance", lambda state, token, max_evidence=3: GrammarState(
        real(state, token, max_evidence).state, 0))
    with pytest.raises(AssertionError):
        check_advance_keeps_the_evidence_count()


def check_records_and_bags_of_words() -> None:
    """Default dimension 64; every field of a record is the argument given; the vector is the topic's bag."""
    assert len(method.hashed_bow("red circle")) == 64
    record = method.make_record(3, "image", "abc", "vision", "red circle", "objects: red circle")
    assert (record.turn, record.modality, record.source_hash, record.expert, record.topic, record.summary) == (
        3, "image", "abc", "vision", "red circle", "objects: red circle")
    assert record.bow_vector == tuple(method.hashed_bow("red circle", 64))


def test_records_and_bags_of_words():
    check_records_and_bags_of_words()


def test_negative_control_swapped_record_fields_are_caught(monkeypatch):
    real = method.make_record
    monkeypatch.setattr(method, "make_record", lambda turn, modality, source, expert, topic, summary, dim=64: real(
        turn, expert, source, modality, topic, summary, dim))
    with pytest.raises(AssertionError):
        check_records_and_bags_of_words()


def check_retrieve_with_a_non_default_dimension() -> None:
    """A memory of dimension 32 embeds the query in 32 buckets too (else the cosine has mismatched lengths)."""
    memory = method.Memory(tau=0.5, dim=32)
    memory.write(method.make_record(1, "image", "src", "vision", "red circle", "objects: red circle", dim=32))
    found = memory.retrieve("src", "red circle")
    assert found is not None and found.turn == 1


def test_retrieve_with_a_non_default_dimension():
    check_retrieve_with_a_non_default_dimension()


def test_negative_control_query_in_default_dimension_is_caught(monkeypatch):
    def default_dimension_query(self, source, query):
        scored = [(method.cosine(method.hashed_bow(query), r.bow_vector), r) for r in self.records
                  if r.source_hash == source]
        best = max(scored, key=lambda pair: pair[0], default=(0.0, None))
        return best[1] if best[0] >= self.tau else None
    monkeypatch.setattr(method.Memory, "retrieve", default_dimension_query)
    with pytest.raises(ValueError, match="different lengths"):
        check_retrieve_with_a_non_default_dimension()


def check_parse_objects_needs_colour_and_shape_and_takes_the_first_colon() -> None:
    assert method.parse_objects("objects: red; blue square") == [("blue", "square")]
    assert method.parse_objects("objects: red circle; note: blue square") == [("red", "circle"), ("blue", "square")]


def test_parse_objects_needs_colour_and_shape_and_takes_the_first_colon():
    check_parse_objects_needs_colour_and_shape_and_takes_the_first_colon()


def test_negative_control_last_colon_is_caught(monkeypatch):
    real = method.parse_objects
    monkeypatch.setattr(method, "parse_objects", lambda summary: real("x:" + summary.rpartition(":")[2]))
    with pytest.raises(AssertionError):
        check_parse_objects_needs_colour_and_shape_and_takes_the_first_colon()


def check_schedule_tts_uses_the_first_free_worker() -> None:
    """Two workers, three sentences (2, 4, 1 chars), 10 ms/char synthesis, 1 ms/char playback, start 100,
    overhead 5: chunk 0 on worker 0 [105, 125], chunk 1 on worker 1 [105, 145], chunk 2 on worker 0 (free at
    125) [125, 135]; playback in order: [125, 127], [145, 149], [149, 150]."""
    chunks = method.schedule_tts(["ab", "cdef", "g"], 100.0, 10.0, 1.0, 2, overhead_ms=5.0)
    assert [(c.index, c.text, c.synth_start, c.synth_end, c.play_start, c.play_end) for c in chunks] == [
        (0, "ab", 105.0, 125.0, 125.0, 127.0), (1, "cdef", 105.0, 145.0, 145.0, 149.0),
        (2, "g", 125.0, 135.0, 149.0, 150.0)]


def test_schedule_tts_uses_the_first_free_worker():
    check_schedule_tts_uses_the_first_free_worker()


def test_negative_control_always_worker_zero_is_caught(monkeypatch):
    real = method.schedule_tts
    monkeypatch.setattr(method, "schedule_tts", lambda sentences, start, ms, play, workers, overhead_ms=0.0: real(
        sentences, start, ms, play, 1, overhead_ms))
    with pytest.raises(AssertionError):
        check_schedule_tts_uses_the_first_free_worker()


def check_zero_cost_is_a_valid_charge() -> None:
    clock = method.VirtualClock()
    assert clock.charge("asr", 0.0) == 0.0 and clock.spent == {"asr": 0.0}
    assert clock.charge("asr", 2.5) == 2.5 and clock.spent == {"asr": 2.5}


def test_zero_cost_is_a_valid_charge():
    check_zero_cost_is_a_valid_charge()


def test_negative_control_zero_cost_refused_is_caught(monkeypatch):
    real = method.VirtualClock.charge

    def strict(self, component, ms):
        if ms <= 0:
            raise ValueError("cost")
        return real(self, component, ms)
    monkeypatch.setattr(method.VirtualClock, "charge", strict)
    with pytest.raises(ValueError):
        check_zero_cost_is_a_valid_charge()


def _module_with_buffer(buffer: torch.Tensor) -> torch.nn.Module:
    module = torch.nn.Module()
    module.register_buffer("b", buffer)
    return module


def check_parameter_hash_covers_shape_and_dtype() -> None:
    """Equal bytes, different shape or dtype: different hashes; the same tensor twice: the same hash."""
    zeros = method.parameter_hash(_module_with_buffer(torch.zeros(2, 3)))
    assert zeros == method.parameter_hash(_module_with_buffer(torch.zeros(2, 3)))
    assert zeros != method.parameter_hash(_module_with_buffer(torch.zeros(3, 2)))
    assert method.parameter_hash(_module_with_buffer(torch.zeros(2, dtype=torch.int32))) != method.parameter_hash(
        _module_with_buffer(torch.zeros(2, dtype=torch.float32)))


def test_parameter_hash_covers_shape_and_dtype():
    check_parameter_hash_covers_shape_and_dtype()


def test_negative_control_bytes_only_hash_is_caught(monkeypatch):
    import hashlib
    monkeypatch.setattr(method, "parameter_hash", lambda module: hashlib.sha256(b"".join(
        t.numpy().tobytes() for _, t in sorted(module.state_dict().items()))).hexdigest())
    with pytest.raises(AssertionError):
        check_parameter_hash_covers_shape_and_dtype()
