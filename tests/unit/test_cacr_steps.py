"""cacr's data generator (the acceptance checks of the procedural videos), the claim metrics by hand, and the
training/evaluation steps on a tiny profile."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tasks.cacr import claim_metrics, data, evaluate, train
from tasks.cacr.config import ACTIONS, CacrConfig
from tasks.common.params import ParamsError, resolve_run, validate_paper_section
from tasks.common.results import SeedResult
from tests.conftest import REPO


def smoke_config() -> CacrConfig:
    return resolve_run("cacr", "smoke").config


def test_generator_is_seeded_and_well_formed():
    cfg = smoke_config()
    a, b = data.make_split(cfg, 5), data.make_split(cfg, 5)
    assert all(a[k].equals(b[k]) for k in a)
    assert not a["train_videos"].equals(data.make_split(cfg, 6)["train_videos"])
    for video in a["train_videos"].to_dicts():
        steps = data.steps_of(video)
        lengths = [s.end - s.start + 1 for s in steps]
        assert sum(lengths) == cfg.data.frames and all(3 <= n <= 8 for n in lengths)
        assert all(s.start == p.end + 1 for p, s in zip(steps, steps[1:]))
        assert all((s.obj, s.act) != (p.obj, p.act) for p, s in zip(steps, steps[1:]))


def test_each_question_has_exactly_one_answer_step():
    cfg = smoke_config()
    frames = data.make_split(cfg, 1)
    videos = {v["video"]: data.steps_of(v) for v in frames["train_videos"].to_dicts()}
    seen = set()
    for q in frames["train_questions"].to_dicts():
        steps = videos[q["video"]]
        seen.add(q["qtype"])
        occurrences = [i for i, s in enumerate(steps) if (s.obj, s.act) == (q["obj"], q["act"])]
        if q["qtype"] == "ordinal":
            k = data.ORDINAL_WORDS.index(q["relation"])
            assert len(occurrences) >= 2 and q["answer_step"] == occurrences[k]   # k-th in time order
        else:
            assert occurrences == [q["ref_step"]]                                 # the referenced step is unique
            shift = {"direct": 0, "after": 1, "before": -1}[q["qtype"]]
            assert q["answer_step"] == q["ref_step"] + shift
        answer = steps[q["answer_step"]]
        assert (q["gt_start"], q["gt_end"]) == (answer.start, answer.end)
    assert seen == {"direct", "after", "before", "ordinal"}


def test_question_options_by_hand():
    S = data.Step
    steps = [S(0, 0, 0, 3), S(1, 1, 4, 9), S(0, 0, 10, 14), S(2, 2, 15, 20)]
    options = data.question_options(steps)
    as_tuples = sorted((o["qtype"], o["relation"], o["answer_step"]) for o in options)
    assert as_tuples == sorted([("ordinal", "first", 0), ("ordinal", "second", 2),
                                ("direct", "when", 1), ("after", "after", 2), ("before", "before", 0),
                                ("direct", "when", 3), ("before", "before", 2)])


def test_render_motion_and_labels():
    S = data.Step
    steps = [S(0, ACTIONS.index("right"), 0, 2), S(1, ACTIONS.index("blink"), 3, 5)]
    video = data.render_video(steps, 0, 0, 8)
    assert video.shape == (6, 3, 8, 8)
    red = video[:, 0] > 0
    assert red[0, 0, 1] and not red[0, 0, 0] and red[1, 0, 2]          # moved one pixel right per frame
    assert video[3].sum() > 0 and video[4].sum() == 0 and video[5].sum() > 0   # blink: every other frame
    assert data.frame_labels(steps).tolist() == [1, 1, 1, 11, 11, 11]   # obj * 6 + act


def test_step_lengths_respect_bounds():
    cfg = smoke_config()
    rng = np.random.default_rng(0)
    for _ in range(50):
        lengths = data.step_lengths(rng, cfg.data)
        assert sum(lengths) == cfg.data.frames and min(lengths) >= 3 and max(lengths) <= 8
        assert cfg.data.min_steps <= len(lengths) <= cfg.data.max_steps


def test_claim_metrics_by_hand():
    m = {"candidate_recall_0.5": 0.7, "top1_r1_0.5": 0.3, "grpo_full_miou": 0.6, "top1_miou": 0.25,
         "dense_miou": 0.5, "grpo_full_r1_0.5": 0.62, "dense_r1_0.5": 0.55, "grpo_full_miou_miss": 0.45,
         "grpo_no_action_miou_miss": 0.1, "grpo_no_action_miou": 0.5, "candidate_miss_count": 40.0,
         "grpo_full_false_grounding_count": 4.0, "grpo_no_reward_false_grounding_count": 10.0,
         "sft_false_grounding_count": 6.0, "grpo_full_reject_correct_count": 160.0, "test_questions": 200.0,
         "sft_miou": 0.58, "grpo_no_reward_miou_miss": 0.4}
    out = claim_metrics.claim_metrics(smoke_config(), SeedResult(0).add(m))
    assert out["candidate_recall_gain_r05"] == pytest.approx(0.4)
    assert out["full_minus_top1_miou"] == pytest.approx(0.35)
    assert out["full_minus_dense_miou"] == pytest.approx(0.1)
    assert out["full_minus_top1_r05"] == pytest.approx(0.32) and out["full_minus_dense_r05"] == pytest.approx(0.07)
    assert out["full_minus_no_action_miou_miss"] == pytest.approx(0.35)
    assert out["full_minus_no_action_miou"] == pytest.approx(0.1)
    assert out["no_reward_minus_full_false_grounding"] == pytest.approx(10 / 40 - 4 / 40)
    assert out["no_reward_false_grounding_rate"] == 0.25 and out["sft_false_grounding_rate"] == 0.15
    assert out["full_reject_accuracy"] == 0.8 and out["full_minus_sft_miou"] == pytest.approx(0.02)
    out = claim_metrics.claim_metrics(smoke_config(), SeedResult(0).add({**m, "candidate_miss_count": 0.0}))
    assert math.isnan(out["full_false_grounding_rate"])


def test_bad_params_name_the_key():
    import yaml
    section = yaml.safe_load((REPO / "params.yaml").read_text())["cacr"]
    section["cpu"]["vbcs"]["window_lengths"] = [3, 80]
    with pytest.raises(ParamsError, match="cacr.cpu"):
        validate_paper_section("cacr", section)
    section = yaml.safe_load((REPO / "params.yaml").read_text())["cacr"]
    section["cpu"]["data"]["frames"] = 100         # 8 steps of <= 8 frames cannot fill 100 frames
    with pytest.raises(ParamsError, match="cacr.cpu.data"):
        validate_paper_section("cacr", section)


def test_paper_profile_refuses_to_train(tmp_path):
    cfg = resolve_run("cacr", "paper").config
    with pytest.raises(NotImplementedError, match="Qwen2.5-VL"):
        train.train(cfg, 0, tmp_path, tmp_path)


def test_train_and_evaluate_smoke(tmp_path):
    cfg = smoke_config()
    data.write_data(cfg, (0,), tmp_path)
    trained = train.train(cfg, 0, tmp_path, tmp_path / "m")
    assert trained.curves["sft_loss"][-1] < trained.curves["sft_loss"][0]
    result = evaluate.evaluate(cfg, 0, tmp_path, tmp_path / "m")
    m = result.metrics
    for name in evaluate.METHODS:
        assert 0.0 <= m[f"{name}_miou"] <= 1.0
        assert m[f"{name}_r1_0.3"] >= m[f"{name}_r1_0.5"] >= m[f"{name}_r1_0.7"]
    assert m["candidate_hit_count"] + m["candidate_miss_count"] == m["test_questions"]
    assert m["grpo_no_action_reject_rate"] == 0.0 and m["top1_reject_rate"] == 0.0
    # no-reject policies ground every miss on a candidate
    assert m["grpo_no_action_false_grounding_count"] == m["candidate_miss_count"]
    assert m["candidate_recall_0.3"] >= m["candidate_recall_0.5"] >= m["candidate_recall_0.7"]
    # the top-1 baseline is the first candidate, and candidates bound it: recall@K >= R@1 of top-1
    assert m["candidate_recall_0.5"] >= m["top1_r1_0.5"]
