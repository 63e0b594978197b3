"""Scoring captions of episodes with the caption reward and the CapEval diagnostics (method.py)."""

from __future__ import annotations

from functools import lru_cache

from tasks.covip import method
from tasks.covip.config import RewardConfig
from tasks.covip.data import Episode, qas


@lru_cache(maxsize=200_000)
def episode_qas(ep: Episode) -> tuple[tuple[method.QA, ...], tuple[method.QA, ...]]:
    present, absent = qas(ep)
    return tuple(present), tuple(absent)


def reward(words: list[str], ep: Episode, cfg: RewardConfig) -> method.RewardBreakdown:
    present, absent = episode_qas(ep)
    return method.caption_reward(words, present, absent, length_limit=cfg.length_limit,
                                 min_sentences=cfg.min_sentences, ngram_n=cfg.ngram_n)


def capeval(words: list[str], ep: Episode) -> method.CapEvalCounts:
    present, absent = episode_qas(ep)
    return method.capeval_counts(words, present, absent)


def gt_accuracy(captions: list[list[str]], eps: list[Episode]) -> float:
    counts = [capeval(w, e) for w, e in zip(captions, eps)]
    return sum(c.gt_correct for c in counts) / max(1, sum(c.gt_total for c in counts))
