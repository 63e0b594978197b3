"""edumirror paper profile (hub.py): the LLM-backed select step and Rater, with a scripted stand-in LLM and a tiny
local GPT-2 folder (never the network)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from tasks.common.params import validate_paper_section
from tasks.edumirror import hub, simulation
from tasks.edumirror.data import write_data
from tasks.edumirror.train import train
from tests.conftest import REPO

SECTION = yaml.safe_load((REPO / "params.yaml").read_text())["edumirror"]


class ScriptedLLM:
    """Answers every prompt with a fixed text; records the prompts."""

    def __init__(self, answer: str) -> None:
        self.answer = answer
        self.prompts: list[str] = []

    def generate(self, prompts, max_new_tokens, temperature=0.0, seed=0):
        self.prompts += list(prompts)
        return [self.answer] * len(prompts)

    def score(self, prompt, continuations):
        raise NotImplementedError

    def choose(self, prompt, options):
        raise NotImplementedError


def test_parse_choice():
    assert hub.parse_choice(" 3.", 5) == 2
    assert hub.parse_choice("option 9 or 2", 5) == 1
    assert hub.parse_choice("none", 5) is None and hub.parse_choice("0", 5) is None


def test_svo_labels_follow_murphys_boundaries():
    assert [hub.svo_label(t) for t in (-15, 0, 45, 75)] == ["competitive", "individualistic", "prosocial",
                                                             "altruistic"]


def view() -> simulation.AgentView:
    return simulation.AgentView(index=3, role="victim", theta=45.0, needs=(1.0, 2.0, 3.0, 4.0, 5.0),
                                memory=((0, 0, "exclude", 3),))


def test_llm_policy_selects_the_named_option_and_counts_fallbacks():
    options = [simulation.Option("study", None), simulation.Option("help", 0), simulation.Option("withdraw", None)]
    utilities = np.array([0.1, 0.5, 0.9])
    llm = ScriptedLLM("2")
    policy = hub.LLMAgentPolicy(llm, 0.7, 4)
    assert policy.select(view, options, utilities, np.random.default_rng(0)) == 1
    assert "safety 1.0" in llm.prompts[0] and "Ava exclude" in llm.prompts[0] and "2. help Ava" in llm.prompts[0]
    garbled = hub.LLMAgentPolicy(ScriptedLLM("I would rather not"), 0.7, 4)
    assert garbled.select(view, options, utilities, np.random.default_rng(0)) == 2  # highest utility
    assert (garbled.calls, garbled.fallbacks) == (1, 1)


def test_llm_rater_codes_and_counts_unparsed():
    codes, unparsed = hub.llm_code(ScriptedLLM("2"), ["x", "y"], 4)
    assert codes.tolist() == [1, 1] and unparsed == 0
    codes, unparsed = hub.llm_code(ScriptedLLM("?"), ["x"], 4)
    assert codes.tolist() == [3] and unparsed == 1


def tiny_paper_config():
    section = yaml.safe_load(yaml.safe_dump(SECTION))
    paper = section["paper"]
    paper["scenario"].update(ticks=3, branch_tick=1, slope_window=2, class_sizes=[5], sweep_scales=[1.5],
                             pg_rounds=2, pg_replicates=1, pg_thetas=[-15.0, 0.0, 45.0])
    paper["measurement"].update(corpus_size=100, rater_steps=20, survey_noise_grid=[0.5])
    paper["hub"].update(replicates=1, rater_sample=10, max_new_tokens=2)
    paper["device"] = "cpu"
    return validate_paper_section("edumirror", section)["paper"]


def test_paper_profile_runs_end_to_end_with_a_scripted_llm(tmp_path: Path):
    cfg = tiny_paper_config()
    write_data(cfg, (0,), tmp_path / "data")
    train(cfg, 0, tmp_path / "data", tmp_path / "model")
    llm = ScriptedLLM("1")
    result = hub.evaluate(cfg, 0, tmp_path / "data", tmp_path / "model", "cpu", llm=llm)
    m = result.metrics
    assert m["llm_agent_calls"] > 0 and m["llm_fallback_rate"] == 0.0
    assert m["integrity_passed"] == m["integrity_checks"]  # branching holds whatever policy selects
    assert m["llm_rater_unparsed"] == 0.0
    # every narration coded "relational aggression": kappa 0 exactly (chance agreement)
    assert m["llm_rater_kappa"] == pytest.approx(0.0, abs=1e-12)


def test_local_stand_in_model_drives_the_select_step_and_the_rater(tmp_path: Path):
    from tasks.common.llm_server import build_byte_tokenizer
    from tasks.common.tiny_lm import build_tiny_gpt2, tiny_gpt2_config

    tokenizer = build_byte_tokenizer()
    config = tiny_gpt2_config(vocab_size=len(tokenizer), n_positions=1024, n_layer=1, n_head=2, n_embd=16)
    model = build_tiny_gpt2(config, seed=0)
    model.save_pretrained(tmp_path / "tiny", safe_serialization=True)
    tokenizer.save_pretrained(tmp_path / "tiny")
    cfg = tiny_paper_config()
    llm = hub.load_policy(cfg.hub.model_copy(update={"agent_model": str(tmp_path / "tiny"), "dtype": "float32"}),
                          "cpu")
    policy = hub.LLMAgentPolicy(llm, 0.7, 2)
    options = [simulation.Option("study", None), simulation.Option("help", 0)]
    choice = policy.select(view, options, np.array([0.1, 0.5]), np.random.default_rng(0))
    assert choice in (0, 1) and policy.calls == 1
    codes, unparsed = hub.llm_code(llm, ["after class, Ava studied."], 2)
    assert codes.shape == (1,) and 0 <= codes[0] < 4 and unparsed in (0, 1)


def test_hub_config_is_paper_only():
    configs = validate_paper_section("edumirror", SECTION)
    assert configs["cpu"].hub is None and configs["paper"].hub.agent_model == "Qwen/Qwen2.5-7B-Instruct"
    bad = yaml.safe_load(yaml.safe_dump(SECTION))
    bad["paper"]["hub"]["temperature"] = -1
    with pytest.raises(Exception, match="temperature"):
        validate_paper_section("edumirror", bad)
