"""diffdt method: exact values on non-degenerate inputs, identities, and negative controls that break the library
through monkeypatch and show the same check fails."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.diffdt import method

# --- event likelihood -----------------------------------------------------------------------------------------


def event_loss_check() -> bool:
    """By hand: l = [0, 0], k* = 0, dt = 0.5: -0 + (1 + 1) 0.5 = 1; l = [log 2, 0], k* = 0, dt = 1: -log 2 + 3."""
    logits = torch.tensor([[0.0, 0.0], [math.log(2.0), 0.0]], dtype=torch.float64)
    loss = method.event_nll(logits, torch.tensor([0, 0]), torch.tensor([0.5, 1.0], dtype=torch.float64))
    return torch.allclose(loss, torch.tensor([1.0, 3.0 - math.log(2.0)], dtype=torch.float64), atol=1e-12)


def test_event_loss_exact_values():
    assert event_loss_check()
    assert abs((3.0 - math.log(2.0)) - 2.3069) < 1e-4
    # one event type: L(l) = -l + exp(l) dt is minimised at l = -log dt (lambda = 1 / dt)
    dt = torch.tensor([0.4], dtype=torch.float64)
    logit = torch.full((1, 1), -math.log(0.4), dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(method.event_nll(logit, torch.tensor([0]), dt).sum(), logit)
    assert abs(float(grad)) < 1e-12
    shifted = method.event_nll(logit.detach() + 0.1, torch.tensor([0]), dt)
    assert float(shifted) > float(method.event_nll(logit.detach(), torch.tensor([0]), dt))


def test_event_loss_censoring_and_risk_set():
    logits = torch.tensor([[math.log(2.0), math.log(3.0)]], dtype=torch.float64)
    dt = torch.tensor([0.5], dtype=torch.float64)
    # censored interval: survival term only, (2 + 3) 0.5
    assert float(method.event_nll(logits, torch.tensor([-1]), dt)) == pytest.approx(2.5, abs=1e-12)
    # code 1 already happened: only code 0 is at risk, -log 2 + 2 * 0.5
    at_risk = torch.tensor([[True, False]])
    assert float(method.event_nll(logits, torch.tensor([0]), dt, at_risk)) == pytest.approx(1 - math.log(2), abs=1e-12)


def test_negative_control_loss_without_dt_is_caught(monkeypatch):
    def no_dt(log_rates, target, dt, at_risk=None):
        return torch.exp(log_rates).sum(-1) - log_rates.gather(-1, target.unsqueeze(-1)).squeeze(-1)

    monkeypatch.setattr(method, "event_nll", no_dt)
    assert not event_loss_check()


def test_sinusoidal_age_exact():
    enc = method.sinusoidal_age(torch.tensor([0.0, 2.0]), 4, max_period=100.0)
    # frequencies 1 and 100^(-1/2) = 0.1
    expected = torch.tensor([[0, 0, 1, 1], [math.sin(2), math.sin(0.2), math.cos(2), math.cos(0.2)]])
    assert torch.allclose(enc, expected.float(), atol=1e-6)
    with pytest.raises(ValueError, match="even"):
        method.sinusoidal_age(torch.tensor([1.0]), 3)


def vocab() -> method.Vocabulary:
    return method.Vocabulary(n_sdoh=2, n_disease=3)


def test_vocabulary_layout():
    v = vocab()
    assert (v.first_sensor, v.sensor("heart"), v.first_event, v.sdoh(1), v.disease(0), v.disease(2), v.size) == (
        4, 5, 8, 9, 10, 12, 13)
    assert v.n_events == 5


def test_sequence_targets_by_hand():
    v = vocab()
    # sex @40, SDoH0 @42, no-event @45, disease1 @47, disease1 would be impossible again; pad
    tokens = torch.tensor([[v.FEMALE, v.sdoh(0), v.NO_EVENT, v.disease(1), v.NO_EVENT, v.PAD]])
    ages = torch.tensor([[40.0, 42.0, 45.0, 47.0, 50.0, 50.0]])
    target, dt, valid, at_risk = method.sequence_targets(tokens, ages, v)
    assert target.tolist() == [[0, -1, 3, -1, -1]]
    assert torch.allclose(dt, torch.tensor([[2.0, 3.0, 2.0, 3.0, 0.0]]))
    assert valid.tolist() == [[True, True, True, True, False]]
    expected_risk = [[True] * 5, [False, True, True, True, True], [False, True, True, True, True],
                     [False, True, True, False, True], [False, True, True, False, True]]
    assert at_risk[0].tolist() == expected_risk


def constant_backbone(log_rates: list[float], n_sdoh: int = 0) -> method.EventBackbone:
    v = method.Vocabulary(n_sdoh=n_sdoh, n_disease=len(log_rates) - n_sdoh)
    torch.manual_seed(0)
    model = method.EventBackbone(v, {"heart": 2}, n_layer=1, n_head=2, n_embd=8, n_positions=4)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.copy_(torch.tensor(log_rates))
    return model.eval()


def test_backbone_loss_with_constant_rates_is_the_hand_value():
    model = constant_backbone([math.log(0.5), math.log(2.0)])
    v = model.vocab
    tokens = torch.tensor([[v.MALE, v.disease(1), v.NO_EVENT]])
    ages = torch.tensor([[40.0, 41.0, 43.0]])
    # interval 1: event 1 after 1 y: -log 2 + 2.5; interval 2: censored 2 y, only code 0 at risk: 0.5 * 2
    expected = ((-math.log(2.0) + 2.5) + 1.0) / 2
    assert method.backbone_loss(model, tokens, ages).item() == pytest.approx(expected, abs=1e-5)


def test_sensor_token_adds_the_projection_only_at_its_position():
    model = constant_backbone([0.0, 0.0])
    v = model.vocab
    tokens = torch.tensor([[v.MALE, v.sensor("heart"), v.NO_EVENT]])
    ages = torch.tensor([[40.0, 50.0, 50.0]])
    latent = torch.tensor([[1.0, -2.0]])
    plain = model.embed(tokens, ages)
    with_sensor = model.embed(tokens, ages, {"heart": latent})
    diff = with_sensor - plain
    assert torch.allclose(diff[0, 1], model.sensor_proj["heart"](latent)[0], atol=1e-6)
    assert torch.all(diff[0, [0, 2]] == 0)


def test_draw_next_event_frequencies_and_padding():
    gen = torch.Generator().manual_seed(0)
    n = 40000
    rates = torch.tensor([[1.0, 3.0]], dtype=torch.float64).repeat(n, 1)
    age = torch.full((n,), 50.0, dtype=torch.float64)
    event, new_age = method.draw_next_event(rates, age, torch.full((n,), 1e9, dtype=torch.float64), gen)
    assert float((event == 1).double().mean()) == pytest.approx(0.75, abs=0.01)
    assert float((new_age - 50).mean()) == pytest.approx(0.25, abs=0.005)
    # padding 0.1 y ahead: P(wait > 0.1) = exp(-0.4) of rows become no-events placed exactly at the padding age
    event, new_age = method.draw_next_event(rates, age, torch.full((n,), 50.1, dtype=torch.float64), gen)
    padded = event == -1
    assert float(padded.double().mean()) == pytest.approx(math.exp(-0.4), abs=0.01)
    assert torch.all(new_age[padded] == 50.1) and torch.all(new_age[~padded] <= 50.1)


def test_sample_incidence_matches_independent_exponentials():
    """Constant rates, death not allowed: each code occurs within H with probability 1 - exp(-lambda_k H)
    (competing exponentials with removal after occurrence are independent clocks); padding never changes it."""
    rates = [0.05, 0.2, 0.01]
    model = constant_backbone([math.log(r) for r in rates])
    v = model.vocab
    n = 3000
    tokens = torch.tensor([[v.FEMALE, v.NO_EVENT]]).repeat(n, 1)
    ages = torch.tensor([[40.0, 52.5]]).repeat(n, 1)
    allowed = torch.tensor([True, True, False])
    occurred = method.sample_incidence(model, tokens, ages, None, 10.0, allowed, 40, torch.Generator().manual_seed(1),
                                       40.0, 5.0)
    freq = occurred.double().mean(0).numpy()
    expected = [1 - math.exp(-0.05 * 10), 1 - math.exp(-0.2 * 10), 0.0]
    assert np.allclose(freq, expected, atol=0.03)
    assert freq[2] == 0.0


def test_sample_incidence_respects_history_and_death():
    model = constant_backbone([math.log(0.5), math.log(5.0)])  # code 1 is death (last)
    v = model.vocab
    n = 2000
    tokens = torch.tensor([[v.FEMALE, v.disease(0), v.NO_EVENT]]).repeat(n, 1)
    ages = torch.tensor([[40.0, 45.0, 50.0]]).repeat(n, 1)
    occurred = method.sample_incidence(model, tokens, ages, None, 10.0, torch.tensor([True, True]), 30,
                                       torch.Generator().manual_seed(2), 40.0, 5.0)
    assert not occurred[:, 0].any()  # already had code 0 before the start
    assert float(occurred[:, 1].double().mean()) == pytest.approx(1 - math.exp(-50), abs=1e-3)


def test_sample_incidence_cache_equals_full_recompute(monkeypatch):
    """The key/value-cached step gives the same hidden state as a forward pass over the whole sequence."""
    torch.manual_seed(3)
    v = vocab()
    model = method.EventBackbone(v, {}, n_layer=2, n_head=2, n_embd=8, n_positions=4).eval()
    tokens = torch.tensor([[v.MALE, v.sdoh(0), v.NO_EVENT, v.PAD], [v.FEMALE, v.disease(1), v.disease(0), v.NO_EVENT]])
    ages = torch.tensor([[40.0, 44.0, 50.0, 50.0], [40.0, 42.0, 47.0, 55.0]])
    seen = []
    original_head = model.head.forward

    def record(h):
        seen.append(h.detach().clone())
        return original_head(h)

    monkeypatch.setattr(model.head, "forward", record)
    gen = torch.Generator().manual_seed(0)
    allowed = torch.tensor([True, True, True, True, False])  # no death: both rows stay active for two steps
    method.sample_incidence(model, tokens, ages, None, 50.0, allowed, 2, gen, 40.0, 5.0)
    assert len(seen) == 2
    # rebuild the sequences the sampler produced from the recorded second step: recompute without cache
    gen = torch.Generator().manual_seed(0)
    rates = torch.exp(original_head(seen[0]).double())
    _, _, _, at_risk = method.sequence_targets(torch.cat([tokens, tokens[:, :1]], 1),
                                               torch.cat([ages, ages[:, :1]], 1), v)
    last = torch.tensor([2, 3])
    rates = rates * (at_risk[torch.arange(2), last] & allowed)
    start = ages[torch.arange(2), last].double()
    next_pad = torch.minimum(40.0 + 5.0 * (torch.floor((start - 40.0) / 5.0) + 1), start + 50.0)
    event, new_age = method.draw_next_event(rates, start, next_pad, gen)
    token = torch.where(event >= 0, v.first_event + event, torch.full_like(event, v.NO_EVENT))
    full_tokens = torch.cat([tokens, token.unsqueeze(1)], 1)
    full_ages = torch.cat([ages, new_age.float().unsqueeze(1)], 1)
    # the appended token sits after the padding of row 0, as in the cached run (pads are masked out)
    with torch.no_grad():
        out = model.trunk(inputs_embeds=model.embed(full_tokens, full_ages),
                          attention_mask=(full_tokens != 0).long() | torch.tensor([[0, 0, 0, 0, 1]]),
                          position_ids=torch.zeros_like(full_tokens))
    assert torch.allclose(seen[1], out.last_hidden_state[:, -1], atol=1e-5)


# --- SPD geometry -------------------------------------------------------------------------------------------------


def random_spd(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    return a @ a.T + 0.5 * torch.eye(n, dtype=torch.float64)


def random_symmetric(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    return 0.5 * (a + a.T)


def round_trip_error() -> float:
    c1, s = random_spd(16, 0), random_symmetric(16, 1)
    c2 = method.exp_at(c1, s)
    return float((method.tangent_at(c1, c2) - s).abs().max())


def test_spd_round_trip():
    c1, s = random_spd(16, 0), random_symmetric(16, 1)
    c2 = method.exp_at(c1, s)
    assert float(torch.linalg.eigvalsh(c2)[0]) > 0
    assert round_trip_error() < 1e-8
    v = method.vech(s)
    assert v.shape == (136,)
    assert torch.equal(method.unvech(v, 16), s) or float((method.unvech(v, 16) - s).abs().max()) < 1e-15
    assert float(v.norm()) == pytest.approx(float(torch.linalg.matrix_norm(s)), abs=1e-12)
    # the exp map of a diagonal tangent at a diagonal base point, by hand: diag(4 e^1, 9 e^-2)
    base = torch.diag(torch.tensor([4.0, 9.0], dtype=torch.float64))
    out = method.exp_at(base, torch.diag(torch.tensor([1.0, -2.0], dtype=torch.float64)))
    assert torch.allclose(out, torch.diag(torch.tensor([4 * math.e, 9 * math.exp(-2)], dtype=torch.float64)))


def test_vech_exact_and_unvech_rejects_a_wrong_length():
    s = torch.tensor([[1.0, 2.0], [2.0, 3.0]], dtype=torch.float64)
    assert torch.allclose(method.vech(s), torch.tensor([1.0, 2 * math.sqrt(2), 3.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="expected 3"):
        method.unvech(torch.zeros(4), 2)


def test_negative_control_exp_map_without_conjugation_is_caught(monkeypatch):
    monkeypatch.setattr(method, "exp_at", lambda base, tangent: method.sym_exp(tangent))
    assert not round_trip_error() < 1e-8


def test_negative_control_euclidean_exp_map_is_caught(monkeypatch):
    monkeypatch.setattr(method, "exp_at", lambda base, tangent: base + tangent)
    assert not round_trip_error() < 1e-8


def airm_checks() -> list[bool]:
    c, d = random_spd(5, 2), random_spd(5, 3)
    a = torch.randn(5, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    target = torch.diag(torch.tensor([math.e**2, math.e**-1], dtype=torch.float64))
    return [float(method.airm_distance(c, c)) < 1e-10,
            abs(float(method.airm_distance(torch.eye(2, dtype=torch.float64), target)) - math.sqrt(5)) < 1e-10,
            abs(float(method.airm_distance(c, d) - method.airm_distance(d, c))) < 1e-8,
            abs(float(method.airm_distance(a @ c @ a.T, a @ d @ a.T) - method.airm_distance(c, d))) < 1e-8]


def test_airm_identities():
    assert all(airm_checks())
    assert math.sqrt(5) == pytest.approx(2.2361, abs=1e-4)


def test_negative_control_frobenius_distance_is_not_affine_invariant(monkeypatch):
    monkeypatch.setattr(method, "airm_distance", lambda a, b: torch.linalg.matrix_norm(a - b))
    assert not all(airm_checks())


def test_is_spd_and_projection():
    bad = torch.diag(torch.tensor([1.0, -0.1, 2.0], dtype=torch.float64))
    q, _ = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
    bad = q @ bad @ q.T  # symmetric, one negative eigenvalue, not diagonal
    good = random_spd(3, 5)
    nan = good.clone()
    nan[0, 0] = float("nan")
    assert method.is_spd(torch.stack([bad, good, nan])).tolist() == [False, True, False]
    fixed = method.project_spd(bad, 0.05)
    assert torch.allclose(torch.linalg.eigvalsh(fixed), torch.tensor([0.05, 1.0, 2.0], dtype=torch.float64))


def test_log_euclidean_mean_exact():
    mats = torch.stack([torch.diag(torch.tensor([math.e, 1.0], dtype=torch.float64)),
                        torch.diag(torch.tensor([math.e**3, math.e**2], dtype=torch.float64))])
    assert torch.allclose(method.log_euclidean_mean(mats),
                          torch.diag(torch.tensor([math.e**2, math.e], dtype=torch.float64)))


# --- DDPM ----------------------------------------------------------------------------------------------------------


def test_schedule_and_forward_diffusion_exact():
    sched = method.NoiseSchedule(torch.tensor([0.1, 0.5], dtype=torch.float64))
    assert torch.allclose(sched.alpha_bar, torch.tensor([0.9, 0.45], dtype=torch.float64))
    z0 = torch.tensor([[2.0]], dtype=torch.float64)
    eps = torch.tensor([[1.0]], dtype=torch.float64)
    zt = method.q_sample(sched, z0, torch.tensor([1]), eps)
    assert float(zt) == pytest.approx(math.sqrt(0.45) * 2 + math.sqrt(0.55), abs=1e-12)
    lin = method.NoiseSchedule.linear(1000)
    assert float(lin.betas[0]) == pytest.approx(1e-4) and float(lin.betas[-1]) == pytest.approx(0.02)
    assert lin.steps == 1000 and float(method.NoiseSchedule.linear(100).betas[-1]) == pytest.approx(0.2)


def cfg_check() -> bool:
    c, n = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 4.0])
    return torch.equal(method.guided_eps(c, n, 0.0), c) and torch.allclose(method.guided_eps(c, n, 1.0),
                                                                             torch.tensor([1.5, -8.0]))


def test_cfg_with_zero_weight_is_conditional():
    assert cfg_check()


def test_negative_control_swapped_guidance_is_caught(monkeypatch):
    monkeypatch.setattr(method, "guided_eps", lambda c, n, w: (1 + w) * n - w * c)
    assert not cfg_check()


class PointMassOracle(torch.nn.Module):
    """The exact noise predictor for data that are always 0: eps = z_t / sqrt(1 - abar_t)."""

    def __init__(self, schedule: method.NoiseSchedule):
        super().__init__()
        self.abar = schedule.alpha_bar
        self.calls: list[torch.Tensor] = []

    def forward(self, z, t, cond, has_cond):
        self.calls.append(has_cond.clone())
        return z / (1 - self.abar.to(z.dtype)[t]).sqrt().unsqueeze(-1)


def test_ddpm_loss_and_sampler_with_the_exact_denoiser():
    sched = method.NoiseSchedule.linear(20)
    oracle = PointMassOracle(sched)
    gen = torch.Generator().manual_seed(0)
    z0 = torch.zeros(64, 3, dtype=torch.float64)
    cond = torch.ones(64, 2, dtype=torch.float64)
    assert float(method.ddpm_loss(oracle, sched, z0, cond, gen, 0.0)) < 1e-20
    assert float(method.ddpm_loss(oracle, sched, z0, cond, gen, 1.0)) < 1e-20
    assert torch.all(oracle.calls[0] == 1) and torch.all(oracle.calls[1] == 0)  # condition kept / dropped
    sample = method.ddpm_sample(oracle, sched, cond, 3, 0.7, gen)
    assert float(sample.abs().max()) < 1e-10
    # a wrong denoiser (eps = 0) leaves the noise in the sample
    zero = lambda z, t, c, h: torch.zeros_like(z)  # noqa: E731
    assert float(method.ddpm_sample(zero, sched, cond, 3, 0.0, gen).abs().max()) > 0.1


def test_ddpm_loss_drops_the_condition_at_the_given_rate():
    sched = method.NoiseSchedule.linear(10)
    oracle = PointMassOracle(sched)
    method.ddpm_loss(oracle, sched, torch.zeros(4000, 1), torch.ones(4000, 1), torch.Generator().manual_seed(0), 0.1)
    assert float(1 - oracle.calls[0].mean()) == pytest.approx(0.1, abs=0.02)


def test_denoiser_null_condition_ignores_the_condition():
    torch.manual_seed(0)
    model = method.Denoiser(3, 2, hidden=16, n_layers=2)
    z, t = torch.randn(4, 3), torch.tensor([0, 1, 2, 3])
    a = model(z, t, torch.randn(4, 2), torch.zeros(4))
    b = model(z, t, torch.randn(4, 2), torch.zeros(4))
    c = model(z, t, torch.randn(4, 2), torch.ones(4))
    assert torch.equal(a, b) and not torch.allclose(a, c)


# --- evaluation ------------------------------------------------------------------------------------------------------


def test_auc_exact_values():
    assert method.auc(np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])) == pytest.approx(0.75)
    assert method.auc(np.array([1.0, 1.0, 0.0]), np.array([1, 0, 0])) == pytest.approx(0.75)  # one tie
    assert math.isnan(method.auc(np.array([1.0, 2.0]), np.array([1, 1])))
    scores = np.array([0.1, 0.9, 0.2, 0.3, 0.8, 0.7])
    labels = np.array([0, 1, 1, 0, 0, 1])
    ages = np.array([50, 51, 52, 61, 62, 63.0])
    # bin [50, 60): AUC((0.9, 0.2) vs 0.1) = 1; bin [60, 70): AUC(0.7 vs (0.3, 0.8)) = 0.5
    assert method.age_stratified_auc(scores, labels, ages, np.array([50.0, 60.0, 70.0])) == pytest.approx(0.75)
    assert math.isnan(method.age_stratified_auc(scores, labels, ages, np.array([80.0, 90.0])))


def test_negative_control_auc_without_tie_correction_is_caught(monkeypatch):
    from sklearn.metrics import roc_auc_score

    scores, labels = np.array([1.0, 1.0, 0.0, 0.5]), np.array([1, 0, 0, 1])
    assert method.auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores))
    monkeypatch.setattr(method, "auc", lambda s, y: float(np.mean([a > b for a in s[y == 1] for b in s[y == 0]])))
    assert method.auc(scores, labels) != pytest.approx(roc_auc_score(labels, scores))


def test_energy_distance_exact():
    x = torch.tensor([[0.0], [2.0]])
    y = torch.tensor([[1.0]])
    # 2 * mean(|0-1|, |2-1|) - mean(0, 2, 2, 0) - 0 = 2 - 1 = 1
    assert method.energy_distance(x, y) == pytest.approx(1.0)
    assert method.energy_distance(x, x) == pytest.approx(0.0)


def test_sign_agreement_exact():
    pred = np.array([0.02, -0.01, 0.03, 0.0, -0.5])
    true = np.array([0.05, 0.04, -0.02, 0.001, -0.2])
    assert method.sign_agreement(pred, true, 0.01) == (2, 4)


def test_sign_agreement_excludes_effects_exactly_at_the_bar():
    # |true| = 0.25 equals the bar: not scored (strictly greater); only the 0.5 entry counts
    assert method.sign_agreement(np.array([1.0, -1.0]), np.array([0.25, 0.5]), 0.25) == (0, 1)


# --- negative controls of the remaining claim quantities ----------------------------------------------------------


def spd_validity_check() -> bool:
    """A symmetric matrix with positive diagonal but one negative eigenvalue is invalid (acceptance check (a)4)."""
    bad = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)  # eigenvalues 3 and -1
    valid = method.is_spd(torch.stack([bad, torch.eye(2, dtype=torch.float64)]))
    return valid.tolist() == [False, True]


def test_spd_validity_counts_a_negative_eigenvalue_as_invalid():
    assert spd_validity_check()


def test_negative_control_diagonal_only_validity_is_caught(monkeypatch):
    monkeypatch.setattr(method, "is_spd", lambda m, tol=0.0: (torch.diagonal(m, dim1=-2, dim2=-1) > tol).all(-1))
    assert not spd_validity_check()


def energy_check() -> bool:
    x = torch.tensor([[0.0], [2.0]])
    y = torch.tensor([[1.0], [4.0]])
    # 2 * mean(1, 4, 1, 2) - mean(0, 2, 2, 0) - mean(0, 3, 3, 0) = 4 - 1 - 1.5 = 1.5
    return method.energy_distance(x, y) == pytest.approx(1.5)


def test_energy_distance_two_sided_exact():
    assert energy_check()


def test_negative_control_energy_without_self_terms_is_caught(monkeypatch):
    monkeypatch.setattr(method, "energy_distance", lambda x, y: float(2 * torch.cdist(x, y).mean()))
    assert not energy_check()


def sign_check() -> bool:
    return method.sign_agreement(np.array([0.0, 0.2, -0.1]), np.array([0.05, 0.1, 0.3]), 0.01) == (1, 3)


def test_sign_agreement_counts_a_zero_prediction_as_wrong():
    assert sign_check()


def test_negative_control_non_negative_as_agreement_is_caught(monkeypatch):
    monkeypatch.setattr(method, "sign_agreement", lambda p, t, m: (int(((p >= 0) == (t > 0))[np.abs(t) > m].sum()),
                                                                    int((np.abs(t) > m).sum())))
    assert not sign_check()


def test_negative_control_sampler_without_the_padding_restart_is_caught(monkeypatch):
    """A sampler that ignores the padding ages would still match the marginal incidence (memorylessness), but it
    must place no-events exactly at the padding age: the check on draw_next_event catches its absence."""
    def no_padding(rates, age, next_pad_age, generator):
        total = rates.sum(-1)
        wait = -torch.log1p(-torch.rand(total.shape, generator=generator, dtype=rates.dtype)) / total
        return torch.multinomial(rates / total.unsqueeze(-1), 1, generator=generator).squeeze(-1), age + wait

    monkeypatch.setattr(method, "draw_next_event", no_padding)
    with pytest.raises(AssertionError):
        test_draw_next_event_frequencies_and_padding()
