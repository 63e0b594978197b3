"""radio1d method: exact values on hand-built inputs, identities of the implementation, and negative controls
that break the library (monkeypatch) and show the same check fails."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.radio1d import method


def grid_tokens(grid: int = 8) -> torch.Tensor:
    """``(1, grid^2, 2)`` row-major tokens whose channels are their (row, col)."""
    rows, cols = torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")
    return torch.stack([rows.flatten(), cols.flatten()], dim=-1)[None].float()


def merge_is_correct() -> bool:
    merged = method.merge_2x2(grid_tokens(), 8)
    if merged.shape != (1, 16, 8):
        return False
    for i in range(4):
        for j in range(4):
            expected = [2 * i, 2 * j, 2 * i + 1, 2 * j, 2 * i, 2 * j + 1, 2 * i + 1, 2 * j + 1]
            if merged[0, 4 * i + j].tolist() != expected:
                return False
    return True


def test_merge_groups_each_2x2_block():
    assert merge_is_correct()


def test_negative_control_row_major_merge_is_caught(monkeypatch):
    # a "merge" that concatenates 4 consecutive row-major tokens: right shape, wrong grouping
    monkeypatch.setattr(method, "merge_2x2", lambda t, grid: t.reshape(t.shape[0], t.shape[1] // 4, 4 * t.shape[2]))
    assert not merge_is_correct()


def test_split_inverts_merge_and_patch_layers_have_the_official_shapes():
    x = torch.randn(2, 64, 6)
    assert torch.equal(method.split_2x2(method.merge_2x2(x, 8), 4), x)
    assert method.PatchMerging(6)(x, 8).shape == (2, 16, 12)
    split = method.PatchSplitting(12)
    y = torch.randn(2, 16, 12)
    out = split(y, 4)
    assert out.shape == (2, 64, 6)
    y2 = y.clone()
    y2[:, 4 * 1 + 2] += 1.0  # token (1, 2) feeds only the block rows 2-3, cols 4-5
    changed = (split(y2, 4) != out).any(-1).any(0).view(8, 8)
    expected = torch.zeros(8, 8, dtype=torch.bool)
    expected[2:4, 4:6] = True
    assert torch.equal(changed, expected)


def test_merge_and_split_reject_bad_grids():
    with pytest.raises(ValueError, match="even square grid"):
        method.merge_2x2(torch.zeros(1, 9, 2), 3)
    with pytest.raises(ValueError, match="cannot be split"):
        method.split_2x2(torch.zeros(1, 16, 6), 4)
    with pytest.raises(ValueError, match="must be even"):
        method.PatchSplitting(5)


def tiny_model(seed: int = 0) -> method.Radio1D:
    torch.manual_seed(seed)
    return method.Radio1D(image_size=16, patch_size=2, width=8, heads=2, depth_before=1, depth_after=1,
                          registers=1, decoder_depth_before=1, decoder_depth_after=1, summary_dim=5,
                          dense_dim=3).eval()


def slicing_holds(model: method.Radio1D) -> bool:
    """Perturbing tokens at positions >= k leaves the decoder output bit-identical; perturbing position k - 1
    changes it."""
    torch.manual_seed(1)
    spatial = torch.randn(2, 16, 16)
    k = torch.tensor([1, 5])
    with torch.no_grad():
        base = model.decode(spatial, k)
        after = spatial.clone()
        after[0, 1:] += torch.randn(15, 16)
        after[1, 5:] += torch.randn(11, 16)
        unchanged = all(torch.equal(a, b) for a, b in zip(model.decode(after, k), base, strict=True))
        inside = spatial.clone()
        inside[0, 0] += 1.0
        inside[1, 4] += 1.0
        moved = model.decode(inside, k)
        changed = all(not torch.equal(moved[1][b], base[1][b]) for b in range(2))
    return unchanged and changed


def test_decoder_ignores_tokens_at_or_after_k():
    model = tiny_model()
    assert slicing_holds(model)
    # no prefix leak: the encoder's cls/register outputs never reach the decoder
    images = torch.rand(2, 1, 16, 16)
    k = torch.tensor([3, 16])
    prefix, spatial = model.encode(images)
    with torch.no_grad():
        base = model(images, k)
        original = model.encode
        model.encode = lambda x: (original(x)[0] + 100.0, original(x)[1])
        leaked = model(images, k)
    assert all(torch.equal(a, b) for a, b in zip(base, leaked, strict=True))


def test_negative_control_leaking_slice_is_caught(monkeypatch):
    monkeypatch.setattr(method, "fill_after_prefix", lambda tokens, k, filler: tokens)
    assert not slicing_holds(tiny_model())


def test_filler_fills_positions_from_k():
    model = tiny_model()
    spatial = torch.randn(2, 16, 16)
    k = torch.tensor([2, 7])
    with torch.no_grad():
        inputs = model.decoder_inputs(spatial, k)
    assert inputs.shape == (2, 2 + 16, 16)
    assert torch.equal(inputs[:, :2], model.dec_prefix.expand(2, -1, -1))
    body = inputs[:, 2:]
    for b, kb in enumerate(k.tolist()):
        assert torch.equal(body[b, :kb], spatial[b, :kb] + model.dec_position[0, :kb])
        assert torch.equal(body[b, kb:], model.filler + model.dec_position[0, kb:])


def test_negative_control_zero_filler_is_caught(monkeypatch):
    monkeypatch.setattr(method, "fill_after_prefix", lambda t, k, filler: torch.where(
        method.keep_mask(k, t.shape[1])[..., None], t, torch.zeros_like(t)))
    model = tiny_model()
    with torch.no_grad():
        body = model.decoder_inputs(torch.randn(1, 16, 16), torch.tensor([2]))[:, 2:]
    assert not torch.equal(body[0, 2:], model.filler + model.dec_position[0, 2:])


def test_keep_mask_exact():
    assert method.keep_mask(torch.tensor([0, 2, 4]), 3).tolist() == [[False] * 3, [True, True, False], [True] * 3]


def test_forward_encoder_is_the_first_k_tokens():
    model = tiny_model()
    images = torch.rand(3, 1, 16, 16)
    with torch.no_grad():
        assert torch.equal(model.forward_encoder(images, 5), model.encode(images)[1][:, :5])
        assert model.forward_encoder(images, 16).shape == (3, 16, 16)
        summary, dense = model(images, torch.tensor([1, 2, 16]))
    assert summary.shape == (3, 5) and dense.shape == (3, 64, 3)
    assert model.max_tokens == 16
    for bad in (0, 17):
        with pytest.raises(ValueError, match="num_tokens"):
            model.forward_encoder(images, bad)
    with pytest.raises(ValueError, match="multiple of 2"):
        method.Radio1D(15, 2, 8, 2, 1, 1, 1, 1, 1, 5, 3)


def triangle_moments(draws: torch.Tensor) -> tuple[float, float, float]:
    return float(draws.double().mean()), float((draws == 1).double().mean()), float((draws == 16).double().mean())


def triangle_holds() -> bool:
    draws = method.sample_num_tokens("triangle", 100_000, 16, torch.Generator().manual_seed(0))
    mean, p1, p16 = triangle_moments(draws)
    # k = 1 iff x < 1/30 with x of density 2(1 - x): P = 1 - (29/30)^2
    return (draws.dtype == torch.long and int(draws.min()) >= 1 and int(draws.max()) <= 16 and abs(mean - 6.0) <= 0.1
            and p1 > p16 and abs(p1 - (1 - (29 / 30) ** 2)) < 0.004)


def test_triangle_sampler_moments():
    assert triangle_holds()


def test_negative_control_increasing_triangle_is_caught(monkeypatch):
    real = method.sample_num_tokens
    monkeypatch.setattr(method, "sample_num_tokens", lambda kind, n, k_max, g, **kw: k_max + 1 - real(
        kind, n, k_max, g, **kw))
    assert not triangle_holds()


def test_other_samplers():
    g = torch.Generator().manual_seed(1)
    uniform = method.sample_num_tokens("uniform", 160_000, 16, g)
    counts = torch.bincount(uniform, minlength=17)[1:].double() / len(uniform)
    assert int(uniform.min()) == 1 and int(uniform.max()) == 16
    assert torch.allclose(counts, torch.full((16,), 1 / 16, dtype=torch.float64), atol=0.003)
    fixed = method.sample_num_tokens("fixed", 10, 16, g, fixed_k=4)
    assert fixed.tolist() == [4] * 10
    beta = method.sample_num_tokens("beta", 100_000, 16, g, beta=(2.0, 2.0))
    assert abs(float(beta.double().mean()) - 8.5) < 0.05  # 1 + 15 * E[x], E[x] = 1/2
    mix = method.sample_num_tokens("gaussian_mixture", 100_000, 16, g, modes=(2.0, 12.0), sigma=0.5)
    share = torch.bincount(mix, minlength=17).double() / len(mix)
    assert abs(float(share[2] + share[12]) - 0.6827) < 0.01  # |z| < 1 rounds onto the mode
    assert abs(float(share[2] - share[12])) < 0.01
    for kind, kwargs, match in (("fixed", {}, "fixed_k"), ("fixed", {"fixed_k": 17}, "fixed_k"),
                                ("gaussian_mixture", {}, "mode"), ("nope", {}, "unknown")):
        with pytest.raises(ValueError, match=match):
            method.sample_num_tokens(kind, 3, 16, g, **kwargs)
    with pytest.raises(ValueError, match="k_max"):
        method.sample_num_tokens("uniform", 3, 0, g)


def test_losses_exact():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    b = torch.tensor([[0.0, 3.0], [0.0, 1.0]])
    assert float(method.summary_loss(a, b)) == pytest.approx((1.0 + 0.0) / 2)
    # dense: location 1: ||(1,-3)||^2 = 10, cos 0 -> 11; location 2: 1, cos 1 -> 1; mean 6
    assert float(method.dense_loss(a[None], b[None])) == pytest.approx(6.0)
    total = method.distillation_loss(a, b, a[None], b[None])
    assert float(total) == pytest.approx(6.5)


def test_average_precision_exact():
    scores = torch.tensor([0.9, 0.8, 0.7, 0.6])
    assert method.average_precision(scores, torch.tensor([1, 0, 1, 0])) == pytest.approx((1 + 2 / 3) / 2)
    assert method.average_precision(scores, torch.tensor([0, 1, 1, 0])) == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert math.isnan(method.average_precision(scores, torch.zeros(4)))
    labels = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 1, 0]])
    assert method.mean_average_precision(labels.float(), labels) == 1.0  # perfect scores; empty column skipped
    two = method.mean_average_precision(torch.tensor([[0.9, 0.1], [0.8, 0.9], [0.7, 0.2]]),
                                        torch.tensor([[0, 1], [1, 1], [0, 0]]))
    # column 0: the positive ranks 2nd -> 1/2; column 1: order (pos, neg, pos) -> (1 + 2/3) / 2
    assert two == pytest.approx((1 / 2 + (1 + 2 / 3) / 2) / 2)
    assert math.isnan(method.mean_average_precision(torch.zeros(2, 2), torch.zeros(2, 2)))


def test_precision_at_1_exact():
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    keys = torch.tensor([[1, 2], [3, 4], [5, 6]])
    assert method.precision_at_1(queries, queries.clone(), keys, keys) == 1.0  # own duplicate in the gallery
    gallery = torch.tensor([[0.9, 0.1], [0.2, 0.8], [-1.0, 0.0]])
    gallery_keys = torch.tensor([[1, 2], [3, 9], [5, 6]])
    # query 0 -> gallery 0 (keys equal), query 1 -> gallery 1 (one key differs), query 2 -> gallery 0
    assert method.precision_at_1(queries, gallery, keys, gallery_keys) == pytest.approx(1 / 3)


def test_held_out_r2_exact():
    x = torch.tensor([[0.0], [1.0], [2.0]])
    assert method.held_out_r2(x, 2 * x + 1, torch.tensor([[5.0]]), torch.tensor([[11.0]]), 1e-12) == \
        pytest.approx(1.0, abs=1e-9)
    # fitted line y = x; test point (1, 3): SSE = 4, SST about the train mean 1 = 4 -> R^2 = 0
    assert method.held_out_r2(x, x.clone(), torch.tensor([[1.0]]), torch.tensor([[3.0]]), 1e-12) == \
        pytest.approx(0.0, abs=1e-9)
    # ridge shrinks the slope: lambda n = 3 * (1/3) = 1, slope = 2 / (2 + 1); prediction at x=2: 1 + 2/3
    r2 = method.held_out_r2(x, x.clone(), torch.tensor([[2.0]]), torch.tensor([[2.0]]), 1 / 3)
    assert r2 == pytest.approx(1 - (1 / 3) ** 2 / 1.0)


def test_curve_measures_exact():
    assert method.violations_of_non_increase([3.0, 2.0, 2.5, 1.0, 1.5]) == 2
    assert method.violations_of_non_increase([3.0, 3.0, 1.0]) == 0
    assert method.log_k_area([1, 2, 4], [1.0, 1.0, 1.0]) == pytest.approx(1.0)
    assert method.log_k_area([1, 2, 4], [2.0, 0.0, 0.0]) == pytest.approx(0.5)
    assert method.log_k_area([1, 4], [1.0, 3.0]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="two distinct"):
        method.log_k_area([2, 2], [1.0, 1.0])


def test_linear_probe_separates_separable_labels():
    torch.manual_seed(0)
    x = torch.randn(200, 4)
    y = torch.stack([(x[:, 0] > 0), (x[:, 1] + x[:, 2] > 0)], dim=1).float()
    logits = method.fit_linear_probe(x[:100], y[:100], x[100:], steps=300, lr=0.1)
    assert logits.shape == (100, 2)
    assert method.mean_average_precision(logits, y[100:]) > 0.97
    # from zero weights, no steps: every logit is 0
    assert torch.equal(method.fit_linear_probe(x[:100], y[:100], x[100:], steps=0, lr=0.1), torch.zeros(100, 2))


def test_mlp_adaptor_shape():
    assert method.mlp_adaptor(4, 7)(torch.zeros(3, 4)).shape == (3, 7)


def test_fill_after_prefix_exact_on_a_non_square_batch():
    tokens = torch.arange(12, dtype=torch.float32).view(2, 3, 2)
    filled = method.fill_after_prefix(tokens, torch.tensor([1, 3]), torch.tensor([-1.0, -2.0]))
    assert filled.tolist() == [[[0, 1], [-1, -2], [-1, -2]], [[6, 7], [8, 9], [10, 11]]]


def test_samplers_draw_only_from_the_given_generator():
    for kind, kwargs in (("uniform", {}), ("triangle", {}), ("gaussian_mixture", {"modes": (3.0, 9.0)})):
        first = method.sample_num_tokens(kind, 500, 16, torch.Generator().manual_seed(7), **kwargs)
        torch.manual_seed(123)  # the global generator must not matter
        second = method.sample_num_tokens(kind, 500, 16, torch.Generator().manual_seed(7), **kwargs)
        assert torch.equal(first, second)


def test_linear_probe_standardises_each_feature():
    torch.manual_seed(0)
    x = torch.randn(120, 3)
    y = (x[:, :1] + x[:, 1:2] > 0).float()
    base = method.fit_linear_probe(x[:80], y[:80], x[80:], steps=50, lr=0.1)
    scaled = x * torch.tensor([100.0, 10.0, 1.0])
    assert torch.allclose(method.fit_linear_probe(scaled[:80], y[:80], scaled[80:], steps=50, lr=0.1), base, atol=1e-4)


def test_held_out_r2_in_two_dimensions():
    x = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 3.0], [1.0, 5.0]])
    y = x @ torch.tensor([[2.0], [-1.0]]) + 0.5
    x_test = torch.tensor([[4.0, 1.0], [0.0, 0.0]])
    assert method.held_out_r2(x, y, x_test, x_test @ torch.tensor([[2.0], [-1.0]]) + 0.5, 0.0) == \
        pytest.approx(1.0, abs=1e-9)
