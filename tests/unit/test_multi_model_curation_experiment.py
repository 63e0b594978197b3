"""multi_model_curation: params fragment, data phase, run_seed at the smoke profile, claims, figures,
and the paper profile's hub loop on tiny local stand-ins (no network)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tasks.common.claims import evaluate_claims, load_claims
from tasks.common.params import ParamsError, params_section, validate_paper_section
from tasks.multi_model_curation import experiment, figures, method
from tasks.multi_model_curation.config import CONFIG

PAPER_DIR = Path(__file__).resolve().parents[2] / "tasks" / "multi_model_curation"
FRAGMENT = params_section("multi_model_curation")
CLAIMS = load_claims(PAPER_DIR / "claims.yaml")


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    """run_seed at the smoke profile for seeds 0 and 1 (the analytic part is shared and cheap)."""
    root = tmp_path_factory.mktemp("mmc")
    config = CONFIG.model_validate(FRAGMENT["smoke"])
    written = experiment.write_data(config, (0, 1), root / "data")
    results = [experiment.run_seed(config, seed, root / "data", root / "models") for seed in (0, 1)]
    return config, root, written, results


def test_fragment_profiles_validate():
    configs = validate_paper_section("multi_model_curation", FRAGMENT)
    assert set(configs) == {"smoke", "cpu", "paper"}
    assert configs["paper"].hub is not None and configs["cpu"].hub is None
    assert configs["cpu"].sampled.k_small == 16 and configs["cpu"].sampled.k_large == 64


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda f: f["cpu"]["sampled"].update(n_samples=10), r"multi_model_curation\.cpu\.sampled\.n_samples"),
    (lambda f: f["cpu"]["sampled"].update(k_small=64, k_large=16), r"multi_model_curation\.cpu\.sampled: .*k_small"),
    (lambda f: f["smoke"]["analytic"].update(typo=1), r"multi_model_curation\.smoke\.analytic\.typo: unknown key"),
    (lambda f: f["cpu"].update(device="tpu"), r"multi_model_curation\.cpu\.device"),
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


def test_run_seed_returns_every_claim_metric_and_is_json(smoke_results):
    _, _, _, results = smoke_results
    needed = set()
    for claim in CLAIMS:
        if claim.metric and set(claim.profiles) & {"smoke", "cpu"}:
            measured = [claim, *claim.preconditions]
            needed |= {m.metric for m in measured if m.counts is None}
            needed |= {name for m in measured if m.counts for name in (m.counts.successes, m.counts.trials)}
    for result in results:
        assert needed <= set(result["metrics"]), needed - set(result["metrics"])
        assert all(np.isfinite(v) for v in result["metrics"].values())
        json.dumps(result)
    rows = evaluate_claims(CLAIMS, {r["seed"]: r["metrics"] for r in results}, "cpu", "multi_model_curation")
    assert len(rows) == len(CLAIMS)
    untestable = {r["verdict"] for r in rows if r["metric"] is None or r["metric"].startswith("hub_")}
    assert untestable == {"not testable at this profile"}


def test_run_seed_is_deterministic_and_seed_dependent(smoke_results):
    config, root, _, results = smoke_results
    again = experiment.run_seed(config, 0, root / "data", root / "models")
    drop = {k for k in again["metrics"] if k.startswith("seconds_")}
    assert {k: v for k, v in again["metrics"].items() if k not in drop} == \
        {k: v for k, v in results[0]["metrics"].items() if k not in drop}
    assert results[0]["metrics"]["dampen_dA1_klarge"] != results[1]["metrics"]["dampen_dA1_klarge"]
    # Analytic parts do not depend on the seed.
    assert results[0]["metrics"]["analytic_self_invert_A1"] == results[1]["metrics"]["analytic_self_invert_A1"]
    assert (root / "models" / "seed0" / "neural_generators.safetensors").is_file()


def test_analytic_metrics_at_smoke_match_the_brief(smoke_results):
    metrics = smoke_results[3][0]["metrics"]
    assert metrics["analytic_dampen_A1"] == pytest.approx(-0.948, abs=1e-3)
    assert metrics["c1_divergent_flagged"] == 1.0 and metrics["c1_convergent_flagged_count"] == 0.0
    assert metrics["c5_cross_influence_uncoupled_max_abs"] < 1e-9
    assert metrics["c5_net_sign_flips"] == 1.0


def test_claim_signs_are_the_analytic_prediction():
    """Every sign check of a sampled chord in claims.yaml (claims and their preconditions) is the sign
    of the K -> infinity chord, so no threshold was set from sampled results."""
    analytic = experiment.analytic_chords(CONFIG.model_validate(FRAGMENT["smoke"]).analytic)
    isolated = method.chord_effect(method.canonical_specs()["self_invert_isolated"], 0, 0.6, 4.0)
    checked = 0
    for claim in [m for c in CLAIMS for m in (c, *c.preconditions)]:
        if claim.check is None or claim.check.op != "sign" or not ("_dA" in claim.metric or "_dsum" in claim.metric):
            continue
        name, _, rest = claim.metric.rpartition("_d")
        if name == "self_invert_isolated":
            expected = np.sign(isolated[0])
        elif rest.startswith("sum"):
            expected = np.sign(analytic[name].sum())
        else:
            expected = np.sign(analytic[name][int(rest[1]) - 1])
        assert claim.check.value == expected, claim.metric
        checked += 1
    assert checked == 14 + 7  # 14 claims, 7 preconditions


def test_stale_data_fails_with_the_key(smoke_results):
    config, root, _, _ = smoke_results
    bigger = config.model_copy(update={"sampled": config.sampled.model_copy(update={"real_pool": 6000})})
    with pytest.raises(ValueError, match=r"sampled\.real_pool: .* rerun the data phase"):
        experiment.run_seed(bigger, 0, root / "data", root / "models")
    with pytest.raises(FileNotFoundError, match=r"sampled\.real_pool: .*missing"):
        experiment.run_seed(config, 7, root / "data", root / "models")


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
    assert sorted(p.name for p in made) == ["alignment_trajectories.png", "influence_heatmap.png", "sign_table.png"]
    assert all(p.stat().st_size > 1000 for p in made)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "alignment_trajectories.csv", "influence_heatmap.csv", "sign_table.csv"]


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
    from tasks.multi_model_curation import hub_loop
    from tasks.multi_model_curation.config import HubConfig

    paths = _stand_ins(tmp_path)
    hub = HubConfig(generators=[paths["gen_a"], paths["gen_b"]], reward_models=[paths["reward"]],
                    prompts_dataset=paths["prompts"], prompts_split="train", prompt_column="prompt",
                    response_column="chosen", n_prompts=8, n_eval_prompts=2, k=3, rounds=1, beta=[5.0, 0.0],
                    mixing=[[0.1, 0.7], [0.7, 0.1]], real_share=0.2, max_new_tokens=4, sft_steps=2, batch_size=4,
                    lr=1e-3, dtype="float32")
    metrics, curves = hub_loop.run_hub_loop(hub, seed=0, device="cpu", out_dir=tmp_path / "out")
    assert set(metrics) == {"hub_A1_final", "hub_A2_final", "hub_A1_gain", "hub_A2_gain"}
    assert all(np.isfinite(v) for v in metrics.values())
    assert len(curves["hub_A1"]) == 2
    assert (tmp_path / "out" / "generator1" / "model.safetensors").is_file()


def test_response_text_reads_chat_and_plain():
    from tasks.multi_model_curation.data import response_text

    assert response_text("plain") == "plain"
    assert response_text([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]) == "a"
    with pytest.raises(ValueError, match="response_column"):
        response_text(3)


def test_sampled_divergence_uses_the_library_flag(smoke_results, monkeypatch):
    """The sampled divergent loop is flagged by method.divergence_flag (no thresholds of its own):
    flagged as is, and not flagged when the library's flag is broken to never fire."""
    config, root, _, _ = smoke_results
    real = experiment.load_real_data(config, 0, root / "data")[0]
    longer = config.sampled.model_copy(update={"rounds": 30})  # 12 smoke rounds stop at v ~ 0.012 > 1e-2
    flagged, _ = experiment.sampled_divergent(longer, 0, real)
    assert flagged["c1_divergent_sampled_runs"] == config.sampled.divergent_replicates == 2
    assert flagged["c1_divergent_sampled_flagged_count"] == 2.0
    monkeypatch.setattr(method, "divergence_flag", lambda *args, **kwargs: False)
    broken, _ = experiment.sampled_divergent(longer, 0, real)
    assert broken["c1_divergent_sampled_flagged_count"] == 0.0


def test_divergent_replicates_are_independent_loops(smoke_results):
    """C1d's binomial trials: the replicate loops of one seed use different random streams (the first
    keeps the single loop's stream), so their variance paths differ."""
    config, root, _, _ = smoke_results
    real = experiment.load_real_data(config, 0, root / "data")[0]
    spec = method.canonical_specs()["divergent"]
    k, rounds, n = config.sampled.k_small, config.sampled.rounds, config.sampled.n_samples
    first = method.iterate_sampled(spec, rounds, k, n, real, experiment.loop_rng(0, 5, k))
    second = method.iterate_sampled(spec, rounds, k, n, real, experiment.loop_rng(0, 5, k, 1))
    _, curve = experiment.sampled_divergent(config.sampled, 0, real)
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
    assert {i for i, k in kinds.items() if k == "mechanism"} == {"C1e", "C1f"}


def test_verification_rows_are_seed_independent(smoke_results):
    """Identity/reference metrics agree exactly across seeds (they come from the closed form)."""
    results = smoke_results[3]
    for claim in CLAIMS:
        if claim.metric is None or "smoke" not in claim.profiles:
            continue
        values = {r["metrics"][claim.metric] for r in results}
        if claim.kind in ("identity", "reference"):
            assert len(values) == 1, claim.id
