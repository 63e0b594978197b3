"""selfjudge steps: config errors, the toy data's invariants, claim metrics on a hand-built decoding table (with
a negative control), and the paper profile's hub code on local stand-ins (no network)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from tasks.common.params import ParamsError, validate_paper_section
from tasks.common.results import SeedResult
from tasks.selfjudge import baselines, claim_metrics, data, evaluate, hub, method
from tasks.selfjudge.baselines import RandomAcceptRule
from tasks.selfjudge.config import SelfJudgeConfig
from tests.conftest import REPO

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())["selfjudge"]


def test_profiles_validate_and_paper_uses_the_hub():
    configs = validate_paper_section("selfjudge", PARAMS)
    assert configs["paper"].hub is not None and configs["paper"].target is None
    assert all(configs[p].hub is None and configs[p].target is not None for p in ("smoke", "cpu"))


@pytest.mark.parametrize("path, value, message", [
    (("decoding", "thresholds"), [0.5, 0.3], "strictly increasing"),
    (("decoding", "top_ks"), [1, 2], "K = 1 is exact"),
    (("decoding", "decision_threshold"), 0.4, "must be one of thresholds"),
    (("target", "n_embd"), 66, "divisible by n_head"),
    (("data", "n_autojudge"), 10_000, "n_autojudge"),
])
def test_bad_values_name_their_key(path, value, message):
    section = yaml.safe_load(yaml.safe_dump(PARAMS))
    leaf = section["cpu"]
    for key in path[:-1]:
        leaf = leaf[key]
    leaf[path[-1]] = value
    with pytest.raises(ParamsError, match=message):
        validate_paper_section("selfjudge", section)


def test_hub_excludes_the_toy_pair():
    raw = yaml.safe_load(yaml.safe_dump(PARAMS["paper"]))
    raw["target"] = PARAMS["cpu"]["target"]
    with pytest.raises(ValueError, match="'hub' excludes"):
        SelfJudgeConfig.model_validate(raw)


def test_toy_data_numbers_are_computed_and_answers_check():
    rng = np.random.default_rng(3)
    for _ in range(200):
        prompt, response, answer = data.arithmetic_example(rng, int(rng.integers(2, 5)))
        assert data.answer_of(response) == answer and response[-1] == "<eos>"
        numbers = [int(w) for w in response if w in data.NUMBERS]
        for a, b, c in zip(numbers[0:-1:3], numbers[1::3], numbers[2::3]):  # "a op b is c" triples
            assert c in (a + b, a - b) and 0 <= c <= data.MAX_NUMBER
    prompt, response, slots = data.description_example(rng)
    assert data.slots_preserved(response, slots)
    assert not data.slots_preserved([w if w != slots[1] else "purple" for w in response], slots)
    assert not data.slots_preserved(response + ["huge" if slots[0] != "huge" else "tiny"], slots)


def test_mismatch_kinds():
    assert data.mismatch_kind("plus", "add") == "style" and data.mismatch_kind("is", "makes") == "style"
    assert data.mismatch_kind("well", "first") == "style"
    assert data.mismatch_kind("7", "8") == "meaning" and data.mismatch_kind("plus", "minus") == "meaning"
    assert data.mismatch_kind("red", "blue") == "meaning" and data.mismatch_kind(".", "the") == "other"


def decoding_table() -> list[dict]:
    def r(method_name, family, knob, tpc, acc, accepted=10, drafted=40, identical=10):
        return {"task": "arith", "method": method_name, "family": family, "knob": knob, "prompts": 10,
                "tokens_per_call": tpc, "accuracy": acc, "correct": round(acc * 10), "accepted_draft": accepted,
                "drafted": drafted, "acceptance_rate": accepted / drafted, "identical_to_target": identical}
    return [r("exact", "exact", 0, 2.0, 0.9), r("top2", "topk", 2, 2.5, 0.6, identical=3),
            r("selfjudge@0", "selfjudge", 0, 2.0, 0.9), r("selfjudge@0.5", "selfjudge", 0.5, 3.0, 0.8, identical=4),
            r("selfjudge@1", "selfjudge", 1, 4.0, 0.2, identical=0),
            r("autojudge@0.5", "autojudge", 0.5, 3.5, 0.4, identical=2)]


def claim_numbers() -> dict[str, float]:
    cfg = SelfJudgeConfig.model_validate(PARAMS["cpu"])
    return claim_metrics.claim_metrics(cfg, SeedResult(0).add(tables={"decoding": decoding_table()}))


def test_claim_metrics_exact_values():
    m = claim_numbers()
    assert m["arith_judge_speedup"] == pytest.approx(1.5)
    assert m["arith_judge_accuracy_change"] == pytest.approx(-0.1)
    assert m["arith_exact_acceptance_rate"] == pytest.approx(0.25)
    assert m["arith_topk_accuracy_drop"] == pytest.approx(0.3)
    # judge sweep (2, 0.9), (3, 0.8), (4, 0.2): at 2.5 -> 0.85, minus top-2's 0.6
    assert m["arith_judge_minus_topk_at_equal_speed"] == pytest.approx(0.25)
    # at AutoJudge's 3.5 -> 0.5, minus 0.4
    assert m["arith_judge_minus_autojudge_at_equal_speed"] == pytest.approx(0.1)
    assert m["arith_lossless_violations"] == 0 and m["lossless_violations"] == 0


def test_negative_control_nearest_point_instead_of_interpolation(monkeypatch):
    monkeypatch.setattr(method, "accuracy_at_speed", lambda pts, s: min(pts, key=lambda p: abs(p[0] - s))[1])
    assert claim_numbers()["arith_judge_minus_topk_at_equal_speed"] != pytest.approx(0.25)


def test_speed_bracket_gap_exact_values():
    # judge sweep speeds 2, 3, 4 (plus exact's 2 at threshold 0): top-2 at 2.5 and AutoJudge at 3.5 each sit
    # between two points 1 token per call apart
    m = claim_numbers()
    assert m["arith_topk_speed_bracket_gap"] == pytest.approx(1.0)
    assert m["arith_autojudge_speed_bracket_gap"] == pytest.approx(1.0)
    points = [(2.0, 0.9), (2.2, 0.9), (4.4, 0.1), (7.0, 0.05)]
    assert claim_metrics.bracket_gap(points, 3.2) == pytest.approx(2.2)
    assert claim_metrics.bracket_gap(points, 2.1) == pytest.approx(0.2)
    assert claim_metrics.bracket_gap(points, 4.4) == 0.0
    assert math.isnan(claim_metrics.bracket_gap(points, 1.9)) and math.isnan(claim_metrics.bracket_gap(points, 7.5))


def test_negative_control_bracket_gap_over_the_whole_sweep(monkeypatch):
    # a gap measured over the whole sweep (first to last point) would call every comparison coarse
    monkeypatch.setattr(claim_metrics, "bracket_gap", lambda pts, s: max(p[0] for p in pts) - min(p[0] for p in pts))
    assert claim_numbers()["arith_topk_speed_bracket_gap"] != pytest.approx(1.0)


def test_a_lossless_violation_is_counted():
    table = decoding_table()
    table[2]["identical_to_target"] = 7
    cfg = SelfJudgeConfig.model_validate(PARAMS["cpu"])
    m = claim_metrics.claim_metrics(cfg, SeedResult(0).add(tables={"decoding": table}))
    assert m["lossless_violations"] == 3


# ---------------------------------------------------------------------------------------------- paper profile

def test_load_prompts_maps_each_benchmark(monkeypatch):
    rows = {"openai/gsm8k": [{"question": "2+3?", "answer": "so 5\n#### 5"}],
            "cais/mmlu": [{"question": "Q", "choices": ["a", "b", "c", "d"], "answer": 2}],
            "HuggingFaceH4/MATH-500": [{"problem": "x?", "answer": " 7 "}]}
    calls = []

    def loader(name, *args, split):
        calls.append((name, args, split))
        return rows[name]

    assert hub.load_prompts("openai/gsm8k", 5, loader) == [{"prompt": "2+3?", "reference": "5"}]
    mmlu = hub.load_prompts("cais/mmlu", 5, loader)[0]
    assert mmlu["reference"] == "C" and "C. c" in mmlu["prompt"]
    assert hub.load_prompts("HuggingFaceH4/MATH-500", 5, loader)[0]["reference"] == "7"
    assert calls[0] == ("openai/gsm8k", ("main",), "test") and calls[2] == ("HuggingFaceH4/MATH-500", (), "test")
    with pytest.raises(ValueError, match="unknown dataset"):
        hub.load_prompts("nope/nothing", 1, loader)


def test_final_answer():
    assert hub.final_answer("so 3 + 4 = 7, the answer is 1,234.") == "1234"
    assert hub.final_answer("The answer is B") == "B"
    assert hub.final_answer("no number") is None


def stand_in_pair(tmp_path: Path) -> tuple[str, str]:
    """A word-level tokenizer and two tiny GPT-2s saved locally, loadable by 'hub name' (a path)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    from tasks.common import tiny_lm

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(data.VOCAB)}, unk_token="<eos>"))
    tok.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="<eos>")
    dirs = []
    for name, seed in (("draft", 1), ("target", 2)):
        config = tiny_lm.tiny_gpt2_config(len(data.VOCAB), 128, 1, 2, 16)
        config.tie_word_embeddings, config.initializer_range = False, 0.5
        model = tiny_lm.build_tiny_gpt2(config, seed)
        model.save_pretrained(tmp_path / name)
        fast.save_pretrained(tmp_path / name)
        dirs.append(str(tmp_path / name))
    return dirs[0], dirs[1]


def test_hub_steps_run_on_local_stand_ins(tmp_path, monkeypatch):
    draft, target = stand_in_pair(tmp_path)
    raw = yaml.safe_load(yaml.safe_dump(PARAMS["paper"]))
    raw["hub"] |= {"draft": draft, "target": target, "mine_datasets": ["openai/gsm8k"],
                   "eval_datasets": ["openai/gsm8k"], "n_mine": 6, "n_eval": 3, "dtype": "float32"}
    raw["decoding"] |= {"max_new_tokens": 12, "gamma": 4}
    raw["device"] = "cpu"
    cfg = SelfJudgeConfig.model_validate(raw)
    prompts = [{"prompt": f"<math> tom has {i} apples , buys 2 .", "reference": str(i + 2)} for i in range(6)]
    monkeypatch.setattr(hub, "load_prompts", lambda name, n, loader=None: prompts[:n])
    trained = hub.train_hub(cfg, 0, tmp_path, tmp_path / "models", "cpu", lambda f, s: None)
    assert trained.metrics["hub_mismatches"] > 0 and (tmp_path / "models" / "heads.npz").is_file()
    evaluated = hub.evaluate_hub(cfg, 0, tmp_path, tmp_path / "models", "cpu", lambda f, s: None)
    rows = {r["method"]: r for r in evaluated.tables["decoding"]}
    assert set(rows) == {"exact", "top2", "top3"} | {f"selfjudge@{t:g}" for t in cfg.decoding.thresholds}
    assert rows["exact"]["tokens"] == rows["selfjudge@0"]["tokens"]
    assert all(r["tokens_per_call"] >= 1 and not math.isnan(r["accuracy"]) for r in rows.values())


# ---------------------------------------------------------------------------------- random-acceptance control

def mismatch_window(n: int) -> method.Window:
    """n draft tokens, every odd position a mismatch (draft 1 where the target wants 2)."""
    proposal = [1 if i % 2 else 3 for i in range(n)]
    argmax = [2 if i % 2 else 3 for i in range(n)] + [0]
    return method.Window(proposal, argmax, [(t,) for t in argmax], [None] * (n + 1))


def test_random_accept_rule_exact_values():
    window = mismatch_window(4)  # match [T, F, T, F]
    u = np.random.default_rng(5).random(2)  # one draw per mismatch, in order
    assert RandomAcceptRule(0.4, seed=5)(window) == [True, bool(u[0] < 0.4), True, bool(u[1] < 0.4)]
    assert RandomAcceptRule(0.0, seed=1)(window) == [True, False, True, False]  # q = 0: exact decoding
    assert RandomAcceptRule(1.0, seed=1)(window) == [True] * 4  # q = 1: accept every draft token
    with pytest.raises(ValueError, match="q must lie"):
        RandomAcceptRule(1.5, seed=0)


def random_acceptance_rate(q: float) -> float:
    mask = RandomAcceptRule(q, seed=0)(mismatch_window(20000))
    return float(np.mean(mask[1::2]))  # the mismatch positions only


def test_random_accept_rule_accepts_mismatches_at_rate_q():
    assert random_acceptance_rate(0.3) == pytest.approx(0.3, abs=0.02)  # 10000 draws: sd 0.005


def test_negative_control_inverted_random_comparison_is_caught(monkeypatch):
    monkeypatch.setattr(baselines, "judge_accept_mask",
                        lambda match, probs, t: [bool(m) or p >= t for m, p in zip(match, probs)])
    assert random_acceptance_rate(0.3) != pytest.approx(0.3, abs=0.02)


def test_evaluation_runs_the_random_control_on_the_threshold_grid():
    cfg = SelfJudgeConfig.model_validate(PARAMS["cpu"])
    head = method.JudgeHead(np.zeros(2), np.ones(2), np.ones(2), 0.0)
    names = [name for name, family, _, _ in evaluate.methods_for("arith", cfg, {"selfjudge_arith": head})
             if family == "random"]
    assert names == [f"random@{q:g}" for q in cfg.decoding.thresholds]
