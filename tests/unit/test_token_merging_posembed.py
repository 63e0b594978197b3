"""token_merging's fixed 2-D sin-cos positional embedding (``vit.pos_embed: sincos``): exact values on small
grids, a negative control (rows and columns swapped), the model's use of it (a fixed buffer that training does
not move and the checkpoint carries), and the config errors."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from tasks.common.io import save_state_dict
from tasks.token_merging import method, train
from tasks.token_merging.config import DigitsDataConfig, TrainConfig, ViTConfig
from tasks.token_merging.model import build_vit, load_vit


def _check_grid2_dim8(embed_fn) -> None:
    """Hand-computed: dim 8 -> quarter 2, w = (1, 10000^-1/2 = 0.01); patch (row i, column j) is at index
    1 + 2 i + j and reads [sin(j w), cos(j w), sin(i w), cos(i w)]."""
    table = embed_fn(2, 8)
    assert table.shape == (5, 8)
    assert torch.equal(table[0], torch.zeros(8))  # cls: no position
    s1, c1, s01, c01 = math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)
    expected_row1_col0 = torch.tensor([0.0, 0.0, 1.0, 1.0, s1, s01, c1, c01])
    expected_row0_col1 = torch.tensor([s1, s01, c1, c01, 0.0, 0.0, 1.0, 1.0])
    torch.testing.assert_close(table[3], expected_row1_col0, rtol=0, atol=1e-7)
    torch.testing.assert_close(table[2], expected_row0_col1, rtol=0, atol=1e-7)
    torch.testing.assert_close(table[1], torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]), rtol=0, atol=0)


def test_sincos_exact_values_grid2_dim8():
    _check_grid2_dim8(method.sincos_pos_embed_2d)


def test_sincos_exact_values_grid2_dim4():
    table = method.sincos_pos_embed_2d(2, 4)  # w = (1,)
    s1, c1 = math.sin(1), math.cos(1)
    expected = torch.tensor([[0, 0, 0, 0], [0, 1, 0, 1], [s1, c1, 0, 1], [0, 1, s1, c1], [s1, c1, s1, c1]],
                            dtype=torch.float32)
    torch.testing.assert_close(table, expected, rtol=0, atol=1e-7)


def test_negative_control_rows_and_columns_swapped_is_caught():
    def swapped(grid: int, dim: int) -> torch.Tensor:
        table = method.sincos_pos_embed_2d(grid, dim)
        half = dim // 2
        return torch.cat([table[:, half:], table[:, :half]], dim=1)

    with pytest.raises(AssertionError):
        _check_grid2_dim8(swapped)


def test_sincos_needs_dim_divisible_by_4():
    with pytest.raises(ValueError, match="dim"):
        method.sincos_pos_embed_2d(2, 6)


def _shape(pos_embed: str) -> method.ViTShape:
    return method.ViTShape(image_size=4, patch_size=1, channels=1, dim=8, depth=2, heads=2, mlp_dim=16,
                           n_classes=10, pos_embed=pos_embed)


def test_sincos_model_embeds_the_fixed_table():
    model = method.MergeViT(_shape("sincos"))
    with torch.no_grad():
        tokens = model.embed(torch.zeros(1, 1, 4, 4))[0]
    table = method.sincos_pos_embed_2d(4, 8)
    torch.testing.assert_close(tokens[1:], table[1:] + model.patch_embed.bias, rtol=0, atol=1e-6)
    torch.testing.assert_close(tokens[0], model.cls_token[0, 0], rtol=0, atol=0)
    assert "pos_embed" not in dict(model.named_parameters())


def test_learned_model_keeps_a_trainable_embedding():
    model = method.MergeViT(_shape("learned"))
    assert "pos_embed" in dict(model.named_parameters())
    assert not torch.equal(model.pos_embed[0], method.sincos_pos_embed_2d(4, 8))


def test_training_does_not_move_the_sincos_table_and_a_checkpoint_round_trips(tmp_path):
    data_cfg = DigitsDataConfig(image_size=8)
    vit = ViTConfig(patch_size=2, dim=8, depth=2, heads=2, pos_embed="sincos")
    model = build_vit(vit, data_cfg, seed=0)
    before = model.pos_embed.clone()
    head_before = model.head.weight.clone()
    cfg = TrainConfig(epochs=1, batch_size=4, lr=1e-2, max_shift=0)
    train.train_vit(model, cfg, torch.rand(8, 1, 8, 8), torch.arange(8) % 10, seed=0)
    assert torch.equal(model.pos_embed, before)
    assert not torch.equal(model.head.weight, head_before)  # training did run
    save_state_dict(model, tmp_path / "vit.safetensors")
    loaded = load_vit(vit, data_cfg, tmp_path)
    x = torch.rand(3, 1, 8, 8)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


@pytest.mark.parametrize(("saved", "loaded"), [("learned", "sincos"), ("sincos", "learned")])
def test_checkpoint_of_the_other_embedding_kind_fails_to_load(tmp_path, saved, loaded):
    data_cfg = DigitsDataConfig(image_size=8)
    save_state_dict(build_vit(ViTConfig(patch_size=2, dim=8, depth=2, heads=2, pos_embed=saved), data_cfg, 0),
                    tmp_path / "vit.safetensors")
    with pytest.raises(RuntimeError, match="pos_embed"):
        load_vit(ViTConfig(patch_size=2, dim=8, depth=2, heads=2, pos_embed=loaded), data_cfg, tmp_path)


def test_config_pos_embed_errors_name_the_key():
    with pytest.raises(ValidationError, match="pos_embed"):
        ViTConfig(patch_size=1, dim=10, depth=2, heads=2, pos_embed="sincos")
    with pytest.raises(ValidationError, match="pos_embed"):
        ViTConfig(patch_size=1, dim=8, depth=2, heads=2, pos_embed="rope")
    assert ViTConfig(patch_size=1, dim=8, depth=2, heads=2).pos_embed == "learned"
