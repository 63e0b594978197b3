"""token_merging's texture-contrast test bed (issue 18): ``data.texture_digits`` draws each digit cell as a block
of random-sign pixels whose spread is the digit's ink. Exact spreads, signs, shift and determinism from the
generator (no global generator), each with a negative control; the config errors; the bed through the steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.common.claims import load_claims
from tasks.common.params import params_section
from tasks.token_merging import claim_metrics, data, evaluate, train
from tasks.token_merging.config import CONFIG, TextureConfig

FOLDER = Path(__file__).resolve().parents[2] / "tasks" / "token_merging"
TEXTURE = TextureConfig(cell=2, low=0.25, high=1.0, max_shift=1)


def ramp_glyphs() -> tuple[torch.Tensor, torch.Tensor]:
    """Three 4x4 digits with 16 distinct ink values each (not symmetric, so a transposed spread shows)."""
    base = torch.linspace(-1.0, 1.0, 16).view(1, 1, 4, 4)
    return torch.cat([base, -base, base.transpose(-1, -2) * 0.5]), torch.tensor([3, 1, 4])


def expected_spread(glyphs: torch.Tensor, texture: TextureConfig) -> torch.Tensor:
    """The spread of every pixel, written out cell by cell (independent of the library's vectorised form)."""
    n, _, grid, _ = glyphs.shape
    c = texture.cell
    out = torch.empty(n, 1, grid * c, grid * c)
    for i in range(grid):
        for j in range(grid):
            value = texture.low + (texture.high - texture.low) * (glyphs[:, :, i, j] + 1) / 2
            out[:, :, i * c:(i + 1) * c, j * c:(j + 1) * c] = value[..., None, None]
    return out


def texture_failures(shift: int = 0) -> list[str]:
    """What is wrong with ``texture_digits`` on the ramp glyphs (empty when every rule holds)."""
    glyphs, labels = ramp_glyphs()
    images, out_labels = data.texture_digits(glyphs, labels, TEXTURE, torch.Generator().manual_seed(5), shift)
    reference = glyphs
    if shift:  # the shift is the generator's first draw: replay it
        reference = data.random_shift(glyphs, shift, torch.Generator().manual_seed(5))
    spread = expected_spread(reference, TEXTURE)
    failures = []
    if images.shape != (3, 1, 8, 8):
        return [f"shape {tuple(images.shape)}"]
    if not torch.equal(out_labels, labels):
        failures.append("labels changed")
    if not torch.allclose(images.abs(), spread, atol=1e-6, rtol=0):
        failures.append("|pixel| is not the cell's spread low + (high - low)(g + 1) / 2")
    signs = torch.sign(images)
    if not torch.all(signs.abs() == 1):
        failures.append("a pixel is not +-spread")
    cells = signs.unfold(2, 2, 2).unfold(3, 2, 2).reshape(3, 16, 4)
    if int((cells.sum(-1).abs() == 4).sum()) > 12:  # 48 cells of 4 coins: about 6 are all alike by chance
        failures.append("the signs are shared within cells (cells would be near-duplicates)")
    return failures


def test_texture_cells_have_the_digit_as_spread_and_random_signs():
    assert texture_failures() == []


def test_texture_shift_moves_the_digit_by_whole_cells_first():
    assert texture_failures(shift=1) == []
    glyphs, labels = ramp_glyphs()
    moved = data.random_shift(glyphs, 1, torch.Generator().manual_seed(5))
    assert not torch.equal(moved, glyphs)  # the case is not degenerate: some digit did move


def transposed_spread(original):
    def texture_digits(glyphs, labels, texture, generator, shift=0):
        return original(glyphs.transpose(-1, -2), labels, texture, generator, shift)
    return texture_digits


def intensity_instead_of_contrast(original):
    def texture_digits(glyphs, labels, texture, generator, shift=0):
        images, out = original(glyphs, labels, texture, generator, shift)
        return images.abs(), out
    return texture_digits


def one_sign_per_cell(original):
    def texture_digits(glyphs, labels, texture, generator, shift=0):
        images, out = original(glyphs, labels, texture, generator, shift)
        c = texture.cell
        first = torch.sign(images[..., ::c, ::c]).repeat_interleave(c, 2).repeat_interleave(c, 3)
        return images.abs() * first, out
    return texture_digits


def shift_after_the_signs(original):
    def texture_digits(glyphs, labels, texture, generator, shift=0):
        images, out = original(glyphs, labels, texture, generator, 0)
        return data.random_shift(images, shift, generator) if shift else images, out
    return texture_digits


@pytest.mark.parametrize("broken", [transposed_spread, intensity_instead_of_contrast, one_sign_per_cell])
def test_negative_control_broken_texture_fails(monkeypatch, broken):
    monkeypatch.setattr(data, "texture_digits", broken(data.texture_digits))
    assert texture_failures() != []


def test_negative_control_shift_applied_to_the_pixels_fails(monkeypatch):
    monkeypatch.setattr(data, "texture_digits", shift_after_the_signs(data.texture_digits))
    assert texture_failures(shift=1) != []


def test_texture_is_decided_by_the_generator_and_leaves_the_global_generators_alone():
    glyphs, labels = ramp_glyphs()
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    first, _ = data.texture_digits(glyphs, labels, TEXTURE, torch.Generator().manual_seed(7), shift=1)
    again, _ = data.texture_digits(glyphs, labels, TEXTURE, torch.Generator().manual_seed(7), shift=1)
    other, _ = data.texture_digits(glyphs, labels, TEXTURE, torch.Generator().manual_seed(8), shift=1)
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert torch.equal(torch.get_rng_state(), torch_state) and np.array_equal(np.random.get_state()[1], numpy_state)


def test_texture_signs_are_fair_coins():
    glyphs = torch.zeros(50, 1, 8, 8)
    images, _ = data.texture_digits(glyphs, torch.zeros(50, dtype=torch.long), TEXTURE,
                                    torch.Generator().manual_seed(0))
    share = float((images > 0).double().mean())  # 12,800 coins: sd 0.0044
    assert share == pytest.approx(0.5, abs=0.02)


def test_texture_config_errors_name_the_key():
    raw = params_section("token_merging")["cpu"]
    texture = {"cell": 4, "low": 0.3, "high": 1.0, "max_shift": 1}
    good = raw | {"data": raw["data"] | {"image_size": 64, "texture": texture},
                  "vit": raw["vit"] | {"patch_size": 4}, "train": raw["train"] | {"max_shift": 0}}
    assert CONFIG.model_validate(good).data.texture.cell == 4
    with pytest.raises(ValueError, match="must equal data.texture.cell"):
        CONFIG.model_validate(good | {"vit": good["vit"] | {"patch_size": 2}})
    with pytest.raises(ValueError, match="train.max_shift: must be 0 with data.texture"):
        CONFIG.model_validate(good | {"train": good["train"] | {"max_shift": 1}})
    with pytest.raises(ValueError, match="must be below high"):
        CONFIG.model_validate(good | {"data": good["data"] | {"texture": texture | {"low": 1.0}}})
    with pytest.raises(ValueError, match="a multiple of texture.cell"):
        CONFIG.model_validate(good | {"data": good["data"] | {"image_size": 62}})
    with pytest.raises(ValueError, match="excludes 'scene'"):
        CONFIG.model_validate(good | {"data": good["data"] | {"scene": {"layout": "quadrants"}}})


# ----------------------------------------------------------------------------------------------------
# The texture bed through the steps (a tiny 8x8-cell grid, 2x2 cells: 64 tokens, seconds)
# ----------------------------------------------------------------------------------------------------


def texture_config():
    raw = params_section("token_merging")["smoke"]
    raw["data"] = raw["data"] | {"image_size": 16, "texture": {"cell": 2, "low": 0.3, "high": 1.0, "max_shift": 1}}
    raw["train"] = raw["train"] | {"epochs": 2, "max_shift": 0}
    return CONFIG.model_validate(raw)


def test_texture_steps_draw_fresh_training_textures_every_epoch_and_fixed_test_textures(tmp_path, monkeypatch):
    cfg = texture_config()
    data.write_data(cfg, (0,), tmp_path / "data")
    tensors = data.read_digits_tensors(cfg.data, tmp_path / "data")
    again = data.read_digits_tensors(cfg.data, tmp_path / "data")
    assert tensors["test"][0].shape == (cfg.data.test_size, 1, 16, 16)
    assert torch.equal(tensors["test"][0], again["test"][0])  # the evaluated textures are fixed
    glyphs, _ = data.digits_tensors(data.read_digits(cfg.data, tmp_path / "data")["test"], 8)
    assert torch.allclose(tensors["test"][0].abs(), expected_spread(glyphs, cfg.data.texture), atol=1e-6)
    calls = []
    original = data.texture_digits

    def counting(*args, **kwargs):
        calls.append((args[3], kwargs.get("shift", 0)))
        return original(*args, **kwargs)

    monkeypatch.setattr(data, "texture_digits", counting)
    result = train.train(cfg, 0, tmp_path / "data", tmp_path / "models" / "seed0")
    # two fixed splits read before training (no shift), then one fresh draw per epoch, shifted, same generator
    assert [s for _, s in calls] == [0, 0] + [cfg.data.texture.max_shift] * cfg.train.epochs
    assert calls[2][0] is calls[3][0] and len(result.curves["train_loss"]) == cfg.train.epochs
    monkeypatch.setattr(data, "texture_digits", original)
    evaluated = evaluate.evaluate(cfg, 0, tmp_path / "data", tmp_path / "models" / "seed0")
    metrics = claim_metrics.claim_metrics(cfg, evaluated)
    for claim in load_claims(FOLDER / "claims.yaml"):
        for name in [claim.metric, *(p.metric for p in claim.preconditions)]:
            if name is not None:
                assert name in metrics or name in evaluated.metrics, (claim.id, name)


def test_the_existing_beds_are_unchanged_by_the_texture_key(tmp_path):
    """Without ``texture`` the pixel bed reads exactly the upsampled digits (bit-identical to before)."""
    cfg = CONFIG.model_validate(params_section("token_merging")["smoke"])
    assert cfg.data.texture is None
    data.write_data(cfg, (0,), tmp_path / "data")
    frames = data.read_digits(cfg.data, tmp_path / "data")
    tensors = data.read_digits_tensors(cfg.data, tmp_path / "data")
    for name, frame in frames.items():
        assert torch.equal(tensors[name][0], data.digits_tensors(frame, cfg.data.image_size)[0])


# ----------------------------------------------------------------------------------------------------
# The fixed splits' textures: train (M4's calibration) and test draw different signs, and both follow split_seed
# ----------------------------------------------------------------------------------------------------


def split_texture_failures(tmp_path: Path) -> list[str]:
    """What is wrong with the fixed splits' textures (empty when every rule holds). The signs do not depend on
    the ink (a fair coin per pixel), so comparing sign patterns compares the draws on a shared glyph shape."""
    signs = {}
    for split_seed in (0, 1):
        cfg = texture_config()
        cfg = cfg.model_copy(update={"data": cfg.data.model_copy(update={"split_seed": split_seed})})
        data.write_data(cfg, (0,), tmp_path / f"data{split_seed}")
        tensors = data.read_digits_tensors(cfg.data, tmp_path / f"data{split_seed}")
        signs[split_seed] = {name: torch.sign(images) for name, (images, _) in tensors.items()}
    failures = []
    n = min(len(signs[0]["train"]), len(signs[0]["test"]))
    if torch.equal(signs[0]["train"][:n], signs[0]["test"][:n]):
        failures.append("the train (calibration) and test splits draw the same signs")
    if torch.equal(signs[0]["test"], signs[1]["test"]):
        failures.append("the test textures do not depend on split_seed")
    return failures


def test_fixed_splits_draw_different_signs_and_follow_the_split_seed(tmp_path):
    assert split_texture_failures(tmp_path) == []


def test_negative_control_same_generator_for_train_and_test_fails(tmp_path, monkeypatch):
    monkeypatch.setitem(data.SCENE_SPLIT_OFFSET, "train", data.SCENE_SPLIT_OFFSET["test"])
    assert split_texture_failures(tmp_path) == ["the train (calibration) and test splits draw the same signs"]


def test_negative_control_test_textures_ignoring_split_seed_fails(tmp_path, monkeypatch):
    original = data.read_digits_tensors

    def split_seed_ignored(cfg, data_dir):
        if cfg.texture is None:
            return original(cfg, data_dir)
        grid = cfg.image_size // cfg.texture.cell
        return {name: data.texture_digits(*data.digits_tensors(frame, grid), cfg.texture,
                                          torch.Generator().manual_seed(data.SCENE_SPLIT_OFFSET[name]))
                for name, frame in data.read_digits(cfg, data_dir).items()}

    monkeypatch.setattr(data, "read_digits_tensors", split_seed_ignored)
    assert split_texture_failures(tmp_path) == ["the test textures do not depend on split_seed"]
