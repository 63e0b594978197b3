"""token_merging method: exact values on non-degenerate inputs (members of unequal norm, sizes > 1),
computed by hand in plain Python beside the library, each with a negative control that monkeypatches
a broken variant into `method` (issue 20: kappa with unequal norms, the sqrt(r) corrected attention
against a hand-computed softmax with sizes > 1)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.token_merging import method as m

F64 = torch.float64


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def softmax(row: list[float]) -> list[float]:
    top = max(row)
    e = [math.exp(x - top) for x in row]
    return [x / sum(e) for x in e]


# kappa with members of unequal norm -------------------------------------------------------------

MEMBERS = [[3.0, 0.0, 1.0], [0.5, 2.0, 0.0], [1.0, -1.0, 2.0]]


def kappa_by_hand(members: list[list[float]]) -> float:
    mean = [sum(col) / len(members) for col in zip(*members)]
    return norm(mean) / math.sqrt(sum(norm(x) ** 2 for x in members) / len(members))


def kappa_check() -> bool:
    got = float(m.kappa_of_members(torch.tensor(MEMBERS, dtype=F64)))
    return abs(got - kappa_by_hand(MEMBERS)) < 1e-12


def test_kappa_with_members_of_unequal_norm():
    assert len({round(norm(x), 6) for x in MEMBERS}) == 3  # non-degenerate: three different norms
    assert kappa_check()
    batched = m.kappa_of_members(torch.tensor([MEMBERS, MEMBERS[::-1]], dtype=F64))
    assert torch.allclose(batched, torch.full((2,), kappa_by_hand(MEMBERS), dtype=F64))


@pytest.mark.parametrize("broken", ["mean_norm_denominator", "sum_not_mean"])
def test_negative_control_kappa_variants_fail(monkeypatch, broken):
    variants = {
        # mean member norm instead of the root mean square: equal only for equal norms
        "mean_norm_denominator": lambda x: x.mean(-2).norm(dim=-1) / x.norm(dim=-1).mean(-1),
        "sum_not_mean": lambda x: x.sum(-2).norm(dim=-1) / x.pow(2).sum(-1).mean(-1).sqrt(),
    }
    monkeypatch.setattr(m, "kappa_of_members", variants[broken])
    assert not kappa_check()


# Corrected attention with sizes > 1, by hand -------------------------------------------------------

Q = [[0.4, -0.2], [1.0, 0.5]]
K = [[0.3, 0.8], [-0.6, 0.1], [0.9, -0.4]]
V = [[1.0, 0.0, 2.0], [0.5, -1.0, 0.0], [-0.3, 0.7, 1.5]]
SIZES = [1.0, 3.0, 2.0]
KAPPA = [1.0, 0.6, 0.8]
R = 0.25


def attention_by_hand(mode: str, value_exp: float = 0.0, shrink_singletons: bool = False) -> list[list[float]]:
    out = []
    for q in Q:
        logits = []
        for c, k in enumerate(K):
            dot = sum(a * b for a, b in zip(q, k)) / math.sqrt(2)
            if mode == "none":
                logits.append(dot)
                continue
            if mode == "prop":
                a = 1.0
            elif mode == "sqrt_r":
                a = math.sqrt(R) if (SIZES[c] > 1 or shrink_singletons) else 1.0
            else:
                a = KAPPA[c]
            logits.append(a * dot + math.log(SIZES[c]))
        p = softmax(logits)
        scale = [R ** (value_exp / 2) if s > 1 else 1.0 for s in SIZES]
        out.append([sum(p[c] * scale[c] * V[c][j] for c in range(3)) for j in range(3)])
    return out


def attention(mode: str, value_exp: float = 0.0, shrink_singletons: bool = False) -> torch.Tensor:
    q = torch.tensor(Q, dtype=F64)[None, None]
    k = torch.tensor(K, dtype=F64)[None, None]
    v = torch.tensor(V, dtype=F64)[None, None]
    sizes = torch.tensor([SIZES], dtype=F64)
    kappa = torch.tensor([KAPPA], dtype=F64)
    return m.corrected_attention(q, k, v, sizes, R, mode, kappa=kappa, value_exp=value_exp,
                                 shrink_singletons=shrink_singletons)[0, 0]


CASES = [("none", 0.0, False), ("prop", 0.0, False), ("sqrt_r", 0.0, False), ("sqrt_r", 0.0, True),
         ("kappa", 0.0, False), ("sqrt_r", 1.0, False), ("prop", -0.5, False)]


def attention_failures() -> list[tuple]:
    return [case for case in CASES
            if not torch.allclose(attention(*case), torch.tensor(attention_by_hand(*case), dtype=F64), atol=1e-12)]


def test_corrected_attention_matches_the_hand_softmax_with_sizes_above_one():
    assert attention_failures() == []
    # the modes really differ on these inputs
    outs = [attention(*case) for case in CASES]
    assert all(not torch.allclose(a, b) for i, a in enumerate(outs) for b in outs[i + 1:])


BROKEN_ATTENTION = {
    "key_logit_scale": lambda sizes, r, mode, kappa=None, shrink=False: (
        torch.full_like(sizes, r) if mode == "sqrt_r" else m_key_logit_scale(sizes, r, mode, kappa, shrink)),
    "value_scale": lambda sizes, r, e: torch.where(sizes > 1, torch.full_like(sizes, r ** e), torch.ones_like(sizes)),
}
m_key_logit_scale = m.key_logit_scale


@pytest.mark.parametrize("name", sorted(BROKEN_ATTENTION))
def test_negative_control_attention_parts_fail(monkeypatch, name):
    monkeypatch.setattr(m, name, BROKEN_ATTENTION[name])
    assert attention_failures() != []


def test_negative_control_size_prior_on_log_scale_missing_fails(monkeypatch):
    original = m.corrected_attention

    def no_log_size(q, k, v, sizes, retention, logit_mode, kappa=None, value_exp=0.0, shrink_singletons=False):
        return original(q, k, v, torch.ones_like(sizes), retention, logit_mode, kappa, value_exp, shrink_singletons)

    monkeypatch.setattr(m, "corrected_attention", no_log_size)
    assert attention_failures() != []


def test_key_logit_scale_and_value_scale_errors():
    sizes = torch.tensor([[1.0, 2.0]])
    with pytest.raises(ValueError):
        m.key_logit_scale(sizes, 1.5, "sqrt_r")
    with pytest.raises(ValueError):
        m.key_logit_scale(sizes, 0.5, "kappa")
    with pytest.raises(ValueError):
        m.key_logit_scale(sizes, 0.5, "bogus")
    assert m.value_scale(sizes, 0.25, 0.0).tolist() == [[1.0, 1.0]]


# One merge round with unequal sizes: average, MLERP, tracked kappa^2 -----------------------------

def _state() -> tuple[m.MergeState, m.MergePlan]:
    # positions 0..5: A = 0, 2, 4; B = 1, 3, 5. Merge A2 -> B1 and A4 -> B1 (both into position 3), keep A0.
    x = torch.tensor([[5.0, 0.0], [1.0, 2.0], [2.0, -1.0], [0.5, 0.5], [-1.0, 3.0], [0.0, 1.0]], dtype=F64)[None]
    sizes = torch.tensor([[1.0, 2.0, 3.0, 1.0, 2.0, 4.0]], dtype=F64)
    kappa_sq = torch.tensor([[1.0, 0.8, 0.5, 1.0, 0.9, 0.7]], dtype=F64)
    plan = m.MergePlan(src=torch.tensor([[1, 2]]), dst=torch.tensor([[1, 1]]), keep=torch.tensor([[0]]))
    return m.MergeState(x, sizes, kappa_sq), plan


def merge_by_hand(mode: str) -> tuple[list[list[float]], list[float], list[float]]:
    state, _ = _state()
    x, s, k2 = state.x[0].tolist(), state.sizes[0].tolist(), state.kappa_sq[0].tolist()
    group = [3, 2, 4]  # B position 3 absorbs A positions 2 and 4
    size = sum(s[i] for i in group)
    mean = [sum(s[i] * x[i][j] for i in group) / size for j in range(2)]
    if mode == "mlerp":
        target = sum(s[i] * norm(x[i]) for i in group) / size
        mean = [v / norm(mean) * target for v in mean]
    energy = sum(s[i] * norm(x[i]) ** 2 / k2[i] for i in group)
    kappa_sq = size * norm(mean) ** 2 / energy
    xs = [x[0], x[1], mean, x[5]]
    return xs, [s[0], s[1], size, s[5]], [k2[0], k2[1], kappa_sq, k2[5]]


def merge_failures() -> list[str]:
    failures = []
    for mode in ("average", "mlerp"):
        state, plan = _state()
        got = m.merge_tokens(state, plan, mode)
        xs, sizes, kappa_sq = merge_by_hand(mode)
        if not (torch.allclose(got.x[0], torch.tensor(xs, dtype=F64), atol=1e-12)
                and got.sizes[0].tolist() == sizes
                and torch.allclose(got.kappa_sq[0], torch.tensor(kappa_sq, dtype=F64), atol=1e-12)):
            failures.append(mode)
    return failures


def test_merge_tokens_exact_with_unequal_sizes_and_kappas():
    assert merge_failures() == []


def test_negative_control_unweighted_merge_fails(monkeypatch):
    original = m.merge_tokens

    def unit_sizes(state, plan, mode="average"):
        merged = original(m.MergeState(state.x, torch.ones_like(state.sizes), state.kappa_sq), plan, mode)
        return m.MergeState(merged.x, original(state, plan, mode).sizes, merged.kappa_sq)

    monkeypatch.setattr(m, "merge_tokens", unit_sizes)
    assert set(merge_failures()) == {"average", "mlerp"}


def test_negative_control_kappa_ignored_in_member_energy_fails(monkeypatch):
    original = m.merge_tokens

    def no_kappa(state, plan, mode="average"):
        merged = original(m.MergeState(state.x, state.sizes, torch.ones_like(state.kappa_sq)), plan, mode)
        return m.MergeState(merged.x, merged.sizes, torch.cat([state.kappa_sq[:, ::2].gather(1, plan.keep),
                                                               merged.kappa_sq[:, 1:]], dim=1))

    monkeypatch.setattr(m, "merge_tokens", no_kappa)
    assert merge_failures() != []


def test_merge_tokens_rejects_an_unknown_mode():
    state, plan = _state()
    with pytest.raises(ValueError):
        m.merge_tokens(state, plan, "max")


# Matching, schedule, statistics -------------------------------------------------------------------

def test_bipartite_soft_matching_exact_plan():
    # A = positions 0, 2, 4, 6 ; B = 1, 3, 5. cos(A1, B0) = 0.8, cos(A2, B2) = 1, cos(A3, B1) = 0.6
    metric = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0],
                           [0.8, -0.6]], dtype=F64)[None]
    plan = m.bipartite_soft_matching(metric, k=2)
    assert plan.src.tolist() == [[2, 1]] and plan.dst.tolist() == [[2, 0]] and plan.keep.tolist() == [[0, 3]]
    free = m.bipartite_soft_matching(metric, k=1, protect_cls=False)
    assert free.src.tolist() == [[0]] or free.src.tolist() == [[2]]  # cls (cos 1 with B1) may merge now
    with pytest.raises(ValueError):
        m.bipartite_soft_matching(metric, k=4)


def test_merge_k_tokens_runs_several_rounds_and_conserves_the_weighted_sum():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 9, 3, generator=g, dtype=F64)
    state = m.merge_k_tokens(m.MergeState.unmerged(x), x.clone(), k=6)
    assert state.x.shape == (1, 3, 3) and state.sizes.sum().item() == 9.0
    assert torch.allclose((state.sizes[..., None] * state.x).sum(1), x.sum(1), atol=1e-12)
    assert torch.equal(state.x[0, 0], x[0, 0])  # cls kept untouched
    with pytest.raises(ValueError):
        m.merge_k_tokens(m.MergeState.unmerged(x), x.clone(), k=9)


def test_merge_schedule_exact():
    assert m.merge_schedule(16, 4, 0.5) == [3, 3, 2, 0]
    assert m.merge_schedule(10, 3, 0.25) == [4, 4, 0]  # keep round(2.5) = 2, remove 8
    assert m.merge_schedule(10, 2, 1.0) == [0, 0]
    assert m.merge_schedule(3, 3, 0.01) == [1, 1, 0]  # keeps at least one


def test_size_weighted_rms_energy_mismatch_and_exponent_choice():
    x = torch.tensor([[[9.0, 9.0], [1.0, 3.0], [2.0, 0.0]]], dtype=F64)
    state = m.MergeState(x, torch.tensor([[1.0, 3.0, 1.0]], dtype=F64), torch.ones(1, 3, dtype=F64))
    assert m.size_weighted_rms(state) == pytest.approx(math.sqrt((3 * 5.0 + 1 * 2.0) / 4))
    ref = torch.tensor([[3.0, 4.0], [0.0, 1.0]])
    merged = torch.tensor([[0.0, 2.0], [1.0, 0.0]])
    assert m.energy_mismatch(ref, merged) == pytest.approx(abs(math.log(1.5 / 3.0)))
    assert m.choose_value_exponent({-1.0: 0.2, 0.0: 0.05, 1.0: 0.01}) == 1.0
    assert m.choose_value_exponent({-1.0: 0.01, 1.0: 0.01, 0.5: 0.3}) == -1.0


def test_radial_angular_exact_on_unequal_vectors():
    total, radial, angular = m.radial_angular_decomposition(torch.tensor([3.0, 4.0], dtype=F64),
                                                            torch.tensor([1.0, 0.0], dtype=F64))
    assert float(total) == pytest.approx(20.0) and float(radial) == pytest.approx(16.0)
    assert float(angular) == pytest.approx(2 * 5 * 1 * (1 - 0.6))


# Survivors of `make mutation SLUG=token_merging` -----------------------------------------------------

ORIGINAL_ATTENTION = m.corrected_attention


def block_attend_check() -> bool:
    """Block.attend = x + out(corrected_attention(...)) with the method's value exponent and singleton rule."""
    torch.manual_seed(0)
    block = m.Block(dim=4, heads=2, mlp_dim=8, eps=1e-6).double().requires_grad_(False)
    x = torch.randn(1, 3, 4, dtype=F64)
    state = m.MergeState(x, torch.tensor([[1.0, 3.0, 2.0]], dtype=F64), torch.tensor([[1.0, 0.36, 0.64]], dtype=F64))
    method = m.MergeMethod("test", "average", "sqrt_r", value_exp=1.5, shrink_singletons=True)
    got, keys = block.attend(state, method, retention=0.25)
    h = block.norm1(x)
    q, k, v = (block.split_heads(layer(h)) for layer in (block.query, block.key, block.value))
    att = ORIGINAL_ATTENTION(q, k, v, state.sizes, 0.25, "sqrt_r", torch.tensor([[1.0, 0.6, 0.8]], dtype=F64),
                                value_exp=1.5, shrink_singletons=True)
    want = x + block.out(att.transpose(1, 2).reshape(x.shape))
    return torch.allclose(got, want, atol=1e-12) and torch.allclose(keys, k.mean(dim=1))


def test_block_attend_passes_the_value_exponent_and_singleton_rule():
    assert block_attend_check()


def test_negative_control_attend_without_value_exponent_fails(monkeypatch):
    monkeypatch.setattr(m, "corrected_attention", lambda q, k, v, sizes, r, mode, kappa=None, value_exp=0.0,
                        shrink_singletons=False: ORIGINAL_ATTENTION(q, k, v, sizes, r, mode, kappa, 0.0,
                                                                    shrink_singletons))
    assert not block_attend_check()


def test_log_softmax_rows_of_very_different_scale():
    logits = np.array([[1000.0, 999.0], [0.0, 1.0]])
    want = [[-math.log(1 + math.exp(-1)), -1 - math.log(1 + math.exp(-1))],
            [-1 - math.log(1 + math.exp(-1)), -math.log(1 + math.exp(-1))]]
    assert np.allclose(m._log_softmax(logits), want, atol=1e-12)


def test_layer_norm_rows_exact_with_a_large_eps():
    x = np.array([[1.0, 2.0, 6.0], [0.0, -3.0, 3.0]])
    for row, got in zip(x.tolist(), m.layer_norm_rows(x, eps=0.5)):
        mean = sum(row) / 3
        var = sum((v - mean) ** 2 for v in row) / 3
        assert np.allclose(got, [(v - mean) / math.sqrt(var + 0.5) for v in row], atol=1e-15)


# ------------------------------------------------------------------ issue 20, fifth pass: what the tool found

from tasks.common.seeding import torch_init_seed  # noqa: E402


def small_vit(pos_embed: str = "learned", seed: int = 4) -> m.MergeViT:
    shape = m.ViTShape(image_size=8, patch_size=2, channels=3, dim=16, depth=3, heads=2, mlp_dim=24, n_classes=4,
                       pos_embed=pos_embed)
    with torch_init_seed(seed):
        model = m.MergeViT(shape).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=F64) * 0.3)
    return model


def vit_images(seed: int = 11) -> torch.Tensor:
    return torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_forward_fused_and_attend_fused_equal_the_reference_path():
    model = small_vit()
    images = vit_images()
    with torch.no_grad():
        torch.testing.assert_close(model.forward_fused(images), model(images), rtol=0, atol=1e-12)
        x = model.embed(images)
        block = model.blocks[1]
        reference, _ = block.attend(m.MergeState.unmerged(x), m.PLAIN, 1.0)
        torch.testing.assert_close(block.attend_fused(x), reference, rtol=0, atol=1e-12)


def test_negative_control_fused_forward_without_the_residual(monkeypatch):
    monkeypatch.setattr(m.Block, "attend_fused", lambda self, x: self.attend(m.MergeState.unmerged(x), m.PLAIN,
                                                                              1.0)[0] - x)
    with pytest.raises(AssertionError):
        test_forward_fused_and_attend_fused_equal_the_reference_path()


def forward_merged_by_hand(model: m.MergeViT, images: torch.Tensor, method: m.MergeMethod, schedule: list[int]):
    """forward_merged written out: attention with the current retention (patch tokens / n0), merging, MLP."""
    state = m.MergeState.unmerged(model.embed(images))
    n0 = model.shape.n_patches
    for block, k in zip(model.blocks, schedule):
        x, metric = block.attend(state, method, (state.x.shape[1] - 1) / n0)
        state = m.MergeState(x, state.sizes, state.kappa_sq)
        if k:
            state = m.merge_k_tokens(state, metric, k, method.merge_mode, protect_cls=True)
        state = m.MergeState(block.feed_forward(state.x), state.sizes, state.kappa_sq)
    kappas = [math.sqrt(float(kq)) for kq, s in zip(state.kappa_sq.flatten(), state.sizes.flatten()) if s > 1]
    return state, sum(kappas) / len(kappas)


MLERP_SQRT_R = m.MergeMethod("mlerp-sqrt_r", "mlerp", "sqrt_r", value_exp=0.5)


def test_forward_merged_against_the_loop_written_out():
    model = small_vit()
    images = vit_images()
    with torch.no_grad():
        out = model.forward_merged(images, MLERP_SQRT_R, [5, 4, 0])
        state, mean_kappa = forward_merged_by_hand(model, images, MLERP_SQRT_R, [5, 4, 0])
    assert out.realised_retention == 7 / 16
    torch.testing.assert_close(out.cls_residual, state.x[:, 0], rtol=0, atol=1e-12)
    torch.testing.assert_close(out.logits, model.head(model.norm(state.x[:, 0])), rtol=0, atol=1e-12)
    assert out.mean_merged_kappa == pytest.approx(mean_kappa, rel=1e-12)
    assert 0 < mean_kappa < 1  # merged tokens of unequal members: kappa strictly below 1


def test_negative_control_forward_merged_with_the_average_merge(monkeypatch):
    original = m.merge_k_tokens
    monkeypatch.setattr(m, "merge_k_tokens", lambda state, metric, k, mode="average", protect_cls=True: original(
        state, metric, k, "average", protect_cls))
    with pytest.raises(AssertionError):
        model = small_vit()
        with torch.no_grad():
            out = model.forward_merged(vit_images(), MLERP_SQRT_R, [5, 4, 0])
        monkeypatch.undo()
        with torch.no_grad():
            state, _ = forward_merged_by_hand(model, vit_images(), MLERP_SQRT_R, [5, 4, 0])
        torch.testing.assert_close(out.cls_residual, state.x[:, 0], rtol=0, atol=1e-12)


def test_gather_and_scatter_helpers_in_two_and_three_dimensions():
    t2 = torch.tensor([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]], dtype=F64)
    index = torch.tensor([[2, 0], [1, 1]])
    assert m._gather_tokens(t2, index).tolist() == [[12.0, 10.0], [21.0, 21.0]]
    t3 = torch.arange(12.0, dtype=F64).view(2, 3, 2)
    assert m._gather_tokens(t3, index).tolist() == [[[4.0, 5.0], [0.0, 1.0]], [[8.0, 9.0], [8.0, 9.0]]]
    src2 = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=F64)
    assert m._scatter_add_tokens(t2, index, src2).tolist() == [[12.0, 11.0, 13.0], [20.0, 28.0, 22.0]]
    src3 = torch.ones(2, 2, 2, dtype=F64)
    assert m._scatter_add_tokens(t3, index, src3).tolist() == [
        [[1.0, 2.0], [2.0, 3.0], [5.0, 6.0]], [[6.0, 7.0], [10.0, 11.0], [10.0, 11.0]]]


def test_negative_control_gather_on_the_wrong_axis(monkeypatch):
    monkeypatch.setattr(m, "_gather_tokens", lambda t, index: t.gather(1, index.flip(-1)) if t.dim() == 2 else
                        t.gather(1, index[..., None].expand(-1, -1, t.shape[-1])))
    with pytest.raises(AssertionError):
        test_gather_and_scatter_helpers_in_two_and_three_dimensions()


def test_row_functions_work_on_the_last_axis_of_three_dimensional_inputs():
    x = np.arange(24.0).reshape(2, 3, 4) ** 1.5
    rows = x.reshape(-1, 4)
    np.testing.assert_allclose(m._log_softmax(x).reshape(-1, 4), m._log_softmax(rows), rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(m.layer_norm_rows(x).reshape(-1, 4), m.layer_norm_rows(rows), rtol=1e-14, atol=1e-14)
    members = torch.tensor(MEMBERS, dtype=F64)
    batch = torch.stack([members, 2.0 * members.flip(0)])  # (2 clusters, 3 members, 3 dims)
    torch.testing.assert_close(m.kappa_of_members(batch), torch.full((2,), kappa_by_hand(MEMBERS), dtype=F64),
                               rtol=1e-14, atol=0)
    ref = torch.tensor([[[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]]], dtype=F64)  # norms 5, 1, 10: mean 16/3
    merged = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]]], dtype=F64)  # norms 1, 2, 0: mean 1
    assert m.energy_mismatch(ref, merged) == pytest.approx(math.log(16 / 3), rel=1e-14)


def test_negative_control_row_functions_on_axis_one(monkeypatch):
    monkeypatch.setattr(m, "energy_mismatch", lambda ref, merged: abs(math.log(
        float(merged.norm(dim=1).mean()) / float(ref.norm(dim=1).mean()))))
    with pytest.raises(AssertionError):
        test_row_functions_work_on_the_last_axis_of_three_dimensional_inputs()


def test_defaults_and_validation():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 3, 4, generator=g, dtype=F64) for _ in range(3))
    sizes = torch.tensor([[1.0, 3.0, 2.0]], dtype=F64)
    for attention in (m.corrected_attention, m.corrected_attention_fused):
        default = attention(q, k, v, sizes, 0.25, "sqrt_r")
        torch.testing.assert_close(default, attention(q, k, v, sizes, 0.25, "sqrt_r", None, 0.0, False),
                                   rtol=0, atol=1e-14)
        assert not torch.allclose(default, attention(q, k, v, sizes, 0.25, "sqrt_r", None, 1.0, False))
        assert not torch.allclose(default, attention(q, k, v, sizes, 0.25, "sqrt_r", None, 0.0, True))
    state, plan = _state()
    by_default = m.merge_tokens(state, plan)
    assert torch.equal(by_default.x, m.merge_tokens(state, plan, "average").x)
    assert not torch.allclose(by_default.x, m.merge_tokens(state, plan, "mlerp").x)
    assert m.SQRT_R.with_value_exp(0.75).value_exp == 0.75
    with pytest.raises(ValueError, match="retention"):
        m.key_logit_scale(sizes, 0.0, "sqrt_r")
    with pytest.raises(ValueError, match="retention"):
        m.merge_schedule(16, 4, 1.5)
    empty = m.bipartite_soft_matching(torch.randn(1, 5, 2, generator=g, dtype=F64), k=0)
    assert empty.src.shape == (1, 0) and empty.keep.tolist() == [[0, 1, 2]]
    # ties within 1e-12 go to the smaller |exponent|; 3e-13 apart is a tie
    assert m.choose_value_exponent({1.0: 0.2, 0.0: 0.2 + 3e-13}) == 0.0
    assert m.choose_value_exponent({1.0: 0.2, 0.0: 0.2 + 3e-12}) == 1.0


def test_negative_control_defaults(monkeypatch):
    monkeypatch.setattr(m.MergeMethod, "with_value_exp", lambda self, value_exp: self)
    with pytest.raises(AssertionError):
        test_defaults_and_validation()


def test_merge_k_tokens_without_cls_protection_and_with_few_feature_dims():
    """protect_cls=False on an odd count: a round merges at most n_b = 3 of 7 (A has 4); a 2-dim metric
    (fewer dims than tokens) still allows 3 per round with the cls protected (8 tokens: n_a - 1 = 3)."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 7, 2, generator=g, dtype=F64)
    state = m.merge_k_tokens(m.MergeState.unmerged(x), x.clone(), k=4, protect_cls=False)
    first = m.bipartite_soft_matching(x, 3, protect_cls=False)
    one = m.merge_tokens(m.MergeState.unmerged(x), first)
    metric = m.merge_tokens(m.MergeState(x, torch.ones(1, 7, dtype=F64), torch.ones(1, 7, dtype=F64)), first).x
    two = m.merge_tokens(one, m.bipartite_soft_matching(metric, 1, protect_cls=False))
    torch.testing.assert_close(state.x, two.x, rtol=0, atol=1e-14)
    assert state.sizes.sum().item() == 7.0
    y = torch.randn(1, 8, 2, generator=g, dtype=F64)
    merged = m.merge_k_tokens(m.MergeState.unmerged(y), y.clone(), k=3, mode="mlerp")
    plan = m.bipartite_soft_matching(y, 3)
    torch.testing.assert_close(merged.x, m.merge_tokens(m.MergeState.unmerged(y), plan, "mlerp").x, rtol=0, atol=0)
    free = m.merge_k_tokens(m.MergeState.unmerged(y), y.clone(), k=3, protect_cls=False)
    torch.testing.assert_close(free.x, m.merge_tokens(m.MergeState.unmerged(y), m.bipartite_soft_matching(
        y, 3, protect_cls=False)).x, rtol=0, atol=0)


def test_negative_control_merge_k_tokens_ignoring_the_mode(monkeypatch):
    original = m.merge_k_tokens
    monkeypatch.setattr(m, "merge_k_tokens", lambda state, metric, k, mode="average", protect_cls=True: original(
        state, metric, k, "average", protect_cls))
    with pytest.raises(AssertionError):
        test_merge_k_tokens_without_cls_protection_and_with_few_feature_dims()


def test_bipartite_matching_uses_per_token_cosines_on_unequal_norms():
    """A = (cls, a1, a2), B = (b0, b1): a1 = (10, 1) is closest in angle to b1 = (1, 0.05) (cos 0.9963 vs 0.7071
    to b0 = (1, 1)); a dot product of globally scaled vectors would pick b0 (11 > 10.05)."""
    metric = torch.tensor([[[0.0, 1.0], [1.0, 1.0], [10.0, 1.0], [1.0, 0.05], [-1.0, 0.2]]], dtype=F64)
    plan = m.bipartite_soft_matching(metric, k=1)
    assert plan.src.tolist() == [[1]] and plan.dst.tolist() == [[1]] and plan.keep.tolist() == [[0, 2]]


def test_negative_control_matching_without_row_normalisation(monkeypatch):
    original = m.F.normalize
    monkeypatch.setattr(m.F, "normalize", lambda t, dim=-1, **kw: original(t.flatten(), dim=0).view_as(t))
    with pytest.raises(AssertionError):
        test_bipartite_matching_uses_per_token_cosines_on_unequal_norms()


def isotropic_by_hand(dim, n_tokens, retention, n_queries, seed, temperature):
    """kl at a = sqrt(r) and a = 1 written out with the same draws (x, queries, permutation)."""
    size = round(1 / retention)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_tokens, dim))
    queries = rng.standard_normal((n_queries, dim))
    clusters = rng.permutation(n_tokens).reshape(n_tokens // size, size)

    def ln(rows):
        c = rows - rows.mean(axis=1, keepdims=True)
        return c / np.sqrt((c**2).mean(axis=1, keepdims=True) + 1e-6)

    def log_softmax(z):
        z = z - z.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))

    temp = math.sqrt(dim) * temperature
    p = np.exp(log_softmax(queries @ ln(x).T / temp))
    mass = np.stack([p[:, c].sum(axis=1) for c in clusters], axis=1)
    base = queries @ ln(np.stack([x[c].mean(axis=0) for c in clusters])).T / temp

    def kl(a):
        log_q = log_softmax(a * base + math.log(size))
        return float(np.mean([(mass[i] * (np.log(mass[i]) - log_q[i])).sum() for i in range(n_queries)]))

    return kl(math.sqrt(retention)), kl(1.0)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_isotropic_study_kl_values_by_hand(temperature):
    kwargs = {} if temperature == 1.0 else {"temperature": temperature}
    result = m.isotropic_cluster_mass_study(8, 12, 0.25, 5, seed=3, **kwargs)
    kl_sqrt_r, kl_prop = isotropic_by_hand(8, 12, 0.25, 5, 3, temperature)
    assert result.retention == 0.25
    assert result.kl_sqrt_r == pytest.approx(kl_sqrt_r, rel=1e-10)
    assert result.kl_prop == pytest.approx(kl_prop, rel=1e-10)
    assert isinstance(result.mean_kappa, float) and 0 < result.mean_kappa < 1
    assert result.kl_optimal <= min(kl_sqrt_r, kl_prop) + 1e-9


def test_negative_control_isotropic_study_summed_over_queries(monkeypatch):
    original = m._log_softmax
    monkeypatch.setattr(m, "_log_softmax", lambda z: original(z) - 0.01)
    with pytest.raises(AssertionError):
        test_isotropic_study_kl_values_by_hand(2.0)


def test_hf_keys_of_both_transformers_layouts_and_a_gelu_check():
    assert m._hf_key_to_ours("vit.encoder.layer.1.attention.attention.query.weight") == "blocks.1.query.weight"
    assert m._hf_key_to_ours("vit.encoder.layer.0.output.dense.bias") == "blocks.0.fc2.bias"
    assert m._hf_key_to_ours("vit.layers.2.mlp.fc1.weight") == "blocks.2.fc1.weight"
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=8, patch_size=2, num_channels=3, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=24, num_labels=4, hidden_act="relu")
    with torch_init_seed(0):
        hf = ViTForImageClassification(config)
    with pytest.raises(ValueError, match="hidden_act"):
        m.vit_from_hf(hf)


def test_negative_control_hf_keys(monkeypatch):
    monkeypatch.setattr(m, "_hf_key_to_ours", lambda key: key)
    with pytest.raises(AssertionError):
        test_hf_keys_of_both_transformers_layouts_and_a_gelu_check()


def test_learned_position_embedding_and_small_initialisation():
    with torch_init_seed(0):
        model = m.MergeViT(m.ViTShape(image_size=8, patch_size=2, channels=3, dim=32, depth=1, heads=2, mlp_dim=8,
                                      n_classes=2, pos_embed="learned"))
    assert isinstance(model.pos_embed, torch.nn.Parameter) and model.pos_embed.shape == (1, 17, 32)
    assert 0 < float(model.pos_embed.detach().abs().max()) < 0.1
    assert 0 < float(model.cls_token.detach().abs().max()) < 0.1


def test_negative_control_unit_initialisation(monkeypatch):
    original = m.nn.init.trunc_normal_
    monkeypatch.setattr(m.nn.init, "trunc_normal_", lambda t, std=1.0, **kw: original(t, std=1.0))
    with pytest.raises(AssertionError):
        test_learned_position_embedding_and_small_initialisation()


def sincos_by_hand(grid: int, dim: int) -> torch.Tensor:
    quarter = dim // 4
    rows = [[0.0] * dim]
    for i in range(grid):
        for j in range(grid):
            w = [1.0 / 10000.0 ** (mm / quarter) for mm in range(quarter)]
            rows.append([math.sin(j * x) for x in w] + [math.cos(j * x) for x in w]
                        + [math.sin(i * x) for x in w] + [math.cos(i * x) for x in w])
    return torch.tensor(rows, dtype=F64).float()


def test_sincos_frequencies_are_computed_in_float64():
    """(16, 64): float32 frequencies would move entries by up to 1e-7, several float32 ulps."""
    assert torch.equal(m.sincos_pos_embed_2d(16, 64), sincos_by_hand(16, 64))


def test_negative_control_sincos_in_float32(monkeypatch):
    monkeypatch.setattr(m, "sincos_pos_embed_2d", lambda grid, dim: sincos_by_hand(grid, dim) + 1e-7)
    with pytest.raises(AssertionError):
        test_sincos_frequencies_are_computed_in_float64()


def test_vit_from_hf_refuses_a_checkpoint_with_missing_tensors():
    """qkv_bias=False: Hugging Face has no q/k/v biases; the strict load must fail instead of keeping ours."""
    from transformers import ViTConfig, ViTForImageClassification

    config = ViTConfig(image_size=8, patch_size=2, num_channels=3, hidden_size=16, num_hidden_layers=1,
                       num_attention_heads=2, intermediate_size=24, num_labels=4, qkv_bias=False)
    with torch_init_seed(0):
        hf = ViTForImageClassification(config)
    with pytest.raises(RuntimeError, match="Missing key"):
        m.vit_from_hf(hf)


def test_negative_control_lenient_load(monkeypatch):
    monkeypatch.setattr(m.MergeViT, "load_state_dict", lambda self, state, strict=True: torch.nn.Module.load_state_dict(
        self, state, strict=False))
    with pytest.raises(pytest.fail.Exception):
        test_vit_from_hf_refuses_a_checkpoint_with_missing_tensors()


def test_even_token_count_limits_a_round_to_a_minus_cls_and_kappa_with_more_dims_than_members():
    """6 tokens: A = 3 (cls included), B = 3, so with the cls protected a round merges at most 2; kappa of
    2 members in 4 dims (the member and feature axes differ in length)."""
    metric = torch.randn(1, 6, 2, generator=torch.Generator().manual_seed(8), dtype=F64)
    assert m.bipartite_soft_matching(metric, k=2).src.shape == (1, 2)
    with pytest.raises(ValueError, match="at most 2"):
        m.bipartite_soft_matching(metric, k=3)
    members = torch.tensor([[3.0, 0.0, 1.0, 2.0], [0.5, 2.0, 0.0, -1.0]], dtype=F64)
    mean = members.mean(0)
    expected = float(mean.norm()) / math.sqrt(float((members**2).sum(1).mean()))
    assert float(m.kappa_of_members(members)) == pytest.approx(expected, rel=1e-14)
    assert float(m.kappa_of_members(members[None].expand(3, -1, -1))[2]) == pytest.approx(expected, rel=1e-14)


def test_negative_control_kappa_summed_over_members(monkeypatch):
    monkeypatch.setattr(m, "kappa_of_members", lambda x: x.mean(-2).norm(dim=-1) / x.pow(2).sum(-2).mean(-1).sqrt())
    with pytest.raises(AssertionError):
        test_even_token_count_limits_a_round_to_a_minus_cls_and_kappa_with_more_dims_than_members()
