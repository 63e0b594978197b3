"""mive method: exact values on hand-computed inputs, identities, and negative controls that break the library."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.mive import method

# ----------------------------------------------------------------------------- hue


def hue_error_check() -> bool:
    a = torch.tensor([350.0, 0.0, 30.0, 200.0])
    b = torch.tensor([10.0, 180.0, 30.0, 20.0])
    return torch.equal(method.circular_hue_error(a, b), torch.tensor([20.0, 180.0, 0.0, 180.0])) and torch.equal(
        method.circular_hue_error(b, a), method.circular_hue_error(a, b))


def test_circular_hue_error_exact_values_and_symmetry():
    assert hue_error_check()
    assert float(method.circular_hue_error(torch.tensor(725.0), torch.tensor(-10.0))) == 15.0


def test_negative_control_plain_difference_is_caught(monkeypatch):
    monkeypatch.setattr(method, "circular_hue_error", lambda a, b: (a - b).abs())
    assert not hue_error_check()


def test_rgb_to_hue_exact_values():
    rgb = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 1.0, 1.0], [0.0, 0.0, 1.0],
                        [1.0, 0.0, 1.0], [1.0, 0.5, 0.0], [0.2, 0.4, 0.8], [0.8, 0.2, 0.5]])
    # (0.2, 0.4, 0.8): max b, 60 * ((r - g) / 0.6 + 4) = 220
    # (0.8, 0.2, 0.5): max r, 60 * ((g - b) / 0.6 mod 6) = 60 * 5.5 = 330
    expected = torch.tensor([0.0, 60.0, 120.0, 180.0, 240.0, 300.0, 30.0, 220.0, 330.0])
    assert torch.allclose(method.rgb_to_hue(rgb), expected, atol=1e-4)


def test_hue_to_rgb_exact_values_and_round_trip():
    assert torch.allclose(method.hue_to_rgb(torch.tensor([0.0, 120.0, 30.0])),
                          torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 0.5, 0.0]]), atol=1e-6)
    assert torch.allclose(method.hue_to_rgb(torch.tensor(60.0), saturation=0.5, value=0.8),
                          torch.tensor([0.8, 0.8, 0.4]), atol=1e-6)
    hues = torch.tensor([5.0, 77.0, 143.0, 199.0, 260.0, 333.0])
    assert torch.allclose(method.rgb_to_hue(method.hue_to_rgb(hues, 0.9, 0.95)), hues, atol=1e-3)


# ----------------------------------------------------------------------------- layer selection


def test_select_layers_returns_the_tensors_and_refuses_duplicates():
    states = [torch.randn(2, 3, 4) for _ in range(5)]
    first, last = method.select_layers(states, (1, -1))
    assert first is states[1] and last is states[4]
    assert method.resolve_layers((0, 2, -2), 5) == (0, 2, 3)
    for bad in ((-1, -1), (4, -1), (1, 1)):
        with pytest.raises(ValueError, match="same hidden state twice"):
            method.select_layers(states, bad)
    with pytest.raises(ValueError, match="out of range"):
        method.select_layers(states, (1, 5))
    with pytest.raises(ValueError, match="out of range"):
        method.select_layers(states, (-6,))
    with pytest.raises(ValueError, match="at least one"):
        method.select_layers(states, ())


def test_negative_control_selecting_the_embedding_layer_is_caught(monkeypatch):
    monkeypatch.setattr(method, "resolve_layers", lambda layers, n: tuple(0 for _ in layers))
    states = [torch.randn(1) for _ in range(5)]
    assert method.select_layers(states, (1, -1))[0] is not states[1]


def test_condition_tokens_layer_embeddings_separate_identical_states():
    torch.manual_seed(0)
    cond = method.ConditionTokens(in_width=6, width=8, n_layers=2)
    h = torch.randn(2, 3, 6)
    tokens = cond([h, h])
    assert tokens.shape == (2, 6, 8)
    assert not torch.allclose(tokens[:, :3], tokens[:, 3:])
    expected = cond.mlps[1](h) + cond.layer_embedding[1]
    assert torch.allclose(tokens[:, 3:], expected)
    with pytest.raises(ValueError, match="expected 2 layers"):
        cond([h])


# ----------------------------------------------------------------------------- rectified flow


def test_interpolation_endpoints_and_midpoint():
    x0, eps = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    assert torch.equal(method.interpolate(x0, eps, torch.zeros(3)), x0)
    assert torch.equal(method.interpolate(x0, eps, torch.ones(3)), eps)
    t = torch.tensor([0.25, 0.5, 1.0])
    assert torch.allclose(method.interpolate(x0, eps, t)[0], 0.75 * x0[0] + 0.25 * eps[0])
    assert torch.allclose(method.interpolate(x0, eps, t)[1], 0.5 * x0[1] + 0.5 * eps[1])
    assert torch.equal(method.velocity_target(x0, eps), eps - x0)


def euler_check() -> bool:
    torch.manual_seed(1)
    x0, eps = torch.randn(4, 6, 3), torch.randn(4, 6, 3)
    seen = []

    def oracle(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        seen.append(float(t[0]))
        return eps - x0

    out = method.euler_sample(oracle, eps, 10)
    times_ok = all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(seen, [1.0 - k / 10 for k in range(10)],
                                                                      strict=True))
    return bool((out - x0).abs().max() < 1e-5) and times_ok


def test_euler_sampler_recovers_x0_from_the_oracle_velocity():
    assert euler_check()
    with pytest.raises(ValueError, match="steps"):
        method.euler_sample(lambda x, t: x, torch.zeros(1, 1), 0)


def test_euler_step_uses_the_current_state():
    # dx/dt = x from x(1) = 1 with 2 Euler steps of 1/2: x <- x - x/2 twice = 0.25 (exact: e^-1)
    out = method.euler_sample(lambda x, t: x, torch.ones(1, 1), 2)
    assert torch.allclose(out, torch.tensor([[0.25]]))


def test_negative_control_wrong_sign_sampler_is_caught(monkeypatch):
    def broken(velocity, noise, steps):
        x = noise
        for k in range(steps):
            x = x + velocity(x, torch.full((x.shape[0],), 1.0 - k / steps)) / steps
        return x

    monkeypatch.setattr(method, "euler_sample", broken)
    assert not euler_check()


def test_flow_matching_loss_exact_values():
    x0 = torch.tensor([[1.0, 2.0]])
    eps = torch.tensor([[0.0, 0.0]])
    pred = torch.tensor([[-1.0, 0.0]])  # target eps - x0 = (-1, -2): errors 0 and 4
    assert float(method.flow_matching_loss(pred, x0, eps)) == 2.0
    assert float(method.flow_matching_loss(pred, x0, eps, torch.tensor([[3.0, 1.0]]))) == 1.0  # (0*3 + 4)/4
    assert float(method.flow_matching_loss(pred, x0, eps, torch.tensor([[0.0, 1.0]]))) == 4.0


# ----------------------------------------------------------------------------- probes


def test_ridge_fit_and_r2_exact():
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    y = 2 * x + 1
    w, b = method.ridge_fit(x, y, 0.0)
    assert torch.allclose(w, torch.tensor([[2.0]], dtype=torch.float64)) and torch.allclose(b, torch.tensor(
        [1.0], dtype=torch.float64))
    # ridge 5 on centred x (-1.5, -.5, .5, 1.5): w = sum(xc yc) / (sum xc^2 + 5) = 10 / 10 = 1, b = 4 - 1.5 = 2.5
    w, b = method.ridge_fit(x, y, 5.0)
    assert torch.allclose(w, torch.tensor([[1.0]], dtype=torch.float64))
    assert torch.allclose(b, torch.tensor([2.5], dtype=torch.float64))
    target = torch.tensor([[1.0], [2.0], [3.0]])
    assert method.r_squared(torch.tensor([[1.0], [2.0], [4.0]]), target) == pytest.approx(0.5)
    assert method.r_squared(target.clone(), target) == 1.0


def probe_sanity() -> tuple[float, float]:
    gen = torch.Generator().manual_seed(3)
    hue = torch.rand(600, generator=gen) * 2 * math.pi
    y = torch.stack([hue.cos(), hue.sin()], 1)
    layer1 = torch.cat([y @ torch.randn(2, 8, generator=gen), 0.05 * torch.randn(600, 8, generator=gen)], 1)
    layer4 = torch.randn(600, 16, generator=gen)
    r1 = method.ridge_probe_r2(layer1[:400], y[:400], layer1[400:], y[400:], 1.0)
    r4 = method.ridge_probe_r2(layer4[:400], y[:400], layer4[400:], y[400:], 1.0)
    return r1, r4


def test_probe_sanity_hue_in_layer_one_absent_from_layer_four():
    r1, r4 = probe_sanity()
    assert r1 > 0.9 and r4 < 0.1


def test_negative_control_probe_with_a_wrong_intercept_is_caught(monkeypatch):
    real = method.ridge_fit

    def broken(x, y, ridge):
        w, _ = real(x, y, ridge)
        return w, torch.ones(y.shape[1], dtype=torch.float64)

    monkeypatch.setattr(method, "ridge_fit", broken)
    assert probe_sanity()[0] < 0.9


def test_probe_is_invariant_to_a_scale_and_shift_of_the_layer():
    """A layer multiplied by 0.01 and shifted by 5 carries the same information: its probe R^2 and accuracy must
    not change (a fixed ridge on raw features fails this: R^2 1.00 -> 0.27)."""
    gen = torch.Generator().manual_seed(3)
    hue = torch.rand(600, generator=gen) * 2 * math.pi
    y = torch.stack([hue.cos(), hue.sin()], 1)
    layer = torch.cat([y @ torch.randn(2, 8, generator=gen), 0.05 * torch.randn(600, 8, generator=gen)], 1)
    squashed = 0.01 * layer + 5.0
    r_raw = method.ridge_probe_r2(layer[:400], y[:400], layer[400:], y[400:], 1.0)
    r_squashed = method.ridge_probe_r2(squashed[:400], y[:400], squashed[400:], y[400:], 1.0)
    assert r_raw > 0.9 and r_squashed == pytest.approx(r_raw, abs=1e-9)
    labels = (hue > math.pi).long()
    a_raw = method.ridge_probe_accuracy(layer[:400], labels[:400], layer[400:], labels[400:], 2, 50.0)
    a_squashed = method.ridge_probe_accuracy(squashed[:400], labels[:400], squashed[400:], labels[400:], 2, 50.0)
    assert a_raw > 0.8 and a_squashed == a_raw


def test_negative_control_unstandardised_probe_is_not_scale_invariant(monkeypatch):
    monkeypatch.setattr(method, "standardise", lambda fit, other: (fit.double(), other.double()))
    with pytest.raises(AssertionError):
        test_probe_is_invariant_to_a_scale_and_shift_of_the_layer()


def test_standardise_uses_the_fit_statistics():
    fit = torch.tensor([[1.0, 10.0], [3.0, 10.0]])  # mean (2, 10), sd (sqrt 2, 0 -> floored)
    z_fit, z_other = method.standardise(fit, torch.tensor([[5.0, 10.0]]))
    assert torch.allclose(z_fit[:, 0], torch.tensor([-1.0, 1.0], dtype=torch.float64) / math.sqrt(2))
    assert torch.allclose(z_other, torch.tensor([[3.0 / math.sqrt(2), 0.0]], dtype=torch.float64))


def test_between_clip_spread_is_centred_and_exact():
    features = torch.tensor([[1.0, 0.0], [3.0, 0.0]])  # std over rows (sqrt 2, 0): mean sqrt(2)/2
    tokens = torch.tensor([[0.0, 0.0], [2.0, 2.0]])  # centred (+-1, +-1): RMS 1
    assert method.between_clip_spread(features, tokens) == pytest.approx(math.sqrt(2) / 2)
    # a shared offset (the uncentred measure's failure) and a common scale change nothing
    assert method.between_clip_spread(3 * features + 100, 3 * tokens + 100) == pytest.approx(math.sqrt(2) / 2)
    assert method.between_clip_spread(torch.ones(4, 2), tokens) == 0.0


def test_x0_velocity_and_loss_exact():
    x0, eps, t = torch.tensor([[1.0, -2.0]]), torch.tensor([[0.5, 0.5]]), torch.tensor([0.25])
    noisy = method.interpolate(x0, eps, t)
    # with the true x0 the velocity is the rectified-flow target eps - x0 exactly
    assert torch.allclose(method.velocity_from_x0(noisy, x0, t), method.velocity_target(x0, eps))
    # t below 1e-3 is clamped: (x_t - x0_hat) / 1e-3
    v = method.velocity_from_x0(torch.tensor([[1.0]]), torch.tensor([[0.0]]), torch.tensor([0.0]))
    assert float(v) == pytest.approx(1000.0)
    assert float(method.x0_matching_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 2.0]]))) == 2.5
    assert float(method.x0_matching_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 2.0]]),
                                         torch.tensor([[3.0, 1.0]]))) == pytest.approx(7 / 4)


def test_euler_with_the_x0_velocity_returns_x0_hat_at_the_last_step():
    x0_hat = torch.tensor([[0.3, -0.7, 1.1]])
    out = method.euler_sample(lambda x, t: method.velocity_from_x0(x, x0_hat, t), torch.randn(1, 3), 10)
    assert torch.allclose(out, x0_hat, atol=1e-6)


def test_ridge_probe_accuracy_exact():
    x = torch.tensor([[0.0], [0.1], [1.0], [1.1]])
    labels = torch.tensor([0, 0, 1, 1])
    assert method.ridge_probe_accuracy(x, labels, torch.tensor([[0.05], [1.05], [2.0]]), torch.tensor([0, 1, 0]),
                                       2, 1e-6) == pytest.approx(2 / 3)


# ----------------------------------------------------------------------------- modules


def test_timestep_embedding_and_modulate_exact():
    emb = method.timestep_embedding(torch.tensor([0.0, 0.001]), 4)
    assert torch.allclose(emb[0], torch.tensor([1.0, 1.0, 0.0, 0.0]))
    # t = 0.001 -> angle 1 * freqs (1, 1/100): cos 1, cos 0.01, sin 1, sin 0.01
    assert torch.allclose(emb[1], torch.tensor([math.cos(1), math.cos(0.01), math.sin(1), math.sin(0.01)]), atol=1e-6)
    x = torch.tensor([[[1.0, 2.0]]])
    out = method.modulate(x, torch.tensor([[0.5, -1.0]]), torch.tensor([[1.0, 0.5]]))
    assert torch.allclose(out, torch.tensor([[[2.5, 2.0]]]))


def dit(attention: str) -> method.EditDiT:
    torch.manual_seed(0)
    model = method.EditDiT(patch_dim=6, n_video_tokens=4, cond_width=5, n_cond_layers=2, width=8, depth=2, heads=2,
                           attention=attention, grid=2, cond_image_frames=1)
    for block in model.blocks:  # adaLN starts at zero; give it weights so the timestep matters too
        torch.nn.init.normal_(block.ada.weight, std=0.1)
    torch.nn.init.normal_(model.head.weight, std=0.1)  # the x0 head starts at zero (no edit); give it weights
    return model


def test_unified_attention_condition_tokens_change_video_outputs():
    model = dit("joint")
    noisy, source, t = torch.randn(1, 4, 6), torch.randn(1, 4, 6), torch.tensor([0.3])
    cond = [torch.randn(1, 3, 5, requires_grad=True), torch.randn(1, 3, 5)]
    out = model(noisy, source, t, cond)
    (grad,) = torch.autograd.grad(out.sum(), cond[0])
    assert grad.abs().sum() > 0
    perturbed = [cond[0].detach().clone(), cond[1]]
    perturbed[0][0, 1] += torch.tensor([1.0, -0.5, 0.3, 0.0, 2.0])  # not a constant shift (LayerNorm removes those)
    assert not torch.allclose(model(noisy, source, t, perturbed), out)


def test_cross_attention_condition_tokens_ignore_video():
    for attention in ("cross", "joint"):
        torch.manual_seed(0)
        block = method.DiTBlock(8, 2, attention)
        cond, time = torch.randn(1, 3, 8), torch.randn(1, 8)
        _, c1 = block(torch.randn(1, 4, 8), cond, time)
        _, c2 = block(torch.randn(1, 4, 8), cond, time)
        assert torch.equal(c1, c2) == (attention == "cross")
    model = dit("cross")
    noisy, source, t = torch.randn(1, 4, 6), torch.randn(1, 4, 6), torch.tensor([0.3])
    cond = [torch.randn(1, 3, 5, requires_grad=True), torch.randn(1, 3, 5)]
    (grad,) = torch.autograd.grad(model(noisy, source, t, cond).sum(), cond[0])
    assert grad.abs().sum() > 0  # video still reads the condition through cross-attention


def test_edit_dit_refuses_bad_width():
    with pytest.raises(ValueError, match="multiple of heads"):
        method.EditDiT(6, 4, 5, 1, width=9, depth=1, heads=2, grid=2)
    with pytest.raises(ValueError, match="multiple of grid"):
        method.EditDiT(6, 6, 5, 1, width=8, depth=1, heads=2, grid=2)


def test_edit_dit_starts_at_the_zero_edit_and_shares_positions_with_condition_patches():
    torch.manual_seed(0)
    model = method.EditDiT(patch_dim=6, n_video_tokens=8, cond_width=5, n_cond_layers=2, width=8, depth=1, heads=2,
                           grid=2, cond_image_frames=2)
    noisy = torch.randn(2, 8, 6)
    assert torch.equal(model(noisy, torch.randn(2, 8, 6), torch.tensor([0.5, 1.0]), [torch.randn(2, 6, 5)] * 2),
                       torch.zeros(2, 8, 6))
    codes = method.sincos_2d(2, 8)
    # video: the same 2-D code in both frames; condition: each layer's first 2 x 4 tokens (source, reference
    # patches) the same codes, the text tokens after them none
    assert torch.equal(model.position[0], torch.cat([codes, codes]))
    positions = model.condition_positions([torch.zeros(1, 10, 5), torch.zeros(1, 10, 5)])[0]
    assert torch.equal(positions[:8], torch.cat([codes, codes])) and torch.equal(positions[10:18], positions[:8])
    assert positions[8:10].abs().sum() == 0 and positions[18:].abs().sum() == 0


def test_sincos_2d_exact_values():
    codes = method.sincos_2d(3, 8)  # quarter 2, freqs (1, 1/100); row-major (row, col)
    assert codes.shape == (9, 8)
    row, col = 1, 2
    expected = torch.tensor([math.sin(row), math.sin(row / 100), math.cos(row), math.cos(row / 100),
                             math.sin(col), math.sin(col / 100), math.cos(col), math.cos(col / 100)])
    assert torch.allclose(codes[row * 3 + col], expected, atol=1e-6)
    assert torch.allclose(codes[0], torch.tensor([0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="multiple of 4"):
        method.sincos_2d(2, 6)


# ----------------------------------------------------------------------------- patches and edit metrics


def test_patchify_layout_and_inverse():
    frames = torch.arange(2 * 4 * 4 * 3, dtype=torch.float32).reshape(1, 2, 4, 4, 3)
    tokens = method.patchify(frames, 2)
    assert tokens.shape == (1, 8, 12)
    assert torch.equal(tokens[0, 1, :3], frames[0, 0, 0, 2])  # patch (row 0, col 1) starts at pixel (0, 2)
    assert torch.equal(tokens[0, 1, 6:9], frames[0, 0, 1, 2])  # its second row
    assert torch.equal(tokens[0, 4, :3], frames[0, 1, 0, 0])  # second frame
    assert torch.equal(method.unpatchify(tokens, 2, 4, 2), frames)


def metric_inputs() -> dict[str, torch.Tensor]:
    """One clip, 1 frame of 2x2: object 0 at pixel (0, 0), object 1 at pixel (1, 1)."""
    source = torch.zeros(1, 1, 2, 2, 3)
    source[0, 0, 0, 0] = torch.tensor([1.0, 0.0, 0.0])
    source[0, 0, 1, 1] = torch.tensor([0.0, 1.0, 0.0])
    target = source.clone()
    target[0, 0, 0, 0] = torch.tensor([0.0, 0.0, 1.0])  # object 0 red -> blue
    masks = torch.zeros(1, 2, 1, 2, 2, dtype=torch.bool)
    masks[0, 0, 0, 0, 0] = True
    masks[0, 1, 0, 1, 1] = True
    return {"source": source, "target": target, "masks": masks}


def test_edit_metrics_exact_values():
    m = metric_inputs()
    edited = m["target"].clone()
    edited[0, 0, 0, 1] = torch.tensor([0.3, 0.0, 0.0])  # background spill
    edited[0, 0, 0, 0] = torch.tensor([0.5, 0.0, 1.0])  # hue 60 * (0.5 + 4) = 270 instead of 240
    edit_mask = m["masks"][:, 0]
    assert torch.allclose(method.masked_mean_rgb(edited, edit_mask), torch.tensor([[0.5, 0.0, 1.0]]))
    assert torch.allclose(method.object_hue_error(edited, m["target"], edit_mask), torch.tensor([30.0]), atol=1e-4)
    # change of object 0: |(0.5, 0, 1) - (1, 0, 0)| mean = 0.5; object 1 unchanged
    assert torch.allclose(method.object_change(edited, m["source"], m["masks"]), torch.tensor([[0.5, 0.0]]))
    assert method.unedited_mse(edited, m["target"], edit_mask).item() == pytest.approx(0.09 / 9)
    assert bool(method.target_selected(edited, m["source"], m["target"], m["masks"], torch.tensor([0])))
    assert not bool(method.target_selected(edited, m["source"], m["target"], m["masks"], torch.tensor([1])))


def test_target_selection_rejects_spill_and_too_small_a_change():
    m = metric_inputs()
    both = m["target"].clone()
    both[0, 0, 1, 1] = torch.tensor([0.0, 0.0, 1.0])  # object 1 changed as much
    assert not bool(method.target_selected(both, m["source"], m["target"], m["masks"], torch.tensor([0])))
    faint = m["source"].clone()
    faint[0, 0, 0, 0] = torch.tensor([0.8, 0.0, 0.2])  # change 0.4/3 < half of the true change 2/3
    assert not bool(method.target_selected(faint, m["source"], m["target"], m["masks"], torch.tensor([0])))


def test_change_centroid_drift_exact():
    m = metric_inputs()
    edit_mask = m["masks"][:, 0]
    assert method.change_centroid_drift(m["target"], m["source"], edit_mask).item() == pytest.approx(0.0, abs=1e-6)
    shifted = m["source"].clone()
    shifted[0, 0, 0, 1] = torch.tensor([1.0, 1.0, 1.0])  # all change at (0, 1): one pixel right of the object
    assert method.change_centroid_drift(shifted, m["source"], edit_mask).item() == pytest.approx(1.0)


def test_dit_block_matches_the_adaln_formula():
    """Joint block: x + (1 + g1) attn(mod(ln1 x; b1, s1)) then x + (1 + g2) mlp(mod(ln2 x; b2, s2)), computed by hand
    from the block's own submodules with nonzero adaLN weights."""
    torch.manual_seed(2)
    block = method.DiTBlock(8, 2, "joint")
    torch.nn.init.normal_(block.ada.weight, std=0.5)
    video, cond, time = torch.randn(2, 3, 8), torch.randn(2, 2, 8), torch.randn(2, 8)
    s1, g1, b1, s2, g2, b2 = block.ada(torch.nn.functional.silu(time)).split(8, dim=1)
    x = torch.cat([video, cond], 1)
    h = block.ln1(x) * (1 + s1[:, None]) + b1[:, None]
    x = x + (1 + g1[:, None]) * block.attn(h, h)
    x = x + (1 + g2[:, None]) * block.mlp(block.ln2(x) * (1 + s2[:, None]) + b2[:, None])
    out_video, out_cond = block(video, cond, time)
    assert torch.allclose(out_video, x[:, :3], atol=1e-5) and torch.allclose(out_cond, x[:, 3:], atol=1e-5)
