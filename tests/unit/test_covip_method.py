"""covip: the recite-all identity (C4), the episode generator, the binding swap and the policy's input layout,
with negative controls."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.covip import baselines, data, method, scoring
from tasks.covip.config import DataConfig, RewardConfig
from tests.unit.test_covip_exact import episode

DATA = DataConfig(n_context=4, max_present=2, n_train=16, n_test=16, n_names=40, n_places=20, n_events=20,
                  jitter=1, noise_sd=0.05)
REWARD = RewardConfig(length_limit=17, min_sentences=2, ngram_n=3)


def recite_all_scores() -> tuple[float, float, float]:
    """(reward, GT-acc, noisy-acc) of the recite-all caption on the hand episode."""
    ep = episode()
    words = baselines.recite_all_caption(ep)
    counts = scoring.capeval(words, ep)
    return (scoring.reward(words, ep, REWARD).total, counts.gt_correct / counts.gt_total,
            counts.noisy_correct / counts.noisy_total)


def test_recite_all_scores_one_and_fails_every_noisy_qa():
    """C4: reciting every context concept gets full GT marks, zero noisy accuracy, reward 2 - 1 = 1."""
    assert recite_all_scores() == (pytest.approx(1.0), 1.0, 0.0)
    eps = data.episodes(DATA, 3, "test", 50)
    for ep in eps:
        counts = scoring.capeval(baselines.recite_all_caption(ep), ep)
        assert counts.noisy_correct == 0 and counts.gt_correct == counts.gt_total


def test_negative_control_judge_that_ignores_keys_is_caught(monkeypatch):
    """A judge answering D whenever a concept is absent from the *context* (not the caption) would pass recite-all."""
    monkeypatch.setattr(method, "judge_answer", lambda words, qa: qa.answer)
    assert recite_all_scores()[2] == 1.0


def test_correct_caption_scores_number_present():
    for ep in data.episodes(DATA, 1, "test", 40):
        assert scoring.reward(baselines.correct_caption(ep), ep, REWARD).total == pytest.approx(len(ep.present))
        assert scoring.reward([], ep, REWARD).total == 0.0


def distractor_is_hard(ep: data.Episode) -> bool:
    """The distractor is no context identity, matches no context concept on (shape, colour), and shares
    exactly one of {shape, colour} with some context concept."""
    shape, colour, _ = data.attributes(ep.distractor)
    context = [data.attributes(i) for i in ep.identities]
    return (ep.distractor not in ep.identities and all((shape, colour) != c[:2] for c in context)
            and any((shape == c[0]) != (colour == c[1]) for c in context))


def test_negative_control_easy_distractor_is_caught(monkeypatch):
    """A generator whose distractor repeats a context identity must fail the hard-distractor check."""
    honest = data.make_episode

    def broken(rng, cfg):
        ep = honest(rng, cfg)
        return data.Episode(ep.identities, ep.names, ep.places, ep.events, ep.cells, ep.identities[0],
                            ep.render_seed, ep.option_seed)
    monkeypatch.setattr(data, "make_episode", broken)
    assert not any(distractor_is_hard(ep) for ep in data.episodes(DATA, 7, "train", 30))


def test_generator_is_seeded_and_distractor_is_hard():
    a, b = data.episodes(DATA, 7, "train", 30), data.episodes(DATA, 7, "train", 30)
    assert a == b and a != data.episodes(DATA, 8, "train", 30)
    vocab = data.Vocab(DATA)
    batch_a, batch_b = data.render_batch(a[:4], DATA, vocab), data.render_batch(b[:4], DATA, vocab)
    assert torch.equal(batch_a.query_cells, batch_b.query_cells)
    for ep in a:
        assert distractor_is_hard(ep)
        assert len(ep.present) in range(1, DATA.max_present + 1) and ep.cells.count(data.DISTRACTOR) == 1
        assert len(set(ep.names)) == len(set(ep.places)) == len(set(ep.events)) == DATA.n_context


def test_qas_answers_point_at_the_true_fact():
    ep = episode()
    present, absent = data.qas(ep)
    assert len(present) == 6 and len(absent) == 6
    for qa in present:
        value = qa.options[method.LETTERS.index(qa.answer)]
        assert value == ep.facts(qa.concept)[("name", "place", "event").index(qa.target_field)]
    assert all(qa.answer == "D" and qa.concept in (2, 3) for qa in absent)


def test_binding_swap_permutes_targets():
    """Permuting context images between dialogues permutes the target facts accordingly (acceptance (a)7)."""
    for ep in data.episodes(DATA, 2, "test", 30):
        swapped = data.swap_bindings(ep)
        k = len(ep.identities)
        for cell_old, cell_new in zip(ep.cells, swapped.cells):
            if cell_old >= 0:
                assert swapped.identities[cell_new] == ep.identities[cell_old]  # same image in the query
                assert swapped.facts(cell_new) == ep.facts((cell_old - 1) % k)
        assert swapped.target_caption != ep.target_caption


def test_rendering_depends_on_identity_only_through_the_template():
    rng = np.random.default_rng(0)
    a = data.render_sprites(np.array([5, 5, -1]), rng, 0, 0.0)
    assert np.array_equal(a[0], a[1]) and not a[2].any() and a[0].any()
    shapes = {data.render_sprites(np.array([data.identity(s, 0, 0)]), rng, 0, 0.0).tobytes() for s in range(8)}
    assert len(shapes) == 8


def blank_caption_gt_acc() -> float:
    eps = data.episodes(DATA, 4, "test", 60)
    counts = [scoring.capeval(baselines.empty_caption(ep), ep) for ep in eps]
    return sum(c.gt_correct for c in counts) / sum(c.gt_total for c in counts)


def test_judge_is_at_chance_on_blank_captions():
    """M3: on empty captions the judge says D to every QA: GT-acc 0 <= 1/4, noisy-acc 1."""
    assert blank_caption_gt_acc() == 0.0
    ep = episode()
    counts = scoring.capeval([], ep)
    assert counts.noisy_correct == counts.noisy_total == 6


def test_negative_control_judge_that_reads_the_episode_is_caught(monkeypatch):
    monkeypatch.setattr(method, "judge_answer", lambda words, qa: qa.answer)
    assert blank_caption_gt_acc() > 0.25
