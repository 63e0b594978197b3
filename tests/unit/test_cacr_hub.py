"""cacr's paper-profile code with local stand-ins: benchmark parsers, second-to-frame mapping, the policy's
prompt and answer parsing, the text reward, and VBCS on a tiny randomly initialised CLIP."""

from __future__ import annotations

import json

import pytest
import torch

from tasks.cacr import hub


def test_seconds_to_frames():
    assert hub.seconds_to_frames(10.0, 20.0, 100.0, 50) == (5, 9)     # 2 s per frame: [10, 20) -> frames 5..9
    assert hub.seconds_to_frames(0.0, 100.0, 100.0, 50) == (0, 49)
    assert hub.seconds_to_frames(99.0, 99.5, 100.0, 50) == (49, 49)


def test_benchmark_parsers(tmp_path):
    tagv = tmp_path / "medvidqa.json"
    tagv.write_text(json.dumps([{"video_id": "v1", "question": "how to splint a finger", "answer_start_second": 12.5,
                                 "answer_end_second": 40, "video_length": 120}]))
    assert hub.load_tagv_json(tagv, "medvidqa") == [hub.GroundingItem("medvidqa", "v1", "how to splint a finger",
                                                                       12.5, 40.0, 120.0)]
    sta = tmp_path / "charades_sta_test.txt"
    sta.write_text("3MSZA 24.3 30.4##person turns on the light.\n\nAB12C 0.0 5.1##a person opens a door.\n")
    items = hub.load_charades_sta(sta, {"3MSZA": 31.0, "AB12C": 20.0})
    assert [(i.video, i.start_s, i.end_s, i.duration_s) for i in items] == [("3MSZA", 24.3, 30.4, 31.0),
                                                                           ("AB12C", 0.0, 5.1, 20.0)]
    assert items[0].question == "person turns on the light."
    anet = tmp_path / "val_1.json"
    anet.write_text(json.dumps({"v_x": {"duration": 60.0, "timestamps": [[0, 10], [20, 30]],
                                        "sentences": ["A man talks.", " He jumps."]}}))
    items = hub.load_activitynet_captions(anet)
    assert [(i.question, i.start_s, i.end_s) for i in items] == [("A man talks.", 0.0, 10.0), ("He jumps.", 20.0, 30.0)]


CANDS = torch.tensor([[10, 15], [30, 40]])


def test_prompt_and_answer_parsing():
    prompt = hub.build_prompt("what happens after the cut?", CANDS, 64, 2)
    assert "1. frames 10-15" in prompt and "2. frames 30-40" in prompt and "what happens after the cut?" in prompt
    assert hub.parse_answer("so <answer>2 -2 1</answer>", CANDS, 64, 2) == ((28, 41), False)
    assert hub.parse_answer("<answer>REJECT 50 44</answer>", CANDS, 64, 2) == ((44, 50), True)
    assert hub.parse_answer("<answer>3 0 0</answer>", CANDS, 64, 2) is None       # no third candidate
    assert hub.parse_answer("<answer>1 3 0</answer>", CANDS, 64, 2) is None       # offset out of range
    assert hub.parse_answer("<answer>reject 70 2</answer>", CANDS, 64, 2) is None  # frame out of range
    assert hub.parse_answer("frames 10 to 15", CANDS, 64, 2) is None


def test_text_reward():
    # gt [44, 50] is a miss (best candidate tIoU 0): reject with the exact span earns 1 + alpha + format
    assert hub.text_reward("<answer>reject 44 50</answer>", (44, 50), CANDS, 64, 2, 0.5, 0.3, 0.1) == pytest.approx(1.6)
    # accepting candidate 1 [10,15] on that miss: tIoU 0, wrong decision, format only
    assert hub.text_reward("<answer>1 0 0</answer>", (44, 50), CANDS, 64, 2, 0.5, 0.3, 0.1) == pytest.approx(0.1)
    assert hub.text_reward("no answer", (44, 50), CANDS, 64, 2, 0.5, 0.3, 0.1) == 0.0


def test_clip_vbcs_with_a_tiny_local_clip():
    from transformers import CLIPConfig, CLIPModel

    config = CLIPConfig(text_config={"vocab_size": 50, "hidden_size": 16, "intermediate_size": 32,
                                     "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 16},
                        vision_config={"image_size": 16, "patch_size": 8, "hidden_size": 16, "intermediate_size": 32,
                                       "num_hidden_layers": 1, "num_attention_heads": 2},
                        projection_dim=8)
    torch.manual_seed(0)
    model = CLIPModel(config).eval()
    frames = torch.randn(12, 3, 16, 16)
    text = {"input_ids": torch.tensor([[1, 5, 7, 2]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    cands, scores = hub.clip_vbcs(model, frames, text, [3, 5], 0.5, 3)
    assert cands.shape == (3, 2) and torch.all(cands[:, 0] <= cands[:, 1]) and torch.all(scores[:-1] >= scores[1:])
