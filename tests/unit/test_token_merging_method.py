"""Deterministic checks of the token-merging library (acceptance checks (a) of the reconstruction, claims.yaml).

Every key check has a negative control: a deliberately broken variant that must fail the same check.
"""

from __future__ import annotations

import math

import pytest
import torch

from tasks.token_merging import baselines
from tasks.token_merging import method as m

F64 = torch.float64


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------------------
# (a)1 radial-angular decomposition
# ----------------------------------------------------------------------------------------------------


def _identity_holds(total: torch.Tensor, radial: torch.Tensor, angular: torch.Tensor, tol: float = 1e-10) -> bool:
    return bool(((total - radial - angular).abs() <= tol * (1 + total.abs())).all())


@pytest.mark.parametrize(("y", "y_hat", "expected"), [
    ([3.0, 4.0], [0.0, 5.0], (10.0, 0.0, 10.0)),
    ([1.0, 0.0], [2.0, 0.0], (1.0, 1.0, 0.0)),
])
def test_decomposition_exact_vectors(y, y_hat, expected):
    parts = m.radial_angular_decomposition(torch.tensor(y, dtype=F64), torch.tensor(y_hat, dtype=F64))
    assert [float(p) for p in parts] == pytest.approx(expected, abs=1e-12)


def test_decomposition_identity_on_random_vectors_and_broken_variant_fails():
    y = torch.randn(500, 48, generator=_rng(0), dtype=F64)
    y_hat = 0.7 * y + torch.randn(500, 48, generator=_rng(1), dtype=F64)
    total, radial, angular = m.radial_angular_decomposition(y, y_hat)
    assert _identity_holds(total, radial, angular)
    assert (radial >= 0).all() and (angular >= -1e-12).all()
    # Negative control: the angular term without its factor 2 breaks the identity.
    assert not _identity_holds(total, radial, angular / 2)


def test_decomposition_handles_zero_vectors():
    total, radial, angular = m.radial_angular_decomposition(torch.zeros(3, dtype=F64),
                                                             torch.tensor([0.0, 3.0, 4.0], dtype=F64))
    assert (float(total), float(radial), float(angular)) == (25.0, 25.0, 0.0)


# ----------------------------------------------------------------------------------------------------
# (a)2 kappa
# ----------------------------------------------------------------------------------------------------


def _equicorrelated_unit_vectors(size: int, rho: float, dim: int = 8) -> torch.Tensor:
    """``size`` unit vectors with every pairwise cosine exactly ``rho``: sqrt(rho) u + sqrt(1 - rho) e_i."""
    basis = torch.eye(dim, dtype=F64)
    return math.sqrt(rho) * basis[0] + math.sqrt(1 - rho) * basis[1:size + 1]


def kappa_check_failures() -> list[str]:
    """Acceptance check (a)2 (README, "Acceptance checks") on the library's ``kappa_of_members``; the list of
    failed cases."""
    eye = torch.eye(4, dtype=F64)
    correlated = _equicorrelated_unit_vectors(4, 0.5)
    cases = {
        "two orthogonal -> sqrt(0.5)": (m.kappa_of_members(eye[:2]), math.sqrt(0.5)),
        "four orthonormal -> 0.5": (m.kappa_of_members(eye), 0.5),
        "identical -> 1": (m.kappa_of_members(torch.ones(3, 5, dtype=F64) * 2.5), 1.0),
        "cosine 0.5, s = 4 -> 0.7906": (m.kappa_of_members(correlated), m.kappa_formula(4, 0.5)),
    }
    return [name for name, (got, want) in cases.items() if abs(float(got) - want) > 1e-12]


def test_kappa_exact_values_and_formula():
    assert kappa_check_failures() == []
    assert m.kappa_formula(4, 0.5) == pytest.approx(0.7906, abs=1e-4)
    assert m.kappa_formula(4, 0.0) == pytest.approx(0.5)  # = sqrt(r) at r = 1/4


def test_kappa_negative_control_wrong_exponent(monkeypatch):
    """The library's kappa replaced by the energy ratio itself (kappa^2, a wrong exponent) fails (a)2."""
    right = m.kappa_of_members
    monkeypatch.setattr(m, "kappa_of_members", lambda members: right(members).pow(2))
    assert set(kappa_check_failures()) == {"two orthogonal -> sqrt(0.5)", "four orthonormal -> 0.5",
                                           "cosine 0.5, s = 4 -> 0.7906"}


def _four_orthonormal_state() -> tuple[m.MergeState, torch.Tensor]:
    """cls + e1..e4 at positions 1..4; the metric pairs (1, 2) and (3, 4) in the first round."""
    eye = torch.eye(6, dtype=F64)
    x = torch.stack([eye[5] * 3.0, eye[0], eye[1], eye[2], eye[3]])[None]
    metric = torch.stack([eye[4], eye[0], eye[0], eye[1], eye[1]])[None]
    return m.MergeState.unmerged(x), metric


def test_kappa_tracked_through_nested_merges():
    state, metric = _four_orthonormal_state()
    pairs = m.merge_k_tokens(state, metric, k=2)
    assert pairs.sizes.tolist() == [[1.0, 2.0, 2.0]]
    assert pairs.kappa_sq.sqrt()[0, 1:].tolist() == pytest.approx([math.sqrt(0.5)] * 2, abs=1e-12)
    whole = m.merge_k_tokens(pairs, pairs.x, k=1)
    assert whole.sizes.tolist() == [[1.0, 4.0]]
    assert float(whole.kappa_sq[0, 1].sqrt()) == pytest.approx(0.5, abs=1e-12)
    assert float(whole.kappa_sq[0, 0]) == 1.0  # cls never merged
    # Negative control: recomputing kappa from the two pair-means alone (no member energies) gives
    # sqrt(0.5) for the pair of orthogonal pair-means, not 0.5.
    assert float(m.kappa_of_members(pairs.x[0, 1:])) == pytest.approx(math.sqrt(0.5), abs=1e-12)


# ----------------------------------------------------------------------------------------------------
# (a)3 merge bookkeeping
# ----------------------------------------------------------------------------------------------------


def _sum_preserved(before: torch.Tensor, state: m.MergeState) -> bool:
    return torch.allclose((state.sizes[..., None] * state.x).sum(1), before.sum(1), rtol=0, atol=1e-10)


def _unweighted_merge(state: m.MergeState, plan: m.MergePlan) -> m.MergeState:
    """Broken on purpose: (x_a + x_b) / 2 ignores sizes."""
    x_a, x_b = state.x[:, ::2], state.x[:, 1::2]
    s_a, s_b = state.sizes[:, ::2], state.sizes[:, 1::2]
    src = x_a.gather(1, plan.src[..., None].expand(-1, -1, x_a.shape[-1]))
    merged = x_b.clone()
    for i in range(plan.src.shape[1]):
        merged[:, plan.dst[0, i]] = (merged[:, plan.dst[0, i]] + src[:, i]) / 2
    sizes = s_b.scatter_add(1, plan.dst, s_a.gather(1, plan.src))
    keep = x_a.gather(1, plan.keep[..., None].expand(-1, -1, x_a.shape[-1]))
    return m.MergeState(torch.cat([keep, merged], 1), torch.cat([s_a.gather(1, plan.keep), sizes], 1),
                        torch.ones_like(torch.cat([s_a.gather(1, plan.keep), sizes], 1)))


def test_merge_preserves_token_count_and_sum_over_many_rounds():
    x = torch.randn(3, 65, 16, generator=_rng(2), dtype=F64)
    state = m.MergeState.unmerged(x)
    for k in m.merge_schedule(64, 6, 0.1):
        if k:
            state = m.merge_k_tokens(state, state.x, k)
        assert float(state.sizes.sum(1).min()) == float(state.sizes.sum(1).max()) == 65.0
        assert _sum_preserved(x, state)
    assert state.x.shape[1] == 1 + round(0.1 * 64)
    assert torch.equal(state.x[:, 0], x[:, 0])  # cls protected and first


def test_unweighted_merge_negative_control_breaks_the_sum():
    x = torch.randn(1, 17, 8, generator=_rng(3), dtype=F64)
    state = m.MergeState.unmerged(x)
    for _ in range(3):
        state = _unweighted_merge(state, m.bipartite_soft_matching(state.x, 3))
    assert float(state.sizes.sum()) == 17.0  # sizes still add ...
    assert not _sum_preserved(x, state)  # ... but the unweighted mean loses mass


def test_mlerp_keeps_the_mean_member_norm():
    x = torch.randn(2, 9, 12, generator=_rng(4), dtype=F64)
    state = m.MergeState.unmerged(x)
    plan = m.bipartite_soft_matching(x, 4)
    merged = m.merge_tokens(state, plan, "mlerp")
    average = m.merge_tokens(state, plan, "average")
    src = x[:, ::2].gather(1, plan.src[..., None].expand(-1, -1, 12))
    offset = plan.keep.shape[1]  # merged B tokens follow the kept A tokens
    for b in range(2):
        for i in range(4):
            j = int(plan.dst[b, i])
            members = [x[b, 1 + 2 * j]] + [src[b, t] for t in range(4) if int(plan.dst[b, t]) == j]
            expected = sum(v.norm() for v in members) / len(members)
            assert float(merged.x[b, offset + j].norm()) == pytest.approx(float(expected), abs=1e-12)
            # Same direction as the size-weighted mean; averaging itself shrinks the norm.
            cos = torch.nn.functional.cosine_similarity(merged.x[b, offset + j], average.x[b, offset + j], dim=0)
            assert float(cos) == pytest.approx(1.0, abs=1e-12)
            assert float(average.x[b, offset + j].norm()) <= float(expected) + 1e-12


def test_bipartite_matching_pairs_most_similar_and_rejects_bad_k():
    metric = torch.tensor([[[1.0, 0, 0], [0, 1, 0], [0, 0.9, 0.1], [1, 0, 0], [0, 0, 1]]], dtype=F64)
    plan = m.bipartite_soft_matching(metric, 1)
    assert plan.src.tolist() == [[1]] and plan.dst.tolist() == [[0]]  # token 2 -> token 1
    assert plan.keep.tolist() == [[0, 2]]
    with pytest.raises(ValueError, match="k: one matching round merges at most 2"):
        m.bipartite_soft_matching(metric, 3)


def test_merge_schedule_reaches_the_target_and_validates():
    for depth, r in [(6, 0.1), (6, 0.75), (3, 0.25), (2, 0.1)]:
        schedule = m.merge_schedule(64, depth, r)
        assert len(schedule) == depth and schedule[-1] == 0
        assert 64 - sum(schedule) == round(r * 64)
    assert m.merge_schedule(64, 6, 1.0) == [0] * 6
    with pytest.raises(ValueError, match="retention"):
        m.merge_schedule(64, 6, 0.0)


# ----------------------------------------------------------------------------------------------------
# (a)4 duplicate-token identity
# ----------------------------------------------------------------------------------------------------


def _attention_inputs(x: torch.Tensor, block: m.Block, queries: torch.Tensor):
    h = block.norm1(x)
    return block.split_heads(block.query(queries)), block.split_heads(block.key(h)), block.split_heads(block.value(h))


def test_duplicate_tokens_merge_exactly_under_prop_and_kappa_only():
    torch.manual_seed(0)
    block = m.Block(dim=16, heads=2, mlp_dim=32, eps=1e-6).double().requires_grad_(False)
    x = torch.randn(1, 9, 16, generator=_rng(5), dtype=F64)
    x[0, 4] = x[0, 3]  # positions 3 (B) and 4 (A): identical residuals, so identical k and v
    queries = torch.randn(1, 5, 16, generator=_rng(6), dtype=F64)
    state = m.MergeState.unmerged(x)
    merged = m.merge_k_tokens(state, x, k=1)
    assert sorted(merged.sizes[0].tolist()) == [1.0] * 7 + [2.0]
    assert float(merged.kappa_sq.max()) == pytest.approx(1.0, abs=1e-12)
    q, k, v = _attention_inputs(x, block, queries)
    _, k_m, v_m = _attention_inputs(merged.x, block, queries)
    ones = torch.ones(1, 9, dtype=F64)
    reference = m.corrected_attention(q, k, v, ones, 1.0, "prop")
    retention = 7 / 8
    outputs = {mode: m.corrected_attention(q, k_m, v_m, merged.sizes, retention, mode, merged.kappa_sq.sqrt())
               for mode in m.LOGIT_MODES}
    torch.testing.assert_close(outputs["prop"], reference, rtol=0, atol=1e-12)
    torch.testing.assert_close(outputs["kappa"], reference, rtol=0, atol=1e-12)
    # Negative controls: no size prior, or a global sqrt(r) shrink of the merged logit, change the output.
    assert float((outputs["none"] - reference).abs().max()) > 1e-4
    assert float((outputs["sqrt_r"] - reference).abs().max()) > 1e-4


def test_key_scale_and_value_scale_rules():
    sizes = torch.tensor([[1.0, 2.0, 4.0]])
    assert m.key_logit_scale(sizes, 0.25, "sqrt_r").tolist() == [[1.0, 0.5, 0.5]]
    assert m.key_logit_scale(sizes, 0.25, "sqrt_r", shrink_singletons=True).tolist() == [[0.5, 0.5, 0.5]]
    assert m.key_logit_scale(sizes, 0.25, "prop").tolist() == [[1.0, 1.0, 1.0]]
    assert m.value_scale(sizes, 0.25, 1.0).tolist() == [[1.0, 0.5, 0.5]]
    assert m.value_scale(sizes, 0.25, -1.0).tolist() == [[1.0, 2.0, 2.0]]
    with pytest.raises(ValueError, match="logit_mode"):
        m.key_logit_scale(sizes, 0.25, "softmax")
    with pytest.raises(ValueError, match="kappa"):
        m.key_logit_scale(sizes, 0.25, "kappa")


def test_choose_value_exponent_prefers_best_match_then_least_intervention():
    assert m.choose_value_exponent({-1.0: 0.3, 0.0: 0.2, 1.0: 0.1}) == 1.0
    assert m.choose_value_exponent({-1.0: 0.1, 0.0: 0.1, 1.0: 0.1}) == 0.0
    y = torch.randn(4, 8, generator=_rng(7))
    assert m.energy_mismatch(y, y) == 0.0
    assert m.energy_mismatch(y, 2 * y) == pytest.approx(math.log(2), abs=1e-6)


# ----------------------------------------------------------------------------------------------------
# (a)5 isotropic Gaussian test of the sqrt(r) logit rule
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("retention", [0.5, 0.25, 0.125])
def test_isotropic_kl_optimal_scale_is_sqrt_r(retention):
    result = m.isotropic_cluster_mass_study(64, 192, retention, n_queries=192, seed=0)
    assert abs(result.optimal_scale - math.sqrt(retention)) <= 0.07
    assert result.kl_optimal <= result.kl_sqrt_r <= result.kl_prop
    if retention <= 0.25:
        assert result.kl_sqrt_r <= 0.8 * result.kl_prop
    # Negative control: without LayerNorm re-inflating the merged key there is no energy drift, the
    # optimal scale stays near 1 and sqrt(r) no longer beats proportional attention.
    control = m.isotropic_cluster_mass_study(64, 192, retention, n_queries=192, seed=0, reinflate_keys=False)
    assert abs(control.optimal_scale - math.sqrt(retention)) > 0.07
    assert control.kl_sqrt_r > 0.8 * control.kl_prop


def test_isotropic_study_rejects_non_integer_cluster_size():
    with pytest.raises(ValueError, match="retention"):
        m.isotropic_cluster_mass_study(8, 12, 0.3, n_queries=4, seed=0)


# ----------------------------------------------------------------------------------------------------
# (a)6 r = 1 reproduces the unmerged model; the Hugging Face conversion is exact
# ----------------------------------------------------------------------------------------------------


def _tiny_vit(seed: int = 0) -> m.MergeViT:
    shape = m.ViTShape(image_size=8, patch_size=2, channels=1, dim=16, depth=3, heads=2, mlp_dim=32, n_classes=5)
    torch.manual_seed(seed)
    return m.MergeViT(shape).double().eval()


def test_r1_every_method_reproduces_the_unmerged_logits_exactly():
    model = _tiny_vit()
    images = torch.randn(4, 1, 8, 8, generator=_rng(8), dtype=F64)
    with torch.no_grad():
        plain = model(images)
        schedule = m.merge_schedule(16, 3, 1.0)
        for method in (*baselines.ALL_METHODS, baselines.ALL_METHODS[3].with_value_exp(1.0)):
            out = model.forward_merged(images, method, schedule)
            assert torch.equal(out.logits, plain), method.name
            assert out.realised_retention == 1.0
        # Negative control: the same comparison detects merging (r = 0.5) for every method.
        for method in baselines.ALL_METHODS:
            merged = model.forward_merged(images, method, m.merge_schedule(16, 3, 0.5))
            assert not torch.allclose(merged.logits, plain, atol=1e-6), method.name
            assert merged.realised_retention == 0.5


def test_vit_from_hf_matches_hugging_face_logits():
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=8, patch_size=2, num_channels=3, hidden_size=16, num_hidden_layers=2,
                       num_attention_heads=2, intermediate_size=24, num_labels=4)
    torch.manual_seed(1)
    hf = ViTForImageClassification(config).double().eval()
    ours = m.vit_from_hf(hf)
    images = torch.randn(3, 3, 8, 8, generator=_rng(9), dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(ours(images), hf(pixel_values=images).logits, rtol=0, atol=1e-10)
        # Negative control: the converted model with its patch-embedding weight permuted (the (C, p, p)
        # kernel transposed, the classic reshape-order bug) no longer matches Hugging Face.
        weight = ours.patch_embed.weight
        weight.copy_(weight.view(16, 3, 2, 2).transpose(2, 3).reshape(16, -1))
        assert not torch.allclose(ours(images), hf(pixel_values=images).logits, atol=1e-4)
