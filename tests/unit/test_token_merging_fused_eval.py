"""token_merging's fused evaluation attention (``merge.fused_attention``): ``corrected_attention_fused`` equals the
hand-computed corrected attention for every mode (sizes above one, kappa, value exponents), a negative control
without the log-size mask fails the same check, the merged forward pass and the sweep equal the reference path,
and at r = 1 every method is bit-identical (claim C5d)."""

from __future__ import annotations

import pytest
import torch

from tasks.token_merging import baselines, method, sweep
from tasks.token_merging.config import MergeSweepConfig
from tests.unit.test_token_merging_exact import CASES, KAPPA, SIZES, K, Q, R, V, attention_by_hand

F64 = torch.float64


def fused_attention(mode: str, value_exp: float = 0.0, shrink_singletons: bool = False) -> torch.Tensor:
    q, k, v = (torch.tensor(t, dtype=F64)[None, None] for t in (Q, K, V))
    return method.corrected_attention_fused(q, k, v, torch.tensor([SIZES], dtype=F64), R, mode,
                                            kappa=torch.tensor([KAPPA], dtype=F64), value_exp=value_exp,
                                            shrink_singletons=shrink_singletons)[0, 0]


def fused_failures() -> list[tuple]:
    return [case for case in CASES
            if not torch.allclose(fused_attention(*case), torch.tensor(attention_by_hand(*case), dtype=F64),
                                  rtol=0, atol=1e-12)]


def test_fused_attention_matches_the_hand_softmax_in_every_mode():
    assert fused_failures() == []


def test_negative_control_fused_attention_without_the_log_size_mask_fails(monkeypatch):
    original = method.F.scaled_dot_product_attention
    monkeypatch.setattr(method.F, "scaled_dot_product_attention",
                        lambda q, k, v, attn_mask=None: original(q, k, v, attn_mask=torch.zeros_like(attn_mask)))
    assert [case[0] for case in fused_failures()] and all(case[0] != "none" for case in fused_failures())


def test_negative_control_fused_attention_without_the_key_scale_fails(monkeypatch):
    monkeypatch.setattr(method, "key_logit_scale", lambda sizes, *args, **kwargs: torch.ones_like(sizes))
    failed = {case[0] for case in fused_failures()}
    assert failed == {"sqrt_r", "kappa"}


def tiny_model() -> method.MergeViT:
    torch.manual_seed(0)
    shape = method.ViTShape(image_size=8, patch_size=1, channels=1, dim=16, depth=3, heads=2, mlp_dim=32,
                            n_classes=5, pos_embed="sincos")
    return method.MergeViT(shape).double().eval()


def images() -> torch.Tensor:
    return torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(3), dtype=F64)


@pytest.mark.parametrize("merge", [*baselines.ALL_METHODS, method.VALUE_CORRECTED.with_value_exp(1.0)],
                         ids=lambda m: f"{m.name}_e{m.value_exp:g}")
def test_fused_merged_forward_equals_the_reference_path(merge):
    model, x = tiny_model(), images()
    schedule = method.merge_schedule(model.shape.n_patches, model.shape.depth, 0.2)
    with torch.no_grad():
        reference = model.forward_merged(x, merge, schedule)
        fused = model.forward_merged(x, merge, schedule, fused=True)
    torch.testing.assert_close(fused.logits, reference.logits, rtol=0, atol=1e-10)
    torch.testing.assert_close(fused.cls_residual, reference.cls_residual, rtol=0, atol=1e-10)
    assert fused.realised_retention == reference.realised_retention < 1


def test_fused_r1_every_method_is_bit_identical():
    model, x = tiny_model().float(), images().float()
    with torch.no_grad():
        logits = [model.forward_merged(x, merge, [0, 0, 0], fused=True).logits
                  for merge in [*baselines.ALL_METHODS, method.VALUE_CORRECTED.with_value_exp(-1.0)]]
    assert all(torch.equal(logits[0], other) for other in logits[1:])


def test_sweep_uses_the_fused_path_only_when_configured(monkeypatch):
    calls = []
    original = method.corrected_attention_fused
    monkeypatch.setattr(method, "corrected_attention_fused", lambda *a, **k: calls.append(1) or original(*a, **k))
    model, x = tiny_model(), images()
    labels = torch.arange(6) % 5
    cfg = MergeSweepConfig(retentions=[1.0, 0.25], value_exponents=[0.0], calibration_size=8)
    plain, *_ = sweep.merging_sweep(model, x, labels, x, cfg)
    assert calls == []
    fused, *_ = sweep.merging_sweep(model, x, labels, x, cfg.model_copy(update={"fused_attention": True}))
    assert calls
    for a, b in zip(plain, fused):
        assert (a.method, a.retention, a.accuracy) == (b.method, b.retention, b.accuracy)
        assert a.angular == pytest.approx(b.angular, rel=1e-8, abs=1e-14)
