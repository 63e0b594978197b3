"""Select to Think (S2T) and S2T-Local over any pair of causal LMs (a pure library: no Prefect, no MLflow).

Ye et al., "Select to Think: Unlocking SLM Potential with Local Sufficiency" (arXiv 2604.26940). The
method follows the paper's official code (github.com/YeRona/Select-to-Think; README "Fidelity checklist"):

- divergence triggers: KL(p_SLM || p_LLM) on the SLM's top-64 support, both renormalised there, above a
  calibration quantile; the SLM's entropy on the same support; a random trigger; none in the warm-up steps;
- candidate sets: the SLM's top-K, or the tokens with p > r * p_max;
- S2T: at a trigger the LLM picks argmax_{c in candidates} p_LLM(c | prefix); Takeover: the LLM's full argmax;
- S2T-Local: B reserved output rows are score bins, score(c) = sum_b softmax(bins)_b * b / (B - 1) read at
  prefix + c; the four-part loss; training that moves only the reserved rows of the output layer (besides the
  body); at a trigger the SLM emits argmax_c score(c) without the LLM.

A "model" is anything called as ``model(input_ids=...)`` returning an object with ``.logits`` of shape
(B, L, V) (Hugging Face causal LMs). Reserved rows are masked to -inf in normal decoding.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

NEG_INF = float("-inf")


# ------------------------------------------------------------------------------------------------
# Normal decoding with reserved rows
# ------------------------------------------------------------------------------------------------

def mask_reserved(logits: torch.Tensor, reserved_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """Logits with the reserved (score-bin) rows at -inf, so they never win in normal decoding
    (S2T-Local: the score bins are masked to -inf in normal decoding)."""
    if len(reserved_ids) == 0:
        return logits
    index = torch.as_tensor(reserved_ids, dtype=torch.long, device=logits.device)
    return logits.index_fill(-1, index, NEG_INF)


def next_token_logits(model: Any, input_ids: torch.Tensor, reserved_ids: Sequence[int] = (),
                      vocab_size: int | None = None) -> torch.Tensor:
    """(B, V) float32 logits of the next token after each row of ``input_ids`` (rows of equal length, no
    padding), reserved rows masked; ``vocab_size`` cuts padded output rows so two models share one vocabulary."""
    with torch.no_grad():
        logits = model(input_ids=input_ids).logits[:, -1].float()
    return cut_and_mask(logits, reserved_ids, vocab_size)


def cut_and_mask(logits: torch.Tensor, reserved_ids: Sequence[int], vocab_size: int | None) -> torch.Tensor:
    """(B, V) logits cut to the first ``vocab_size`` rows (None: all), reserved rows masked. Reserved rows at or
    beyond ``vocab_size`` (the paper profile's bins sit in the padding past the tokenizer) are cut already."""
    if vocab_size is None:
        return mask_reserved(logits, reserved_ids)
    return mask_reserved(logits[:, :vocab_size], [i for i in reserved_ids if i < vocab_size])


# ------------------------------------------------------------------------------------------------
# Divergence triggers (divergence points)
# ------------------------------------------------------------------------------------------------

def support_top(slm_logits: torch.Tensor, support_size: int) -> torch.Tensor:
    """(B, S) ids of the SLM's top-S tokens (S clipped to the number of finite logits)."""
    finite = int(torch.isfinite(slm_logits).sum(-1).min())
    return slm_logits.topk(min(support_size, finite), dim=-1).indices


def kl_on_support(slm_logits: torch.Tensor, llm_logits: torch.Tensor, support_size: int = 64) -> torch.Tensor:
    """KL(p_SLM || p_LLM) with both distributions renormalised on the SLM's top-``support_size`` tokens.

    Renormalising = a log-softmax over the gathered logits (the official code's trigger score)."""
    support = support_top(slm_logits, support_size)
    log_p = torch.log_softmax(slm_logits.gather(-1, support), dim=-1)
    log_q = torch.log_softmax(llm_logits.gather(-1, support), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def entropy_on_support(slm_logits: torch.Tensor, support_size: int = 64) -> torch.Tensor:
    """The SLM's entropy on its own top-``support_size`` tokens (the LLM-free trigger score)."""
    log_p = torch.log_softmax(slm_logits.gather(-1, support_top(slm_logits, support_size)), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def calibrate_threshold(scores: Sequence[float] | np.ndarray | torch.Tensor, quantile: float) -> float:
    """The trigger threshold: the ``quantile`` of the scores collected on calibration problems
    (official code: q = 0.99 over 20 problems, so about 1% of steps fire)."""
    values = np.asarray(scores.cpu() if isinstance(scores, torch.Tensor) else scores, dtype=float).ravel()
    if values.size == 0:
        raise ValueError("calibrate_threshold: no calibration scores (every step was in the warm-up?)")
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    return float(np.quantile(values, quantile))


def threshold_trigger(scores: torch.Tensor, threshold: float, step: int, warmup_steps: int) -> torch.Tensor:
    """(B,) bool: fire where score > threshold, never during the first ``warmup_steps`` generated steps."""
    if step < warmup_steps:
        return torch.zeros_like(scores, dtype=torch.bool)
    return scores > threshold


def random_trigger(batch: int, rate: float, step: int, warmup_steps: int, generator: torch.Generator
                   ) -> torch.Tensor:
    """(B,) bool: Bernoulli(rate) after the warm-up (the official code's random-trigger control)."""
    draws = torch.rand(batch, generator=generator)
    if step < warmup_steps:
        return torch.zeros(batch, dtype=torch.bool)
    return draws < rate


# ------------------------------------------------------------------------------------------------
# Candidate sets and selection
# ------------------------------------------------------------------------------------------------

def top_k_candidates(slm_logits: torch.Tensor, k: int) -> torch.Tensor:
    """(B, k) ids of the SLM's top-k tokens, most probable first."""
    return slm_logits.topk(k, dim=-1).indices


def ratio_candidates(slm_logits: torch.Tensor, ratio: float = 0.1) -> torch.Tensor:
    """(B, V) bool: tokens with p > ratio * p_max (the official code's alternative candidate set)."""
    probs = torch.softmax(slm_logits, dim=-1)
    return probs > ratio * probs.max(dim=-1, keepdim=True).values


def ids_to_mask(candidates: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(B, K) ids -> (B, V) bool membership mask."""
    mask = torch.zeros(candidates.shape[0], vocab_size, dtype=torch.bool, device=candidates.device)
    return mask.scatter(-1, candidates, True)


def s2t_select(llm_logits: torch.Tensor, candidate_mask: torch.Tensor) -> torch.Tensor:
    """S2T: argmax over the candidates of the LLM's logits (= of p_LLM(c | prefix))."""
    return llm_logits.masked_fill(~candidate_mask, NEG_INF).argmax(-1)


def takeover_select(llm_logits: torch.Tensor) -> torch.Tensor:
    """Takeover baseline: the LLM's argmax over the full (unreserved) vocabulary."""
    return llm_logits.argmax(-1)


def hit_at_k(slm_logits: torch.Tensor, llm_logits: torch.Tensor, ks: Sequence[int]) -> dict[int, torch.Tensor]:
    """Local sufficiency (claim C1): per row, is the LLM's argmax among the SLM's top-k? One (B,) bool per k."""
    target = llm_logits.argmax(-1, keepdim=True)
    return {k: (top_k_candidates(slm_logits, k) == target).any(-1) for k in ks}


def random_ranking_hit_probability(valid_count: int, target_valid: bool, k: int, vocab: int) -> float:
    """Chance level of hit@k at one trigger step (C1b), exactly: the probability that a ranker which lists the
    ``valid_count`` tokens the format allows at the step in a uniformly random order, then the other
    ``vocab - valid_count`` tokens in a uniformly random order, puts the target in its top-k.

    A valid target is uniform over ranks 0 .. n-1: min(k, n) / n. An invalid one is uniform over ranks
    n .. V-1: min(max(k - n, 0), V - n) / (V - n). With n = V (no format known) both give min(k, V) / V."""
    if not 1 <= valid_count <= vocab or k < 0:
        raise ValueError(f"need 1 <= valid_count ({valid_count}) <= vocab ({vocab}) and k ({k}) >= 0")
    if target_valid:
        return min(k, valid_count) / valid_count
    if valid_count == vocab:
        raise ValueError("the target is outside a format that allows every token")
    return min(max(k - valid_count, 0), vocab - valid_count) / (vocab - valid_count)


def chance_corrected_hit(hit: float, chance: float) -> float:
    """(hit - chance) / (1 - chance) (C1b): the share of the headroom above chance that the SLM's top-k closes
    (1: every target found; 0: no better than the random ranking; negative: worse). Equals ``hit`` when chance
    is 0 (a large vocabulary), so the paper's bar on hit@8 carries over unchanged. NaN when chance is 1 (no
    headroom: the claim cannot be tested)."""
    return (hit - chance) / (1.0 - chance) if chance < 1.0 else math.nan


# ------------------------------------------------------------------------------------------------
# S2T-Local: score bins in the output layer
# ------------------------------------------------------------------------------------------------

def bin_ids(first_reserved_id: int, n_bins: int) -> list[int]:
    """The reserved output rows used as score bins (unused token ids)."""
    return list(range(first_reserved_id, first_reserved_id + n_bins))


def bin_levels(n_bins: int, dtype: torch.dtype = torch.float32, device: Any = None) -> torch.Tensor:
    """The value b / (B - 1) of each bin b = 0..B-1 (bin 0 -> 0, bin B-1 -> 1)."""
    return torch.arange(n_bins, dtype=dtype, device=device) / (n_bins - 1)


def bin_score(bin_logits: torch.Tensor) -> torch.Tensor:
    """score = sum_b softmax(bins)_b * b / (B - 1): the expected bin, in [0, 1]."""
    levels = bin_levels(bin_logits.shape[-1], bin_logits.dtype, bin_logits.device)
    return (torch.softmax(bin_logits, dim=-1) * levels).sum(-1)


def candidate_inputs(prefixes: torch.Tensor, lengths: torch.Tensor, candidates: torch.Tensor, pad_id: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(G*K, Lmax+1) inputs ``prefix + c`` right-padded, and the (G*K,) position of c in each row.

    Right padding is safe for a causal LM: the logits at the position of c see no later token."""
    groups, k = candidates.shape
    width = int(lengths.max()) + 1
    rows = torch.full((groups, width), pad_id, dtype=torch.long, device=prefixes.device)
    keep = min(prefixes.shape[1], width)
    rows[:, :keep] = prefixes[:, :keep]
    position = torch.arange(width, device=prefixes.device)
    rows = rows.masked_fill(position >= lengths[:, None], pad_id)
    rows = rows.repeat_interleave(k, dim=0)
    at = lengths.repeat_interleave(k)
    rows[torch.arange(groups * k, device=rows.device), at] = candidates.reshape(-1)
    return rows, at


def candidate_scores(model: Any, prefixes: torch.Tensor, lengths: torch.Tensor, candidates: torch.Tensor,
                     reserved: Sequence[int], pad_id: int = 0, return_logits: bool = False
                     ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(G, K) bin scores of each candidate: feed prefix + c, read the bin logits at the position of c.

    With ``return_logits`` also returns the full (G*K, Lmax+1, V) logits (for the frozen-copy KL)."""
    inputs, at = candidate_inputs(prefixes, lengths, candidates, pad_id)
    logits = model(input_ids=inputs).logits
    index = torch.as_tensor(list(reserved), dtype=torch.long, device=logits.device)
    bins = logits[torch.arange(inputs.shape[0], device=logits.device), at][:, index]
    scores = bin_score(bins.float()).reshape(candidates.shape)
    return (scores, logits) if return_logits else scores


def local_select(scores: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """S2T-Local inference: the candidate with the highest bin score."""
    return candidates.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)


# ------------------------------------------------------------------------------------------------
# S2T-Local loss per group, parts (i)-(iv) (README "Fidelity checklist")
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LocalLossWeights:
    kl_weight: float = 0.1
    frozen_kl_weight: float = 0.1
    hinge_margin: float = 1.0


def selection_ce(scores: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """(i) cross-entropy of softmax over the group's scores against the teacher's argmax candidate."""
    return F.cross_entropy(scores, best, reduction="none")


def hinge_loss(scores: torch.Tensor, best: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """(ii) max(0, margin - (s_best - s_hardest negative)); the hardest negative is the top-scored other."""
    s_best = scores.gather(-1, best[:, None]).squeeze(-1)
    return torch.clamp(margin - (s_best - hardest_negative(scores, best)), min=0.0)


def hardest_negative(scores: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """(G,) the highest score among the candidates other than ``best``."""
    return scores.scatter(-1, best[:, None], NEG_INF).max(-1).values


def teacher_kl(scores: torch.Tensor, teacher_probs: torch.Tensor) -> torch.Tensor:
    """(iii) KL(p_teacher-on-candidates || softmax(scores)), the teacher's probabilities renormalised."""
    target = teacher_probs / teacher_probs.sum(-1, keepdim=True).clamp_min(1e-12)
    log_q = torch.log_softmax(scores, dim=-1)
    return (target * (torch.log(target.clamp_min(1e-12)) - log_q)).where(target > 0, 0.0).sum(-1)


def frozen_token_kl(logits: torch.Tensor, frozen_logits: torch.Tensor, lengths: torch.Tensor,
                    reserved: Sequence[int]) -> torch.Tensor:
    """(iv) per group: mean over prefix positions p < length of KL(p_frozen || p_model), normal-decoding
    distributions (reserved rows masked). The position of the action token c is excluded."""
    log_p = torch.log_softmax(mask_reserved(frozen_logits.float(), reserved), dim=-1)
    log_q = torch.log_softmax(mask_reserved(logits.float(), reserved), dim=-1)
    finite = torch.isfinite(log_p)
    per_position = (log_p.exp() * (log_p - log_q)).where(finite, 0.0).sum(-1)
    positions = torch.arange(logits.shape[1], device=logits.device)
    inside = (positions[None, :] < lengths[:, None]).float()
    return (per_position * inside).sum(-1) / inside.sum(-1).clamp_min(1.0)


def local_loss(scores: torch.Tensor, teacher_probs: torch.Tensor, weights: LocalLossWeights,
               frozen_kl: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """The four-part loss, averaged over groups: (i) + (ii) + w_kl (iii) + w_frozen (iv)."""
    best = teacher_probs.argmax(-1)
    parts = {"ce": selection_ce(scores, best).mean(),
             "hinge": hinge_loss(scores, best, weights.hinge_margin).mean(),
             "teacher_kl": teacher_kl(scores, teacher_probs).mean(),
             "frozen_kl": frozen_kl.mean() if frozen_kl is not None else scores.new_zeros(())}
    parts["total"] = (parts["ce"] + parts["hinge"] + weights.kl_weight * parts["teacher_kl"]
                      + weights.frozen_kl_weight * parts["frozen_kl"])
    return parts


# ------------------------------------------------------------------------------------------------
# S2T-Local training: only the reserved rows of the output layer move (besides the body)
# ------------------------------------------------------------------------------------------------

def output_layer(model: Any) -> torch.nn.Linear:
    head = model.get_output_embeddings()
    if head is model.get_input_embeddings() or head.weight is model.get_input_embeddings().weight:
        raise ValueError("S2T-Local needs an untied lm_head (tie_word_embeddings=False): a tied head would move "
                         "the input embeddings of the reserved ids and every row through the body's update")
    return head


def restrict_output_rows(model: Any, reserved: Sequence[int]) -> torch.utils.hooks.RemovableHandle:
    """A gradient hook that zeroes the gradient of every non-reserved row of ``lm_head`` (official code)."""
    weight = output_layer(model).weight
    keep = torch.zeros(weight.shape[0], 1, dtype=weight.dtype, device=weight.device)
    keep[list(reserved)] = 1.0
    return weight.register_hook(lambda grad: grad * keep)


def local_optimizer(model: Any, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay 0 on ``lm_head``: decoupled decay would shrink the frozen rows (acceptance a3).
    Parameters without a gradient (a frozen body) are left out."""
    head = output_layer(model)
    head_params = {id(p) for p in head.parameters()}
    body = [p for p in model.parameters() if id(p) not in head_params and p.requires_grad]
    groups = [{"params": list(head.parameters()), "weight_decay": 0.0}]
    if body:
        groups.insert(0, {"params": body, "weight_decay": weight_decay})
    return torch.optim.AdamW(groups, lr=lr)


def frozen_rows_change(before: torch.Tensor, after: torch.Tensor, reserved: Sequence[int]) -> float:
    """max |W_after - W_before| over the non-reserved rows of lm_head (0.0 exactly when untouched)."""
    keep = torch.ones(before.shape[0], dtype=torch.bool)
    keep[list(reserved)] = False
    return float((after[keep] - before[keep]).abs().max())


@dataclass
class CandidateGroups:
    """Collected trigger steps: right-padded prefixes, their lengths, K candidate ids, the teacher's
    absolute probabilities on them (S2T-Local's training data)."""

    prefixes: torch.Tensor
    lengths: torch.Tensor
    candidates: torch.Tensor
    teacher_probs: torch.Tensor

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def subset(self, index: torch.Tensor) -> CandidateGroups:
        return CandidateGroups(self.prefixes[index], self.lengths[index], self.candidates[index],
                               self.teacher_probs[index])


@dataclass
class LocalTrainingLog:
    total: list[float] = field(default_factory=list)
    ce: list[float] = field(default_factory=list)
    hinge: list[float] = field(default_factory=list)
    teacher_kl: list[float] = field(default_factory=list)
    frozen_kl: list[float] = field(default_factory=list)


def train_s2t_local(model: Any, groups: CandidateGroups, reserved: Sequence[int], epochs: int, batch_groups: int,
                    lr: float, weight_decay: float, weights: LocalLossWeights, seed: int, pad_id: int = 0,
                    on_step: Callable[[int, int], None] | None = None, train_body: bool = True
                    ) -> LocalTrainingLog:
    """Train the SLM's bins and body on collected groups with the four-part loss (gradient clip 1.0).

    A frozen copy of the model at entry gives loss (iv). ``train_body=False``: only the reserved rows of
    ``lm_head`` are trained (the body is frozen, a linear read-out of the SLM's own features; the project's
    control, not the paper's LoRA): the normal-decoding distribution then cannot move, loss (iv) is 0
    identically and is not computed."""
    if len(groups) == 0:
        raise ValueError("train_s2t_local: no candidate groups were collected (no trigger fired)")
    frozen_body = freeze_body(model) if not train_body else []
    if not train_body:
        weights = LocalLossWeights(weights.kl_weight, 0.0, weights.hinge_margin)
    frozen = frozen_copy(model) if weights.frozen_kl_weight > 0 else None
    hook = restrict_output_rows(model, reserved)
    optimizer = local_optimizer(model, lr, weight_decay)
    generator = torch.Generator().manual_seed(seed)
    log = LocalTrainingLog()
    steps_per_epoch = math.ceil(len(groups) / batch_groups)
    model.train()
    try:
        for epoch in range(epochs):
            order = torch.randperm(len(groups), generator=generator)
            for start in range(0, len(groups), batch_groups):
                batch = groups.subset(order[start:start + batch_groups])
                parts = local_step(model, frozen, batch, reserved, weights, pad_id)
                optimizer.zero_grad(set_to_none=True)
                parts["total"].backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                for name in ("total", "ce", "hinge", "teacher_kl", "frozen_kl"):
                    getattr(log, name).append(float(parts[name].detach()))
                if on_step is not None:
                    on_step(epoch * steps_per_epoch + start // batch_groups + 1, epochs * steps_per_epoch)
    finally:
        hook.remove()
        for parameter in frozen_body:
            parameter.requires_grad_(True)
        model.eval()
    return log


def freeze_body(model: Any) -> list[torch.nn.Parameter]:
    """Stop the gradient of every parameter but ``lm_head``'s (whose non-reserved rows the gradient hook holds);
    returns the parameters frozen here, so that training can give them back their gradient."""
    head = {id(p) for p in output_layer(model).parameters()}
    frozen = [p for p in model.parameters() if id(p) not in head and p.requires_grad]
    for parameter in frozen:
        parameter.requires_grad_(False)
    return frozen


def body_change(before: dict[str, torch.Tensor], model: Any) -> float:
    """max |theta_after - theta_before| over every parameter but ``lm_head`` (0.0 exactly for the frozen-body
    variant); ``before`` is a ``state_dict`` copy."""
    head = {id(p) for p in output_layer(model).parameters()}
    changes = [float((p.detach() - before[name]).abs().max()) for name, p in model.named_parameters()
               if id(p) not in head]
    return max(changes, default=0.0)


def frozen_copy(model: Any) -> Any:
    """The reference of loss (iv): an exact, gradient-free copy of the model at the start of training."""
    frozen = copy.deepcopy(model).eval()
    for parameter in frozen.parameters():
        parameter.requires_grad_(False)
    return frozen


def local_step(model: Any, frozen: Any, batch: CandidateGroups, reserved: Sequence[int],
               weights: LocalLossWeights, pad_id: int) -> dict[str, torch.Tensor]:
    """Loss of one batch of groups. Loss (iv) reads the prefix positions of the first candidate's row: in a
    causal LM they do not depend on the candidate."""
    scores, logits = candidate_scores(model, batch.prefixes, batch.lengths, batch.candidates, reserved, pad_id,
                                      return_logits=True)
    k = batch.candidates.shape[1]
    frozen_kl = None
    if weights.frozen_kl_weight > 0:
        first = logits[::k]
        inputs, _ = candidate_inputs(batch.prefixes, batch.lengths, batch.candidates[:, :1], pad_id)
        with torch.no_grad():
            frozen_logits = frozen(input_ids=inputs).logits
        frozen_kl = frozen_token_kl(first, frozen_logits, batch.lengths, reserved)
    return local_loss(scores, batch.teacher_probs.to(scores.dtype), weights, frozen_kl)


# ------------------------------------------------------------------------------------------------
# Batched decoding with a policy: SLM greedy / sampling, S2T, Takeover, S2T-Local
# ------------------------------------------------------------------------------------------------

ACTIONS = ("greedy", "sample", "s2t", "takeover", "local")
TRIGGERS = ("none", "kl", "entropy", "random")


@dataclass(frozen=True)
class DecodePolicy:
    """What happens at each generated step. ``action`` is applied at trigger steps (greedy / sample at
    every step); ``threshold`` = inf records trigger scores without firing (calibration)."""

    action: str = "greedy"
    trigger: str = "none"
    threshold: float = math.inf
    random_rate: float = 0.0
    warmup_steps: int = 3
    support_size: int = 64
    k: int = 8
    ratio_to_max: float | None = None  # candidates p > r * p_max instead of the top-k (S2T only)
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {self.action!r}")
        if self.trigger not in TRIGGERS:
            raise ValueError(f"trigger must be one of {TRIGGERS}, got {self.trigger!r}")

    @property
    def needs_llm_every_step(self) -> bool:
        return self.trigger == "kl"

    @property
    def needs_llm_at_triggers(self) -> bool:
        return self.action in ("s2t", "takeover")


@dataclass
class DecodeTrace:
    """Generated tokens (B, T), trigger mask (B, T), the number of (row, step) LLM evaluations, the
    calibration scores (every active step after the warm-up), hit@K at triggers, collected groups."""

    tokens: torch.Tensor
    fired: torch.Tensor
    llm_row_evaluations: int
    scores: list[float]
    hits: dict[int, list[bool]]
    groups: list[CandidateGroups]


class CachedLogits:
    """Next-token logits of a growing batch of sequences with the model's key/value cache (Hugging Face
    ``cache`` in transformers 5): each call feeds only the tokens appended since the last call. Rows grow in
    lockstep (no padding), so positions follow from the cache length."""

    def __init__(self, model: Any, reserved: Sequence[int] = (), vocab_size: int | None = None):
        self.model, self.reserved, self.vocab_size = model, reserved, vocab_size
        self.cache: Any = None
        self.seen = 0

    def __call__(self, seqs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            out = self.model(input_ids=seqs[:, self.seen:], cache=self.cache, use_cache=True)
        self.cache, self.seen = out.cache, seqs.shape[1]
        return cut_and_mask(out.logits[:, -1].float(), self.reserved, self.vocab_size)


def decode(slm: Any, prompts: torch.Tensor, max_new_tokens: int, policy: DecodePolicy, *, llm: Any = None,
           reserved: Sequence[int] = (), vocab_size: int | None = None, eos_id: int | None = None,
           generator: torch.Generator | None = None, hit_ks: Sequence[int] = (), collect_k: int | None = None,
           pad_id: int = 0) -> DecodeTrace:
    """Decode a batch of equal-length prompts for ``max_new_tokens`` steps under ``policy``.

    With ``hit_ks`` the LLM is evaluated at every step and hit@K is recorded at trigger steps; with
    ``collect_k`` each trigger step is logged as an S2T-Local group (top-``collect_k`` SLM candidates and
    the LLM's absolute probabilities on them). ``llm`` None guarantees that no LLM runs (S2T-Local with
    the entropy trigger); a policy that needs it raises."""
    if (policy.needs_llm_every_step or policy.needs_llm_at_triggers or hit_ks or collect_k) and llm is None:
        raise ValueError(f"policy {policy.action}/{policy.trigger} (or hit@K / collection) needs the LLM")
    generator = generator or torch.Generator().manual_seed(0)
    seqs = prompts.clone()
    batch = seqs.shape[0]
    finished = torch.zeros(batch, dtype=torch.bool)
    tokens, fired_steps, scores = [], [], []
    hits: dict[int, list[bool]] = {k: [] for k in hit_ks}
    groups: list[CandidateGroups] = []
    llm_evaluations = 0
    slm_step = CachedLogits(slm, reserved, vocab_size)
    llm_step = CachedLogits(llm, reserved, vocab_size) if llm is not None else None
    for step in range(max_new_tokens):
        slm_logits = slm_step(seqs)
        choice = slm_choice(slm_logits, policy, generator)
        active = ~finished
        llm_logits = None
        if policy.needs_llm_every_step or hit_ks or collect_k:
            llm_logits = llm_step(seqs)[:, :slm_logits.shape[-1]]
            llm_evaluations += int(active.sum())
        fire = trigger_mask(slm_logits, llm_logits, policy, step, active, generator, scores)
        if fire.any():
            rows = fire.nonzero().squeeze(-1)
            if llm_logits is None and policy.needs_llm_at_triggers:
                row_llm = next_token_logits(llm, seqs[rows], reserved, slm_logits.shape[-1])
                llm_evaluations += len(rows)
            else:
                row_llm = llm_logits[rows] if llm_logits is not None else None
            choice[rows] = act_at_trigger(slm, seqs[rows], slm_logits[rows], row_llm, policy, reserved, pad_id)
            if row_llm is not None and hit_ks:
                for k, hit in hit_at_k(slm_logits[rows], row_llm, hit_ks).items():
                    hits[k] += hit.tolist()
            if collect_k:
                groups.append(collect_groups(seqs[rows], slm_logits[rows], row_llm, collect_k))
        if eos_id is not None:
            choice = choice.masked_fill(finished, eos_id)
            finished |= choice == eos_id
        seqs = torch.cat([seqs, choice[:, None]], dim=1)
        tokens.append(choice)
        fired_steps.append(fire)
        if eos_id is not None and bool(finished.all()):
            break
    return DecodeTrace(torch.stack(tokens, 1), torch.stack(fired_steps, 1), llm_evaluations, scores, hits, groups)


def slm_choice(slm_logits: torch.Tensor, policy: DecodePolicy, generator: torch.Generator) -> torch.Tensor:
    if policy.action == "sample":
        probs = torch.softmax(slm_logits / policy.temperature, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return slm_logits.argmax(-1)


def trigger_mask(slm_logits: torch.Tensor, llm_logits: torch.Tensor | None, policy: DecodePolicy, step: int,
                 active: torch.Tensor, generator: torch.Generator, record: list[float]) -> torch.Tensor:
    """(B,) bool trigger of this step; appends the active rows' scores (after the warm-up) to ``record``."""
    if policy.trigger == "none":
        return torch.zeros_like(active)
    if policy.trigger == "random":
        return random_trigger(len(active), policy.random_rate, step, policy.warmup_steps, generator) & active
    if policy.trigger == "kl":
        score = kl_on_support(slm_logits, llm_logits, policy.support_size)
    else:
        score = entropy_on_support(slm_logits, policy.support_size)
    if step >= policy.warmup_steps:
        record += score[active].tolist()
    return threshold_trigger(score, policy.threshold, step, policy.warmup_steps) & active


def act_at_trigger(slm: Any, prefixes: torch.Tensor, slm_logits: torch.Tensor, llm_logits: torch.Tensor | None,
                   policy: DecodePolicy, reserved: Sequence[int], pad_id: int) -> torch.Tensor:
    """The token emitted at trigger rows: S2T / Takeover (LLM) or S2T-Local (bin scores), else the SLM's."""
    if policy.action == "takeover":
        return takeover_select(llm_logits)
    if policy.action == "s2t":
        if policy.ratio_to_max is not None:
            mask = ratio_candidates(slm_logits, policy.ratio_to_max)
        else:
            mask = ids_to_mask(top_k_candidates(slm_logits, policy.k), slm_logits.shape[-1])
        return s2t_select(llm_logits, mask)
    if policy.action == "local":
        candidates = top_k_candidates(slm_logits, policy.k)
        lengths = torch.full((len(prefixes),), prefixes.shape[1], dtype=torch.long)
        with torch.no_grad():
            scores = candidate_scores(slm, prefixes, lengths, candidates, reserved, pad_id)
        return local_select(scores, candidates)
    return slm_logits.argmax(-1)


def collect_groups(prefixes: torch.Tensor, slm_logits: torch.Tensor, llm_logits: torch.Tensor, k: int
                   ) -> CandidateGroups:
    """S2T-Local data at trigger rows: prefix, the SLM's top-k candidates, the LLM's absolute probabilities."""
    candidates = top_k_candidates(slm_logits, k)
    teacher = torch.softmax(llm_logits, dim=-1).gather(-1, candidates)
    lengths = torch.full((len(prefixes),), prefixes.shape[1], dtype=torch.long)
    return CandidateGroups(prefixes.clone(), lengths, candidates, teacher)


def concat_groups(parts: Sequence[CandidateGroups], pad_id: int = 0) -> CandidateGroups:
    """Join groups of different prefix lengths (right-padded to the longest)."""
    if not parts:
        return CandidateGroups(torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                               torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, 1))
    width = max(p.prefixes.shape[1] for p in parts)
    prefixes = torch.cat([F.pad(p.prefixes, (0, width - p.prefixes.shape[1]), value=pad_id) for p in parts])
    return CandidateGroups(prefixes, torch.cat([p.lengths for p in parts]), torch.cat([p.candidates for p in parts]),
                           torch.cat([p.teacher_probs for p in parts]))
