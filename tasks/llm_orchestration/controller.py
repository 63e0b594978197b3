"""The controller of the cpu profile: a tiny GPT-2 (``tasks.common.tiny_lm``) trained on text only, mapping a
request (attachment tags + words) to a control program, decoded with or without the grammar mask.

It never sees modality features: a spoken request reaches it as the ASR transcript (the interaction layer
runs ASR first and forces ``<ASR>`` as the program's first token). Intents and gold programs:

    count (image attached)      [<ASR>] <VISION:img> <MEM_WRITE> <ANSWER> [<TTS>] <EOS>
    direction (video attached)  [<ASR>] <VIDEO:vid> <MEM_WRITE> <ANSWER> [<TTS>] <EOS>
    follow-up (no attachment)   [<ASR>] <MEM_READ> <ANSWER> [<TTS>] <EOS>
    chat                        [<ASR>] <ANSWER> [<TTS>] <EOS>
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import GPT2LMHeadModel

from tasks.common.tiny_lm import build_tiny_gpt2, tiny_gpt2_config, train_causal_lm
from tasks.llm_orchestration import method
from tasks.llm_orchestration.method import ANSWER, ASR, CONTROL_TOKENS, EOS, MEM_READ, MEM_WRITE, TTS, VIDEO, VISION
from tasks.llm_orchestration.world import request_text

PAD, SEP, IMG, VID, AUD = "<pad>", "<sep>", "<img>", "<vid>", "<aud>"
INTENTS = ("count", "direction", "followup_count", "followup_direction", "chat")
MAX_WORDS, MAX_PROGRAM = 14, 8


@dataclass(frozen=True)
class Request:
    """One user turn as the controller and the executor see it."""

    intent: str
    text: str
    spoken: bool
    speak: bool

    @property
    def tags(self) -> list[str]:
        tags = [IMG] if self.intent == "count" else [VID] if self.intent == "direction" else []
        return tags + ([AUD] if self.spoken else [])


def gold_program(request: Request) -> list[str]:
    evidence = {"count": [VISION, MEM_WRITE], "direction": [VIDEO, MEM_WRITE], "followup_count": [MEM_READ],
                "followup_direction": [MEM_READ], "chat": []}[request.intent]
    return ([ASR] if request.spoken else []) + evidence + [ANSWER] + ([TTS] if request.speak else []) + [EOS]


def token_list(words: Sequence[str]) -> list[str]:
    return [PAD, SEP, IMG, VID, AUD, *CONTROL_TOKENS, *words]


def prompt_tokens(request: Request, text: str | None = None) -> list[str]:
    """Tags, the request's words (or ``text``: the ASR transcript of a spoken request) and the separator."""
    return [*request.tags, *(request.text if text is None else text).split()[:MAX_WORDS], SEP]


def sample_request(rng: np.random.Generator, intent: str, held_out: bool, spoken_fraction: float,
                   speak_fraction: float) -> Request:
    speak = bool(rng.random() < speak_fraction)
    return Request(intent, request_text(intent, rng, held_out, speak), bool(rng.random() < spoken_fraction), speak)


def training_corpus(n: int, seed: int, vocab: dict[str, int], spoken_fraction: float = 0.5,
                    speak_fraction: float = 0.5) -> torch.Tensor:
    """(n, L) token ids of prompt + gold program, right-padded, from the training paraphrases only."""
    rng = np.random.default_rng(seed)
    length = 2 + MAX_WORDS + 1 + MAX_PROGRAM
    rows = torch.full((n, length), vocab[PAD], dtype=torch.long)
    for i in range(n):
        request = sample_request(rng, INTENTS[rng.integers(len(INTENTS))], False, spoken_fraction, speak_fraction)
        ids = [vocab[t] for t in prompt_tokens(request) + gold_program(request)]
        rows[i, :len(ids)] = torch.tensor(ids)
    return rows


def train_controller(vocab: dict[str, int], n_layer: int, n_head: int, n_embd: int, steps: int, batch_size: int,
                     lr: float, seed: int, corpus_size: int = 4000) -> tuple[GPT2LMHeadModel, list[float]]:
    corpus = training_corpus(corpus_size, seed, vocab)
    config = tiny_gpt2_config(len(vocab), corpus.shape[1] + 2, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
    model = build_tiny_gpt2(config, seed)

    def batch(generator: torch.Generator) -> torch.Tensor:
        return corpus[torch.randint(0, len(corpus), (batch_size,), generator=generator)]

    return model, train_causal_lm(model, batch, steps, lr, seed)


@torch.no_grad()
def decode_programs(model: GPT2LMHeadModel, vocab: dict[str, int], prompts: Sequence[list[str]],
                    prefixes: Sequence[list[str]], constrained: bool, max_evidence: int = 3,
                    max_len: int = MAX_PROGRAM, temperature: float = 0.0,
                    generator: torch.Generator | None = None) -> tuple[list[list[str]], list[int]]:
    """Programs for ``prompts`` after their forced ``prefixes``; also the tokens each decode generated.

    ``constrained``: the choice is restricted to the grammar's allowed next tokens (``method.grammar_mask``). Free
    decoding: the whole vocabulary, stopping at ``<EOS>`` or ``max_len`` tokens (the result may be invalid).
    ``temperature`` 0: greedy (argmax); > 0: sampled from softmax(logits / temperature) with ``generator`` (the
    stress control of the grammar mask: sampling makes free decoding leave the grammar)."""
    if temperature > 0 and generator is None:
        raise ValueError("sampled decoding (temperature > 0) needs an explicit torch.Generator")
    everything = torch.ones(len(vocab), dtype=torch.bool)
    names = {i: t for t, i in vocab.items()}
    programs: list[list[str]] = [list(p) for p in prefixes]
    generated = [0] * len(prompts)
    groups: dict[int, list[int]] = defaultdict(list)
    for i, (prompt, prefix) in enumerate(zip(prompts, prefixes, strict=True)):
        groups[len(prompt) + len(prefix)].append(i)
    for members in groups.values():
        ids = torch.tensor([[vocab[t] for t in prompts[i] + programs[i]] for i in members])
        states = {}
        for i in members:
            state = method.GrammarState()
            for token in programs[i]:
                state = method.advance(state, token, max_evidence)
            states[i] = state
        active = [True] * len(members)
        while any(active):
            logits = model(input_ids=ids).logits[:, -1]
            next_ids = []
            for row, i in enumerate(members):
                if not active[row]:
                    next_ids.append(vocab[PAD])
                    continue
                mask = method.grammar_mask(states[i], vocab, len(vocab), max_evidence) if constrained else everything
                if temperature > 0:
                    choice = method.masked_sample(logits[row], mask, temperature, generator)
                else:
                    choice = method.masked_argmax(logits[row], mask)
                token = names[choice]
                programs[i].append(token)
                generated[i] += 1
                if constrained:
                    states[i] = method.advance(states[i], token, max_evidence)
                if token == EOS or len(programs[i]) >= max_len:
                    active[row] = False
                next_ids.append(choice)
            ids = torch.cat([ids, torch.tensor(next_ids).unsqueeze(1)], dim=1)
    return programs, generated
