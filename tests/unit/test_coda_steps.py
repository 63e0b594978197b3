"""coda outside the core math: the params fragment, the data phase and its checks, the train -> evaluate ->
claim_metrics steps at the smoke profile (every claim's metric present, checkpoints written and read back),
figures from their results, the paper-profile LFM path on a tiny local stand-in (no network)."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from tasks.coda import claim_metrics as cm
from tasks.coda import data, evaluate, figures, hub, method, model, train
from tasks.coda.config import CONFIG, LfmConfig
from tasks.common.claims import load_claims
from tasks.common.io import write_parquet
from tasks.common.params import ParamsError, params_section, validate_paper_section
from tasks.common.results import SeedResult

TASK_DIR = Path(__file__).resolve().parents[2] / "tasks" / "coda"
SLUG = "coda"


def profile_section() -> dict:
    return params_section("coda")


def smoke_config():
    return CONFIG.model_validate(profile_section()["smoke"])


def test_only_the_paper_profile_runs_the_lfm_study():
    configs = validate_paper_section(SLUG, profile_section())
    assert configs["paper"].lfm is not None and configs["cpu"].lfm is None
    assert len(configs["cpu"].data.tasks) == 6


@pytest.mark.parametrize("path,value,message", [
    (("cpu", "model", "coda_rank"), 0, "coda.cpu.model.coda_rank"),
    (("cpu", "model", "coda_rank"), 64, "r << N"),
    (("smoke", "data", "tasks"), ["sine"], "unknown task"),
    (("cpu", "data", "dt_low"), 0.5, "dt_low"),
    (("cpu", "study", "two_layer_tasks"), ["lorenz", "lorenz"], "distinct"),
])
def test_bad_values_name_the_key(path, value, message):
    section = copy.deepcopy(profile_section())
    node = section
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ParamsError, match=message.replace(".", r"\.")):
        validate_paper_section(SLUG, section)


def test_study_tasks_must_be_run():
    raw = profile_section()["smoke"]
    raw["study"]["convert_tasks"] = ["lorenz"]
    with pytest.raises(ValueError, match="study.convert_tasks"):
        CONFIG.model_validate(raw)


@pytest.mark.parametrize("name", ["lotka_volterra", "lorenz", "van_der_pol", "glucose_insulin",
                                  "oscillator_regimes", "occupancy"])
def test_every_task_is_seeded_irregular_and_standardised(name):
    cfg = CONFIG.model_validate(profile_section()["cpu"]).data.model_copy(update={"n_train": 64, "n_val": 16,
                                                                                          "n_test": 16})
    first, again, other = (data.make_task(cfg, name, s) for s in (0, 0, 1))
    assert np.array_equal(first.inputs, again.inputs) and not np.array_equal(first.inputs, other.inputs)
    assert first.dt.min() >= cfg.dt_low - 1e-6 and first.dt.max() <= cfg.dt_high + 1e-6
    assert np.allclose(np.round(first.dt / cfg.dt_resolution) * cfg.dt_resolution, first.dt, atol=1e-6)
    assert np.isfinite(first.inputs).all() and first.inputs.shape[:2] == (96, cfg.seq_len)
    assert list(first.split) == ["train"] * 64 + ["val"] * 16 + ["test"] * 16
    train_inputs = first.inputs[:64, :, :-1]
    assert np.allclose(train_inputs.mean(axis=(0, 1)), 0, atol=1e-4)
    assert np.allclose(train_inputs.std(axis=(0, 1)), 1, atol=1e-3)
    if first.kind == "classify":
        assert set(np.unique(first.targets)) == set(range(first.n_outputs))
    else:
        assert first.mask.sum() > 0 and first.targets.shape[-1] == first.n_outputs


def test_lorenz_hides_and_scores_only_the_horizon():
    cfg = smoke_config().data.model_copy(update={"tasks": ["lorenz"]})
    task = data.make_task(cfg, "lorenz", 0)
    h = cfg.forecast_horizon
    assert (task.mask[:, -h:] == 1).all() and (task.mask[:, :-h] == 0).all()
    assert (task.inputs[:, -h:, 3] == task.inputs[0, -1, 3]).all()  # the observed flag is constant in the horizon


def run_steps(cfg, seed: int, data_dir: Path, model_dir: Path) -> tuple[SeedResult, SeedResult, SeedResult]:
    """train, evaluate, and the merged result with the claim metrics (as the flow composes them)."""
    trained = train.train(cfg, seed, data_dir, model_dir)
    evaluated = evaluate.evaluate(cfg, seed, data_dir, model_dir)
    merged = trained.merged(evaluated)
    return trained, evaluated, merged.add(cm.claim_metrics(cfg, merged))


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("coda")
    cfg = smoke_config()
    written = data.write_data(cfg, (0,), root / "data")
    return cfg, root, written, run_steps(cfg, 0, root / "data", root / "models" / "seed0")


def test_write_data_outputs(smoke_run):
    cfg, root, written, _ = smoke_run
    assert [p.name for p in written] == ["lotka_volterra_seed0.parquet"]
    assert pl.read_parquet(written[0]).height == cfg.data.n_train + cfg.data.n_val + cfg.data.n_test
    assert not [p for p in (root / "data").iterdir() if p.name.endswith(".partial")]


def test_steps_return_every_claim_metric(smoke_run):
    cfg, root, _, (trained, evaluated, result) = smoke_run
    claims = load_claims(TASK_DIR / "claims.yaml")
    needed = set()
    for c in claims:
        if c.metric is not None and not c.metric.startswith("lfm_"):  # C3b, C3d (paper only) still run at smoke
            for measured in [c, *c.preconditions]:
                needed |= {measured.metric} | ({measured.counts.successes, measured.counts.trials}
                                               if measured.counts else set())
    assert needed <= set(result.metrics), needed - set(result.metrics)
    assert not needed & set(trained.metrics)  # training returns curves and its own timings only
    assert all(isinstance(v, float) and np.isfinite(v) for v in result.metrics.values())
    assert result.metrics["nfe_ratio_ltc_over_coda"] == 6.0
    assert result.metrics["coda_max_real_eig_plus_eps"] <= 0
    assert result.metrics["zoh_vs_rk4_max_abs_error"] <= 1e-5
    weights = sorted(p.name for p in (root / "models" / "seed0").iterdir())
    assert weights == sorted(f"lotka_volterra_{m}.safetensors" for m in (
        "ltc_L1", "coda_L1", "gru_dense_L1", "gru_L1", "ltc_L2", "coda_L2", "coda_converted_L1", "coda_converted_L2",
        "coda_distilled_L1", "coda_distilled_L2"))
    assert {(r["model"], r["layers"]) for r in trained.tables["training"]} == {
        (r["model"], r["layers"]) for r in evaluated.tables["models"]}
    # C3c's untrained 1- and 2-layer stacks, costed on the cost task
    assert sorted((r["model"], r["layers"]) for r in evaluated.tables["costs"]) == [
        ("coda", 1), ("coda", 2), ("ltc", 1), ("ltc", 2)]
    # every model early-stopped within max_epochs, with its validation curve logged
    assert all(1 <= r["epochs"] <= cfg.train.max_epochs for r in trained.tables["training"])
    assert all(len(trained.curves[f"val_loss_{r['task']}_{r['model']}_L{r['layers']}"]) == r["epochs"]
               for r in trained.tables["training"])


def test_paper_only_claims_are_the_lfm_ones_and_the_one_task_studies():
    """C4a-c need the LFM study; C3b and C3d do not run at cpu (the budget trains the 1-layer models to
    convergence, README) and run on every task at the paper profile."""
    claims = load_claims(TASK_DIR / "claims.yaml")
    assert {c.metric for c in claims if c.profiles == ["paper"]} == {
        "lfm_train_speedup", "lfm_inference_speedup", "lfm_perplexity_ratio", "two_layer_parity_fraction",
        "converted_parity_fraction"}
    cpu, paper = (CONFIG.model_validate(params_section("coda")[p]) for p in ("cpu", "paper"))
    assert cpu.study.two_layer_tasks == cpu.study.convert_tasks == []
    assert paper.study.two_layer_tasks == paper.study.convert_tasks == paper.data.tasks


def digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_training_is_deterministic_and_evaluation_reads_the_checkpoints(smoke_run, tmp_path):
    cfg, root, _, (_, evaluated, result) = smoke_run
    _, again_evaluated, again = run_steps(cfg, 0, root / "data", tmp_path / "seed0")
    assert digests(root / "models" / "seed0") == digests(tmp_path / "seed0")  # bit-identical checkpoints
    deterministic = [k for k in result.metrics if not k.startswith(("seconds_", "measured_"))]
    assert {k: result.metrics[k] for k in deterministic} == {k: again.metrics[k] for k in deterministic}
    # evaluation measures what is on disk: a changed checkpoint changes the score
    path = model.checkpoint_path(tmp_path / "seed0", "lotka_volterra", "gru", 1)
    task = data.read_task(cfg.data, "lotka_volterra", 0, root / "data")
    gru = model.load_model("gru", 1, task, cfg.model, tmp_path / "seed0", "gru", "cpu")
    with torch.no_grad():
        gru.head.bias.add_(1.0)
    model.save_model(gru, tmp_path / "seed0", "lotka_volterra", "gru", 1)
    assert path.is_file()
    changed = evaluate.evaluate(cfg, 0, root / "data", tmp_path / "seed0")
    assert changed.metrics["mse_lotka_volterra_gru_L1"] != evaluated.metrics["mse_lotka_volterra_gru_L1"]
    path.unlink()
    with pytest.raises(FileNotFoundError):
        evaluate.evaluate(cfg, 0, root / "data", tmp_path / "seed0")


def test_figures_build_from_results(smoke_run, tmp_path):
    cfg, _, _, (_, _, result) = smoke_run
    other = SeedResult.from_dict(result.to_dict() | {"seed": 1})
    made = figures.make_figures(cfg, [result, other], tmp_path / "figures", tmp_path / "plots")
    assert sorted(p.name for p in made) == ["models.csv", "pareto.png", "speedup.csv", "speedup.png"]
    assert all(p.stat().st_size > 0 for p in made)
    models = pl.read_csv(tmp_path / "plots" / "models.csv")
    assert models["seed"].unique().sort().to_list() == [0, 1]
    assert models.filter(pl.col("model") == "ltc")["seconds_per_epoch"].min() > 0  # joined from training


def test_stale_or_missing_data_is_rejected_naming_the_key(smoke_run, tmp_path):
    cfg, root, _, _ = smoke_run
    longer = cfg.model_copy(update={"data": cfg.data.model_copy(update={"seq_len": 30})})
    for step in (train.train, evaluate.evaluate):
        with pytest.raises(ValueError, match=r"coda\.data\.seq_len"):
            step(longer, 0, root / "data", tmp_path)
        with pytest.raises(FileNotFoundError, match="data phase"):
            step(cfg, 7, root / "data", tmp_path)


# ----------------------------------------------------------------------------------------------------
# Paper profile on a tiny local LFM2 stand-in
# ----------------------------------------------------------------------------------------------------

def tiny_lfm():
    from transformers import Lfm2Config, Lfm2ForCausalLM

    config = Lfm2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"],
                        max_position_embeddings=64)
    torch.manual_seed(0)
    return Lfm2ForCausalLM(config).eval()


TINY_LFM = LfmConfig(model="local", n_train_texts=1, n_eval_texts=1, seq_len=16, batch_size=4, distill_steps=3,
                     finetune_steps=2, gru_hidden=8, rank=4, timing_steps=1, dtype="float32")


def test_lfm_conversion_replaces_short_convs_and_measures(tmp_path):
    teacher = tiny_lfm()
    blocks = torch.randint(0, 64, (12, 16), generator=torch.Generator().manual_seed(0))
    before = teacher.state_dict()["model.layers.0.conv.in_proj.weight"].clone()
    student, distill, losses = hub.convert_and_finetune(teacher, blocks[:8], TINY_LFM, seed=0)
    assert (len(distill), len(losses)) == (3, 2)
    assert torch.equal(teacher.state_dict()["model.layers.0.conv.in_proj.weight"], before)  # teacher untouched
    assert isinstance(student.model.layers[0].conv, hub.CodaTokenMixer)
    assert not hasattr(student.model.layers[1], "conv")
    rows = hub.measure_models(teacher, student, blocks[:8], blocks[8:], TINY_LFM)
    assert [r["model"] for r in rows] == ["original", "coda"]
    ratios = cm.lfm_ratios(rows)
    assert set(ratios) == {"lfm_train_speedup", "lfm_inference_speedup", "lfm_perplexity_ratio"}
    assert all(np.isfinite(v) and v > 0 for v in ratios.values())
    # the checkpoint round trip (tied embeddings stored once) gives the same student
    hub.save_student(student, tmp_path)
    loaded = hub.load_student(teacher, TINY_LFM, 0, tmp_path)
    assert hub.perplexity(loaded, blocks[8:], 4) == rows[1]["perplexity"]


def test_lfm_train_and_evaluate_steps_on_the_stand_in(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "load_lfm", lambda name, dtype: (tiny_lfm(), None))
    blocks = torch.randint(0, 64, (12, 16), generator=torch.Generator().manual_seed(0))
    metrics, curves = hub.train_student(TINY_LFM, 0, blocks[:8], tmp_path, "cpu")
    assert np.isfinite(metrics["lfm_final_finetune_loss"]) and len(curves["lfm_finetune_loss"]) == 2
    assert (tmp_path / hub.STUDENT).is_file()
    rows = hub.evaluate_student(TINY_LFM, 0, (blocks[:8], blocks[8:]), tmp_path, "cpu")
    assert rows[1]["perplexity"] != rows[0]["perplexity"]  # the student, not a second copy of the teacher


def test_token_blocks_and_missing_blocks():
    class CharTokenizer:
        def __call__(self, text):
            return {"input_ids": [ord(c) % 50 for c in text]}

    blocks = hub.token_blocks(CharTokenizer(), ["abcdefgh", "ijklm"], seq_len=4)
    assert blocks.shape == (3, 4) and blocks[0].tolist() == [ord(c) % 50 for c in "abcd"]
    with pytest.raises(ValueError, match="seq_len"):
        hub.token_blocks(CharTokenizer(), ["ab"], seq_len=4)
    cfg = LfmConfig(model="local", n_train_texts=1, n_eval_texts=1, seq_len=8, batch_size=1, distill_steps=0,
                    finetune_steps=0)
    with pytest.raises(FileNotFoundError, match="data phase"):
        hub.read_blocks(cfg, Path("/nonexistent"), "train")


def test_stale_token_blocks_name_the_key(tmp_path):
    cfg = LfmConfig(model="local", n_train_texts=1, n_eval_texts=1, seq_len=8, batch_size=1, distill_steps=0,
                    finetune_steps=0)
    blocks = pl.DataFrame({"input_ids": np.zeros((2, 4), dtype=np.int64)})
    write_parquet(blocks, hub.text_blocks_path(tmp_path, "train"))
    with pytest.raises(ValueError, match=r"coda\.lfm\.seq_len"):
        hub.read_blocks(cfg, tmp_path, "train")


# ----------------------------------------------------------------------------------------------------
# Claim metrics: planted rows, the trained-block checks and their negative control, input checks
# ----------------------------------------------------------------------------------------------------

def _row(task, model_name, layers, score, kind="forecast", ms=1.0, chance=10.0, converged=True):
    return {"task": task, "kind": kind, "model": model_name, "layers": layers, "score": score, "nfe_per_step": 1.0,
            "train_step_flops": 1.0, "inference_flops": 1.0, "ms_train_step_paired": ms,
            "ms_inference_batch_paired": ms, "chance_score": chance, "untrained_val_loss": 1.0, "converged": converged}


def planted(rows: list[dict], costs: list[dict] | None = None) -> SeedResult:
    """A result with the ``models`` (and ``costs``) tables and validation curves whose convergence under the
    smoke profile's rule (patience 2, 1%, no warm-up, no initial drop: best <= the untrained loss of 1.0) is each
    row's ``converged``: a curve that fell and then stayed flat for the patience, or one still falling at the cap."""
    curves = {f"val_loss_{r['task']}_{r['model']}_L{r['layers']}": [1.0, 0.5, 0.5, 0.5] if r.pop("converged")
              else [3.0, 2.0, 1.0] for r in rows}
    return SeedResult(0).add(curves=curves, tables={"models": rows, "costs": costs or []})


def without_ablation_and_costs(cfg, **study):
    return cfg.model_copy(update={"study": cfg.study.model_copy(update={"ablation": False, "cost_tasks": []}
                                                                 | study)})


def test_claim_metrics_on_planted_rows():
    cfg = without_ablation_and_costs(smoke_config(), baselines=["gru"])
    rows = [_row("lotka_volterra", "ltc", 1, 1.0, ms=10.0), _row("lotka_volterra", "coda", 1, 1.05, ms=2.0),
            _row("lotka_volterra", "gru", 1, 0.5),
            _row("lotka_volterra", "ltc", 2, 0.1, ms=20.0), _row("lotka_volterra", "coda", 2, 1.0, ms=2.0),
            _row("lotka_volterra", "coda_converted", 1, 1.0), _row("lotka_volterra", "coda_converted", 2, 1.0)]
    metrics = cm.claim_metrics(cfg, planted(rows))
    assert metrics["parity_fraction"] == 1.0  # 1.05 <= 1.1 x 1.0
    assert metrics["parity_fraction_vs_best_baseline"] == 0.0  # 1.05 > 1.1 x 0.5 (GRU)
    assert metrics["two_layer_parity_fraction"] == 0.0  # 1.0 > 1.1 x 0.1
    assert metrics["converted_parity_fraction"] == 0.5  # each against its own-depth teacher: L1 yes, L2 no
    assert metrics["measured_train_time_ratio_coda_over_ltc_5of6"] == 0.2
    assert "flops_speedup_2layer_over_1layer_min" not in metrics  # no cost_tasks: C3c's rows are not made
    # the binomial claims' counts (one task: one trial each) and their preconditions
    assert (metrics["parity_count"], metrics["parity_trials"]) == (1.0, 1.0)
    assert metrics["parity_vs_best_baseline_count"] == 0.0
    assert (metrics["two_layer_parity_count"], metrics["two_layer_trials"]) == (0.0, 1.0)
    assert (metrics["converted_parity_count"], metrics["converted_trials"]) == (1.0, 2.0)
    for name in ("ltc_learned", "best_baseline_learned", "ltc_L2_learned", "ltc_coda_converged",
                 "best_baseline_coda_converged", "two_layer_converged"):
        assert (metrics[f"{name}_count"], metrics[f"{name}_fraction"]) == (1.0, 1.0), name
    assert (metrics["teacher_learned_count"], metrics["converted_converged_count"]) == (2.0, 2.0)
    for name in ("ltc_coda", "best_baseline_coda", "two_layer"):  # the two parts of convergence
        assert (metrics[f"{name}_stopped_count"], metrics[f"{name}_left_plateau_count"]) == (1.0, 1.0), name
    assert (metrics["ltc_competitive_count"], metrics["ltc_competitive_fraction"]) == (0.0, 0.0)  # 1.0 > 1.1 x 0.5


def test_ltc_competitiveness_is_parity_with_the_best_baseline_of_each_task():
    """C3a's third precondition: the LTC, as candidate, at parity (same rule) with the task's best baseline."""
    cfg = without_ablation_and_costs(smoke_config(), baselines=["cfc", "gru"], two_layer_tasks=[], convert_tasks=[])
    cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"tasks": ["lotka_volterra", "occupancy"]})})
    rows = [_row("lotka_volterra", "ltc", 1, 0.54), _row("lotka_volterra", "coda", 1, 0.5),
            _row("lotka_volterra", "cfc", 1, 0.5), _row("lotka_volterra", "gru", 1, 0.9),  # 0.54 <= 1.1 x 0.5
            _row("occupancy", "ltc", 1, 90.0, kind="classify", chance=50.0),
            _row("occupancy", "coda", 1, 95.0, kind="classify", chance=50.0),
            _row("occupancy", "cfc", 1, 80.0, kind="classify", chance=50.0),
            _row("occupancy", "gru", 1, 92.5, kind="classify", chance=50.0)]  # 90 < 92.5 - 2
    metrics = cm.claim_metrics(cfg, planted(rows))
    assert (metrics["ltc_competitive_count"], metrics["parity_trials"]) == (1.0, 2.0)
    assert metrics["ltc_competitive_fraction"] == 0.5
    assert metrics["parity_count"] == 2.0  # CoDA at parity with both LTCs: the precondition is what tells them apart


def test_parity_preconditions_count_a_reference_at_chance_and_an_unconverged_model():
    cfg = without_ablation_and_costs(smoke_config(), baselines=["gru"])
    # the LTC scores 1.0 and a mean-target predictor 1.05: chance is at parity with it (1.05 <= 1.1), so CoDA's
    # parity with it is no evidence; the 2-layer CoDA has not converged
    rows = [_row("lotka_volterra", "ltc", 1, 1.0, chance=1.05), _row("lotka_volterra", "coda", 1, 1.0, chance=1.05),
            _row("lotka_volterra", "gru", 1, 0.5, chance=1.05),
            _row("lotka_volterra", "ltc", 2, 0.5, chance=1.05),
            _row("lotka_volterra", "coda", 2, 0.5, chance=1.05, converged=False),
            _row("lotka_volterra", "coda_converted", 1, 1.0, chance=1.05)]
    metrics = cm.claim_metrics(cfg, planted(rows))
    assert metrics["parity_count"] == 1.0 and metrics["ltc_learned_count"] == 0.0
    assert metrics["best_baseline_learned_count"] == 1.0  # 1.05 > 1.1 x 0.5: the GRU learned
    assert metrics["ltc_L2_learned_count"] == 1.0 and metrics["two_layer_converged_count"] == 0.0
    # its curve [3, 2, 1] was still falling (not stopped) but its best, 1.0, is not above the untrained 1.0
    assert (metrics["two_layer_stopped_count"], metrics["two_layer_left_plateau_count"]) == (0.0, 1.0)
    assert metrics["teacher_learned_count"] == 0.0 and metrics["converted_converged_count"] == 1.0
    # classification: learned means chance accuracy < the reference's accuracy - 2 points
    study = cfg.study
    assert cm.learned(_row("t", "ltc", 1, 40.0, kind="classify", chance=37.9), study)
    assert not cm.learned(_row("t", "ltc", 1, 40.0, kind="classify", chance=38.0), study)


def test_evaluation_reports_scores_and_chance_per_model():
    rows = [_row("lotka_volterra", "ltc", 1, 1.0), _row("lotka_volterra", "coda_converted", 1, 2.0),
            _row("occupancy", "gru", 2, 90.0, kind="classify", chance=60.0)]
    rows[1].pop("nfe_per_step")
    assert evaluate.row_metrics(rows) == {
        "nfe_per_step_ltc_L1": 1.0, "mse_lotka_volterra_ltc_L1": 1.0, "mse_lotka_volterra_chance": 10.0,
        "mse_lotka_volterra_coda_converted_L1": 2.0, "nfe_per_step_gru_L2": 1.0, "acc_occupancy_gru_L2": 90.0,
        "acc_occupancy_chance": 60.0}


def test_chance_score_is_the_majority_class_or_the_mean_target():
    labels = model.Split(torch.zeros(5, 2, 1), torch.ones(5, 2), torch.tensor([0, 1, 1, 2, 1]), torch.ones(5, 2))
    test = model.Split(torch.zeros(4, 2, 1), torch.ones(4, 2), torch.tensor([1, 1, 0, 2]), torch.ones(4, 2))
    assert evaluate.chance_score("classify", labels, test) == 50.0  # majority class 1: 2 of 4 test labels
    # forecasting: the constant is the mean over the SCORED training steps only (mask), per output dimension
    targets = torch.tensor([[[1.0], [100.0]], [[3.0], [100.0]]])  # the unscored step holds 100
    train_split = model.Split(torch.zeros(2, 2, 1), torch.ones(2, 2), targets, torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
    test = model.Split(torch.zeros(1, 2, 1), torch.ones(1, 2), torch.tensor([[[2.0], [5.0]]]),
                       torch.tensor([[0.0, 1.0]]))
    assert evaluate.chance_score("forecast", train_split, test) == pytest.approx(9.0)  # (5 - 2)^2 on the scored step


def test_linear_ode_checks_on_blocks_and_their_negative_control(monkeypatch):
    torch.manual_seed(0)
    block = method.CodaBlock(2, 4, gru_hidden=3, rank=4, eps=1e-2)
    with torch.no_grad():
        block.s.mul_(20.0)  # a large skew part: harmless for the correct K, destabilising for the broken one
    sequence_model = method.SequenceModel([block], torch.nn.Linear(4, 1), "forecast")
    dt = torch.full((2, 3), 0.1)
    good = evaluate.linear_ode_checks([sequence_model], dt, seed=0)
    assert good["coda_max_real_eig_plus_eps"] <= 1e-6 and good["zoh_vs_rk4_max_abs_error"] <= 1e-5
    correct = method.stable_generator
    monkeypatch.setattr(method, "stable_generator", lambda p, s, eps: correct(p, s, eps) + 2 * s.transpose(-1, -2))
    assert evaluate.linear_ode_checks([sequence_model], dt, seed=0)["coda_max_real_eig_plus_eps"] > 0


def test_paired_timings_cover_every_model_and_phase():
    cfg = smoke_config()
    task = data.make_task(cfg.data, "lotka_volterra", 0)
    train_split, test = model.task_splits(task, "cpu")
    models = {kind: model.build_model(kind, 1, task, cfg.model, 0) for kind in ("ltc", "coda")}
    medians = evaluate.paired_timings(models, train_split.take(slice(0, 4)), test.take(slice(0, 4)), repeats=2)
    assert set(medians) == {"ltc", "coda"}
    assert all(set(p) == {"train", "inference"} and all(v > 0 for v in p.values()) for p in medians.values())
    assert all(p.grad is None for m in models.values() for p in m.parameters())


def test_lfm_blocks_are_checked_before_any_training(smoke_run, tmp_path, monkeypatch):
    cfg, root, _, _ = smoke_run
    with_lfm = cfg.model_copy(update={"lfm": LfmConfig(model="local", n_train_texts=1, n_eval_texts=1, seq_len=8,
                                                        batch_size=1, distill_steps=0, finetune_steps=0)})

    def no_compute(*args, **kwargs):
        raise AssertionError("training started before the inputs were checked")

    monkeypatch.setattr(train, "train_model", no_compute)
    with pytest.raises(FileNotFoundError, match="coda.lfm"):
        train.train(with_lfm, 0, root / "data", tmp_path)
