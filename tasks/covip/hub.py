"""The paper profile of covip: the real policy, judge and benchmark by hub name.

What is built: the judge side of the caption reward with a real LLM behind the project's ``LLMPolicy``
interface (``tasks.common.llm_policy``) or ``OfficialJudge`` (the official ``return_result``: chat, T 0.7,
top-p 0.8, top-k 20, min-p 0 on a vLLM server of Qwen/Qwen3-30B-A3B-Instruct-2507-FP8), the judge prompt of
the official ``get_prompt_qatask`` and the multiple-choice block of ``generate_qa_prompt`` (verbatim,
``evaluation/CapEval_QAs_save.py``), the ``\\boxed{X}`` parsing of ``return_caption_matches``, the official
containment test ``return_answer`` (the expected letter must occur in the boxed reply), the same r_pos/r_neg
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
# Verbatim from the official get_prompt_qatask (oyt9306/CoViP, evaluation/CapEval_QAs_save.py), indentation
# included: the official string is an indented triple-quoted literal and is sent as is.
JUDGE_RULES = """You are given a description about an object. This description may or may not contain enough information to answer a multiple-choice question.
    You must answer the question using only the information in the description below.
    - Do NOT use any external knowledge.
    - Do NOT assume facts that are not clearly supported by the description.

    [Answering Rules]
    1. Read the description carefully.
    2. For each question, choose the SINGLE best option:
    - If one of A/B/C is explicitly or clearly supported by the description, choose that option.
    - If NONE of A/B/C can be confirmed from the description, choose D.
    3. You MUST ignore any information that is not in the description.
    4. For each question:
    - You may briefly explain your reasoning in natural language.
    - Then, on a separate line, output the final choice in the exact format:

        Answer: \\boxed{X}

    where X is one of A, B, C, or D.
    5. Inside \\boxed{} there must be EXACTLY ONE letter (A/B/C/D), no extra text.
    """  # noqa: E501 (the official text, byte for byte)


def mcqa_prompt(question: str, options: Mapping[str, str]) -> str:
    """Official ``generate_qa_prompt``: 'Question: q' then one 'X. option' line per choice A-D."""
    return f"Question: {question}\n" + "".join(f"{c}. {options[c]}\n" for c in CHOICES)


def judge_prompt(caption: str, question: str, options: Mapping[str, str]) -> str:
    """Official ``get_prompt_qatask(caption, generate_qa_prompt(qa))``."""
    return JUDGE_RULES + f"""
    [Description]
    {caption}

    [Question]
    {mcqa_prompt(question, options)}"""


def parse_boxed(reply: str) -> str:
    """The first ``\\boxed{...}`` content as the official code takes it (not stripped); D (cannot be
    determined) when there is none."""
    found = BOXED.findall(reply)
    return found[0] if found else method.CANNOT_DETERMINE


def contained_letters(replies: Sequence[str], expected: Sequence[str]) -> list[str]:
    """Official ``return_answer(a1, a)`` is ``a in a1``: a boxed reply counts as the expected letter when it
    contains it (``D. The answer cannot be determined`` counts as D). Each reply is mapped to the expected
    letter if it contains it, else kept, so ``method``'s equality test then applies the containment rule."""
    return [want if want in got else got for got, want in zip(replies, expected, strict=True)]


class OfficialJudge:
    """The official ``return_result``: one chat message per prompt to the vLLM judge, temperature, top-p,
    and top-k / min-p 0 through ``extra_body``; the reply stripped. ``client`` defaults to an OpenAI client
    on ``hub.judge_base_url`` (tests pass a stand-in)."""

    def __init__(self, hub: HubConfig, client: Any = None):
        if client is None:
            from openai import OpenAI

            client = OpenAI(api_key="EMPTY", base_url=hub.judge_base_url)
        self.hub, self.client = hub, client

    def generate(self, prompts: Sequence[str], max_new_tokens: int, temperature: float = 0.0,
                 seed: int = 0) -> list[str]:
        replies = []
        for index, prompt in enumerate(prompts):
            response = self.client.chat.completions.create(
                model=self.hub.judge_model, messages=[{"role": "user", "content": prompt}],
                temperature=temperature, top_p=self.hub.judge_top_p, max_tokens=max_new_tokens, seed=seed + index,
                extra_body={"top_k": self.hub.judge_top_k, "min_p": 0.0})
            replies.append(response.choices[0].message.content.strip())
        return replies


def judge_letters(judge: LLMPolicy | OfficialJudge, caption: str, questions: Sequence[Mapping[str, Any]],
                  hub: HubConfig, seed: int = 0) -> list[str]:
    """One judge call per QA (``question``, ``options`` {A..D}) at the config's temperature (0.7 in the
    paper); the boxed replies, unstripped. ``OfficialJudge`` also sends top-p / top-k; a generic
    ``LLMPolicy`` has no top-k (its server defaults apply)."""
    prompts = [judge_prompt(caption, q["question"], q["options"]) for q in questions]
    replies = judge.generate(prompts, max_new_tokens=256, temperature=hub.judge_temperature, seed=seed)
    return [parse_boxed(r) for r in replies]


def judged_caption_reward(judge: LLMPolicy | OfficialJudge, caption: str, present: Sequence[Mapping[str, Any]],
                          absent: Sequence[Mapping[str, Any]], hub: HubConfig, length_in_tokens: int,
                          length_limit: int = 511, seed: int = 0) -> float:
    """``yes_no_reward_caps`` with an LLM judge: -1 for heavy repetition or more than ``length_limit``
    tokens, else r_pos + r_neg over the judge's letters."""
    if method.has_heavy_repetition(caption.split()) or length_in_tokens > length_limit:
        return -1.0
    answers = [q["correct_answer"] for q in present]
    r_pos = method.positive_from_letters(contained_letters(judge_letters(judge, caption, present, hub, seed), answers),
                                         answers)
    absent_letters = judge_letters(judge, caption, absent, hub, seed + len(present))
    r_neg = method.negative_from_letters(contained_letters(absent_letters, [method.CANNOT_DETERMINE] * len(absent)))
    return r_pos + r_neg


def load_benchmark(name: str, split: str = "test", **kwargs: Any):
    """The benchmark by hub name (or a local folder/file for tests) through ``datasets.load_dataset``."""
    from datasets import load_dataset

    return load_dataset(name, split=split, **kwargs)


def lora_settings(hub: HubConfig) -> dict[str, Any]:
    """The official LoRA settings (r 64, alpha 128, dropout 0.05, vision tower frozen), as peft keywords."""
    return {"r": hub.lora_r, "lora_alpha": hub.lora_alpha, "lora_dropout": hub.lora_dropout,
            "target_modules": "all-linear", "exclude_modules": r".*visual.*"}
