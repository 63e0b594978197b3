"""The LLM side of the method **[reconstructed]**, over ``tasks.common.llm_policy.LLMPolicy`` (an in-process
``transformers`` model or an OpenAI-compatible server such as vLLM):

- generate: ``generate_question_pool`` asks the model for a pool of yes/no evaluation questions for a task
  (or, for a personalised rubric, for one sample's context) and parses one question per line;
- answer: ``yes_probability`` = P(" Yes") / (P(" Yes") + P(" No")) of the next words after a question prompt
  (``LLMPolicy.score``); one judging at temperature T samples the answer from the tempered two-way distribution
  (``tempered_yes_probability``), i.e. the answer token drawn at temperature T restricted to Yes / No;
- label-free likelihoods (variant B): theta[j, s] = the same probability for a hypothetical response that expert
  judges rated s + 1 of K (``hypothetical_yes_probability``);
- the free-form baseline: ``cot_score`` lets the model reason, then parses its final "Score: n".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import numpy as np

from tasks.common.llm_policy import LLMPolicy

YES, NO = " Yes", " No"
QUESTION_LINE = re.compile(r"^\s*(?:[-*]|\d+[.)])?\s*(.+\?)\s*$")
SCORE_PATTERN = re.compile(r"score\s*[:=]\s*(\d+)", re.IGNORECASE)


def question_pool_prompt(task: str, pool_size: int) -> str:
    return (f"You design evaluation rubrics. Task: {task}\n"
            f"Write {pool_size} different yes/no questions that an evaluator could answer about one response to "
            "judge its quality. Cover different criteria. One question per line, each ending with '?'.\n")


def parse_questions(text: str) -> list[str]:
    """Lines that are one question each (bullets and numbering stripped), first occurrence of each kept."""
    seen: dict[str, None] = {}
    for line in text.splitlines():
        match = QUESTION_LINE.match(line)
        if match:
            seen.setdefault(match.group(1).strip(), None)
    return list(seen)


def generate_question_pool(policy: LLMPolicy, task: str, pool_size: int, max_new_tokens: int,
                           seed: int = 0, temperature: float = 0.0) -> list[str]:
    """Step 1 (generate): up to ``pool_size`` distinct questions from the model; ValueError if it wrote < 2."""
    text = policy.generate([question_pool_prompt(task, pool_size)], max_new_tokens, temperature, seed)[0]
    questions = parse_questions(text)[:pool_size]
    if len(questions) < 2:
        raise ValueError(f"the question generator wrote {len(questions)} parseable questions (need >= 2); "
                         f"its output began: {text[:200]!r}")
    return questions


def answer_prompt(item: str, question: str) -> str:
    return f"Response to evaluate:\n{item}\n\nQuestion: {question}\nAnswer Yes or No.\nAnswer:"


def hypothetical_prompt(question: str, level: int, n_levels: int) -> str:
    return (f"Expert judges rated a response {level + 1} on a scale from 1 (worst) to {n_levels} (best).\n"
            f"Question about that response: {question}\nAnswer Yes or No.\nAnswer:")


def two_way_yes(log_yes: float, log_no: float) -> float:
    """P(yes) renormalised over the two answers: 1 / (1 + exp(log_no - log_yes))."""
    return 1.0 / (1.0 + math.exp(log_no - log_yes))


def yes_probability(policy: LLMPolicy, item: str, question: str) -> float:
    log_yes, log_no = policy.score(answer_prompt(item, question), [YES, NO])
    return two_way_yes(log_yes, log_no)


def hypothetical_yes_probability(policy: LLMPolicy, question: str, level: int, n_levels: int) -> float:
    log_yes, log_no = policy.score(hypothetical_prompt(question, level, n_levels), [YES, NO])
    return two_way_yes(log_yes, log_no)


def tempered_yes_probability(p_yes: np.ndarray, temperature: float) -> np.ndarray:
    """P(yes) at sampling temperature T over the two answers: p^(1/T) / (p^(1/T) + (1 - p)^(1/T)); T = 0 is the
    greedy answer (1 where p > 1/2, 0 where p < 1/2, 1/2 on a tie)."""
    p = np.clip(np.asarray(p_yes, dtype=np.float64), 1e-300, 1 - 1e-16)
    if temperature == 0:
        return np.where(p > 0.5, 1.0, np.where(p < 0.5, 0.0, 0.5))
    logit = (np.log(p) - np.log1p(-p)) / temperature
    return 1.0 / (1.0 + np.exp(-logit))


def yes_probabilities(policy: LLMPolicy, items: Sequence[str], questions: Sequence[str]) -> np.ndarray:
    """(n_items, n_questions) two-way P(yes) of every question about every item."""
    return np.array([[yes_probability(policy, item, q) for q in questions] for item in items])


def cot_prompt(item: str, n_levels: int) -> str:
    return (f"Response to evaluate:\n{item}\n\nThink step by step about its quality, then finish with a line "
            f"'Score: n' where n is an integer from 1 (worst) to {n_levels} (best).\n")


def parse_score(text: str, n_levels: int) -> int | None:
    """The last 'Score: n' with 1 <= n <= K, as a level n - 1; None when there is none."""
    for match in reversed(SCORE_PATTERN.findall(text)):
        if 1 <= int(match) <= n_levels:
            return int(match) - 1
    return None


def cot_score(policy: LLMPolicy, items: Sequence[str], n_levels: int, temperature: float, max_new_tokens: int,
              seed: int) -> list[int | None]:
    """The free-form baseline: one reasoning-then-score generation per item (seed + i), parsed."""
    texts = policy.generate([cot_prompt(item, n_levels) for item in items], max_new_tokens, temperature, seed)
    return [parse_score(text, n_levels) for text in texts]
