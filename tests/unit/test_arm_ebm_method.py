"""Deterministic float64 checks of the ARM <-> EBM library (tasks/arm_ebm/method.py; claims C1-C2d, C4a)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.arm_ebm import method as m

SPECS = [
    m.ToyEBMSpec(vocab_size=3, horizon=4, n_prompts=2, b=4.0, c=4.0),
    m.ToyEBMSpec(vocab_size=4, horizon=5, n_prompts=3),
]


def _random_q(n_prompts: int, vocab: int, horizon: int, seed: int, scale: float = 2.0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [scale * rng.standard_normal((n_prompts, vocab**t, vocab)) for t in range(horizon)]


def _tiny_gpt2(vocab: int, n_prompts: int):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=32, n_positions=8, vocab_size=vocab + n_prompts
    )
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).double().eval()


# ----------------------------------------------------------------------------------------------------
# Toy energy matches the README's formula ("What is measured")
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_toy_energy_matches_formula(spec: m.ToyEBMSpec) -> None:
    local, total = m.toy_ebm_rewards(spec)
    vocab, horizon = spec.vocab_size, spec.horizon
    score = np.random.default_rng(spec.seed).standard_normal(vocab)
    tokens = m.index_to_tokens(np.arange(vocab**horizon), vocab, horizon)
    expected_local = spec.a * score[tokens].sum(axis=1)
    for x in range(spec.n_prompts):
        expected = (
            expected_local
            + spec.b * (tokens[:, -1] == tokens[:, 0])
            + spec.c * (tokens.sum(axis=1) % vocab == x % vocab)
        )
        np.testing.assert_allclose(m.sequence_energy(total)[x], expected, rtol=0, atol=1e-12)
        np.testing.assert_allclose(m.sequence_energy(local)[x], expected_local, rtol=0, atol=1e-12)
    # Local and total rewards differ only at the last step.
    for t in range(horizon - 1):
        np.testing.assert_array_equal(local[t], total[t])


# ----------------------------------------------------------------------------------------------------
# 1. E1 bijection
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_e1_soft_bellman_arm_equals_ebm(spec: m.ToyEBMSpec) -> None:
    _, total = m.toy_ebm_rewards(spec)
    q_star, _ = m.soft_bellman(total)
    err = np.max(np.abs(m.arm_log_probs(q_star) - m.ebm_log_probs(m.sequence_energy(total))))
    assert err < 1e-8


@pytest.mark.parametrize("spec", SPECS)
def test_e1_gpt2_round_trip(spec: m.ToyEBMSpec) -> None:
    vocab, horizon, n_prompts = spec.vocab_size, spec.horizon, spec.n_prompts
    model = _tiny_gpt2(vocab, n_prompts)
    q = m.prefix_tree_logits(m.gpt2_logits_fn(model), n_prompts, vocab, horizon)
    logp_arm = m.arm_log_probs(q)
    # The GPT-2 ARM is a genuine distribution over the V**T sequences of each prompt.
    np.testing.assert_allclose(m.logsumexp(logp_arm, axis=1), 0.0, atol=1e-12)
    rewards = m.arm_to_rewards(q)  # ARM -> EBM
    q_back, _ = m.soft_bellman(rewards)  # EBM -> ARM
    assert np.max(np.abs(m.arm_log_probs(q_back) - logp_arm)) < 1e-8
    assert np.max(np.abs(m.ebm_log_probs(m.sequence_energy(rewards)) - logp_arm)) < 1e-8
    # Teacher-forcing NLL on the same ids equals -log p_q from the prefix-tree tables.
    samples = m.sample_sequences(logp_arm, 64, np.random.default_rng(1), vocab)
    ids = torch.as_tensor(m.training_sequences(samples, vocab))
    nll = m.teacher_forcing_nll(m.gpt2_logits_fn(model)(ids[:, :-1]), ids, vocab).numpy()
    expected = -logp_arm[samples[:, 0], m.sequence_index(samples[:, 1:], vocab)]
    np.testing.assert_allclose(nll, expected, rtol=0, atol=1e-10)


# ----------------------------------------------------------------------------------------------------
# 2. Telescoping and the bijection in both directions
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,seed", [((2, 3, 4), 0), ((3, 4, 3), 1), ((1, 2, 6), 2)])
def test_telescoping_identity(shape: tuple[int, int, int], seed: int) -> None:
    n_prompts, vocab, horizon = shape
    q = _random_q(n_prompts, vocab, horizon, seed)
    rewards = m.arm_to_rewards(q)
    energy = m.sequence_energy(rewards)
    v_q = m.soft_values(q)[0]  # (X, 1)
    assert v_q.shape == (n_prompts, 1)
    np.testing.assert_allclose(energy, m.arm_log_probs(q) + v_q, rtol=0, atol=1e-8)
    np.testing.assert_allclose(v_q[:, 0], m.log_partition(energy), rtol=0, atol=1e-8)
    # Bijection: EBM -> ARM recovers q exactly and ARM -> EBM recovers r exactly.
    q_back, values = m.soft_bellman(rewards)
    assert max(np.max(np.abs(a - b)) for a, b in zip(q_back, q)) < 1e-10
    np.testing.assert_allclose(values[0], v_q, rtol=0, atol=1e-10)
    r_back = m.arm_to_rewards(m.soft_bellman(rewards)[0])
    assert max(np.max(np.abs(a - b)) for a, b in zip(r_back, rewards)) < 1e-10


# ----------------------------------------------------------------------------------------------------
# 3. Soft Bellman residual
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_soft_bellman_residual(spec: m.ToyEBMSpec) -> None:
    _, total = m.toy_ebm_rewards(spec)
    q_star, values = m.soft_bellman(total)
    assert len(values) == spec.horizon + 1
    for t, level in enumerate(values):
        assert level.shape == (spec.n_prompts, spec.vocab_size**t)
    np.testing.assert_array_equal(values[-1], 0.0)
    assert m.bellman_residual(q_star, total) < 1e-10
    # The residual is not trivially small: the myopic table violates the equation.
    local, _ = m.toy_ebm_rewards(spec)
    assert m.bellman_residual(m.myopic_arm(local), total) > 1.0


# ----------------------------------------------------------------------------------------------------
# 4. Reward shaping
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
def test_reward_shaping_invariance(spec: m.ToyEBMSpec) -> None:
    _, total = m.toy_ebm_rewards(spec)
    rng = np.random.default_rng(3)
    x_, v_, t_ = spec.n_prompts, spec.vocab_size, spec.horizon
    potential = [3.0 * rng.standard_normal((x_, v_**t)) for t in range(t_)] + [np.zeros((x_, v_**t_))]
    shaped = m.shape_rewards(total, potential)
    # The shaped rewards are really different per step ...
    assert max(np.max(np.abs(a - b)) for a, b in zip(shaped, total)) > 1.0
    # ... yet p_R is unchanged, and so is the ARM obtained by soft Bellman.
    logp = m.ebm_log_probs(m.sequence_energy(total))
    assert np.max(np.abs(m.ebm_log_probs(m.sequence_energy(shaped)) - logp)) < 1e-10
    assert np.max(np.abs(m.arm_log_probs(m.soft_bellman(shaped)[0]) - logp)) < 1e-10
    # Phi_0 shifts log Z by -Phi_0(x).
    np.testing.assert_allclose(
        m.soft_bellman(shaped)[1][0], m.soft_bellman(total)[1][0] - potential[0], atol=1e-10
    )

    bad = [p.copy() for p in potential]
    bad[-1][0, 0] = 0.5
    with pytest.raises(ValueError):
        m.shape_rewards(total, bad)
    with pytest.raises(ValueError):
        m.shape_rewards(total, potential[:-1])


# ----------------------------------------------------------------------------------------------------
# 5. Negative controls
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("sees", ["local", "total"])
def test_myopic_arm_fails_e1(spec: m.ToyEBMSpec, sees: str) -> None:
    local, total = m.toy_ebm_rewards(spec)
    logp = m.ebm_log_probs(m.sequence_energy(total))
    logp_myopic = m.arm_log_probs(m.myopic_arm(local if sees == "local" else total))
    assert np.max(np.abs(logp_myopic - logp)) > 0.1
    assert np.mean(m.kl_divergence(logp, logp_myopic)) > 0.1


def test_myopic_matches_reference_numbers() -> None:
    # Reference numbers of the cpu toy (README, "What is measured"; V=5, T=6, X=8, b=c=4):
    # KL(p_R || myopic) ~ 1.1 nats, first-token TV ~ 0.15.
    # Seed 0 gives 1.13 / 0.148 with the global terms visible at the last step (total rewards, no V).
    local, total = m.toy_ebm_rewards(m.ToyEBMSpec(vocab_size=5, horizon=6, n_prompts=8))
    logp = m.ebm_log_probs(m.sequence_energy(total))
    logp_myopic = m.arm_log_probs(m.myopic_arm(total))
    kl_myopic = np.mean(m.kl_divergence(logp, logp_myopic))
    assert kl_myopic > 1.0 and kl_myopic < 1.25
    assert 0.13 < np.mean(m.first_token_tv(logp, logp_myopic, 5)) < 0.17
    # A model that never sees the global terms is further off, with the same first-token marginal.
    logp_local = m.arm_log_probs(m.myopic_arm(local))
    assert np.mean(m.kl_divergence(logp, logp_local)) > 2.0
    np.testing.assert_allclose(m.first_token_marginal(logp_local, 5), m.first_token_marginal(logp_myopic, 5))


def _broken_bellman(rewards: list[np.ndarray], mode: str) -> list[np.ndarray]:
    """Backward DP with one deliberate bug, to show test 1's tolerance can fail."""
    n_prompts, _, vocab = rewards[0].shape
    horizon = len(rewards)
    nxt = np.zeros((n_prompts, vocab**horizon))
    q = [np.empty(0)] * horizon
    for t in range(horizon - 1, -1, -1):
        if mode == "wrong_prefix":
            nxt = np.roll(nxt, 1, axis=1)  # V of a neighbouring prefix instead of s (+) a
        q[t] = rewards[t] + nxt.reshape(n_prompts, vocab**t, vocab)
        nxt = q[t].max(axis=-1) if mode == "hard_max" else m.logsumexp(q[t], axis=-1)
    return q


@pytest.mark.parametrize("mode", ["wrong_prefix", "hard_max"])
def test_broken_bellman_fails_e1(mode: str) -> None:
    _, total = m.toy_ebm_rewards(SPECS[0])
    logp = m.ebm_log_probs(m.sequence_energy(total))
    err = np.max(np.abs(m.arm_log_probs(_broken_bellman(total, mode)) - logp))
    assert err > 1e-3


# ----------------------------------------------------------------------------------------------------
# 6. E4 distillation bound (project-derived 2 T eps)
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.01, 0.05, 0.2])
def test_e4_distillation_bound(eps: float) -> None:
    rng = np.random.default_rng(42)
    mean_kl = []
    for horizon in (2, 3, 4):
        _, total = m.toy_ebm_rewards(m.ToyEBMSpec(vocab_size=3, horizon=horizon, n_prompts=2))
        q_star, _ = m.soft_bellman(total)
        logp = m.arm_log_probs(q_star)
        kls = []
        for _ in range(100):
            q_hat = m.perturb_logits(q_star, eps, rng)
            assert max(np.max(np.abs(a - b)) for a, b in zip(q_hat, q_star)) <= eps
            kls.append(m.kl_divergence(logp, m.arm_log_probs(q_hat)))
        kls_arr = np.array(kls)  # (100, X)
        assert np.all(kls_arr >= 0.0)
        assert np.all(kls_arr <= m.distillation_bound(horizon, eps))
        mean_kl.append(kls_arr.mean())
    assert mean_kl[0] < mean_kl[1] < mean_kl[2]


def test_distillation_bound_value() -> None:
    assert m.distillation_bound(3, 0.05) == pytest.approx(0.3)


# ----------------------------------------------------------------------------------------------------
# 7. Exact small vectors computed by hand
# ----------------------------------------------------------------------------------------------------


def test_hand_computed_ebm_to_arm() -> None:
    # V = 2, T = 2, X = 1. r_0 = [0, 0]; r_1(prefix 0) = [0, 0], r_1(prefix 1) = [0, log 3].
    # Energies: R(00) = 0, R(01) = 0, R(10) = 0, R(11) = log 3 -> Z = 1 + 1 + 1 + 3 = 6.
    # V_1(0) = log(e^0 + e^0) = log 2;  V_1(1) = log(1 + 3) = log 4.
    # q_0 = r_0 + [V_1(0), V_1(1)] = [log 2, log 4];  V_0 = log(2 + 4) = log 6 = log Z.
    # log p = [-log 6, -log 6, -log 6, log 3 - log 6 = -log 2];  p(y_1 = 0) = 2/6 = 1/3.
    log2, log3, log4, log6 = math.log(2), math.log(3), math.log(4), math.log(6)
    rewards = [np.array([[[0.0, 0.0]]]), np.array([[[0.0, 0.0], [0.0, log3]]])]
    q, values = m.soft_bellman(rewards)
    np.testing.assert_allclose(q[0], [[[log2, log4]]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(q[1], rewards[1], rtol=0, atol=1e-15)
    np.testing.assert_allclose(values[1], [[log2, log4]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(values[0], [[log6]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(values[2], np.zeros((1, 4)))
    expected_logp = [[-log6, -log6, -log6, -log2]]
    np.testing.assert_allclose(m.arm_log_probs(q), expected_logp, rtol=0, atol=1e-15)
    np.testing.assert_allclose(m.ebm_log_probs(m.sequence_energy(rewards)), expected_logp, rtol=0, atol=1e-15)
    np.testing.assert_allclose(m.first_token_marginal(m.arm_log_probs(q), 2), [[1 / 3, 2 / 3]], atol=1e-15)


def test_hand_computed_arm_to_ebm() -> None:
    # V = 2, T = 2, X = 1. q_0 = [0, 0]; q_1(prefix 0) = [0, log 3], q_1(prefix 1) = [0, 0].
    # V_1 = [log(1 + 3), log(1 + 1)] = [log 4, log 2];  r_0 = q_0 - V_1 = [-log 4, -log 2];  r_1 = q_1.
    # R(00) = -log 4, R(01) = log 3 - log 4, R(10) = R(11) = -log 2.
    # log p_q: y_1 uniform (1/2), then (1/4, 3/4) after 0 and (1/2, 1/2) after 1 -> p = [1/8, 3/8, 1/4, 1/4].
    # V_q(x) = logsumexp q_0 = log 2;  R - log p = [log 8/4, log (3/4)/(3/8), log 4/2, log 4/2] = log 2.
    log2, log3, log4 = math.log(2), math.log(3), math.log(4)
    q = [np.array([[[0.0, 0.0]]]), np.array([[[0.0, log3], [0.0, 0.0]]])]
    rewards = m.arm_to_rewards(q)
    np.testing.assert_allclose(rewards[0], [[[-log4, -log2]]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(rewards[1], q[1], rtol=0, atol=1e-15)
    np.testing.assert_allclose(m.sequence_energy(rewards), [[-log4, log3 - log4, -log2, -log2]], atol=1e-15)
    np.testing.assert_allclose(np.exp(m.arm_log_probs(q)), [[1 / 8, 3 / 8, 1 / 4, 1 / 4]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(m.soft_values(q)[0], [[log2]], rtol=0, atol=1e-15)


def test_hand_computed_toy_rewards() -> None:
    # V = 2, T = 2, X = 2, a = 0 (no token scores), b = 1, c = 10.
    # R(x, y) = 1[y_2 = y_1] + 10 * 1[y_1 + y_2 = x mod 2]; sequences 00, 01, 10, 11 have sums 0, 1, 1, 2.
    # x = 0: [1 + 10, 0, 0, 1 + 10];  x = 1: [1, 10, 10, 1].
    _, total = m.toy_ebm_rewards(m.ToyEBMSpec(vocab_size=2, horizon=2, n_prompts=2, a=0.0, b=1.0, c=10.0))
    np.testing.assert_allclose(m.sequence_energy(total), [[11.0, 0.0, 0.0, 11.0], [1.0, 10.0, 10.0, 1.0]])


def test_kl_and_tv_handle_zero_probabilities() -> None:
    # p = (1/2, 1/2, 0), q = (1/4, 1/4, 1/2): KL = 2 * 1/2 * log 2 = log 2, TV = (1/4 + 1/4 + 1/2)/2 = 1/2.
    with np.errstate(divide="ignore"):
        logp = np.log(np.array([[0.5, 0.5, 0.0]]))
    logq = np.log(np.array([[0.25, 0.25, 0.5]]))
    np.testing.assert_allclose(m.kl_divergence(logp, logq), [math.log(2)], rtol=0, atol=1e-15)
    np.testing.assert_allclose(m.total_variation(logp, logq), [0.5], rtol=0, atol=1e-15)
    assert np.isinf(m.kl_divergence(logq, logp)[0])
    np.testing.assert_allclose(m.kl_divergence(logp, logp), [0.0], atol=0)


# ----------------------------------------------------------------------------------------------------
# 8. Tabular supervised equivalence (C3)
# ----------------------------------------------------------------------------------------------------


def test_tabular_arm_and_ebm_fits_agree() -> None:
    vocab, horizon, n_prompts = 3, 3, 2
    _, total = m.toy_ebm_rewards(m.ToyEBMSpec(vocab_size=vocab, horizon=horizon, n_prompts=n_prompts))
    logp_r = m.ebm_log_probs(m.sequence_energy(total))
    samples = m.sample_sequences(logp_r, 2000, np.random.default_rng(0), vocab)
    logp_emp = m.empirical_log_probs(samples, vocab, horizon, n_prompts)
    entropy = m.empirical_nll(samples, logp_emp, vocab)

    q, arm_curve = m.fit_tabular_arm(samples, vocab, horizon, n_prompts, steps=300, lr=0.1, seed=0)
    energy, ebm_curve = m.fit_tabular_ebm(samples, vocab, horizon, n_prompts, steps=300, lr=0.1, seed=0)
    assert len(arm_curve) == len(ebm_curve) == 300
    logp_arm, logp_ebm = m.arm_log_probs(q), m.ebm_log_probs(energy)

    assert np.max(m.total_variation(logp_arm, logp_ebm)) < 0.01
    assert np.max(m.total_variation(logp_arm, logp_emp)) < 0.01
    assert np.max(m.total_variation(logp_ebm, logp_emp)) < 0.01
    assert abs(arm_curve[-1] - ebm_curve[-1]) < 0.01
    assert abs(arm_curve[-1] - entropy) < 0.01
    assert abs(ebm_curve[-1] - entropy) < 0.01
    # Training actually moved the models: both start near the uniform NLL T log V.
    assert arm_curve[0] == pytest.approx(horizon * math.log(vocab), abs=0.05)
    assert ebm_curve[0] == pytest.approx(horizon * math.log(vocab), abs=0.05)
    # The curves report the NLL of the returned parameters (up to the last step).
    assert m.empirical_nll(samples, logp_arm, vocab) == pytest.approx(arm_curve[-1], abs=0.01)


def test_empirical_log_probs() -> None:
    samples = np.array([[0, 1, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]])
    logp = m.empirical_log_probs(samples, 2, 2, 2)
    np.testing.assert_allclose(np.exp(logp), [[0, 1 / 3, 2 / 3, 0], [0, 0, 0, 1]], atol=1e-15)
    assert np.isneginf(logp[0, 0])


# ----------------------------------------------------------------------------------------------------
# 9. Sampling and indexing
# ----------------------------------------------------------------------------------------------------


def test_sample_sequences_matches_distribution() -> None:
    vocab, horizon, n_prompts = 3, 3, 2
    _, total = m.toy_ebm_rewards(m.ToyEBMSpec(vocab_size=vocab, horizon=horizon, n_prompts=n_prompts))
    logp = m.ebm_log_probs(m.sequence_energy(total))
    samples = m.sample_sequences(logp, 200_000, np.random.default_rng(7), vocab)
    assert samples.shape == (200_000, 1 + horizon) and samples.dtype == np.int64
    assert samples[:, 1:].min() >= 0 and samples[:, 1:].max() < vocab
    counts = np.bincount(samples[:, 0], minlength=n_prompts)
    np.testing.assert_allclose(counts / len(samples), 1 / n_prompts, atol=0.01)
    tv = m.total_variation(logp, m.empirical_log_probs(samples, vocab, horizon, n_prompts))
    assert np.max(tv) < 0.02
    # Same seed, same draws.
    np.testing.assert_array_equal(
        samples[:50], m.sample_sequences(logp, 200_000, np.random.default_rng(7), vocab)[:50]
    )


@pytest.mark.parametrize("vocab,length", [(2, 1), (3, 4), (5, 6)])
def test_index_tokens_round_trip(vocab: int, length: int) -> None:
    index = np.arange(vocab**length)
    tokens = m.index_to_tokens(index, vocab, length)
    np.testing.assert_array_equal(m.sequence_index(tokens, vocab), index)
    # Lexicographic order, first token most significant.
    np.testing.assert_array_equal(tokens[1, -1], 1 if vocab > 1 else 0)
    np.testing.assert_array_equal(tokens[-1], np.full(length, vocab - 1))
    assert m.sequence_index(np.array([1] + [0] * (length - 1)), vocab) == vocab ** (length - 1)


def test_training_sequences() -> None:
    samples = np.array([[0, 2, 1], [1, 0, 0]])
    np.testing.assert_array_equal(m.training_sequences(samples, 3), [[3, 2, 1], [4, 0, 0]])


# ----------------------------------------------------------------------------------------------------
# 10. prefix_tree_logits on a known causal table
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [4096, 5])
def test_prefix_tree_logits_reproduces_table(batch_size: int) -> None:
    vocab, horizon, n_prompts = 3, 4, 2
    n_ids = vocab + n_prompts + 1  # one extra id beyond the prompts, to be cut off
    table = torch.as_tensor(np.random.default_rng(5).standard_normal((horizon, n_ids, n_ids)))

    def fake_logits(ids: torch.Tensor) -> torch.Tensor:
        # Causal "model": logits at position l depend only on (l, ids[:, l]).
        positions = torch.arange(ids.shape[1])
        return table[positions[None, :], ids]

    q = m.prefix_tree_logits(fake_logits, n_prompts, vocab, horizon, batch_size=batch_size)
    assert [level.shape for level in q] == [(n_prompts, vocab**t, vocab) for t in range(horizon)]
    table_np = table.numpy()
    for t in range(horizon):
        for x in range(n_prompts):
            for i in range(vocab**t):
                last = vocab + x if t == 0 else i % vocab  # BOS_x at t = 0, else the last prefix token y_t
                np.testing.assert_array_equal(q[t][x, i], table_np[t, last, :vocab])


# ----------------------------------------------------------------------------------------------------
# 11. The GPT-2's training objective: the exact population cross-entropy over the prefix tree
# ----------------------------------------------------------------------------------------------------


def test_population_cross_entropy_hand_value() -> None:
    # One row, one position, V = 2: target (1/4, 3/4), logits (0, log 3) -> softmax = target, so the loss is
    # the target's entropy H = -(1/4 log 1/4 + 3/4 log 3/4); uniform logits give log 2 whatever the target.
    targets = torch.tensor([[[0.25, 0.75]]], dtype=torch.float64)
    entropy = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    logits = torch.tensor([[[0.0, math.log(3.0), 9.0]]], dtype=torch.float64)  # a third id beyond V is ignored
    assert float(m.population_cross_entropy(logits, targets, 2)) == pytest.approx(entropy, abs=1e-15)
    assert m.mean_target_entropy(targets.numpy()) == pytest.approx(entropy, abs=1e-15)
    assert float(m.population_cross_entropy(torch.zeros(1, 1, 2, dtype=torch.float64), targets, 2)) == (
        pytest.approx(math.log(2.0), abs=1e-15))


def test_population_cross_entropy_equals_brute_force_sum(monkeypatch) -> None:
    """Every prefix of the tree weighted by p_R gives exactly E_{x, y ~ p_R}[-log p_q(y|x)], computed here
    independently: one forward pass per full sequence, teacher-forcing NLL summed with weights p_R(y|x)/X."""
    vocab, horizon, n_prompts = 3, 3, 2
    _, total = m.toy_ebm_rewards(m.ToyEBMSpec(vocab, horizon, n_prompts, seed=4))
    logp_r = m.ebm_log_probs(m.sequence_energy(total))
    model = _tiny_gpt2(vocab, n_prompts)

    def exact_loss() -> float:
        prefixes = m.all_prefixes(n_prompts, vocab, horizon)
        ids, targets = m.prefix_inputs_and_targets(prefixes, m.next_token_log_probs(logp_r, vocab), vocab)
        weights = torch.as_tensor(m.prefix_weights(prefixes, logp_r, vocab))
        with torch.no_grad():
            logits = model(input_ids=torch.as_tensor(ids)).logits
        return float(m.population_cross_entropy(logits, torch.as_tensor(targets), vocab, weights))

    brute = 0.0
    for x in range(n_prompts):
        for index in range(vocab**horizon):
            ids = torch.as_tensor([[vocab + x, *m.index_to_tokens(index, vocab, horizon)]])
            with torch.no_grad():
                nll = float(m.teacher_forcing_nll(model(input_ids=ids[:, :-1]).logits, ids, vocab)[0])
            brute += math.exp(logp_r[x, index]) * nll / n_prompts
    loss = exact_loss()
    assert loss == pytest.approx(brute, rel=0, abs=1e-12)
    # It is H(p_R) + KL(p_R || p_q), the KL read off the prefix-tree tables of the same model.
    q = m.prefix_tree_logits(m.gpt2_logits_fn(model), n_prompts, vocab, horizon)
    entropy = float(-(np.exp(logp_r) * logp_r).sum(axis=1).mean())
    assert loss == pytest.approx(entropy + m.kl_divergence(logp_r, m.arm_log_probs(q)).mean(), abs=1e-12)
    # Negative controls: equal weights over prefixes, or the myopic ARM's next-token laws as targets.
    prefixes = m.all_prefixes(n_prompts, vocab, horizon)
    ids, targets = m.prefix_inputs_and_targets(prefixes, m.next_token_log_probs(logp_r, vocab), vocab)
    with torch.no_grad():
        logits = model(input_ids=torch.as_tensor(ids)).logits
    unweighted = float(m.population_cross_entropy(logits, torch.as_tensor(targets), vocab))
    assert abs(unweighted - brute) > 1e-3
    myopic = m.conditional_log_probs(m.myopic_arm(total))
    monkeypatch.setattr(m, "next_token_log_probs", lambda logp, v: myopic)
    assert abs(exact_loss() - brute) > 1e-3


def test_prefix_weights_and_targets_layout() -> None:
    vocab, horizon, n_prompts = 2, 3, 2
    _, total = m.toy_ebm_rewards(m.ToyEBMSpec(vocab, horizon, n_prompts, seed=0))
    logp_r = m.ebm_log_probs(m.sequence_energy(total))
    prefixes = m.all_prefixes(n_prompts, vocab, horizon)
    assert prefixes.shape == (n_prompts * vocab ** (horizon - 1), horizon)
    np.testing.assert_array_equal(prefixes[5], [1, 0, 1])  # prompt-major, then base-V order
    weights = m.prefix_weights(prefixes, logp_r, vocab)
    assert weights.sum() == pytest.approx(1.0, abs=1e-14)
    # Row [x=1, 0, 1]: p_R(y_1 = 0, y_2 = 1 | x = 1) / X = (p(010) + p(011)) / 2.
    p = np.exp(logp_r)
    assert weights[5] == pytest.approx((p[1, 2] + p[1, 3]) / 2, abs=1e-15)
    ids, targets = m.prefix_inputs_and_targets(prefixes, m.next_token_log_probs(logp_r, vocab), vocab)
    np.testing.assert_array_equal(ids[5], [vocab + 1, 0, 1])
    # Position 2 of that row: p(y_3 | x = 1, 0, 1) = (p(010), p(011)) / (p(010) + p(011)).
    np.testing.assert_allclose(targets[5, 2], p[1, 2:4] / p[1, 2:4].sum(), rtol=0, atol=1e-15)
    np.testing.assert_allclose(targets.sum(axis=2), 1.0, atol=1e-14)
    # Full samples [x, y_1..y_T] give the same rows as their prefixes.
    full = np.concatenate([prefixes, np.zeros((len(prefixes), 1), dtype=np.int64)], axis=1)
    ids_full, targets_full = m.prefix_inputs_and_targets(full, m.next_token_log_probs(logp_r, vocab), vocab)
    np.testing.assert_array_equal(ids_full, ids)
    np.testing.assert_array_equal(targets_full, targets)


def test_stepwise_kl_sums_to_kl_and_splits_off_the_last_step() -> None:
    vocab, horizon, n_prompts = 3, 4, 2
    local, total = m.toy_ebm_rewards(m.ToyEBMSpec(vocab, horizon, n_prompts, seed=2))
    logp_r = m.ebm_log_probs(m.sequence_energy(total))
    q = _random_q(n_prompts, vocab, horizon, seed=3)
    steps = m.stepwise_kl(logp_r, q)
    assert steps.shape == (horizon,) and np.all(steps >= 0)
    assert steps.sum() == pytest.approx(m.kl_divergence(logp_r, m.arm_log_probs(q)).mean(), abs=1e-12)
    # The myopic ARM sees every term of R at the last step: its last-step KL is 0, all its error is lookahead.
    myopic = m.stepwise_kl(logp_r, m.myopic_arm(total))
    assert myopic[-1] < 1e-14 and myopic[:-1].sum() > 0.1
    # q* has no error anywhere.
    assert np.max(m.stepwise_kl(logp_r, m.soft_bellman(total)[0])) < 1e-14
    # Hand case: V = 2, T = 1, p = (1/4, 3/4), q uniform: KL = log 2 - H(1/4).
    hand = m.stepwise_kl(np.log([[0.25, 0.75]]), [np.zeros((1, 1, 2))])
    assert hand[0] == pytest.approx(math.log(2) + 0.25 * math.log(0.25) + 0.75 * math.log(0.75), abs=1e-15)


def test_sample_sequences_with_precomputed_cdf_gives_the_same_draws() -> None:
    _, total = m.toy_ebm_rewards(m.ToyEBMSpec(3, 3, 2))
    logp = m.ebm_log_probs(m.sequence_energy(total))
    cdf = np.cumsum(np.exp(logp), axis=1)
    a = m.sample_sequences(logp, 500, np.random.default_rng(9), 3)
    b = m.sample_sequences(logp, 500, np.random.default_rng(9), 3, cdf=cdf)
    np.testing.assert_array_equal(a, b)


def test_neural_ebm_prompt_subsampling() -> None:
    _, total = m.toy_ebm_rewards(m.ToyEBMSpec(2, 3, 4, seed=0))
    logp_r = m.ebm_log_probs(m.sequence_energy(total))
    full, curve_full = m.fit_neural_ebm(logp_r, 2, 3, hidden=8, steps=5, lr=1e-2, seed=0)
    every, curve_every = m.fit_neural_ebm(logp_r, 2, 3, hidden=8, steps=5, lr=1e-2, seed=0, prompts_per_step=4)
    np.testing.assert_array_equal(full, every)  # all prompts per step is the full-batch fit
    assert curve_full == curve_every
    sub, curve_sub = m.fit_neural_ebm(logp_r, 2, 3, hidden=8, steps=5, lr=1e-2, seed=0, prompts_per_step=1)
    assert len(curve_sub) == 5 and sub.shape == logp_r.shape and not np.array_equal(sub, full)
    np.testing.assert_allclose(m.logsumexp(sub, axis=1), 0.0, atol=1e-12)
    for bad in (0, 5):
        with pytest.raises(ValueError, match="prompts_per_step"):
            m.fit_neural_ebm(logp_r, 2, 3, hidden=8, steps=1, lr=1e-2, prompts_per_step=bad)
