"""ARM <-> EBM bijection on enumerable prefix trees (Blondel et al., arXiv 2512.15605).

Pure numerical library (numpy + torch, float64 everywhere); no pipeline or tracking imports.

Objects
-------
* ARM: p_q(y|x) = prod_t softmax(q(s_t, .))[y_t], s_t = x (+) y_<t.
* EBM: p_R(y|x) = exp R(x, y) / sum_y' exp R(x, y').
* Soft Bellman (deterministic transitions, gamma = 1, temperature 1), with R(x, y) = sum_t r(s_t, y_t):
  V(s) = logsumexp_a q(s, a),  q(s, a) = r(s, a) + V(s (+) a),  V = 0 after the last step.
* ARM -> EBM: r(s, a) = q(s, a) - logsumexp_a' q(s (+) a, a'); telescoping gives
  log p_q(y|x) = R(x, y) - V_q(x) with V_q(x) = log Z_R(x).

Representation ("prefix-tree tables")
-------------------------------------
For X prompts, vocabulary V and horizon T, a function on (prefix, action) is a list of T float64
arrays; element t has shape (X, V**t, V) and entry [x, i, a] is the value at prompt x, prefix y_<t with
base-V index i (first token most significant) and action a. The index of the prefix y_<t (+) a is
i * V + a, so ``table.reshape(X, V**(t+1))`` is indexed by the next prefix. A full-sequence function
(energy, log-probabilities) has shape (X, V**T).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tasks.common.seeding import torch_init_seed

Tables = list[np.ndarray]

# ----------------------------------------------------------------------------------------------------
# Small numerical helpers
# ----------------------------------------------------------------------------------------------------


def logsumexp(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """Stable log sum_i exp(values_i) along ``axis``; rows that are all -inf give -inf (not NaN)."""
    values = np.asarray(values, dtype=np.float64)
    peak = np.max(values, axis=axis, keepdims=True)
    # An all -inf row would give -inf - -inf = NaN; shifting by 0 there keeps the result -inf.
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(divide="ignore"):
        out = np.log(np.sum(np.exp(values - peak), axis=axis, keepdims=True)) + peak
    return np.squeeze(out, axis=axis)


def log_softmax(values: np.ndarray, axis: int = -1) -> np.ndarray:
    """log softmax(values)_i = values_i - logsumexp(values) along ``axis``."""
    return values - np.expand_dims(logsumexp(values, axis=axis), axis)


def _dims(tables: Sequence[np.ndarray]) -> tuple[int, int, int]:
    """(X, V, T) of a prefix-tree table list, checking every level has shape (X, V**t, V)."""
    horizon = len(tables)
    if horizon == 0:
        raise ValueError("a prefix-tree table needs at least one step")
    n_prompts, _, vocab = tables[0].shape
    for t, table in enumerate(tables):
        if table.shape != (n_prompts, vocab**t, vocab):
            raise ValueError(f"level {t} has shape {table.shape}, expected {(n_prompts, vocab**t, vocab)}")
    return n_prompts, vocab, horizon


def _accumulate(tables: Sequence[np.ndarray]) -> np.ndarray:
    """Sum a per-step table along every prefix-tree path: out[x, idx(y)] = sum_t table_t[x, s_t, y_t]."""
    n_prompts, _, _ = _dims(tables)
    total = np.zeros((n_prompts, 1))
    for table in tables:
        # Child index i*V + a follows from C-order reshaping of (X, V**t, V).
        total = (total[:, :, None] + table).reshape(n_prompts, -1)
    return total


# ----------------------------------------------------------------------------------------------------
# Sequence indexing
# ----------------------------------------------------------------------------------------------------


def sequence_index(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """Base-V index of token sequences, first token most significant: idx = sum_k y_k V**(L-1-k).

    ``tokens`` has shape (..., L); the result has shape (...). An empty sequence (L = 0) has index 0.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    index = np.zeros(tokens.shape[:-1], dtype=np.int64)
    for k in range(tokens.shape[-1]):
        index = index * vocab_size + tokens[..., k]
    return index


def index_to_tokens(index: np.ndarray | int, vocab_size: int, length: int) -> np.ndarray:
    """Inverse of :func:`sequence_index`: tokens of shape (..., length) whose base-V index is ``index``."""
    index = np.asarray(index, dtype=np.int64)
    powers = vocab_size ** np.arange(length - 1, -1, -1, dtype=np.int64)
    return (index[..., None] // powers) % vocab_size


# ----------------------------------------------------------------------------------------------------
# Toy energy
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToyEBMSpec:
    """Enumerable toy EBM R(x,y) = sum_t a*score(y_t) + b*1[y_T = y_1] + c*1[sum_t y_t = x mod V]."""

    vocab_size: int
    horizon: int
    n_prompts: int
    a: float = 1.0
    b: float = 4.0
    c: float = 4.0
    seed: int = 0


def toy_token_scores(spec: ToyEBMSpec) -> np.ndarray:
    """score(v) ~ N(0, 1) per token v, drawn from np.random.default_rng(spec.seed)."""
    return np.random.default_rng(spec.seed).standard_normal(spec.vocab_size)


def toy_ebm_rewards(spec: ToyEBMSpec) -> tuple[Tables, Tables]:
    """Per-step rewards of the toy EBM: (local_rewards, total_rewards).

    local:  r_t(s, a) = a * score(a) at every step t (all a myopic model sees).
    total:  local plus, at the last step t = T-1 only (they need the whole sequence),
            b * 1[a = y_1] + c * 1[(sum_{k<T} y_k + a) = x mod V],
    so that sum_t r_t(s_t, y_t) = R(x, y) (README, "What is measured"). For T = 1, y_T = y_1 always holds.
    """
    vocab, horizon, n_prompts = spec.vocab_size, spec.horizon, spec.n_prompts
    if vocab < 1 or horizon < 1 or n_prompts < 1:
        raise ValueError(f"invalid toy spec {spec}")
    score = toy_token_scores(spec)
    local = [
        np.broadcast_to(spec.a * score, (n_prompts, vocab**t, vocab)).astype(np.float64)
        for t in range(horizon)
    ]
    total = [table.copy() for table in local]

    actions = np.arange(vocab)
    prefixes = index_to_tokens(np.arange(vocab ** (horizon - 1)), vocab, horizon - 1)  # (V**(T-1), T-1)
    if horizon >= 2:
        same_ends = (prefixes[:, :1] == actions[None, :]).astype(np.float64)  # (V**(T-1), V)
    else:
        same_ends = np.ones((1, vocab))
    token_sum = prefixes.sum(axis=1)[:, None] + actions[None, :]  # (V**(T-1), V)
    residue = (np.arange(n_prompts) % vocab)[:, None, None]
    congruent = ((token_sum[None] % vocab) == residue).astype(np.float64)  # (X, V**(T-1), V)
    total[-1] = total[-1] + spec.b * same_ends[None] + spec.c * congruent
    return local, total


# ----------------------------------------------------------------------------------------------------
# EBM side
# ----------------------------------------------------------------------------------------------------


def sequence_energy(rewards: Sequence[np.ndarray]) -> np.ndarray:
    """R(x, y) = sum_t r_t(s_t, y_t), shape (X, V**T)."""
    return _accumulate(rewards)


def ebm_log_probs(energy: np.ndarray) -> np.ndarray:
    """log p_R(y|x) = R(x, y) - log sum_y' exp R(x, y'), per prompt row."""
    return log_softmax(np.asarray(energy, dtype=np.float64), axis=1)


def log_partition(energy: np.ndarray) -> np.ndarray:
    """log Z_R(x) = logsumexp_y R(x, y), shape (X,)."""
    return logsumexp(np.asarray(energy, dtype=np.float64), axis=1)


# ----------------------------------------------------------------------------------------------------
# Soft Bellman / ARM side
# ----------------------------------------------------------------------------------------------------


def soft_bellman(rewards: Sequence[np.ndarray]) -> tuple[Tables, Tables]:
    """EBM -> ARM by backward dynamic programming over the prefix tree.

    V_T = 0;  q_t(s, a) = r_t(s, a) + V_{t+1}(s (+) a);  V_t(s) = logsumexp_a q_t(s, a).
    Returns (q, values) with len(values) = T + 1, values[t] of shape (X, V**t); values[0] = log Z_R(x).
    """
    n_prompts, vocab, horizon = _dims(rewards)
    values: Tables = [np.empty(0)] * (horizon + 1)
    q: Tables = [np.empty(0)] * horizon
    values[horizon] = np.zeros((n_prompts, vocab**horizon))
    for t in range(horizon - 1, -1, -1):
        q[t] = rewards[t] + values[t + 1].reshape(n_prompts, vocab**t, vocab)
        values[t] = logsumexp(q[t], axis=-1)
    return q, values


def soft_values(q: Sequence[np.ndarray]) -> Tables:
    """V_t(s) = logsumexp_a q_t(s, a) for t < T and V_T = 0 (shape (X, V**T)); T + 1 arrays."""
    n_prompts, vocab, horizon = _dims(q)
    return [logsumexp(table, axis=-1) for table in q] + [np.zeros((n_prompts, vocab**horizon))]


def arm_to_rewards(q: Sequence[np.ndarray]) -> Tables:
    """ARM -> EBM: r_t(s, a) = q_t(s, a) - V_{t+1}(s (+) a) = q_t(s, a) - logsumexp_a' q_{t+1}(s (+) a, a').

    Inverse of :func:`soft_bellman`'s q map: soft_bellman(arm_to_rewards(q))[0] == q.
    """
    n_prompts, vocab, _ = _dims(q)
    values = soft_values(q)
    return [table - values[t + 1].reshape(n_prompts, vocab**t, vocab) for t, table in enumerate(q)]


def arm_log_probs(q: Sequence[np.ndarray]) -> np.ndarray:
    """log p_q(y|x) = sum_t log softmax(q_t(s_t, .))[y_t], shape (X, V**T)."""
    return _accumulate([log_softmax(table, axis=-1) for table in q])


def bellman_residual(q: Sequence[np.ndarray], rewards: Sequence[np.ndarray]) -> float:
    """max over t, x, s, a of |q_t(s, a) - r_t(s, a) - V_{t+1}(s (+) a)| with V from q itself."""
    n_prompts, vocab, _ = _dims(q)
    values = soft_values(q)
    return float(
        max(
            np.max(np.abs(q[t] - rewards[t] - values[t + 1].reshape(n_prompts, vocab**t, vocab)))
            for t in range(len(q))
        )
    )


def shape_rewards(rewards: Sequence[np.ndarray], potential: Sequence[np.ndarray]) -> Tables:
    """Potential-based reward shaping r'_t(s, a) = r_t(s, a) + Phi_{t+1}(s (+) a) - Phi_t(s).

    ``potential`` holds T + 1 arrays, potential[t] of shape (X, V**t). The shaped energy telescopes to
    R'(x, y) = R(x, y) + Phi_T(y) - Phi_0(x); Phi_0 only moves log Z, so p_R is unchanged iff Phi_T = 0.
    Raises ValueError when potential[T] is not identically zero or shapes do not match.
    """
    n_prompts, vocab, horizon = _dims(rewards)
    if len(potential) != horizon + 1:
        raise ValueError(f"potential needs T + 1 = {horizon + 1} levels, got {len(potential)}")
    for t, phi in enumerate(potential):
        if np.shape(phi) != (n_prompts, vocab**t):
            raise ValueError(
                f"potential level {t} has shape {np.shape(phi)}, expected {(n_prompts, vocab**t)}"
            )
    if np.any(np.asarray(potential[horizon]) != 0.0):
        raise ValueError("potential must be zero at terminal prefixes (t = T), otherwise p_R changes")
    return [
        rewards[t] + potential[t + 1].reshape(n_prompts, vocab**t, vocab) - potential[t][:, :, None]
        for t in range(horizon)
    ]


def myopic_arm(local_rewards: Sequence[np.ndarray]) -> Tables:
    """Negative control: q_t(s, a) = r_t(s, a), the soft Bellman equation with V(s (+) a) dropped.

    Which per-step rewards are passed sets what the myopic model sees. The project's reference numbers for
    V=5, T=6, X=8, b=c=4 (KL(p_R || myopic) ~ 1.1 nats, first-token TV ~ 0.15; ~0.68 / 0.13 for b=c=3) are
    reproduced by passing ``total_rewards`` (global terms visible only at the last step, no lookahead);
    passing ``local_rewards`` (global terms never seen) gives a larger KL (~2.4) and the same first-token TV,
    since the first step carries only a*score(a) either way.
    """
    return [np.array(table, dtype=np.float64, copy=True) for table in local_rewards]


# ----------------------------------------------------------------------------------------------------
# Distribution comparisons
# ----------------------------------------------------------------------------------------------------


def kl_divergence(logp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """KL(p || q)[x] = sum_y p(y|x) (log p(y|x) - log q(y|x)), shape (X,).

    Terms with p = 0 contribute 0 (even where log q = -inf); p > 0 with q = 0 gives +inf.
    """
    logp = np.asarray(logp, dtype=np.float64)
    logq = np.asarray(logq, dtype=np.float64)
    prob = np.exp(logp)
    with np.errstate(invalid="ignore"):
        gap = np.where(prob > 0, logp - logq, 0.0)
    return np.sum(prob * gap, axis=1)


def total_variation(p_logp: np.ndarray, q_logp: np.ndarray) -> np.ndarray:
    """TV(p, q)[x] = 0.5 sum_y |p(y|x) - q(y|x)|, shape (X,) (exp(-inf) = 0 handles empty cells)."""
    return 0.5 * np.sum(np.abs(np.exp(p_logp) - np.exp(q_logp)), axis=1)


def first_token_marginal(logp: np.ndarray, vocab_size: int) -> np.ndarray:
    """Probabilities p(y_1 = v | x) = sum_{y_2..y_T} p(y|x), shape (X, V).

    The first token is the most significant digit, so the marginal sums contiguous blocks of V**(T-1)
    sequences. ``vocab_size`` is required because V**T alone does not determine V (2**4 = 4**2).
    """
    logp = np.asarray(logp, dtype=np.float64)
    n_prompts, width = logp.shape
    if width % vocab_size:
        raise ValueError(f"width {width} is not a multiple of vocab_size {vocab_size}")
    return np.exp(logp).reshape(n_prompts, vocab_size, width // vocab_size).sum(axis=2)


def first_token_tv(p_logp: np.ndarray, q_logp: np.ndarray, vocab_size: int) -> np.ndarray:
    """TV between first-token marginals: 0.5 sum_v |p(y_1=v|x) - q(y_1=v|x)|, shape (X,)."""
    return 0.5 * np.sum(
        np.abs(first_token_marginal(p_logp, vocab_size) - first_token_marginal(q_logp, vocab_size)), axis=1
    )


# ----------------------------------------------------------------------------------------------------
# Distillation error (E4)
# ----------------------------------------------------------------------------------------------------


def perturb_logits(q: Sequence[np.ndarray], eps: float, rng: np.random.Generator) -> Tables:
    """q_hat_t(s, a) = q_t(s, a) + u, u ~ Uniform[-eps, eps] drawn independently for every entry."""
    return [table + rng.uniform(-eps, eps, size=table.shape) for table in q]


def distillation_bound(horizon: int, eps: float) -> float:
    """KL(p_R || p_q_hat) <= 2 T eps whenever |q_hat - q*| <= eps entrywise.

    Project's derivation [reconstructed], not the paper's constant: a shift of at most eps per logit
    moves log softmax by at most 2 eps (eps from the logit, eps from the logsumexp), so
    |log p_R - log p_q_hat| <= 2 T eps for every sequence, and the KL (an average of that log ratio under
    p_R) inherits the bound.
    """
    return 2.0 * horizon * eps


# ----------------------------------------------------------------------------------------------------
# Sampling and empirical distributions
# ----------------------------------------------------------------------------------------------------


def sample_sequences(logp: np.ndarray, n: int, rng: np.random.Generator, vocab_size: int,
                     cdf: np.ndarray | None = None) -> np.ndarray:
    """Exact samples: x ~ Uniform(prompts), y ~ exp(logp[x]); returns int64 (n, 1 + T) = [x, y_1, ..., y_T].

    ``vocab_size`` is required because V**T alone does not determine V (e.g. 2**4 = 4**2). ``cdf`` is
    ``np.cumsum(np.exp(logp), axis=1)`` precomputed by a caller that draws many batches (same draws).
    """
    logp = np.asarray(logp, dtype=np.float64)
    n_prompts, width = logp.shape
    horizon = round(np.log(width) / np.log(vocab_size)) if vocab_size > 1 else 1
    if vocab_size**horizon != width:
        raise ValueError(f"width {width} is not a power of vocab_size {vocab_size}")
    prompts = rng.integers(0, n_prompts, size=n)
    uniforms = rng.random(n)
    if cdf is None:
        cdf = np.cumsum(np.exp(logp), axis=1)
    index = np.empty(n, dtype=np.int64)
    for x in range(n_prompts):
        rows = prompts == x
        # Inverse-CDF draw; scaling by the last CDF value absorbs the rounding of sum p = 1.
        index[rows] = np.searchsorted(cdf[x], uniforms[rows] * cdf[x, -1], side="right")
    index = np.minimum(index, width - 1)
    return np.concatenate([prompts[:, None], index_to_tokens(index, vocab_size, horizon)], axis=1)


def empirical_log_probs(samples: np.ndarray, vocab_size: int, horizon: int, n_prompts: int) -> np.ndarray:
    """log of per-prompt empirical frequencies, shape (X, V**T); -inf at unseen sequences and prompts."""
    samples = np.asarray(samples, dtype=np.int64)
    counts = np.zeros((n_prompts, vocab_size**horizon))
    np.add.at(counts, (samples[:, 0], sequence_index(samples[:, 1:], vocab_size)), 1.0)
    totals = counts.sum(axis=1, keepdims=True)
    out = np.full_like(counts, -np.inf)
    seen = counts > 0
    out[seen] = np.log((counts / np.maximum(totals, 1.0))[seen])
    return out


def empirical_nll(samples: np.ndarray, logp: np.ndarray, vocab_size: int) -> float:
    """Mean over samples of -log p(y|x), nats per sequence (empirical logp gives the entropy floor)."""
    samples = np.asarray(samples, dtype=np.int64)
    return float(-np.mean(logp[samples[:, 0], sequence_index(samples[:, 1:], vocab_size)]))


# ----------------------------------------------------------------------------------------------------
# Tabular supervised equivalence (C3), torch float64
# ----------------------------------------------------------------------------------------------------


def _prefix_indices(samples: np.ndarray, vocab_size: int, horizon: int) -> list[torch.Tensor]:
    """For each step t, the base-V index of the prefix y_<t of every sample (0 for the empty prefix)."""
    return [torch.as_tensor(sequence_index(samples[:, 1 : 1 + t], vocab_size)) for t in range(horizon)]


def fit_tabular_arm(
    samples: np.ndarray, vocab_size: int, horizon: int, n_prompts: int, steps: int, lr: float, seed: int = 0
) -> tuple[Tables, list[float]]:
    """Free logit tables q_t (X, V**t, V) trained by full-batch Adam on the teacher-forcing NLL.

    NLL(q) = -mean_i sum_t log softmax(q_t(s_t^i, .))[y_t^i]; its minimiser is the empirical conditional law,
    hence the empirical joint per prompt. Returns (q tables as numpy, nll_curve) where nll_curve[k] is the
    mean train NLL (nats per sequence) of the parameters at the start of step k.
    """
    samples = np.asarray(samples, dtype=np.int64)
    generator = torch.Generator().manual_seed(seed)
    # Small random init (not zeros) so the fit does not depend on a symmetric starting point.
    params = [
        torch.nn.Parameter(
            0.01 * torch.randn(n_prompts, vocab_size**t, vocab_size, generator=generator, dtype=torch.float64)
        )
        for t in range(horizon)
    ]
    prompts = torch.as_tensor(samples[:, 0])
    tokens = torch.as_tensor(samples[:, 1:])
    prefixes = _prefix_indices(samples, vocab_size, horizon)
    optimizer = torch.optim.Adam(params, lr=lr)
    curve: list[float] = []
    for _ in range(steps):
        optimizer.zero_grad()
        log_lik = torch.zeros(len(samples), dtype=torch.float64)
        for t, table in enumerate(params):
            logits = table[prompts, prefixes[t]]  # (n, V)
            log_lik = log_lik + torch.log_softmax(logits, dim=-1).gather(1, tokens[:, t : t + 1]).squeeze(1)
        loss = -log_lik.mean()
        loss.backward()
        optimizer.step()
        curve.append(float(loss.detach()))
    return [p.detach().numpy().copy() for p in params], curve


def fit_tabular_ebm(
    samples: np.ndarray, vocab_size: int, horizon: int, n_prompts: int, steps: int, lr: float, seed: int = 0
) -> tuple[np.ndarray, list[float]]:
    """Free energy table R (X, V**T) trained by full-batch Adam on the exact-partition MLE NLL.

    NLL(R) = -mean_i [R(x^i, y^i) - log sum_y exp R(x^i, y)]; same minimiser as the ARM's teacher-forcing NLL
    (the empirical law per prompt). Returns (energy as numpy, nll_curve) as in :func:`fit_tabular_arm`.
    """
    samples = np.asarray(samples, dtype=np.int64)
    generator = torch.Generator().manual_seed(seed)
    energy = torch.nn.Parameter(
        0.01 * torch.randn(n_prompts, vocab_size**horizon, generator=generator, dtype=torch.float64)
    )
    prompts = torch.as_tensor(samples[:, 0])
    index = torch.as_tensor(sequence_index(samples[:, 1:], vocab_size))
    optimizer = torch.optim.Adam([energy], lr=lr)
    curve: list[float] = []
    for _ in range(steps):
        optimizer.zero_grad()
        log_z = torch.logsumexp(energy, dim=1)
        loss = -(energy[prompts, index] - log_z[prompts]).mean()
        loss.backward()
        optimizer.step()
        curve.append(float(loss.detach()))
    return energy.detach().numpy().copy(), curve


# ----------------------------------------------------------------------------------------------------
# Neural ARMs (tiny GPT-2) on the prefix tree
# ----------------------------------------------------------------------------------------------------

LogitsFn = Callable[[torch.Tensor], torch.Tensor]


def prompt_token(x: int | np.ndarray, vocab_size: int) -> int | np.ndarray:
    """Token id of prompt x: V + x (ids 0..V-1 are the sequence vocabulary, V..V+X-1 the prompt tokens)."""
    return vocab_size + x


def prefix_tree_logits(
    logits_fn: LogitsFn, n_prompts: int, vocab_size: int, horizon: int, batch_size: int = 4096
) -> Tables:
    """q tables of a causal ARM: q_t(s, a) = logits[t, :V] on the input [BOS_x, y_1, ..., y_{T-1}].

    Enumerates all X * V**(T-1) inputs of length T in batches; for a causal model the logits at position
    t depend only on (x, y_<=t), so one pass over full-length inputs yields every prefix's logits.
    ``logits_fn`` maps int64 ids (B, L) to float logits (B, L, n_vocab) with n_vocab >= V; the result is
    float64.
    """
    n_tail = vocab_size ** (horizon - 1)
    tails = index_to_tokens(np.arange(n_tail), vocab_size, horizon - 1)  # (V**(T-1), T-1)
    prompts = np.repeat(np.arange(n_prompts), n_tail)
    inputs = np.concatenate(
        [prompt_token(prompts, vocab_size)[:, None], np.tile(tails, (n_prompts, 1))], axis=1
    )
    chunks = []
    for start in range(0, len(inputs), batch_size):
        ids = torch.as_tensor(inputs[start : start + batch_size], dtype=torch.int64)
        logits = logits_fn(ids)
        chunks.append(logits[..., :vocab_size].detach().to(torch.float64).cpu().numpy())
    all_logits = np.concatenate(chunks, axis=0).reshape(n_prompts, n_tail, horizon, vocab_size)
    tables: Tables = []
    for t in range(horizon):
        # Tail index j = prefix_index(y_1..y_t) * V**(T-1-t) + rest; the rest=0 representative suffices.
        stride = vocab_size ** (horizon - 1 - t)
        tables.append(np.ascontiguousarray(all_logits[:, ::stride, t, :]))
    return tables


def gpt2_logits_fn(model: torch.nn.Module) -> LogitsFn:
    """Wrap a (duck-typed) GPT2LMHeadModel: ids -> model(input_ids=ids).logits as float64, no grad."""

    def logits_fn(ids: torch.Tensor) -> torch.Tensor:
        device = next(model.parameters()).device
        with torch.no_grad():
            return model(input_ids=ids.to(device)).logits.to(torch.float64)

    return logits_fn


def training_sequences(samples: np.ndarray, vocab_size: int) -> np.ndarray:
    """GPT-2 inputs [V + x, y_1, ..., y_T] (int64, shape (n, 1 + T)) from samples [x, y_1, ..., y_T].

    Teacher forcing: feed ids[:, :-1] and predict ids[:, 1:] (y_t from position t-1), scoring only the first V
    logits as :func:`prefix_tree_logits` and :func:`teacher_forcing_nll` do.
    """
    samples = np.asarray(samples, dtype=np.int64)
    return np.concatenate([prompt_token(samples[:, :1], vocab_size), samples[:, 1:]], axis=1)


def teacher_forcing_nll(logits: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Per-sequence NLL -sum_t log softmax(logits[:, t-1, :V])[y_t] for ids = [BOS_x, y_1..y_T].

    ``logits`` are the model outputs on ids[:, :-1], shape (B, T, n_vocab); returns shape (B,). Restricting
    the softmax to the V sequence tokens makes this exactly -log p_q(y|x) for the q of
    :func:`prefix_tree_logits`.
    """
    log_pi = torch.log_softmax(logits[..., :vocab_size], dim=-1)
    return -log_pi.gather(2, ids[:, 1:, None]).squeeze(2).sum(dim=1)


# ----------------------------------------------------------------------------------------------------
# Neural EBM (C3, neural side): an MLP energy trained by exact-partition maximum likelihood
# ----------------------------------------------------------------------------------------------------


def one_hot_sequences(n_prompts: int, vocab_size: int, horizon: int) -> torch.Tensor:
    """Inputs of the MLP energy for every (prompt, sequence): [one_hot(x), one_hot(y_1), ..., one_hot(y_T)],
    shape (X * V**T, X + T*V), rows ordered like the (X, V**T) tables."""
    tokens = torch.as_tensor(index_to_tokens(np.arange(vocab_size**horizon), vocab_size, horizon))
    y_part = torch.nn.functional.one_hot(tokens, vocab_size).reshape(len(tokens), -1).to(torch.float32)
    x_part = torch.eye(n_prompts).repeat_interleave(len(tokens), dim=0)
    return torch.cat([x_part, y_part.repeat(n_prompts, 1)], dim=1)


def neural_energy_net(n_inputs: int, hidden: int, seed: int) -> torch.nn.Sequential:
    """The MLP energy E_theta(x, y): Linear -> SiLU -> Linear -> SiLU -> Linear(1) on one-hot (x, y) inputs,
    initialised from ``seed`` (under ``torch_init_seed``: parallel seeds share torch's global generator)."""
    with torch_init_seed(seed):
        return torch.nn.Sequential(
            torch.nn.Linear(n_inputs, hidden), torch.nn.SiLU(),
            torch.nn.Linear(hidden, hidden), torch.nn.SiLU(),
            torch.nn.Linear(hidden, 1),
        )


def neural_ebm_inputs(n_prompts: int, vocab_size: int, horizon: int) -> torch.Tensor:
    """:func:`one_hot_sequences` as (X, V**T, X + T*V): one block of every sequence per prompt."""
    return one_hot_sequences(n_prompts, vocab_size, horizon).reshape(n_prompts, vocab_size**horizon, -1)


def train_neural_ebm(target_logp: np.ndarray, vocab_size: int, horizon: int, hidden: int, steps: int, lr: float,
                     seed: int = 0, prompts_per_step: int | None = None) -> tuple[torch.nn.Sequential, list[float]]:
    """MLP energy E_theta(x, y) on one-hot inputs, p_theta(y|x) = softmax_y E_theta(x, .), trained by Adam (cosine
    decay) on the exact population NLL  -mean_x sum_y p_R(y|x) log p_theta(y|x)  (partition by enumeration).

    This is the EBM side of the supervised equivalence: the same objective as the ARM's teacher-forcing NLL
    under p_R (cross-entropy H(p_R, p_theta)). ``prompts_per_step`` (default: every prompt) draws that many
    prompts per step without replacement: the per-prompt term stays exact (its partition over every y), the
    step's loss is an unbiased estimate of the mean over prompts, and a step costs that fraction of a full one.
    Returns (the trained energy network, curve) where curve[k] is step k's loss (over its prompts).
    """
    target_logp = np.asarray(target_logp, dtype=np.float64)
    n_prompts = target_logp.shape[0]
    per_step = n_prompts if prompts_per_step is None else prompts_per_step
    if not 1 <= per_step <= n_prompts:
        raise ValueError(f"prompts_per_step must be in [1, {n_prompts}], got {prompts_per_step}")
    inputs = neural_ebm_inputs(n_prompts, vocab_size, horizon)
    energy_net = neural_energy_net(inputs.shape[-1], hidden, seed)
    weights = torch.as_tensor(np.exp(target_logp), dtype=torch.float32)
    optimizer = torch.optim.Adam(energy_net.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, steps))
    generator = torch.Generator().manual_seed(40_000 + seed)
    curve: list[float] = []
    for _ in range(steps):
        rows = (torch.arange(n_prompts) if per_step == n_prompts
                else torch.randperm(n_prompts, generator=generator)[:per_step])
        log_p = torch.log_softmax(energy_net(inputs[rows]).squeeze(-1), dim=1)
        loss = -(weights[rows] * log_p).sum(dim=1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        curve.append(float(loss.detach()))
    return energy_net, curve


def neural_ebm_log_probs(energy_net: torch.nn.Module, n_prompts: int, vocab_size: int, horizon: int) -> np.ndarray:
    """log p_theta(y|x) = log softmax_y E_theta(x, y) over every sequence, as (X, V**T) float64."""
    with torch.no_grad():
        energies = energy_net(neural_ebm_inputs(n_prompts, vocab_size, horizon)).squeeze(-1)
        return torch.log_softmax(energies.double(), dim=1).numpy()


def fit_neural_ebm(target_logp: np.ndarray, vocab_size: int, horizon: int, hidden: int, steps: int, lr: float,
                   seed: int = 0, prompts_per_step: int | None = None) -> tuple[np.ndarray, list[float]]:
    """:func:`train_neural_ebm` then :func:`neural_ebm_log_probs`: (log p_theta as (X, V**T) float64, curve)."""
    energy_net, curve = train_neural_ebm(target_logp, vocab_size, horizon, hidden, steps, lr, seed, prompts_per_step)
    return neural_ebm_log_probs(energy_net, np.asarray(target_logp).shape[0], vocab_size, horizon), curve


# ----------------------------------------------------------------------------------------------------
# Population cross-entropy of a causal ARM under p_R (the GPT-2's training objective)
# ----------------------------------------------------------------------------------------------------


def conditional_log_probs(q: Sequence[np.ndarray]) -> Tables:
    """log pi(a|s) = log softmax_a q_t(s, a) at every prefix-tree node: T arrays of shape (X, V**t, V)."""
    return [log_softmax(np.asarray(table, dtype=np.float64), axis=-1) for table in q]


def next_token_log_probs(logp: np.ndarray, vocab_size: int) -> Tables:
    """log p(a | s_t) = log p(s_t (+) a | x) - log p(s_t | x) of a sequence distribution (X, V**T), as T prefix-tree
    tables of shape (X, V**t, V); -inf where the prefix has no mass. For p_R it equals log softmax q* (C1)."""
    marginals = prefix_marginals(logp, vocab_size)
    n_prompts = marginals[0].shape[0]
    out = []
    with np.errstate(divide="ignore", invalid="ignore"):
        for t in range(len(marginals) - 1):
            parent = np.log(marginals[t])[..., None]
            child = np.log(marginals[t + 1]).reshape(n_prompts, vocab_size**t, vocab_size)
            out.append(np.where(np.isfinite(parent), child - parent, -np.inf))
    return out


def prefix_inputs_and_targets(samples: np.ndarray, target_log_pi: Sequence[np.ndarray], vocab_size: int
                              ) -> tuple[np.ndarray, np.ndarray]:
    """GPT-2 inputs [V + x, y_1, ..., y_{T-1}] (int64, (n, T)) and, at each position t, the target's whole
    next-token law pi_R(.|s_t) (float64, (n, T, V)), for sequences ``samples`` = [x, y_1, ..., y_T] (only the
    prefix y_<T is used, so samples of length >= T work).

    With these soft targets the per-sequence loss of :func:`population_cross_entropy` is
    sum_t CE(pi_R(.|s_t), pi_q(.|s_t)), the exact expectation over every next token given the prefix.
    """
    samples = np.asarray(samples, dtype=np.int64)
    n_prompts, _, horizon = _dims(target_log_pi)
    if samples.shape[1] < horizon:
        raise ValueError(f"samples need a prompt and at least T - 1 = {horizon - 1} tokens")
    prompts, tokens = samples[:, 0], samples[:, 1:horizon]
    ids = np.concatenate([prompt_token(prompts, vocab_size)[:, None], tokens], axis=1)
    targets = np.stack([np.exp(target_log_pi[t][prompts, sequence_index(tokens[:, :t], vocab_size)])
                        for t in range(horizon)], axis=1)
    return ids, targets


def all_prefixes(n_prompts: int, vocab_size: int, horizon: int) -> np.ndarray:
    """Every (x, y_1..y_{T-1}) as rows [x, y_1, ..., y_{T-1}] (int64, (X * V**(T-1), T)), prompt-major."""
    tails = index_to_tokens(np.arange(vocab_size ** (horizon - 1)), vocab_size, horizon - 1)
    prompts = np.repeat(np.arange(n_prompts), len(tails))
    return np.concatenate([prompts[:, None], np.tile(tails, (n_prompts, 1))], axis=1)


def prefix_weights(prefixes: np.ndarray, target_logp: np.ndarray, vocab_size: int) -> np.ndarray:
    """p_R(y_<T | x) / X for rows [x, y_1..y_{T-1}]: the weight that makes a sum over :func:`all_prefixes`
    the expectation over x ~ Uniform(prompts), y ~ p_R(.|x) (float64, (n,))."""
    prefixes = np.asarray(prefixes, dtype=np.int64)
    n_prompts = target_logp.shape[0]
    marginal = np.exp(target_logp).reshape(n_prompts, -1, vocab_size).sum(axis=2)  # p_R(y_<T | x)
    return marginal[prefixes[:, 0], sequence_index(prefixes[:, 1:], vocab_size)] / n_prompts


def population_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                             weights: torch.Tensor | None = None) -> torch.Tensor:
    """sum_i w_i sum_t CE(targets[i, t], softmax(logits[i, t, :V])); w = 1/n when ``weights`` is None.

    With the rows of :func:`all_prefixes` weighted by :func:`prefix_weights` this is exactly the population
    cross-entropy E_{x, y ~ p_R}[-log p_q(y|x)] = H(p_R) + KL(p_R || p_q) (chain rule over the prefix tree);
    with prefixes sampled from p_R and w = 1/n it is an unbiased estimate of it whose gradient vanishes at
    p_q = p_R on every sampled prefix (no label noise at the floor).
    """
    log_q = torch.log_softmax(logits[..., :vocab_size], dim=-1)
    per_row = -(targets * log_q).sum(dim=(1, 2))
    if weights is None:
        return per_row.mean()
    return (weights * per_row).sum()


def prefix_marginals(logp: np.ndarray, vocab_size: int) -> Tables:
    """p(s_t | x) for every prefix of length t = 0..T: T + 1 arrays of shape (X, V**t) (float64)."""
    prob = np.exp(np.asarray(logp, dtype=np.float64))
    n_prompts, width = prob.shape
    levels, size = [], 1
    while size <= width:
        levels.append(prob.reshape(n_prompts, size, width // size).sum(axis=2))
        size *= vocab_size
    return levels


def stepwise_kl(target_logp: np.ndarray, q: Sequence[np.ndarray]) -> np.ndarray:
    """Expected next-token KL at each step, averaged over prompts: shape (T,), entry t is
    mean_x sum_{s_t} p_R(s_t|x) KL(pi_R(.|s_t) || softmax q_t(s_t, .)).

    By the chain rule the entries sum to KL(p_R || p_q) (``kl_divergence(...).mean()``). Entry T - 1 is the
    last step, where every term of R is visible and no lookahead is needed; entries t < T - 1 need V(next).
    """
    n_prompts, vocab, horizon = _dims(q)
    marginals = prefix_marginals(target_logp, vocab)
    out = np.empty(horizon)
    for t in range(horizon):
        mass = marginals[t]  # (X, V**t)
        child = marginals[t + 1].reshape(n_prompts, vocab**t, vocab)
        with np.errstate(divide="ignore", invalid="ignore"):
            pi = np.where(mass[..., None] > 0, child / mass[..., None], 0.0)
            log_pi = np.where(pi > 0, np.log(pi), 0.0)
        log_q = log_softmax(np.asarray(q[t], dtype=np.float64), axis=-1)
        out[t] = float((mass * np.sum(np.where(pi > 0, pi * (log_pi - log_q), 0.0), axis=-1)).sum(axis=1).mean())
    return out


def mean_target_entropy(targets: np.ndarray) -> float:
    """Mean over rows of sum_t H(targets[i, t]) for next-token laws of shape (n, T, V): the entropy floor of
    :func:`population_cross_entropy` on those rows (0 log 0 = 0)."""
    targets = np.asarray(targets, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(targets > 0, -targets * np.log(targets), 0.0)
    return float(terms.sum(axis=(1, 2)).mean())
