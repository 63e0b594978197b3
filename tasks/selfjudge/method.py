"""SelfJudge as a pure library over any draft / target pair of causal LMs (no Prefect, no MLflow, no files).

Follows the official code (github.com/naver-aics/SelfJudge, derived from AutoJudge):

1. Mining (``mine_mismatches``). The target's greedy response Y is teacher-forced through the draft; every
   position m inside the response (not its last token) where the draft's argmax d_m differs from y_m is a
   mismatch. Each mismatch is scored against the ORIGINAL Y: Y' = Y with y_m replaced by d_m, one target
   forward pass on Y' (the continuation after m stays the original one).
2. Semantic-preservation score (``diff_n``), with rows t of the log-prob tables predicting token t+1:
   diff_N = mean_{t=m-1}^{m+N-1} max_v log p_T(v | Y_<=t)
            - mean( [log p_T(d_m | Y_<m)] u {max_v log p_T(v | Y'_<=t)}_{t=m}^{m+N-1} ),
   both means of N+1 terms, windows truncated at the sequence end. Labels: important = 1[diff_N > tau_N].
3. Head (``fit_judge_head``): StandardScaler + LogisticRegression(C) on the target's last-layer hidden state at
   position m of Y' (label from the threshold) plus the hidden state at position m of Y (extra negatives, label
   0); C on the grid (10^0.5)^-k selected by validation ROC-AUC.
4. Judge decoding (``speculative_generate`` with ``JudgeRule``): the draft proposes gamma tokens, one target
   pass scores them; position i is accepted iff draft == target argmax OR p_head(h_i) < threshold, the accepted
   length is the run of leading accepted positions, and the target's own token is emitted at the first rejected
   position (or after a fully accepted window, the bonus token of standard speculative decoding).
5. Baselines: exact speculative decoding (``ExactRule``, lossless for greedy decoding) and top-K acceptance
   (``TopKRule``); AutoJudge-style labels (``autojudge_labels``): a substitution is important iff the target's
   greedy regeneration after it changes the final answer (the official AutoJudge search is semi-greedy; here one
   greedy regeneration per mismatch - a simplification).

Speed is counted in target forward passes, not seconds: ``DecodeTrace.target_calls`` counts one call per
verification window, and tokens per target call (``tokens / target_calls``) is the speed proxy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

# ---------------------------------------------------------------------------------------------------------
# Memoised causal LM: a causal LM's outputs at position t depend only on tokens <= t, so one forward pass on a
# sequence gives the next-token prediction of every one of its prefixes. Memoising them by prefix makes many
# decoding runs over the same prompts cheap; the decoding algorithms count target calls themselves.
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefixInfo:
    """What a causal LM says after a prefix: its greedy next token, its top-K next tokens (best first) and the
    last-layer hidden state at the prefix's last position (None unless kept)."""

    argmax: int
    top: tuple[int, ...]
    hidden: np.ndarray | None


class MemoLM:
    """A causal LM queried by prefix; ``run(ids)`` computes (once) the info of every prefix of ``ids``."""

    def __init__(self, model: torch.nn.Module, top_k: int = 1, keep_hidden: bool = False,
                 device: str | torch.device = "cpu"):
        self.model, self.top_k, self.keep_hidden, self.device = model, max(1, top_k), keep_hidden, device
        self.memo: dict[tuple[int, ...], PrefixInfo] = {}
        self.forward_passes = 0

    @torch.no_grad()
    def run(self, ids: Sequence[int]) -> None:
        key = tuple(int(i) for i in ids)
        if key in self.memo:
            return
        input_ids = torch.tensor([key], dtype=torch.long, device=self.device)
        out = self.model(input_ids=input_ids, output_hidden_states=self.keep_hidden)
        self.forward_passes += 1
        logits = out.logits[0].float()
        top = torch.topk(logits, self.top_k, dim=-1).indices.tolist()
        greedy = logits.argmax(dim=-1).tolist()
        hidden = out.hidden_states[-1][0].float().cpu().numpy() if self.keep_hidden else None
        for t in range(len(key)):
            self.memo.setdefault(key[: t + 1], PrefixInfo(int(greedy[t]), tuple(int(v) for v in top[t]),
                                                          None if hidden is None else hidden[t].copy()))

    def info(self, ids: Sequence[int]) -> PrefixInfo:
        key = tuple(int(i) for i in ids)
        if key not in self.memo:
            self.run(key)
        return self.memo[key]


# ---------------------------------------------------------------------------------------------------------
# Acceptance rules (Section "judge decoding"; acceptance check (a)3)
# ---------------------------------------------------------------------------------------------------------


def accepted_length(accept_mask: Sequence[bool]) -> int:
    """Number of leading accepted positions: the cumulative product of the mask, summed (first failure stops)."""
    n = 0
    for accepted in accept_mask:
        if not accepted:
            break
        n += 1
    return n


def judge_accept_mask(match: Sequence[bool], p_head: Sequence[float], threshold: float) -> list[bool]:
    """Position i is accepted iff the draft token equals the target argmax OR p_head_i < threshold.

    Threshold 0 never accepts a mismatch (p >= 0), so judge decoding reduces to exact speculative decoding."""
    if len(match) != len(p_head):
        raise ValueError(f"match ({len(match)}) and p_head ({len(p_head)}) differ in length")
    return [bool(m) or float(p) < threshold for m, p in zip(match, p_head)]


def topk_accept_mask(proposal: Sequence[int], target_top: Sequence[Sequence[int]], k: int) -> list[bool]:
    """Position i is accepted iff the draft token is among the target's top-k tokens there (lossy baseline)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return [int(tok) in tuple(top)[:k] for tok, top in zip(proposal, target_top)]


@dataclass(frozen=True)
class Window:
    """One verification window: the draft's proposal and, per position i, the target's view of it."""

    proposal: list[int]
    target_argmax: list[int]        # target greedy token for position i (after prefix + proposal[:i]); len+1
    target_top: list[tuple[int, ...]]  # target top-K for position i; len+1
    hidden: list[np.ndarray | None]  # target hidden state at the position where proposal[i] is the input


class AcceptRule(Protocol):
    def __call__(self, window: Window) -> list[bool]: ...


class ExactRule:
    """Standard (lossless) speculative decoding for greedy targets: accept iff draft == target argmax."""

    def __call__(self, window: Window) -> list[bool]:
        return [p == t for p, t in zip(window.proposal, window.target_argmax)]


@dataclass(frozen=True)
class TopKRule:
    k: int

    def __call__(self, window: Window) -> list[bool]:
        return topk_accept_mask(window.proposal, window.target_top[: len(window.proposal)], self.k)


@dataclass(frozen=True)
class JudgeHead:
    """StandardScaler + logistic regression: p = sigmoid(coef . (h - mean) / scale + intercept)."""

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float
    c: float = math.nan
    val_auroc: float = math.nan

    def probability(self, hidden: np.ndarray) -> np.ndarray:
        """p_head of each row of ``hidden`` (or of one vector): the probability that the token is important."""
        z = ((np.asarray(hidden, dtype=np.float64) - self.mean) / self.scale) @ self.coef + self.intercept
        return 1.0 / (1.0 + np.exp(-z))


@dataclass
class JudgeRule:
    """SelfJudge acceptance: draft == target argmax OR p_head(hidden) < threshold."""

    head: JudgeHead
    threshold: float

    def __call__(self, window: Window) -> list[bool]:
        match = [p == t for p, t in zip(window.proposal, window.target_argmax)]
        if self.threshold <= 0:
            return match
        probs = [1.0 if m else float(self.head.probability(h)) for m, h in zip(match, window.hidden)]
        return judge_accept_mask(match, probs, self.threshold)


# ---------------------------------------------------------------------------------------------------------
# Speculative generation (one prompt)
# ---------------------------------------------------------------------------------------------------------


@dataclass
class DecodeTrace:
    tokens: list[int]                 # generated tokens (without the prompt), eos included if reached
    target_calls: int = 0
    drafted: int = 0                  # draft tokens proposed
    accepted_draft: int = 0           # draft tokens accepted
    accepted_mismatches: int = 0      # accepted draft tokens that differ from the target argmax (lossy)
    window_accepts: list[int] = field(default_factory=list)


def greedy_generate(lm: MemoLM, prompt: Sequence[int], max_new_tokens: int, eos_id: int) -> list[int]:
    """The target alone: greedy decoding, one (memoised) prediction per token."""
    out = [int(t) for t in prompt]
    generated: list[int] = []
    while len(generated) < max_new_tokens:
        token = lm.info(out).argmax
        out.append(token)
        generated.append(token)
        if token == eos_id:
            break
    return generated


def speculative_generate(target: MemoLM, draft: MemoLM, prompt: Sequence[int], max_new_tokens: int, gamma: int,
                         eos_id: int, rule: AcceptRule) -> DecodeTrace:
    """Draft-then-verify decoding. Per window: the draft greedily proposes up to gamma tokens (stopping at eos
    or the budget), ONE target call scores prefix + proposal, ``rule`` gives the accept mask, the leading
    accepted tokens are kept and the target's token at the first rejected position (or the bonus position
    after a fully accepted window) is appended. Stops at eos or ``max_new_tokens``."""
    if gamma < 1 or max_new_tokens < 1:
        raise ValueError(f"gamma and max_new_tokens must be >= 1, got {gamma} and {max_new_tokens}")
    out = [int(t) for t in prompt]
    trace = DecodeTrace(tokens=[])
    while len(trace.tokens) < max_new_tokens and not (trace.tokens and trace.tokens[-1] == eos_id):
        budget = max_new_tokens - len(trace.tokens)
        proposal: list[int] = []
        while len(proposal) < min(gamma, budget - 1 if budget > 1 else 1):
            token = draft.info(out + proposal).argmax
            proposal.append(token)
            if token == eos_id:
                break
        target.run(out + proposal)
        trace.target_calls += 1
        infos = [target.info(out + proposal[:i]) for i in range(len(proposal) + 1)]
        window = Window(proposal, [x.argmax for x in infos], [x.top for x in infos],
                        [target.info(out + proposal[: i + 1]).hidden for i in range(len(proposal))])
        n_acc = accepted_length(rule(window))
        emitted = proposal[:n_acc]
        trace.drafted += len(proposal)
        trace.accepted_draft += n_acc
        trace.accepted_mismatches += sum(p != t for p, t in zip(emitted, window.target_argmax))
        trace.window_accepts.append(n_acc)
        if not (emitted and emitted[-1] == eos_id) and len(emitted) < budget:
            emitted = emitted + [window.target_argmax[n_acc]]
        for token in emitted:
            out.append(token)
            trace.tokens.append(token)
            if token == eos_id:
                break
    return trace


# ---------------------------------------------------------------------------------------------------------
# Mining and the semantic-preservation score
# ---------------------------------------------------------------------------------------------------------


def diff_n(logp_orig: torch.Tensor, logp_sub: torch.Tensor, m: int, substitute: int, n: int) -> float:
    """diff_N of a substitution at position m (module docstring, step 2); rows t predict token t+1.

    The window t = m..m+N-1 is truncated at the last row that predicts a token of the sequence (L-2)."""
    length = logp_orig.shape[0]
    if not 1 <= m <= length - 1:
        raise ValueError(f"m must lie in [1, {length - 1}], got {m}")
    last = min(m + n - 1, length - 2)
    orig_terms = [logp_orig[m - 1].max()] + [logp_orig[t].max() for t in range(m, last + 1)]
    sub_terms = [logp_orig[m - 1, substitute]] + [logp_sub[t].max() for t in range(m, last + 1)]
    return float(torch.stack(orig_terms).double().mean() - torch.stack(sub_terms).double().mean())


@dataclass(frozen=True)
class Mismatch:
    position: int            # m, index in the full sequence (prompt + response)
    original: int            # y_m
    substitute: int          # d_m
    diff: float              # diff_N
    hidden_sub: np.ndarray   # target last-layer hidden state at m of Y'
    hidden_orig: np.ndarray  # target last-layer hidden state at m of Y


def substituted_sequences(sequence: torch.Tensor, positions: Sequence[int], substitutes: Sequence[int]
                          ) -> torch.Tensor:
    """One row per mismatch: the ORIGINAL sequence with only its own position replaced (acceptance check (a)5)."""
    rows = sequence.unsqueeze(0).repeat(len(positions), 1)
    for row, (m, d) in enumerate(zip(positions, substitutes)):
        rows[row, m] = int(d)
    return rows


@torch.no_grad()
def mine_mismatches(target: torch.nn.Module, draft: torch.nn.Module, sequence: Sequence[int], response_start: int,
                    n: int, device: str | torch.device = "cpu") -> list[Mismatch]:
    """Every draft/target mismatch of the target's response Y = sequence[response_start:], scored by diff_N.

    ``sequence`` is prompt + Y (Y the target's greedy output). Mismatch positions m run over
    [response_start, L-2]: inside the response, not its last token."""
    ids = torch.tensor([list(sequence)], dtype=torch.long, device=device)
    draft_pred = draft(input_ids=ids).logits[0].argmax(dim=-1)
    positions = [m for m in range(max(1, response_start), ids.shape[1] - 1)
                 if int(draft_pred[m - 1]) != int(ids[0, m])]
    if not positions:
        return []
    substitutes = [int(draft_pred[m - 1]) for m in positions]
    orig = target(input_ids=ids, output_hidden_states=True)
    sub = target(input_ids=substituted_sequences(ids[0], positions, substitutes), output_hidden_states=True)
    logp_orig = torch.log_softmax(orig.logits[0].float(), dim=-1)
    logp_sub = torch.log_softmax(sub.logits.float(), dim=-1)
    h_orig, h_sub = orig.hidden_states[-1][0].float().cpu().numpy(), sub.hidden_states[-1].float().cpu().numpy()
    return [Mismatch(m, int(ids[0, m]), d, diff_n(logp_orig, logp_sub[row], m, d, n), h_sub[row, m].copy(),
                     h_orig[m].copy())
            for row, (m, d) in enumerate(zip(positions, substitutes))]


def autojudge_labels(target: torch.nn.Module, items: Sequence[tuple[Sequence[int], int, int, int]],
                     max_new_tokens: int, eos_id: int, answer_of: Callable[[list[int]], object],
                     device: str | torch.device = "cpu") -> list[int]:
    """AutoJudge-style labels (need a verifiable answer). Item = (sequence, position m, substitute d, response
    start): 1 iff putting d at m and letting the target regenerate greedily changes the final answer."""
    prefixes = [list(seq[:m]) + [int(d)] for seq, m, d, _ in items]
    continuations = batch_greedy(target, prefixes, max_new_tokens, eos_id, device)
    labels = []
    for (seq, _, d, start), prefix, cont in zip(items, prefixes, continuations):
        regenerated = prefix if int(d) == eos_id else prefix + cont
        labels.append(int(answer_of(regenerated[start:]) != answer_of(list(seq[start:]))))
    return labels


@torch.no_grad()
def batch_greedy(model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int, eos_id: int,
                 device: str | torch.device = "cpu") -> list[list[int]]:
    """Greedy continuation of each prompt (eos included when reached), prompts batched by equal length (no
    padding, so each row is exactly the unbatched computation up to float reduction order)."""
    out: list[list[int]] = [[] for _ in prompts]
    by_length: dict[int, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(index)
    for indices in by_length.values():
        ids = torch.tensor([list(prompts[i]) for i in indices], dtype=torch.long, device=device)
        done = torch.zeros(len(indices), dtype=torch.bool, device=device)
        for _ in range(max_new_tokens):
            nxt = model(input_ids=ids).logits[:, -1].argmax(dim=-1)
            for row, index in enumerate(indices):
                if not done[row]:
                    out[index].append(int(nxt[row]))
            done |= nxt == eos_id
            if bool(done.all()):
                break
            ids = torch.cat([ids, nxt[:, None]], dim=1)
    return out


# ---------------------------------------------------------------------------------------------------------
# Labels and the head
# ---------------------------------------------------------------------------------------------------------


def label_threshold(diffs: Sequence[float], quantile: float) -> float:
    """tau_N: the ``quantile`` of diff_N over the mined mismatches (0.6 gives 40% positives)."""
    return float(np.quantile(np.asarray(diffs, dtype=np.float64), quantile))


def auroc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """ROC-AUC = P(score of a positive > score of a negative) + 0.5 P(tie); NaN without both classes."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    pos, neg = s[y == 1], s[y == 0]
    if len(pos) == 0 or len(neg) == 0:
        return math.nan
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))


def c_grid(size: int) -> list[float]:
    """The official grid C = (10^0.5)^-k, k = 0..size-1."""
    return [float(10 ** (-0.5 * k)) for k in range(size)]


def fit_judge_head(features: np.ndarray, labels: np.ndarray, val_fraction: float, c_values: Sequence[float],
                   seed: int, max_iter: int = 2000) -> JudgeHead:
    """StandardScaler + LogisticRegression(C) with C chosen by validation ROC-AUC (refit on train rows only)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x, y = np.asarray(features, dtype=np.float64), np.asarray(labels, dtype=np.int64)
    if len(set(y.tolist())) < 2:
        raise ValueError("the head needs both classes among its labels")
    order = np.random.default_rng(seed).permutation(len(y))
    n_val = max(1, int(round(val_fraction * len(y))))
    val, train = order[:n_val], order[n_val:]
    scaler = StandardScaler().fit(x[train])
    best: tuple[float, float, LogisticRegression] | None = None
    for c in c_values:
        model = LogisticRegression(C=c, max_iter=max_iter).fit(scaler.transform(x[train]), y[train])
        score = auroc(model.decision_function(scaler.transform(x[val])), y[val])
        if best is None or (not math.isnan(score) and (math.isnan(best[0]) or score > best[0])):
            best = (score, c, model)
    assert best is not None
    score, c, model = best
    scale = np.where(scaler.scale_ > 0, scaler.scale_, 1.0)
    return JudgeHead(scaler.mean_.copy(), scale, model.coef_[0].astype(np.float64), float(model.intercept_[0]),
                     c=c, val_auroc=score)


def head_training_set(mismatches: Sequence[Mismatch], tau: float) -> tuple[np.ndarray, np.ndarray]:
    """Features and labels of the head: hidden at m of Y' labelled 1[diff > tau], plus hidden at m of Y labelled
    0 (the official extra negatives)."""
    if not mismatches:
        raise ValueError("no mismatches to train on")
    x = [mm.hidden_sub for mm in mismatches] + [mm.hidden_orig for mm in mismatches]
    y = [int(mm.diff > tau) for mm in mismatches] + [0] * len(mismatches)
    return np.stack(x), np.asarray(y, dtype=np.int64)


def accuracy_at_speed(points: Sequence[tuple[float, float]], speed: float) -> float:
    """Accuracy of a threshold sweep at a given speed (tokens per target call), by linear interpolation between
    the sweep's (speed, accuracy) points sorted by speed; NaN when ``speed`` lies outside the swept range.
    Points with equal speed are averaged first. Used to compare methods at equal accepted length."""
    by_speed: dict[float, list[float]] = {}
    for s, a in points:
        by_speed.setdefault(float(s), []).append(float(a))
    xs = sorted(by_speed)
    ys = [float(np.mean(by_speed[x])) for x in xs]
    if not xs or speed < xs[0] or speed > xs[-1]:
        return math.nan
    return float(np.interp(speed, xs, ys))
