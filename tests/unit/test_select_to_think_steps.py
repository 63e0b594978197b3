"""select_to_think config, data, the train / evaluate / claim_metrics steps at the smoke profile, figures, and the
paper profile (data loaders and both steps) on local stand-ins (no network). Profiles validating and bad values
naming their key are checked for every paper in tests/unit/test_paper_contracts.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from tasks.common.claims import load_claims
from tasks.common.params import ParamsError, params_section, validate_paper_section
from tasks.common.results import SeedResult
from tasks.select_to_think import claim_metrics, data, evaluate, figures, hub, model, train
from tasks.select_to_think.config import CONFIG

FOLDER = Path(__file__).resolve().parents[2] / "tasks" / "select_to_think"


def profile_section() -> dict:
    return params_section("select_to_think")


def smoke_config():
    return CONFIG.model_validate(profile_section()["smoke"])


def test_paper_profile_loads_the_hub_pair_and_the_others_train_the_tiny_pair():
    configs = validate_paper_section("select_to_think", profile_section())
    assert configs["paper"].hub is not None and configs["paper"].slm is None
    assert all(configs[p].hub is None and configs[p].slm is not None for p in ("smoke", "cpu"))


@pytest.mark.parametrize(("path", "value", "message"), [
    (("data", "min_digits"), 5, "min_digits .* must be <= max_digits"),
    (("llm", "n_head"), 3, "divisible by n_head"),
    (("s2t", "hit_ks"), [1, 4, 2], "strictly increasing"),
    (("s2t", "k_collect"), 20, "must be <= the addition vocabulary"),
    (("s2t", "k_eval"), 11, "k_eval .* must be <= s2t.k_collect"),
    (("s2t", "quantile"), 1.5, "less than 1"),
])
def test_config_validators_give_clear_errors(path, value, message):
    raw = profile_section()["cpu"]
    raw[path[0]][path[1]] = value
    with pytest.raises(ValidationError, match=message):
        CONFIG.model_validate(raw)


def test_ratio_to_max_config_reaches_the_s2t_policy():
    s2t = smoke_config().s2t
    assert model.policy_for(s2t, "s2t", "kl").ratio_to_max is None  # default: top-k_eval candidates
    ratio = s2t.model_copy(update={"ratio_to_max": 0.1})
    assert model.policy_for(ratio, "s2t", "kl").ratio_to_max == 0.1
    assert model.policy_for(ratio, "local", "entropy").ratio_to_max is None  # S2T only


def test_unused_hub_batch_size_is_an_unknown_key():
    bad = profile_section()
    bad["paper"]["hub"]["batch_size"] = 8
    with pytest.raises(ParamsError, match=r"select_to_think\.paper\.hub\.batch_size: unknown key"):
        validate_paper_section("select_to_think", bad)


def test_paper_profile_excludes_the_tiny_pair():
    raw = profile_section()["paper"] | {"slm": profile_section()["cpu"]["slm"]}
    with pytest.raises(ValidationError, match="'hub' .* excludes"):
        CONFIG.model_validate(raw)


def test_sequence_encoding_exact_vector_and_answer_parsing():
    tokens = data.encode_problem(47, 38, 3)
    assert tokens == [0, 4, 7, 10, 0, 3, 8, 11, 5, 1, 8, 0, 0, 0, 12, 0, 0, 8, 5, 13]
    assert len(tokens) == data.sequence_length(3)
    assert data.decode_answer(tokens[data.prompt_length(3):], 3) == 85
    assert data.decode_answer(data.encode_solution(999, 999, 3), 3) == 1998
    broken = tokens[data.prompt_length(3):]
    broken[-1] = 5  # no end of sequence
    assert data.decode_answer(broken, 3) is None


def test_problems_hold_out_test_pairs_and_respect_the_digit_range():
    frame = data.addition_problems({"train": 3000, "calibration": 50, "collection": 200, "test": 300}, 2, 3, 0)
    test = {(a, b) for a, b in frame.filter(frame["split"] == "test").select("a", "b").iter_rows()}
    others = {(a, b) for a, b in frame.filter(frame["split"] != "test").select("a", "b").iter_rows()}
    assert len(test) == 300 and not test & others
    values = frame.select("a", "b").to_numpy()
    assert values.min() >= 10 and values.max() <= 999
    assert frame.equals(data.addition_problems({"train": 3000, "calibration": 50, "collection": 200, "test": 300},
                                               2, 3, 0))


def test_stale_or_missing_data_is_rejected_naming_the_key(tmp_path):
    cfg = smoke_config()
    data.write_data(cfg, (0,), tmp_path)
    other = cfg.model_copy(update={"data": cfg.data.model_copy(update={"n_test": 70})})
    with pytest.raises(ValueError, match=r"select_to_think\.data\.n_test: .*rerun the data phase"):
        train.train(other, 0, tmp_path, tmp_path / "models" / "seed0")
    with pytest.raises(ValueError, match=r"select_to_think\.data\.n_test: .*rerun the data phase"):
        evaluate.evaluate(other, 0, tmp_path, tmp_path / "models" / "seed0")
    with pytest.raises(FileNotFoundError, match="run the data phase first"):
        train.train(cfg, 1, tmp_path, tmp_path / "models" / "seed1")


def run_steps(cfg, seed: int, data_dir: Path, model_dir: Path, progress=None) -> tuple[SeedResult, SeedResult]:
    """train -> evaluate -> claim_metrics as the flow runs them; returns (train result, full result)."""
    kwargs = {"progress": progress} if progress else {}
    trained = train.train(cfg, seed, data_dir, model_dir, **kwargs)
    result = trained.merged(evaluate.evaluate(cfg, seed, data_dir, model_dir, **kwargs))
    return trained, result.add(claim_metrics.claim_metrics(cfg, result))  # add raises on a name given twice


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("select_to_think")
    cfg = smoke_config()
    data.write_data(cfg, (0,), root / "data")
    calls: list[float] = []
    trained, first = run_steps(cfg, 0, root / "data", root / "models" / "seed0", lambda f, _m: calls.append(f))
    again = train.train(cfg, 0, root / "data", root / "models2" / "seed0")
    return cfg, root, trained, first, again, calls


def test_steps_at_smoke_return_every_claim_metric(smoke_results):
    _, root, trained, result, _, calls = smoke_results
    metrics = result.metrics
    for claim in load_claims(FOLDER / "claims.yaml"):
        if claim.metric is not None:
            assert claim.metric in metrics, claim.id
            for measured in [claim, *claim.preconditions]:  # preconditions and binomial counts are emitted too
                assert measured.metric in metrics, (claim.id, measured.metric)
                if measured.counts is not None:
                    for name in (measured.counts.successes, measured.counts.trials):
                        assert metrics[name] == round(metrics[name]) >= 0, (claim.id, name)
    assert all(isinstance(v, float) for v in metrics.values())
    # undefined at a tiny scale only: a ratio to a greedy SLM that solves nothing, a rate with no trigger step
    undefined = {"local_entropy_relative_gain", "local_entropy_over_greedy", "local_frozen_entropy_over_greedy",
                 "slm_llm_disagree_rate"}
    assert all(np.isfinite(v) for k, v in metrics.items() if k not in undefined)
    assert metrics["hit_at_8_count"] <= metrics["trigger_count"] and metrics["test_count"] == 60
    assert set(result.curves) == set(trained.curves) == {"llm_train_loss", "slm_train_loss", "local_train_loss",
                                                         "local_ce", "local_hinge", "local_frozen_train_loss",
                                                         "local_frozen_ce"}
    assert set(result.tables) == {"hit_at_k", "examples"}
    assert {"seconds_train_pair", "seconds_local_train", "seconds_baselines", "seconds_local_eval",
            "seconds_local_frozen_train", "seconds_local_frozen_eval"} <= set(metrics)
    for name in (model.LLM, model.SLM, model.LOCAL, model.LOCAL_FROZEN):  # the seed's own folder
        assert (root / "models" / "seed0" / name / "model.safetensors").is_file()
    assert calls and calls[-1] == pytest.approx(1.0)
    # Mechanism checks inside the steps: C7 and C8 hold exactly at any scale.
    assert metrics["local_entropy_llm_evaluations"] == 0.0
    assert metrics["local_frozen_rows_max_change"] == 0.0
    assert metrics["hit_at_full_vocab"] == 1.0
    # the frozen-body variant (C8b): body and non-reserved rows bitwise unchanged, no LLM call
    assert metrics["local_frozen_body_max_change"] == metrics["local_frozen_rows_max_change_frozen_body"] == 0.0
    assert metrics["local_frozen_entropy_llm_evaluations"] == 0.0
    # exact chance at the trigger steps: a probability per step, so at most the number of steps, nested in K
    chance = [metrics[f"chance_hit_at_{k}"] for k in (1, 2, 4, 8)]
    assert chance == sorted(chance) and 0 < chance[0] and chance[-1] < 1
    assert metrics["scorer_chance_rate"] == pytest.approx(1 / smoke_config().s2t.k_collect)


def test_training_metrics_come_from_train_and_measurements_from_evaluate(smoke_results):
    _, _, trained, _, _, _ = smoke_results
    assert {k for k in trained.metrics if not k.startswith("seconds_")} == {
        "llm_train_steps", "slm_train_steps", "local_groups", "local_frozen_rows_max_change",
        "local_frozen_body_max_change", "local_frozen_rows_max_change_frozen_body"}
    assert not trained.tables


def test_evaluate_reads_the_checkpoints_and_trains_nothing(smoke_results):
    cfg, root, _, first, _, _ = smoke_results
    folder = root / "models" / "seed0"
    files = sorted(folder.rglob("*.safetensors"))
    before = {p: p.stat().st_mtime_ns for p in files}
    again = evaluate.evaluate(cfg, 0, root / "data", folder)
    assert {p: p.stat().st_mtime_ns for p in files} == before
    assert {k: v for k, v in again.metrics.items() if not k.startswith("seconds_")} == {
        k: v for k, v in first.metrics.items() if k in again.metrics and not k.startswith("seconds_")}


def test_hit_counts_and_the_disagreement_over_trigger_steps():
    hits = {1: [True, False, False, True], 2: [True, True, False, True], 8: [True, True, True, True]}
    counts = model.hit_counts(hits, [1, 2, 8])
    assert counts == {"trigger_count": 4.0, "hit_at_1_count": 2.0, "hit_at_2_count": 3.0, "hit_at_8_count": 4.0,
                      "hit8_not_hit1_count": 2.0}
    # the counts give the rates the claims read: hit@8 - hit@1 = (in top-8, not top-1) / triggers
    assert counts["hit8_not_hit1_count"] / counts["trigger_count"] == np.mean(hits[8]) - np.mean(hits[1])
    assert claim_metrics.disagreement(counts["trigger_count"], counts["hit_at_1_count"]) == {
        "slm_llm_disagree_count": 2.0, "slm_llm_disagree_rate": 0.5}
    empty = model.hit_counts({1: [], 8: []}, [1, 8])
    assert empty["trigger_count"] == 0.0
    assert np.isnan(claim_metrics.disagreement(0.0, 0.0)["slm_llm_disagree_rate"])


def test_claim_metrics_differences_and_ratios_exact():
    result = SeedResult(0).add(slm_greedy_accuracy=0.5, local_entropy_accuracy=0.75, s2t_accuracy=0.875,
                               takeover_accuracy=0.625, slm_maj_accuracy=0.25, hit_at_1=0.5, hit_at_8=1.0,
                               trigger_count=8.0, hit_at_1_count=4.0)
    assert claim_metrics.claim_metrics(smoke_config(), result) == {
        "hit8_minus_hit1": 0.5, "s2t_minus_takeover": 0.25, "s2t_minus_greedy": 0.375,
        "local_entropy_relative_gain": 0.5, "local_entropy_over_greedy": 1.5, "local_entropy_minus_maj": 0.5,
        "slm_llm_disagree_count": 4.0, "slm_llm_disagree_rate": 0.5, "maj_minus_greedy": -0.25}
    # the preconditions' numbers: class-only chance rates, the scorer against the SLM's top-1, the body's accuracy
    result.add({f"class_chance_hit_at_{k}_count": float(c) for k, c in zip((1, 2, 4, 8), (1, 2, 4, 6))},
               heldout_group_count=16.0, local_scorer_teacher_count=12.0, slm_top1_teacher_count=4.0,
               local_body_greedy_accuracy=0.375)
    out = claim_metrics.claim_metrics(smoke_config(), result)
    assert [out[f"class_chance_hit_at_{k}"] for k in (1, 2, 4, 8)] == [0.125, 0.25, 0.5, 0.75]
    assert (out["local_scorer_teacher_rate"], out["slm_top1_teacher_rate"], out["local_scorer_minus_top1"]) == (
        0.75, 0.25, 0.5)
    assert out["local_body_minus_greedy"] == -0.125
    result.metrics.update(heldout_group_count=0.0, trigger_count=0.0)  # no group, no trigger step: NaN, not 0
    out = claim_metrics.claim_metrics(smoke_config(), result)
    assert np.isnan(out["local_scorer_minus_top1"]) and np.isnan(out["class_chance_hit_at_8"])


def test_format_classes_hold_every_solution_token_and_mark_carries_and_markers():
    classes = data.format_classes(3)
    digits, carry = tuple(range(10)), (0, 1)
    assert classes == [digits, carry, digits, carry, digits, carry, (data.ANSWER,), carry, digits, digits, digits,
                       (data.EOS,)]
    assert len(classes) == data.generated_length(3)
    rng = np.random.default_rng(0)
    for a, b in rng.integers(0, 1000, size=(200, 2)):
        solution = data.encode_solution(int(a), int(b), 3)
        assert all(token in allowed for token, allowed in zip(solution, classes))


def test_class_chance_ranker_hits_at_its_expected_rates():
    """A ranker that knows only the class: hit@K = min(K, |C|) / |C| when the target is in the class (0.8 at K = 8 on
    a digit, 1 on a carry), else max(0, K - |C|) / (V - |C|); the hits are nested in K."""
    n = 20_000
    rng = np.random.default_rng(1)
    cases = {"digit": ([10] * n, [True] * n), "carry": ([2] * n, [True] * n), "outside": ([10] * n, [False] * n)}
    rates = {name: {k: model.class_chance_counts(sizes, inside, [k], 14, np.random.default_rng(7))[
        f"class_chance_hit_at_{k}_count"] / n for k in (1, 2, 4, 8)} for name, (sizes, inside) in cases.items()}
    assert rates["carry"] == {1: pytest.approx(0.5, abs=0.02), 2: 1.0, 4: 1.0, 8: 1.0}
    for k in (1, 2, 4, 8):
        assert rates["digit"][k] == pytest.approx(k / 10, abs=0.02)
        assert rates["outside"][k] == pytest.approx(max(0, k - 10) / 4, abs=0.02)
    counts = model.class_chance_counts([10] * 50 + [2] * 50, [True] * 100, [1, 2, 4, 8], 14, rng)
    assert [counts[f"class_chance_hit_at_{k}_count"] for k in (1, 2, 4, 8)] == sorted(counts.values())
    assert counts["class_chance_hit_at_8_count"] >= 50  # every carry step is a hit at K >= 2


class _BinStub(torch.nn.Module):
    """A 'model' whose score bins, read at the position of candidate c, say 1 for token ``liked`` and 0 else."""

    def __init__(self, liked: int, vocab: int = 30, first_bin: int = 14):
        super().__init__()
        self.liked, self.vocab, self.first_bin = liked, vocab, first_bin

    def forward(self, input_ids):
        logits = torch.zeros(*input_ids.shape, self.vocab)
        top = torch.where(input_ids == self.liked, self.first_bin + 15, self.first_bin)
        logits.scatter_(-1, top[..., None], 50.0)
        return type("Out", (), {"logits": logits})()


def test_scorer_counts_compare_the_bin_scores_and_the_slm_top1_with_the_teacher():
    from tasks.select_to_think import method

    candidates = torch.tensor([[3, 5, 7], [5, 3, 7], [7, 5, 3], [5, 7, 3]])  # the SLM's top-3, most probable first
    teacher = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8], [0.5, 0.4, 0.1]])
    groups = method.CandidateGroups(torch.tensor([[1, 2, 0], [1, 2, 4], [1, 0, 0], [1, 2, 3]]),
                                    torch.tensor([2, 3, 1, 3]), candidates, teacher)
    reserved = method.bin_ids(14, 16)
    # the teacher's candidates: token 3, 3, 3, 5. A scorer that likes token 3 picks it in the first three groups
    assert model.scorer_counts(_BinStub(liked=3), groups, reserved, batch_groups=3) == {
        "heldout_group_count": 4.0, "local_scorer_teacher_count": 3.0, "slm_top1_teacher_count": 2.0,
        "scorer_chance_expected": 4 / 3}  # a random pick among 3 candidates: 1/3 per group
    # a scorer that likes token 7 never agrees with this teacher: it does not beat the top-1
    assert model.scorer_counts(_BinStub(liked=7), groups, reserved, batch_groups=2)["local_scorer_teacher_count"] == 0
    empty = groups.subset(torch.arange(0))
    assert model.scorer_counts(_BinStub(liked=3), empty, reserved, batch_groups=2)["heldout_group_count"] == 0.0


def test_llm_preferred_tokens_are_the_llms_own_greedy_choices(smoke_results):
    """One causal forward pass gives the LLM's argmax after every prefix: on its own greedy path, its own tokens."""
    from tasks.select_to_think import method

    cfg, root, _, _, _, _ = smoke_results
    setup = model.load_setup(cfg, 0, root / "data")
    llm = model.load_lm(root / "models" / "seed0", model.LLM)
    trace = method.decode(llm, setup.test.prompts, setup.test.steps, method.DecodePolicy(), reserved=setup.reserved)
    assert torch.equal(evaluate.llm_preferred_tokens(llm, setup.test.prompts, trace.tokens), trace.tokens)


def test_differ_counts_and_accuracy_ratio():
    a = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    b = torch.tensor([[1, 2, 3], [4, 0, 6], [7, 8, 9]])
    assert evaluate.differ_counts(a, b) == {"s2t_takeover_differ_count": 1.0,
                                            "s2t_takeover_differ_rate": pytest.approx(1 / 3)}
    assert evaluate.differ_counts(a, a)["s2t_takeover_differ_count"] == 0.0
    assert claim_metrics.accuracy_ratio(0.33, 0.3) == pytest.approx(1.1)
    assert np.isnan(claim_metrics.accuracy_ratio(0.5, 0.0))
    assert claim_metrics.relative_gain(0.5, 0.0) == np.inf and claim_metrics.relative_gain(0.0, 0.0) == 0.0


def test_training_is_deterministic_given_the_seed(smoke_results):
    """Bitwise: the same curves, metrics and checkpoint bytes (evaluation's determinism: the test above)."""
    _, root, trained, _, again, _ = smoke_results
    strip = {k: v for k, v in trained.metrics.items() if not k.startswith("seconds_")}
    assert strip == {k: v for k, v in again.metrics.items() if not k.startswith("seconds_")}
    assert trained.curves == again.curves
    for name in (model.LLM, model.SLM, model.LOCAL, model.LOCAL_FROZEN):
        first, second = (root / folder / "seed0" / name / "model.safetensors" for folder in ("models", "models2"))
        assert first.read_bytes() == second.read_bytes(), name


def test_lm_schedule_is_warmup_cosine_or_warmup_then_constant():
    lm = smoke_config().llm.model_copy(update={"steps": 40})
    rates = {}
    for stop_early in (False, True):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        schedule = train.lm_schedule(optimizer, lm, stop_early)
        rates[stop_early] = []
        for _ in range(40):
            rates[stop_early].append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            schedule.step()
    assert rates[True][:3] == [0.5, 1.0, 1.0] and set(rates[True][1:]) == {1.0}  # warm-up of max(1, 40 // 20) = 2
    assert rates[False][0] == 0.5 and rates[False][1] == pytest.approx(0.5 * (1 + np.cos(np.pi / 40)))
    assert all(a > b for a, b in zip(rates[False][1:], rates[False][2:]))


def test_figures_build_from_results(smoke_results, tmp_path):
    cfg, _, _, first, _, _ = smoke_results
    other = SeedResult(1).add(first.metrics, curves=first.curves, tables=first.tables)
    paths = figures.make_figures(cfg, [first, other], tmp_path / "figures", tmp_path / "plots")
    assert {p.suffix for p in paths} == {".png", ".csv"}
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)


# ----------------------------------------------------------------------------------------------------
# Paper profile loaders on local stand-ins
# ----------------------------------------------------------------------------------------------------

def test_final_answer_extraction():
    assert data.final_answer("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert data.final_answer("He pays 3 + 4 = 7.\n#### 1,007") == "1007"
    assert data.final_answer("the total is 42.") == "42"
    assert data.final_answer("no number") is None


def stand_in_hub_config(tmp_path: Path, **updates):
    """The paper profile pointed at local parquet stand-ins of MATH (12 problems) and GSM8K (9)."""
    from datasets import Dataset

    math_dir, gsm_dir = tmp_path / "math", tmp_path / "gsm"
    math_dir.mkdir()
    gsm_dir.mkdir()
    Dataset.from_dict({"problem": [f"p{i}" for i in range(12)],
                       "solution": [f"x = \\boxed{{{i}}}" for i in range(12)]}).to_parquet(math_dir / "train.parquet")
    Dataset.from_dict({"question": [f"q{i}" for i in range(9)],
                       "answer": [f"... #### {i}" for i in range(9)]}).to_parquet(gsm_dir / "test.parquet")
    raw = profile_section()["paper"]
    raw["hub"] |= {"collect_dataset": str(math_dir), "collect_config": None, "collect_split": "train",
                   "n_collect": 6, "n_calibration": 2, "eval_dataset": str(gsm_dir), "eval_config": None,
                   "eval_split": "test", "n_eval": 5} | updates.pop("hub", {})
    return CONFIG.model_validate(raw | updates)


def test_hub_problems_round_trip_on_local_parquet(tmp_path):
    cfg = stand_in_hub_config(tmp_path)
    written = data.write_data(cfg, (0,), tmp_path / "data")
    assert written == [tmp_path / "data" / "hub_seed0"]
    splits = data.read_hub_problems(cfg.hub, tmp_path / "data", 0)
    assert [len(splits[s]) for s in ("calibration", "collection", "test")] == [2, 6, 5]
    assert all(r["answer"] == r["question"][1:] for r in splits["test"] + splits["collection"])
    wrong = cfg.hub.model_copy(update={"n_eval": 4})
    with pytest.raises(ValueError, match=r"select_to_think\.hub\.n_eval: .*rerun the data phase"):
        data.read_hub_problems(wrong, tmp_path / "data", 0)


class StandInTokenizer:
    """A 14-token tokenizer (digits, then 4 specials; eos 13) with a chat template: the interface hub.py uses."""

    eos_token_id = 13

    def __len__(self) -> int:
        return 14

    def apply_chat_template(self, messages, add_generation_prompt, return_tensors):
        return torch.tensor([[ord(ch) % 10 for ch in messages[0]["content"][:12]]])

    def decode(self, tokens, skip_special_tokens):
        return "".join(str(int(t)) for t in tokens if int(t) < 10)


def test_hub_train_and_evaluate_run_on_stand_in_models(tmp_path, monkeypatch):
    """Both paper-profile steps end to end on tiny GPT-2 stand-ins of the Qwen pair: the SLM has 16 output rows
    beyond the tokenizer (the score bins), as Qwen2.5 pads its embedding matrix."""
    from tasks.common import tiny_lm

    def load_pair(slm_name, llm_name, dtype):
        untied = tiny_lm.tiny_gpt2_config(30, 64, 1, 2, 16)
        untied.tie_word_embeddings = False
        slm = tiny_lm.build_tiny_gpt2(untied, seed=1)
        llm = tiny_lm.build_tiny_gpt2(tiny_lm.tiny_gpt2_config(30, 64, 1, 2, 16), seed=2)
        return slm.eval(), llm.eval(), StandInTokenizer()

    monkeypatch.setattr(data, "load_pair", load_pair)
    cfg = stand_in_hub_config(tmp_path, hub={"max_new_tokens": 6, "dtype": "float32"},
                              s2t={"quantile": 0.5, "warmup_steps": 1, "k_eval": 4, "k_collect": 8,
                                   "hit_ks": [1, 2, 4, 8]},
                              local={"n_bins": 16, "epochs": 1, "batch_groups": 4, "lr": 1.0e-3})
    data.write_data(cfg, (0,), tmp_path / "data")
    folder = tmp_path / "models" / "seed0"
    trained = train.train(cfg, 0, tmp_path / "data", folder)
    assert (folder / model.LOCAL / "model.safetensors").is_file() and not (folder / model.SLM).exists()
    assert trained.metrics["local_groups"] > 0 and trained.metrics["local_frozen_rows_max_change"] == 0.0
    result = trained.merged(evaluate.evaluate(cfg, 0, tmp_path / "data", folder))
    result.add(claim_metrics.claim_metrics(cfg, result))
    m = result.metrics
    assert m["test_count"] == 5 and m["local_entropy_llm_evaluations"] == 0.0
    # the preconditions are measured at the paper profile too: the LLM alone, a uniform chance ranker over the
    # vocabulary, the fine-tuned body alone and the scorer on the test problems' held-out groups
    assert 0 <= m["llm_correct_count"] <= 5 and 0 <= m["local_body_greedy_accuracy"] <= 1
    assert m["heldout_group_count"] == m["trigger_count"]
    assert m["local_scorer_teacher_count"] <= m["heldout_group_count"]
    assert m["class_chance_hit_at_8_count"] <= m["trigger_count"] and np.isfinite(m["local_scorer_minus_top1"])
    for claim in load_claims(FOLDER / "claims.yaml"):  # every paper-profile claim finds what it reads
        if "paper" in claim.profiles and claim.metric is not None:
            for measured in [claim, *claim.preconditions]:
                counts = [measured.counts.successes, measured.counts.trials] if measured.counts else []
                assert all(name in m for name in [measured.metric, *counts]), (claim.id, measured.metric)
    assert m["hit_at_8_count"] <= m["trigger_count"] and m["trigger_count"] > 0
    assert np.isnan(m["local_entropy_minus_maj"])  # Maj@N is not computed at the paper profile
    assert [row["k"] for row in result.tables["hit_at_k"]] == [1, 2, 4, 8]
    assert hub.reserved_rows(load_pair("", "", "")[0], StandInTokenizer(), 16) == list(range(14, 30))
