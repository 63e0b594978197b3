"""token_merging's config validators, the contract's steps (data, train, evaluate, claim_metrics, figures) at
the smoke profile, and the paper profile's loaders on local stand-ins (no network)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from tasks.common.claims import load_claims
from tasks.common.params import ParamsError, params_section, validate_paper_section
from tasks.common.results import SeedResult
from tasks.token_merging import claim_metrics, data, evaluate, figures, model, sweep, train
from tasks.token_merging.config import CONFIG

FOLDER = Path(__file__).resolve().parents[2] / "tasks" / "token_merging"


def fragment() -> dict:
    return params_section("token_merging")


def smoke_config():
    return CONFIG.model_validate(fragment()["smoke"])


def test_the_configs_own_validator_names_the_key():
    """The paper's cross-field check through params validation; the generic checks (every profile validates,
    a bad number or an unknown key names its key) are tests/unit/test_paper_contracts.py."""
    configs = validate_paper_section("token_merging", fragment())
    assert configs["paper"].hub is not None and configs["cpu"].hub is None
    bad = fragment()
    bad["cpu"]["vit"]["heads"] = 5  # 48 is not divisible by 5
    with pytest.raises(ParamsError, match=r"token_merging\.cpu\.vit: .*divisible by heads"):
        validate_paper_section("token_merging", bad)


@pytest.mark.parametrize(("path", "value", "message"), [
    (("merge", "retentions"), [0.5, 0.25], "must start with 1.0"),
    (("merge", "retentions"), [1.0, 0.25, 0.5], "strictly decreasing"),
    (("merge", "retentions"), [1.0, 0.5], "at least one value <= aggressive_retention"),
    (("isotropic", "retentions"), [0.3], "1/r must be an integer"),
    (("vit", "patch_size"), 3, "must divide data.image_size"),
])
def test_config_validators_give_clear_errors(path, value, message):
    raw = fragment()["smoke"]
    raw[path[0]][path[1]] = value
    with pytest.raises(ValidationError, match=message):
        CONFIG.model_validate(raw)


def test_paper_profile_excludes_the_digits_model():
    raw = fragment()["paper"] | {"vit": fragment()["cpu"]["vit"]}
    with pytest.raises(ValidationError, match="'hub' .* excludes"):
        CONFIG.model_validate(raw)


def test_digits_split_is_fixed_and_stale_data_is_rejected(tmp_path):
    cfg = smoke_config()
    written = data.write_data(cfg, (0, 1), tmp_path)
    assert sorted(p.name for p in written) == ["digits_meta.json", "digits_test.parquet", "digits_train.parquet"]
    frames = data.read_digits(cfg.data, tmp_path)
    assert frames["test"].height == 100 and frames["train"].height == 200
    assert not set(frames["train"]["index"].to_list()) & set(frames["test"]["index"].to_list())
    images, labels = data.digits_tensors(frames["test"], 16)
    assert images.shape == (100, 1, 16, 16) and float(images.min()) >= -1 and float(images.max()) <= 1
    assert sorted(set(labels.tolist())) == list(range(10))
    other = cfg.data.model_copy(update={"split_seed": 1})
    with pytest.raises(ValueError, match=r"token_merging\.data\.split_seed: .*rerun the data phase"):
        data.read_digits(other, tmp_path)
    with pytest.raises(FileNotFoundError, match="run the data phase first"):
        data.read_digits(cfg.data, tmp_path / "empty")


def test_bad_data_fails_before_any_compute(tmp_path, monkeypatch):
    """train and evaluate read and validate the data before building, loading or training a model, and
    before the isotropic study."""

    def must_not_run(*_args, **_kwargs):
        raise AssertionError("compute started before the data was validated")

    monkeypatch.setattr(train, "train_vit", must_not_run)
    monkeypatch.setattr(train, "build_vit", must_not_run)
    monkeypatch.setattr(evaluate, "load_vit", must_not_run)
    monkeypatch.setattr(sweep, "isotropic_rows", must_not_run)
    cfg = smoke_config()
    for step in (train.train, evaluate.evaluate):
        with pytest.raises(FileNotFoundError, match="run the data phase first"):
            step(cfg, 0, tmp_path / "empty", tmp_path / "models" / "seed0")
    data.write_data(cfg, (0,), tmp_path / "data")
    stale = cfg.model_copy(update={"data": cfg.data.model_copy(update={"split_seed": 1})})
    for step in (train.train, evaluate.evaluate):
        with pytest.raises(ValueError, match=r"token_merging\.data\.split_seed"):
            step(stale, 0, tmp_path / "data", tmp_path / "models" / "seed0")


def test_evaluate_without_a_checkpoint_names_the_train_step(tmp_path):
    cfg = smoke_config()
    data.write_data(cfg, (0,), tmp_path / "data")
    with pytest.raises(FileNotFoundError, match="run the train step first"):
        evaluate.evaluate(cfg, 0, tmp_path / "data", tmp_path / "models" / "seed0")


def test_random_shift_moves_pixels_within_bounds():
    images = torch.zeros(8, 1, 6, 6)
    images[:, 0, 2, 3] = 1.0
    shifted = data.random_shift(images, 1, torch.Generator().manual_seed(0))
    rows, cols = np.nonzero(shifted[:, 0].numpy().sum(0))
    assert shifted.sum() == 8 and all(1 <= r <= 3 for r in rows) and all(2 <= c <= 4 for c in cols)
    assert torch.equal(data.random_shift(images, 0, torch.Generator()), images)


def run_steps(cfg, seed: int, data_dir: Path, model_dir: Path, progress=lambda f, m: None) -> SeedResult:
    """train -> evaluate -> claim_metrics, merged as the flow merges them (tasks/common/paper_flow.py)."""
    result = train.train(cfg, seed, data_dir, model_dir, progress=progress)
    result = result.merged(evaluate.evaluate(cfg, seed, data_dir, model_dir, progress=progress))
    return result.add(claim_metrics.claim_metrics(cfg, result))


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    root = tmp_path_factory.mktemp("token_merging")
    cfg = smoke_config()
    data.write_data(cfg, (0,), root / "data")
    calls: list[float] = []
    first = run_steps(cfg, 0, root / "data", root / "models" / "seed0", progress=lambda f, _m: calls.append(f))
    again = run_steps(cfg, 0, root / "data", root / "models2" / "seed0")
    return cfg, root, first, again, calls


def test_the_steps_return_every_claim_metric(smoke_results):
    _, root, result, _, calls = smoke_results
    metrics = result.metrics
    for claim in load_claims(FOLDER / "claims.yaml"):
        for name in [claim.metric, *(p.metric for p in claim.preconditions)]:
            if name is not None:
                assert name in metrics, (claim.id, name)
                assert np.isfinite(metrics[name]), (claim.id, name)
    assert isinstance(result, SeedResult) and len(result.curves["train_loss"]) == 2  # smoke: 2 epochs
    assert all(isinstance(v, float) for v in metrics.values())
    assert (root / "models" / "seed0" / "vit.safetensors").is_file()
    assert calls and calls[-1] == pytest.approx(1.0)
    # (a)6 at run time: every method is the unmerged model at r = 1.
    assert metrics["r1_max_method_acc_spread"] == 0.0
    assert metrics["decomposition_identity_error"] <= 1e-9
    assert metrics["realised_retention_smallest_r"] == 0.25


def test_the_steps_are_deterministic_given_the_seed(smoke_results):
    _, root, first, again, _ = smoke_results
    strip = {k: v for k, v in first.metrics.items() if not k.startswith("seconds_")}
    assert strip == {k: v for k, v in again.metrics.items() if not k.startswith("seconds_")}
    assert first.curves == again.curves
    checkpoint = Path("seed0") / model.CHECKPOINT
    assert (root / "models" / checkpoint).read_bytes() == (root / "models2" / checkpoint).read_bytes()


def test_evaluate_reads_the_saved_checkpoint(smoke_results, tmp_path):
    """Evaluation measures the model on disk, not a fresh one: with the weights replaced by another seed's
    initialisation the accuracies change (negative control), with the checkpoint copied they do not."""
    cfg, root, first, _, _ = smoke_results
    copied = tmp_path / "copied"
    copied.mkdir()
    (copied / model.CHECKPOINT).write_bytes((root / "models" / "seed0" / model.CHECKPOINT).read_bytes())
    again = evaluate.evaluate(cfg, 0, root / "data", copied)
    assert again.tables["sweep"] == first.tables["sweep"]
    untrained = tmp_path / "untrained"
    from tasks.common.io import save_state_dict

    save_state_dict(model.build_vit(cfg.vit, cfg.data, seed=7), untrained / model.CHECKPOINT)
    other = evaluate.evaluate(cfg, 0, root / "data", untrained)
    assert other.tables["sweep"] != first.tables["sweep"]


def test_claim_metrics_do_not_repeat_the_evaluations_names(smoke_results):
    cfg, _, first, _, _ = smoke_results
    measured = SeedResult(0).add(tables=first.tables)
    derived = claim_metrics.claim_metrics(cfg, measured)
    assert derived == {k: first.metrics[k] for k in derived}
    evaluated = {k for k in first.metrics if k.startswith(("acc_", "m4_value_exponent", "seconds_"))}
    assert not set(derived) & evaluated and set(first.metrics) == set(derived) | evaluated


def test_figures_build_from_results(smoke_results, tmp_path):
    cfg, _, first, again, _ = smoke_results
    second = SeedResult(1).add(again.metrics, curves=again.curves, tables=again.tables)
    paths = figures.make_figures(cfg, [first, second], tmp_path / "figures", tmp_path / "plots")
    assert {p.suffix for p in paths} == {".png", ".csv"}
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths)


# ----------------------------------------------------------------------------------------------------
# Paper profile on local stand-ins
# ----------------------------------------------------------------------------------------------------


def _stand_ins(root: Path) -> tuple[Path, Path]:
    """A tiny random ViTForImageClassification + processor, and a "validation" parquet of 20 images."""
    from datasets import ClassLabel, Dataset, Features, Image
    from PIL import Image as PILImage
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    model_dir, data_dir = root / "tiny-vit", root / "tiny-imagenet"
    config = ViTConfig(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                       intermediate_size=32, num_labels=3)
    torch.manual_seed(0)
    ViTForImageClassification(config).save_pretrained(model_dir)
    ViTImageProcessor(size={"height": 16, "width": 16}).save_pretrained(model_dir)
    rng = np.random.default_rng(0)
    images = [PILImage.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)) for _ in range(20)]
    features = Features({"image": Image(), "label": ClassLabel(num_classes=3)})
    data_dir.mkdir()
    Dataset.from_dict({"image": images, "label": [i % 3 for i in range(20)]}, features=features).to_parquet(
        data_dir / "validation.parquet")
    return model_dir, data_dir


def test_paper_profile_runs_on_local_stand_ins(tmp_path):
    model_dir, dataset_dir = _stand_ins(tmp_path)
    raw = fragment()["paper"]
    raw["hub"] |= {"model": str(model_dir), "dataset": str(dataset_dir), "n_images": 14, "batch_size": 4}
    raw["merge"] |= {"calibration_size": 8, "retentions": [1.0, 0.5, 0.25]}
    raw["isotropic"] |= {"n_queries": 8}
    cfg = CONFIG.model_validate(raw)
    written = data.write_data(cfg, (0,), tmp_path / "data")
    assert written == [tmp_path / "data" / "hub_seed0"]
    result = run_steps(cfg, 0, tmp_path / "data", tmp_path / "models" / "seed0")
    assert not (tmp_path / "models").exists()  # a pretrained checkpoint: nothing trained, nothing saved
    assert result.metrics["r1_max_method_acc_spread"] == 0.0
    assert result.metrics["realised_retention_smallest_r"] == 0.25
    wrong = CONFIG.model_validate(raw | {"hub": raw["hub"] | {"n_images": 15}})
    with pytest.raises(ValueError, match=r"token_merging\.hub\.n_images: .*rerun the data phase"):
        evaluate.evaluate(wrong, 0, tmp_path / "data", tmp_path / "models" / "seed0")


def _rows(acc: dict[tuple[str, float], float], angular: dict[tuple[str, float], float],
          kappa: dict[tuple[str, float], float] | None = None) -> list[dict]:
    """Rows of the evaluation's ``sweep`` table (``sweep.sweep_rows``); unmerged cls energy 10."""
    kappa = kappa or {}
    points = [sweep.SweepPoint(method=name, retention=r, realised_retention=r, accuracy=a / 100.0, radial=0.0,
                               angular=angular.get((name, r), 1.0), total=1.0, identity_error=0.0,
                               rms_ratio_last=1.0, rms_ratio_per_block=[1.0],
                               mean_merged_kappa=kappa.get((name, r), 1.0), reference_energy=10.0)
              for (name, r), a in acc.items()]
    return sweep.sweep_rows(points)


def test_sweep_metrics_headroom_precondition_and_correction_gaps():
    """m2_acc_drop_aggressive_mean (C2, and C5b's precondition) is M2's accuracy at r = 1 minus its mean over
    r <= 0.25; the gaps M3 - M2, the M3 / M2 angular ratio, M2's relative angular error (C3b's precondition)
    and M2's mean kappa are taken over the same r."""
    merge = smoke_config().merge.model_copy(update={"retentions": [1.0, 0.5, 0.25, 0.1], "aggressive_retention": 0.25})
    m2 = {1.0: 95.0, 0.5: 94.0, 0.25: 92.0, 0.1: 89.0}  # loses 3 and 6 points at r <= 0.25
    m3 = {1.0: 95.0, 0.5: 93.5, 0.25: 93.0, 0.1: 92.0}
    acc = {(name, r): (m3[r] if name in ("M3", "M4") else m2[r]) for name in ("M1", "M2", "M3", "M4", "M5", "M6")
           for r in m2}
    angular = {("M2", 0.25): 2.0, ("M3", 0.25): 1.0, ("M2", 0.1): 4.0, ("M3", 0.1): 3.0}
    kappa = {("M2", 0.5): 0.5, ("M2", 0.25): 0.9, ("M2", 0.1): 0.7}
    metrics = claim_metrics.sweep_metrics(_rows(acc, angular, kappa), merge)
    assert metrics["m2_angular_relative_min_aggressive"] == pytest.approx(0.2)  # min(2, 4) / energy 10
    assert metrics["m2_kappa_aggressive_mean"] == pytest.approx(0.8)  # (0.9 + 0.7) / 2; r = 0.5 excluded
    assert metrics["m2_acc_drop_aggressive_mean"] == pytest.approx(4.5)  # (3 + 6) / 2 >= 2: headroom
    assert metrics["m2_acc_drop_smallest_r"] == pytest.approx(6.0)
    assert metrics["m3_minus_m2_acc_aggressive_mean"] == pytest.approx(2.0)  # (1 + 3) / 2
    assert metrics["m3_minus_m2_acc_min"] == pytest.approx(-0.5)  # r = 0.5
    assert metrics["m3_over_m2_angular_max_aggressive"] == pytest.approx(0.75)  # max(1 / 2, 3 / 4)
    assert metrics["r1_max_method_acc_spread"] == 0.0
