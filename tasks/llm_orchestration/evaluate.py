"""Evaluation step of llm_orchestration: reads the checkpoints and measures; derives no claim numbers.

1. each expert alone on its held-out unimodal test set (the preconditions);
2. the controller's routing on the evaluation requests, with and without the grammar mask;
3. single-turn QA: the orchestrator (vision v2) against the joint model at every budget, and the
   orchestrator with vision v1 (the swap test);
4. 4-turn sessions with and without memory: accuracy, expert calls, reuse, virtual-clock latency shares;
5. TTS on the virtual clock: TTFA sequential vs parallel, and a barge-in per spoken reply;
6. parameter hashes of every expert before and after all of the above.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_model as load_safetensors_model
from transformers import GPT2Config, GPT2LMHeadModel

from tasks.common.io import load_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.seeding import torch_init_seed
from tasks.llm_orchestration import baselines, experts, method, orchestrator
from tasks.llm_orchestration.config import LlmOrchestrationConfig
from tasks.llm_orchestration.controller import decode_programs, gold_program, prompt_tokens
from tasks.llm_orchestration.data import (
    SPEECH_VOCAB,
    gold_answer,
    images_of,
    joint_inputs,
    load_stream,
    request_of,
    spectra_of,
    videos_of,
)
from tasks.llm_orchestration.train import (
    CONTROLLER_DIR,
    EXPERT_FILES,
    controller_vocab,
    joint_file,
    timed,
    word_index,
)
from tasks.llm_orchestration.world import SPEAK_SUFFIX, TEMPLATES

_LOAD_LOCK = threading.Lock()


def load_controller(directory: Path) -> GPT2LMHeadModel:
    """The controller from its ``save_pretrained`` folder, built from its config and loaded with safetensors, with
    ``lm_head`` tied to the token embeddings explicitly.

    Not ``from_pretrained``: in the 2026-12-01 cpu run three seeds loaded their controllers concurrently on the
    flow's threads and every one came back with an untied, freshly initialised ``lm_head`` (routing accuracy 3%,
    every free-decoded program invalid), while the same folders loaded alone were correct; ``tie_weights`` on a
    module built on a worker thread did not tie either (measured). Loads are serialised by a lock, every saved
    tensor must load, and the tie is set and checked here rather than assumed."""
    with _LOAD_LOCK:
        config = GPT2Config.from_pretrained(str(directory))
        with torch_init_seed(0):
            model = GPT2LMHeadModel(config)
        missing, unexpected = load_safetensors_model(model, str(Path(directory) / "model.safetensors"), strict=False)
        if unexpected or set(missing) - {"lm_head.weight"}:
            raise RuntimeError(f"controller at {directory}: missing {missing}, unexpected {unexpected}")
        model.lm_head.weight = model.transformer.wte.weight
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        raise RuntimeError(f"controller at {directory}: lm_head is not tied to the token embeddings")
    return model.eval()


class Timer:
    """Wall seconds per named component (for the wall-clock overhead share)."""

    def __init__(self) -> None:
        self.seconds: Counter[str] = Counter()

    def time(self, name: str, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self.seconds[name] += time.perf_counter() - start
        return out


def load_experts(cfg: LlmOrchestrationConfig, model_dir: Path) -> dict[str, torch.nn.Module]:
    width = cfg.experts.width
    models = {"vision_v1": experts.build_expert("vision", width, 0),
              "vision_v2": experts.build_expert("vision", width, 0),
              "video": experts.build_expert("video", width, 0),
              "asr": experts.build_expert("asr", width, 0, vocab_size=len(SPEECH_VOCAB))}
    for name, model in models.items():
        load_state_dict(model, Path(model_dir) / EXPERT_FILES[name])
        model.eval()
    return models


def expert_accuracies(cfg: LlmOrchestrationConfig, models: dict, data_dir: Path, seed: int) -> dict[str, float]:
    """Exact-description accuracy of each expert on its own held-out test set (counts for binomial intervals)."""
    out: dict[str, float] = {}
    images = [r for r in load_stream(data_dir, "images", seed) if r["split"] == "test"]
    pixels = images_of(images, cfg.world.image_noise)
    truth = [experts.scene_text(list(r["cells"])) for r in images]
    for name in ("vision_v1", "vision_v2"):
        said = experts.describe_images(models[name], pixels)
        out[f"{name}_correct"] = float(sum(a == b for a, b in zip(said, truth, strict=True)))
    out["vision_trials"] = float(len(images))
    videos = [r for r in load_stream(data_dir, "videos", seed) if r["split"] == "test"]
    said = experts.describe_videos(models["video"], videos_of(videos, cfg.world.image_noise))
    truth = [experts.motion_text(r["colour"], r["direction"]) for r in videos]
    out.update(video_correct=float(sum(a == b for a, b in zip(said, truth, strict=True))),
               video_trials=float(len(videos)))
    utterances = [r for r in load_stream(data_dir, "utterances", seed) if r["split"] == "test"]
    right = total = 0
    for r in utterances:
        heard = experts.transcribe(models["asr"], spectra_of(r["text"], r["noise_seed"], cfg.world.speech_noise),
                                   SPEECH_VOCAB).split()
        right += sum(a == b for a, b in zip(heard, r["text"].split(), strict=True))
        total += len(heard)
    out.update(asr_words_correct=float(right), asr_words=float(total))
    return out


def expert_tables(cfg: LlmOrchestrationConfig, rows: list[dict], vision: torch.nn.Module, video: torch.nn.Module,
                  timer: Timer, prefix: str) -> orchestrator.ExpertTables:
    """Every row's image and video described once (ids ``<prefix><i>``), with content hashes."""
    pixels = images_of(rows, cfg.world.image_noise)
    clips = videos_of(rows, cfg.world.image_noise)
    image_text = timer.time("vision", experts.describe_images, vision, pixels)
    video_text = timer.time("video", experts.describe_videos, video, clips)
    ids = [f"{prefix}{i}" for i in range(len(rows))]
    hashes = {f"{i}:image": method.source_hash(pixels[k].numpy().tobytes()) for k, i in enumerate(ids)}
    hashes |= {f"{i}:video": method.source_hash(clips[k].numpy().tobytes()) for k, i in enumerate(ids)}
    return orchestrator.ExpertTables({f"{i}:image": t for i, t in zip(ids, image_text, strict=True)},
                                     {f"{i}:video": t for i, t in zip(ids, video_text, strict=True)}, hashes)


def transcripts(cfg: LlmOrchestrationConfig, rows: list[dict], asr: torch.nn.Module, timer: Timer) -> list[str]:
    out = []
    for r in rows:
        if r["spoken"]:
            spectra = spectra_of(r["text"], r["noise_seed"], cfg.world.speech_noise)
            out.append(timer.time("asr", experts.transcribe, asr, spectra, SPEECH_VOCAB))
        else:
            out.append(r["text"])
    return out


def programs_for(controller, rows: list[dict], heard: list[str], constrained: bool, max_evidence: int,
                 timer: Timer, temperature: float = 0.0, generator: torch.Generator | None = None
                 ) -> tuple[list[list[str]], list[int], list[list[str]]]:
    """The controller's programs for ``rows`` (greedy, or sampled at ``temperature`` with ``generator``)."""
    requests = [request_of(r) for r in rows]
    prompts = [prompt_tokens(q, text) for q, text in zip(requests, heard, strict=True)]
    prefixes = [[method.ASR] if q.spoken else [] for q in requests]
    name = ("controller" if constrained else "controller_free") + ("_sampled" if temperature > 0 else "")
    programs, generated = timer.time(name, lambda: decode_programs(controller, controller_vocab(), prompts, prefixes,
                                                                   constrained, max_evidence, temperature=temperature,
                                                                   generator=generator))
    return programs, generated, prompts


def stress_invalid_counts(controller, rows: list[dict], heard: list[str], max_evidence: int, temperature: float,
                          seed: int) -> dict[str, float]:
    """The grammar mask's stress control: invalid programs among ``rows`` when the controller's programs are
    sampled at ``temperature``, free and constrained, each decode with its own generator seeded by ``seed``."""
    out = {}
    for constrained, name in ((False, "free"), (True, "constrained")):
        generator = torch.Generator().manual_seed(seed)
        programs, _, _ = programs_for(controller, rows, heard, constrained, max_evidence, Timer(), temperature,
                                      generator)
        out[f"invalid_{name}_sampled"] = float(sum(not method.accepts(p, max_evidence) for p in programs))
    return out


def attached_of(row: dict, key: str) -> dict[str, str]:
    if row["intent"] == "count":
        return {"image": f"{key}:image"}
    if row["intent"] == "direction":
        return {"video": f"{key}:video"}
    return {}


def run_sessions(cfg: LlmOrchestrationConfig, rows: list[dict], programs: list[list[str]], generated: list[int],
                 prompts: list[list[str]], heard: list[str], tables: orchestrator.ExpertTables, memory: bool,
                 timer: Timer) -> dict[str, float]:
    """Every session's turns in order; accuracy, calls on sessions with follow-ups, reuse, virtual time shares."""
    sessions: dict[int, list[int]] = {}
    for k, r in enumerate(rows):
        sessions.setdefault(r["session"], []).append(k)
    correct = calls_followup = reused = 0
    calls: Counter[str] = Counter()
    spent: Counter[str] = Counter()
    latency = 0.0
    followup_sessions = generated_tokens = 0
    for members in sessions.values():
        members.sort(key=lambda k: rows[k]["turn"])
        state = orchestrator.SessionState(method.Memory(cfg.memory.tau, cfg.memory.bow_dim) if memory else None)
        latest_rows: dict[str, dict] = {}
        has_followup = any(rows[k]["intent"].startswith("followup") for k in members)
        for k in members:
            r = rows[k]
            if r["intent"] == "count":
                latest_rows["image"] = r
            elif r["intent"] == "direction":
                latest_rows["video"] = r
            spoken_words = len(r["text"].split()) if r["spoken"] else 0
            outcome = timer.time("memory_and_execution", orchestrator.run_turn, programs[k], heard[k], r["turn"],
                                 attached_of(r, f"t{k}"), state, tables, cfg.clock, cfg.memory, len(prompts[k]),
                                 generated[k], spoken_words)
            correct += outcome.answer == gold_answer(r, latest_rows.get("image"), latest_rows.get("video"))
            spent.update(outcome.spent)
            latency += outcome.latency_ms
            generated_tokens += generated[k]
        reused += state.reused
        calls.update(state.calls)
        if has_followup:
            followup_sessions += 1
            calls_followup += state.calls["vision"] + state.calls["video"]
    tag = "mem" if memory else "nomem"
    out = {f"session_correct_{tag}": float(correct), f"expert_calls_followup_sessions_{tag}": float(calls_followup),
           f"reused_{tag}": float(reused), f"virtual_total_ms_{tag}": latency,
           f"controller_tokens_generated_{tag}": float(generated_tokens),
           f"calls_vision_{tag}": float(calls["vision"]), f"calls_video_{tag}": float(calls["video"])}
    for component in ("asr", "controller", "memory", "vision", "video", "tts_first_audio"):
        out[f"virtual_{component}_ms_{tag}"] = spent.get(component, 0.0)
    if memory:
        out["followup_sessions"] = float(followup_sessions)
    return out


def tts_measures(cfg: LlmOrchestrationConfig, replies: list[str], seed: int) -> dict[str, float]:
    """TTFA of sequential and parallel TTS per reply, and one barge-in per reply at a uniform time in its playback."""
    c = cfg.clock
    rng = np.random.default_rng([seed, 7])
    ttfa_seq = ttfa_par = cancel = 0.0
    violations = cancelled_pending = 0
    for reply in replies:
        seq = method.schedule_tts([reply], 0.0, c.tts_ms_per_char, c.play_ms_per_char, 1, c.tts_overhead_ms)
        par = method.schedule_tts(method.split_sentences(reply), 0.0, c.tts_ms_per_char, c.play_ms_per_char,
                                  c.tts_workers, c.tts_overhead_ms)
        ttfa_seq += method.time_to_first_audio(seq, 0.0)
        ttfa_par += method.time_to_first_audio(par, 0.0)
        t = float(rng.uniform(par[0].play_start, par[-1].play_end))
        cut = method.barge_in(par, t, c.frame_ms)
        violations += sum(ch.play_start >= t for ch in cut.emitted) + int(cut.audio_end > t + c.frame_ms)
        violations += sum(ch.play_start < t for ch in par if ch.index in cut.cancelled)
        cancelled_pending += len(cut.cancelled) == sum(ch.play_start >= t for ch in par)
        cancel += cut.audio_end - t
    n = max(1, len(replies))
    return {"ttfa_sequential_ms": ttfa_seq / n, "ttfa_parallel_ms": ttfa_par / n, "cancel_latency_ms": cancel / n,
            "barge_in_violations": float(violations), "barge_ins": float(len(replies)),
            "barge_ins_all_pending_cancelled": float(cancelled_pending)}


def evaluate(cfg: LlmOrchestrationConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    if cfg.world is None:
        from tasks.llm_orchestration.hub import evaluate_paper_profile

        return evaluate_paper_profile(cfg, seed, progress)
    model_dir = Path(model_dir)
    models = load_experts(cfg, model_dir)
    hashes_before = {name: method.parameter_hash(m) for name, m in models.items()}
    controller = load_controller(model_dir / CONTROLLER_DIR)
    timer = Timer()
    with timed(result, "experts_alone"):
        result.add(expert_accuracies(cfg, models, data_dir, seed))
    progress(0.2, "experts measured")

    with timed(result, "qa"):
        qa = load_stream(data_dir, "qa_eval", seed)
        heard = transcripts(cfg, qa, models["asr"], Timer())
        programs, generated, prompts = programs_for(controller, qa, heard, True, cfg.controller.max_evidence, Timer())
        for version in ("vision_v1", "vision_v2"):
            tables = expert_tables(cfg, qa, models[version], models["video"], Timer(), "q")
            correct = count_correct = direction_correct = 0
            for k, r in enumerate(qa):
                state = orchestrator.SessionState(method.Memory(cfg.memory.tau, cfg.memory.bow_dim))
                outcome = orchestrator.run_turn(programs[k], heard[k], 0, attached_of(r, f"q{k}"), state, tables,
                                                cfg.clock, cfg.memory, len(prompts[k]), generated[k], 0)
                correct += outcome.answer == gold_answer(r)
                count_correct += r["intent"] == "count" and outcome.answer == gold_answer(r)
                direction_correct += r["intent"] == "direction" and outcome.answer == gold_answer(r)
            result.add({f"orch_qa_correct_{version}": float(correct),
                        f"orch_image_qa_correct_{version}": float(count_correct),
                        f"orch_video_qa_correct_{version}": float(direction_correct)})
        count_items = [k for k, r in enumerate(qa) if r["intent"] == "count"]
        result.add(qa_trials=float(len(qa)), qa_count_trials=float(len(count_items)))
        # The swap test's reference: each vision version alone on the same image questions (its summary, the
        # true question text, the executor), i.e. what the expert contributes without routing or ASR.
        for version in ("vision_v1", "vision_v2"):
            tables = expert_tables(cfg, [qa[k] for k in count_items], models[version], models["video"], Timer(), "c")
            right = sum(method.execute_answer(qa[k]["text"], {"image": tables.image_text[f"c{j}:image"]})
                        == gold_answer(qa[k])
                        for j, k in enumerate(count_items))
            result.add({f"image_qa_correct_{version}": float(right)})
        # the joint models (fusion transformer over the frozen experts' tokens) and the capacity check (the same
        # transformer on the true scene), per question type: count questions need every cell, direction one clip
        inputs = joint_inputs(qa, cfg.world.image_noise, cfg.world.speech_noise, word_index())
        labels = torch.tensor([baselines.ANSWERS.index(gold_answer(r)) for r in qa])
        tokens = {"joint": baselines.expert_tokens(inputs, models["vision_v2"], models["video"], models["asr"]),
                  "oracle": baselines.oracle_tokens(qa, inputs)}
        shapes = {"joint": baselines.expert_shapes(cfg.experts.width), "oracle": baselines.ORACLE_SHAPES}
        intents = {intent: torch.tensor([r["intent"] == intent for r in qa]) for intent in ("count", "direction")}
        result.add({f"qa_trials_{intent}": float(mask.sum()) for intent, mask in intents.items()})
        count_answers = Counter(gold_answer(r) for r in qa if r["intent"] == "count")
        result.add(count_majority_correct=float(max(count_answers.values())))
        j = cfg.joint
        for kind, budgets in (("joint", j.budgets), ("oracle", [j.oracle_budget])):
            for budget in budgets:
                model = baselines.build_fusion(shapes[kind], j.width, j.layers, j.heads, len(SPEECH_VOCAB), 0)
                load_state_dict(model, model_dir / joint_file(budget, kind))
                model.eval()
                right = baselines.fusion_predict(model, tokens[kind]) == labels
                result.add({f"{kind}_qa_correct_{intent}_N{budget}": float(right[is_intent].sum())
                            for intent, is_intent in intents.items()})
                result.add({f"{kind}_qa_correct_N{budget}": float(right.sum())})
    progress(0.5, "single-turn QA measured")

    with timed(result, "sessions"):
        rows = load_stream(data_dir, "sessions", seed)
        heard = transcripts(cfg, rows, models["asr"], timer)
        tables = expert_tables(cfg, rows, models["vision_v2"], models["video"], timer, "t")
        programs, generated, prompts = programs_for(controller, rows, heard, True, cfg.controller.max_evidence, timer)
        free, _, _ = programs_for(controller, rows, heard, False, cfg.controller.max_evidence, timer)
        gold = [gold_program(request_of(r)) for r in rows]
        held = [k for k, r in enumerate(rows) if held_out(r)]
        result.add(turns=float(len(rows)), held_out_turns=float(len(held)),
                   invalid_constrained=float(sum(not method.accepts(p, cfg.controller.max_evidence) for p in programs)),
                   invalid_free=float(sum(not method.accepts(p, cfg.controller.max_evidence) for p in free)),
                   routing_correct=float(sum(p == g for p, g in zip(programs, gold, strict=True))),
                   routing_correct_held_out=float(sum(programs[k] == gold[k] for k in held)),
                   routing_correct_free=float(sum(p == g for p, g in zip(free, gold, strict=True))))
        result.add(stress_invalid_counts(controller, rows, heard, cfg.controller.max_evidence,
                                         cfg.controller.stress_temperature, seed))
        for memory in (True, False):
            result.add(run_sessions(cfg, rows, programs, generated, prompts, heard, tables, memory,
                                    timer if memory else Timer()))
        replies = [orchestrator.reply_text(gold_answer(r), None) for r in rows if r["speak"]]
        result.add(tts_measures(cfg, replies, seed))
        # Wall seconds: the controller's decode and the layer's execution (memory, executor) of every turn; the
        # experts' batched forward per source, times the calls the memory run made (claim_metrics).
        result.add(wall_controller_s=timer.seconds["controller"],
                   wall_memory_and_execution_s=timer.seconds["memory_and_execution"],
                   wall_asr_s=timer.seconds["asr"], wall_vision_per_call_s=timer.seconds["vision"] / len(rows),
                   wall_video_per_call_s=timer.seconds["video"] / len(rows))
    hashes_after = {name: method.parameter_hash(m) for name, m in models.items()}
    result.add(expert_hashes_changed=float(sum(hashes_before[k] != hashes_after[k] for k in models)))
    progress(1.0, "sessions measured")
    return result


def held_out(row: dict) -> bool:
    """True when the request uses a held-out paraphrase (its words are not all from the training templates)."""
    text = row["text"]
    return any(t.split("{a}")[0].strip() and text.startswith(t.split("{a}")[0].strip())
               for t in TEMPLATES[row["intent"]][1]) or any(text.endswith(s) for s in SPEAK_SUFFIX[1])
