"""mive method: exact values where test_mive_method.py's inputs could not tell a right formula from a wrong one
(issue 20, survivors of the full mutation run), each with a negative control that breaks the library."""

from __future__ import annotations

import pytest
import torch

from tasks.mive import method


def check_losses_and_hue_exact() -> None:
    """Flow-matching and x0 losses by hand (mean squared error; a weighted mean whose weights sum to 0.5 < 1), and
    hues outside [0, 360) wrap by 360 degrees."""
    x0 = torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64)
    noise = torch.tensor([[1.0, 0.5], [-0.5, 1.5]], dtype=torch.float64)
    predicted = torch.tensor([[0.25, 1.0], [-2.0, 1.0]], dtype=torch.float64)
    err = (predicted - (noise - x0)) ** 2  # (0.0625, 0.25; 0.25, 0.0625)
    assert float(method.flow_matching_loss(predicted, x0, noise)) == pytest.approx(float(err.mean()), abs=1e-15)
    weight = torch.tensor([[0.25, 0.0], [0.0, 0.25]], dtype=torch.float64)
    assert float(method.flow_matching_loss(predicted, x0, noise, weight)) == pytest.approx(
        (0.25 * 0.0625 + 0.25 * 0.0625) / 0.5, abs=1e-15)
    x0_hat = torch.tensor([[1.0, -0.5], [1.0, 0.0]], dtype=torch.float64)
    assert float(method.x0_matching_loss(x0_hat, x0)) == pytest.approx((0.25 + 0.25 + 1.0 + 0.0625) / 4, abs=1e-15)
    assert float(method.x0_matching_loss(x0_hat, x0, weight)) == pytest.approx(
        (0.25 * 0.25 + 0.25 * 0.0625) / 0.5, abs=1e-15)
    assert torch.allclose(method.hue_to_rgb(torch.tensor([390.0, -30.0, 361.0])),
                          method.hue_to_rgb(torch.tensor([30.0, 330.0, 1.0])), atol=1e-6)


def test_losses_and_hue_exact():
    check_losses_and_hue_exact()


@pytest.mark.parametrize("broken", ["doubled_error", "weights_floored_at_one", "hue_mod_361"])
def test_negative_control_losses_and_hue(monkeypatch, broken):
    if broken == "doubled_error":
        monkeypatch.setattr(method, "x0_matching_loss", lambda x0_hat, x0, weight=None: ((x0_hat - x0) * 2).mean()
                            if weight is None else ((x0_hat - x0) * 2 * weight).sum() / weight.sum())
    elif broken == "weights_floored_at_one":
        real = method.flow_matching_loss
        monkeypatch.setattr(method, "flow_matching_loss", lambda p, x0, n, weight=None: real(p, x0, n) if weight is None
                            else (weight * (p - (n - x0)) ** 2).sum() / weight.sum().clamp_min(1.0))
    else:
        real_hue = method.hue_to_rgb
        monkeypatch.setattr(method, "hue_to_rgb", lambda hue, saturation=1.0, value=1.0: real_hue(
            hue % 361.0, saturation, value))
    with pytest.raises(AssertionError):
        check_losses_and_hue_exact()


# Fourth pass (2026-12-02): survivors of the second pass's full run in the metrics, probes, position codes and the
# sampler: batches of more than one clip, per-dimension means that differ, boundaries hit exactly ------------------

import math  # noqa: E402

CHECK_FAILED = (AssertionError, RuntimeError, ValueError, IndexError, TypeError)
F64 = torch.float64


def two_clips():
    """Two clips (N = 2), T = 2 frames of 3 x 4 pixels, K = 2 objects; clip 0 edits object 0 (top-left block),
    clip 1 edits object 1 (bottom-right block) by exactly half its true change, and spills half onto object 0."""
    n, t, h, w = 2, 2, 3, 4
    masks = torch.zeros(n, 2, t, h, w, dtype=torch.bool)
    masks[:, 0, :, :2, :2] = True
    masks[:, 1, :, 1:, 2:] = True
    source = torch.zeros(n, t, h, w, 3, dtype=F64)
    target = source.clone()
    edited = source.clone()
    target[0][masks[0, 0]] = 0.6
    edited[0][masks[0, 0]] = 0.45
    target[1][masks[1, 1]] = 0.8
    edited[1][masks[1, 1]] = 0.4       # change 0.4 = tau = 0.5 * 0.8: a hit at equality
    edited[1][masks[1, 0]] = 0.4       # object 0 changed by 0.4 = tau: a spill at equality
    return source, target, edited, masks


def check_metrics_exact() -> None:
    source, target, edited, masks = two_clips()
    change = method.object_change(edited, source, masks)
    assert torch.allclose(change, torch.tensor([[0.45, 0.0], [0.4, 0.4]], dtype=F64), rtol=0, atol=1e-15)
    assert method.target_selected(edited, source, target, masks, torch.tensor([0, 1])).tolist() == [True, False]
    clean = edited.clone()
    clean[1][masks[1, 0]] = 0.0        # no spill: clip 1 is selected, at equality (>=)
    assert method.target_selected(clean, source, target, masks, torch.tensor([0, 1])).tolist() == [True, True]
    # masked mean colour and the MSE outside the edit mask, per clip
    rgb = method.masked_mean_rgb(edited, masks[:, 1])
    assert torch.allclose(rgb, torch.tensor([[0.0] * 3, [0.4] * 3], dtype=F64), rtol=0, atol=1e-15)
    keep = ~masks[:, 0]
    mse = method.unedited_mse(edited, target, masks[:, 0])
    by_hand = [float((((edited[i] - target[i]) ** 2) * keep[i][..., None]).sum() / (3 * keep[i].sum()))
               for i in range(2)]
    assert mse.tolist() == pytest.approx(by_hand, abs=1e-15) and by_hand[1] > 0
    # change centroid vs mask centroid, per clip, averaged over frames: clip 0's change sits on its mask (0);
    # clip 1 changes both objects equally: centroid (1.0, 1.5) vs the mask's (1.5, 2.5) in every frame
    drift = method.change_centroid_drift(edited, source, masks[:, 1])
    assert drift.tolist() == pytest.approx([math.hypot(0.5 - 1.5, 0.5 - 2.5), math.hypot(0.5, 1.0)], abs=1e-12)
    # a frame whose change mass is below 1 (a faint edit), and a frame with an empty mask (centroid 0)
    faint = source.clone()
    faint[0, 0, 2, 3] = 0.1
    faint[0, 1, 0, 1] = 0.2
    empty = torch.zeros_like(masks[:, 0])
    empty[0, 0, 2, 3] = True
    drift = method.change_centroid_drift(faint, source, empty)
    assert drift[0] == pytest.approx(0.5 * (0.0 + math.hypot(0.0, 1.0)), abs=1e-12) and drift[1] == 0.0


def test_metrics_exact_on_two_clips():
    check_metrics_exact()


@pytest.mark.parametrize("broken", ["strict_hit", "pooled_spill", "pooled_mse", "pooled_centroid",
                                    "mask_floor_one"])
def test_negative_control_metric_variants_are_caught(monkeypatch, broken):
    real_select, real_mse, real_drift, real_rgb = (method.target_selected, method.unedited_mse,
                                                   method.change_centroid_drift, method.masked_mean_rgb)
    if broken == "strict_hit":
        monkeypatch.setattr(method, "target_selected", lambda e, s, t, m, k: real_select(
            e - 1e-9 * (e != s), s, t, m, k))
    elif broken == "pooled_spill":
        monkeypatch.setattr(method, "target_selected", lambda e, s, t, m, k: (lambda sel: sel & sel.all())(
            real_select(e, s, t, m, k)))
    elif broken == "pooled_mse":
        monkeypatch.setattr(method, "unedited_mse", lambda e, t, m: real_mse(e, t, m).mean().expand(len(e)))
    elif broken == "pooled_centroid":
        monkeypatch.setattr(method, "change_centroid_drift", lambda e, s, m: real_drift(e, s, m).mean().expand(len(e)))
    else:
        monkeypatch.setattr(method, "masked_mean_rgb", lambda c, m: (c * m.to(c.dtype)[..., None]).sum((1, 2, 3))
                            / m.to(c.dtype)[..., None].sum((1, 2, 3)).clamp_min(1) * 0 + real_rgb(c, m) * 0.5)
    with pytest.raises(CHECK_FAILED):
        check_metrics_exact()


def check_probes_and_codes_exact() -> None:
    # between-clip spread: tokens with per-dimension means 10 and -3 and an RMS below 1 after centring
    features = torch.tensor([[0.1, 0.2], [0.3, -0.2], [0.2, 0.0]], dtype=F64)
    tokens = torch.tensor([[10.1, -3.2], [9.9, -2.8], [10.0, -3.0], [10.2, -3.1]], dtype=F64)
    spread = float(features.std(0).mean())
    centred = tokens - tokens.mean(0)
    assert method.between_clip_spread(features, tokens) == pytest.approx(
        spread / float(centred.pow(2).mean().sqrt()), rel=1e-14)
    assert float(centred.pow(2).mean().sqrt()) < 1
    # R^2 pooled over columns with different column means
    target = torch.tensor([[1.0, 10.0], [2.0, 12.0], [4.0, 11.0]], dtype=F64)
    predicted = torch.tensor([[1.5, 10.5], [2.0, 11.0], [3.0, 11.5]], dtype=F64)
    ss_tot = ((target - target.mean(0)) ** 2).sum()
    assert method.r_squared(predicted, target) == pytest.approx(
        1 - float(((target - predicted) ** 2).sum() / ss_tot), abs=1e-15)
    # standardise: the sd floor is 1e-12 times the largest sd (here 0.01), not 1e-12
    x_fit = torch.tensor([[0.0, 1.0], [0.02, 1.0 + 4e-13], [0.01, 1.0 - 4e-13]], dtype=F64)
    z_fit, _ = method.standardise(x_fit, x_fit)
    sd = x_fit.std(0)
    assert float(sd[1]) < 1e-12 and float(sd[1]) > 1e-12 * float(sd[0])
    assert z_fit[:, 1].tolist() == pytest.approx(((x_fit[:, 1] - x_fit[:, 1].mean()) / sd[1]).tolist(), rel=1e-9)
    # a ridge classifier on unbalanced classes (4 vs 2), whose per-class intercepts differ: the test points near
    # the boundary (between 5.6 and 5.65 here) are classified right only with + b
    x_train = torch.tensor([[5.0], [5.1], [5.2], [5.3], [6.0], [6.1]], dtype=F64)
    labels = torch.tensor([0, 0, 0, 0, 1, 1])
    x_test = torch.tensor([[5.2], [5.45], [5.55], [5.9]], dtype=F64)
    assert method.ridge_probe_accuracy(x_train, labels, x_test, torch.tensor([0, 0, 0, 1]), 2, 0.1) == 1.0
    # position and timestep codes, width 8: w_k = 10000^(-k / 2) and exp(-ln(10000) k / 4)
    codes = method.sincos_2d(40, 8)
    for p, (row, col) in ((0, (0, 0)), (1, (0, 1)), (40, (1, 0)), (40 * 39 + 38, (39, 38))):
        want = [math.sin(row), math.sin(row / 100), math.cos(row), math.cos(row / 100),
                math.sin(col), math.sin(col / 100), math.cos(col), math.cos(col / 100)]
        assert codes[p].tolist() == pytest.approx(want, abs=1e-6)
    emb = method.timestep_embedding(torch.tensor([0.3, 0.7]), 8)
    freqs = [math.exp(-math.log(10000.0) * k / 4) for k in range(4)]
    want = [[math.cos(1000 * t * f) for f in freqs] + [math.sin(1000 * t * f) for f in freqs] for t in (0.3, 0.7)]
    assert emb.flatten().tolist() == pytest.approx(sum(want, []), abs=2e-4)  # float32 angles up to 700 rad
    assert emb[0, 1].item() == pytest.approx(math.cos(300 * freqs[1]), abs=1e-5)
    # the centred ridge fit is exact under a large shift of y (y in 1/16 steps: exact at 1e8 too); an uncentred or
    # wrongly centred y leaves ~1e-8 of rounding in W
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(50, 3, generator=gen, dtype=F64) * 0.7 + 0.3
    y = (torch.randint(-40, 40, (50, 2), generator=gen) / 16).double()
    w0, b0 = method.ridge_fit(x, y, 0.1)
    w1, b1 = method.ridge_fit(x, y + 1e8, 0.1)
    assert torch.allclose(w1, w0, rtol=0, atol=1e-12) and torch.allclose(b1 - 1e8, b0, rtol=0, atol=1e-6)
    # layer indices: -n_states is the first state
    assert method.resolve_layers([-5, 4], 5) == (0, 4)
    # hue stays in [0, 360): a tiny negative (g - b) / delta wraps to 6 and must map to 0
    assert float(method.rgb_to_hue(torch.tensor([1.0, 0.0, 1e-17], dtype=F64))) == 0.0
    # hue of a batch of rows of pixels (N, M, 3)
    rgb = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 1.0, 0.0]]] * 2, dtype=F64)
    assert method.rgb_to_hue(rgb).tolist() == [[0.0, 120.0, 240.0, 60.0]] * 2


def test_probes_codes_and_colour_exact():
    check_probes_and_codes_exact()


@pytest.mark.parametrize("broken", ["global_token_mean", "r2_global_mean", "absolute_sd_floor", "no_intercept",
                                    "codes_base_10001", "hue_mod_361", "open_layer_range", "uncentred_y"])
def test_negative_control_probe_variants_are_caught(monkeypatch, broken):
    if broken == "global_token_mean":
        monkeypatch.setattr(method, "between_clip_spread", lambda f, a: float(f.double().std(0).mean() / (
            a.double() - a.double().mean()).pow(2).mean().sqrt()))
    elif broken == "r2_global_mean":
        monkeypatch.setattr(method, "r_squared",
                            lambda p, t: float(1 - ((t - p) ** 2).sum() / ((t - t.mean()) ** 2).sum()))
    elif broken == "absolute_sd_floor":
        monkeypatch.setattr(method, "standardise", lambda a, b: (
            (a.double() - a.double().mean(0)) / a.double().std(0).clamp_min(1e-12),
            (b.double() - a.double().mean(0)) / a.double().std(0).clamp_min(1e-12)))
    elif broken == "no_intercept":
        real_fit = method.ridge_fit
        monkeypatch.setattr(method, "ridge_fit", lambda x, y, r: (real_fit(x, y, r)[0], -real_fit(x, y, r)[1]))
    elif broken == "codes_base_10001":
        monkeypatch.setattr(method, "sincos_2d", lambda g, w: torch.cat([
            (lambda a: torch.cat([a.sin(), a.cos()], 1))(p.reshape(-1, 1) * (1.0 / 10001.0 ** (torch.arange(w // 4)
                                                                                               / (w // 4)))[None])
            for p in torch.meshgrid(torch.arange(g, dtype=torch.float32), torch.arange(g, dtype=torch.float32),
                                    indexing="ij")], 1))
    elif broken == "hue_mod_361":
        real_hue = method.rgb_to_hue
        monkeypatch.setattr(method, "rgb_to_hue", lambda rgb: torch.where(real_hue(rgb) == 0, 360.0,
                                                                          real_hue(rgb)) % 361.0)
    elif broken == "uncentred_y":
        def uncentred(x, y, r):  # xc.T @ y without removing y's mean (equal in exact arithmetic)
            x64, y64 = x.double(), y.double()
            xc = x64 - x64.mean(0)
            w = torch.linalg.solve(xc.T @ xc + r * torch.eye(x.shape[1], dtype=F64), xc.T @ y64)
            return w, y64.mean(0) - x64.mean(0) @ w
        monkeypatch.setattr(method, "ridge_fit", uncentred)
    else:
        real_layers = method.resolve_layers
        monkeypatch.setattr(method, "resolve_layers", lambda layers, n: real_layers(
            [i if i > -n else n + 1 for i in layers], n))
    with pytest.raises(CHECK_FAILED):
        check_probes_and_codes_exact()


def check_sampler_and_weights() -> None:
    # one Euler step is allowed; t is the batch's, in the noise's dtype (float64: t = 1 - k/3 exactly as in float64)
    noise = torch.tensor([[1.0, -2.0], [0.5, 0.25], [3.0, 1.0]], dtype=F64)
    seen = []

    def velocity(x, t):
        seen.append(t.clone())
        return x * t[:, None]
    assert torch.allclose(method.euler_sample(velocity, noise, 1), noise - noise * 1.0, atol=0)
    seen.clear()
    x = noise
    for k in range(3):
        x = x - (1 / 3) * x * (1.0 - k / 3)
    assert torch.equal(method.euler_sample(velocity, noise, 3), x)
    assert [s.dtype for s in seen] == [F64] * 3 and [tuple(s.shape) for s in seen] == [(3,)] * 3
    # velocity from x0_hat on a 3-D batch with one t per row
    noisy = torch.arange(24, dtype=F64).reshape(3, 2, 4) / 10
    x0_hat = torch.ones(3, 2, 4, dtype=F64)
    t = torch.tensor([0.5, 0.25, 0.0], dtype=F64)
    v = method.velocity_from_x0(noisy, x0_hat, t)
    assert v.shape == (3, 2, 4)
    assert torch.allclose(v, (noisy - x0_hat) / torch.tensor([0.5, 0.25, 1e-3], dtype=F64)[:, None, None], atol=1e-12)
    # float32 weights (not dyadic) are summed in the error's dtype
    x0 = torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=F64)
    pred = torch.tensor([[0.25, 1.0], [-2.0, 1.0]], dtype=F64)
    weight = torch.tensor([[0.1, 0.3], [0.7, 0.2]])
    err = (pred - x0) ** 2
    w64 = weight.double()
    assert float(method.x0_matching_loss(pred, x0, weight)) == float((w64 * err).sum() / w64.sum())
    zero = torch.zeros_like(x0)
    err = (pred - (zero - x0)) ** 2
    assert float(method.flow_matching_loss(pred, x0, zero, weight)) == float((w64 * err).sum() / w64.sum())


def test_sampler_velocity_and_weighted_losses_exact():
    check_sampler_and_weights()


@pytest.mark.parametrize("broken", ["float32_t", "two_step_minimum", "weights_in_float32"])
def test_negative_control_sampler_variants_are_caught(monkeypatch, broken):
    real_euler, real_x0 = method.euler_sample, method.x0_matching_loss
    if broken == "float32_t":
        monkeypatch.setattr(method, "euler_sample", lambda v, noise, steps: real_euler(
            lambda x, t: v(x, t.float()), noise, steps))
    elif broken == "two_step_minimum":
        monkeypatch.setattr(method, "euler_sample", lambda v, noise, steps: real_euler(v, noise, max(steps, 2)))
    else:
        monkeypatch.setattr(method, "x0_matching_loss", lambda x0_hat, x0, weight=None: real_x0(x0_hat, x0) if weight
                            is None else ((weight * (x0_hat - x0) ** 2).sum() / weight.sum()).double())
    with pytest.raises(CHECK_FAILED):
        check_sampler_and_weights()


# The modules, written out: attention with two heads, the cross-attention block with non-zero adaLN, the condition
# tokens and EditDiT's forward with a non-zero head (at init the head is zero and hides every sign), the layer
# norms without affine parameters (adaLN supplies scale and shift), the position buffers kept out of state_dict ----

import torch.nn.functional as F  # noqa: E402


def attention_by_hand(att, x, context):
    b, n, w = x.shape
    heads, hd = att.heads, w // att.heads
    q = att.q(x).view(b, n, heads, hd).transpose(1, 2)
    kv = att.kv(context).view(b, context.shape[1], 2, heads, hd)
    k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
    y = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1) @ v
    return att.out(y.transpose(1, 2).reshape(b, n, w))


def ln(x):
    return F.layer_norm(x, x.shape[-1:])


def block_by_hand(block, video, cond, time):
    s1, g1, b1, s2, g2, b2 = block.ada(F.silu(time)).chunk(6, dim=-1)

    def mlp(x):
        return block.mlp[2](F.gelu(block.mlp[0](x)))
    h = ln(video) * (1 + s1[:, None]) + b1[:, None]
    video = video + (1 + g1[:, None]) * attention_by_hand(block.attn, h, h)
    video = video + attention_by_hand(block.cross, block.ln_cross(video), cond)
    video = video + (1 + g2[:, None]) * mlp(ln(video) * (1 + s2[:, None]) + b2[:, None])
    return video, cond


def check_modules_written_out() -> None:
    torch.manual_seed(3)
    att = method._MultiHeadAttention(8, 2)
    x, ctx = torch.randn(2, 5, 8), torch.randn(2, 3, 8)
    assert torch.allclose(att(x, ctx), attention_by_hand(att, x, ctx), atol=1e-5)
    block = method.DiTBlock(8, 2, "cross")
    torch.nn.init.normal_(block.ada.weight, std=0.3)
    torch.nn.init.normal_(block.ada.bias, std=0.3)
    video, cond, time = torch.randn(2, 5, 8), torch.randn(2, 3, 8), torch.randn(2, 8)
    got, cond_out = block(video, cond, time)
    want, _ = block_by_hand(block, video, cond, time)
    assert torch.allclose(got, want, atol=1e-5) and torch.equal(cond_out, cond)
    for norm in (block.ln1, block.ln2):
        assert not list(norm.parameters())
    # condition tokens: LN -> Linear -> GELU -> Linear, plus a per-layer embedding drawn N(0, 0.5^2) after the MLPs
    torch.manual_seed(4)
    tokens = method.ConditionTokens(in_width=6, width=8, n_layers=2)
    torch.manual_seed(4)
    for _ in range(2):
        torch.nn.Linear(6, 8), torch.nn.Linear(8, 8)
    assert torch.equal(tokens.layer_embedding.data, torch.randn(2, 8) * 0.5)
    states = [torch.randn(2, 3, 6), torch.randn(2, 4, 6)]
    want = torch.cat([m[3](F.gelu(m[1](ln(h)))) + tokens.layer_embedding[i]
                      for i, (m, h) in enumerate(zip(tokens.mlps, states, strict=True))], dim=1)
    assert torch.allclose(tokens(states), want, atol=1e-6)
    # EditDiT with the default grid 4 and 2 condition frames, a non-zero head: the forward written out
    torch.manual_seed(5)
    model = method.EditDiT(patch_dim=6, n_video_tokens=16, cond_width=5, n_cond_layers=2, width=8, depth=1,
                           heads=2, attention="cross")
    assert model.cond_position.shape == (1, 32, 8) and model.position.shape == (1, 16, 8)
    assert "position" not in model.state_dict() and "cond_position" not in model.state_dict()
    assert not list(model.norm.parameters())
    torch.nn.init.normal_(model.head.weight, std=0.3)
    for blk in model.blocks:
        torch.nn.init.normal_(blk.ada.weight, std=0.3)
    noisy, source, t = torch.randn(2, 16, 6), torch.randn(2, 16, 6), torch.tensor([0.3, 0.8])
    states = [torch.randn(2, 40, 5), torch.randn(2, 10, 5)]
    video = model.embed(torch.cat([noisy, source], dim=-1)) + model.position
    positions = model.condition_positions(states)
    assert torch.equal(positions[0, :32], model.cond_position[0]) and positions[0, 32:40].abs().sum() == 0
    cond = model.condition(states) + positions
    tm = model.time_mlp
    time = tm[2](F.silu(tm[0](method.timestep_embedding(t, 8))))
    for blk in model.blocks:
        video, cond = block_by_hand(blk, video, cond, time)
    assert torch.allclose(model(noisy, source, t, states), model.head(ln(video)), atol=1e-5)


def test_modules_equal_their_forward_written_out():
    check_modules_written_out()


@pytest.mark.parametrize("broken", ["single_head_layout", "minus_position", "affine_norms", "persistent_codes"])
def test_negative_control_module_variants_are_caught(monkeypatch, broken):
    if broken == "single_head_layout":
        real = method._MultiHeadAttention.forward

        def scrambled(self, x, context):
            out = real(self, x, context)
            return out.flip(1)
        monkeypatch.setattr(method._MultiHeadAttention, "forward", scrambled)
    elif broken == "minus_position":
        real_fwd = method.EditDiT.forward

        def minus(self, noisy, source, t, states):
            self.position.mul_(-1)
            try:
                return real_fwd(self, noisy, source, t, states)
            finally:
                self.position.mul_(-1)
        monkeypatch.setattr(method.EditDiT, "forward", minus)
    elif broken == "affine_norms":
        real_init = method.DiTBlock.__init__

        def affine(self, width, heads, attention):
            real_init(self, width, heads, attention)
            self.ln1 = torch.nn.LayerNorm(width)
        monkeypatch.setattr(method.DiTBlock, "__init__", affine)
    else:
        real_init = method.EditDiT.__init__

        def persistent(self, *args, **kw):
            real_init(self, *args, **kw)
            self.register_buffer("position", self.position.clone(), persistent=True)
        monkeypatch.setattr(method.EditDiT, "__init__", persistent)
    with pytest.raises(CHECK_FAILED):
        check_modules_written_out()
