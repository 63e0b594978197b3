"""The paper profile of quatro (tasks/quatro/hub.py) end to end on local stand-ins: a tiny GPT-2 with a word-level
tokenizer saved to disk, and a local parquet dataset of math problems, through data, train and evaluate."""

from __future__ import annotations

import polars as pl
import pytest
import torch
import yaml
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tasks.common.tiny_lm import build_tiny_gpt2, tiny_gpt2_config
from tasks.quatro import data, evaluate, hub, train
from tasks.quatro.config import QuatroConfig
from tests.conftest import REPO

WORDS = ["<pad>", "<eos>", "What", "is", "1+1", "2+2", "?", "\\boxed{2}", "\\boxed{4}", "Please", "reason", "step",
         "by", "and", "put", "your", "final", "answer", "within", "\\boxed{}.", "x"]


def test_extract_and_normalise_boxed_answers():
    assert hub.extract_boxed("so \\boxed{\\frac{1}{2}} and \\boxed{3}") == "3"
    assert hub.extract_boxed("x \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert hub.extract_boxed("no box") is None and hub.extract_boxed("\\boxed{open") is None
    assert hub.normalise_answer(" $\\dfrac{1}{2}$. ") == "\\frac{1}{2}"
    assert hub.math_rewards(["\\boxed{ 4 }", "\\boxed{5}", "4"], ["4", "4", "4"]).tolist() == [1.0, 0.0, 0.0]


@pytest.fixture()
def stand_ins(tmp_path):
    vocab = {w: i for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="x"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    model = build_tiny_gpt2(tiny_gpt2_config(len(WORDS), 64, n_layer=1, n_head=2, n_embd=16), seed=0)
    model.config.eos_token_id, model.config.pad_token_id = 1, 0
    model.save_pretrained(tmp_path / "policy")
    fast.save_pretrained(tmp_path / "policy")
    ds = tmp_path / "math"
    ds.mkdir()
    rows = {"problem": ["What is 1+1 ?", "What is 2+2 ?"] * 3, "solution": ["\\boxed{2}", "\\boxed{4}"] * 3}
    pl.DataFrame(rows).write_parquet(ds / "train.parquet")
    pl.DataFrame(rows).write_parquet(ds / "test.parquet")
    section = yaml.safe_load((REPO / "params.yaml").read_text())["quatro"]["paper"]
    section["rl"] |= {"steps": 2, "prompts_per_step": 2, "group_size": 2, "cells": [[1, 1e-3], [2, 1e-3]],
                      "algorithms": ["grpo", "quatro"]}
    section["eval"] = {"samples_per_prompt": 2, "ks": [1, 2]}
    section["hub"] |= {"model": str(tmp_path / "policy"), "train_dataset": str(ds), "eval_datasets": [str(ds)],
                       "max_new_tokens": 3, "max_prompts": 4}
    section["device"] = "cpu"
    return QuatroConfig(**section), tmp_path


def test_paper_profile_runs_data_train_evaluate_on_stand_ins(stand_ins):
    cfg, tmp = stand_ins
    written = data.write_data(cfg, (0,), tmp / "data")
    assert {p.name for p in written} == {"hub_train_seed0.parquet", "hub_eval_math.parquet"}
    rows = pl.read_parquet(tmp / "data" / "hub_train_seed0.parquet").to_dicts()
    assert len(rows) == 4 and {r["answer"] for r in rows} <= {"2", "4"}
    trained = train.train(cfg, 0, tmp / "data", tmp / "models", device="cpu")
    for name in ("grpo_mu1_lr0.001", "quatro_mu2_lr0.001"):
        assert (tmp / "models" / name / "config.json").is_file()
        assert len(trained.curves[f"{name}_reward"]) == 2
    measured = evaluate.evaluate(cfg, 0, tmp / "data", tmp / "models", device="cpu")
    for name in ("sft", "grpo_mu2_lr0.001", "quatro_mu1_lr0.001"):
        p1, p2 = measured.metrics[f"{name}_eval_pass_at_1"], measured.metrics[f"{name}_eval_pass_at_2"]
        assert 0.0 <= p1 <= p2 <= 1.0
        assert measured.metrics[f"{name}_eval_sample_count"] == 2 * 4  # max_prompts rows, 2 samples each
        assert 0.0 < measured.metrics[f"{name}_eval_entropy"] <= torch.log(torch.tensor(len(WORDS) * 1.0)) + 1e-6
