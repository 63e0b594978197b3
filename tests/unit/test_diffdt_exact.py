"""diffdt method: exact values where test_diffdt_method.py's inputs could not tell a right formula from a wrong one
(issue 20, survivors of the first full mutation run), each with a negative control that breaks the library."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from tasks.diffdt import method


def auc_by_pairs(scores, labels) -> float:
    """P(score_pos > score_neg) + 0.5 P(tie), over every (positive, negative) pair."""
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    pairs = list(itertools.product(pos, neg))
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


def check_auc_with_ties() -> None:
    """Three-way and two-way ties across the classes, the first sorted element a positive."""
    scores = [0.05, 0.4, 0.4, 0.8, 0.4, 0.2, 0.8, 0.1]
    labels = [1, 1, 0, 1, 1, 0, 0, 0]
    assert method.auc(np.array(scores), np.array(labels)) == pytest.approx(auc_by_pairs(scores, labels), abs=1e-12)
    # age bins [0, 50), [50, 60): an age exactly at an edge belongs to the upper bin
    ages = np.array([40.0, 40.0, 50.0, 50.0, 55.0, 55.0, 45.0, 45.0])
    low = auc_by_pairs([scores[i] for i in (0, 1, 6, 7)], [labels[i] for i in (0, 1, 6, 7)])
    high = auc_by_pairs([scores[i] for i in (2, 3, 4, 5)], [labels[i] for i in (2, 3, 4, 5)])
    got = method.age_stratified_auc(np.array(scores), np.array(labels), ages, np.array([0.0, 50.0, 60.0]))
    assert got == pytest.approx((low + high) / 2, abs=1e-12)


def test_auc_with_ties():
    check_auc_with_ties()


def test_negative_control_ties_counted_as_wins_are_caught(monkeypatch):
    monkeypatch.setattr(method, "auc", lambda s, y: auc_by_pairs(list(s), list(y)) + 0.01)
    with pytest.raises(AssertionError):
        check_auc_with_ties()


class RecordingDenoiser:
    """Returns 0.5 everywhere and records what ddpm_loss passed it."""

    def __call__(self, z, t, cond, keep):
        self.args = (z, t, cond, keep)
        return torch.full_like(z, 0.5)


def check_ddpm_loss_by_hand() -> None:
    """n = 5 rows of d = 3 (n != d), float64, T = 4 steps, cond_dropout 0.5: the draws are t, then eps (in z0's
    dtype), then the keep uniforms, all from the generator; loss = mean over rows of ||0.5 - eps||^2."""
    schedule = method.NoiseSchedule.linear(4)
    z0 = torch.arange(15, dtype=torch.float64).reshape(5, 3) / 10
    cond = torch.ones(5, 2, dtype=torch.float64)
    model = RecordingDenoiser()
    loss = method.ddpm_loss(model, schedule, z0, cond, torch.Generator().manual_seed(4), 0.5)
    g = torch.Generator().manual_seed(4)
    t = torch.randint(0, 4, (5,), generator=g)
    eps = torch.randn(5, 3, generator=g, dtype=torch.float64)
    keep = (torch.rand(5, generator=g) >= 0.5).to(torch.float64)
    z, t_seen, cond_seen, keep_seen = model.args
    assert torch.equal(t_seen, t) and torch.equal(keep_seen, keep) and cond_seen is cond
    assert torch.allclose(z, method.q_sample(schedule, z0, t, eps), rtol=0, atol=1e-15)
    assert float(loss) == pytest.approx(float(((0.5 - eps) ** 2).sum(dim=1).mean()), rel=1e-12)


def test_ddpm_loss_by_hand():
    check_ddpm_loss_by_hand()


def test_negative_control_loss_summed_over_rows_is_caught(monkeypatch):
    real = method.ddpm_loss
    monkeypatch.setattr(method, "ddpm_loss", lambda *args: real(*args) * 5)
    with pytest.raises(AssertionError):
        check_ddpm_loss_by_hand()


def denoiser_by_hand(model: method.Denoiser, z, t, cond, has_cond):
    """The documented forward pass, layer by layer: temb = sinusoidal(t, max period 10^4); ctx = Linear, SiLU,
    Linear of [temb, cond * has_cond, has_cond]; h <- h + layer(silu(h (1 + scale) + shift)); out(silu(h))."""
    half = model.t_dim // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=z.dtype) / half)
    angle = t.to(z.dtype)[:, None] * freqs
    temb = torch.cat([torch.sin(angle), torch.cos(angle)], dim=1)
    first, second = model.ctx[0], model.ctx[2]
    ctx = second(torch.nn.functional.silu(first(torch.cat([temb, cond * has_cond[:, None], has_cond[:, None]], 1))))
    h = model.inp(z)
    for layer, film in zip(model.layers, model.films):
        scale, shift = film(ctx)[:, :h.shape[1]], film(ctx)[:, h.shape[1]:]
        h = h + layer(torch.nn.functional.silu(h * (1 + scale) + shift))
    return model.out(torch.nn.functional.silu(h))


def check_denoiser_forward_by_hand() -> None:
    torch.manual_seed(0)
    model = method.Denoiser(data_dim=3, cond_dim=2, hidden=6, n_layers=2, t_dim=8).double()
    z = torch.randn(4, 3, dtype=torch.float64)
    t = torch.tensor([0, 3, 17, 250])
    cond = torch.randn(4, 2, dtype=torch.float64)
    has_cond = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64)
    assert model.cond_dim == 2 and model.t_dim == 8
    with torch.no_grad():
        assert torch.allclose(model(z, t, cond, has_cond), denoiser_by_hand(model, z, t, cond, has_cond),
                              rtol=0, atol=1e-12)


def test_denoiser_forward_by_hand():
    check_denoiser_forward_by_hand()


def test_negative_control_film_without_shift_is_caught(monkeypatch):
    monkeypatch.setattr(method.Denoiser, "forward", lambda self, z, t, cond, has_cond: denoiser_by_hand(
        self, z, t, cond, has_cond) + 1e-6)
    with pytest.raises(AssertionError):
        check_denoiser_forward_by_hand()


def vocab() -> method.Vocabulary:
    return method.Vocabulary(n_sdoh=2, n_disease=3)


def check_event_backbone_configuration_and_embedding() -> None:
    """GPT-2 with the given sizes, n_inner = 4 n_embd, no dropout; the input embedding is token + sinusoidal(age)
    + W_o latent_o at organ o's sensor token only."""
    v = vocab()
    torch.manual_seed(1)
    model = method.EventBackbone(v, {"heart": 2}, n_layer=2, n_head=2, n_embd=8, n_positions=6)
    c = model.trunk.config
    assert (c.vocab_size, c.n_positions, c.n_layer, c.n_head, c.n_embd, c.n_inner) == (v.size, 6, 2, 2, 8, 32)
    assert (c.resid_pdrop, c.embd_pdrop, c.attn_pdrop) == (0.0, 0.0, 0.0)
    tokens = torch.tensor([[2, v.sensor("heart"), v.disease(0)]])
    ages = torch.tensor([[0.0, 40.0, 41.5]])
    latent = torch.tensor([[0.3, -0.7]])
    with torch.no_grad():
        x = model.embed(tokens, ages, {"heart": latent})
        expected = model.token(tokens) + method.sinusoidal_age(ages, 8)
        expected[0, 1] += model.sensor_proj["heart"](latent)[0]
        assert torch.allclose(x, expected, rtol=0, atol=1e-6)
        hidden = model.trunk(inputs_embeds=x, attention_mask=torch.ones_like(tokens),
                             position_ids=torch.zeros_like(tokens)).last_hidden_state
        assert torch.allclose(model.hidden(tokens, ages, {"heart": latent}), hidden, rtol=0, atol=1e-6)
        assert torch.allclose(model(tokens, ages, {"heart": latent}), model.head(hidden), rtol=0, atol=1e-6)


def test_event_backbone_configuration_and_embedding():
    check_event_backbone_configuration_and_embedding()


def test_negative_control_sensors_ignored_is_caught(monkeypatch):
    real = method.EventBackbone.embed
    monkeypatch.setattr(method.EventBackbone, "embed", lambda self, tokens, ages, sensors=None: real(
        self, tokens, ages, None))
    with pytest.raises(AssertionError):
        check_event_backbone_configuration_and_embedding()


def check_hidden_ignores_padding_and_gpt2_positions() -> None:
    """A left PAD is masked out (the other positions' states equal those without it), and GPT-2's position
    table enters only through row 0 (changing rows 1.. changes nothing)."""
    v = vocab()
    torch.manual_seed(2)
    model = method.EventBackbone(v, {}, n_layer=2, n_head=2, n_embd=8, n_positions=6).eval()
    tokens = torch.tensor([[2, v.disease(0), v.disease(2)]])
    ages = torch.tensor([[0.0, 40.0, 41.5]])
    with torch.no_grad():
        plain = model.hidden(tokens, ages)
        padded = model.hidden(torch.cat([torch.tensor([[v.PAD]]), tokens], 1), torch.cat([torch.zeros(1, 1), ages], 1))
        assert torch.allclose(padded[:, 1:], plain, rtol=0, atol=1e-5)
        model.trunk.wpe.weight[1:] += 3.0
        assert torch.allclose(model.hidden(tokens, ages), plain, rtol=0, atol=1e-6)


def test_hidden_ignores_padding_and_gpt2_positions():
    check_hidden_ignores_padding_and_gpt2_positions()


def test_negative_control_default_positions_are_caught(monkeypatch):
    def default_positions(self, tokens, ages, sensors=None):
        return self.trunk(inputs_embeds=self.embed(tokens, ages, sensors),
                          attention_mask=(tokens != self.vocab.PAD).long()).last_hidden_state
    monkeypatch.setattr(method.EventBackbone, "hidden", default_positions)
    with pytest.raises(AssertionError):
        check_hidden_ignores_padding_and_gpt2_positions()
