"""Paper profile of arm_ebm: the telescoping identity (claim C2e) on a real Hugging Face causal LM.

The model (``hub.hf_model``, ``openai-community/gpt2`` in params.yaml) is loaded with ``transformers``;
tests use a local stand-in folder (tests/unit/test_arm_ebm_identities.py).
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.arm_ebm.config import PaperProfileConfig
from tasks.common.seeding import torch_init_seed


def load_hub_model(name_or_path: str, dtype: str):
    """A real causal LM and its tokenizer by hub name (or a local folder in tests), in eval mode.

    Loaded under the module-initialisation lock (``torch_init_seed``): the flow's seeds run on parallel
    threads, and with transformers 5.24 models loaded by ``from_pretrained`` on several threads at once come
    back with parameters missing and left uninitialised."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    with torch_init_seed(0):
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    return model.eval(), tokenizer


def sample_continuation(model, prompt_ids: torch.Tensor, new_tokens: int, generator: torch.Generator,
                        device: str) -> torch.Tensor:
    """Ancestral sampling of ``new_tokens`` tokens after the prompt; returns prompt + continuation ids."""
    ids = prompt_ids.clone()
    with torch.no_grad():
        for _ in range(new_tokens):
            logits = model(input_ids=ids.to(device)).logits[0, -1].double().cpu()
            token = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            ids = torch.cat([ids, token[None]], dim=1)
    return ids


def telescoping_gap(q: torch.Tensor, ids: torch.Tensor, prompt_length: int) -> tuple[float, float]:
    """(|sum_t r(s_t, y_t) - (log p(y|x) + V(x))|, log p(y|x)) for the tokens after the prompt, with
    q(s_t, .) = ``q[t]`` the logits at every prefix, r(s, a) = q(s, a) - logsumexp q(s + a, .) and V = 0
    after the last sampled token."""
    start = prompt_length - 1  # position whose logits score the first new token
    steps = torch.arange(start, ids.shape[1] - 1)
    chosen = q[steps, ids[0, steps + 1]]
    values = torch.logsumexp(q[start:ids.shape[1]], dim=-1)  # V(s_t) for t = 0..T
    values[-1] = 0.0  # terminal: nothing follows the last sampled token
    rewards = chosen - values[1:]
    log_p = torch.log_softmax(q[steps], -1)[torch.arange(len(steps)), ids[0, steps + 1]].sum()
    return float(abs(rewards.sum() - (log_p + values[0]))), float(log_p)


def hub_telescoping(hub: PaperProfileConfig, seed: int, device: str) -> dict[str, float]:
    """sum_t r(s_t, y_t) = log p(y|x) + V(x) on sequences sampled from a real LM (``telescoping_gap``):
    the largest gap over every sample, and the mean log-probability of the samples."""
    model, tokenizer = load_hub_model(hub.hf_model, hub.dtype)
    model.to(device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    errors, log_probs = [], []
    for prompt in hub.prompts:
        prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        for _ in range(hub.samples_per_prompt):
            ids = sample_continuation(model, prompt_ids, hub.new_tokens, generator, device)
            with torch.no_grad():
                q = model(input_ids=ids.to(device)).logits[0].double().cpu()  # q(s_t, .) at every prefix
            error, log_p = telescoping_gap(q, ids, prompt_ids.shape[1])
            errors.append(error)
            log_probs.append(log_p)
    return {"hub_telescoping_error": max(errors), "hub_mean_log_prob": float(np.mean(log_probs))}
