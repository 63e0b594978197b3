"""Paper profile of edumirror: an open instruct model (``hub.agent_model``, e.g. Qwen/Qwen2.5-7B-Instruct) makes
the agents' select step and codes the narrations (the paper's LLM Rater), through ``LLMPolicy``: a local
OpenAI-compatible server (vLLM) at ``hub.server_url``, or the model in process. **[reconstructed]**

The planner still proposes options and evaluates their value-driven utilities (shown to the model as context);
the LLM chooses among the proposed options by number. An answer that names no valid option falls back to the
highest-utility option and is counted (``llm_fallback_rate``). The Surveyor stays the numeric response model of
measurement.py (an LLM answering scale items in character is not implemented here). Tested only with a tiny local
stand-in model; never the network in tests.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tasks.common.llm_policy import LLMPolicy, OpenAIServerPolicy, TransformersPolicy
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.edumirror import method, simulation
from tasks.edumirror.config import EdumirrorConfig, HubConfig
from tasks.edumirror.measurement import NAMES, narrate
from tasks.edumirror.simulation import CATEGORIES, AgentView, Option

OPTION_TEXT = {"exclude": "leave {t} out of the group", "rumour": "spread a rumour about {t}",
               "confront": "shove {t}", "help": "help {t} and include them", "comfort": "comfort {t}",
               "socialise": "chat and play with {t}", "report": "tell the teacher what happened",
               "withdraw": "stay alone", "study": "study"}


def svo_label(theta: float) -> str:
    """Murphy's SVO categories by angle."""
    if theta < -12.04:
        return "competitive"
    if theta < 22.45:
        return "individualistic"
    if theta < 57.15:
        return "prosocial"
    return "altruistic"


def agent_prompt(view: AgentView, options: Sequence[Option], utilities: np.ndarray) -> str:
    """The select step's prompt: profile, needs, recent memory and the proposed options."""
    needs = ", ".join(f"{n} {v:.1f}" for n, v in zip(method.NEED_NAMES, view.needs, strict=True))
    memory = "; ".join(f"tick {t}: {NAMES[a]} {act}" + (f" {NAMES[j]}" if j is not None else "")
                       for t, a, act, j in view.memory[-5:]) or "nothing yet"
    lines = [f"{i + 1}. {OPTION_TEXT[o.action].format(t=NAMES[o.target] if o.target is not None else '')} "
             f"(value {u:+.2f})" for i, (o, u) in enumerate(zip(options, utilities, strict=True))]
    return (f"You are {NAMES[view.index]}, a {view.role} in a school class, with a {svo_label(view.theta)} social "
            f"value orientation. Your needs on a 0-10 scale: {needs}. Recently: {memory}.\n"
            "Which of these do you do now?\n" + "\n".join(lines) + "\nAnswer with the option's number only.\nAnswer:")


def parse_choice(text: str, n_options: int) -> int | None:
    """The first integer in 1..n_options in the model's answer, as a 0-based index; None if there is none."""
    for match in re.findall(r"\d+", text):
        if 1 <= int(match) <= n_options:
            return int(match) - 1
    return None


@dataclass
class LLMAgentPolicy:
    """The select step by an LLM; counts its calls and fallbacks."""

    llm: LLMPolicy
    temperature: float
    max_new_tokens: int
    calls: int = 0
    fallbacks: int = 0

    def select(self, view: Callable[[], AgentView], options: Sequence[Option], utilities: np.ndarray,
               rng: np.random.Generator) -> int:
        prompt = agent_prompt(view(), options, utilities)
        answer = self.llm.generate([prompt], self.max_new_tokens, self.temperature,
                                   seed=int(rng.integers(2**31 - 1)))[0]
        self.calls += 1
        choice = parse_choice(answer, len(options))
        if choice is None:
            self.fallbacks += 1
            return int(np.argmax(utilities))
        return choice


def rater_prompt(narration: str) -> str:
    categories = "\n".join(f"{i + 1}. {c}" for i, c in enumerate(CATEGORIES))
    return (f"Code the behaviour in this classroom observation.\nObservation: {narration}\nCategories:\n"
            f"{categories}\nAnswer with the category's number only.\nAnswer:")


def llm_code(llm: LLMPolicy, narrations: Sequence[str], max_new_tokens: int) -> tuple[np.ndarray, int]:
    """The LLM Rater's categories (greedy); an unparseable answer is coded neutral and counted."""
    answers = llm.generate([rater_prompt(t) for t in narrations], max_new_tokens, 0.0, seed=0)
    neutral = CATEGORIES.index("neutral")
    codes, unparsed = [], 0
    for answer in answers:
        choice = parse_choice(answer, len(CATEGORIES))
        unparsed += choice is None
        codes.append(neutral if choice is None else choice)
    return np.array(codes), unparsed


def load_policy(hub: HubConfig, device: str) -> LLMPolicy:
    """The server at ``server_url`` if given, else the model in process (a local folder as is, a hub name
    downloaded first: paper profile only)."""
    if hub.server_url:
        return OpenAIServerPolicy(hub.server_url, hub.agent_model, chat=True)
    import torch

    path = Path(hub.agent_model)
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(hub.agent_model))
    policy = TransformersPolicy.from_directory(path, dtype=getattr(torch, hub.dtype), device=device)
    policy.chat = getattr(policy.tokenizer, "chat_template", None) is not None
    return policy


def evaluate(cfg: EdumirrorConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress, llm: LLMPolicy | None = None) -> SeedResult:
    """Every experiment of the cpu profile with LLM-driven agents (``hub.replicates`` classrooms per experiment),
    plus the LLM Rater's kappa on a sample of narrations."""
    from tasks.edumirror.evaluate import simulate_and_measure

    hub = cfg.hub
    assert hub is not None
    llm = llm if llm is not None else load_policy(hub, device)
    policy = LLMAgentPolicy(llm, hub.temperature, hub.max_new_tokens)
    scenario = cfg.scenario.model_copy(update={"replicates": max(2, hub.replicates),
                                               "sweep_replicates": max(2, hub.replicates),
                                               "size_replicates": max(2, hub.replicates)})
    small = cfg.model_copy(update={"scenario": scenario})
    result = simulate_and_measure(small, seed, model_dir, policy, progress)
    rng = np.random.default_rng([seed, 99])
    events = [simulation.Event(0, int(a), act, int(t), False)
              for a, act, t in zip(rng.integers(5, size=hub.rater_sample),
                                   rng.choice(list(simulation.CATEGORY_OF), size=hub.rater_sample),
                                   rng.integers(5, size=hub.rater_sample), strict=True)]
    texts = [narrate(e.action, e.actor, e.target if simulation.CATEGORY_OF[e.action] != 3 else None,
                     int(rng.integers(6)), int(rng.integers(8))) for e in events]
    codes, unparsed = llm_code(llm, texts, hub.max_new_tokens)
    truth = np.array([simulation.CATEGORY_OF[e.action] for e in events])
    return result.add(llm_rater_kappa=method.cohens_kappa(method.confusion_matrix(truth, codes, len(CATEGORIES))),
                      llm_rater_unparsed=float(unparsed), llm_agent_calls=float(policy.calls),
                      llm_fallback_rate=policy.fallbacks / max(1, policy.calls))
