"""convex_gated_probing method: exact values, identities, and negative controls that break the library
(acceptance checks (a)1-4 and (a)6; the planted-layer test (a)5 is in test_convex_gated_probing_steps.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import average_precision_score
from torch.nn import functional as F

from tasks.convex_gated_probing import method

# ----------------------------------------------------------------------------------- (a)1 the gate


def gate_is_on_simplex(gate_logits: torch.Tensor) -> bool:
    alpha = method.layer_gate(gate_logits)
    return bool((alpha >= 0).all()) and math.isclose(float(alpha.sum()), 1.0, abs_tol=1e-6)


def test_gate_uniform_at_init_and_on_the_simplex():
    head = method.CGPHead(n_layers=6, dim=8, n_prototypes=4, n_classes=3)
    assert torch.equal(head.alpha(), torch.full((6,), 1 / 6))
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert gate_is_on_simplex(3 * torch.randn(6, generator=generator))
    assert torch.allclose(method.layer_gate(torch.tensor([math.log(3.0), 0.0])), torch.tensor([0.75, 0.25]))


def test_negative_control_sigmoid_gate_is_not_convex(monkeypatch):
    monkeypatch.setattr(method, "layer_gate", torch.sigmoid)
    assert not gate_is_on_simplex(torch.ones(6))


# ------------------------------------------------------------------------------ (a)2 the exact vector


def exact_example() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """L = 2, N = 2, D = 2, K = 2, P = I, a = [log 3, 0] (alpha = [0.75, 0.25])."""
    patch = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]], [[0.0, 1.0], [1.0, 0.0]]]])  # (1, 2, 2, 2)
    cls = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])  # (1, 2, 2)
    return patch, cls, torch.tensor([math.log(3.0), 0.0]), torch.eye(2)


def exact_vector_check() -> bool:
    """By hand: z_bar_1 = 0.75 [1,0] + 0.25 [0,1] = [0.75, 0.25], z_bar_2 = [0.25, 0.75]; with P = I,
    s_z = [[0.75, 0.25], [0.25, 0.75]], so min = [0.25, 0.25], max = [0.75, 0.75]; o_bar = [0.75, 0.25]."""
    f = method.cgp_features(*exact_example())
    return torch.allclose(f, torch.tensor([[0.25, 0.25, 0.75, 0.25, 0.75, 0.75]]), atol=1e-6)


def test_exact_feature_vector():
    assert exact_vector_check()


def test_exact_vector_without_cls_uses_the_mean():
    patch, _, a, p = exact_example()
    f = method.cgp_features(patch, None, a, p)
    assert torch.allclose(f, torch.tensor([[0.25, 0.25, 0.5, 0.5, 0.75, 0.75]]), atol=1e-6)


def test_unnormalised_inputs_give_the_same_vector():
    """Step 1 normalises tokens and step 3 prototypes: scaling either leaves f unchanged."""
    patch, cls, a, p = exact_example()
    scale = torch.tensor([3.0, 0.5]).reshape(1, 2, 1, 1)
    f = method.cgp_features(patch * scale * torch.tensor([[[[2.0], [5.0]]]]), cls * 7.0, a, 4.0 * p)
    assert torch.allclose(f, method.cgp_features(patch, cls, a, p), atol=1e-6)


@pytest.mark.parametrize("broken", ["no_normalise", "uniform_gate", "mean_not_min", "swap_blocks"])
def test_negative_control_broken_features_fail_the_exact_vector(monkeypatch, broken):
    original = method.cgp_features
    if broken == "no_normalise":
        monkeypatch.setattr(method, "l2_normalise", lambda x, eps=1e-12: 2.0 * x)
    elif broken == "uniform_gate":
        monkeypatch.setattr(method, "layer_gate", lambda a: torch.full_like(a, 1.0 / a.shape[-1]))
    elif broken == "mean_not_min":
        def mean_pool(patch, cls, a, p):
            f = original(patch, cls, a, p)
            k = p.shape[0]
            sims = method.mix_layers(patch, method.layer_gate(a)) @ method.l2_normalise(p).T
            return torch.cat([sims.mean(dim=1), f[:, k:]], dim=-1)
        monkeypatch.setattr(method, "cgp_features", mean_pool)
    else:
        def swapped(patch, cls, a, p):
            f = original(patch, cls, a, p)
            k = p.shape[0]
            return torch.cat([f[:, 2 * k:], f[:, k:2 * k], f[:, :k]], dim=-1)
        monkeypatch.setattr(method, "cgp_features", swapped)
    assert not exact_vector_check()


# ------------------------------------------------------------------------------ (a)3 bounds, invariances


def random_features(seed: int = 0, batch: int = 3, layers: int = 4, tokens: int = 5, dim: int = 6, k: int = 7):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, layers, tokens, dim, generator=g), torch.randn(batch, layers, dim, generator=g),
            torch.randn(layers, generator=g), torch.randn(k, dim, generator=g))


def test_similarities_are_bounded_and_dimension_is_3k():
    patch, cls, a, p = random_features()
    for f in (method.cgp_features(patch, cls, a, p), method.cgp_features(patch, None, a, p)):
        assert f.shape == (3, 21)
        assert float(f.abs().max()) <= 1.0 + 1e-6
    # min <= centre <= max when the centre is the mean of the same similarities
    f = method.cgp_features(patch, None, a, p)
    assert bool((f[:, :7] <= f[:, 7:14] + 1e-6).all()) and bool((f[:, 7:14] <= f[:, 14:] + 1e-6).all())


def test_mixture_lies_in_the_unit_ball():
    """A convex combination of unit vectors has norm <= 1, with equality when all layers agree."""
    patch, _, a, _ = random_features()
    mixed = method.mix_layers(patch, method.layer_gate(a))
    assert float(mixed.norm(dim=-1).max()) <= 1.0 + 1e-6
    same = patch[:, :1].expand_as(patch) * torch.tensor([1.0, 2.0, 3.0, 4.0]).reshape(1, 4, 1, 1)
    assert torch.allclose(method.mix_layers(same, method.layer_gate(a)).norm(dim=-1), torch.ones(3, 5), atol=1e-6)


def test_invariant_to_token_and_joint_layer_permutation():
    patch, cls, a, p = random_features(seed=1)
    f = method.cgp_features(patch, cls, a, p)
    tokens = torch.randperm(5, generator=torch.Generator().manual_seed(2))
    assert torch.allclose(method.cgp_features(patch[:, :, tokens], cls, a, p), f, atol=1e-6)
    layers = torch.tensor([2, 0, 3, 1])
    assert torch.allclose(method.cgp_features(patch[:, layers], cls[:, layers], a[layers], p), f, atol=1e-6)
    # permuting the layers without the gate changes f: the check can fail
    assert not torch.allclose(method.cgp_features(patch[:, layers], cls[:, layers], a, p), f, atol=1e-3)


def test_negative_control_first_token_pooling_breaks_permutation_invariance(monkeypatch):
    def first_token(patch, cls, a, p):
        sims = method.mix_layers(patch, method.layer_gate(a)) @ method.l2_normalise(p).T
        return torch.cat([sims[:, 0], sims[:, 0], sims[:, 0]], dim=-1)
    monkeypatch.setattr(method, "cgp_features", first_token)
    patch, cls, a, p = random_features(seed=1)
    tokens = torch.randperm(5, generator=torch.Generator().manual_seed(2))
    assert not torch.allclose(method.cgp_features(patch[:, :, tokens], cls, a, p),
                              method.cgp_features(patch, cls, a, p), atol=1e-6)


def test_cgp_head_forward_is_features_then_linear():
    patch, cls, _, _ = random_features(seed=3)
    head = method.CGPHead(4, 6, 7, 2).eval()
    expected = head.classifier(method.cgp_features(patch, cls, head.gate_logits, head.prototypes))
    assert torch.allclose(head(patch, cls), expected)
    assert head.prototypes.std().item() == pytest.approx(0.02, rel=0.5)
    assert head.dropout.p == 0.2


def test_lcgp_mixes_the_raw_cls_tokens_then_layer_norms():
    """Official LinearCGP: gate the RAW cls tokens, LayerNorm(eps=1e-6), Dropout, Linear; hand-computed."""
    patch, cls, _, _ = random_features(seed=4)
    head = method.LCGPHead(4, 6, 2).eval()
    assert head.norm.eps == 1e-6
    with torch.no_grad():
        head.gate_logits.copy_(torch.tensor([0.0, 0.0, 50.0, 0.0]))  # alpha ~ one-hot on layer 3
    def layer_norm(x):
        return (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-6).sqrt()
    assert torch.allclose(head(patch, cls), head.classifier(layer_norm(cls[:, 2])), atol=1e-5)
    assert torch.allclose(head(patch, None), head.classifier(layer_norm(patch[:, 2].mean(dim=1))), atol=1e-5)
    with torch.no_grad():
        head.gate_logits.copy_(torch.tensor([0.0, math.log(3.0), 0.0, 0.0]))  # alpha = (1, 3, 1, 1) / 6
    mixed = (cls[:, 0] + 3 * cls[:, 1] + cls[:, 2] + cls[:, 3]) / 6  # raw, not L2-normalised, tokens
    assert torch.allclose(head(patch, cls), head.classifier(layer_norm(mixed)), atol=1e-5)


def test_negative_control_l2_normalised_lcgp_fails_the_raw_mix(monkeypatch):
    """The former reconstruction (L2-normalise the cls tokens before the mix) gives a different output once
    layers have different norms, so the exact test above catches it."""
    patch, cls, _, _ = random_features(seed=4)
    cls = cls * torch.tensor([1.0, 5.0, 0.2, 2.0]).reshape(1, 4, 1)
    head = method.LCGPHead(4, 6, 2).eval()
    with torch.no_grad():
        head.gate_logits.copy_(torch.tensor([0.0, math.log(3.0), 0.0, 0.0]))
    official = head(patch, cls)
    original = method.LCGPHead.forward
    def l2_first(self, patch, cls):
        return original(self, patch, None if cls is None else method.l2_normalise(cls))
    monkeypatch.setattr(method.LCGPHead, "forward", l2_first)
    assert not torch.allclose(head(patch, cls), official, atol=1e-3)


# ------------------------------------------------------------------------------------- (a)4 ProtoBin STE


def check_straight_through(binarise_fn) -> bool:
    """The STE check: forward equals the official binarisation and the gradient is passed through unchanged."""
    g = torch.Generator().manual_seed(5)
    weights = torch.randn(4, 3, generator=g, requires_grad=True)
    upstream = torch.randn(4, 3, generator=g)
    binary = binarise_fn(weights)
    if not torch.equal(binary, torch.where(weights >= 0, 1.0, -1.0)) or not binary.requires_grad:
        return False
    grad = torch.autograd.grad((binary * upstream).sum(), weights, allow_unused=True)[0]
    return grad is not None and torch.equal(grad, upstream)  # d loss / dP = d loss / d binarise(P)


def test_protobin_straight_through_gradient():
    assert check_straight_through(method.sign_ste)


def test_binarise_maps_zero_to_plus_one_like_the_official_code():
    x = torch.tensor([-2.0, -0.0, 0.0, 1e-9, 3.0])
    assert torch.equal(method.binarise(x), torch.tensor([-1.0, 1.0, 1.0, 1.0, 1.0]))


def test_negative_control_sign_ste_without_straight_through_fails(monkeypatch):
    """Monkeypatch the library's sign_ste to a plain binarisation (zero gradient): the same check fails."""
    monkeypatch.setattr(method, "sign_ste", lambda x: method.binarise(x))
    assert not check_straight_through(method.sign_ste)
    monkeypatch.setattr(method, "sign_ste", torch.sign)  # sign has zero gradient almost everywhere
    assert not check_straight_through(method.sign_ste)


def test_protobin_reads_the_last_layer_with_binary_prototypes():
    patch, cls, _, _ = random_features(seed=6)
    head = method.ProtoBinHead(6, 7, 2).eval()
    protos = torch.where(head.prototypes >= 0, 1.0, -1.0) / math.sqrt(6)
    tokens = patch[:, -1] / patch[:, -1].norm(dim=-1, keepdim=True)
    assert torch.allclose(head(patch, cls), head.classifier((tokens @ protos.T).amax(dim=1)), atol=1e-6)
    changed = patch.clone()
    changed[:, :-1] = 0.0  # earlier layers do not matter
    assert torch.allclose(head(changed, None), head(patch, cls), atol=1e-6)


# ----------------------------------------------------------------- the convex linear probe (optimality)


def probe_problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(120, 5, generator=g, dtype=torch.float64)
    logits = x @ torch.randn(5, 3, generator=g, dtype=torch.float64)
    y = (torch.rand(120, 3, generator=g, dtype=torch.float64) < torch.sigmoid(logits)).double()
    return x, y


def test_linear_probe_objective_exact_value():
    """W = 0, b = 0: every logit is 0, BCE = log 2, penalty 0; W = [[1, 0]], x = [[2, 1]], y = [[1]]:
    BCE = log(1 + e^-2), penalty 0.5 * 0.3 * 1."""
    x = torch.tensor([[2.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([[1.0]], dtype=torch.float64)
    bias = torch.zeros(1, dtype=torch.float64)
    zero = method.linear_probe_objective(torch.zeros(1, 2, dtype=torch.float64), bias, x, y, 0.3)
    assert float(zero) == pytest.approx(math.log(2.0), abs=1e-12)
    one = method.linear_probe_objective(torch.tensor([[1.0, 0.0]], dtype=torch.float64), bias, x, y, 0.3)
    assert float(one) == pytest.approx(math.log1p(math.exp(-2.0)) + 0.15, abs=1e-12)


def test_linear_probe_reaches_zero_gradient_kkt():
    """The probe objective is convex, so the stationary point L-BFGS returns is the global minimum."""
    x, y = probe_problem()
    weight, bias = method.fit_linear_probe(x, y, l2=0.05)
    assert method.linear_probe_gradient_norm(weight, bias, x, y, 0.05) < 1e-7
    # any perturbation raises the objective (first-order optimality of a convex function)
    best = float(method.linear_probe_objective(weight, bias, x, y, 0.05))
    g = torch.Generator().manual_seed(9)
    for _ in range(10):
        step = 1e-3 * torch.randn(weight.shape, generator=g, dtype=torch.float64)
        assert float(method.linear_probe_objective(weight + step, bias, x, y, 0.05)) > best


def test_linear_probe_agrees_with_sklearn_reference_solver():
    """The objective averages BCE over n clips and c classes, so per class it is (1 / (n c)) times sklearn's
    C-weighted logistic loss with C = 1 / (n c l2): the minimisers coincide."""
    x, y = probe_problem(seed=1)
    l2 = 0.05
    weight, bias = method.fit_linear_probe(x, y, l2)
    for c in range(y.shape[1]):
        reference = LogisticRegression(C=1.0 / (x.shape[0] * y.shape[1] * l2), tol=1e-12, max_iter=10_000)
        reference.fit(x.numpy(), y[:, c].numpy())
        assert np.allclose(weight[c].numpy(), reference.coef_[0], atol=1e-5)
        assert bias[c].item() == pytest.approx(reference.intercept_[0], abs=1e-5)


def test_negative_control_truncated_solver_fails_kkt(monkeypatch):
    x, y = probe_problem()
    original = method.fit_linear_probe
    monkeypatch.setattr(method, "fit_linear_probe", lambda x, y, l2: original(x, y, l2, max_iter=2))
    weight, bias = method.fit_linear_probe(x, y, 0.05)
    assert method.linear_probe_gradient_norm(weight, bias, x, y, 0.05) > 1e-7


def test_negative_control_gradient_norm_detects_a_wrong_penalty():
    """The minimiser of the problem with l2 = 0.5 is not stationary for l2 = 0.05."""
    x, y = probe_problem()
    weight, bias = method.fit_linear_probe(x, y, l2=0.5)
    assert method.linear_probe_gradient_norm(weight, bias, x, y, 0.05) > 1e-3


def test_standardise_uses_training_statistics():
    train = torch.tensor([[1.0, 10.0], [3.0, 30.0]])
    test = torch.tensor([[2.0, 50.0]])
    s_train, s_test = method.standardise(train, test)
    std = math.sqrt(2.0)  # unbiased std of [1, 3]
    assert torch.allclose(s_train, torch.tensor([[-1 / std, -1 / std], [1 / std, 1 / std]]))
    assert torch.allclose(s_test, torch.tensor([[0.0, 30 / (10 * std)]]))


# --------------------------------------------------------------------------------------------- metric


def test_average_precision_exact_and_against_sklearn():
    """Scores [0.9, 0.8, 0.7, 0.6], labels [1, 0, 1, 0]: precisions at the positives 1/1 and 2/3."""
    assert method.average_precision(np.array([0.9, 0.8, 0.7, 0.6]), np.array([1, 0, 1, 0])) == pytest.approx(5 / 6)
    assert math.isnan(method.average_precision(np.array([0.1, 0.2]), np.array([0, 0])))
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((50, 4))
    labels = (rng.random((50, 4)) < 0.3).astype(int)
    reference = 100 * average_precision_score(labels, scores, average="macro")
    assert method.macro_map(scores, labels) == pytest.approx(reference)


def test_cosine_to_mean_exact():
    # rows (1,0), (0,1), (2,0): unit rows (1,0),(0,1),(1,0); mean (2/3, 1/3), direction (2, 1)/sqrt(5)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 0.0]])
    assert method.cosine_to_mean(x) == pytest.approx((2 + 1 + 2) / (3 * math.sqrt(5)), rel=1e-6)
    assert method.cosine_to_mean(torch.tensor([[1.0, 1.0], [3.0, 3.0]])) == pytest.approx(1.0)
    assert method.cosine_to_mean(x.reshape(3, 1, 2)) == pytest.approx(method.cosine_to_mean(x))


def test_chance_map_and_prior_entropy_exact():
    labels = np.array([[1, 0], [0, 0], [0, 1], [0, 1]])  # prevalence 0.25 and 0.5
    assert method.chance_map(labels) == pytest.approx(100 * 0.375)
    assert method.chance_map(np.array([[1, 0], [0, 0]])) == pytest.approx(50.0)  # classes with no positive skipped
    h = lambda p: -p * math.log(p) - (1 - p) * math.log(1 - p)  # noqa: E731
    assert method.prior_entropy(labels) == pytest.approx((h(0.25) + h(0.5)) / 2)
    # the prior entropy is the BCE of the best constant predictor
    logits = torch.logit(torch.tensor([[0.25, 0.5]])).expand(4, 2)
    bce = F.binary_cross_entropy_with_logits(logits, torch.tensor(labels, dtype=torch.float32))
    assert float(bce) == pytest.approx(method.prior_entropy(labels), rel=1e-5)


def test_prior_entropy_of_a_class_in_every_clip_is_zero():
    """A class present in every clip has prevalence 1 and entropy 0 (clipped below 1, not nan)."""
    labels = np.array([[1, 0], [1, 1]])
    assert method.prior_entropy(labels) == pytest.approx(math.log(2) / 2)


def test_linear_probe_keeps_the_feature_dtype():
    x, y = probe_problem()
    weight, bias = method.fit_linear_probe(x.double(), y.double(), 1e-2, max_iter=5)
    assert weight.dtype == torch.float64 and bias.dtype == torch.float64


def test_gap_closure_exact():
    assert method.gap_closure(probe=37.70, linear=26.15, finetune=41.59) == pytest.approx(11.55 / 15.44)


# ----------------------------------------------------------------------------------- (a)6 BAT elements


def test_frontend_spans_zero_to_one_per_clip():
    g = torch.Generator().manual_seed(0)
    waves = torch.randn(4, 8000, generator=g) * torch.tensor([[0.01], [1.0], [100.0], [3.0]])
    spec = method.log_mel_frontend(waves, 8000, 256, 128, 32, 64)
    assert spec.shape == (4, 64, 32)
    flat = spec.reshape(4, -1)
    assert torch.allclose(flat.amin(dim=1), torch.zeros(4)) and torch.allclose(flat.amax(dim=1), torch.ones(4))


def test_minmax_exact_and_negative_control(monkeypatch):
    x = torch.tensor([[[2.0, 4.0], [6.0, 10.0]]])
    assert torch.allclose(method.minmax_per_clip(x), torch.tensor([[[0.0, 0.25], [0.5, 1.0]]]))
    monkeypatch.setattr(method, "minmax_per_clip", lambda x, eps=1e-8: x / x.amax())  # batch-global, not per clip
    waves = torch.randn(2, 8000) * torch.tensor([[0.01], [100.0]])
    spec = method.log_mel_frontend(waves, 8000, 256, 128, 32, 64).reshape(2, -1)
    assert not torch.allclose(spec.amin(dim=1), torch.zeros(2))


def test_mel_filterbank_peaks_and_a_pure_tone_lands_in_its_band():
    bank = method.mel_filterbank(256, 32, 8000)
    assert bank.shape == (129, 32)
    assert float(bank.min()) == 0.0 and float(bank.max()) <= 1.0  # triangles: non-negative, peak at most 1
    tone = torch.sin(2 * math.pi * 1000.0 * torch.arange(8000) / 8000)[None]
    spec = method.log_mel_frontend(tone, 8000, 256, 128, 32, 64)
    centre_hz = 700 * (10 ** (np.linspace(0, 2595 * np.log10(1 + 4000 / 700), 34)[1:-1] / 2595) - 1)
    assert abs(centre_hz[int(spec[0, 30].argmax())] - 1000.0) < 120.0


def test_gated_attention_with_unit_gate_equals_standard_attention():
    torch.manual_seed(0)
    gated = method.GatedSelfAttention(16, 4, gated=True)
    plain = method.GatedSelfAttention(16, 4, gated=False)
    plain.load_state_dict({k: v for k, v in gated.state_dict().items() if not k.startswith("gate.")})
    with torch.no_grad():
        gated.gate.weight.zero_()
        gated.gate.bias.fill_(60.0)  # sigma(60) = 1 in float32
    x = torch.randn(2, 5, 16)
    assert torch.allclose(gated(x), plain(x), atol=1e-6)
    reference = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    with torch.no_grad():
        reference.in_proj_weight.copy_(plain.qkv.weight)
        reference.in_proj_bias.copy_(plain.qkv.bias)
        reference.out_proj.weight.copy_(plain.proj.weight)
        reference.out_proj.bias.copy_(plain.proj.bias)
    assert torch.allclose(plain(x), reference(x, x, x, need_weights=False)[0], atol=1e-6)
    with torch.no_grad():
        gated.gate.bias.fill_(0.0)  # sigma(0) = 1/2 halves the attention output before the projection
    assert torch.allclose(gated(x) - plain.proj.bias, 0.5 * (plain(x) - plain.proj.bias), atol=1e-6)


def test_gated_attention_rejects_indivisible_heads():
    with pytest.raises(ValueError, match="divisible"):
        method.GatedSelfAttention(10, 4, gated=True)


# ------------------------------------------------- middle-layer headroom, layer chosen on validation (finding 8)


def test_middle_layer_gain_selects_on_validation_not_test():
    # 3 layers x 2 readouts (cls, mean). On validation the best non-last pair is (layer 1, mean): 52 > 50 > 40 > 30.
    val = np.array([[40.0, 52.0], [50.0, 30.0], [99.0, 99.0]])  # the last layer is never a candidate
    test = np.array([[70.0, 45.0], [80.0, 20.0], [60.0, 41.0]])
    gain, layer, readout = method.middle_layer_gain(val, test)
    # test(layer 1, mean) - test(last, mean) = 45 - 41, although test data would have picked (layer 2, cls): +20
    assert (gain, layer, readout) == (pytest.approx(4.0), 1, 1)
    val_cls = np.array([[10.0], [20.0], [0.0]])
    test_cls = np.array([[30.0], [25.0], [27.0]])
    assert method.middle_layer_gain(val_cls, test_cls) == (pytest.approx(-2.0), 2, 0)  # the gain can be negative
    # two layers (the smallest valid input): the only non-last layer is layer 1
    assert method.middle_layer_gain(np.array([[1.0, 3.0], [5.0, 5.0]]), np.array([[9.0, 8.0], [6.0, 2.0]])) == (
        pytest.approx(6.0), 1, 1)


def test_middle_layer_gain_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="must be the same"):
        method.middle_layer_gain(np.zeros((3, 2)), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="layers >= 2"):
        method.middle_layer_gain(np.zeros((1, 2)), np.zeros((1, 2)))


def test_negative_control_selecting_on_test_inflates_the_gain(monkeypatch):
    """A variant that picks the layer on the test mAPs (the old best_middle_lp_map) fails the exact check above."""
    def on_test(val_maps, test_maps):
        test = np.asarray(test_maps, dtype=float)
        layer, readout = np.unravel_index(int(np.argmax(test[:-1])), test[:-1].shape)
        return float(test[layer, readout] - test[-1, readout]), int(layer) + 1, int(readout)

    monkeypatch.setattr(method, "middle_layer_gain", on_test)
    val = np.array([[40.0, 52.0], [50.0, 30.0], [99.0, 99.0]])
    test = np.array([[70.0, 45.0], [80.0, 20.0], [60.0, 41.0]])
    assert method.middle_layer_gain(val, test)[0] != pytest.approx(4.0)


def test_mel_filterbank_matches_the_htk_formulas_exactly():
    n_fft, n_mels, sample_rate = 64, 5, 8000
    hz_to_mel = lambda f: 2595.0 * np.log10(1.0 + f / 700.0)  # noqa: E731
    mel_to_hz = lambda m: 700.0 * (10.0 ** (m / 2595.0) - 1.0)  # noqa: E731
    freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(0.0, hz_to_mel(sample_rate / 2), n_mels + 2))
    expected = np.stack([np.clip(np.minimum((freqs - edges[m]) / (edges[m + 1] - edges[m]),
                                            (edges[m + 2] - freqs) / (edges[m + 2] - edges[m + 1])), 0.0, None)
                         for m in range(n_mels)], axis=1)
    assert np.allclose(method.mel_filterbank(n_fft, n_mels, sample_rate).numpy(), expected, atol=1e-6)


def test_log_mel_frontend_uses_the_given_hop():
    waves = torch.randn(2, 800, generator=torch.Generator().manual_seed(0))
    n_fft, hop, n_mels = 64, 32, 8
    n_frames = 800 // hop + 1  # centred STFT: every frame kept, no padding or cropping
    spec = torch.stft(waves, n_fft=n_fft, hop_length=hop, window=torch.hann_window(n_fft), return_complex=True,
                      center=True).abs().pow(2)
    db = 10.0 * torch.log10((spec.transpose(1, 2) @ method.mel_filterbank(n_fft, n_mels, 8000)).clamp_min(1e-10))
    expected = method.minmax_per_clip(db)
    out = method.log_mel_frontend(waves, 8000, n_fft, hop, n_mels, n_frames)
    assert out.shape == (2, n_frames, n_mels)
    assert torch.allclose(out, expected, atol=1e-5)
