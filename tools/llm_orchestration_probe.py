"""One-seed probe for llm_orchestration (run before changing the cpu profile; never on the evaluation items).

(1) The joint model alone at paired budgets N on a probe pool drawn with its own generator ([seed, 99], not the
evaluation stream [seed, 1]): trained on the first N items, early-stopped on the next 1000, its count accuracy
measured on a further 1000 (the probe's validation split), with the seed thread's CPU seconds.
(2) The grammar-mask stress control: the trained controller decodes training-distribution requests (own
generator [seed, 98]) greedily and sampled at temperatures, free and constrained; invalid-program rates.

    PYTHONPATH=. python tools/llm_orchestration_probe.py 6400 1600
"""

from __future__ import annotations

import sys
import time
from collections import Counter

import numpy as np
import torch
import yaml

from tasks.llm_orchestration import baselines, method
from tasks.llm_orchestration.baselines import ANSWERS
from tasks.llm_orchestration.config import CONFIG
from tasks.llm_orchestration.controller import (
    INTENTS,
    decode_programs,
    prompt_tokens,
    sample_request,
    train_controller,
)
from tasks.llm_orchestration.data import SPEECH_VOCAB, _qa_rows, gold_answer, joint_inputs, make_streams
from tasks.llm_orchestration.method import ASR
from tasks.llm_orchestration.train import controller_vocab, train_asr, train_video, train_vision, word_index


def main(budgets: list[int], seed: int = 0) -> None:
    torch.set_num_threads(1)
    cfg = CONFIG.model_validate(yaml.safe_load(open("params.yaml"))["llm_orchestration"]["cpu"])
    streams = make_streams(cfg, seed)
    t0 = time.thread_time()
    rows = {k: [r for r in streams[k].to_dicts() if r["split"] == "train"] for k in ("images", "videos", "utterances")}
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        from pathlib import Path
        vision, _ = train_vision(cfg, rows["images"], seed, Path(tmp))
    video, _ = train_video(cfg, rows["videos"], seed)
    asr, _ = train_asr(cfg, rows["utterances"], seed)
    print(f"experts: {time.thread_time() - t0:.1f} CPU-s", flush=True)

    top, w = max(budgets), cfg.world
    pool = _qa_rows(np.random.default_rng([seed, 99]), top + 2000, w.held_out_fraction, w.spoken_fraction)
    t0 = time.thread_time()
    inputs = joint_inputs(pool, w.image_noise, w.speech_noise, word_index())
    labels = torch.tensor([ANSWERS.index(gold_answer(r)) for r in pool])
    tokens = baselines.expert_tokens(inputs, vision, video, asr)
    print(f"pool tokens ({len(pool)} items): {time.thread_time() - t0:.1f} CPU-s", flush=True)
    stop, probe = slice(top, top + 1000), slice(top + 1000, top + 2000)
    probe_rows = pool[top + 1000:]
    count = torch.tensor([r["intent"] == "count" for r in probe_rows])
    majority = max(Counter(gold_answer(r) for r in probe_rows if r["intent"] == "count").values()) / int(count.sum())
    print(f"probe split: {int(count.sum())} count items, majority rate {majority:.3f}", flush=True)
    j = cfg.joint
    for k, budget in enumerate(budgets):
        t0 = time.thread_time()
        model = baselines.build_fusion(baselines.expert_shapes(cfg.experts.width), j.width, j.layers, j.heads,
                                       len(SPEECH_VOCAB), seed + 10 + k)
        log = baselines.train_fusion(model, baselines.take(tokens, slice(0, budget)), labels[:budget],
                                     baselines.take(tokens, stop), labels[stop], j.batch_size, j.lr,
                                     j.check_min_steps, j.patience, j.safety_steps, seed + 10 + k)
        right = baselines.fusion_predict(model, baselines.take(tokens, probe)) == labels[probe]
        print(f"joint N={budget}: {log.steps} steps (best {log.best_step}, early {log.stopped_early}), "
              f"{time.thread_time() - t0:.1f} CPU-s; probe-split count accuracy "
              f"{float(right[count].float().mean()):.3f} (majority + 0.2 = {majority + 0.2:.3f}), all "
              f"{float(right.float().mean()):.3f}", flush=True)

    c = cfg.controller
    t0 = time.thread_time()
    controller, _ = train_controller(controller_vocab(), c.n_layer, c.n_head, c.n_embd, c.steps, c.batch_size, c.lr,
                                     seed + 3)
    controller.eval()
    rng = np.random.default_rng([seed, 98])
    requests = [sample_request(rng, INTENTS[rng.integers(len(INTENTS))], bool(rng.random() < w.held_out_fraction),
                               w.spoken_fraction, w.speak_fraction) for _ in range(500)]
    prompts = [prompt_tokens(r) for r in requests]
    prefixes = [[ASR] if r.spoken else [] for r in requests]
    for temperature in (0.0, 1.0, 1.5, 2.0):
        for constrained in (False, True):
            generator = torch.Generator().manual_seed(seed)
            programs, _ = decode_programs(controller, controller_vocab(), prompts, prefixes, constrained,
                                          c.max_evidence, temperature=temperature, generator=generator)
            invalid = sum(not method.accepts(p, c.max_evidence) for p in programs) / len(programs)
            print(f"controller T={temperature} constrained={constrained}: invalid rate {invalid:.3f}", flush=True)
    print(f"controller: {time.thread_time() - t0:.1f} CPU-s", flush=True)


if __name__ == "__main__":
    main([int(b) for b in sys.argv[1:]])
