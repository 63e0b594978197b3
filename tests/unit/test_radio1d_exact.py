"""radio1d method: exact values where test_radio1d_method.py's inputs could not tell a right formula from a wrong one
(issue 20, found by the full mutation run): the samplers draw by their documented formulas from the given generator
(float64 draws, default sigma, both clamps, the bounds k = 1 and k = k_max, n = 0, large k), the model's structure
(block counts, no dropout, prefix shapes and init scale, which decoder output is cls, + positions), dtypes and devices
of the masks, the losses and measures on inputs without symmetries (unequal norms, ties, several output columns,
ridge not exact in float32, a large offset). Each check has a negative control that breaks the library."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tasks.radio1d import method

# ----------------------------------------------------------------------------- samplers


def expected_draws(kind: str, n: int, k_max: int, seed: int, modes: tuple[float, ...] = (),
                   sigma: float = 1.0) -> torch.Tensor:
    """The docstring's formulas on float64 draws from a generator seeded with ``seed`` (u first, then z)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g, dtype=torch.float64)
    if kind == "uniform":
        k = 1 + torch.floor(u * k_max)
    elif kind == "triangle":
        k = 1 + torch.round((k_max - 1) * (1 - torch.sqrt(1 - u)))
    else:
        pick = torch.floor(u * len(modes)).long()
        z = torch.randn(n, generator=g, dtype=torch.float64)
        k = torch.round(torch.tensor(modes, dtype=torch.float64)[pick] + sigma * z)
    return k.clamp(1, k_max).long()


def check_samplers_follow_their_formulas() -> None:
    def draw(kind, n, k_max, seed, **kwargs):
        return method.sample_num_tokens(kind, n, k_max, torch.Generator().manual_seed(seed), **kwargs)

    # k_max = 2^30: float32 draws would be visible in k (float32 resolves ~2^-24 of the range)
    for kind in ("uniform", "triangle"):
        assert torch.equal(draw(kind, 2000, 2**30, 4), expected_draws(kind, 2000, 2**30, 4))
    # default sigma (1.0); modes near both ends, so the clamps at 1 and k_max both act
    mixture = draw("gaussian_mixture", 4000, 16, 5, modes=(1.0, 15.6))
    assert torch.equal(mixture, expected_draws("gaussian_mixture", 4000, 16, 5, modes=(1.0, 15.6)))
    assert int((mixture == 1).sum()) > 1000 and int((mixture == 16).sum()) > 600
    # modes are float64: 2.5000001 rounds to 3, 7.4999999 to 7 (as float32 they would be 2.5 -> 2 and 7.5 -> 8)
    assert draw("gaussian_mixture", 3, 16, 0, modes=(2.5000001,), sigma=0.0).tolist() == [3, 3, 3]
    assert draw("gaussian_mixture", 3, 16, 0, modes=(7.4999999,), sigma=0.0).tolist() == [7, 7, 7]
    # beta draws from the global generator, with float64 parameters (float32 would show at k_max = 2^30)
    torch.manual_seed(11)
    beta = draw("beta", 500, 2**30, 0, beta=(2.0, 3.0))
    torch.manual_seed(11)
    x = torch.distributions.Beta(torch.tensor(2.0, dtype=torch.float64), torch.tensor(3.0, dtype=torch.float64))
    assert torch.equal(beta, (1 + torch.round((2**30 - 1) * x.sample((500,)))).clamp(1, 2**30).long())
    # bounds: k_max = 1 is valid; fixed_k may be 1 or k_max; n = 0 gives an empty long tensor
    assert draw("uniform", 3, 1, 0).tolist() == [1, 1, 1]
    assert draw("fixed", 2, 16, 0, fixed_k=1).tolist() == [1, 1]
    assert draw("fixed", 2, 16, 0, fixed_k=16).tolist() == [16, 16]
    assert draw("fixed", 1, 2**24 + 1, 0, fixed_k=2**24 + 1).tolist() == [2**24 + 1]  # not float32 (2^24)
    empty = draw("beta", 0, 16, 0)
    assert empty.shape == (0,) and empty.dtype == torch.long


def test_samplers_follow_their_formulas():
    check_samplers_follow_their_formulas()


@pytest.mark.parametrize("broken", ["float32_draws", "sigma_two", "values_below_one"])
def test_negative_control_broken_samplers_are_caught(monkeypatch, broken):
    real = method.sample_num_tokens

    def sampler(kind, n, k_max, generator, **kwargs):
        if broken == "sigma_two" and kind == "gaussian_mixture":
            kwargs.setdefault("sigma", 2.0)
        if broken == "float32_draws" and kind == "uniform":
            u = torch.rand(n, generator=generator)
            return (1 + torch.floor(u * k_max)).clamp(1, k_max).long()
        if broken == "values_below_one" and kind == "gaussian_mixture":
            drawn = real(kind, n, k_max, generator, **kwargs)
            return drawn - (drawn == 1).long()  # a draw that the clamp at 1 held now shows as 0
        return real(kind, n, k_max, generator, **kwargs)

    monkeypatch.setattr(method, "sample_num_tokens", sampler)
    with pytest.raises(AssertionError):
        check_samplers_follow_their_formulas()


# ----------------------------------------------------------------------------- the model


def model(depths: tuple[int, int, int, int] = (2, 1, 1, 3), width: int = 8, registers: int = 1,
          seed: int = 0) -> method.Radio1D:
    torch.manual_seed(seed)
    before, after, dec_before, dec_after = depths
    return method.Radio1D(image_size=16, patch_size=2, width=width, heads=2, depth_before=before, depth_after=after,
                          registers=registers, decoder_depth_before=dec_before, decoder_depth_after=dec_after,
                          summary_dim=5, dense_dim=3)


def check_model_structure() -> None:
    net = model()
    assert [len(net.blocks_before), len(net.blocks_after), len(net.dec_blocks_before), len(net.dec_blocks_after)] == \
        [2, 1, 1, 3]
    assert net.enc_prefix.shape == (1, 2, 8) and net.dec_prefix.shape == (1, 2, 16) and net.filler.shape == (16,)
    # no dropout anywhere: the training mode computes the same function as the evaluation mode
    images = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    k = torch.tensor([3, 16])
    with torch.no_grad():
        trained = net.train()(images, k)
        evaluated = net.eval()(images, k)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(trained, evaluated, strict=True))
    # prefix tokens and filler start as N(0, 0.02^2) (256, 512 and 64 values: the sample sd is 0.02 +- 0.003)
    wide = model(width=32, registers=7, seed=3)
    for parameter in (wide.enc_prefix, wide.dec_prefix, wide.filler):
        assert 0.012 < float(parameter.detach().std()) < 0.028 and abs(float(parameter.detach().mean())) < 0.01


def test_model_structure_dropout_and_init():
    check_model_structure()


@pytest.mark.parametrize("broken", ["no_blocks", "dropout", "init_scale"])
def test_negative_control_broken_structure_is_caught(monkeypatch, broken):
    real_init = method.Radio1D.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        if broken == "no_blocks":
            self.dec_blocks_after = torch.nn.ModuleList()
        elif broken == "dropout":
            for block in self.blocks_after:
                block.mlp.append(torch.nn.Dropout(0.5))
        else:
            with torch.no_grad():
                self.filler.mul_(50.0)

    monkeypatch.setattr(method.Radio1D, "__init__", init)
    with pytest.raises(AssertionError):
        check_model_structure()


def check_encoder_and_decoder_by_hand() -> None:
    """Without transformer blocks each path is a few layers, written out here: spatial tokens are
    norm(merge(patchify + positions)); the decoder's cls is dec_norm(dec_prefix_proj(dec_prefix[0])), the same
    for every sample (nothing of the tokens reaches it without blocks); a k of 1 is a valid 1D code."""
    net = model(depths=(0, 0, 0, 0)).eval()
    images = torch.rand(2, 1, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, spatial = net.encode(images)
        patches = net.patchify(images).flatten(2).transpose(1, 2) + net.position
        assert torch.allclose(spatial, net.norm(net.merge(patches, 8)), atol=1e-6)
        cls, _ = net.decode(spatial, torch.tensor([2, 9]))
        expected_cls = net.dec_norm(net.dec_prefix_proj(net.dec_prefix[0, 0]))
        assert torch.allclose(cls, expected_cls.expand(2, -1), atol=1e-6)
        assert torch.equal(net.forward_encoder(images, 1), spatial[:, :1])


def test_encoder_and_decoder_by_hand():
    check_encoder_and_decoder_by_hand()


@pytest.mark.parametrize("broken", ["register_as_cls", "positions_subtracted"])
def test_negative_control_broken_paths_are_caught(monkeypatch, broken):
    if broken == "register_as_cls":
        real = method.Radio1D.decode
        monkeypatch.setattr(method.Radio1D, "decode", lambda self, s, k: (self.dec_norm(self.dec_prefix_proj(
            self.dec_prefix[:, 1])).expand(s.shape[0], -1), real(self, s, k)[1]))
    else:
        monkeypatch.setattr(method.Radio1D, "encode", _encode_with_subtracted_positions)
    with pytest.raises(AssertionError):
        check_encoder_and_decoder_by_hand()


def _encode_with_subtracted_positions(net: method.Radio1D, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = net.patchify(images).flatten(2).transpose(1, 2) - net.position
    x = torch.cat([net.enc_prefix.expand(x.shape[0], -1, -1), x], dim=1)
    prefix, spatial = x[:, :net.prefix], x[:, net.prefix:]
    x = net.norm(torch.cat([net.prefix_proj(prefix), net.merge(spatial, net.grid)], dim=1))
    return x[:, :net.prefix], x[:, net.prefix:]


def check_masks_keep_device_and_dtype() -> None:
    on_meta = method.keep_mask(torch.tensor([1, 2], device="meta"), 3)
    assert on_meta.device.type == "meta" and on_meta.shape == (2, 3)
    tokens = torch.arange(6, dtype=torch.float32).view(1, 3, 2)
    filled = method.fill_after_prefix(tokens, torch.tensor([1]), torch.tensor([0.1, -0.2], dtype=torch.float64))
    assert filled.dtype == torch.float32
    a, b = float(torch.tensor(0.1, dtype=torch.float32)), float(torch.tensor(-0.2, dtype=torch.float32))
    assert filled.tolist() == [[[0.0, 1.0], [a, b], [a, b]]]


def test_masks_keep_device_and_dtype():
    check_masks_keep_device_and_dtype()


@pytest.mark.parametrize("broken", ["cpu_mask", "filler_dtype"])
def test_negative_control_mask_device_and_dtype_are_caught(monkeypatch, broken):
    if broken == "cpu_mask":
        monkeypatch.setattr(method, "keep_mask", lambda k, length: torch.arange(length)[None, :] < k.cpu()[:, None])
    else:
        monkeypatch.setattr(method, "fill_after_prefix", lambda t, k, filler: torch.where(
            (torch.arange(t.shape[1])[None, :] < k[:, None])[..., None], t, filler.expand_as(t)))
    with pytest.raises((AssertionError, RuntimeError)):
        check_masks_keep_device_and_dtype()


# ----------------------------------------------------------------------------- losses and measures


def check_losses_and_measures() -> None:
    # dense loss on (B, grid, D) = (2, 3, 4) by hand: per location ||p - t||^2 + 1 - cos, mean over 6 locations
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(2, 3, 4, generator=g, dtype=torch.float64), torch.randn(2, 3, 4, generator=g,
                                                                                        dtype=torch.float64)
    by_hand = sum(float(((pred[b, i] - target[b, i]) ** 2).sum()) + 1 - float(
        pred[b, i] @ target[b, i] / (pred[b, i].norm() * target[b, i].norm())) for b in range(2) for i in range(3)) / 6
    assert float(method.dense_loss(pred, target)) == pytest.approx(by_hand, abs=1e-12)
    # summary loss on a (B, T, D) batch: 1 - cos over the feature axis, mean over B and T
    by_hand = sum(1 - float(pred[b, i] @ target[b, i] / (pred[b, i].norm() * target[b, i].norm()))
                  for b in range(2) for i in range(3)) / 6
    assert float(method.summary_loss(pred, target)) == pytest.approx(by_hand, abs=1e-12)
    # AP with ties broken in index order (100 scores on 3 levels): precision at each positive's rank, by hand
    scores = torch.tensor([float(i % 3) for i in range(100)])
    labels = torch.tensor([1 if i % 7 in (0, 3) else 0 for i in range(100)])
    ranking = sorted(range(100), key=lambda i: (-float(scores[i]), i))
    hits, precisions = 0, []
    for rank, i in enumerate(ranking, start=1):
        if labels[i]:
            hits += 1
            precisions.append(hits / rank)
    assert method.average_precision(scores, labels) == pytest.approx(sum(precisions) / len(precisions), abs=1e-12)
    # P@1 by cosine, not by dot product or column-normalised features:
    # query (1, 0.1): cos 0.995 to gallery (1, 0) (key hit), 0.68 to (3, 4) which has the larger dot product 3.4
    assert method.precision_at_1(torch.tensor([[1.0, 0.1]]), torch.tensor([[1.0, 0.0], [3.0, 4.0]]),
                                 torch.tensor([[1]]), torch.tensor([[1], [2]])) == 1.0
    # query (0.8, 0.6) is nearest to (0.6, 0.8) (cos 0.96 vs 0.8); query (0, 10) to (0.6, 0.8): one hit of two.
    # Normalising queries per feature column instead (norms 0.8 and 10.02) would send query 0 to (1, 0).
    assert method.precision_at_1(torch.tensor([[0.8, 0.6], [0.0, 10.0]]), torch.tensor([[1.0, 0.0], [0.6, 0.8]]),
                                 torch.tensor([[2], [3]]), torch.tensor([[1], [2]])) == 0.5
    # a query whose norm overflows float32 does not change another query's neighbour
    assert method.precision_at_1(torch.tensor([[3e19, 0.0], [0.0, 1.0]]), torch.tensor([[1.0, 0.0], [0.0, 1.0]]),
                                 torch.tensor([[1], [2]]), torch.tensor([[1], [2]])) == 1.0


def test_losses_and_measures_exact():
    check_losses_and_measures()


@pytest.mark.parametrize("broken", ["dense_sum_over_grid", "unstable_ties", "dot_product"])
def test_negative_control_broken_losses_and_measures_are_caught(monkeypatch, broken):
    if broken == "dense_sum_over_grid":
        monkeypatch.setattr(method, "dense_loss", lambda p, t: (((p - t) ** 2).sum(1)[:, :, None] + 1
                                                                - F.cosine_similarity(p, t, dim=-1)[:, None]).mean())
    elif broken == "unstable_ties":
        real = method.average_precision
        monkeypatch.setattr(method, "average_precision", lambda s, y: real(s + 1e-3 * torch.rand(len(s)), y))
    else:
        monkeypatch.setattr(method, "precision_at_1", lambda q, g, qk, gk: float(
            (gk[(q @ g.T).argmax(dim=1)] == qk).all(dim=-1).double().mean()))
    with pytest.raises(AssertionError):
        check_losses_and_measures()


def check_held_out_r2_and_curves() -> None:
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0]], dtype=torch.float64)
    # ridge 0.1 (not a float32 number): lambda n = 0.4, slope = (x_c . y_c) / (5 + 0.4) with y = x: 5 / 5.4
    slope = 5 / 5.4
    r2 = method.held_out_r2(x, x.clone(), torch.tensor([[5.0]], dtype=torch.float64),
                            torch.tensor([[5.0]], dtype=torch.float64), 0.1)
    assert r2 == pytest.approx(1 - (5.0 - (1.5 + slope * 3.5)) ** 2 / 3.5**2, abs=1e-14)
    # two output columns with different means (SST about each column's own train mean)
    y = torch.cat([x, 10 - 2 * x], dim=1)
    r2_two = method.held_out_r2(x, y, torch.tensor([[4.0]], dtype=torch.float64),
                                torch.tensor([[5.0, 1.0]], dtype=torch.float64), 1e-12)
    # predictions (4, 2); SSE = 1 + 1 = 2; SST = (5 - 1.5)^2 + (1 - 7)^2 = 12.25 + 36
    assert r2_two == pytest.approx(1 - 2 / 48.25, abs=1e-9)
    # a large offset: y = 2^39 + (0, 2, 4, 6) 2^-13 is an exact line; centring keeps it exact (R^2 = 1 at x = 5);
    # y + ybar would round the odd multiples of 2^-13 at 2^40
    offset = 2.0**39 + torch.tensor([[0.0], [2.0], [4.0], [6.0]], dtype=torch.float64) * 2.0**-13
    assert method.held_out_r2(x, offset, torch.tensor([[5.0]], dtype=torch.float64),
                              torch.tensor([[2.0**39 + 10 * 2.0**-13]], dtype=torch.float64), 0.0) == 1.0
    # curves: a first interval of zero width is allowed; the area is divided by the log2 range (k from 2)
    assert method.log_k_area([2, 2, 4], [1.0, 1.0, 3.0]) == pytest.approx(2.0, abs=1e-12)
    assert method.log_k_area([2, 4, 8], [1.0, 1.0, 1.0]) == pytest.approx(1.0, abs=1e-12)


def test_held_out_r2_and_curves_exact():
    check_held_out_r2_and_curves()


@pytest.mark.parametrize("broken", ["float32_ridge", "pooled_mean", "log_range_sum"])
def test_negative_control_broken_r2_and_curves_are_caught(monkeypatch, broken):
    if broken == "float32_ridge":
        real = method.held_out_r2
        monkeypatch.setattr(method, "held_out_r2", lambda a, b, c, d, ridge: real(a, b, c, d, float(
            torch.tensor(ridge, dtype=torch.float32))))
    elif broken == "pooled_mean":
        def pooled(x_train, y_train, x_test, y_test, ridge):  # one mean over all output columns
            x_mean, y_mean = x_train.mean(0), y_train.mean()
            xc, yc = (x_train - x_mean).double(), (y_train - y_mean).double()
            gram = xc.T @ xc + ridge * len(xc) * torch.eye(xc.shape[1], dtype=torch.float64)
            prediction = (x_test - x_mean).double() @ torch.linalg.solve(gram, xc.T @ yc) + y_mean.double()
            return float(1 - ((y_test - prediction) ** 2).sum() / ((y_test - y_mean) ** 2).sum())

        monkeypatch.setattr(method, "held_out_r2", pooled)
    else:
        real_area = method.log_k_area
        monkeypatch.setattr(method, "log_k_area", lambda ks, v: real_area(ks, v) * (
            math.log2(ks[-1]) - math.log2(ks[0])) / (math.log2(ks[-1]) + math.log2(ks[0])))
    with pytest.raises(AssertionError):
        check_held_out_r2_and_curves()


def check_adaptor_and_probe() -> None:
    # adaptor = Linear, GELU, Linear: with weights (1, -1) then (1, 1) and zero biases, out = gelu(x) + gelu(-x)
    # = x (2 Phi(x) - 1); without the GELU it would be 0
    adaptor = method.mlp_adaptor(1, 1)
    with torch.no_grad():
        adaptor[0].weight.copy_(torch.tensor([[1.0], [-1.0]]))
        adaptor[0].bias.zero_()
        adaptor[-1].weight.copy_(torch.tensor([[1.0, 1.0]]))
        adaptor[-1].bias.zero_()
        assert float(adaptor(torch.tensor([[1.0]]))) == pytest.approx(math.erf(1 / math.sqrt(2)), abs=1e-6)
    # one Adam step from zero: each parameter moves by -lr sign(gradient) (Adam's first step, up to eps).
    # Features: mean 3, spread 1e-5 (so the +1e-6 in the std matters: 1.1e-5 vs 0.9e-5).
    x_train = torch.tensor([[3.0 - 1e-5], [3.0 + 1e-5], [3.0 + 2e-5], [3.0 + 0.5e-5]], dtype=torch.float64).float()
    # labels: 3 of 4 positive, the negative at a high value (so the centred gradient has the opposite sign of the
    # gradient of uncentred features, whose mean term -0.25 * 2 * 3 / std dominates)
    y_train = torch.tensor([[1.0], [1.0], [0.0], [1.0]])
    x_test = torch.tensor([[3.0 + 3e-5], [3.0 - 2e-5]]).float()
    mean, std = x_train.mean(0), x_train.std(0) + 1e-6
    xs = (x_train - mean) / std
    grad_w = float(((0.5 - y_train) * xs).mean())  # d BCE / d w at zero logits: mean (sigmoid(0) - y) x
    grad_b = float((0.5 - y_train).mean())
    w, b = -0.1 * math.copysign(1.0, grad_w), -0.1 * math.copysign(1.0, grad_b)
    expected = ((x_test - mean) / std) * w + b
    logits = method.fit_linear_probe(x_train, y_train, x_test, steps=1, lr=0.1)
    assert torch.allclose(logits, expected, atol=1e-5)
    # guards: the bias moved (unbalanced labels), and the 1e-6 in the std moves the logits by far more than atol
    assert b > 0
    assert float((((x_test - mean) / (std - 2e-6)) * w + b - expected).abs().max()) > 1e-2


def test_adaptor_and_probe_exact():
    check_adaptor_and_probe()


@pytest.mark.parametrize("broken", ["no_gelu", "frozen_bias", "std_minus_eps"])
def test_negative_control_broken_adaptor_and_probe_are_caught(monkeypatch, broken):
    if broken == "no_gelu":
        monkeypatch.setattr(method, "mlp_adaptor", lambda i, o: torch.nn.Sequential(
            torch.nn.Linear(i, 2 * i), torch.nn.Identity(), torch.nn.Linear(2 * i, o)))
    else:
        def probe(x_train, y_train, x_test, steps, lr):
            shift = -1e-6 if broken == "std_minus_eps" else 1e-6
            mean, std = x_train.mean(0), x_train.std(0) + shift
            xs, xt = (x_train - mean) / std, (x_test - mean) / std
            weight = torch.zeros(xs.shape[1], y_train.shape[1], requires_grad=True)
            bias = torch.zeros(y_train.shape[1], requires_grad=broken != "frozen_bias")
            optimizer = torch.optim.Adam([weight, bias], lr=lr)
            for _ in range(steps):
                loss = F.binary_cross_entropy_with_logits(xs @ weight + bias, y_train)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            return (xt @ weight + bias).detach()

        monkeypatch.setattr(method, "fit_linear_probe", probe)
    with pytest.raises(AssertionError):
        check_adaptor_and_probe()
