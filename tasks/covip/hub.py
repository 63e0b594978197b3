"""The paper profile of covip: the real policy, judge and benchmark by hub name.

What is built: the judge side of the caption reward with a real LLM behind the project's ``LLMPolicy``
interface (``tasks.common.llm_policy``: ``OpenAIServerPolicy`` on a vLLM server of
Qwen/Qwen3-30B-A3B-Instruct-2507-FP8 at the paper profile), the multiple-choice prompt of the official
``generate_qa_prompt``, the ``\\boxed{X}`` parsing of ``return_caption_matches``, the same r_pos/r_neg
formula as the cpu judge (``method.positive_from_letters`` / ``negative_from_letters``), and the benchmark
loader. What is not built: LoRA GSPO training of Qwen/Qwen3-VL-8B-Instruct (``peft`` is not installed in
the project's environment) and the paper-profile evaluation loop; ``train``/``evaluate`` say so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from tasks.common.llm_policy import LLMPolicy
from tasks.covip import method
from tasks.covip.config import HubConfig

CHOICES = ("A", "B", "C", "D")
BOXED = re.compile(r"\\boxed\{(.*?)\}", flags=re.DOTALL)
# Reconstructed: the official judge prompt (get_prompt_qatask) was not available verbatim to the project.
JUDGE_TEMPLATE = ("Read the caption and answer the multiple-choice question using only the caption. If the caption "
                  "does not contain the answer, choose D.\n\nCaption: {caption}\n\n{question}\n"
                  "Answer with the letter inside \\boxed{{}}.")


def mcqa_prompt(question: str, options: Mapping[str, str]) -> str:
    """Official ``generate_qa_prompt``: 'Question: q' then one 'X. option' line per choice A-D."""
    return f"Question: {question}\n" + "".join(f"{c}. {options[c]}\n" for c in CHOICES)


def judge_prompt(caption: str, question: str, options: Mapping[str, str]) -> str:
    return JUDGE_TEMPLATE.format(caption=caption, question=mcqa_prompt(question, options))


def parse_boxed(reply: str) -> str:
    """The first ``\\boxed{...}`` content, stripped; D (cannot be determined) when there is none."""
    found = BOXED.findall(reply)
    return found[0].strip() if found else method.CANNOT_DETERMINE


def judge_letters(judge: LLMPolicy, caption: str, questions: Sequence[Mapping[str, Any]], hub: HubConfig,
                  seed: int = 0) -> list[str]:
    """One judge call per QA (``question``, ``options`` {A..D}); temperature from the config (0.7 in the
    paper; ``LLMPolicy.generate`` has no top-p/top-k, which a vLLM server sets by its own defaults)."""
    prompts = [judge_prompt(caption, q["question"], q["options"]) for q in questions]
    replies = judge.generate(prompts, max_new_tokens=256, temperature=hub.judge_temperature, seed=seed)
    return [parse_boxed(r) for r in replies]


def judged_caption_reward(judge: LLMPolicy, caption: str, present: Sequence[Mapping[str, Any]],
                          absent: Sequence[Mapping[str, Any]], hub: HubConfig, length_in_tokens: int,
                          length_limit: int = 511, seed: int = 0) -> float:
    """``yes_no_reward_caps`` with an LLM judge: -1 for heavy repetition or more than ``length_limit``
    tokens, else r_pos + r_neg over the judge's letters."""
    if method.has_heavy_repetition(caption.split()) or length_in_tokens > length_limit:
        return -1.0
    r_pos = method.positive_from_letters(judge_letters(judge, caption, present, hub, seed),
                                         [q["correct_answer"] for q in present])
    r_neg = method.negative_from_letters(judge_letters(judge, caption, absent, hub, seed + len(present)))
    return r_pos + r_neg


def load_benchmark(name: str, split: str = "test", **kwargs: Any):
    """The benchmark by hub name (or a local folder/file for tests) through ``datasets.load_dataset``."""
    from datasets import load_dataset

    return load_dataset(name, split=split, **kwargs)


def lora_settings(hub: HubConfig) -> dict[str, Any]:
    """The official LoRA settings (r 64, alpha 128, dropout 0.05, vision tower frozen), as peft keywords."""
    return {"r": hub.lora_r, "lora_alpha": hub.lora_alpha, "lora_dropout": hub.lora_dropout,
            "target_modules": "all-linear", "exclude_modules": r".*visual.*"}
