"""constrained_unlearning outside the core math: the params fragment, the data phase and its checks,
run_seed at the smoke profile (every claim's metric present), figures from its results, paper-profile loaders."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from tasks.common.claims import load_claims
from tasks.common.params import ParamsError, params_section, validate_paper_section
from tasks.constrained_unlearning import data, experiment, figures
from tasks.constrained_unlearning.config import CONFIG

TASK_DIR = Path(__file__).resolve().parents[2] / "tasks" / "constrained_unlearning"
SLUG = "constrained_unlearning"


def fragment() -> dict:
    return params_section("constrained_unlearning")


def smoke_config():
    return CONFIG.model_validate(fragment()["smoke"])


def test_fragment_validates_every_profile():
    configs = validate_paper_section(SLUG, fragment())
    assert set(configs) == {"smoke", "cpu", "paper"}
    assert configs["cpu"].ddpm is not None and configs["paper"].hub is not None
    assert configs["cpu"].device == "auto"


@pytest.mark.parametrize("path,value,message", [
    (("cpu", "ddpm", "layers"), 0, "constrained_unlearning.cpu.ddpm.layers"),
    (("smoke", "grid", "dual_lr", "lu"), -1.0, "constrained_unlearning.smoke.grid.dual_lr.lu"),
    (("cpu", "mixture", "close_offset"), 0.5, "close_offset"),
    (("cpu", "baselines", "esd_eta"), [0.1, -1.0], "esd_eta"),
    (("cpu", "mixture", "surprise"), 1, "unknown key"),
    (("cpu", "device"), "tpu", "constrained_unlearning.cpu.device"),
    (("cpu", "data_unlearn", "radius_sigmas"), 2.0, "radius_sigmas"),
    (("cpu", "data_unlearn", "n_points"), 8, "n_points"),
    (("smoke", "data_unlearn", "duplicates"), 1, "constrained_unlearning.smoke.data_unlearn.duplicates"),
])
def test_bad_values_name_the_key(path, value, message):
    section = copy.deepcopy(fragment())
    node = section
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(ParamsError, match=message.replace(".", r"\.")):
        validate_paper_section(SLUG, section)


def test_unlearning_without_a_ddpm_section_is_rejected():
    raw = fragment()["smoke"]
    raw.pop("ddpm")
    with pytest.raises(ValueError, match="need a ddpm section"):
        CONFIG.model_validate(raw)


def test_mixture_table_is_seeded_and_well_formed():
    cfg = smoke_config().mixture
    first, again, other = (data.mixture_table(cfg, s) for s in (0, 0, 1))
    assert first.equals(again) and not first.equals(other)
    assert first["role"].to_list().count("forget") == 1 and first["role"].to_list()[-1] == "close"
    assert first["weight"].sum() == pytest.approx(1.0)
    q, forget, close = data.mixture_from_table(first)
    assert np.linalg.norm(close - forget.means[0]) == pytest.approx(cfg.close_offset)
    assert np.linalg.norm(forget.means[0]) == pytest.approx(cfg.ring_radius)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("cu")
    cfg = smoke_config()
    written = experiment.write_data(cfg, (0,), root / "data")
    result = experiment.run_seed(cfg, 0, root / "data", root / "models")
    return cfg, root, written, result


def test_write_data_outputs(smoke_run):
    cfg, root, written, _ = smoke_run
    assert sorted(p.name for p in written) == ["mixture_seed0.parquet", "train_seed0.parquet"]
    assert pl.read_parquet(root / "data" / "train_seed0.parquet").height == cfg.mixture.n_train
    assert not [p for p in (root / "data").iterdir() if p.name.endswith(".partial")]


def test_run_seed_returns_every_claim_metric(smoke_run):
    _, root, _, result = smoke_run
    assert result["seed"] == 0
    claims = load_claims(TASK_DIR / "claims.yaml")
    needed = set()
    for claim in claims:
        for measured in (claim, *claim.preconditions):
            if measured.metric is not None:
                needed.add(measured.metric)
            if measured.counts is not None:
                needed |= {measured.counts.successes, measured.counts.trials}
    assert needed <= set(result["metrics"]), needed - set(result["metrics"])
    assert all(isinstance(v, float) for v in result["metrics"].values())
    assert {"tradeoff", "samples"} <= set(result["tables"])
    weights = sorted(p.name for p in (root / "models" / "seed0").iterdir())
    assert weights == ["data_unlearned_fu.safetensors", "memorised.safetensors", "pretrained.safetensors"] + [
        f"unlearned_{f}.safetensors" for f in ("fu", "lu", "ru")]


def test_smoke_exact_claims_hold(smoke_run):
    """Stage A is exact at every profile: the smoke run must already satisfy its checks."""
    metrics = smoke_run[3]["metrics"]
    for f in ("ru", "fu", "lu"):
        assert metrics[f"a_{f}_tv_to_closed_form"] < 1e-3
        assert metrics[f"a_{f}_lambda_rel_error"] < 0.01
        assert metrics[f"a_{f}_min_lambda"] >= 0
    assert metrics["a_lu_over_ru_retained_kl"] < 0.5
    assert metrics["c6_esd_eta_at_lambda_two_thirds"] == pytest.approx(2.0)


def test_run_seed_is_deterministic(smoke_run, tmp_path):
    cfg, root, _, result = smoke_run
    again = experiment.run_seed(cfg, 0, root / "data", tmp_path / "models")
    same = {k: v for k, v in result["metrics"].items() if not k.startswith("seconds_")}
    np.testing.assert_equal(same, {k: v for k, v in again["metrics"].items() if not k.startswith("seconds_")})
    assert result["tables"]["tradeoff"] == again["tables"]["tradeoff"]


def test_figures_build_from_results(smoke_run, tmp_path):
    cfg, _, _, result = smoke_run
    other = copy.deepcopy(result) | {"seed": 1}
    made = figures.make_figures(cfg, [result, other], tmp_path / "figures", tmp_path / "plots")
    names = sorted(p.name for p in made)
    assert names == ["data_unlearning.png", "lambda_trajectories.csv", "lambda_trajectories.png", "samples.png",
                     "tradeoff.csv", "tradeoff.png"]
    assert all(p.stat().st_size > 0 for p in made)
    assert pl.read_csv(tmp_path / "plots" / "tradeoff.csv")["seed"].unique().sort().to_list() == [0, 1]


def test_stale_data_is_rejected_naming_the_key(smoke_run, tmp_path):
    cfg, root, _, _ = smoke_run
    changed = cfg.model_copy(update={"mixture": cfg.mixture.model_copy(update={"ring_radius": 3.0})})
    with pytest.raises(ValueError, match="`mixture`"):
        experiment.run_seed(changed, 0, root / "data", tmp_path)
    fewer = cfg.model_copy(update={"mixture": cfg.mixture.model_copy(update={"n_train": 500})})
    with pytest.raises(ValueError, match="mixture.n_train"):
        experiment.run_seed(fewer, 0, root / "data", tmp_path)
    with pytest.raises(FileNotFoundError, match="data phase"):
        experiment.run_seed(cfg, 7, root / "data", tmp_path)


def test_paper_profile_loader_without_diffusers_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_diffusers(name, *args, **kwargs):
        if name == "diffusers":
            raise ImportError("no diffusers")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_diffusers)
    with pytest.raises(ImportError, match="pip install diffusers peft"):
        data.load_diffusion_pipeline("CompVis/stable-diffusion-v1-4")


def test_paper_profile_hub_section_is_refused_before_any_compute(tmp_path):
    """The paper profile names Stable Diffusion checkpoints whose Stage B is not implemented: both phases
    fail at once, naming the key, instead of running the toy in their place (the data folder is absent, so a
    late check would fail with FileNotFoundError instead)."""
    paper = CONFIG.model_validate(fragment()["paper"])
    with pytest.raises(NotImplementedError, match=r"constrained_unlearning\.paper\.hub"):
        experiment.run_seed(paper, 0, tmp_path / "absent", tmp_path / "models")
    with pytest.raises(NotImplementedError, match=r"constrained_unlearning\.paper\.hub"):
        experiment.write_data(paper, (0,), tmp_path / "data")
    assert not (tmp_path / "data").exists() and not (tmp_path / "models").exists()
    without_hub = paper.model_copy(update={"hub": None})
    experiment.refuse_unimplemented(without_hub)  # Stage A alone is allowed


def test_retained_kl_at_mass_reads_both_runs_at_the_target_mass():
    before = {"forget_mass": 0.09, "retained_kl": 0.03}
    # A run that hit the target exactly keeps its own value.
    assert experiment.retained_kl_at_mass(before, {"forget_mass": 0.05, "retained_kl": 0.2}, 0.05) == pytest.approx(0.2)
    # Overshoot (4% forget mass): read halfway back along the segment to the pretrained point.
    assert experiment.retained_kl_at_mass(before, {"forget_mass": 0.01, "retained_kl": 0.23}, 0.05) == \
        pytest.approx(0.13)
    # Undershoot (6%): extrapolated along the same segment.
    assert experiment.retained_kl_at_mass(before, {"forget_mass": 0.07, "retained_kl": 0.08}, 0.05) == \
        pytest.approx(0.13)
    # Negative control: the unmatched ratio of two runs at different masses differs from the matched one.
    lu = {"forget_mass": 0.03, "retained_kl": 0.05}
    ru = {"forget_mass": 0.07, "retained_kl": 0.08}
    matched = experiment.retained_kl_at_mass(before, lu, 0.05) / experiment.retained_kl_at_mass(before, ru, 0.05)
    assert abs(matched - lu["retained_kl"] / ru["retained_kl"]) > 0.1


def test_c4b_ratio_is_at_matched_mass(smoke_run):
    """C4b's metric is the ratio of the two runs' retained KL read at the target forget mass, not of their raw
    end points; the raw ratio, the KL above the floor and the mass gap are reported next to it."""
    cfg, _, _, result = smoke_run
    m = result["metrics"]
    target = cfg.grid.target_forget_mass
    before = {"forget_mass": m["b_pretrained_forget_mass"], "retained_kl": m["b_pretrained_retained_kl"]}
    at = {f: experiment.retained_kl_at_mass(before, {"forget_mass": m[f"b_{f}_forget_mass"],
                                                     "retained_kl": m[f"b_{f}_retained_kl"]}, target)
          for f in ("lu", "ru")}
    assert m["b_lu_over_ru_retained_kl"] == pytest.approx(at["lu"] / at["ru"])
    floor = m["b_pretrained_retained_kl"]
    assert m["b_lu_retained_kl_above_floor"] == pytest.approx(at["lu"] - floor)
    assert m["b_ru_retained_kl_above_floor"] == pytest.approx(at["ru"] - floor)
    assert m["b_lu_ru_forget_mass_gap"] == pytest.approx(abs(m["b_lu_forget_mass"] - m["b_ru_forget_mass"]))
    assert m["b_lu_over_ru_retained_kl_unmatched"] == pytest.approx(m["b_lu_retained_kl"] / m["b_ru_retained_kl"])


def test_forget_counts_are_the_binomial_counts_of_the_forget_mass(smoke_run):
    """C5a-c are decided on Clopper-Pearson intervals of pooled counts: every forget mass is an integer
    count of evaluation samples over the number of samples, and the experiment reports both."""
    cfg, _, _, result = smoke_run
    m = result["metrics"]
    assert m["b_eval_samples"] == cfg.ddpm.eval_samples
    for name in ("pretrained", "ru", "fu", "lu"):
        count = m[f"b_{name}_forget_count"]
        assert count == int(count) and 0 <= count <= m["b_eval_samples"]
        assert count / m["b_eval_samples"] == pytest.approx(m[f"b_{name}_forget_mass"], abs=1e-12)


def test_claim_kinds_of_the_paper():
    """Issue 14: identities of the implementation and seed-independent reference numbers are verification rows;
    the memorisation of the test bed (formerly C3a) is C3b's precondition, not a claim; ratios use the log interval
    and the forget mass (a rate) the binomial."""
    claims = {c.id: c for c in load_claims(TASK_DIR / "claims.yaml")}
    identity = {f"C1{x}" for x in "abcdefghi"} | {"C6a", "C6b"}
    reference = {"C4c", "C4d", "C4e", "C4f", "C5d", "C5e", "C5f"}
    assert {i for i, c in claims.items() if c.kind == "identity"} == identity
    assert {i for i, c in claims.items() if c.kind == "reference"} == reference
    assert "C3a" not in claims
    pre = claims["C3b"].preconditions[0]
    assert (pre.metric, pre.check.op, pre.check.value, pre.interval) == ("c_memorised_memorisation_ratio", ">=", 2.0,
                                                                         "log")
    assert {i for i, c in claims.items() if c.interval == "log"} == {"C3b", "C3c", "C4a", "C4b"}
    assert {i for i, c in claims.items() if c.interval == "binomial"} == {"C5a", "C5b", "C5c"}


def test_data_unlearning_metrics_are_consistent(smoke_run):
    """Stage C (C3): the memorisation ratios are the near fractions' ratio, the duplicate share is the
    construction's, the forget points and their held-out twins have the same q-density, and the retained-KL
    ratio is over the retrain reference's own floor."""
    cfg, _, _, result = smoke_run
    m, du = result["metrics"], cfg.data_unlearn
    copies = du.n_points * du.duplicates
    assert m["c_duplicate_share"] == pytest.approx(copies / (cfg.mixture.n_train + copies))
    assert m["c_heldout_density_ratio"] == pytest.approx(1.0, abs=1e-3)
    n = cfg.ddpm.eval_samples
    for stage in ("retrain", "memorised", "fu"):
        expected = m[f"c_{stage}_forget_near"] / max(m[f"c_{stage}_heldout_near"], 1 / n)
        assert m[f"c_{stage}_memorisation_ratio"] == pytest.approx(expected)
    assert m["c_fu_retained_kl_over_floor"] == pytest.approx(m["c_fu_retained_kl"] / m["c_retrain_retained_kl"])
    assert m["c_fu_lambda"] >= 0 and len(result["curves"]["c_lambda_fu"]) == du.dual_updates
    sets = {row["set"] for row in result["tables"]["data_unlearning"]}
    assert sets == {"forget_points", "heldout_points", "memorised", "data-unlearned FU"}


def test_data_unlearn_needs_a_ddpm_section():
    raw = copy.deepcopy(fragment()["smoke"])
    for key in ("ddpm", "unlearn", "baselines"):
        raw.pop(key)
    with pytest.raises(ValueError, match="data_unlearn needs a ddpm section"):
        CONFIG.model_validate(raw)
