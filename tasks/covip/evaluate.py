"""Evaluation step of covip: greedy captions of every captioner on the test episodes, scored by the caption
reward, the CapEval diagnostics, concept-set F1 and CAG downstream F1; the blind and binding-swap controls."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.tiny_vlm import load_vlm
from tasks.covip import baselines, method, scoring
from tasks.covip.config import CovipConfig
from tasks.covip.data import Episode, Vocab, load_episodes, swap_bindings
from tasks.covip.train import caption_words

DOWNSTREAM_TASKS = ("last_seen", "last_action")


def mentioned_concepts(words: list[str], ep: Episode) -> set[int]:
    """Context concepts whose NAME the caption states."""
    names = {f"n{n}": k for k, n in enumerate(ep.names)}
    return {names[w] for w in words if w in names}


def downstream_gold(ep: Episode, task: method.DownstreamTask) -> list[str]:
    index = 1 if task == "last_seen" else 2
    return [w for k in ep.present for w in (ep.facts(k)[0], ep.facts(k)[index])]


def score_captions(name: str, captions: list[list[str]], eps: list[Episode], cfg: CovipConfig) -> dict[str, float]:
    """Mean reward, GT/noisy QA accuracy (pooled over QAs), penalty rate, concept-set F1 and CAG F1."""
    rewards = [scoring.reward(w, e, cfg.reward) for w, e in zip(captions, eps)]
    counts = [scoring.capeval(w, e) for w, e in zip(captions, eps)]
    cag = [method.token_set_f1(method.cag_answer(w, task), downstream_gold(e, task))
           for w, e in zip(captions, eps) for task in DOWNSTREAM_TASKS]
    return {f"{name}_reward": float(np.mean([r.total for r in rewards])),
            f"{name}_gt_acc": sum(c.gt_correct for c in counts) / sum(c.gt_total for c in counts),
            f"{name}_noisy_acc": sum(c.noisy_correct for c in counts) / sum(c.noisy_total for c in counts),
            f"{name}_penalty_rate": float(np.mean([r.penalised for r in rewards])),
            f"{name}_set_f1": float(np.mean([method.set_f1(mentioned_concepts(w, e), e.present)
                                             for w, e in zip(captions, eps)])),
            f"{name}_cag_f1": float(np.mean(cag))}


def swap_follow(captions: list[list[str]], eps: list[Episode], swapped: list[Episode]) -> tuple[int, int]:
    new = old = 0
    for words, ep, sw in zip(captions, eps, swapped):
        n, o = method.binding_follow_counts(words, [w for k in sw.present for w in sw.facts(k)],
                                            [w for k in ep.present for w in ep.facts(k)])
        new, old = new + n, old + o
    return new, old


def evaluate(cfg: CovipConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        raise NotImplementedError("covip paper profile evaluation is not built (see tasks/covip/hub.py)")
    vocab = Vocab(cfg.data)
    eps = load_episodes(data_dir, "test", seed)[:cfg.eval.n_episodes]
    result = SeedResult(seed)
    metrics: dict[str, float] = {}
    rng = np.random.default_rng([seed, 11])
    text = {"correct": [baselines.correct_caption(e) for e in eps],
            "recite_all": [baselines.recite_all_caption(e) for e in eps],
            "random_subset": [baselines.random_subset_caption(e, rng) for e in eps],
            "empty": [baselines.empty_caption(e) for e in eps]}
    for name, captions in text.items():
        metrics.update(score_captions(name, captions, eps, cfg))
    swapped = [swap_bindings(e) for e in eps]
    with result.stage("captions"), torch.no_grad():
        for model_name in ("sft", "grpo", "sft_more"):
            model = load_vlm(Path(model_dir) / model_name)
            metrics.update(score_captions(model_name, caption_words(model, eps, cfg, vocab), eps, cfg))
            metrics.update(score_captions(f"blind_{model_name}", caption_words(model, eps, cfg, vocab, blind=True),
                                          eps, cfg))
            if model_name != "sft_more":
                swap_captions = caption_words(model, swapped, cfg, vocab)
                metrics.update(score_captions(f"swap_{model_name}", swap_captions, swapped, cfg))
                new, old = swap_follow(swap_captions, eps, swapped)
                metrics.update({f"swap_{model_name}_new_facts": new, f"swap_{model_name}_old_facts": old})
            progress(0.3, f"{model_name}: reward {metrics[f'{model_name}_reward']:.3f}")
    return result.add(metrics, n_test_episodes=len(eps))
