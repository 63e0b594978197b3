"""token_merging's 256-token scene test bed (issue 18): the scene composer (exact tile placement, labels,
determinism) with negative controls, the scene path through the train and evaluate steps, the new claim
metrics (C1a / C1b), M4's value rescaling in the sweep where it is not a no-op, and the M3 = M4 figure rule."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from tasks.common.claims import load_claims
from tasks.common.params import params_section
from tasks.common.results import SeedResult
from tasks.token_merging import baselines, claim_metrics, data, evaluate, figures, method, sweep, train
from tasks.token_merging.config import CONFIG, SceneConfig

FOLDER = Path(__file__).resolve().parents[2] / "tasks" / "token_merging"
QUADRANTS = SceneConfig(layout="quadrants", noise_std=0.0)


def glyph_set(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """n distinct 8x8 glyphs in [-1, 1]: glyph i is constant (i / n) except a one-pixel mark at (i, i)."""
    glyphs = torch.stack([torch.full((1, 8, 8), i / n) for i in range(n)])
    for i in range(n):
        glyphs[i, 0, i, i] = -1.0
    return glyphs, torch.arange(n) % 10


def quadrant_failures(glyphs: torch.Tensor, labels: torch.Tensor, canvas: int = 16) -> list[str]:
    """What is wrong with the quadrant scenes of these glyphs (empty when every rule holds)."""
    images, scene_labels = data.compose_scenes(glyphs, labels, QUADRANTS, canvas, torch.Generator().manual_seed(3))
    half = canvas // 2
    tiles = F.interpolate(glyphs, size=(half, half), mode="bilinear", align_corners=False)
    failures = []
    if images.shape != (len(labels), 1, canvas, canvas):
        failures.append(f"shape {tuple(images.shape)}")
    if not torch.equal(images[:, :, :half, :half], tiles):
        failures.append("the labelled glyph is not the top-left tile")
    if not torch.equal(scene_labels, labels):
        failures.append("labels are not the top-left glyph's")
    for row, col in ((0, half), (half, 0), (half, half)):
        quadrant = images[:, :, row:row + half, col:col + half]
        if not all(any(torch.equal(q, t) for t in tiles) for q in quadrant):
            failures.append(f"quadrant ({row}, {col}) is not a tile of the set")
    return failures


def test_quadrant_scenes_place_the_labelled_glyph_top_left_and_distractors_from_the_set():
    glyphs, labels = glyph_set()
    assert quadrant_failures(glyphs, labels) == []
    again, _ = data.compose_scenes(glyphs, labels, QUADRANTS, 16, torch.Generator().manual_seed(3))
    same, _ = data.compose_scenes(glyphs, labels, QUADRANTS, 16, torch.Generator().manual_seed(3))
    other, _ = data.compose_scenes(glyphs, labels, QUADRANTS, 16, torch.Generator().manual_seed(4))
    assert torch.equal(again, same) and not torch.equal(again, other)  # the generator decides the distractors


def test_negative_control_a_composer_labelling_a_distractor_fails(monkeypatch):
    original = data.compose_scenes

    def label_of_the_top_right(glyphs, labels, scene, canvas, generator):
        images, _ = original(glyphs, labels, scene, canvas, generator)
        half = canvas // 2
        tiles = F.interpolate(glyphs, size=(half, half), mode="bilinear", align_corners=False)
        top_right = images[:, :, :half, half:]
        which = torch.tensor([next(j for j, t in enumerate(tiles) if torch.equal(q, t)) for q in top_right])
        swapped = images.clone()
        swapped[:, :, :half, :half], swapped[:, :, :half, half:] = top_right, images[:, :, :half, :half]
        return swapped, labels[which]

    monkeypatch.setattr(data, "compose_scenes", label_of_the_top_right)
    glyphs, labels = glyph_set()
    assert quadrant_failures(glyphs, labels) != []


RANDOM_TWO = SceneConfig(layout="random", digits_per_scene=2, noise_std=0.0)
RANDOM_LABELS = torch.tensor([3, 7, 1, 9, 0])


def random_two_digit_failures() -> list[str]:
    """What is wrong with two-digit random scenes of solid glyphs (empty when every rule holds): one 8x8 square
    of ink in each half of a 24-pixel canvas, background -1 elsewhere, label = the larger of the two digits."""
    glyphs = torch.full((5, 1, 8, 8), 1.0)  # solid ink: the pasted squares are exactly the +1 pixels
    images, scene_labels = data.compose_scenes(glyphs, RANDOM_LABELS, RANDOM_TWO, 24, torch.Generator().manual_seed(0))
    failures = []
    ink = images[:, 0] == 1.0
    if not (torch.all(ink[:, :, :12].sum((1, 2)) == 64) and torch.all(ink[:, :, 12:].sum((1, 2)) == 64)):
        failures.append("not one 8x8 digit in each half")
    if not torch.all(images[~(images == 1.0)] == -1.0):
        failures.append("background is not -1")
    partners = torch.randint(0, 5, (5,), generator=torch.Generator().manual_seed(0))  # the composer's first draw
    expected = torch.maximum(RANDOM_LABELS, RANDOM_LABELS[partners])
    if not torch.equal(expected, RANDOM_LABELS):  # the case must tell "larger" from "left" (else the check is void)
        if not torch.equal(scene_labels, expected):
            failures.append(f"labels {scene_labels.tolist()} are not the larger digit's {expected.tolist()}")
    else:
        failures.append("degenerate case: every left digit is already the larger")
    return failures


def test_random_scenes_with_two_digits_label_the_larger_and_keep_the_halves_apart():
    assert random_two_digit_failures() == []
    glyphs = torch.full((5, 1, 8, 8), 1.0)
    single, single_labels = data.compose_scenes(glyphs, RANDOM_LABELS,
                                                RANDOM_TWO.model_copy(update={"digits_per_scene": 1}),
                                                24, torch.Generator().manual_seed(0))
    assert torch.equal(single_labels, RANDOM_LABELS) and torch.all((single[:, 0] == 1.0).sum((1, 2)) == 64)


def composer_labelling_the_left_digit(original):
    def compose(glyphs, labels, scene, canvas, generator):
        images, _ = original(glyphs, labels, scene, canvas, generator)
        return images, labels
    return compose


def composer_with_both_digits_in_the_left_half(original):
    def compose(glyphs, labels, scene, canvas, generator):
        images, scene_labels = original(glyphs, labels, scene, canvas, generator)
        half = canvas // 2
        moved = torch.full_like(images, -1.0)
        moved[..., :half] = images[..., :half]
        moved[..., :half] = torch.maximum(moved[..., :half], images[..., half:])  # the partner pasted on the left
        return moved, scene_labels
    return compose


@pytest.mark.parametrize("broken", [composer_labelling_the_left_digit, composer_with_both_digits_in_the_left_half])
def test_negative_control_broken_random_two_digit_composer_fails(monkeypatch, broken):
    monkeypatch.setattr(data, "compose_scenes", broken(data.compose_scenes))
    assert random_two_digit_failures() != []


def test_scene_noise_has_the_configured_spread():
    glyphs, labels = glyph_set(4)
    noisy, _ = data.compose_scenes(glyphs.repeat(200, 1, 1, 1), labels.repeat(200),
                                   QUADRANTS.model_copy(update={"noise_std": 0.5}), 16,
                                   torch.Generator().manual_seed(0))
    clean, _ = data.compose_scenes(glyphs.repeat(200, 1, 1, 1), labels.repeat(200), QUADRANTS, 16,
                                   torch.Generator().manual_seed(0))
    assert float((noisy - clean).std()) == pytest.approx(0.5, rel=0.02)


def test_scene_config_errors_name_the_key():
    raw = params_section("token_merging")["cpu"]
    raw["data"] = {key: value for key, value in raw["data"].items() if key != "texture"}  # the scene / pixel beds
    scenes = raw["data"] | {"image_size": 32, "scene": {"layout": "quadrants", "noise_std": 0.0}}
    assert CONFIG.model_validate(raw | {"data": scenes}).data.scene.layout == "quadrants"
    with pytest.raises(ValueError, match="a scene canvas must be at least 16"):
        CONFIG.model_validate(raw | {"data": scenes | {"image_size": 8}})
    with pytest.raises(ValueError, match="at most 32 for upsampled digits"):
        CONFIG.model_validate(raw | {"data": raw["data"] | {"image_size": 64}})
    with pytest.raises(ValueError, match="layout"):
        CONFIG.model_validate(raw | {"data": scenes | {"scene": {"layout": "grid"}}})


def test_cpu_profile_is_a_256_token_test_bed():
    cfg = CONFIG.model_validate(params_section("token_merging")["cpu"])
    assert (cfg.data.image_size // cfg.vit.patch_size) ** 2 >= 256


# ----------------------------------------------------------------------------------------------------
# The scene path through the steps (a tiny 16x16 canvas: 64 tokens, seconds)
# ----------------------------------------------------------------------------------------------------


def scene_config():
    raw = params_section("token_merging")["smoke"]
    raw["data"] = raw["data"] | {"image_size": 16, "scene": {"layout": "quadrants", "noise_std": 0.1}}
    raw["train"] = raw["train"] | {"epochs": 2}
    return CONFIG.model_validate(raw)


def test_scene_steps_compose_fresh_training_scenes_every_epoch_and_fixed_test_scenes(tmp_path, monkeypatch):
    cfg = scene_config()
    data.write_data(cfg, (0,), tmp_path / "data")
    tensors = data.read_digits_tensors(cfg.data, tmp_path / "data")
    again = data.read_digits_tensors(cfg.data, tmp_path / "data")
    assert tensors["test"][0].shape == (cfg.data.test_size, 1, 16, 16)
    assert torch.equal(tensors["test"][0], again["test"][0])  # the evaluated scenes are fixed
    calls = []
    original = data.compose_scenes

    def counting(*args):
        calls.append(args[-1])
        return original(*args)

    monkeypatch.setattr(data, "compose_scenes", counting)
    result = train.train(cfg, 0, tmp_path / "data", tmp_path / "models" / "seed0")
    epochs_calls = [g for g in calls if g is not None]
    # two fixed splits read before training, then one fresh draw per epoch from the seed's generator
    assert len(epochs_calls) == 2 + cfg.train.epochs and len(result.curves["train_loss"]) == cfg.train.epochs
    assert epochs_calls[2] is epochs_calls[3]  # the same generator, advanced: each epoch draws new scenes
    monkeypatch.setattr(data, "compose_scenes", original)
    evaluated = evaluate.evaluate(cfg, 0, tmp_path / "data", tmp_path / "models" / "seed0")
    metrics = claim_metrics.claim_metrics(cfg, evaluated)
    for claim in load_claims(FOLDER / "claims.yaml"):
        for name in [claim.metric, *(p.metric for p in claim.preconditions)]:
            if name is not None:
                assert name in metrics or name in evaluated.metrics, (claim.id, name)


# ----------------------------------------------------------------------------------------------------
# C1a / C1b metrics, exact
# ----------------------------------------------------------------------------------------------------


def rms_rows(ratio_last: dict[tuple[str, float], float]) -> list[dict]:
    points = [sweep.SweepPoint(method=name, retention=r, realised_retention=r, accuracy=0.9, radial=0.0, angular=1.0,
                               total=1.0, identity_error=0.0, rms_ratio_last=v, rms_ratio_per_block=[1.0, v],
                               mean_merged_kappa=1.0, reference_energy=10.0)
              for (name, r), v in ratio_last.items()]
    return sweep.sweep_rows(points)


def rms_shift_failures() -> list[str]:
    """C1a / C1b metrics on hand-set last-block RMS ratios (empty when every value is exact): M2 at 0.98 (r = 0.75,
    the mildest merged r), 0.88 and then 1.12 (r = 0.1, the smallest), M1 at 0.7 (r = 0.1), every other 1; the
    shift is |1 - ratio|, so 0.12 / 0.02 / growth 0.10 / M1 0.3, and the same growth when M2 overshoots to 1.12."""
    merge = CONFIG.model_validate(params_section("token_merging")["smoke"]).merge.model_copy(
        update={"retentions": [1.0, 0.75, 0.25, 0.1]})
    ratios = {(m.name, r): 1.0 for m in baselines.ALL_METHODS for r in merge.retentions}
    ratios |= {("M2", 0.75): 0.98, ("M2", 0.1): 0.88, ("M1", 0.1): 0.7}
    metrics = claim_metrics.sweep_metrics(rms_rows(ratios), merge)
    expected = {"m2_rms_shift_smallest_r": 0.12, "m2_rms_shift_mild": 0.02, "m2_rms_shift_growth": 0.10,
                "m1_rms_shift_smallest_r": 0.3}
    failures = [f"{name} = {metrics[name]} (expected {value})" for name, value in expected.items()
                if metrics[name] != pytest.approx(value)]
    ratios[("M2", 0.1)] = 1.12  # the shift is a distance from 1, either way
    overshoot = claim_metrics.sweep_metrics(rms_rows(ratios), merge)["m2_rms_shift_growth"]
    if overshoot != pytest.approx(0.10):
        failures.append(f"growth with the ratio above 1 = {overshoot} (expected 0.10)")
    return failures


def test_rms_shift_metrics_exact():
    assert rms_shift_failures() == []


def sweep_metrics_mildest_is_r1(original):
    """The mildest r taken as retentions[0] (r = 1, where nothing is merged) instead of retentions[1]."""
    def broken(rows, merge):
        metrics = original(rows, merge)
        at_r1 = next(row for row in rows if row["method"] == "M2" and row["retention"] == merge.retentions[0])
        mild = abs(1.0 - at_r1["rms_ratio_last"])
        return metrics | {"m2_rms_shift_mild": mild, "m2_rms_shift_growth": metrics["m2_rms_shift_smallest_r"] - mild}
    return broken


def sweep_metrics_signed_shift(original):
    """The shift as 1 - ratio (signed) instead of |1 - ratio|."""
    def broken(rows, merge):
        metrics = original(rows, merge)
        ratio = {row["retention"]: row["rms_ratio_last"] for row in rows if row["method"] == "M2"}
        smallest, mild = 1.0 - ratio[merge.retentions[-1]], 1.0 - ratio[merge.retentions[1]]
        return metrics | {"m2_rms_shift_smallest_r": smallest, "m2_rms_shift_mild": mild,
                          "m2_rms_shift_growth": smallest - mild}
    return broken


@pytest.mark.parametrize("broken", [sweep_metrics_mildest_is_r1, sweep_metrics_signed_shift])
def test_negative_control_broken_rms_shift_metrics_fail(monkeypatch, broken):
    monkeypatch.setattr(claim_metrics, "sweep_metrics", broken(claim_metrics.sweep_metrics))
    assert rms_shift_failures() != []


# ----------------------------------------------------------------------------------------------------
# M4's value rescaling in the sweep, on a case where it is not a no-op
# ----------------------------------------------------------------------------------------------------


def tiny_model() -> method.MergeViT:
    shape = method.ViTShape(image_size=8, patch_size=1, channels=1, dim=16, depth=3, heads=2, mlp_dim=32,
                            n_classes=10)
    torch.manual_seed(0)
    model = method.MergeViT(shape).double().eval()
    with torch.no_grad():
        model.pos_embed.normal_(0, 0.5)
    return model


def m4_sweep(exponents: list[float]) -> tuple[list[sweep.SweepPoint], float, torch.Tensor, method.MergeViT]:
    model = tiny_model()
    images = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    labels = torch.arange(12) % 10
    merge = CONFIG.model_validate(params_section("token_merging")["smoke"]).merge.model_copy(
        update={"retentions": [1.0, 0.5, 0.25], "value_exponents": exponents})
    points, exponent, _, _ = sweep.merging_sweep(model, images, labels, images[:6], merge)
    return points, exponent, images, model


def m4_rescaling_failures() -> list[str]:
    """With e = +1 forced (the only candidate), M4 must be M3 with merged values scaled by sqrt(r): equal to M3 at
    r = 1, different below, and equal to a forward pass with VALUE_CORRECTED at e = +1 (whose attention is
    checked against the hand softmax in test_token_merging_exact.py)."""
    points, exponent, images, model = m4_sweep([1.0])
    failures = [] if exponent == 1.0 else [f"exponent {exponent}"]
    for r in (1.0, 0.5, 0.25):
        m3, m4 = sweep.point(points, "M3", r), sweep.point(points, "M4", r)
        same = (m3.radial, m3.angular) == (m4.radial, m4.angular)
        if (r == 1.0) != same:
            failures.append(f"r = {r}: M4 {'equals' if same else 'differs from'} M3")
        schedule = method.merge_schedule(model.shape.n_patches, model.shape.depth, r)
        with torch.no_grad():
            direct = model.forward_merged(images, method.VALUE_CORRECTED.with_value_exp(1.0), schedule).cls_residual
            plain = model.forward_merged(images, baselines.PLAIN_AVERAGE, [0] * model.shape.depth).cls_residual
        total, _, _ = method.radial_angular_decomposition(plain, direct)
        if abs(float(total.mean()) - m4.total) > 1e-9 * max(1.0, m4.total):
            failures.append(f"r = {r}: M4's cls error {m4.total} is not the e = +1 pass's {float(total.mean())}")
    return failures


def test_m4_value_rescaling_in_the_sweep_is_not_a_no_op():
    assert m4_rescaling_failures() == []


def test_negative_control_value_scale_ignored_fails(monkeypatch):
    monkeypatch.setattr(method, "value_scale", lambda sizes, r, e: torch.ones_like(sizes))
    assert m4_rescaling_failures() != []


def test_energy_matching_exponent_zero_makes_m4_exactly_m3():
    points, exponent, _, _ = m4_sweep([0.0])
    assert exponent == 0.0
    for r in (1.0, 0.5, 0.25):
        m3, m4 = sweep.point(points, "M3", r), sweep.point(points, "M4", r)
        assert (m3.accuracy, m3.radial, m3.angular) == (m4.accuracy, m4.radial, m4.angular)


def test_figures_draw_one_line_for_m3_and_m4_only_when_every_seed_picked_zero():
    zero = [SeedResult(s).add(m4_value_exponent=0.0) for s in (0, 1)]
    assert figures.m4_is_m3(zero)
    assert not figures.m4_is_m3([*zero, SeedResult(2).add(m4_value_exponent=1.0)])
    assert not figures.m4_is_m3([SeedResult(0)])  # no exponent recorded: draw both


# ----------------------------------------------------------------------------------------------------
# Fused-attention training path: the same function as the reference forward pass
# ----------------------------------------------------------------------------------------------------


def fused_matches_reference() -> bool:
    model = tiny_model()
    images = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        return torch.allclose(model.forward_fused(images), model(images), rtol=0, atol=1e-12)


def test_forward_fused_equals_the_reference_forward():
    assert fused_matches_reference()


def test_negative_control_fused_attention_with_the_wrong_scale_fails(monkeypatch):
    original = F.scaled_dot_product_attention
    monkeypatch.setattr(method.F, "scaled_dot_product_attention", lambda q, k, v: original(q, k, v, scale=1.0))
    assert not fused_matches_reference()


def test_training_uses_the_fused_path_only_when_configured(monkeypatch):
    cfg = scene_config()
    model = tiny_model().float()
    used = []
    monkeypatch.setattr(method.MergeViT, "forward_fused", lambda self, x: used.append("fused") or self.forward(x))
    images, labels = torch.randn(8, 1, 8, 8), torch.arange(8)
    train.train_vit(model, cfg.train.model_copy(update={"epochs": 1, "batch_size": 8}), images, labels, seed=0)
    assert used == []
    train.train_vit(model, cfg.train.model_copy(update={"epochs": 1, "batch_size": 8, "fused_attention": True}),
                    images, labels, seed=0)
    assert used == ["fused"]
