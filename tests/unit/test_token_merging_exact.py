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
