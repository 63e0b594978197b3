"""llm_orchestration world, data and paper-profile planner: determinism, exact renderings, a local stand-in LLM."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tasks.llm_orchestration import data, experts, hub, method, world
from tasks.llm_orchestration.controller import Request, gold_program


def test_rendering_is_deterministic_and_exact():
    cells = ["red square", "empty", "empty", "blue circle"]
    a = world.render_image(cells, np.random.default_rng(0), 0.0)
    b = world.render_image(cells, np.random.default_rng(0), 0.0)
    assert np.array_equal(a, b) and a.shape == (3, 16, 16)
    assert a[0].sum() == pytest.approx(25 * 1.0 + 13 * 0.1)  # a 5x5 red square, a 13-pixel blue circle
    assert a[2].sum() == pytest.approx(25 * 0.1 + 13 * 1.0)
    assert a[:, 8:, :8].sum() == 0.0  # empty cell (row 1, col 0)
    video = world.render_video("green", "square", "right", np.random.default_rng(1), 0.0)
    cols = [np.nonzero(video[t, 1].sum(axis=0))[0] for t in range(4)]
    assert [c[0] - cols[0][0] for c in cols] == [0, 2, 4, 6]  # 2 px per frame to the right


def test_speech_spectrum_peaks_at_the_word_tones():
    tones = world.word_tones(["alpha", "beta"])
    assert tones == {"alpha": (300.0, 1000.0), "beta": (400.0, 1000.0)}
    frames = world.render_speech("beta", tones, np.random.default_rng(0), 0.0)
    spectrum = world.spectrum(frames)[0]
    top = sorted(np.argsort(spectrum)[-2:] * world.SAMPLE_RATE / world.WORD_SAMPLES)
    assert abs(top[0] - 400) <= 20 and abs(top[1] - 1000) <= 20
    with pytest.raises(ValueError):
        world.word_tones([str(i) for i in range(61)])


def test_gold_answers_use_the_true_scene():
    row = {"text": "how many red objects are in the picture",
           "cells": ["red square", "red circle", "empty", "blue square"],
           "direction": "up"}
    assert data.gold_answer(row) == "2"
    assert data.gold_answer({"text": "which way is the object moving in the video", "direction": "up"}) == "up"
    assert experts.scene_text(row["cells"]) == "image objects: red square; red circle; blue square"
    assert experts.cell_labels(row["cells"]) == ([2, 1, 0, 2], [0, 0, 0, 2])


def test_every_request_word_is_in_the_vocabulary():
    vocab = set(world.vocabulary())
    rng = np.random.default_rng(0)
    for kind in world.TEMPLATES:
        for held in (False, True):
            assert set(world.request_text(kind, rng, held, True).split()) <= vocab


@pytest.fixture(scope="module")
def stand_in_policy(tmp_path_factory):
    from tasks.common.llm_policy import TransformersPolicy
    from tasks.common.llm_server import build_tiny_local_model

    folder = build_tiny_local_model(tmp_path_factory.mktemp("llm") / "tiny", seed=0, train_steps=0, n_embd=16,
                                    n_layer=1)
    return TransformersPolicy.from_directory(folder)


def test_paper_profile_planner_always_emits_a_legal_program(stand_in_policy):
    """The grammar constrains any LLMPolicy: an untrained local stand-in still yields accepted programs."""
    for request in ("how many red objects are in the picture", "hello there"):
        program = hub.plan(stand_in_policy, request, ["image"], instruction="")
        assert method.accepts(program), program


def test_negative_control_planner_without_the_grammar_is_caught(monkeypatch, stand_in_policy):
    monkeypatch.setattr(method, "allowed_next", lambda state, max_evidence=3: (method.EOS,)
                        if state.state != method.ACCEPTED else ())
    monkeypatch.setattr(method, "advance", lambda state, token, max_evidence=3: method.GrammarState(method.ACCEPTED))
    program = hub.plan(stand_in_policy, "hello there", [], instruction="")
    monkeypatch.undo()
    assert not method.accepts(program)


def test_paper_profile_evaluation_says_what_is_missing():
    with pytest.raises(NotImplementedError, match="lmms-eval"):
        hub.evaluate_paper_profile(None, 0, lambda f, m: None)


def test_gold_program_of_a_spoken_follow_up():
    assert gold_program(Request("followup_count", "x", True, True)) == [
        method.ASR, method.MEM_READ, method.ANSWER, method.TTS, method.EOS]


def _bow_in_subprocess(expression: str, hash_seed: str) -> str:
    code = f"from tasks.llm_orchestration import method; print({expression})"
    env = {"PYTHONHASHSEED": hash_seed, "PATH": "", "PYTHONPATH": os.getcwd()}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout


def test_hashed_bow_is_identical_across_processes():
    """Acceptance check (a)3: two processes with different string-hash salts give the same vector."""
    expression = "method.hashed_bow('image objects red circle blue square', 64)"
    assert _bow_in_subprocess(expression, "1") == _bow_in_subprocess(expression, "2")


def test_negative_control_a_salted_hash_differs_across_processes():
    expression = "[hash(w) % 64 for w in method.words('image objects red circle blue square')]"
    assert _bow_in_subprocess(expression, "1") != _bow_in_subprocess(expression, "2")


def _smoke_cfg(budgets: list[int]):
    from tasks.common.params import read_params, validate_paper_section

    cfg = validate_paper_section("llm_orchestration", read_params()["llm_orchestration"])["smoke"]
    return cfg.model_copy(update={"joint": cfg.joint.model_copy(update={"budgets": budgets,
                                                                        "oracle_budget": budgets[0]})})


def test_the_budgets_never_redraw_the_evaluation_set():
    small, large = data.make_streams(_smoke_cfg([50, 100]), 3), data.make_streams(_smoke_cfg([50, 300]), 3)
    validation = _smoke_cfg([50, 100]).joint.validation
    for name in ("qa_eval", "sessions", "images", "videos", "utterances"):
        assert small[name].equals(large[name]), name
    # the training items of the smaller top budget are a prefix of the larger one's, the validation tail is the same
    assert small["qa_train"].head(100).equals(large["qa_train"].head(100))
    assert small["qa_train"].tail(validation).equals(large["qa_train"].tail(validation))
    assert small["qa_train"].height == 100 + validation and large["qa_train"].height == 300 + validation
    assert not small["qa_eval"].equals(data.make_streams(_smoke_cfg([50, 100]), 4)["qa_eval"])  # seeded


def test_negative_control_one_generator_for_pool_and_evaluation_is_caught(monkeypatch):
    def shared(cfg, seed):  # the old layout: the pool, then the evaluation items and sessions, on one generator
        w, budget = cfg.world, max(cfg.joint.budgets) + cfg.joint.validation
        rng = np.random.default_rng([seed, 1])
        out = {name: data.pl.DataFrame(rows(rng, n, "train") + rows(rng, w.n_expert_test, "test"))
               for name, rows, n in (("images", data._image_rows, w.n_images), ("videos", data._video_rows, w.n_videos),
                                     ("utterances", data._utterance_rows, w.n_utterances))}
        out["qa_train"] = data.pl.DataFrame(data._qa_rows(rng, budget, w.held_out_fraction, w.spoken_fraction))
        out["qa_eval"] = data.pl.DataFrame(data._qa_rows(rng, w.n_qa_eval, w.held_out_fraction, w.spoken_fraction))
        out["sessions"] = data.pl.DataFrame(data._session_rows(rng, w.n_sessions, cfg))
        return out

    monkeypatch.setattr(data, "make_streams", shared)
    with pytest.raises(AssertionError):
        test_the_budgets_never_redraw_the_evaluation_set()
