"""Paper profile **[partial, reconstructed]**: the controller is an instruct LLM behind ``LLMPolicy`` (in process,
or any OpenAI-compatible server that returns prompt log-probs, e.g. vLLM at ``hub.server_url``), decoded under
the same protocol grammar (method.py): at every step it chooses among the control tokens the grammar allows,
scored by the model (``LLMPolicy.choose``), so no illegal program can come out. The ASR and vision experts load
through ``transformers`` pipelines by hub name.

Not implemented (README, "Paper profile"): the benchmark evaluation (lmms-eval on MMBench, MMStar, MME,
Video-MME, LVBench, WorldSense), the TTS expert (CosyVoice2 has no ``transformers`` loader) and the jointly
trained omni baselines. ``evaluate_paper_profile`` says so instead of returning numbers.
Tested only with local stand-ins (a tiny GPT-2 with a byte-level tokenizer); never the network in tests.
"""

from __future__ import annotations

from pathlib import Path

from tasks.common.llm_policy import LLMPolicy, OpenAIServerPolicy, TransformersPolicy
from tasks.common.results import Progress, SeedResult
from tasks.llm_orchestration import method
from tasks.llm_orchestration.config import HubConfig, LlmOrchestrationConfig

INSTRUCTION = ("You route a user's request to experts. Control tokens: <ASR> transcribe speech, <VISION:img> describe "
               "the attached image, <VIDEO:vid> describe the attached video, <MEM_READ> reuse an earlier expert "
               "output, "
               "<MEM_WRITE> store this turn's expert outputs, <ANSWER> answer, <TTS> speak the answer, <EOS> end.\n")


def planner_prompt(request: str, attachments: list[str], instruction: str = INSTRUCTION) -> str:
    attached = ", ".join(attachments) if attachments else "nothing"
    return f"{instruction}Attached: {attached}.\nRequest: {request}\nProgram:"


def plan(policy: LLMPolicy, request: str, attachments: list[str], max_evidence: int = 3,
         instruction: str = INSTRUCTION) -> list[str]:
    """Grammar-constrained decoding with any ``LLMPolicy``: at each step the model picks (``choose``, highest
    log-probability of the token's text) among the tokens ``method.allowed_next`` permits."""
    prompt = planner_prompt(request, attachments, instruction)
    state, program = method.GrammarState(), []
    while state.state != method.ACCEPTED:
        options = method.allowed_next(state, max_evidence)
        token = options[policy.choose(prompt + "".join(" " + t for t in program), [" " + t for t in options])]
        program.append(token)
        state = method.advance(state, token, max_evidence)
    return program


def load_policy(hub: HubConfig, device: str) -> LLMPolicy:
    """A server at ``server_url`` (it must return prompt log-probs: vLLM), else the model in process; a local
    folder is used as is, a hub name is downloaded first (paper profile only)."""
    if hub.server_url:
        return OpenAIServerPolicy(hub.server_url, hub.controller_model, chat=False)
    import torch

    path = Path(hub.controller_model)
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(hub.controller_model))
    return TransformersPolicy.from_directory(path, dtype=getattr(torch, hub.dtype), device=device)


def load_asr(hub: HubConfig, device: str):
    """The ASR expert (e.g. ``openai/whisper-large-v3``) as a ``transformers`` pipeline."""
    from transformers import pipeline

    return pipeline("automatic-speech-recognition", model=hub.asr_model, device=device)


def load_vision(hub: HubConfig, device: str):
    """The vision/video expert (e.g. ``Qwen/Qwen2.5-VL-7B-Instruct``) as an ``image-text-to-text`` pipeline."""
    from transformers import pipeline

    return pipeline("image-text-to-text", model=hub.vision_model, device=device)


def evaluate_paper_profile(cfg: LlmOrchestrationConfig, seed: int, progress: Progress) -> SeedResult:
    raise NotImplementedError(
        "llm_orchestration paper profile: the benchmark evaluation (lmms-eval on MMBench/MMStar/MME/Video-MME/"
        "LVBench/WorldSense), the CosyVoice2 TTS expert and the omni baselines are not implemented; hub.plan "
        "(grammar-constrained planning with an LLMPolicy) and the ASR/vision loaders are")
