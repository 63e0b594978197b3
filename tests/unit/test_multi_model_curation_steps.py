"""multi_model_curation: params fragment, data phase, the train -> evaluate -> claim_metrics steps at the
smoke profile, claims, figures, and the paper profile's hub loop on tiny local stand-ins (no network)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tasks.common.claims import evaluate_claims, load_claims
from tasks.common.params import ParamsError, params_section, validate_paper_section
from tasks.common.results import SeedResult
from tasks.multi_model_curation import claim_metrics, data, evaluate, figures, loops, method, train
from tasks.multi_model_curation.config import CONFIG

PAPER_DIR = Path(__file__).resolve().parents[2] / "tasks" / "multi_model_curation"
FRAGMENT = params_section("multi_model_curation")
CLAIMS = load_claims(PAPER_DIR / "claims.yaml")


def run_steps(config, seed: int, data_dir: Path, model_dir: Path) -> SeedResult:
    """train, evaluate and the claim metrics of one seed, merged as the flow merges them."""
    result = train.train(config, seed, data_dir, model_dir).merged(evaluate.evaluate(config, seed, data_dir, model_dir))
    return result.add(claim_metrics.claim_metrics(config, result))


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    """The steps at the smoke profile for seeds 0 and 1 (the analytic part is shared and cheap)."""
    root = tmp_path_factory.mktemp("mmc")
    config = CONFIG.model_validate(FRAGMENT["smoke"])
    written = data.write_data(config, (0, 1), root / "data")
    results = [run_steps(config, seed, root / "data", root / "models" / f"seed{seed}") for seed in (0, 1)]
    return config, root, written, results


def test_only_the_paper_profile_runs_the_hub_loop():
    configs = validate_paper_section("multi_model_curation", FRAGMENT)
    assert configs["paper"].hub is not None and configs["cpu"].hub is None
    assert configs["cpu"].sampled.k_small == 16 and configs["cpu"].sampled.k_large == 64


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda f: f["cpu"]["sampled"].update(n_samples=10), r"multi_model_curation\.cpu\.sampled\.n_samples"),
    (lambda f: f["cpu"]["sampled"].update(k_small=64, k_large=16), r"multi_model_curation\.cpu\.sampled: .*k_small"),
    (lambda f: f["paper"]["hub"].update(mixing=[[0.5, 0.5], [0.7, 0.1]]),
     r"multi_model_curation\.paper\.hub: .*mixing\[0\] must be >= 0 and sum to 1 - real_share"),
    (lambda f: f["cpu"]["analytic"].update(coupling_grid=[0.0, 0.9]),
     r"multi_model_curation\.cpu\.analytic: .*coupling_grid"),
])
def test_bad_fragment_values_name_the_key(mutate, message):
    fragment = params_section("multi_model_curation")
    mutate(fragment)
    with pytest.raises(ParamsError, match=message):
        validate_paper_section("multi_model_curation", fragment)


def test_steps_return_every_claim_metric_and_are_json(smoke_results):
    _, _, _, results = smoke_results
    needed = set()
    for claim in CLAIMS:
        if claim.metric and set(claim.profiles) & {"smoke", "cpu"}:
            measured = [claim, *claim.preconditions]
            needed |= {m.metric for m in measured if m.counts is None}
            needed |= {name for m in measured if m.counts for name in (m.counts.successes, m.counts.trials)}
    for result in results:
        assert needed <= set(result.metrics), needed - set(result.metrics)
        assert all(np.isfinite(v) for v in result.metrics.values())
        json.dumps(result.to_dict())
    rows = evaluate_claims(CLAIMS, {r.seed: r.metrics for r in results}, "cpu", "multi_model_curation")
    assert len(rows) == len(CLAIMS)
    assert {r["verdict"] for r in rows if r["metric"] is None and r["id"] not in ("C7b", "C7c")} == {"report only"}
    # C7b/C7c (i.i.d. draws sampled at finite K) are not measured since the review of 2026-12-02
    assert {r["verdict"] for r in rows if r["id"] in ("C7b", "C7c")} == {"not testable at this profile"}
    assert {r["verdict"] for r in rows if r["metric"] and r["metric"].startswith("hub_")} == {
        "not testable at this profile"}


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_steps_are_deterministic_and_seed_dependent(smoke_results, tmp_path):
    config, root, _, results = smoke_results
    again = run_steps(config, 0, root / "data", tmp_path / "seed0")
    drop = {k for k in again.metrics if k.startswith("seconds_")}
    assert {k: v for k, v in again.metrics.items() if k not in drop} == \
        {k: v for k, v in results[0].metrics.items() if k not in drop}
    assert digests(tmp_path / "seed0") == digests(root / "models" / "seed0") == {
        loops.NEURAL_CHECKPOINT: digests(root / "models" / "seed0")[loops.NEURAL_CHECKPOINT]}
    assert results[0].metrics["dampen_dA1_klarge"] != results[1].metrics["dampen_dA1_klarge"]
    # Analytic parts do not depend on the seed.
    assert results[0].metrics["analytic_self_invert_A1"] == results[1].metrics["analytic_self_invert_A1"]


def test_evaluation_reads_the_trained_neural_generators(smoke_results, tmp_path):
    """The saved generators reproduce the neural loop's last measured alignment exactly; untrained ones
    (saved in their place) do not."""
    config, root, _, results = smoke_results
    for result in results:
        for row in result.tables["neural"]:
            assert row["checkpoint_A"] == result.curves[f"neural_A{row['model']}"][-1]
    loops.save_neural_generators(loops.new_neural_generators(config.neural, 0), tmp_path)
    untrained = evaluate.neural_rows(config.neural, config.analytic, 0, tmp_path)
    assert [r["checkpoint_A"] for r in untrained] != [r["checkpoint_A"] for r in results[0].tables["neural"]]


def test_a_profile_without_trained_generators_trains_nothing(smoke_results, tmp_path):
    config, root, _, _ = smoke_results
    analytic_only = config.model_copy(update={"neural": None})
    trained = train.train(analytic_only, 0, root / "data", tmp_path / "seed0")
    assert trained.to_dict() == SeedResult(0).to_dict() and not (tmp_path / "seed0").exists()
    result = trained.merged(evaluate.evaluate(analytic_only, 0, root / "data", tmp_path / "seed0"))
    assert "c1_neural_max_rel_error" not in claim_metrics.claim_metrics(analytic_only, result)


def test_analytic_metrics_at_smoke_match_the_reference(smoke_results):
    metrics = smoke_results[3][0].metrics
    assert metrics["analytic_dampen_A1"] == pytest.approx(-0.948, abs=1e-3)
    assert metrics["c1_divergent_flagged"] == 1.0 and metrics["c1_convergent_flagged_count"] == 0.0
    assert metrics["c5_cross_influence_uncoupled_max_abs"] < 1e-9
    assert metrics["c5_net_sign_flips"] == 1.0


def test_claim_signs_are_the_analytic_prediction():
    """Every sign check of a sampled chord in claims.yaml (claims and their preconditions) is the sign
    of the K -> infinity chord, so no threshold was set from sampled results."""
    analytic = evaluate.analytic_chords(CONFIG.model_validate(FRAGMENT["smoke"]).analytic)
    isolated = method.chord_effect(method.canonical_specs()["self_invert_isolated"], 0, 0.6, 4.0)
    checked = 0
    for claim in [m for c in CLAIMS for m in (c, *c.preconditions)]:
        if claim.check is None or claim.check.op != "sign" or not ("_dA" in claim.metric or "_dsum" in claim.metric):
            continue
        name, _, rest = claim.metric.rpartition("_d")
        # The mixture test (C8a-c) and its single-Gaussian control check the Gaussian K -> inf signs too.
        name = name.removeprefix("mixture_").removeprefix("gaussian_control_")
        if name == "self_invert_isolated":
            expected = np.sign(isolated[0])
        elif rest.startswith("sum"):
            expected = np.sign(analytic[name].sum())
        else:
            expected = np.sign(analytic[name][int(rest[1]) - 1])
        assert claim.check.value == expected, claim.metric
        checked += 1
    # 6 claims decided at K = 64 and their 4 preconditions; C8a-c and their 4 preconditions
    assert checked == 6 + 4 + 3 + 4


def test_stale_data_fails_with_the_key(smoke_results, tmp_path):
    config, root, _, _ = smoke_results
    bigger = config.model_copy(update={"sampled": config.sampled.model_copy(update={"real_pool": 6000})})
    with pytest.raises(ValueError, match=r"sampled\.real_pool: .* rerun the data phase"):
        evaluate.evaluate(bigger, 0, root / "data", root / "models" / "seed0")
    with pytest.raises(FileNotFoundError, match=r"sampled\.real_pool: .*missing"):
        evaluate.evaluate(config, 7, root / "data", root / "models" / "seed0")
    wider = config.model_copy(update={"neural": config.neural.model_copy(update={"dim": config.neural.dim + 1})})
    with pytest.raises(ValueError, match=r"neural\.real_pool/neural\.dim: .* rerun the data phase"):
        train.train(wider, 0, root / "data", tmp_path)


def test_data_phase_writes_real_data_sets(smoke_results):
    config, root, written, _ = smoke_results
    assert sorted(p.name for p in written) == sorted(
        [f"real_1d_seed{s}.parquet" for s in (0, 1)] + [f"real_conditional_seed{s}.parquet" for s in (0, 1)])
    import polars as pl

    frame = pl.read_parquet(root / "data" / "real_1d_seed0.parquet")
    assert frame.height == config.sampled.real_pool
    assert abs(frame["y"].mean()) < 0.1 and abs(frame["y"].var() - 1.0) < 0.1
    assert not list((root / "data").glob("*.partial"))


def test_figures_build_from_results(smoke_results, tmp_path):
    config, _, _, results = smoke_results
    made = figures.make_figures(config, results, tmp_path / "figures", tmp_path / "plots")
    assert sorted(p.name for p in made) == ["alignment_trajectories.png", "influence_heatmap.png", "sign_table.png",
                                            "survey_and_mixture.png"]
    assert all(p.stat().st_size > 1000 for p in made)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "alignment_trajectories.csv", "influence_heatmap.csv", "sign_table.csv", "survey_sampled.csv"]
    signs = figures.sign_rows(results[0])
    assert np.mean([r["sign_match"] for r in signs]) == results[0].metrics["sign_match_fraction"]


# ------------------------------------------------------------------------------------------------
# Paper profile on local stand-ins
# ------------------------------------------------------------------------------------------------

def _stand_ins(root: Path) -> dict[str, str]:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2ForSequenceClassification, PreTrainedTokenizerFast

    from tasks.common import tiny_lm
    from tasks.common.seeding import torch_init_seed

    words = ["[UNK]", "[PAD]", "[EOS]", "good", "bad", "movie", "the", "was", "is", "a", "?"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                        eos_token="[EOS]")
    paths = {}
    for name in ("gen_a", "gen_b"):
        config = tiny_lm.tiny_gpt2_config(len(words), 64, n_layer=1, n_head=2, n_embd=8)
        tiny_lm.build_tiny_gpt2(config, seed=len(name) + ord(name[-1])).save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        paths[name] = str(root / name)
    with torch_init_seed(0):
        reward = GPT2ForSequenceClassification(GPT2Config(vocab_size=len(words), n_positions=64, n_layer=1, n_head=2,
                                                          n_embd=8, num_labels=1, pad_token_id=1))
    reward.save_pretrained(root / "reward")
    tokenizer.save_pretrained(root / "reward")
    paths["reward"] = str(root / "reward")
    (root / "prompts").mkdir()
    lines = [{"prompt": f"the movie {i % 3}", "chosen": [{"role": "user", "content": "x"},
                                                          {"role": "assistant", "content": "good good"}]}
             for i in range(8)]
    (root / "prompts" / "train.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    paths["prompts"] = str(root / "prompts")
    return paths


def test_hub_loop_on_local_stand_ins(tmp_path):
    from tasks.multi_model_curation import hub
    from tasks.multi_model_curation.config import HubConfig

    paths = _stand_ins(tmp_path)
    cfg = HubConfig(generators=[paths["gen_a"], paths["gen_b"]], reward_models=[paths["reward"]],
                    prompts_dataset=paths["prompts"], prompts_split="train", prompt_column="prompt",
                    response_column="chosen", n_prompts=8, n_eval_prompts=2, k=3, rounds=1, beta=[5.0, 0.0],
                    mixing=[[0.1, 0.7], [0.7, 0.1]], real_share=0.2, max_new_tokens=4, sft_steps=2, batch_size=4,
                    lr=1e-3, dtype="float32")
    curves = hub.run_hub_loop(cfg, seed=0, device="cpu", model_dir=tmp_path / "out")
    assert set(curves) == {"hub_A1", "hub_A2"} and len(curves["hub_A1"]) == 2
    metrics = claim_metrics.hub_claims(SeedResult(0).add(curves=curves), 2)
    assert set(metrics) == {"hub_A1_final", "hub_A2_final", "hub_A1_gain", "hub_A2_gain"}
    assert all(np.isfinite(v) for v in metrics.values())
    assert metrics["hub_A1_gain"] == curves["hub_A1"][1] - curves["hub_A1"][0]
    assert (tmp_path / "out" / "generator1" / "model.safetensors").is_file()


def test_response_text_reads_chat_and_plain():
    from tasks.multi_model_curation.hub import response_text

    assert response_text("plain") == "plain"
    assert response_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    with pytest.raises(ValueError, match="response_column"):
        response_text(3)


def test_sampled_divergence_uses_the_library_flag(smoke_results, monkeypatch):
    """The sampled divergent loop is flagged by method.divergence_flag (no thresholds of its own):
    flagged as is, and not flagged when the library's flag is broken to never fire."""
    config, root, _, _ = smoke_results
    real = data.read_real_1d(config, 0, root / "data")
    longer = config.sampled.model_copy(update={"rounds": 30})  # 12 smoke rounds stop at v ~ 0.012 > 1e-2
    flagged = claim_metrics.divergent_claims(evaluate.sampled_divergent(longer, 0, real)[2])
    assert flagged["c1_divergent_sampled_runs"] == config.sampled.divergent_replicates == 2
    assert flagged["c1_divergent_sampled_flagged_count"] == 2.0
    # C1d's metric: the worst loop's margin is below 1 exactly when every loop meets the collapse criterion.
    assert flagged["c1_divergent_sampled_worst_margin"] < 1.0
    short = claim_metrics.divergent_claims(evaluate.sampled_divergent(config.sampled, 0, real)[2])
    assert short["c1_divergent_sampled_flagged_count"] < 2.0 and short["c1_divergent_sampled_worst_margin"] >= 1.0
    monkeypatch.setattr(method, "divergence_flag", lambda *args, **kwargs: False)
    broken = claim_metrics.divergent_claims(evaluate.sampled_divergent(longer, 0, real)[2])
    assert broken["c1_divergent_sampled_flagged_count"] == 0.0


def test_divergent_replicates_are_independent_loops(smoke_results):
    """C1d's binomial trials: the replicate loops of one seed use different random streams (the first
    keeps the single loop's stream), so their variance paths differ."""
    config, root, _, _ = smoke_results
    real = data.read_real_1d(config, 0, root / "data")
    spec = method.canonical_specs()["divergent"]
    k, rounds, n = config.sampled.k_small, config.sampled.rounds, config.sampled.n_samples
    first = method.iterate_sampled(spec, rounds, k, n, real, loops.loop_rng(0, 5, k))
    second = method.iterate_sampled(spec, rounds, k, n, real, loops.loop_rng(0, 5, k, 1))
    _, curve, _ = evaluate.sampled_divergent(config.sampled, 0, real)
    np.testing.assert_array_equal(curve, first.v.min(axis=1))
    assert not np.array_equal(first.v, second.v)


def test_claims_show_no_project_number_as_the_paper_value():
    """The paper reports no number known to the project: every paper_value is qualitative. Every
    seed-independent K -> infinity row is a verification row (identity or reference), never counted:
    their metrics are identical across seeds."""
    assert {c.paper_value for c in CLAIMS} == {"qualitative"}
    assert {c.fidelity for c in CLAIMS} == {"reconstructed"}
    kinds = {c.id: c.kind for c in CLAIMS}
    assert kinds["C5a"] == "identity"
    assert {i for i, k in kinds.items() if k == "reference"} == {"C1a", "C1b", "C1c", "C2a", "C2b", "C5b", "C5c"}
    # Every sampled and neural loop row of the Gaussian model is a mechanism check of the project's
    # reconstruction; the empirical rows are the paper profile's LM loop and, since the review of 2026-12-02,
    # the mixture-generator test (a generator outside the reconstruction, C8a-c).
    assert {i for i, k in kinds.items() if k == "empirical"} == {"C6a", "C6b", "C8a", "C8b", "C8c"}
    assert {c.id for c in CLAIMS if c.kind == "empirical" and "cpu" in c.profiles} == {"C8a", "C8b", "C8c"}


def test_one_counted_row_per_claim():
    """The sign claims are decided at K = 64 only; the K = 16 chords and the claims that are another claim's
    precondition (C4d of C4b, C4i of C4f, C4h, C4j) are report-only rows (no check, not counted). The survey's
    rates among i.i.d. draws (C7a-c) are report only since the review of 2026-12-02 (a check 'rate > 0' cannot
    fail); the K = 16 survival rate C7e is its own claim. The preconditions of C3e and C4 were added after the
    2026-11-30 cpu results and say so; those of C8a-c (issue 19) were written before the run that decides them,
    except the BIC and stationarity ones, added after the 2026-12-02 run (post hoc)."""
    report_only = {c.id for c in CLAIMS if c.check is None}
    assert report_only == {"C3a", "C3c", "C4a", "C4c", "C4d", "C4e", "C4g", "C4i", "C7a", "C7b", "C7c"}
    counted = [c for c in CLAIMS if c.check is not None and c.kind in ("empirical", "mechanism")]
    assert [c.id for c in counted if c.metric.endswith("_ksmall")] == ["C7e"]
    assert len({c.metric for c in counted}) == len(counted)
    preconditions = {p.metric for c in CLAIMS for p in c.preconditions}
    assert not preconditions & {c.metric for c in counted}
    post_hoc = {c.id for c in CLAIMS for p in c.preconditions if p.post_hoc}
    assert post_hoc == {"C3e", "C4b", "C4f", "C4h", "C4j", "C8a", "C8b", "C8c"}
    assert {c.id for c in CLAIMS for p in c.preconditions if not p.post_hoc} == {"C8a", "C8b", "C8c"}
    added_after_review = [p for c in CLAIMS for p in c.preconditions
                          if "drift_excess" in p.metric or "over_bic" in p.metric]
    assert len(added_after_review) == 4 and all(p.post_hoc for p in added_after_review)
    assert {c.id: c.kind for c in CLAIMS if c.id.startswith("C8")} == {"C8a": "empirical", "C8b": "empirical",
                                                                        "C8c": "empirical"}


def test_verification_rows_are_seed_independent(smoke_results):
    """Identity/reference metrics agree exactly across seeds (they come from the closed form)."""
    results = smoke_results[3]
    for claim in CLAIMS:
        if claim.metric is None or "smoke" not in claim.profiles:
            continue
        values = {r.metrics[claim.metric] for r in results}
        if claim.kind in ("identity", "reference"):
            assert len(values) == 1, claim.id
