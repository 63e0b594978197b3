"""LLM policies behind one interface: an in-process ``transformers`` model or any OpenAI-compatible server.

``LLMPolicy`` is what paper code programs against:

- ``generate(prompts, max_new_tokens, temperature, seed)``: one completion per prompt. ``temperature == 0``
  is greedy decoding; otherwise plain temperature sampling (no top-k / top-p truncation). Prompt ``i`` is
  sampled with seed ``seed + i``, so ``generate([p] * k, ..., seed=s)`` draws ``k`` different samples and
  a given (prompt, seed) pair reproduces.
- ``score(prompt, continuations)``: for each continuation, ``sum_t log p(c_t | prompt, c_<t)`` over the
  continuation's tokens (natural log, no length normalisation). ``prompt + continuation`` is tokenized as
  one string and the continuation's tokens are those whose first character is at or after ``len(prompt)``;
  a continuation must start on a token boundary (``ValueError`` otherwise) and the prompt must contain at
  least one token, since a causal LM gives no probability to its first token. With a byte-level tokenizer
  every character boundary is a token boundary; with BPE tokenizers start continuations with a space.
- ``choose(prompt, options)``: the index of the highest score; ties go to the lowest index.

``TransformersPolicy`` runs a causal LM in this process (``model.generate`` and one forward pass per
scored continuation). ``OpenAIServerPolicy`` talks to a server through the official ``openai`` client:
``transformers serve`` at the cpu profile (``tasks.common.llm_server``), vLLM at the paper profile.
Its ``score`` uses the legacy completions endpoint with ``echo=True, logprobs=1`` (prompt log-probs),
which vLLM implements and ``transformers serve`` (5.x) does not: that server accepts ``echo`` and
``logprobs`` but ignores them (``UNUSED_LEGACY_COMPLETION_FIELDS`` in ``transformers/cli/serving/
completion.py``) and returns ``logprobs: null``; ``score``/``choose`` then raise ``NotImplementedError``
rather than guess. Score such a model with ``TransformersPolicy`` on the same weights instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from tasks.common.seeding import torch_init_seed


@runtime_checkable
class LLMPolicy(Protocol):
    """Generation, continuation scoring and multiple choice, whatever runs the model."""

    def generate(self, prompts: Sequence[str], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> list[str]:
        """One completion (new text only) per prompt; greedy at ``temperature == 0``."""
        ...

    def score(self, prompt: str, continuations: Sequence[str]) -> list[float]:
        """Sum of the natural-log probabilities of each continuation's tokens after ``prompt``."""
        ...

    def choose(self, prompt: str, options: Sequence[str]) -> int:
        """Index of the option with the highest ``score``; ties go to the lowest index."""
        ...


def argmax_first(values: Sequence[float]) -> int:
    """Index of the largest value, the lowest such index on ties (NaN never wins)."""
    if not values:
        raise ValueError("argmax of an empty sequence")
    best = 0
    for index, value in enumerate(values):
        if value > values[best] or (math.isnan(values[best]) and not math.isnan(value)):
            best = index
    return best


def _check_generation_args(max_new_tokens: int, temperature: float) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0 or not math.isfinite(temperature):
        raise ValueError(f"temperature must be finite and >= 0, got {temperature}")


def continuation_start(offsets: Sequence[tuple[int, int]], prompt_chars: int) -> int:
    """Index of the first continuation token, from per-token ``(start, end)`` character offsets of
    ``prompt + continuation``: the first token starting at or after ``prompt_chars``.

    Raises ``ValueError`` when a token straddles the boundary or no token precedes it. Special tokens
    with an empty ``(0, 0)`` span (a BOS) count as prompt tokens.
    """
    start = next((i for i, (begin, end) in enumerate(offsets) if begin >= prompt_chars and end > begin),
                 len(offsets))
    straddles = [i for i, (begin, end) in enumerate(offsets[:start]) if end > prompt_chars]
    if straddles:
        raise ValueError(f"the continuation does not start on a token boundary (token {straddles[0]} spans "
                         f"character {prompt_chars}); start continuations with a space or score whole words")
    if start == 0:
        raise ValueError("the prompt has no tokens: a causal LM gives no log-probability to its first token")
    return start


def _predicting_positions(start: int, end: int) -> range:
    """Logit rows that predict tokens ``start..end-1``: row ``t - 1`` predicts token ``t``."""
    return range(start - 1, end - 1)


def continuation_logprob(logits: torch.Tensor, input_ids: torch.Tensor, start: int) -> float:
    """``sum_{t >= start} log_softmax(logits[t - 1])[input_ids[t]]`` for one sequence, in float64.

    ``logits`` is ``(L, V)`` and ``input_ids`` is ``(L,)`` for the same sequence.
    """
    end = input_ids.shape[0]
    if start >= end:
        return 0.0
    rows = torch.tensor(list(_predicting_positions(start, end)), dtype=torch.long)
    logp = torch.log_softmax(logits[rows].double(), dim=-1)
    targets = input_ids[start:end]
    return float(logp.gather(-1, targets.unsqueeze(-1)).sum())


class TransformersPolicy:
    """An in-process causal LM and its tokenizer.

    ``chat=True`` wraps every prompt as one user message through the tokenizer's chat template (with the
    generation prompt), the way ``transformers serve``'s chat endpoint does; ``score`` then scores the
    continuation as the assistant's reply.
    """

    def __init__(self, model: Any, tokenizer: Any, chat: bool = False) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.chat = chat

    @classmethod
    def from_directory(cls, directory: str | Path, chat: bool = False, dtype: torch.dtype = torch.float32,
                       device: str = "cpu") -> TransformersPolicy:
        """Load ``AutoModelForCausalLM`` + ``AutoTokenizer`` from a local folder (never the hub)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = str(Path(directory).resolve())
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True).to(device)
        return cls(model, tokenizer, chat=chat)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt_text(self, prompt: str) -> str:
        """The text the model conditions on: the prompt itself, or its chat rendering."""
        if not self.chat:
            return prompt
        return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                  add_generation_prompt=True)

    def _encode(self, text: str, offsets: bool = False) -> dict:
        # A chat rendering already holds its special tokens (as the server's apply_chat_template does).
        return self.tokenizer(text, add_special_tokens=not self.chat, return_offsets_mapping=offsets)

    def generate(self, prompts: Sequence[str], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> list[str]:
        """``model.generate`` per prompt; sampling draws from torch's global generator under
        ``torch_init_seed(seed + i)`` (a lock: concurrent sampling threads take turns)."""
        _check_generation_args(max_new_tokens, temperature)
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        options: dict[str, Any] = {"max_new_tokens": max_new_tokens, "pad_token_id": pad, "eos_token_id": eos}
        if temperature > 0:
            options.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
        else:
            options.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        texts = []
        for index, prompt in enumerate(prompts):
            ids = torch.tensor([self._encode(self.prompt_text(prompt))["input_ids"]], device=self.device)
            if ids.shape[1] == 0:
                raise ValueError(f"prompt {index} encodes to no tokens; a causal LM needs at least one")
            with torch.no_grad():
                if temperature > 0:
                    with torch_init_seed(seed + index):
                        out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **options)
                else:
                    out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **options)
            texts.append(self.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
        return texts

    def score(self, prompt: str, continuations: Sequence[str]) -> list[float]:
        """One forward pass per continuation over ``prompt + continuation``; see the module docstring."""
        context = self.prompt_text(prompt)
        scores = []
        for continuation in continuations:
            encoded = self._encode(context + continuation, offsets=True)
            offsets = encoded["offset_mapping"]
            start = continuation_start(offsets, len(context))
            # A special token the tokenizer appends (an EOS, zero-width) is not part of the continuation.
            end = len(offsets)
            while end > start and offsets[end - 1][0] == offsets[end - 1][1]:
                end -= 1
            ids = torch.tensor(encoded["input_ids"][:end], device=self.device)
            with torch.no_grad():
                logits = self.model(input_ids=ids.unsqueeze(0)).logits[0]
            scores.append(continuation_logprob(logits, ids, start))
        return scores

    def choose(self, prompt: str, options: Sequence[str]) -> int:
        """``argmax_first(score(prompt, options))``: ties go to the lowest index."""
        return argmax_first(self.score(prompt, options))


class OpenAIServerPolicy:
    """Any OpenAI-compatible server (``transformers serve``, vLLM) through the official ``openai`` client.

    ``generate`` uses ``/v1/completions`` (``chat=False``: the prompt is sent as raw text) or
    ``/v1/chat/completions`` (``chat=True``: one user message; the server applies the chat template), with
    ``top_p=1.0`` and ``seed=seed + i``. The server must honour ``seed`` for sampled output to reproduce
    (vLLM and ``transformers serve`` do); ``transformers serve`` samples at ``temperature > 0`` only when
    the model's ``generation_config.json`` has ``do_sample=true``.

    ``score`` needs prompt log-probs: ``/v1/completions`` with ``echo=True, logprobs=1, max_tokens=1,
    temperature=0`` (``max_tokens=1`` and not 0: ``transformers serve`` answers 0 with HTTP 500 and some vLLM
    versions crashed on it; the one generated token lies past the text and is ignored). A server that
    returns no ``logprobs`` for that request raises ``NotImplementedError``. The continuation's tokens are
    found by the server's ``text_offset`` and must spell the continuation (``ValueError`` otherwise). Chat
    mode cannot score: the chat API returns no log-probs of given text.
    """

    def __init__(self, base_url: str, model: str, api_key: str = "EMPTY", chat: bool = False,
                 timeout_s: float = 300.0, max_retries: int = 2, client: Any = None) -> None:
        import openai

        self.base_url = base_url
        self.model = model
        self.chat = chat
        self.client = client or openai.OpenAI(base_url=base_url, api_key=api_key, timeout=timeout_s,
                                              max_retries=max_retries)

    def generate(self, prompts: Sequence[str], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> list[str]:
        """One request per prompt (sequential); returns each completion's new text."""
        _check_generation_args(max_new_tokens, temperature)
        texts = []
        for index, prompt in enumerate(prompts):
            common = {"model": self.model, "max_tokens": max_new_tokens, "temperature": float(temperature),
                      "top_p": 1.0, "seed": seed + index}
            if self.chat:
                reply = self.client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **common)
                texts.append(reply.choices[0].message.content or "")
            else:
                reply = self.client.completions.create(prompt=prompt, **common)
                texts.append(reply.choices[0].text)
        return texts

    def score(self, prompt: str, continuations: Sequence[str]) -> list[float]:
        """Prompt log-probs of ``prompt + continuation`` via ``echo=True``; see the class docstring."""
        if self.chat:
            raise NotImplementedError("OpenAIServerPolicy(chat=True) cannot score: the chat completions API "
                                      "returns no log-probs of given text; use chat=False on a server with echo")
        scores = []
        for continuation in continuations:
            text = prompt + continuation
            reply = self.client.completions.create(model=self.model, prompt=text, echo=True, logprobs=1,
                                                   max_tokens=1, temperature=0.0)
            scores.append(echo_continuation_logprob(reply.choices[0].logprobs, len(prompt), text, self.base_url))
        return scores

    def choose(self, prompt: str, options: Sequence[str]) -> int:
        """``argmax_first(score(prompt, options))``: ties go to the lowest index."""
        return argmax_first(self.score(prompt, options))


def echo_continuation_logprob(logprobs: Any, prompt_chars: int, text: str, server: str = "server") -> float:
    """The continuation's log-prob from an echoed completion's ``logprobs`` (``tokens``, ``token_logprobs``,
    ``text_offset``) for ``text = prompt + continuation``: the tokens whose offset lies in
    ``[prompt_chars, len(text))``; tokens at or past ``len(text)`` were generated and are ignored. The
    selected tokens must spell the continuation (``ValueError`` otherwise)."""
    text_chars = len(text)
    offsets = getattr(logprobs, "text_offset", None) if logprobs is not None else None
    values = getattr(logprobs, "token_logprobs", None) if logprobs is not None else None
    if not offsets or values is None or len(values) != len(offsets):
        raise NotImplementedError(
            f"{server} returned no prompt log-probs for a completions request with echo=True, logprobs=1 "
            "(transformers serve ignores echo and logprobs); score needs a server with echo support "
            "(vLLM) or TransformersPolicy on the same weights")
    echoed = sum(1 for offset in offsets if offset < text_chars)
    # Echoed tokens tile the text, so a token ends where the next one begins.
    spans = list(zip(offsets[:echoed], [*offsets[1:echoed], text_chars]))
    start = continuation_start(spans, prompt_chars)
    picked = values[start:echoed]
    tokens = getattr(logprobs, "tokens", None)
    if tokens is not None and "".join(map(str, tokens[start:echoed])) != text[prompt_chars:]:
        # E.g. offsets shifted by a special token's text, or a character split over byte tokens.
        raise ValueError(f"{server}'s echoed tokens {tokens[start:echoed]!r} do not spell the continuation "
                         f"{text[prompt_chars:]!r}; its text offsets cannot be trusted for this text")
    if any(value is None for value in picked):
        raise ValueError(f"{server} returned a null log-prob inside the continuation: {picked}")
    return float(sum(picked))
