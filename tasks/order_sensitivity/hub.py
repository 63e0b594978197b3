"""Paper profile: label-token probabilities of a real causal LM on real evidence items (FEVER, HotpotQA).

Each item is rendered as a text prompt (evidence chunks in a given order, then the claim, then "Answer:");
q = P(" 1") / (P(" 1") + P(" 0")) at the next token. Skeletons replace EVERY chunk by "[MASK]"
(no gold relevance: a user of the method cannot tell which chunks are relevant; the official toolkit's
evidence-erase skeleton blanks the whole evidence field).
Tested only with local stand-ins (a tiny random GPT-2 and a word-level tokenizer); never the network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from tasks.common.results import Progress
from tasks.order_sensitivity import data
from tasks.order_sensitivity.config import OrderSensitivityConfig
from tasks.order_sensitivity.measures import ScoredItems

MASK_TEXT = "[MASK]"
DOSE_CHUNKS = 4


def load_hub_model(name_or_path: str, dtype: str, load_in_4bit: bool = False):
    """Paper profile: a causal LM and its tokenizer by hub name (a local folder in tests)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
    if load_in_4bit:
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                           bnb_4bit_compute_dtype=getattr(torch, dtype))
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    model = AutoModelForCausalLM.from_pretrained(name_or_path, **kwargs)
    return model.eval(), tokenizer


def render_prompt(chunks: list[str], claim: str) -> str:
    evidence = "\n".join(f"- {chunk}" for chunk in chunks)
    return (f"Evidence:\n{evidence}\nClaim: {claim}\n"
            "Is the claim supported by the evidence? Answer 1 for yes, 0 for no.\nAnswer:")


def label_token_ids(tokenizer) -> tuple[int, int]:
    """Ids of the label tokens " 0" and " 1" (the last sub-token, as a tokenizer may split the space)."""
    zero, one = tokenizer.encode(" 0", add_special_tokens=False), tokenizer.encode(" 1", add_special_tokens=False)
    if not zero or not one or zero[-1] == one[-1]:
        raise ValueError("order_sensitivity.hub.model: the tokenizer has no distinct label tokens ' 0' / ' 1'")
    return zero[-1], one[-1]


def score_prompts(model, tokenizer, prompts: list[str], device: str) -> np.ndarray:
    """q = P("1") / (P("1") + P("0")) of the next token after each prompt (one prompt at a time: no padding)."""
    zero, one = label_token_ids(tokenizer)
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
            logits = model(input_ids=ids).logits[0, -1].double().cpu()
            out.append(float(torch.sigmoid(logits[one] - logits[zero])))
    return np.asarray(out)


def dose_items(frame: pl.DataFrame, rng: np.random.Generator) -> pl.DataFrame:
    """Dose study on real items: supported items with >= 3 relevant chunks keep d = 0..3 of them plus
    distractors (non-relevant chunks of the whole set) up to 4 chunks; d = 0 is a Control [project design]."""
    pool = [c for chunks, flags in zip(frame["chunks"], frame["relevant"]) for c, r in zip(chunks, flags) if not r]
    rows = []
    for item in frame.filter((pl.col("label") == 1) & ~pl.col("is_control")).iter_rows(named=True):
        relevant = [c for c, r in zip(item["chunks"], item["relevant"]) if r]
        if len(relevant) < DOSE_CHUNKS - 1 or len(pool) < DOSE_CHUNKS:
            continue
        for dose in range(DOSE_CHUNKS):
            fillers = [pool[int(i)] for i in rng.permutation(len(pool))[:DOSE_CHUNKS - dose]]
            rows.append({"claim": item["claim"], "chunks": relevant[:dose] + fillers,
                         "relevant": [True] * dose + [False] * (DOSE_CHUNKS - dose),
                         "label": 1 if dose else data.NO_LABEL, "is_control": dose == 0, "n_chunks": DOSE_CHUNKS,
                         "dose": dose})
    return pl.DataFrame(rows)


def score_items(model, tokenizer, frame: pl.DataFrame, permutations: int, skeletons: int, rng: np.random.Generator,
                device: str, progress: Progress | None = None) -> ScoredItems:
    """Every item of ``frame`` under m uniform permutations, skeletons of the first k, and its stored order."""
    q_full, q_skeleton, q_identity = [], [], []
    for i, item in enumerate(frame.iter_rows(named=True)):
        chunks = list(item["chunks"])
        masked = [MASK_TEXT] * len(chunks)  # the evidence erased; the gold relevance is never read
        orders = [rng.permutation(len(chunks)) for _ in range(permutations)]
        q_full.append(score_prompts(model, tokenizer, [render_prompt([chunks[j] for j in o], item["claim"])
                                                       for o in orders], device))
        q_skeleton.append(score_prompts(model, tokenizer, [render_prompt([masked[j] for j in o], item["claim"])
                                                           for o in orders[:skeletons]], device))
        q_identity.append(score_prompts(model, tokenizer, [render_prompt(chunks, item["claim"])], device)[0])
        if progress is not None and (i + 1) % 20 == 0:
            progress((i + 1) / frame.height, f"scored {i + 1}/{frame.height} items")
    dose = frame["dose"].to_numpy() if "dose" in frame.columns else np.full(frame.height, -1)
    return ScoredItems(np.asarray(q_full), np.asarray(q_skeleton), np.asarray(q_identity), frame["label"].to_numpy(),
                       frame["is_control"].to_numpy(), frame["n_chunks"].to_numpy(), dose)


def read_hub_items(cfg: OrderSensitivityConfig, seed: int, data_dir: Path) -> pl.DataFrame:
    """The seed's real evidence items, checked against the config before any model is loaded."""
    path = data.hub_items_path(data_dir, seed)
    if not path.is_file():
        raise FileNotFoundError(f"order_sensitivity.hub: {path} is missing; run the data phase first")
    frame = pl.read_parquet(path)
    expected = 2 * cfg.hub.items_per_source
    if frame.height > expected:
        raise ValueError(f"order_sensitivity.hub.items_per_source: {path} holds {frame.height} items, more than "
                         f"2 x {cfg.hub.items_per_source}; rerun the data phase")
    return frame


def hub_scores(cfg: OrderSensitivityConfig, frame: pl.DataFrame, seed: int, device: str,
               progress: Progress | None) -> tuple[ScoredItems, ScoredItems | None, dict[str, float]]:
    """The hub model scores the test items and the dose items built from them (one stream (seed, 3003))."""
    model, tokenizer = load_hub_model(cfg.hub.model, cfg.hub.dtype, cfg.hub.load_in_4bit)
    if not cfg.hub.load_in_4bit:
        model.to(device)
    ev = cfg.evaluation
    rng = np.random.default_rng([seed, 3_003])
    test = score_items(model, tokenizer, frame, ev.permutations, ev.skeletons, rng, device, progress)
    doses = dose_items(frame, rng)
    dose = (score_items(model, tokenizer, doses, ev.permutations, ev.skeletons, rng, device)
            if doses.height else None)
    return test, dose, {"n_items": float(frame.height)}
