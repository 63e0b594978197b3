"""Checks of tasks/common/rl.py: exact loss values and gradients on hand-built tensors, reproducible sampling,
staleness, and a tiny GPT-2 that learns a trivial reward.

Each key check is a function returning bool; a test asserts it holds, and a negative control monkeypatches a
deliberately wrong variant into rl.py and asserts the same check then fails.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch

from tasks.common import rl
from tasks.common.tiny_lm import build_tiny_gpt2, tiny_gpt2_config

F64 = torch.float64
NAN = float("nan")


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tensors here are tiny: intra-op threads only add synchronisation (and stall on a busy machine)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _close(actual: torch.Tensor | float, expected: torch.Tensor | float, atol: float = 1e-12) -> bool:
    actual, expected = torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64)
    return actual.shape == expected.shape and bool(torch.allclose(actual, expected, rtol=0.0, atol=atol))


def _value_and_grad(loss_fn, new: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Loss value, d loss / d new_logprobs (autograd; zeros when the loss does not depend on them) and stats."""
    new = new.clone().requires_grad_(True)
    loss, stats = loss_fn(new, *args, **kwargs)
    grad = torch.autograd.grad(loss, new)[0] if loss.requires_grad else torch.zeros_like(new)
    return loss.detach(), grad, stats


# ----------------------------------------------------------------------------------------------------------------
# group_advantages
# ----------------------------------------------------------------------------------------------------------------

def _advantages_match_hand() -> bool:
    """rewards [1,0,0,1 | 2,2,2,2], G=4. Group 0: mean 0.5, sample std sqrt((4 * 0.5^2) / 3) = sqrt(1/3), so
    A = +-0.5 / (sqrt(1/3) + eps) = +-sqrt(3)/2 (about); group 1 is all equal: A = 0."""
    eps = 1e-6
    a = 0.5 / (math.sqrt(1 / 3) + eps)
    rewards = torch.tensor([1, 0, 0, 1, 2, 2, 2, 2], dtype=F64)
    std = rl.group_advantages(rewards, 4, scale="std", eps=eps)
    centred = rl.group_advantages(rewards, 4, scale="none")
    return (_close(std, [a, -a, -a, a, 0, 0, 0, 0])
            and _close(centred, [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]))


def test_group_advantages_exact():
    assert _advantages_match_hand()


def test_group_advantages_check_fails_without_mean_subtraction(monkeypatch):
    monkeypatch.setattr(rl, "_centre", lambda grouped: grouped)
    assert not _advantages_match_hand()


def test_group_advantages_all_equal_group_is_exactly_zero_without_nan():
    # 0.1 is not representable: a naive (r - mean) / (std + eps) gives ~1e-10 here, and NaN with eps = 0
    rewards = torch.tensor([0.1] * 3 + [0.7] * 3, dtype=torch.float32)
    for eps in (1e-6, 0.0):
        advantages = rl.group_advantages(rewards, 3, eps=eps)
        assert torch.equal(advantages, torch.zeros(6))
    # integer rewards, G=2: centred +-0.5, sample std of {0, 1} is sqrt(1/2)
    assert torch.equal(rl.group_advantages(torch.tensor([1, 0, 1, 0]), 2),
                       torch.tensor([0.5, -0.5, 0.5, -0.5]) / (math.sqrt(0.5) + 1e-6))


@pytest.mark.parametrize("rewards, group_size", [(torch.ones(4), 1), (torch.ones(5), 2)])
def test_group_advantages_rejects_bad_groups(rewards, group_size):
    with pytest.raises(ValueError):
        rl.group_advantages(rewards, group_size)


# ----------------------------------------------------------------------------------------------------------------
# grpo_loss
# ----------------------------------------------------------------------------------------------------------------

# Ratios r = exp(new - old); row 1 has a padded third token whose log-prob is NaN (it must not leak).
GRPO_RATIOS = [[1.5, 0.9, 1.1], [0.5, 1.3, 7.0]]
GRPO_MASK = torch.tensor([[True, True, True], [True, True, False]])
GRPO_ADV = torch.tensor([1.0, -2.0], dtype=F64)


def _grpo_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    old = torch.full((2, 3), math.log(0.5), dtype=F64)
    new = old + torch.tensor(GRPO_RATIOS, dtype=F64).log()
    new[1, 2] = NAN
    return new, old


def _grpo_matches_hand(aggregation: str) -> bool:
    """eps_low 0.2, eps_high 0.28 (clip range [0.8, 1.28]). Per-token min(r A, clip(r) A):
    row 0 (A=+1): r=1.5 -> clip 1.28 (clipped); 0.9; 1.1.
    row 1 (A=-2): r=0.5 -> min(-1.0, 0.8 * -2 = -1.6) = -1.6 (clipped); r=1.3 -> min(-2.6, -2.56) = -2.6 (not).
    token:    L = -(1.28 + 0.9 + 1.1 - 1.6 - 2.6) / 5 = 0.184
    sequence: L = -((1.28 + 0.9 + 1.1) / 3 + (-1.6 - 2.6) / 2) / 2 = 0.50333...
    dL/dnew_t = -A r_t / n_t on unclipped tokens (dr/dnew = r), exactly 0 on clipped and padded ones.
    """
    new, old = _grpo_inputs()
    loss, grad, stats = _value_and_grad(rl.grpo_loss, new, old, GRPO_ADV, GRPO_MASK, eps_low=0.2, eps_high=0.28,
                                        aggregation=aggregation)
    if aggregation == "token":
        expected_loss = -(1.28 + 0.9 + 1.1 - 1.6 - 2.6) / 5
        expected_grad = [[0.0, -0.9 / 5, -1.1 / 5], [0.0, 2 * 1.3 / 5, 0.0]]
    else:
        expected_loss = -((1.28 + 0.9 + 1.1) / 3 + (-1.6 - 2.6) / 2) / 2
        expected_grad = [[0.0, -0.9 / 6, -1.1 / 6], [0.0, 2 * 1.3 / 4, 0.0]]
    valid = [1.5, 0.9, 1.1, 0.5, 1.3]
    expected_kl = sum(r - 1 - math.log(r) for r in valid) / 5  # k3 of KL(old || new) with r = new / old
    return (_close(loss, expected_loss) and _close(grad, expected_grad)
            and _close(stats["clip_fraction"], 2 / 5) and _close(stats["ratio_mean"], 5.3 / 5)
            and _close(stats["approx_kl"], expected_kl))


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_grpo_loss_exact_value_and_gradient(aggregation):
    assert _grpo_matches_hand(aggregation)


def test_grpo_check_fails_when_clip_has_no_min(monkeypatch):
    # clip(r) A alone: row 1's r=1.3 token would contribute -2.56 instead of -2.6 (and get zero gradient)
    monkeypatch.setattr(rl, "_clipped_objective", lambda r, a, lo, hi: r.clamp(1 - lo, 1 + hi) * a)
    assert not _grpo_matches_hand("token")
    assert not _grpo_matches_hand("sequence")


def test_grpo_check_fails_when_clip_is_symmetric(monkeypatch):
    # eps_high ignored (no clip-higher): r=1.5 clips at 1.2 instead of 1.28
    monkeypatch.setattr(rl, "_clipped_objective",
                        lambda r, a, lo, hi: torch.minimum(r * a, r.clamp(1 - lo, 1 + lo) * a))
    assert not _grpo_matches_hand("token")


def test_grpo_check_fails_when_aggregations_are_swapped(monkeypatch):
    original = rl._aggregate
    swapped = {"token": "sequence", "sequence": "token"}
    monkeypatch.setattr(rl, "_aggregate", lambda x, m, agg: original(x, m, swapped[agg]))
    assert not _grpo_matches_hand("token")
    assert not _grpo_matches_hand("sequence")


def test_grpo_loss_takes_per_token_advantages():
    new, old = _grpo_inputs()
    per_token = GRPO_ADV.unsqueeze(1).expand(2, 3).clone()
    loss_seq, _ = rl.grpo_loss(new, old, GRPO_ADV, GRPO_MASK, eps_high=0.28)
    loss_tok, _ = rl.grpo_loss(new, old, per_token, GRPO_MASK, eps_high=0.28)
    assert _close(loss_tok, loss_seq) and _close(loss_seq, 0.184)


# ----------------------------------------------------------------------------------------------------------------
# gspo_loss
# ----------------------------------------------------------------------------------------------------------------

def _gspo_matches_hand() -> bool:
    """Per-token log-ratios, rows of lengths 3, 2, 1 (padding NaN): [0.3, -0.1, 0.1] -> mean 0.1;
    [0.2, 0.4] -> mean 0.3; [-0.5] -> mean -0.5. s = (e^0.1, e^0.3, e^-0.5) = (1.1052, 1.3499, 0.6065).
    A = (+1, -1, -1), clip range [0.8, 1.2]:
    row 0: s in range -> s A = e^0.1;  row 1: min(-e^0.3, -1.2) = -e^0.3 (not clipped: A < 0);
    row 2: min(-e^-0.5, -0.8) = -0.8 (clipped).     L = -(e^0.1 - e^0.3 - 0.8) / 3.
    dL/dnew_it = -(1/N) A_i s_i / |y_i| on unclipped rows: row 0: -e^0.1 / 9 each; row 1: +e^0.3 / 6 each; row 2: 0.
    """
    old = torch.full((3, 3), -1.0, dtype=F64)
    new = old + torch.tensor([[0.3, -0.1, 0.1], [0.2, 0.4, NAN], [-0.5, NAN, NAN]], dtype=F64)
    mask = torch.tensor([[True, True, True], [True, True, False], [True, False, False]])
    adv = torch.tensor([1.0, -1.0, -1.0], dtype=F64)
    loss, grad, stats = _value_and_grad(rl.gspo_loss, new, old, adv, mask, eps_low=0.2, eps_high=0.2)
    e1, e3 = math.exp(0.1), math.exp(0.3)
    expected_grad = [[-e1 / 9] * 3, [e3 / 6, e3 / 6, 0.0], [0.0, 0.0, 0.0]]
    return (_close(loss, -(e1 - e3 - 0.8) / 3) and _close(grad, expected_grad)
            and _close(stats["clip_fraction"], 1 / 3) and _close(stats["ratio_mean"], (e1 + e3 + math.exp(-0.5)) / 3))


def test_gspo_loss_exact_value_and_gradient():
    assert _gspo_matches_hand()


def _gspo_is_length_normalised() -> bool:
    """Two rows with the same per-token log-ratio 0.1 and lengths 2 and 4 get the same s = e^0.1 (a summed
    ratio would give e^0.2 and e^0.4). A = (1, 1), no clipping: L = -e^0.1, and the gradient per token is
    -(1/2) e^0.1 / |y_i|: e^0.1 / 4 on the short row, e^0.1 / 8 on the long one (negated)."""
    old = torch.full((2, 4), -2.0, dtype=F64)
    new = old + 0.1
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    log_s = rl.sequence_log_ratio(new, old, mask)
    loss, grad, _ = _value_and_grad(rl.gspo_loss, new, old, torch.ones(2, dtype=F64), mask, eps_low=0.5, eps_high=0.5)
    e = math.exp(0.1)
    return (_close(log_s, [0.1, 0.1]) and _close(loss, -e)
            and _close(grad, [[-e / 4, -e / 4, 0.0, 0.0], [-e / 8] * 4]))


def test_gspo_ratio_is_length_normalised():
    assert _gspo_is_length_normalised()


@pytest.mark.parametrize("check", [_gspo_matches_hand, _gspo_is_length_normalised])
def test_gspo_checks_fail_without_length_normalisation(monkeypatch, check):
    monkeypatch.setattr(rl, "sequence_log_ratio", lambda new, old, mask: rl._log_ratio(new, old, mask.bool()).sum(1))
    assert not check()


def test_gspo_rejects_per_token_advantages():
    with pytest.raises(ValueError):
        rl.gspo_loss(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))


# ----------------------------------------------------------------------------------------------------------------
# reinforce_is_loss
# ----------------------------------------------------------------------------------------------------------------

def _reinforce_matches_hand(aggregation: str) -> bool:
    """r = [[2, 0.5], [1.5, pad]], A = (+1, -1); no clipping, even at r = 2.
    token:    L = -(2 + 0.5 - 1.5) / 3 = -1/3;         dL/dnew = -A r / 3 = [[-2/3, -0.5/3], [1.5/3, 0]]
    sequence: L = -((2 + 0.5) / 2 - 1.5) / 2 = 0.125;  dL/dnew = [[-2/4, -0.5/4], [1.5/2, 0]]
    """
    old = torch.full((2, 2), math.log(0.25), dtype=F64)
    new = old + torch.tensor([[2.0, 0.5], [1.5, 1.0]], dtype=F64).log()
    new[1, 1] = NAN
    mask = torch.tensor([[True, True], [True, False]])
    loss, grad, stats = _value_and_grad(rl.reinforce_is_loss, new, old, torch.tensor([1.0, -1.0], dtype=F64), mask,
                                        aggregation=aggregation)
    if aggregation == "token":
        expected = (-1 / 3, [[-2 / 3, -0.5 / 3], [1.5 / 3, 0.0]])
    else:
        expected = (0.125, [[-2 / 4, -0.5 / 4], [1.5 / 2, 0.0]])
    return (_close(loss, expected[0]) and _close(grad, expected[1])
            and stats["clip_fraction"] == 0.0 and _close(stats["ratio_mean"], 4 / 3))


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_reinforce_is_loss_exact_value_and_gradient(aggregation):
    assert _reinforce_matches_hand(aggregation)


def test_reinforce_check_fails_with_inverted_ratio(monkeypatch):
    monkeypatch.setattr(rl, "_log_ratio", lambda new, old, mask: torch.where(mask, old - new, 0.0))
    assert not _reinforce_matches_hand("token")


def test_reinforce_check_fails_when_the_ratio_is_detached(monkeypatch):
    # same value, but no gradient flows: only the gradient half of the check catches it
    monkeypatch.setattr(rl, "_log_ratio", lambda new, old, mask: torch.where(mask, (new - old).detach(), 0.0))
    assert not _reinforce_matches_hand("token")


# ----------------------------------------------------------------------------------------------------------------
# k3 KL to a reference
# ----------------------------------------------------------------------------------------------------------------

def _kl_matches_hand() -> bool:
    """new = (ln 0.5, ln 0.1, pad), ref = (ln 0.25, ln 0.3, 0): d = ref - new = (ln 0.5, ln 3);
    k3 = exp(d) - d - 1 = (0.5 - ln 0.5 - 1, 3 - ln 3 - 1); KL = mean of the two = (ln 2 - ln 3 + 1.5) / 2.
    d k3 / d new = 1 - exp(d) = (0.5, -2), divided by the 2 valid tokens: (0.25, -1, 0)."""
    new = torch.tensor([[math.log(0.5), math.log(0.1), NAN]], dtype=F64)
    ref = torch.tensor([[math.log(0.25), math.log(0.3), 0.0]], dtype=F64)
    mask = torch.tensor([[True, True, False]])
    kl, grad, _ = _value_and_grad(lambda n, r, m: (rl.kl_to_reference(n, r, m), {}), new, ref, mask)
    expected = ((0.5 - math.log(0.5) - 1) + (3 - math.log(3) - 1)) / 2
    return _close(kl, expected) and _close(grad, [[0.25, -1.0, 0.0]])


def test_kl_k3_exact_value_and_gradient():
    assert _kl_matches_hand()


def test_kl_check_fails_with_wrong_sign(monkeypatch):
    # exp(-d) + d - 1: the k3 of the other KL direction, also >= 0, but not GRPO's estimator
    monkeypatch.setattr(rl, "_k3", lambda d: torch.exp(-d) + d - 1)
    assert not _kl_matches_hand()


def test_kl_k3_is_zero_when_equal_and_nonnegative():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(4, 5, generator=g, dtype=F64).requires_grad_(True)
    mask = torch.rand(4, 5, generator=g) < 0.7
    kl = rl.kl_to_reference(logp, logp.detach(), mask)
    (grad,) = torch.autograd.grad(kl, logp)
    assert kl.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))
    d = torch.arange(-3000, 3001, dtype=F64) / 100  # d[3000] is exactly 0
    k3 = rl._k3(d)
    assert bool((k3 >= 0).all()) and k3[3000].item() == 0.0 and bool((k3[d != 0] > 0).all())


def test_add_kl_penalty_adds_beta_times_kl():
    new = torch.tensor([[math.log(0.5), math.log(0.1)]], dtype=F64)
    ref = torch.tensor([[math.log(0.25), math.log(0.3)]], dtype=F64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    loss, stats = rl.add_kl_penalty(torch.tensor(1.5, dtype=F64), {"clip_fraction": 0.0}, new, ref, mask, 0.04)
    kl = ((0.5 - math.log(0.5) - 1) + (3 - math.log(3) - 1)) / 2
    assert _close(loss, 1.5 + 0.04 * kl) and _close(stats["kl_ref"], kl) and stats["clip_fraction"] == 0.0


# ----------------------------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------------------------

VOCAB, EOS = 16, 3


@pytest.fixture(scope="module")
def lm():
    return build_tiny_gpt2(tiny_gpt2_config(VOCAB, 64, n_layer=1, n_head=2, n_embd=32), seed=0)


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Three prompts of lengths 4, 2 and 3, left-padded with a token id that is not 0."""
    ids = torch.tensor([[5, 9, 2, 7], [1, 1, 4, 12], [1, 8, 8, 6]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1], [0, 1, 1, 1]], dtype=torch.bool)
    return ids, mask


def _sample(lm, seed=0, **kwargs) -> rl.Rollouts:
    ids, mask = _prompts()
    options = {"prompt_mask": mask, "temperature": 0.8, "eos_token_id": EOS} | kwargs
    return rl.sample_group(lm, ids, 4, 10, seed=seed, **options)


def test_sampling_is_reproducible_from_the_seed_and_leaves_global_rng_alone(lm):
    state = torch.get_rng_state()
    a, b = _sample(lm, seed=1), _sample(lm, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    torch.manual_seed(123)  # the global generator has no influence
    c = _sample(lm, seed=torch.Generator().manual_seed(1))
    for other in (b, c):
        assert torch.equal(a.completion_ids, other.completion_ids) and torch.equal(a.old_logprobs, other.old_logprobs)
    assert not torch.equal(a.completion_ids, _sample(lm, seed=2).completion_ids)


def test_rollouts_layout(lm):
    r = _sample(lm, seed=1)
    ids, mask = _prompts()
    assert torch.equal(r.prompt_ids, ids.repeat_interleave(4, 0))
    assert torch.equal(r.prompt_mask, mask.repeat_interleave(4, 0))
    assert torch.equal(r.group_index, torch.tensor([0] * 4 + [1] * 4 + [2] * 4))
    assert r.group_size == 4 and r.num_groups == 3 and r.temperature == 0.8
    assert r.completion_ids.shape == r.completion_mask.shape == r.old_logprobs.shape
    assert r.old_logprobs.dtype == torch.float32 and r.completion_mask.dtype == torch.bool


def test_greedy_equals_argmax_decoding(lm):
    prompts = torch.tensor([[5, 9, 2, 7], [1, 4, 12, 0]])
    r = rl.sample_group(lm, prompts, 2, 6, seed=0, temperature=0.0)
    sequence = prompts.clone()
    logps = []
    with torch.no_grad():
        for _ in range(6):  # plain recompute, no cache, no masks: the reference
            logits = lm(input_ids=sequence).logits[:, -1]
            token = logits.argmax(-1)
            logps.append(torch.log_softmax(logits, -1).gather(-1, token[:, None]).squeeze(-1))
            sequence = torch.cat([sequence, token[:, None]], 1)
    assert torch.equal(r.completion_ids, sequence[:, 4:].repeat_interleave(2, 0))
    assert torch.allclose(r.old_logprobs, torch.stack(logps, 1).repeat_interleave(2, 0), atol=1e-5, rtol=0)
    assert r.temperature == 1.0 and bool(r.completion_mask.all())


def _old_logprobs_match_recomputed(lm, **kwargs) -> bool:
    """The sampler's log-probs equal token_logprobs of the same completions (1e-5), cache or no cache."""
    r = _sample(lm, seed=3, **kwargs)
    recomputed = rl.rollout_logprobs(lm, r)
    return bool(torch.allclose(recomputed, r.old_logprobs, atol=1e-5, rtol=0))


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_old_logprobs_equal_recomputed_token_logprobs(lm, use_cache, temperature):
    assert _old_logprobs_match_recomputed(lm, use_cache=use_cache, temperature=temperature)


def test_logprob_check_fails_with_off_by_one_logits(monkeypatch, lm):
    monkeypatch.setattr(rl, "_completion_logits", lambda logits, t: logits[:, -t:])
    assert not _old_logprobs_match_recomputed(lm)


def test_cached_and_recomputed_sampling_agree(lm):
    a, b = _sample(lm, seed=4, use_cache=True), _sample(lm, seed=4, use_cache=False)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert torch.allclose(a.old_logprobs, b.old_logprobs, atol=1e-5, rtol=0)


def _padding_invariant(lm) -> bool:
    """Each completion scored inside the left-padded batch equals the same completion after its unpadded prompt."""
    r = _sample(lm, seed=5)
    batch = rl.rollout_logprobs(lm, r)
    for row in range(r.prompt_ids.shape[0]):
        prompt = r.prompt_ids[row, r.prompt_mask[row]]
        ids = torch.cat([prompt, r.completion_ids[row]])[None]
        attention = torch.cat([torch.ones_like(prompt, dtype=torch.bool), r.completion_mask[row]])[None]
        alone = rl.token_logprobs(lm, ids, attention, r.completion_mask[row][None], temperature=r.temperature)
        if not torch.allclose(alone[0], batch[row], atol=1e-5, rtol=0):
            return False
    return True


def test_left_padding_does_not_change_logprobs(lm):
    assert _padding_invariant(lm)


def test_padding_check_fails_when_positions_ignore_padding(monkeypatch, lm):
    monkeypatch.setattr(rl, "_positions", lambda mask: torch.arange(mask.shape[1]).expand(mask.shape[0], -1))
    assert not _padding_invariant(lm)


def test_completion_mask_stops_after_eos(lm):
    r = _sample(lm, seed=1)
    ended = 0
    for tokens, mask, logp in zip(r.completion_ids, r.completion_mask, r.old_logprobs):
        eos_at = (tokens == EOS).nonzero()
        first = int(eos_at[0]) if len(eos_at) else len(tokens)
        assert torch.equal(mask, torch.arange(len(tokens)) <= first)  # EOS itself is scored and trained on
        assert bool((tokens[first + 1:] == EOS).all())  # pad defaults to the EOS id
        assert bool((logp[~mask] == 0).all()) and bool((logp[mask] < 0).all())
        ended += first < len(tokens) - 1
    assert ended >= 3  # this seed ends several rows early


def _scripted_lm(eos_ids: list[int], eos_after: int, prompt_length: int):
    """A plain callable (no position_ids, no cache): uniform over the non-EOS tokens for ``eos_after`` steps,
    then EOS (the first id) with probability 1 - 1e-40."""
    def model(input_ids, attention_mask):
        logits = torch.zeros(*input_ids.shape, VOCAB)
        logits[..., eos_ids] = -torch.inf
        logits[:, prompt_length + eos_after - 1:, eos_ids[0]] = 100.0
        return SimpleNamespace(logits=logits)
    return model


def test_plain_callable_model_and_early_stop():
    prompts = torch.tensor([[1, 2], [4, 5]])
    eos = [15, EOS]
    r = rl.sample_group(_scripted_lm(eos, 3, 2), prompts, 3, 10, seed=0, eos_token_id=eos, pad_token_id=0)
    assert r.completion_ids.shape == (6, 4)  # stopped once every row emitted EOS, not at 10
    assert torch.equal(r.completion_ids[:, 3], torch.full((6,), 15)) and bool(r.completion_mask.all())
    assert torch.allclose(r.old_logprobs[:, :3], torch.full((6, 3), -math.log(VOCAB - 2)), atol=1e-6, rtol=0)
    assert r.old_logprobs[:, 3].abs().max() < 1e-6
    assert len(set(map(tuple, r.completion_ids[:, :3].tolist()))) == 6  # the rows are independent draws


@pytest.mark.parametrize("use_cache", [True, False])
def test_prefix_embeddings(lm, use_cache):
    ids, mask = _prompts()
    prefix = torch.randn(3, 2, 32, generator=torch.Generator().manual_seed(0))
    r = rl.sample_group(lm, ids, 2, 8, seed=6, prompt_mask=mask, eos_token_id=EOS, prefix_embeds=prefix,
                        use_cache=use_cache)
    assert torch.equal(r.prefix_embeds, prefix.repeat_interleave(2, 0))
    assert torch.allclose(rl.rollout_logprobs(lm, r), r.old_logprobs, atol=1e-5, rtol=0)
    without = rl.token_logprobs(lm, r.input_ids, r.attention_mask, r.completion_mask)
    assert not torch.allclose(without, r.old_logprobs, atol=1e-3)  # the prefix is seen
    same_with_cache = rl.sample_group(lm, ids, 2, 8, seed=6, prompt_mask=mask, eos_token_id=EOS,
                                      prefix_embeds=prefix, use_cache=not use_cache)
    assert torch.equal(r.completion_ids, same_with_cache.completion_ids)


def test_sampling_restores_training_mode(lm):
    lm.train()
    try:
        _sample(lm)
        assert lm.training
    finally:
        lm.eval()


# ----------------------------------------------------------------------------------------------------------------
# Staleness and grpo_step
# ----------------------------------------------------------------------------------------------------------------

def _small_lm(seed: int = 0):
    return build_tiny_gpt2(tiny_gpt2_config(8, 16, n_layer=1, n_head=2, n_embd=32), seed=seed)


def _first_token_reward(r: rl.Rollouts, target: int = 5) -> torch.Tensor:
    return (r.completion_ids[:, 0] == target).float()


PROMPTS = torch.tensor([[1, 2, 3], [4, 0, 6], [7, 7, 1], [2, 5, 0]])


def test_staleness_zero_is_on_policy():
    policy = _small_lm()
    lagged = rl.LaggedPolicy(policy, staleness=0)
    assert lagged.behaviour is policy
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    for step in range(3):
        r = rl.sample_group(lagged.behaviour, PROMPTS, 4, 3, seed=step)
        stats = rl.grpo_step(policy, optimizer, r, [float(x) for x in torch.arange(16) % 3 == 0], loss="grpo")
        lagged.update()
        assert abs(stats["ratio_mean"] - 1) < 1e-6 and stats["clip_fraction"] == 0.0 and stats["approx_kl"] < 1e-12
    assert lagged.updates == lagged.behaviour_version == 3


def test_staleness_k_samples_from_the_policy_k_updates_ago():
    policy = _small_lm()
    lagged = rl.LaggedPolicy(policy, staleness=2)
    optimizer = torch.optim.SGD(policy.parameters(), lr=0.5)
    history = [copy.deepcopy(policy.state_dict())]
    for update in range(5):
        version = max(0, update - 2)
        assert lagged.behaviour_version == version
        assert all(torch.equal(v, history[version][k]) for k, v in lagged.behaviour.state_dict().items())
        r = rl.sample_group(lagged.behaviour, PROMPTS, 4, 3, seed=update)
        assert torch.allclose(rl.rollout_logprobs(lagged.behaviour, r), r.old_logprobs, atol=1e-5, rtol=0)
        stats = rl.grpo_step(policy, optimizer, r, _first_token_reward(r) + torch.arange(16) % 2, loss="grpo")
        assert (stats["approx_kl"] > 1e-6) == (update >= 1)  # the learner has moved away from the behaviour
        lagged.update()
        history.append(copy.deepcopy(policy.state_dict()))
    assert not any(p.requires_grad for p in lagged.behaviour.parameters())
    with pytest.raises(ValueError):
        rl.LaggedPolicy(policy, staleness=-1)


def _one_sgd_step(loss: str, **loss_kwargs) -> dict[str, torch.Tensor]:
    policy = _small_lm()
    r = rl.sample_group(policy, PROMPTS, 4, 3, seed=0, eos_token_id=2)
    assert len(set(r.lengths.tolist())) > 1  # unequal lengths: token and sequence means differ
    rewards = torch.arange(16, dtype=torch.float32) % 3
    rl.grpo_step(policy, torch.optim.SGD(policy.parameters(), lr=1.0), r, rewards, loss=loss, loss_kwargs=loss_kwargs)
    return policy.state_dict()


def test_on_policy_gradients_coincide():
    """At r = 1 nothing is clipped: GRPO-token == REINFORCE-IS, and GRPO-sequence == GSPO (one length-normalised
    policy-gradient term per sequence), so one SGD step lands on the same parameters."""
    pairs = [(_one_sgd_step("grpo"), _one_sgd_step("reinforce_is")),
             (_one_sgd_step("grpo", aggregation="sequence"), _one_sgd_step("gspo"))]
    for a, b in pairs:
        assert all(torch.allclose(a[k], b[k], atol=1e-6, rtol=0) for k in a)
    a, b = pairs[0][0], pairs[1][0]
    assert not all(torch.allclose(a[k], b[k], atol=1e-6, rtol=0) for k in a)  # the two aggregations do differ


def test_grpo_step_kl_to_identical_reference_is_zero():
    policy = _small_lm()
    r = rl.sample_group(policy, PROMPTS, 4, 3, seed=0)
    stats = rl.grpo_step(policy, torch.optim.SGD(policy.parameters(), lr=0.1), r, _first_token_reward(r),
                         ref_model=copy.deepcopy(policy), beta=0.1, max_grad_norm=1.0)
    assert stats["kl_ref"] == 0.0 and stats["grad_norm"] > 0
    assert set(stats) >= {"loss", "reward_mean", "completion_length", "clip_fraction", "ratio_mean", "approx_kl"}


# ----------------------------------------------------------------------------------------------------------------
# Integration: a tiny GPT-2 learns to open with token 5
# ----------------------------------------------------------------------------------------------------------------

def _mean_reward(model, seed: int) -> float:
    return float(_first_token_reward(rl.sample_group(model, PROMPTS, 64, 1, seed=seed)).mean())


@pytest.mark.parametrize("loss, staleness", [("grpo", 0), ("gspo", 0), ("reinforce_is", 0), ("grpo", 2)])
def test_tiny_gpt2_learns_a_trivial_reward(loss, staleness):
    policy = _small_lm(seed=1)
    before = _mean_reward(policy, seed=1000)
    lagged = rl.LaggedPolicy(policy, staleness)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    for step in range(40):
        r = rl.sample_group(lagged.behaviour, PROMPTS, 8, 2, seed=step)
        rl.grpo_step(policy, optimizer, r, _first_token_reward(r), loss=loss, max_grad_norm=1.0)
        lagged.update()
    after = _mean_reward(policy, seed=1000)
    assert before < 0.25 and after > 0.9, (before, after)
