"""Paper profile of multi_model_curation (the project's proposal; the paper's own experiments are
unknown): chat LMs fine-tuned on each other's Bradley-Terry-curated generations, scored by hub reward
models. It runs in the training step: the loop trains the generators and measures their alignment
every round (the curves ``hub_A<i>``; claim_metrics derives the claims' gains from them).

Round t, for every generator j: sample K responses per training prompt, score them with r_j, keep
one with probability softmax(beta_j r_j). Generator i then runs ``sft_steps`` steps of supervised
fine-tuning on D_i = real_share (prompt, human response) + sum_j W_ij (generator j's kept pairs).
Alignment A_i = mean r_i of generator i's sampled responses on held-out prompts.
Runs only with hub access and a GPU; the tests drive it with tiny local stand-ins.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.common import tiny_lm
from tasks.multi_model_curation import method
from tasks.multi_model_curation.config import HubConfig

Pair = tuple[str, str]


# ------------------------------------------------------------------------------------------------
# Hugging Face loaders (exercised in tests with local stand-ins only)
# ------------------------------------------------------------------------------------------------

def response_text(value: Any) -> str:
    """A human response: plain text, or the last assistant turn of a chat (ultrafeedback's 'chosen')."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and isinstance(value[-1], dict):
        assistant = [turn["content"] for turn in value if turn.get("role") == "assistant"]
        return assistant[-1] if assistant else str(value[-1].get("content", ""))
    raise ValueError(f"response_column: cannot read a response from {type(value).__name__}")


def load_prompt_pairs(dataset: str, split: str, prompt_column: str, response_column: str, n: int
                      ) -> list[tuple[str, str]]:
    """The first ``n`` (prompt, human response) pairs of a hub data set (or a local data folder)."""
    from datasets import load_dataset

    rows = load_dataset(dataset, split=split)
    for column in (prompt_column, response_column):
        if column not in rows.column_names:
            raise KeyError(f"hub.{'prompt' if column == prompt_column else 'response'}_column: {column!r} not in "
                           f"{dataset} columns {rows.column_names}")
    if len(rows) < n:
        raise ValueError(f"hub.n_prompts: {dataset}[{split}] has {len(rows)} rows, fewer than {n}")
    rows = rows.select(range(n))
    return [(str(p), response_text(r)) for p, r in zip(rows[prompt_column], rows[response_column])]


def load_generator(name_or_path: str, dtype: str):
    """A causal LM and its tokenizer (left padding, so batched generation continues the prompt)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=getattr(torch, dtype))
    return model, tokenizer


def load_reward_model(name_or_path: str):
    """A sequence-classification reward model (one logit) and its tokenizer."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token if tokenizer.eos_token is not None else tokenizer.unk_token
    model = AutoModelForSequenceClassification.from_pretrained(name_or_path)
    return model.eval(), tokenizer


def chat_prompt(tokenizer: Any, prompt: str) -> str:
    """The user turn in the generator's chat format (plain text plus a newline without a template)."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
    return prompt + "\n"


@torch.no_grad()
def generate(model: Any, tokenizer: Any, prompts: list[str], n_per_prompt: int, max_new_tokens: int,
             device: str, batch_size: int) -> list[list[str]]:
    """``n_per_prompt`` sampled responses per prompt (temperature 1: the model's own distribution)."""
    out: list[list[str]] = []
    for start in range(0, len(prompts), batch_size):
        chunk = [chat_prompt(tokenizer, p) for p in prompts[start:start + batch_size]]
        encoded = tokenizer(chunk, return_tensors="pt", padding=True).to(device)
        tokens = model.generate(**encoded, do_sample=True, top_k=0, top_p=1.0, temperature=1.0,
                                max_new_tokens=max_new_tokens, num_return_sequences=n_per_prompt,
                                pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(tokens[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
        out.extend(texts[i * n_per_prompt:(i + 1) * n_per_prompt] for i in range(len(chunk)))
    return out


@torch.no_grad()
def score(reward_model: Any, tokenizer: Any, prompts: list[str], responses: list[str], device: str,
          batch_size: int) -> np.ndarray:
    """r(prompt, response): the reward model's single logit on the (prompt, response) text pair."""
    values = []
    for start in range(0, len(prompts), batch_size):
        encoded = tokenizer(prompts[start:start + batch_size], responses[start:start + batch_size],
                            return_tensors="pt", padding=True, truncation=True).to(device)
        values.append(reward_model(**encoded).logits[:, 0].float().cpu().numpy())
    return np.concatenate(values) if values else np.zeros(0)


def sft(model: Any, tokenizer: Any, pairs: list[Pair], steps: int, batch_size: int, lr: float, device: str,
        rng: np.random.Generator) -> float:
    """Supervised fine-tuning on (prompt, response) pairs; the loss covers response tokens only."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss_value = float("nan")
    for _ in range(steps):
        batch = [pairs[i] for i in rng.choice(len(pairs), size=min(batch_size, len(pairs)), replace=False)]
        prompts = [chat_prompt(tokenizer, p) for p, _ in batch]
        full = [p + r for p, (_, r) in zip(prompts, batch)]
        encoded = tokenizer(full, return_tensors="pt", padding=True, truncation=True).to(device)
        labels = encoded["input_ids"].clone()
        labels[encoded["attention_mask"] == 0] = -100
        for row, prompt in enumerate(prompts):
            prompt_len = len(tokenizer(prompt)["input_ids"])
            pad = int((encoded["attention_mask"][row] == 0).sum()) if tokenizer.padding_side == "left" else 0
            labels[row, pad:pad + prompt_len] = -100
        loss = model(**encoded, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_value = float(loss.detach())
    model.eval()
    return loss_value


def mixture(hub: HubConfig, model: int, real: list[Pair], pools: list[list[Pair]], rng: np.random.Generator
            ) -> list[Pair]:
    """D_i with the configured shares, as many pairs as there are training prompts."""
    size = len(real)
    parts = [real[i] for i in rng.choice(size, size=int(round(hub.real_share * size)), replace=False)]
    for source, pool in enumerate(pools):
        count = int(round(hub.mixing[model][source] * size))
        if count and pool:
            parts.extend(pool[i] for i in rng.choice(len(pool), size=min(count, len(pool)), replace=False))
    return parts


Model = tuple[Any, Any]  # (model, tokenizer)


def load_models(hub: HubConfig, device: str) -> tuple[list[Model], list[Model]]:
    """The generators (eval mode) and the reward models, on ``device``."""
    generators = [load_generator(name, hub.dtype) for name in hub.generators]
    for model, _ in generators:
        model.to(device).eval()
    judges = [load_reward_model(name) for name in hub.reward_models]
    for model, _ in judges:
        model.to(device)
    return generators, judges


def judge_of(judges: list[Model], i: int) -> Model:
    """Generator i's reward model: its own, or the one shared by all."""
    return judges[i if len(judges) > 1 else 0]


def alignment_now(hub: HubConfig, generators: list[Model], judges: list[Model], eval_prompts: list[str],
                  device: str) -> list[float]:
    """A_i: the mean reward r_i of one sampled response of generator i per held-out prompt."""
    values = []
    for i, (model, tokenizer) in enumerate(generators):
        responses = [r[0] for r in generate(model, tokenizer, eval_prompts, 1, hub.max_new_tokens, device,
                                            hub.batch_size)]
        values.append(float(score(*judge_of(judges, i), eval_prompts, responses, device, hub.batch_size).mean()))
    return values


def curated_pools(hub: HubConfig, generators: list[Model], judges: list[Model], prompts: list[str], device: str,
                  rng: np.random.Generator) -> list[list[Pair]]:
    """Every generator's kept pairs of one round: K sampled responses per prompt, one kept with
    probability softmax(beta_j r_j)."""
    pools: list[list[Pair]] = []
    for j, (model, tokenizer) in enumerate(generators):
        candidates = generate(model, tokenizer, prompts, hub.k, hub.max_new_tokens, device, hub.batch_size)
        flat_prompts = [p for p in prompts for _ in range(hub.k)]
        rewards = score(*judge_of(judges, j), flat_prompts, [c for group in candidates for c in group], device,
                        hub.batch_size).reshape(len(prompts), hub.k)
        picked = method.bradley_terry_pick(rewards, hub.beta[j], rng)
        pools.append([(p, group[k]) for p, group, k in zip(prompts, candidates, picked)])
    return pools


def run_hub_loop(hub: HubConfig, seed: int, device: str, model_dir: Path,
                 progress: Callable[[float, str], None] | None = None) -> dict[str, list[float]]:
    """``hub.rounds`` rounds of the multi-model loop; saves the fine-tuned generators in ``model_dir``
    (``generator<i>/``) and returns the alignment trajectories ``hub_A<i>`` (round 0 = before training)."""
    pairs = load_prompt_pairs(hub.prompts_dataset, hub.prompts_split, hub.prompt_column, hub.response_column,
                              hub.n_prompts)
    eval_prompts = [p for p, _ in pairs[:hub.n_eval_prompts]]
    train = pairs[hub.n_eval_prompts:]
    generators, judges = load_models(hub, device)
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)  # generate() samples from torch's global generator; unavoidable here
    history = [alignment_now(hub, generators, judges, eval_prompts, device)]
    for round_index in range(hub.rounds):
        pools = curated_pools(hub, generators, judges, [p for p, _ in train], device, rng)
        for i, (model, tokenizer) in enumerate(generators):
            sft(model, tokenizer, mixture(hub, i, train, pools, rng), hub.sft_steps, hub.batch_size, hub.lr,
                device, rng)
        history.append(alignment_now(hub, generators, judges, eval_prompts, device))
        if progress is not None:
            progress((round_index + 1) / hub.rounds, f"seed {seed}: hub round {round_index + 1}/{hub.rounds}")
    for i, (model, _) in enumerate(generators):
        tiny_lm.save_model(model, Path(model_dir) / f"generator{i + 1}")
    trajectory = np.array(history)
    return {f"hub_A{i + 1}": trajectory[:, i].tolist() for i in range(len(generators))}
