"""order_sensitivity config validators, data phase, the train / evaluate / claim_metrics steps at the smoke
profile, the measurements on hand-built scores, figures, and the paper profile on local stand-ins (no network).
Profiles validating and a bad value naming its key are tests/unit/test_paper_contracts.py's, for every paper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from pydantic import ValidationError

from tasks.common.claims import load_claims
from tasks.common.params import ParamsError, params_section, validate_paper_section
from tasks.common.results import SeedResult
from tasks.order_sensitivity import claim_metrics, data, evaluate, figures, hub, measures, model, train
from tasks.order_sensitivity.config import CONFIG

FOLDER = Path(__file__).resolve().parents[2] / "tasks" / "order_sensitivity"


def profile_section() -> dict:
    return params_section("order_sensitivity")


def smoke_config():
    return CONFIG.model_validate(profile_section()["smoke"])


def test_paper_validators_name_the_key():
    configs = validate_paper_section("order_sensitivity", profile_section())
    assert configs["paper"].hub is not None and configs["cpu"].hub is None
    bad = profile_section()
    bad["cpu"]["model"]["n_head"] = 5
    with pytest.raises(ParamsError, match=r"order_sensitivity\.cpu\.model: .*divisible by n_head"):
        validate_paper_section("order_sensitivity", bad)
    bad = profile_section()
    bad["smoke"]["evaluation"]["skeletons"] = 99
    with pytest.raises(ParamsError, match=r"order_sensitivity\.smoke\.evaluation: .*skeletons \(99\) must be <="):
        validate_paper_section("order_sensitivity", bad)
    bad = profile_section()
    bad["cpu"]["evaluation"]["clip_mode"] = "both"
    with pytest.raises(ParamsError, match=r"order_sensitivity\.cpu\.evaluation\.clip_mode"):
        validate_paper_section("order_sensitivity", bad)


@pytest.mark.parametrize(("section", "key", "value", "message"), [
    ("data", "test_n", [8, 4], "strictly increasing"),
    ("data", "relevant_min", 4, "relevant_min .* must be <= relevant_max"),
    ("data", "train_n_min", 2, "room for relevant_max"),
    ("data", "test_n", [4, 8, 16], r"test_n: the largest test chunk count \(16\) exceeds train_n_max \(8\)"),
    ("evaluation", "h_star", 1.5, "less than 1"),
])
def test_config_validators_give_clear_errors(section, key, value, message):
    raw = profile_section()["smoke"]
    raw[section][key] = value
    with pytest.raises(ValidationError, match=message):
        CONFIG.model_validate(raw)


def test_paper_profile_excludes_the_tiny_model():
    raw = profile_section()["paper"] | {"model": profile_section()["cpu"]["model"]}
    with pytest.raises(ValidationError, match="'hub' .* excludes"):
        CONFIG.model_validate(raw)


def test_paper_profile_refuses_a_batch_size_the_hub_scorer_would_ignore():
    bad = profile_section()
    bad["paper"]["evaluation"]["batch_size"] = 8
    with pytest.raises(ParamsError, match=r"order_sensitivity\.paper: .*evaluation\.batch_size: batched hub scoring is "
                                          r"not implemented"):
        validate_paper_section("order_sensitivity", bad)


def test_stale_data_fails_before_any_compute(tmp_path, monkeypatch):
    cfg = smoke_config()
    data.write_data(cfg, (0,), tmp_path)

    def no_compute(*_args, **_kwargs):
        raise AssertionError("compute started before the data were validated")

    monkeypatch.setattr(train, "build_model", no_compute)
    for name in ("qmv_metrics", "edfl_metrics", "load_model"):
        monkeypatch.setattr(evaluate, name, no_compute)
    stale = cfg.model_copy(update={"data": cfg.data.model_copy(update={"n_values": 9})})
    for step in (train.train, evaluate.evaluate):
        with pytest.raises(ValueError, match=r"order_sensitivity\.data\.n_values: .*rerun the data phase"):
            step(stale, 0, tmp_path, tmp_path / "models" / "seed0")
        with pytest.raises(FileNotFoundError, match="run the data phase first"):
            step(cfg, 1, tmp_path, tmp_path / "models" / "seed1")


def test_evaluate_reads_the_checkpoint_train_wrote(tmp_path):
    cfg = smoke_config()
    data.write_data(cfg, (0,), tmp_path)
    with pytest.raises(FileNotFoundError, match="run the train step first"):
        evaluate.evaluate(cfg, 0, tmp_path, tmp_path / "models" / "seed0")


def test_procedural_items_follow_the_labelling_rules():
    cfg = smoke_config().data
    frame = data.procedural_items(cfg, 0)
    assert set(frame["split"].unique()) == set(data.SPLITS)
    for row in frame.iter_rows(named=True):
        relevant = np.array(row["relevant"])
        entities, values = np.array(row["entities"]), np.array(row["values"])
        # distractors are about other entities; relevant chunks are about the claim's entity
        assert np.all((entities == row["claim_entity"]) == relevant)
        if row["is_control"]:
            assert not relevant.any() and row["label"] == data.NO_LABEL
        else:
            support = int((values[relevant] == row["claim_value"]).sum())
            assert row["label"] == data.gold_label(support, int(relevant.sum()) - support)
    dose = frame.filter(pl.col("split") == "dose")
    assert dose["n_chunks"].unique().to_list() == [cfg.dose_chunks]
    assert [len([r for r in x if r]) for x in dose["relevant"].to_list()] == dose["dose"].to_list()
    assert data.gold_label(1, 1) == 0 and data.gold_label(2, 1) == 1  # a tie is not support


def test_rendering_permutes_chunks_and_masks_every_value():
    cfg = smoke_config().data
    vocab = data.vocabulary(cfg)
    frame = data.procedural_items(cfg, 0).filter((pl.col("split") == "test") & (pl.col("n_chunks") == 4))
    items = data.item_arrays(frame, vocab)
    orders = data.random_orders(frame.height, 3, 4, np.random.default_rng(0))
    ids = data.render_ids(items.chunk_tokens, items.claim_tokens, orders)
    assert ids.shape == (frame.height, 3, 5, 3)
    np.testing.assert_array_equal(ids[0, 1, :4], items.chunk_tokens[0][orders[0, 1]])
    np.testing.assert_array_equal(ids[:, :, 4], np.broadcast_to(items.claim_tokens[:, None], (frame.height, 3, 3)))
    check_every_chunk_value_is_masked(items, vocab)


def test_stale_or_missing_data_is_rejected_with_the_key(tmp_path):
    cfg = smoke_config()
    data.write_data(cfg, (0,), tmp_path)
    other = cfg.data.model_copy(update={"primacy_fraction": 0.2})
    with pytest.raises(ValueError, match=r"order_sensitivity\.data\.primacy_fraction: .*rerun the data phase"):
        data.read_procedural(other, tmp_path, 0)
    with pytest.raises(FileNotFoundError, match="run the data phase first"):
        data.read_procedural(cfg.data, tmp_path, 1)


def run_steps(cfg, seed: int, data_dir: Path, model_dir: Path, progress=None) -> SeedResult:
    """What the flow does per seed: train, evaluate from the checkpoint, then the claim metrics."""
    report = progress or (lambda _f, _m: None)
    result = train.train(cfg, seed, data_dir, model_dir, progress=lambda f, m: report(("train", f), m))
    result = result.merged(evaluate.evaluate(cfg, seed, data_dir, model_dir,
                                             progress=lambda f, m: report(("evaluate", f), m)))
    return result.add(claim_metrics.claim_metrics(cfg, result))


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("order_sensitivity")
    cfg = smoke_config()
    data.write_data(cfg, (0,), root / "data")
    calls: list[tuple[str, float]] = []
    first = run_steps(cfg, 0, root / "data", root / "models" / "seed0", progress=lambda f, _m: calls.append(f))
    again = run_steps(cfg, 0, root / "data", root / "models2" / "seed0")
    return cfg, root, first, again, calls


def test_smoke_steps_return_every_claim_metric(smoke_results):
    _, root, result, _, calls = smoke_results
    metrics = result.metrics
    for claim in load_claims(FOLDER / "claims.yaml"):
        if claim.metric is not None:
            assert claim.metric in metrics, claim.id
            for measured in [claim, *claim.preconditions]:  # preconditions and binomial counts are emitted too
                assert measured.metric in metrics, (claim.id, measured.metric)
                if measured.counts is not None:
                    for name in (measured.counts.successes, measured.counts.trials):
                        assert name in metrics and metrics[name] == round(metrics[name]) >= 0, (claim.id, name)
            # smoke-testable claims must be finite; the others may be NaN at smoke (e.g. a gate that answers
            # nothing has no hallucination rate), never inf
            assert np.isfinite(metrics[claim.metric]) or ("smoke" not in claim.profiles
                                                          and np.isnan(metrics[claim.metric])), claim.id
    assert all(isinstance(v, float) for v in metrics.values())
    assert set(result.tables) == {"qmv_first_order", "dispersion_vs_n", "gate_curve", "dose_response", "definitions"}
    assert [p.name for p in (root / "models" / "seed0").iterdir()] == [model.CHECKPOINT]
    assert ("train", 1.0) in calls and calls[-1] == ("evaluate", 1.0)
    # exact checks hold inside the evaluation at any profile
    assert metrics["wiring_control_abstention"] == 1.0
    assert metrics["qmv_violation_rate"] == 0.0 and metrics["edfl_violations"] == 0.0
    assert metrics["edfl_model_min_slack"] >= -1e-12
    assert metrics["abs_residual_over_pair_max"] <= 1.0


def test_claim_metrics_are_the_rates_and_differences_of_the_measurements(smoke_results):
    """claim_metrics only divides counts and subtracts measurements; each agrees with its definition on items."""
    _, _, result, _, _ = smoke_results
    m = result.metrics
    assert m["gate_abstention"] == pytest.approx(m["gate_abstained_count"] / m["test_item_count"], abs=1e-15)
    assert m["order_flip_fraction"] == m["order_flip_count"] / m["non_control_count"]
    assert m["mixture_minus_single_acc_pp"] == 100 * (m["mixture_accuracy"] - m["single_order_accuracy"])
    assert m["dose_evidence_hallucination_rate"] == m["dose_evidence_hallucinated_count"] / m["dose_evidence_count"]
    assert claim_metrics.rate(0.0, 0.0) != claim_metrics.rate(0.0, 0.0)  # NaN without trials


def test_steps_are_deterministic_given_the_seed(smoke_results):
    _, root, first, again, _ = smoke_results
    strip = {k: v for k, v in first.metrics.items() if not k.startswith("seconds_")}
    assert strip == {k: v for k, v in again.metrics.items() if not k.startswith("seconds_")}
    assert first.curves == again.curves and first.tables == again.tables
    checkpoint = Path("seed0") / model.CHECKPOINT
    assert (root / "models" / checkpoint).read_bytes() == (root / "models2" / checkpoint).read_bytes()


def test_figures_build_from_results(smoke_results, tmp_path):
    cfg, _, first, again, _ = smoke_results
    second = SeedResult(1).add(again.metrics, curves=again.curves, tables=again.tables)
    paths = figures.make_figures(cfg, [first, second], tmp_path / "figures", tmp_path / "plots")
    assert {p.suffix for p in paths} == {".png", ".csv"}
    assert len(paths) == 6
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)


def measured(scored: measures.ScoredItems, ev) -> tuple[dict[str, float], object]:
    """The gate and mixture measurements of hand-built scores, with the claim numbers derived from them."""
    gate, plan = measures.gate_metrics(scored, ev)
    result = SeedResult(0).add(gate).add(measures.mixture_metrics(scored, ev))
    return result.metrics | claim_metrics.claim_metrics(smoke_config(), result), plan


def test_gate_metrics_follow_the_hallucination_definition():
    """Hand-built scores: a confident correct item, a confident wrong item, a control answered, an unsure item."""
    q_full = np.array([[0.99] * 4, [0.99] * 4, [0.99] * 4, [0.6] * 4])
    scored = measures.ScoredItems(q_full=q_full, q_skeleton=np.full((4, 2), 0.5), q_identity=q_full[:, 0],
                                    label=np.array([1, 0, data.NO_LABEL, 1]),
                                    is_control=np.array([False, False, True, False]),
                                    n_chunks=np.array([3, 3, 4, 4]), dose=np.full(4, -1))
    ev = smoke_config().evaluation
    metrics, plan = measured(scored, ev)
    np.testing.assert_array_equal(plan.answer, [True, True, True, False])
    assert metrics["gate_hallucination_answered"] == pytest.approx(2 / 3)
    assert metrics["gate_abstention"] == pytest.approx(0.25)
    assert metrics["ungated_hallucination"] == pytest.approx(0.5)
    assert metrics["ungated_wrong_label_rate"] == pytest.approx(1 / 3)
    # the counts the binomial claims pool over seeds
    assert (metrics["gate_hallucinated_count"], metrics["gate_answered_count"]) == (2.0, 3.0)
    assert (metrics["gate_abstained_count"], metrics["test_item_count"]) == (1.0, 4.0)
    assert (metrics["ungated_mixture_wrong_label_count"], metrics["non_control_count"]) == (1.0, 3.0)
    assert metrics["ungated_mixture_wrong_label_rate"] == pytest.approx(1 / 3)
    assert metrics["control_share"] == 0.25


def test_order_flips_count_items_whose_label_changes_between_permutations():
    q_full = np.array([[0.9, 0.8, 0.7], [0.9, 0.4, 0.7], [0.2, 0.1, 0.3], [0.6, 0.4, 0.5], [0.1, 0.9, 0.9]])
    scored = measures.ScoredItems(q_full=q_full, q_skeleton=q_full[:, :2], q_identity=q_full[:, 0],
                                    label=np.array([1, 1, 0, 1, data.NO_LABEL]),
                                    is_control=np.array([False, False, False, False, True]),
                                    n_chunks=np.full(5, 3), dose=np.full(5, -1))
    metrics, _ = measured(scored, smoke_config().evaluation)
    # items 2 and 4 flip; the Control (which also flips) is not counted
    assert metrics["order_flip_count"] == 2.0 and metrics["order_flip_fraction"] == 0.5
    # the bound the C3a precondition rests on: |mixture - single accuracy| <= the share that flips
    assert abs(metrics["mixture_minus_single_acc_pp"]) <= 100 * metrics["order_flip_fraction"]
    no_flip = measures.ScoredItems(**(scored.__dict__ | {"q_full": np.repeat(q_full[:, :1], 3, axis=1)}))
    metrics, _ = measured(no_flip, smoke_config().evaluation)
    assert metrics["order_flip_count"] == 0.0 and metrics["mixture_minus_single_acc_pp"] == 0.0


def _random_scored(rng: np.random.Generator, n: int = 400, m: int = 6, k: int = 3) -> measures.ScoredItems:
    q_full = rng.uniform(0.01, 0.99, size=(n, m))
    control = rng.random(n) < 0.25
    label = np.where(control, data.NO_LABEL, rng.integers(2, size=n))
    return measures.ScoredItems(q_full=q_full, q_skeleton=rng.uniform(0.01, 0.99, size=(n, k)),
                                  q_identity=q_full[:, 0], label=label, is_control=control, n_chunks=np.full(n, 4),
                                  dose=np.full(n, -1))


def check_ungated_hallucination_counts_controls(scored: measures.ScoredItems) -> None:
    metrics, _ = measured(scored, smoke_config().evaluation)
    share = scored.is_control.mean()
    wrong = metrics["ungated_wrong_label_rate"]
    assert metrics["control_share"] == share
    assert metrics["ungated_hallucination"] == pytest.approx(share + wrong * (1 - share), abs=1e-15)
    assert metrics["ungated_hallucination_minus_control_share"] >= 0


def test_ungated_hallucination_counts_every_answered_control():
    """C7c: the ungated model answers every item and each answered Control is a hallucination, so its
    hallucination is the Control share plus the wrong labels among the other items, exactly."""
    rng = np.random.default_rng(3)
    for _ in range(5):
        check_ungated_hallucination_counts_controls(_random_scored(rng))


def test_ungated_hallucination_negative_control_controls_not_counted_fails(monkeypatch):
    """A library whose definition forgets the Control clause (answered AND wrong label only) breaks the identity."""
    monkeypatch.setattr(measures, "hallucinated",
                        lambda answered, decision, scored: answered & ~scored.is_control & (decision != scored.label))
    with pytest.raises(AssertionError):
        check_ungated_hallucination_counts_controls(_random_scored(np.random.default_rng(3)))


def test_binary_edfl_slack_is_nonnegative_for_any_probabilities():
    """C5c: mean_k KL(Ber(p) || Ber(s_k)) >= KL(Ber(p) || Ber(mean_k s_k)) by convexity, whatever the numbers."""
    ev = smoke_config().evaluation
    rng = np.random.default_rng(4)
    for _ in range(20):
        scored = _random_scored(rng, m=ev.permutations, k=ev.skeletons)
        assert measures.edfl_model_min_slack(scored, ev) >= -1e-12
    # equal skeletons: both sides coincide, the slack is 0 on every item
    same = _random_scored(rng, m=ev.permutations, k=ev.skeletons)
    equal = np.repeat(same.q_skeleton[:, :1], ev.skeletons, axis=1)
    same = measures.ScoredItems(**(same.__dict__ | {"q_skeleton": equal}))
    assert measures.edfl_model_min_slack(same, ev) == pytest.approx(0.0, abs=1e-12)


def test_binary_edfl_negative_control_non_convex_divergence_fails(monkeypatch):
    """A library 'KL' that is not convex in its second argument (its square root) gives negative slack."""
    from tasks.order_sensitivity import method

    correct = method.bernoulli_kl
    monkeypatch.setattr(method, "bernoulli_kl", lambda p, q: np.sqrt(correct(p, q)))
    ev = smoke_config().evaluation
    rng = np.random.default_rng(4)
    assert min(measures.edfl_model_min_slack(_random_scored(rng, m=ev.permutations, k=ev.skeletons), ev)
               for _ in range(20)) < -1e-6


def test_a_gate_that_answers_nothing_has_no_hallucination_rate():
    """Not a vacuous 0: abstaining everywhere gives NaN (an inconclusive verdict), not 'reproduced'."""
    q_full = np.full((3, 4), 0.6)
    scored = measures.ScoredItems(q_full=q_full, q_skeleton=q_full[:, :2], q_identity=q_full[:, 0],
                                    label=np.array([1, 0, 1]), is_control=np.zeros(3, dtype=bool),
                                    n_chunks=np.full(3, 3), dose=np.full(3, -1))
    metrics, plan = measured(scored, smoke_config().evaluation)
    assert not plan.answer.any() and metrics["gate_abstention"] == 1.0
    assert np.isnan(metrics["gate_hallucination_answered"])


def _dose_items(delta_for_evidence: np.ndarray, wrong: np.ndarray) -> measures.ScoredItems:
    """Dose items d = 0..3, equally many per d (d = 0: Controls, skeleton = prompt). Evidence items (gold label
    1) answer with probability p = 0.5 e^delta against a skeleton at 0.5, so their lift is delta exactly;
    where ``wrong`` they answer 0 with that probability."""
    dose = np.repeat(np.arange(4), len(delta_for_evidence) // 3)
    q = np.full(len(dose), 0.5)
    p_answer = 0.5 * np.exp(delta_for_evidence)  # u = log(p / 0.5) = delta
    q[dose >= 1] = np.where(wrong, 1 - p_answer, p_answer)
    control = dose == 0
    return measures.ScoredItems(q_full=np.repeat(q[:, None], 4, axis=1),
                                  q_skeleton=np.where(control[:, None], q[:, None], 0.5) * np.ones((1, 2)),
                                  q_identity=q, label=np.where(control, data.NO_LABEL, 1), is_control=control,
                                  n_chunks=np.full(len(dose), 4), dose=dose)


def test_dose_metrics_on_evidence_items_can_fail_where_the_all_dose_ones_cannot():
    """Delta_bar unrelated to d on d >= 1: the all-dose Spearman still clears 0.5 (the d = 0 Controls sit at
    Delta_bar = 0 exactly), while the evidence-only statistic the claim verdicts does not."""
    rng = np.random.default_rng(0)
    per = 80
    delta = rng.uniform(0.05, 0.6, size=3 * per)
    wrong = rng.random(3 * per) < 0.2
    metrics, rows = measures.dose_metrics(_dose_items(delta, wrong), smoke_config().evaluation)
    assert rows[0]["delta_bar"] == 0.0 and rows[0]["ungated_hallucination"] == 1.0
    assert metrics["dose_spearman_delta"] > 0.5
    assert metrics["dose_ols_hallucination_per_nat"] < 0
    assert abs(metrics["dose_spearman_delta_evidence"]) < 0.2
    # a genuine dose-response on d >= 1 passes the evidence-only checks
    ordered = np.sort(delta)
    metrics, _ = measures.dose_metrics(_dose_items(ordered, np.arange(3 * per) < 30), smoke_config().evaluation)
    assert metrics["dose_spearman_delta_evidence"] > 0.5
    assert metrics["dose_ols_hallucination_per_nat_evidence"] < 0
    # no hallucination at all on d >= 1: nothing can fall, the slope is undefined (NaN), not a failing 0
    metrics, _ = measures.dose_metrics(_dose_items(ordered, np.zeros(3 * per, dtype=bool)), smoke_config().evaluation)
    assert np.isnan(metrics["dose_ols_hallucination_per_nat_evidence"])
    # ... and C6b's precondition (some hallucination on evidence items) is what turns that into "undecided"
    assert (metrics["dose_evidence_hallucinated_count"], metrics["dose_evidence_count"]) == (0.0, 3 * per)
    assert claim_metrics.rate(metrics["dose_evidence_hallucinated_count"], metrics["dose_evidence_count"]) == 0.0


def test_dose1_gold_probability_is_the_mixture_probability_on_single_support_items():
    per = 10
    delta = np.concatenate([np.full(per, 0.2), np.full(per, 0.5), np.full(per, 0.6)])
    wrong = np.zeros(3 * per, dtype=bool)
    wrong[:3] = True
    metrics, _ = measures.dose_metrics(_dose_items(delta, wrong), smoke_config().evaluation)
    p = 0.5 * np.exp(0.2)  # d = 1 items answer 1 with this probability, or 0 with it where wrong
    assert metrics["dose1_gold_probability"] == pytest.approx((7 * p + 3 * (1 - p)) / 10)
    assert (metrics["dose_evidence_hallucinated_count"], metrics["dose_evidence_count"]) == (3.0, 30.0)


def test_skeleton_prior_against_dose_exposes_a_budget_that_follows_the_masking():
    """C6a's second precondition: a skeleton fixed at 1/2 does not move (shift 0); a skeleton whose q falls with
    d makes Delta_bar rise with d with an unchanged posterior (the masking confound), and the shift shows it."""
    per = 20
    delta = np.full(3 * per, 0.3)
    still = _dose_items(delta, np.zeros(3 * per, dtype=bool))
    metrics, rows = measures.dose_metrics(still, smoke_config().evaluation)
    assert metrics["dose_skeleton_q_shift"] == 0.0 and [r["skeleton_q"] for r in rows[1:]] == [0.5] * 3
    assert np.isnan(metrics["dose_spearman_skeleton_q_evidence"])  # a constant prior: nothing to rank
    moving = np.where(still.dose >= 1, 0.5 - 0.05 * still.dose, still.q_skeleton[:, 0])
    confounded = measures.ScoredItems(still.q_full, moving[:, None] * np.ones((1, 2)), still.q_identity,
                                      still.label, still.is_control, still.n_chunks, still.dose)
    metrics, rows = measures.dose_metrics(confounded, smoke_config().evaluation)
    assert metrics["dose_skeleton_q_shift"] == pytest.approx(-0.10)
    assert metrics["dose_spearman_skeleton_q_evidence"] == pytest.approx(-1.0)
    # the posterior is the same at every dose, yet the budget rises with d: the claim's statistic clears 0.5
    assert metrics["dose_spearman_delta_evidence"] > 0.5
    assert [r["skeleton_q"] for r in rows[1:]] == pytest.approx([0.45, 0.40, 0.35])


# ----------------------------------------------------------------------------------------------------
# Paper profile on local stand-ins
# ----------------------------------------------------------------------------------------------------

def _stand_ins(root: Path) -> tuple[Path, Path, Path]:
    """A tiny random GPT-2 with a word-level tokenizer, and local FEVER / HotpotQA parquet folders."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    words = ("evidence claim is the supported by answer 1 for yes 0 no to - : ? . [MASK] a b c d e f g h paris "
             "france capital of rome italy berlin germany q").split()
    vocab = {w: i for i, w in enumerate(dict.fromkeys(["[UNK]", *words]))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    model_dir = root / "tiny-lm"
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(model_dir)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_positions=512, n_layer=1, n_head=2, n_embd=16)
                    ).save_pretrained(model_dir)
    fever_dir, hotpot_dir = root / "fever", root / "hotpot"
    fever_dir.mkdir()
    hotpot_dir.mkdir()
    sentences = ["paris is the capital of france", "rome is the capital of italy", "berlin is a capital",
                 "a b c d", "e f g h"]
    pl.DataFrame({"claim": [f"claim {i}" for i in range(12)],
                  "label": ["SUPPORTS", "REFUTES", "NOT ENOUGH INFO"] * 4,
                  "evidence": [[["t", "0", sentences[i % 5]], ["t", "1", sentences[(i + 1) % 5]],
                                ["t", "2", sentences[(i + 2) % 5]]] for i in range(12)]}
                 ).write_parquet(fever_dir / "validation.parquet")
    pl.DataFrame({"question": [f"q {i}" for i in range(6)], "answer": ["paris"] * 6,
                  "context": [{"title": ["x", "y"], "sentences": [sentences[:3], sentences[3:]]}] * 6,
                  "supporting_facts": [{"title": ["x", "x", "x"], "sent_id": [0, 1, 2]}] * 6}
                 ).write_parquet(hotpot_dir / "validation.parquet")
    return model_dir, fever_dir, hotpot_dir


def test_paper_profile_runs_on_local_stand_ins(tmp_path):
    model_dir, fever_dir, hotpot_dir = _stand_ins(tmp_path)
    raw = profile_section()["paper"]
    raw["hub"] |= {"model": str(model_dir), "dtype": "float32", "fever_dataset": str(fever_dir),
                   "hotpot_dataset": str(hotpot_dir), "hotpot_config": None, "items_per_source": 4, "max_chunks": 6}
    raw["evaluation"] |= {"permutations": 3, "skeletons": 2, "bootstrap_resamples": 20, "eg_steps": 5}
    raw["theory"] = profile_section()["smoke"]["theory"]
    cfg = CONFIG.model_validate(raw)
    written = data.write_data(cfg, (0,), tmp_path / "data")
    assert written == [data.hub_items_path(tmp_path / "data", 0)]
    frame = pl.read_parquet(written[0])
    assert frame.height == 8 and frame["is_control"].sum() == 1
    assert all(3 <= n <= 6 for n in frame["n_chunks"])
    model_dir = tmp_path / "models" / "seed0"
    assert train.train(cfg, 0, tmp_path / "data", model_dir) == SeedResult(0) and not model_dir.exists()
    result = run_steps(cfg, 0, tmp_path / "data", model_dir)
    assert result.metrics["wiring_control_abstention"] == 1.0 and result.metrics["n_items"] == 8.0
    assert "dose_spearman_delta" in result.metrics and "gate_hallucination_answered" in result.metrics
    assert hub.render_prompt(["x"], "c").endswith("Answer:")
    wrong = CONFIG.model_validate(raw | {"hub": raw["hub"] | {"items_per_source": 2}})
    with pytest.raises(ValueError, match=r"order_sensitivity\.hub\.items_per_source: .*rerun the data phase"):
        evaluate.evaluate(wrong, 0, tmp_path / "data", model_dir)


# ------------------------------------------------------------------------------------------------
# Issue 19: skeletons without gold relevance, the ISR gate against the confidence gate
# ------------------------------------------------------------------------------------------------

def check_every_chunk_value_is_masked(items: data.ItemArrays, vocab: data.Vocabulary) -> None:
    """The skeleton masks the value of every chunk (relevant or not), keeps entity and attribute, and does not
    read the gold relevance: the same items with a scrambled ``relevant`` give the same skeleton."""
    assert items.relevant.any() and (~items.relevant).any()  # non-degenerate: both kinds of chunk present
    masked = data.mask_all_values(items, vocab)
    assert np.all(masked[..., 2] == vocab.mask)
    np.testing.assert_array_equal(masked[..., :2], items.chunk_tokens[..., :2])
    scrambled = data.ItemArrays(**(items.__dict__ | {"relevant": np.random.default_rng(0).random(
        items.relevant.shape) < 0.5}))
    np.testing.assert_array_equal(data.mask_all_values(scrambled, vocab), masked)
    rows = np.arange(len(masked)) % 2 == 0  # training masks some items only
    partial = data.mask_all_values(items, vocab, where=rows)
    np.testing.assert_array_equal(partial[rows], masked[rows])
    np.testing.assert_array_equal(partial[~rows], items.chunk_tokens[~rows])


def _smoke_items(n: int = 4) -> tuple[data.ItemArrays, data.Vocabulary]:
    cfg = smoke_config().data
    vocab = data.vocabulary(cfg)
    frame = data.procedural_items(cfg, 0).filter((pl.col("split") == "test") & (pl.col("n_chunks") == n))
    return data.item_arrays(frame, vocab), vocab


def _relevant_only_masking(items, vocab, where=None):
    """The pre-issue-19 skeleton: only the gold-relevant chunks' values masked (an oracle)."""
    tokens = items.chunk_tokens.copy()
    rows = np.ones(len(tokens), dtype=bool) if where is None else np.asarray(where, dtype=bool)
    tokens[..., 2][items.relevant & rows[:, None]] = vocab.mask
    return tokens


def test_negative_control_relevant_only_masking_fails_the_skeleton_check(monkeypatch):
    items, vocab = _smoke_items()
    monkeypatch.setattr(data, "mask_all_values", _relevant_only_masking)
    with pytest.raises(AssertionError):
        check_every_chunk_value_is_masked(items, vocab)


def check_scored_skeletons_mask_every_value(monkeypatch) -> None:
    """Wiring: the evaluation's skeletons are the full prompts with every value masked, Controls included. A
    stand-in scorer returns the number of masked chunk values as the logit gap, so with temperature 1 the
    skeleton's q is sigmoid(n) on EVERY item (a Control too) and the full prompt's is sigmoid(0) = 1/2."""
    cfg = smoke_config()
    vocab = data.vocabulary(cfg.data)
    frame = data.procedural_items(cfg.data, 0).filter(pl.col("split") == "test")
    assert frame["is_control"].any() and (~frame["is_control"]).any()
    monkeypatch.setattr(evaluate, "score_gaps", lambda model, ids, batch_size, device="cpu": (
        (ids[..., :-1, 2] == vocab.mask).sum(axis=-1).astype(float)))
    scored = evaluate.score_procedural(None, frame, vocab, cfg.evaluation, 1.0, np.random.default_rng(0))
    np.testing.assert_allclose(scored.q_full, 0.5)
    np.testing.assert_allclose(scored.q_skeleton, np.broadcast_to(
        method_sigmoid(scored.n_chunks.astype(float))[:, None], scored.q_skeleton.shape))


def method_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def test_scored_skeletons_mask_every_value(monkeypatch):
    check_scored_skeletons_mask_every_value(monkeypatch)


def test_negative_control_scored_skeletons_with_gold_relevance_fail(monkeypatch):
    monkeypatch.setattr(data, "mask_all_values", _relevant_only_masking)
    with pytest.raises(AssertionError):
        check_scored_skeletons_mask_every_value(monkeypatch)


def _gate_comparison_scores() -> measures.ScoredItems:
    """Eight hand-built items, skeletons k = 2 of m = 4 permutations, h* = 0.05, symmetric clip 6.

    With B2T(1/2) = KL(Ber(0.95) || Ber(0.5)) = 0.4946 nats (decision 1 on every item, mean q >= 1/2):
    1 label 1, P = 0.99 vs S = 0.5: Delta = ln 1.98 = 0.683 >= 0.4946, ISR answers (right); confidence 0.99
    2 label 0, first two P = 0.99 (mean 0.795): ISR answers (wrong); confidence 0.795
    3 label 1, first two P = 0.7: ln 1.4 = 0.336 < 0.4946, ISR abstains; confidence 0.845
    4 Control at 1/2: Delta = 0, ISR abstains; confidence 0.5
    5 label 0, P = 0.95, S = (0.9, 0.3): Delta = 0.603, q_lo = 0.3, B2T = 0.963, ISR abstains; confidence 0.95
    6 label 1, P = 0.98: ln 1.96 = 0.673, ISR answers (right); confidence 0.98
    7 label 1, first two P = 0.9 (mean 0.945): ln 1.8 = 0.588, ISR answers (right); confidence 0.945
    8 label 0, P = 0.96, S = (0.95, 0.2): Delta = 0.790, q_lo = 0.2, B2T = 1.342, ISR abstains; confidence 0.96
    ISR: answers {1, 2, 6, 7}, hallucinates on 2: 1 / 4. Confidence gate, 4 abstentions (the lowest: 4, 2, 3, 7):
    answers {1, 5, 6, 8}, hallucinates on 5 and 8: 2 / 4. Difference +25 points.
    """
    q_full = np.array([[0.99] * 4, [0.99, 0.99, 0.6, 0.6], [0.7, 0.7, 0.99, 0.99], [0.5] * 4, [0.95] * 4,
                       [0.98] * 4, [0.9, 0.9, 0.99, 0.99], [0.96] * 4])
    q_skeleton = np.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5], [0.9, 0.3], [0.5, 0.5], [0.5, 0.5],
                           [0.95, 0.2]])
    label = np.array([1, 0, 1, data.NO_LABEL, 0, 1, 1, 0])
    return measures.ScoredItems(q_full=q_full, q_skeleton=q_skeleton, q_identity=q_full[:, 0], label=label,
                                is_control=label == data.NO_LABEL, n_chunks=np.full(8, 4), dose=np.full(8, -1))


def check_isr_against_confidence_gate() -> None:
    ev = smoke_config().evaluation.model_copy(update={"h_star": 0.05, "clip": 6.0, "clip_mode": "symmetric",
                                                      "margin": 0.0})
    metrics, plan = measured(_gate_comparison_scores(), ev)
    np.testing.assert_array_equal(plan.answer, [True, True, False, False, False, True, True, False])
    assert (metrics["gate_hallucinated_count"], metrics["gate_answered_count"]) == (1.0, 4.0)
    assert (metrics["confidence_gate_hallucinated_count"], metrics["confidence_gate_answered_count"]) == (2.0, 4.0)
    assert metrics["confidence_gate_hallucination_answered"] == 0.5
    assert metrics["confidence_minus_isr_hallucination_pp"] == pytest.approx(25.0, abs=1e-12)
    assert metrics["confidence_gate_control_abstention"] == 1.0
    # C7a's precondition: the mixture's label answered on all 8 items hallucinates on 2, 4 (Control), 5, 8
    assert (metrics["ungated_mixture_hallucinated_count"], metrics["ungated_mixture_hallucination_rate"]) == (4.0, 0.5)


def test_isr_gate_against_the_confidence_gate_at_equal_abstention():
    """C7d's statistic and its precondition on hand-derived counts (docstring of _gate_comparison_scores)."""
    check_isr_against_confidence_gate()


@pytest.mark.parametrize("broken", ["unequal_abstention", "most_confident_abstain", "sign"])
def test_negative_control_isr_against_confidence_gate(monkeypatch, broken):
    from tasks.order_sensitivity import baselines

    if broken == "unequal_abstention":  # the baseline answers everything: not at the ISR gate's abstention
        monkeypatch.setattr(baselines, "confidence_gate", lambda q, abstention: np.ones(len(q), dtype=bool))
    elif broken == "most_confident_abstain":  # ranks the wrong way round
        monkeypatch.setattr(baselines, "confidence_gate", lambda q, abstention: baselines.abstain_lowest(
            -np.maximum(q, 1 - q), abstention))
    else:  # the difference taken the other way round
        real = claim_metrics.claim_metrics

        def flipped(cfg, result):
            out = real(cfg, result)
            return out | {"confidence_minus_isr_hallucination_pp": -out["confidence_minus_isr_hallucination_pp"]}
        monkeypatch.setattr(claim_metrics, "claim_metrics", flipped)
    with pytest.raises(AssertionError):
        check_isr_against_confidence_gate()


def check_ungated_mixture_hallucination() -> None:
    """C7a's precondition on the eight hand-built items: the mixture's label (1 on every item) answered on all 8
    hallucinates on 2, 5, 8 (wrong label) and 4 (a Control): 4 of 8 items. The three wrong labels alone would
    give 3 / 8, and dividing by the 7 non-Controls 4 / 7."""
    ev = smoke_config().evaluation.model_copy(update={"h_star": 0.05, "clip": 6.0, "clip_mode": "symmetric",
                                                      "margin": 0.0})
    metrics, _ = measured(_gate_comparison_scores(), ev)
    assert (metrics["ungated_mixture_hallucinated_count"], metrics["test_item_count"]) == (4.0, 8.0)
    assert metrics["ungated_mixture_hallucination_rate"] == 0.5
    assert (metrics["ungated_mixture_wrong_label_count"], metrics["non_control_count"]) == (3.0, 7.0)


def test_ungated_mixture_hallucination_counts_controls_and_wrong_labels():
    check_ungated_mixture_hallucination()


@pytest.mark.parametrize("broken", ["non_controls_only", "divided_by_non_controls"])
def test_negative_control_ungated_mixture_hallucination(monkeypatch, broken):
    if broken == "non_controls_only":  # answered Controls not counted: the rate of wrong labels among all items
        monkeypatch.setattr(measures, "hallucinated", lambda answered, decision, scored: (
            answered & ~scored.is_control & (decision != scored.label)))
    else:
        real = claim_metrics.claim_metrics

        def over_non_controls(cfg, result):
            m = result.metrics
            return real(cfg, result) | {"ungated_mixture_hallucination_rate":
                                        m["ungated_mixture_hallucinated_count"] / m["non_control_count"]}
        monkeypatch.setattr(claim_metrics, "claim_metrics", over_non_controls)
    with pytest.raises(AssertionError):
        check_ungated_mixture_hallucination()


def test_config_accepts_test_n_up_to_train_n_max():
    """The boundary of the test-n rule: the largest test n equal to train_n_max is trained on, so it is allowed."""
    raw = profile_section()["smoke"]
    raw["data"]["test_n"] = [4, raw["data"]["train_n_max"]]
    assert CONFIG.model_validate(raw).data.test_n[-1] == raw["data"]["train_n_max"]
    raw["data"]["test_n"] = [4, raw["data"]["train_n_max"] + 1]  # one past the boundary is refused
    with pytest.raises(ValidationError, match="exceeds train_n_max"):
        CONFIG.model_validate(raw)


def _training_item_random_masked_target(cfg, rng):
    """The pre-12-02 rule: a masked item trained on a random target (it pinned the skeleton prior near 1/2)."""
    n = int(rng.integers(cfg.train_n_min, cfg.train_n_max + 1))
    control = bool(rng.random() < cfg.control_fraction)
    item = data.make_item(cfg, n, rng, control=control, primacy=bool(rng.random() < cfg.primacy_fraction))
    if not control and rng.random() < cfg.masked_train_fraction:
        item["masked"] = True
    item["target"] = int(rng.integers(2)) if control or item["masked"] else item["label"]
    return item


def check_masked_items_train_on_their_gold_label(cfg) -> None:
    """Every non-Control training item, masked or not, has its gold label as target; a Control a coin flip.
    The cpu data is used so that both labels occur among masked items (the rule is not met by a constant)."""
    train_rows = data.procedural_items(cfg, 0).filter(pl.col("split") == "train")
    masked = train_rows.filter(pl.col("masked"))
    assert masked.height >= 50 and set(masked["label"].to_list()) == {0, 1}
    np.testing.assert_array_equal(masked["target"].to_numpy(), masked["label"].to_numpy())
    plain = train_rows.filter(~pl.col("masked") & ~pl.col("is_control"))
    np.testing.assert_array_equal(plain["target"].to_numpy(), plain["label"].to_numpy())
    assert set(train_rows.filter(pl.col("is_control"))["target"].to_list()) == {0, 1}


def _cpu_data_config():
    return CONFIG.model_validate(profile_section()["cpu"]).data


def test_masked_training_items_train_on_their_gold_label():
    check_masked_items_train_on_their_gold_label(_cpu_data_config())


def test_gold_masked_targets_leave_every_item_as_before(monkeypatch):
    """The coin is still drawn for a masked item, so the items (chunks, labels, which are masked) are those of
    the old rule; only the masked items' targets differ."""
    cfg = _cpu_data_config()
    new = data.procedural_items(cfg, 0)
    monkeypatch.setattr(data, "training_item", _training_item_random_masked_target)
    old = data.procedural_items(cfg, 0)
    assert new.drop("target").equals(old.drop("target"))
    differs = (new["target"] != old["target"]).to_numpy()
    assert differs.any() and new.filter(pl.Series(differs))["masked"].all()


def test_negative_control_random_masked_targets_fail(monkeypatch):
    monkeypatch.setattr(data, "training_item", _training_item_random_masked_target)
    with pytest.raises(AssertionError):
        check_masked_items_train_on_their_gold_label(_cpu_data_config())


def check_answered_wrong_label() -> None:
    """Four hand-built items: answered (T, T, T, F), decision (1, 0, 1, 1), label (1, 1, Control, 0). Item 2 is an
    answered wrong label, item 3 an answered Control (a hallucination, not a wrong label), item 4 a wrong label
    that is not answered: one answered wrong label, two hallucinations."""
    label = np.array([1, 1, data.NO_LABEL, 0])
    scored = measures.ScoredItems(q_full=np.full((4, 2), 0.5), q_skeleton=np.full((4, 1), 0.5),
                                  q_identity=np.full(4, 0.5), label=label, is_control=label == data.NO_LABEL,
                                  n_chunks=np.full(4, 4), dose=np.full(4, -1))
    answered, decision = np.array([True, True, True, False]), np.array([1, 0, 1, 1])
    np.testing.assert_array_equal(measures.answered_wrong_label(answered, decision, scored),
                                  [False, True, False, False])
    assert measures.hallucinated(answered, decision, scored).sum() == 2
    # on the eight gate items (_gate_comparison_scores) every hallucination of both gates is a wrong label
    ev = smoke_config().evaluation.model_copy(update={"h_star": 0.05, "clip": 6.0, "clip_mode": "symmetric",
                                                      "margin": 0.0})
    metrics, _ = measured(_gate_comparison_scores(), ev)
    assert (metrics["gate_wrong_label_count"], metrics["confidence_gate_wrong_label_count"]) == (1.0, 2.0)


def test_answered_wrong_label_excludes_answered_controls():
    check_answered_wrong_label()


def test_negative_control_answered_wrong_label_counting_controls_fails(monkeypatch):
    monkeypatch.setattr(measures, "answered_wrong_label", measures.hallucinated)
    with pytest.raises(AssertionError):
        check_answered_wrong_label()
