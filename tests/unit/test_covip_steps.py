"""covip steps at the smoke profile (data -> train -> evaluate -> claim metrics -> figures), the config's
error path, and the paper profile's judge-side reward with a local stand-in judge."""

from __future__ import annotations

import math

import pytest

from tasks.common.params import ParamsError, resolve_run
from tasks.common.results import SeedResult
from tasks.covip import claim_metrics as claim_metrics_module
from tasks.covip import data, hub, method
from tasks.covip.claim_metrics import claim_metrics
from tasks.covip.config import CovipConfig
from tasks.covip.evaluate import evaluate
from tasks.covip.figures import make_figures
from tasks.covip.train import train


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    cfg = resolve_run("covip", "smoke").config
    root = tmp_path_factory.mktemp("covip")
    data.write_data(cfg, (0,), root / "data")
    trained = train(cfg, 0, root / "data", root / "models")
    evaluated = evaluate(cfg, 0, root / "data", root / "models")
    return cfg, root, trained, evaluated


def test_smoke_steps_produce_finite_metrics_in_range(smoke_run):
    cfg, root, trained, evaluated = smoke_run
    m = evaluated.metrics
    for name in ("sft", "grpo", "sft_more", "blind_grpo", "recite_all", "random_subset", "correct"):
        assert 0 <= m[f"{name}_gt_acc"] <= 1 and 0 <= m[f"{name}_noisy_acc"] <= 1
        assert -1 <= m[f"{name}_reward"] <= cfg.data.max_present
    assert m["correct_reward"] == pytest.approx(1.0) and m["correct_gt_acc"] == 1.0 and m["correct_noisy_acc"] == 1.0
    assert m["recite_all_noisy_acc"] == 0.0 and m["empty_gt_acc"] == 0.0
    assert len(trained.curves["grpo_reward"]) == cfg.grpo.steps
    claims = claim_metrics(cfg, trained.merged(evaluated))
    assert claims["sft_headroom"] == pytest.approx(1.0 - m["sft_reward"])
    assert claims["sft_val_gt_acc_minus_stop"] == pytest.approx(trained.metrics["sft_val_gt_acc"] - cfg.sft.stop_gt_acc)
    assert all(math.isfinite(v) or k == "swap_follow_rate" for k, v in claims.items())
    paths = make_figures(cfg, [trained.merged(evaluated)], root / "figures", root / "plots")
    assert all(p.exists() for p in paths)


def test_bad_params_name_the_key():
    with pytest.raises(ValueError, match="max_present"):
        CovipConfig.model_validate({"reward": {"length_limit": 13, "min_sentences": 2, "ngram_n": 3},
                                    "data": {"n_context": 3, "max_present": 3, "n_train": 100, "n_test": 100,
                                             "n_names": 40, "n_places": 20, "n_events": 20, "jitter": 0,
                                             "noise_sd": 0.0}})
    with pytest.raises((ParamsError, ValueError)):
        resolve_run("covip", "smoke", seeds=[-1])


class StandInJudge:
    """A local stand-in for the LLM judge: answers each prompt with a fixed reply, in order."""

    def __init__(self, replies):
        self.replies, self.prompts = list(replies), []

    def generate(self, prompts, max_new_tokens, temperature=0.0, seed=0):
        self.prompts += list(prompts)
        out, self.replies = self.replies[:len(prompts)], self.replies[len(prompts):]
        return out

    def score(self, prompt, continuations):
        raise NotImplementedError

    def choose(self, prompt, options):
        raise NotImplementedError


def test_paper_judge_reward_with_a_stand_in_judge():
    cfg = resolve_run("covip", "paper").config
    options = {"A": "Seoul", "B": "Busan", "C": "Jeju", "D": "The answer cannot be determined"}
    present = [{"question": f"q{i}", "options": options, "correct_answer": "A"} for i in range(3)]
    absent = [{"question": f"r{i}", "options": options, "correct_answer": "D"} for i in range(2)]
    # two of three present QAs right (2/3), one of two absent QAs answered non-D (-1/2)
    judge = StandInJudge(["so \\boxed{A}", "\\boxed{ B }", "\\boxed{A} then \\boxed{C}", "no box", "\\boxed{C}"])
    value = hub.judged_caption_reward(judge, "Minji at Seoul.", present, absent, cfg.hub, length_in_tokens=5)
    assert value == pytest.approx(2 / 3 - 1 / 2)
    assert "[Description]\n    Minji at Seoul.\n" in judge.prompts[0]
    assert "D. The answer cannot be determined" in judge.prompts[0]
    assert hub.judged_caption_reward(StandInJudge([]), "x", present, absent, cfg.hub, length_in_tokens=600) == -1.0
    assert method.has_heavy_repetition("a b . a b . a b . c d .".split())


def test_paper_benchmark_loader_reads_a_local_stand_in(tmp_path):
    (tmp_path / "test.jsonl").write_text('{"caption": "a"}\n{"caption": "b"}\n')
    ds = hub.load_benchmark("json", split="train", data_files=str(tmp_path / "test.jsonl"))
    assert ds["caption"] == ["a", "b"]
    assert hub.lora_settings(resolve_run("covip", "paper").config.hub)["r"] == 64


def _measured(**overrides: float) -> SeedResult:
    """Evaluation + training metrics of one seed with hand-set, distinct values (non-degenerate)."""
    values = {"correct": (1.0, 1.0, 1.0, 1.0), "sft": (-0.20, 0.30, 0.70, 0.35), "grpo": (-0.05, 0.40, 0.80, 0.45),
              "sft_more": (-0.15, 0.35, 0.72, 0.40), "recite_all": (-0.30, 1.0, 0.0, 0.30),
              "random_subset": (-0.20, 0.31, 0.65, 0.31), "blind_grpo": (-0.10, 0.09, 0.76, 0.28),
              "empty": (0.0, 0.0, 1.0, 0.0)}
    m = {f"{name}_{field}": v for name, vals in values.items()
         for field, v in zip(("reward", "gt_acc", "noisy_acc", "cag_f1"), vals)}
    m.update(swap_grpo_new_facts=30, swap_grpo_old_facts=10, sft_val_gt_acc=0.42, **overrides)
    return SeedResult(0).add(m)


def test_claim_metrics_exact_gate_and_empty_control():
    cfg = resolve_run("covip", "cpu").config
    c = claim_metrics(cfg, _measured())
    assert c["sft_val_gt_acc_minus_stop"] == pytest.approx(0.42 - cfg.sft.stop_gt_acc)
    # the empty caption (reward 0.0, CAG F1 0.0) is the best control on reward: GRPO -0.05 loses to it
    assert c["grpo_minus_best_control_reward"] == pytest.approx(-0.05)
    assert c["grpo_minus_best_control_cag_f1"] == pytest.approx(0.45 - 0.31)
    assert c["grpo_minus_sft_gt_acc"] == pytest.approx(0.10)
    assert c["swap_follow_rate"] == pytest.approx(0.75) and c["swap_grpo_facts"] == 40


def test_negative_control_dropping_the_empty_control_is_caught(monkeypatch):
    """Without the empty caption among the controls, GRPO (-0.05) would beat every control (best -0.10)."""
    cfg = resolve_run("covip", "cpu").config
    monkeypatch.setattr(claim_metrics_module, "CONTROLS", ("recite_all", "random_subset", "blind_grpo"))
    assert claim_metrics(cfg, _measured())["grpo_minus_best_control_reward"] == pytest.approx(0.05)


OPTIONS = {"A": "Seoul", "B": "Busan", "C": "Jeju", "D": "The answer cannot be determined"}


def test_paper_judge_uses_the_official_containment_rule():
    """Official return_answer(a1, a) is `a in a1`: a boxed reply 'D. The answer cannot be determined' counts as D
    and 'A. Seoul' as A. One present QA (answer A) and two absent QAs: r = 1/3 + 0 (both absent replies hold D)."""
    cfg = resolve_run("covip", "paper").config
    present = [{"question": "q0", "options": OPTIONS, "correct_answer": "A"}]
    absent = [{"question": f"r{i}", "options": OPTIONS, "correct_answer": "D"} for i in range(2)]
    judge = StandInJudge(["\\boxed{A. Seoul}", "\\boxed{D. The answer cannot be determined}", "\\boxed{D}"])
    assert hub.judged_caption_reward(judge, "Minji at Seoul.", present, absent, cfg.hub, 5) == pytest.approx(1 / 3)
    assert hub.contained_letters(["A. Seoul", " B ", "C"], ["A", "A", "C"]) == ["A", " B ", "C"]


def test_negative_control_equality_matching_is_caught(monkeypatch):
    """With letter equality instead of containment (the earlier port), the same replies score 0 - 1/2."""
    cfg = resolve_run("covip", "paper").config
    monkeypatch.setattr(hub, "contained_letters", lambda replies, expected: list(replies))
    present = [{"question": "q0", "options": OPTIONS, "correct_answer": "A"}]
    absent = [{"question": f"r{i}", "options": OPTIONS, "correct_answer": "D"} for i in range(2)]
    judge = StandInJudge(["\\boxed{A. Seoul}", "\\boxed{D. The answer cannot be determined}", "\\boxed{D}"])
    assert hub.judged_caption_reward(judge, "Minji at Seoul.", present, absent, cfg.hub, 5) == pytest.approx(-0.5)


def test_paper_judge_prompt_and_sampling_follow_the_official_code():
    prompt = hub.judge_prompt("Minji at Seoul.", "Where was Minji met?", OPTIONS)
    assert prompt.startswith("You are given a description about an object. This description may or may not")
    assert "        Answer: \\boxed{X}\n" in prompt and "5. Inside \\boxed{} there must be EXACTLY ONE letter" in prompt
    assert prompt.endswith("    [Description]\n    Minji at Seoul.\n\n    [Question]\n    Question: Where was Minji "
                           "met?\nA. Seoul\nB. Busan\nC. Jeju\nD. The answer cannot be determined\n")

    class Client:  # stand-in for openai.OpenAI: records each chat.completions.create call
        def __init__(self):
            self.calls = []
            self.chat = self
            self.completions = self

        def create(self, **kwargs):
            self.calls.append(kwargs)
            message = type("M", (), {"content": "  Answer: \\boxed{A}  "})
            return type("R", (), {"choices": [type("C", (), {"message": message})]})

    hub_cfg = resolve_run("covip", "paper").config.hub
    client = Client()
    judge = hub.OfficialJudge(hub_cfg, client)
    questions = [{"question": "q", "options": OPTIONS}] * 2
    assert hub.judge_letters(judge, "Minji at Seoul.", questions, hub_cfg) == ["A", "A"]
    call = client.calls[1]
    assert call["temperature"] == 0.7 and call["top_p"] == 0.8 and call["extra_body"] == {"top_k": 20, "min_p": 0.0}
    assert call["model"] == "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8" and call["seed"] == 1
    message = call["messages"][0]
    assert message["role"] == "user" and message["content"].endswith("D. The answer cannot be determined\n")
