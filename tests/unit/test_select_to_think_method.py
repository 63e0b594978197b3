"""select_to_think method: the brief's deterministic acceptance checks (a)1-6, each with a negative control."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.common import tiny_lm
from tasks.select_to_think import baselines, method

BASE, N_BINS = 14, 16
RESERVED = method.bin_ids(BASE, N_BINS)


def tiny_model(seed: int = 0, untied: bool = True):
    config = tiny_lm.tiny_gpt2_config(BASE + N_BINS, 24, n_layer=1, n_head=2, n_embd=16)
    config.tie_word_embeddings = not untied
    return tiny_lm.build_tiny_gpt2(config, seed=seed).eval()


# (a)1 -------------------------------------------------------------------------------------------

def test_bin_score_exact_values():
    assert method.bin_score(torch.zeros(16)).item() == pytest.approx(0.5, abs=1e-6)
    top = torch.zeros(16)
    top[15] = 50.0
    bottom = torch.zeros(16)
    bottom[0] = 50.0
    assert method.bin_score(top).item() == pytest.approx(1.0, abs=1e-6)
    assert method.bin_score(bottom).item() == pytest.approx(0.0, abs=1e-6)
    # Negative control: levels b / B instead of b / (B - 1) miss the top of the range.
    wrong = (torch.softmax(top, -1) * torch.arange(16) / 16).sum()
    assert abs(wrong.item() - 1.0) > 1e-2


# (a)2 -------------------------------------------------------------------------------------------

def test_reserved_rows_never_win_even_at_plus_100():
    logits = torch.randn(6, BASE + N_BINS)
    logits[:, RESERVED] = 100.0
    masked = method.mask_reserved(logits, RESERVED)
    assert not set(masked.argmax(-1).tolist()) & set(RESERVED)
    assert torch.isneginf(masked[:, RESERVED]).all()
    sampled = torch.multinomial(torch.softmax(masked, -1), 50, replacement=True, generator=torch.Generator())
    assert not set(sampled.unique().tolist()) & set(RESERVED)
    # Negative control: without the mask a reserved row wins.
    assert set(logits.argmax(-1).tolist()) <= set(RESERVED)


def test_decoding_never_emits_reserved_ids_after_the_bins_are_boosted():
    model = tiny_model()
    with torch.no_grad():
        model.get_output_embeddings().weight[RESERVED] *= 0
        model.get_output_embeddings().bias = None
        model.transformer.ln_f.bias.fill_(1.0)
        model.get_output_embeddings().weight[RESERVED] += 100.0  # bins dominate the raw logits
    prompts = torch.randint(0, BASE, (4, 5), generator=torch.Generator().manual_seed(0))
    trace = method.decode(model, prompts, 6, method.DecodePolicy(), reserved=RESERVED)
    assert trace.tokens.max().item() < BASE
    raw = method.decode(model, prompts, 6, method.DecodePolicy(), reserved=())
    assert raw.tokens.min().item() >= BASE  # negative control: unmasked decoding picks the bins


# (a)3 -------------------------------------------------------------------------------------------

def _groups(n: int = 12, k: int = 4, seed: int = 0) -> method.CandidateGroups:
    g = torch.Generator().manual_seed(seed)
    prefixes = torch.randint(0, BASE, (n, 8), generator=g)
    lengths = torch.randint(4, 9, (n,), generator=g)
    candidates = torch.stack([torch.randperm(BASE, generator=g)[:k] for _ in range(n)])
    teacher = torch.softmax(3 * torch.randn(n, k, generator=g), -1) * 0.9
    return method.CandidateGroups(prefixes, lengths, candidates, teacher)


def _train(model, head_weight_decay: float = 0.0) -> None:
    method.train_s2t_local(model, _groups(), RESERVED, epochs=2, batch_groups=4, lr=1e-2, weight_decay=0.01,
                           weights=method.LocalLossWeights(), seed=0, head_weight_decay=head_weight_decay)


def test_local_training_leaves_non_reserved_rows_bitwise_unchanged():
    model = tiny_model()
    head = model.get_output_embeddings().weight
    before = head.detach().clone()
    body_before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    _train(model)
    keep = [i for i in range(BASE + N_BINS) if i not in RESERVED]
    assert torch.equal(head.detach()[keep], before[keep])
    assert not torch.equal(head.detach()[RESERVED], before[RESERVED])  # the bins did learn
    assert not torch.equal(model.transformer.h[0].mlp.c_fc.weight, body_before)  # and the body


def test_negative_control_weight_decay_on_lm_head_moves_frozen_rows():
    model = tiny_model()
    before = model.get_output_embeddings().weight.detach().clone()
    _train(model, head_weight_decay=0.1)
    keep = [i for i in range(BASE + N_BINS) if i not in RESERVED]
    assert not torch.equal(model.get_output_embeddings().weight.detach()[keep], before[keep])


def test_negative_control_without_the_gradient_hook_frozen_rows_move():
    model = tiny_model()
    before = model.get_output_embeddings().weight.detach().clone()
    optimizer = method.local_optimizer(model, 1e-2, 0.0)
    batch = _groups()
    # Loss (iv) against a different network sends gradient to every row of lm_head; no hook stops it.
    parts = method.local_step(model, tiny_model(seed=5), batch, RESERVED, method.LocalLossWeights(), 0)
    parts["total"].backward()
    optimizer.step()
    keep = [i for i in range(BASE + N_BINS) if i not in RESERVED]
    assert not torch.equal(model.get_output_embeddings().weight.detach()[keep], before[keep])


def test_tied_lm_head_is_refused():
    with pytest.raises(ValueError, match="untied lm_head"):
        method.restrict_output_rows(tiny_model(untied=False), RESERVED)


# (a)4 -------------------------------------------------------------------------------------------

def test_s2t_equals_takeover_when_llm_argmax_is_a_candidate():
    g = torch.Generator().manual_seed(1)
    slm, llm = torch.randn(64, BASE, generator=g), torch.randn(64, BASE, generator=g)
    candidates = method.top_k_candidates(slm, 8)
    mask = method.ids_to_mask(candidates, BASE)
    s2t, takeover = method.s2t_select(llm, mask), method.takeover_select(llm)
    inside = mask.gather(-1, takeover[:, None]).squeeze(-1)
    assert inside.any() and (~inside).any()
    assert torch.equal(s2t[inside], takeover[inside])
    assert mask.gather(-1, s2t[:, None]).all()  # S2T always stays among the candidates
    assert (s2t[~inside] != takeover[~inside]).all()  # outside: S2T differs from Takeover (control)


def test_s2t_picks_llm_best_candidate_exact_vector():
    llm = torch.tensor([[0.0, 5.0, 1.0, 3.0, -1.0]])
    mask = torch.tensor([[True, False, True, True, False]])
    assert method.s2t_select(llm, mask).item() == 3 and method.takeover_select(llm).item() == 1


def test_ratio_candidates_exact():
    probs = torch.tensor([[0.5, 0.3, 0.06, 0.04, 0.1]])
    assert method.ratio_candidates(probs.log(), 0.1)[0].tolist() == [True, True, True, False, True]


# (a)5 -------------------------------------------------------------------------------------------

def test_no_trigger_in_warmup_steps():
    model, llm = tiny_model(0), tiny_model(1)
    prompts = torch.randint(0, BASE, (8, 5), generator=torch.Generator().manual_seed(0))
    for trigger in ("kl", "entropy"):
        policy = method.DecodePolicy(action="s2t", trigger=trigger, threshold=-1.0, warmup_steps=3)
        trace = method.decode(model, prompts, 8, policy, llm=llm, reserved=RESERVED)
        assert not trace.fired[:, :3].any() and trace.fired[:, 3:].all()
    random = method.decode(model, prompts, 8, method.DecodePolicy(action="s2t", trigger="random", random_rate=1.0,
                                                                   warmup_steps=3), llm=llm, reserved=RESERVED)
    assert not random.fired[:, :3].any() and random.fired[:, 3:].all()
    # Negative control: warm-up 0 fires at step 0.
    none = method.decode(model, prompts, 8, method.DecodePolicy(action="s2t", trigger="kl", threshold=-1.0,
                                                                 warmup_steps=0), llm=llm, reserved=RESERVED)
    assert none.fired[:, 0].all()


def test_hit_at_k_monotone_and_full_vocabulary_is_one():
    g = torch.Generator().manual_seed(2)
    slm, llm = torch.randn(200, BASE, generator=g), torch.randn(200, BASE, generator=g)
    ks = [1, 2, 4, 8, BASE]
    rates = [h.float().mean().item() for h in method.hit_at_k(slm, llm, ks).values()]
    assert all(a <= b for a, b in zip(rates, rates[1:])) and rates[-1] == 1.0
    assert rates[0] < 0.2  # random pairs: top-1 agreement near 1/14
    # Negative control: ranking by the SLM's *lowest* logits breaks monotone coverage of the LLM's choice.
    reversed_rates = [h.float().mean().item() for h in method.hit_at_k(-slm, slm, [1, 8]).values()]
    assert reversed_rates == [0.0, 0.0]


def test_kl_and_entropy_on_support_exact():
    p = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert method.kl_on_support(p, p, 64).item() == pytest.approx(0.0, abs=1e-7)
    uniform = torch.zeros(1, 4)
    assert method.entropy_on_support(uniform, 64).item() == pytest.approx(math.log(4), abs=1e-6)
    # Top-2 support: both renormalised on {0, 1}; q puts (0.5, 0.5) there.
    q = torch.tensor([[0.0, 0.0, 9.0, 9.0]])
    p2 = torch.softmax(p[0, :2], -1)
    expected = float((p2 * (p2.log() - math.log(0.5))).sum())
    assert method.kl_on_support(p, q, 2).item() == pytest.approx(expected, abs=1e-6)
    # Negative control: on the full support q's mass on tokens 2 and 3 makes the KL much larger.
    assert method.kl_on_support(p, q, 4).item() > expected + 1.0


def test_calibrated_threshold_fires_at_the_quantile_rate():
    scores = torch.linspace(0, 1, 1001)
    threshold = method.calibrate_threshold(scores, 0.9)
    assert threshold == pytest.approx(0.9)
    assert method.threshold_trigger(scores, threshold, 5, 3).float().mean().item() == pytest.approx(0.1, abs=2e-3)
    with pytest.raises(ValueError, match="no calibration scores"):
        method.calibrate_threshold([], 0.9)


# (a)6 -------------------------------------------------------------------------------------------

def test_hinge_zero_at_margin_and_positive_below():
    best = torch.tensor([0, 0])
    scores = torch.tensor([[1.0, 0.0, -0.5], [0.9, 0.0, 0.2]])
    hinge = method.hinge_loss(scores, best, 1.0)
    assert hinge[0].item() == 0.0 and hinge[1].item() == pytest.approx(0.3)
    # Negative control: taking the easiest negative (min) instead of the hardest gives 0 for row 1.
    easiest = torch.clamp(1.0 - (scores[1, 0] - scores[1, 1:].min()), min=0.0)
    assert easiest.item() == pytest.approx(0.1)


def test_frozen_copy_kl_is_zero_at_initialisation_and_positive_after_a_change():
    model = tiny_model()
    groups = _groups()
    frozen = tiny_model()
    parts = method.local_step(model, frozen, groups, RESERVED, method.LocalLossWeights(), 0)
    assert parts["frozen_kl"].item() == pytest.approx(0.0, abs=1e-7)
    changed = tiny_model(seed=5)  # negative control: a different network is far from the frozen copy
    assert method.local_step(changed, frozen, groups, RESERVED, method.LocalLossWeights(), 0)["frozen_kl"] > 1e-3


def test_teacher_kl_zero_when_scores_match_teacher_log_probs():
    teacher = torch.tensor([[0.5, 0.25, 0.25]])
    assert method.teacher_kl(teacher.log(), teacher * 0.5).item() == pytest.approx(0.0, abs=1e-6)
    assert method.teacher_kl(torch.zeros(1, 3), teacher).item() > 0.01


def test_candidate_scores_ignore_right_padding_and_read_the_candidate_position():
    model = tiny_model()
    prefixes = torch.tensor([[1, 2, 3, 4, 9, 9], [5, 6, 7, 8, 1, 2]])
    lengths = torch.tensor([4, 6])
    candidates = torch.tensor([[0, 3], [2, 1]])
    scores = method.candidate_scores(model, prefixes, lengths, candidates, RESERVED)
    alone = method.candidate_scores(model, prefixes[:1, :4], lengths[:1], candidates[:1], RESERVED)
    assert torch.allclose(scores[:1], alone, atol=1e-6)
    assert ((scores >= 0) & (scores <= 1)).all()


def test_cached_decoding_matches_full_forward():
    model = tiny_model()
    x = torch.randint(0, BASE, (3, 5), generator=torch.Generator().manual_seed(0))
    step = method.CachedLogits(model, RESERVED)
    for _ in range(4):
        cached, full = step(x), method.next_token_logits(model, x, RESERVED)
        assert torch.allclose(cached[:, :BASE], full[:, :BASE], atol=1e-5)
        x = torch.cat([x, cached.argmax(-1, keepdim=True)], 1)


def test_entropy_trigger_local_runs_without_llm_and_kl_needs_it():
    model = tiny_model()
    prompts = torch.randint(0, BASE, (4, 5), generator=torch.Generator().manual_seed(0))
    trace = method.decode(model, prompts, 6, method.DecodePolicy(action="local", trigger="entropy", threshold=-1.0,
                                                                  warmup_steps=1), llm=None, reserved=RESERVED)
    assert trace.llm_row_evaluations == 0 and trace.fired[:, 1:].all()
    with pytest.raises(ValueError, match="needs the LLM"):
        method.decode(model, prompts, 6, method.DecodePolicy(action="local", trigger="kl"), reserved=RESERVED)


def test_majority_vote_rules():
    assert baselines.majority_vote([3, None, 5, 5, 3]) == 3  # tie: the first reached
    assert baselines.majority_vote([None, 7, 7, 2]) == 7
    assert baselines.majority_vote([None, None]) is None
