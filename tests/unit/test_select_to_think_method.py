"""select_to_think method: the deterministic acceptance checks (a)1-6 of the method (README "Fidelity checklist"),
each with a negative control."""

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

def bin_score_check() -> bool:
    """(a)1: equal bin logits -> 0.5; one-hot bin 15 (+50) -> 1.0; one-hot bin 0 -> 0.0 (1e-6)."""
    top, bottom = torch.zeros(16), torch.zeros(16)
    top[15], bottom[0] = 50.0, 50.0
    values = [method.bin_score(x).item() for x in (torch.zeros(16), top, bottom)]
    return all(abs(v - want) <= 1e-6 for v, want in zip(values, (0.5, 1.0, 0.0)))


def test_bin_score_exact_values():
    assert bin_score_check()


def test_negative_control_bin_levels_b_over_B_fails_a1(monkeypatch):
    monkeypatch.setattr(method, "bin_levels", lambda n, dtype=torch.float32, device=None:
                        torch.arange(n, dtype=dtype, device=device) / n)
    assert not bin_score_check()


# (a)2 -------------------------------------------------------------------------------------------

def boosted_bins_model():
    """A model whose raw logits are dominated by the reserved rows (+100 on every bin)."""
    model = tiny_model()
    with torch.no_grad():
        model.get_output_embeddings().weight[RESERVED] *= 0
        model.transformer.ln_f.bias.fill_(1.0)
        model.get_output_embeddings().weight[RESERVED] += 100.0
    return model


def reserved_never_win_check() -> bool:
    """(a)2: greedy and sampled decoding never emit a reserved id, though the bins dominate the raw logits."""
    model = boosted_bins_model()
    prompts = torch.randint(0, BASE, (4, 5), generator=torch.Generator().manual_seed(0))
    raw = model(input_ids=prompts).logits[:, -1]
    assert set(raw.argmax(-1).tolist()) <= set(RESERVED)  # the setup really boosts the bins
    greedy = method.decode(model, prompts, 6, method.DecodePolicy(), reserved=RESERVED)
    sampled = method.decode(model, prompts.repeat(8, 1), 6, method.DecodePolicy(action="sample"), reserved=RESERVED,
                            generator=torch.Generator().manual_seed(1))
    return greedy.tokens.max().item() < BASE and sampled.tokens.max().item() < BASE


def test_decoding_never_emits_reserved_ids_after_the_bins_are_boosted():
    assert reserved_never_win_check()


def test_negative_control_without_the_reserved_mask_bins_win(monkeypatch):
    monkeypatch.setattr(method, "mask_reserved", lambda logits, reserved_ids: logits)
    assert not reserved_never_win_check()


def test_mask_reserved_puts_minus_inf_on_the_bins():
    logits = torch.randn(6, BASE + N_BINS)
    logits[:, RESERVED] = 100.0
    masked = method.mask_reserved(logits, RESERVED)
    assert torch.isneginf(masked[:, RESERVED]).all() and torch.equal(masked[:, :BASE], logits[:, :BASE])


def test_cut_to_the_tokenizer_vocabulary_leaves_bins_past_it_out():
    """Paper profile: the bins sit in the output rows past the tokenizer, which ``vocab_size`` cuts off; a bin
    inside the cut is still masked."""
    logits = torch.randn(2, BASE + N_BINS)
    assert torch.equal(method.cut_and_mask(logits, RESERVED, BASE), logits[:, :BASE])
    inside = method.cut_and_mask(logits, RESERVED, BASE + 1)
    assert inside.shape == (2, BASE + 1) and torch.isneginf(inside[:, BASE]).all()
    assert torch.equal(method.cut_and_mask(logits, RESERVED, None), method.mask_reserved(logits, RESERVED))


# (a)3 -------------------------------------------------------------------------------------------

def _groups(n: int = 12, k: int = 4, seed: int = 0) -> method.CandidateGroups:
    g = torch.Generator().manual_seed(seed)
    prefixes = torch.randint(0, BASE, (n, 8), generator=g)
    lengths = torch.randint(4, 9, (n,), generator=g)
    candidates = torch.stack([torch.randperm(BASE, generator=g)[:k] for _ in range(n)])
    teacher = torch.softmax(3 * torch.randn(n, k, generator=g), -1) * 0.9
    return method.CandidateGroups(prefixes, lengths, candidates, teacher)


def _train(model) -> method.LocalTrainingLog:
    return method.train_s2t_local(model, _groups(), RESERVED, epochs=2, batch_groups=4, lr=1e-2, weight_decay=0.01,
                                  weights=method.LocalLossWeights(), seed=0)


def frozen_rows_check() -> bool:
    """(a)3: after S2T-Local training the non-reserved rows of lm_head are bitwise unchanged (and the bins and
    the body did move, so the check is not passed by a training that does nothing)."""
    model = tiny_model()
    head = model.get_output_embeddings().weight
    before = head.detach().clone()
    body_before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    _train(model)
    assert not torch.equal(head.detach()[RESERVED], before[RESERVED])
    assert not torch.equal(model.transformer.h[0].mlp.c_fc.weight, body_before)
    return method.frozen_rows_change(before, head.detach(), RESERVED) == 0.0


def test_local_training_leaves_non_reserved_rows_bitwise_unchanged():
    assert frozen_rows_check()


def test_negative_control_weight_decay_on_lm_head_moves_frozen_rows(monkeypatch):
    def decaying_head(model, lr, weight_decay):
        return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)

    monkeypatch.setattr(method, "local_optimizer", decaying_head)
    assert not frozen_rows_check()


def test_negative_control_without_the_gradient_hook_frozen_rows_move(monkeypatch):
    class NoHook:
        def remove(self) -> None:
            pass

    monkeypatch.setattr(method, "restrict_output_rows", lambda model, reserved: NoHook())
    assert not frozen_rows_check()


def test_tied_lm_head_is_refused():
    with pytest.raises(ValueError, match="untied lm_head"):
        method.restrict_output_rows(tiny_model(untied=False), RESERVED)


# (a)4 -------------------------------------------------------------------------------------------

def s2t_identity_check() -> bool:
    """(a)4: at every trigger row where the LLM's full-vocabulary argmax is among the SLM's top-8, S2T emits the
    Takeover token (decoded through ``method.act_at_trigger``, the decoder's action at a trigger)."""
    g = torch.Generator().manual_seed(1)
    slm, llm = torch.randn(64, BASE, generator=g), torch.randn(64, BASE, generator=g)
    prefixes = torch.zeros(64, 3, dtype=torch.long)
    s2t = method.act_at_trigger(None, prefixes, slm, llm, method.DecodePolicy(action="s2t", k=8), RESERVED, 0)
    takeover = method.act_at_trigger(None, prefixes, slm, llm, method.DecodePolicy(action="takeover"), RESERVED, 0)
    inside = method.ids_to_mask(method.top_k_candidates(slm, 8), BASE).gather(-1, takeover[:, None]).squeeze(-1)
    assert inside.any() and (~inside).any()
    return bool(torch.equal(s2t[inside], takeover[inside]))


def test_s2t_equals_takeover_when_llm_argmax_is_a_candidate():
    assert s2t_identity_check()


def test_negative_control_s2t_that_ignores_the_llm_fails_a4(monkeypatch):
    # A broken S2T that emits the first candidate id instead of the LLM's best candidate.
    monkeypatch.setattr(method, "s2t_select", lambda llm_logits, mask: mask.float().argmax(-1))
    assert not s2t_identity_check()


def test_s2t_picks_llm_best_candidate_exact_vector():
    llm = torch.tensor([[0.0, 5.0, 1.0, 3.0, -1.0]])
    mask = torch.tensor([[True, False, True, True, False]])
    assert method.s2t_select(llm, mask).item() == 3 and method.takeover_select(llm).item() == 1


def test_ratio_candidates_exact():
    probs = torch.tensor([[0.5, 0.3, 0.06, 0.04, 0.1]])
    assert method.ratio_candidates(probs.log(), 0.1)[0].tolist() == [True, True, True, False, True]


# (a)5 -------------------------------------------------------------------------------------------

def warmup_check() -> bool:
    """(a)5: with a threshold every score exceeds (and a random rate of 1), no trigger in the first 3 steps and a
    trigger at every later step, for the KL, entropy and random triggers."""
    model, llm = tiny_model(0), tiny_model(1)
    prompts = torch.randint(0, BASE, (8, 5), generator=torch.Generator().manual_seed(0))
    policies = [method.DecodePolicy(action="s2t", trigger=t, threshold=-1.0, warmup_steps=3) for t in ("kl", "entropy")]
    policies.append(method.DecodePolicy(action="s2t", trigger="random", random_rate=1.0, warmup_steps=3))
    fired = [method.decode(model, prompts, 8, p, llm=llm, reserved=RESERVED).fired for p in policies]
    return all(not f[:, :3].any() and bool(f[:, 3:].all()) for f in fired)


def test_no_trigger_in_warmup_steps():
    assert warmup_check()


def test_negative_control_triggers_that_ignore_the_warmup_fail_a5(monkeypatch):
    monkeypatch.setattr(method, "threshold_trigger", lambda scores, threshold, step, warmup: scores > threshold)
    monkeypatch.setattr(method, "random_trigger",
                        lambda batch, rate, step, warmup, generator: torch.rand(batch, generator=generator) < rate)
    assert not warmup_check()


def hit_at_k_check() -> bool:
    """(a)5: hit@K is non-decreasing in K and hit@|V| = 1 (random logit pairs, 200 rows)."""
    g = torch.Generator().manual_seed(2)
    slm, llm = torch.randn(200, BASE, generator=g), torch.randn(200, BASE, generator=g)
    rates = [h.float().mean().item() for h in method.hit_at_k(slm, llm, [1, 2, 4, 8, BASE]).values()]
    return all(a <= b for a, b in zip(rates, rates[1:])) and rates[-1] == 1.0


def test_hit_at_k_monotone_and_full_vocabulary_is_one():
    assert hit_at_k_check()
    g = torch.Generator().manual_seed(2)
    slm, llm = torch.randn(200, BASE, generator=g), torch.randn(200, BASE, generator=g)
    assert method.hit_at_k(slm, llm, [1])[1].float().mean().item() < 0.2  # random pairs: near 1/14


def test_negative_control_candidates_that_skip_the_slm_top1_fail_a5(monkeypatch):
    # Off-by-one ranking: the top-k list starts at the SLM's second token, so hit@|V| < 1.
    monkeypatch.setattr(method, "top_k_candidates", lambda logits, k: torch.cat(
        [logits.topk(logits.shape[-1], dim=-1).indices[:, 1:], logits.argmax(-1, keepdim=True) * 0 - 1], -1)[:, :k])
    assert not hit_at_k_check()


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

def hinge_check() -> bool:
    """(a)6: hinge = 0 when s_best - s_hardest negative >= 1, and 1 - gap below (hardest = the top other score)."""
    best = torch.tensor([0, 0])
    scores = torch.tensor([[1.0, 0.0, -0.5], [0.9, 0.0, 0.2]])
    hinge = method.hinge_loss(scores, best, 1.0)
    return hinge[0].item() == 0.0 and abs(hinge[1].item() - 0.3) < 1e-6


def test_hinge_zero_at_margin_and_positive_below():
    assert hinge_check()


def test_negative_control_easiest_negative_fails_a6(monkeypatch):
    monkeypatch.setattr(method, "hardest_negative",
                        lambda scores, best: scores.scatter(-1, best[:, None], float("inf")).min(-1).values)
    assert not hinge_check()


def frozen_kl_at_init_check() -> bool:
    """(a)6: the frozen-copy KL (iv) is 0 at the first step of S2T-Local training, and positive later (the body
    moves away from the copy)."""
    log = _train(tiny_model())
    assert max(log.frozen_kl[1:]) > 0.0
    return log.frozen_kl[0] == pytest.approx(0.0, abs=1e-7)


def test_frozen_copy_kl_is_zero_at_initialisation():
    assert frozen_kl_at_init_check()


def test_negative_control_a_wrong_frozen_copy_fails_a6(monkeypatch):
    # A "frozen copy" that is a freshly initialised network instead of the model at entry.
    monkeypatch.setattr(method, "frozen_copy", lambda model: tiny_model(seed=5).requires_grad_(False))
    assert not frozen_kl_at_init_check()


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


def check_entropy_local_is_llm_free() -> None:
    """C7: S2T-Local with the entropy trigger decodes with llm=None (no LLM exists to call), triggering at every
    step after the warm-up, and counts zero LLM evaluations; the KL trigger cannot run without the LLM."""
    model = tiny_model()
    prompts = torch.randint(0, BASE, (4, 5), generator=torch.Generator().manual_seed(0))
    trace = method.decode(model, prompts, 6, method.DecodePolicy(action="local", trigger="entropy", threshold=-1.0,
                                                                  warmup_steps=1), llm=None, reserved=RESERVED)
    assert trace.llm_row_evaluations == 0 and trace.fired[:, 1:].all()
    with pytest.raises(ValueError, match="needs the LLM"):
        method.decode(model, prompts, 6, method.DecodePolicy(action="local", trigger="kl"), reserved=RESERVED)


def test_entropy_trigger_local_runs_without_llm_and_kl_needs_it():
    check_entropy_local_is_llm_free()


def test_negative_control_local_action_that_consults_the_llm_fails_c7(monkeypatch):
    """A library whose S2T-Local action asks the LLM at triggers (as S2T does) cannot run the LLM-free decode."""
    monkeypatch.setattr(method.DecodePolicy, "needs_llm_at_triggers", property(lambda self: True))
    with pytest.raises(ValueError, match="needs the LLM"):
        check_entropy_local_is_llm_free()


def test_majority_vote_rules():
    assert baselines.majority_vote([3, None, 5, 5, 3]) == 3  # tie: the first reached
    assert baselines.majority_vote([None, 7, 7, 2]) == 7
    assert baselines.majority_vote([None, None]) is None
