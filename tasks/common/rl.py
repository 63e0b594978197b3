"""Group-relative policy optimisation (GRPO and relatives) for causal LMs, on plain torch tensors.

Pieces, each usable alone:

- rollouts: ``sample_group`` draws G completions per prompt with an explicit ``torch.Generator`` (its own
  sampling loop, KV cache for ``transformers`` models) and returns ``Rollouts`` carrying the sampling
  policy's token log-probs; ``token_logprobs`` scores completions under any model in one forward pass.
- advantages: ``group_advantages`` (GRPO's group-normalised rewards).
- losses, pure functions of (new log-probs, old log-probs, advantages, mask) returning ``(loss, stats)``:
  ``grpo_loss`` (PPO clip per token, with DAPO's clip-higher and token-level mean), ``gspo_loss``
  (length-normalised sequence ratio), ``reinforce_is_loss`` (unclipped importance-weighted REINFORCE);
  ``kl_to_reference`` / ``add_kl_penalty`` (k3 estimator of the KL to a reference policy).
- staleness: ``LaggedPolicy`` keeps the behaviour (sampling) policy ``k`` optimiser updates behind the learner.
- ``grpo_step``: one optimiser update from rollouts and rewards.

Layout. A row is ``[prefix embeddings (K)] [prompt (P, left-padded)] [completion (T, right-padded)]`` and the
G rows of a group are contiguous (row i belongs to group i // G). Masks are bool. Log-probs at masked positions
are 0 and never reach a loss: masking uses ``torch.where`` before any ``exp``, so NaN or inf there leaks neither
into the value nor into the gradient. Sampling runs in eval mode; train with dropout 0 so that the learner's
log-probs equal the sampler's (ratio 1 on policy).

References: Schulman et al. 2017 (PPO); Shao et al. 2024, DeepSeekMath (GRPO); Yu et al. 2025, DAPO;
Zheng et al. 2025, Group Sequence Policy Optimization (GSPO); Liu et al. 2025, Understanding R1-Zero-like
training (Dr. GRPO); Schulman 2020, "Approximating KL divergence" (k3).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel

Aggregation = Literal["token", "sequence"]
Stats = dict[str, float]
LossFn = Callable[..., tuple[Tensor, Stats]]


# ---------------------------------------------------------------------------------------------------------------
# Rollouts
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rollouts:
    """G sampled completions per prompt, N = num_groups * G rows, groups contiguous.

    prompt_ids (N, P) long, left-padded; prompt_mask (N, P) bool; completion_ids (N, T) long, ``pad`` after the
    first EOS; completion_mask (N, T) bool, True up to and including the first EOS; old_logprobs (N, T) float32,
    log pi_old(y_t | x, y_<t) of the sampling policy at ``temperature`` (0 where masked); group_index (N,) long;
    prefix_embeds (N, K, D) or None (a vision-language prefix placed before the prompt).
    """

    prompt_ids: Tensor
    prompt_mask: Tensor
    completion_ids: Tensor
    completion_mask: Tensor
    old_logprobs: Tensor
    group_index: Tensor
    group_size: int
    temperature: float = 1.0
    prefix_embeds: Tensor | None = None

    @property
    def input_ids(self) -> Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def num_groups(self) -> int:
        return self.prompt_ids.shape[0] // self.group_size

    @property
    def lengths(self) -> Tensor:
        """Number of valid completion tokens per row (EOS included)."""
        return self.completion_mask.sum(dim=1)


def _kwarg_names(model: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    """Keyword names the model's forward takes, and whether it also takes ``**kwargs``."""
    params = inspect.signature(model.forward if isinstance(model, nn.Module) else model).parameters
    return frozenset(params), any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _forward(model: Callable[..., Any], inputs: dict[str, Tensor], keep: int, cache: Any = None,
             use_cache: bool = False) -> tuple[Tensor, Any]:
    """Call ``model(**inputs)`` and return (logits of at least the last ``keep`` positions, KV cache or None).

    ``position_ids`` is passed only to models that accept it, ``logits_to_keep`` (saves the (N, L, V) logits of
    the prompt) only to models that name it. The cache keyword is ``cache`` in recent ``transformers`` 5.x and
    ``past_key_values`` before.
    """
    names, var_kw = _kwarg_names(model)
    kwargs = {k: v for k, v in inputs.items() if k != "position_ids" or k in names or var_kw}
    if "logits_to_keep" in names:
        kwargs["logits_to_keep"] = keep
    if use_cache:
        kwargs["use_cache"] = True
        if cache is not None:
            kwargs["cache" if "cache" in names else "past_key_values"] = cache
    out = model(**kwargs)
    new_cache = getattr(out, "cache", None)
    return out.logits, new_cache if new_cache is not None else getattr(out, "past_key_values", None)


def _positions(attention_mask: Tensor) -> Tensor:
    """Position of each token among the valid ones (pads get a dummy position), so padding does not shift them."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp_min(0)


def _embed(model: Callable[..., Any], input_ids: Tensor, embed_tokens: Callable[[Tensor], Tensor] | None,
           dtype: torch.dtype) -> Tensor:
    embed = embed_tokens if embed_tokens is not None else model.get_input_embeddings()
    return embed(input_ids).to(dtype)


def _model_inputs(model: Callable[..., Any], input_ids: Tensor, attention_mask: Tensor,
                  prefix_embeds: Tensor | None, embed_tokens: Callable[[Tensor], Tensor] | None) -> dict[str, Tensor]:
    """Forward kwargs for ``[prefix] + input_ids``: token ids, or embeddings when there is a prefix."""
    mask = attention_mask.bool()
    if prefix_embeds is None:
        return {"input_ids": input_ids, "attention_mask": mask.long(), "position_ids": _positions(mask)}
    prefix_mask = torch.ones(prefix_embeds.shape[:2], dtype=torch.bool, device=mask.device)
    mask = torch.cat([prefix_mask, mask], dim=1)
    embeds = torch.cat([prefix_embeds, _embed(model, input_ids, embed_tokens, prefix_embeds.dtype)], dim=1)
    return {"inputs_embeds": embeds, "attention_mask": mask.long(), "position_ids": _positions(mask)}


def _completion_logits(logits: Tensor, num_completion: int) -> Tensor:
    """Logits that score the last ``num_completion`` tokens: token t is predicted at position t - 1."""
    return logits[:, -num_completion - 1:-1]


def _gather_logprobs(logits: Tensor, tokens: Tensor, temperature: float) -> Tensor:
    """log softmax(logits / temperature)[token], in float32."""
    scaled = logits.float() / temperature
    return scaled.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - scaled.logsumexp(dim=-1)


def token_logprobs(model: Callable[..., Any], input_ids: Tensor, attention_mask: Tensor, completion_mask: Tensor, *,
                   temperature: float = 1.0, prefix_embeds: Tensor | None = None,
                   embed_tokens: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """log pi(y_t | x, y_<t) = log softmax(z_{t-1} / temperature)[y_t] for the completion tokens, (N, T).

    The completion is the last T = ``completion_mask.shape[1]`` columns of ``input_ids``; one teacher-forced
    forward pass over ``[prefix_embeds] + input_ids``; 0 where ``completion_mask`` is False. Differentiable
    (call it under ``torch.no_grad()`` for old or reference log-probs).
    """
    num_completion = completion_mask.shape[1]
    inputs = _model_inputs(model, input_ids, attention_mask, prefix_embeds, embed_tokens)
    logits, _ = _forward(model, inputs, keep=num_completion + 1)
    logp = _gather_logprobs(_completion_logits(logits, num_completion), input_ids[:, -num_completion:], temperature)
    return torch.where(completion_mask.bool(), logp, 0.0)


def rollout_logprobs(model: Callable[..., Any], rollouts: Rollouts,
                     embed_tokens: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """``token_logprobs`` of ``rollouts``' completions under ``model``, at the rollouts' temperature."""
    return token_logprobs(model, rollouts.input_ids, rollouts.attention_mask, rollouts.completion_mask,
                          temperature=rollouts.temperature, prefix_embeds=rollouts.prefix_embeds,
                          embed_tokens=embed_tokens)


@contextlib.contextmanager
def _eval_mode(model: Callable[..., Any]) -> Iterator[None]:
    training = isinstance(model, nn.Module) and model.training
    if training:
        model.eval()
    try:
        yield
    finally:
        if training:
            model.train()


def _draw(logits: Tensor, temperature: float, generator: torch.Generator) -> Tensor:
    """One token per row from softmax(logits / temperature), or the argmax when temperature == 0."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def sample_group(model: Callable[..., Any], prompt_ids: Tensor, group_size: int, max_new_tokens: int, *,
                 seed: int | torch.Generator, temperature: float = 1.0, prompt_mask: Tensor | None = None,
                 eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
                 prefix_embeds: Tensor | None = None, embed_tokens: Callable[[Tensor], Tensor] | None = None,
                 use_cache: bool | None = None) -> Rollouts:
    """Draw ``group_size`` completions per prompt, y_t ~ softmax(z_t / temperature), reproducibly from ``seed``.

    ``prompt_ids`` (B, P), left-padded with ``prompt_mask`` when lengths differ; ``prefix_embeds`` (B, K, D) is
    prepended as embeddings (via ``embed_tokens``, default ``model.get_input_embeddings()``). A row stops after
    its first EOS (later tokens are ``pad_token_id``, default the first EOS or 0, and masked); the loop stops
    when every row has stopped, so T <= ``max_new_tokens``. ``temperature == 0`` is greedy decoding, scored at
    temperature 1. The model is any callable taking ``input_ids`` or ``inputs_embeds`` and ``attention_mask``
    and returning ``.logits``; ``use_cache`` (default: only for ``transformers`` models) decodes with a KV cache,
    otherwise the whole sequence is recomputed at every step. Rows are ``prompt_ids.repeat_interleave(G)``.
    """
    if group_size < 1 or max_new_tokens < 1:
        raise ValueError(f"need group_size >= 1 and max_new_tokens >= 1, got {group_size}, {max_new_tokens}")
    device = prompt_ids.device
    generator = seed if isinstance(seed, torch.Generator) else torch.Generator(device=device).manual_seed(seed)
    eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
    eos_ids = torch.tensor(eos, dtype=torch.long, device=device)
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    use_cache = isinstance(model, PreTrainedModel) if use_cache is None else use_cache

    ids = prompt_ids.repeat_interleave(group_size, dim=0)
    pmask = (torch.ones_like(prompt_ids, dtype=torch.bool) if prompt_mask is None else prompt_mask.bool()
             ).repeat_interleave(group_size, dim=0)
    prefix = None if prefix_embeds is None else prefix_embeds.repeat_interleave(group_size, dim=0)
    finished = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
    tokens: list[Tensor] = []
    alive: list[Tensor] = []
    logps: list[Tensor] = []
    with _eval_mode(model):
        inputs = _model_inputs(model, ids, pmask, prefix, embed_tokens)
        logits, cache = _forward(model, inputs, keep=1, use_cache=use_cache)
        attention = inputs["attention_mask"]
        for step in range(max_new_tokens):
            last = logits[:, -1]
            token = torch.where(finished, pad, _draw(last, temperature, generator))
            tokens.append(token)
            alive.append(~finished)
            logps.append(torch.where(finished, 0.0, _gather_logprobs(last, token, temperature or 1.0)))
            finished = finished | torch.isin(token, eos_ids)
            if bool(finished.all()) or step == max_new_tokens - 1:
                break
            if use_cache:
                attention = torch.cat([attention, alive[-1].long().unsqueeze(1)], dim=1)
                step_inputs = {"attention_mask": attention, "position_ids": _positions(attention)[:, -1:]}
                if prefix is None:
                    step_inputs["input_ids"] = token.unsqueeze(1)
                else:
                    step_inputs["inputs_embeds"] = _embed(model, token.unsqueeze(1), embed_tokens, prefix.dtype)
                logits, cache = _forward(model, step_inputs, keep=1, cache=cache, use_cache=True)
            else:
                so_far = _model_inputs(model, torch.cat([ids, torch.stack(tokens, 1)], 1),
                                       torch.cat([pmask, torch.stack(alive, 1)], 1), prefix, embed_tokens)
                logits, _ = _forward(model, so_far, keep=1)
    return Rollouts(prompt_ids=ids, prompt_mask=pmask, completion_ids=torch.stack(tokens, 1),
                    completion_mask=torch.stack(alive, 1), old_logprobs=torch.stack(logps, 1),
                    group_index=torch.arange(prompt_ids.shape[0], device=device).repeat_interleave(group_size),
                    group_size=group_size, temperature=temperature or 1.0, prefix_embeds=prefix)


# ---------------------------------------------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------------------------------------------

def _centre(grouped: Tensor) -> Tensor:
    return grouped - grouped.mean(dim=1, keepdim=True)


def group_advantages(rewards: Tensor, group_size: int, *, scale: Literal["std", "none"] = "std",
                     eps: float = 1e-6) -> Tensor:
    """A_i = (r_i - mean_g(r)) / (std_g(r) + eps) within each group of G contiguous rows (Shao et al. 2024, 4.1.2).

    std_g is the sample standard deviation (Bessel-corrected, divisor G - 1), as TRL's and verl's GRPO compute
    it. A group whose rewards are all equal gets A = 0 exactly (it carries no learning signal). ``scale="none"``
    keeps only the centring, A_i = r_i - mean_g(r) (Dr. GRPO, Liu et al. 2025).
    """
    if group_size < 2 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not form groups of size {group_size} >= 2")
    grouped = rewards.reshape(-1, group_size)
    grouped = grouped if grouped.is_floating_point() else grouped.float()
    advantages = _centre(grouped)
    if scale == "std":
        advantages = advantages / (grouped.std(dim=1, keepdim=True) + eps)
    elif scale != "none":
        raise ValueError(f"scale must be 'std' or 'none', got {scale!r}")
    degenerate = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(degenerate, 0.0, advantages).reshape(-1)


# ---------------------------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------------------------

def _log_ratio(new_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log r_t = new_t - old_t on valid tokens, 0 elsewhere (before any exp: no inf/NaN from padding)."""
    return torch.where(mask, new_logprobs - old_logprobs.detach(), 0.0)


def _per_token(advantages: Tensor, like: Tensor) -> Tensor:
    """Sequence advantages (N,) broadcast to tokens, or per-token advantages (N, T) as given; never differentiated."""
    advantages = advantages.detach().to(like.dtype)
    return advantages.unsqueeze(1).expand_as(like) if advantages.dim() == 1 else advantages


def _aggregate(per_token: Tensor, mask: Tensor, aggregation: Aggregation) -> Tensor:
    """"token": sum over valid tokens / their count (DAPO); "sequence": per-sequence mean, then mean (GRPO)."""
    per_token = torch.where(mask, per_token, 0.0)
    if aggregation == "token":
        return per_token.sum() / mask.sum().clamp_min(1)
    if aggregation == "sequence":
        return (per_token.sum(dim=1) / mask.sum(dim=1).clamp_min(1)).mean()
    raise ValueError(f"aggregation must be 'token' or 'sequence', got {aggregation!r}")


def _clipped_objective(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """PPO's pessimistic surrogate min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (Schulman et al. 2017, eq. 7)."""
    return torch.minimum(ratio * advantages, ratio.clamp(1 - eps_low, 1 + eps_high) * advantages)


def _clip_active(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """Where the clipped branch is the minimum and flat: r < 1 - eps_low with A < 0, or r > 1 + eps_high with A > 0."""
    return ((ratio < 1 - eps_low) & (advantages < 0)) | ((ratio > 1 + eps_high) & (advantages > 0))


def _k3(log_ratio: Tensor) -> Tensor:
    """k3(d) = exp(d) - d - 1 >= 0, with d = log(q / p) for samples of p: unbiased for KL(p || q) (Schulman 2020)."""
    return torch.exp(log_ratio) - log_ratio - 1


def _token_stats(log_ratio: Tensor, mask: Tensor, clipped: Tensor) -> Stats:
    """Fraction of valid tokens clipped, mean ratio r_t, and k3 estimate of KL(pi_old || pi_new) per token."""
    ratio = torch.exp(log_ratio.detach())
    return {"clip_fraction": float(_aggregate(clipped.to(ratio.dtype), mask, "token")),
            "ratio_mean": float(_aggregate(ratio, mask, "token")),
            "approx_kl": float(_aggregate(_k3(log_ratio.detach()), mask, "token"))}


def grpo_loss(new_logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
              eps_low: float = 0.2, eps_high: float = 0.2, aggregation: Aggregation = "token") -> tuple[Tensor, Stats]:
    """L = -agg_t min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A), r_t = exp(logp_new_t - logp_old_t).

    GRPO (Shao et al. 2024, eq. 3) averages the tokens of each sequence, then the sequences
    (``aggregation="sequence"``); DAPO (Yu et al. 2025) averages over all tokens of the batch (``"token"``) and
    decouples the clip range (clip-higher: eps_low 0.2, eps_high 0.28). ``advantages`` is (N,) or (N, T).
    The gradient is 0 exactly on clipped tokens (``stats["clip_fraction"]``). KL: ``add_kl_penalty``.
    """
    mask = mask.bool()
    log_ratio = _log_ratio(new_logprobs, old_logprobs, mask)
    ratio, adv = torch.exp(log_ratio), _per_token(advantages, new_logprobs)
    loss = -_aggregate(_clipped_objective(ratio, adv, eps_low, eps_high), mask, aggregation)
    return loss, _token_stats(log_ratio, mask, _clip_active(ratio.detach(), adv, eps_low, eps_high))


def sequence_log_ratio(new_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> Tensor:
    """log s_i = (1 / |y_i|) sum_t (logp_new_it - logp_old_it) over the valid tokens of row i (GSPO, eq. 7), (N,)."""
    mask = mask.bool()
    return _log_ratio(new_logprobs, old_logprobs, mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1)


def gspo_loss(new_logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
              eps_low: float = 3e-4, eps_high: float = 4e-4) -> tuple[Tensor, Stats]:
    """L = -(1/N) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), s_i = exp(sequence_log_ratio_i).

    GSPO (Zheng et al. 2025, eq. 5-7): one length-normalised importance ratio and one clip decision per
    sequence; their clip range is 3e-4 / 4e-4. ``advantages`` is (N,). Stats count clipped sequences.
    """
    if advantages.dim() != 1:
        raise ValueError("gspo_loss takes one advantage per sequence, shape (N,)")
    mask = mask.bool()
    seq_ratio = torch.exp(sequence_log_ratio(new_logprobs, old_logprobs, mask))
    adv = advantages.detach().to(seq_ratio.dtype)
    loss = -_clipped_objective(seq_ratio, adv, eps_low, eps_high).mean()
    stats = _token_stats(_log_ratio(new_logprobs, old_logprobs, mask), mask, torch.zeros_like(mask))
    stats["clip_fraction"] = float(_clip_active(seq_ratio.detach(), adv, eps_low, eps_high).to(adv.dtype).mean())
    stats["ratio_mean"] = float(seq_ratio.detach().mean())
    return loss, stats


def reinforce_is_loss(new_logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, *,
                      aggregation: Aggregation = "token") -> tuple[Tensor, Stats]:
    """L = -agg_t r_t A, r_t = exp(logp_new_t - logp_old_t), no clipping: dL/dlogp_new_t = -r_t A / n.

    Importance-weighted REINFORCE with the group baseline in A; on policy (r = 1) its gradient equals GRPO's.
    """
    mask = mask.bool()
    log_ratio = _log_ratio(new_logprobs, old_logprobs, mask)
    loss = -_aggregate(torch.exp(log_ratio) * _per_token(advantages, new_logprobs), mask, aggregation)
    return loss, _token_stats(log_ratio, mask, torch.zeros_like(mask))


def kl_to_reference(new_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, *,
                    aggregation: Aggregation = "token") -> Tensor:
    """agg_t [exp(ref_t - new_t) - (ref_t - new_t) - 1], the k3 estimator of KL(pi_new || pi_ref) (GRPO eq. 4).

    Unbiased for tokens sampled from pi_new; GRPO also applies it to samples of pi_old. ``ref`` is detached.
    """
    mask = mask.bool()
    return _aggregate(_k3(torch.where(mask, ref_logprobs.detach() - new_logprobs, 0.0)), mask, aggregation)


def add_kl_penalty(loss: Tensor, stats: Stats, new_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor,
                   beta: float, *, aggregation: Aggregation = "token") -> tuple[Tensor, Stats]:
    """(loss + beta * KL_k3(pi_new || pi_ref), stats with "kl_ref") for any of the losses above."""
    kl = kl_to_reference(new_logprobs, ref_logprobs, mask, aggregation=aggregation)
    return loss + beta * kl, {**stats, "kl_ref": float(kl.detach())}


LOSSES: dict[str, LossFn] = {"grpo": grpo_loss, "gspo": gspo_loss, "reinforce_is": reinforce_is_loss}


# ---------------------------------------------------------------------------------------------------------------
# Staleness and the update step
# ---------------------------------------------------------------------------------------------------------------

class LaggedPolicy:
    """Behaviour policy that lags the learner by ``staleness`` optimiser updates.

    After u updates ``behaviour`` holds the learner's parameters theta_{max(0, u - staleness)}; sample rollouts
    from it and train ``policy`` on them, and the importance ratios correct for the lag. ``staleness == 0`` is
    on-policy: ``behaviour`` is ``policy`` itself. Call ``update()`` after every optimiser step. Holds
    ``staleness + 1`` state_dict copies on the parameters' device.
    """

    def __init__(self, policy: nn.Module, staleness: int):
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.policy, self.staleness, self.updates = policy, staleness, 0
        self.behaviour = policy if staleness == 0 else copy.deepcopy(policy).eval().requires_grad_(False)
        self._snapshots: deque[tuple[int, dict[str, Tensor]]] = deque([(0, self._snapshot())] if staleness else [])

    def _snapshot(self) -> dict[str, Tensor]:
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    @property
    def behaviour_version(self) -> int:
        """Number of updates the behaviour parameters have seen, max(0, updates - staleness)."""
        return self._snapshots[0][0] if self.staleness else self.updates

    def update(self) -> None:
        """Record the learner after one optimiser step and move the behaviour policy to theta_{u - staleness}."""
        self.updates += 1
        if not self.staleness:
            return
        self._snapshots.append((self.updates, self._snapshot()))
        if len(self._snapshots) > self.staleness + 1:
            self._snapshots.popleft()
        self.behaviour.load_state_dict(self._snapshots[0][1])


def grpo_step(policy: nn.Module, optimizer: torch.optim.Optimizer, rollouts: Rollouts,
              rewards: Tensor | Sequence[float], *, loss: str = "grpo", loss_kwargs: dict[str, Any] | None = None,
              scale: Literal["std", "none"] = "std", eps: float = 1e-6, advantages: Tensor | None = None,
              ref_model: nn.Module | None = None, beta: float = 0.0, max_grad_norm: float | None = None,
              embed_tokens: Callable[[Tensor], Tensor] | None = None) -> Stats:
    """One update: A = group_advantages(rewards) (or ``advantages``), L = LOSSES[loss](logp_policy, logp_old, A)
    [+ beta * k3 KL to ``ref_model``], then backward, optional grad-norm clipping and ``optimizer.step()``.

    Full batch, one step; call it again on the same rollouts for several off-policy epochs. Returns the loss's
    stats plus loss, reward_mean, completion_length and (when clipping) grad_norm.
    """
    kwargs = loss_kwargs or {}
    device = rollouts.old_logprobs.device
    rewards = torch.as_tensor(rewards, dtype=torch.float32, device=device)
    adv = group_advantages(rewards, rollouts.group_size, scale=scale, eps=eps) if advantages is None else advantages
    new = rollout_logprobs(policy, rollouts, embed_tokens)
    value, stats = LOSSES[loss](new, rollouts.old_logprobs, adv, rollouts.completion_mask, **kwargs)
    if ref_model is not None and beta:
        with torch.no_grad():
            ref = rollout_logprobs(ref_model, rollouts, embed_tokens)
        value, stats = add_kl_penalty(value, stats, new, ref, rollouts.completion_mask, beta,
                                      aggregation=kwargs.get("aggregation", "token"))
    optimizer.zero_grad(set_to_none=True)
    value.backward()
    if max_grad_norm is not None:
        stats["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(policy.parameters(), max_grad_norm))
    optimizer.step()
    return {**stats, "loss": float(value.detach()), "reward_mean": float(rewards.mean()),
            "completion_length": float(rollouts.lengths.float().mean())}
