"""Deterministic checks of the CoDA library: acceptance checks (a)1-(a)5, the sources of the identities C1, C2
and C2b in tasks/coda/claims.yaml.

Every key check has a negative control: a deliberately broken variant that must fail the same check.
"""

from __future__ import annotations

import pytest
import scipy.linalg
import torch

from tasks.coda import baselines
from tasks.coda import method as m

F64 = torch.float64


def _rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _random_generator(seed: int, r: int = 8, eps: float = 1e-2) -> torch.Tensor:
    g = _rng(seed)
    return m.stable_generator(torch.randn(r, r, generator=g, dtype=F64), torch.randn(r, r, generator=g, dtype=F64),
                              eps)


# ----------------------------------------------------------------------------------------------------
# (a)1 exact ZOH propagation == fine RK4 of the same linear ODE
# ----------------------------------------------------------------------------------------------------

def _worst_zoh_vs_rk4_gap(seed: int) -> float:
    """The (a)1 check: largest gap between the library's ZOH step and 400-step RK4, over Delta in [0.05, 0.15]."""
    g = _rng(100 + seed)
    k = _random_generator(seed)
    z0, forcing = torch.randn(8, generator=g, dtype=F64), torch.randn(8, generator=g, dtype=F64)
    worst = 0.0
    for dt in torch.linspace(0.05, 0.15, 5, dtype=F64).tolist():
        phi, gamma = m.zoh_propagators(k, torch.tensor([dt], dtype=F64))
        exact = m.zoh_step(z0, forcing, phi[0], gamma[0])
        reference = m.rk4_integrate(lambda z: k @ z + forcing, z0, dt, 400)
        worst = max(worst, float((exact - reference).abs().max()))
        # the augmented form of the step, expm([[K, B h], [0, 0]] dt), agrees too
        assert torch.allclose(m.zoh_step_augmented(z0, forcing, k, dt), exact, atol=1e-12)
    return worst


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_zoh_step_equals_fine_rk4(seed):
    assert _worst_zoh_vs_rk4_gap(seed) <= 1e-5


def test_zoh_check_fails_when_the_library_truncates_the_exponential_series(monkeypatch):
    # negative control: the library's series cut to first order (Phi = I + A per scaled step)
    monkeypatch.setattr(m, "series_terms", lambda dtype: 1)
    monkeypatch.setattr(m, "zoh_step_augmented", lambda z, f, k, dt: m.zoh_step(
        z, f, *(x[0] for x in m.zoh_propagators(k, torch.tensor([dt], dtype=F64)))))
    assert _worst_zoh_vs_rk4_gap(0) > 1e-5


def test_rk4_is_fourth_order_on_a_scalar_exponential():
    exact = torch.exp(torch.tensor(-1.0, dtype=F64))
    errors = [abs(float(m.rk4_integrate(lambda y: -y, torch.tensor(1.0, dtype=F64), 1.0, n)) - float(exact))
              for n in (4, 8)]
    assert 12 < errors[0] / errors[1] < 20  # 2^4 = 16


# ----------------------------------------------------------------------------------------------------
# (a)2 augmented-exponential identity (reference: scipy's expm, independent of torch)
# ----------------------------------------------------------------------------------------------------

DTS = (0.05, 0.1, 0.15, 2.5)


def _identity_gaps(seed: int) -> dict[str, float]:
    """The (a)2 check: top-right block of expm([[K, I], [0, 0]] dt) (``augmented_exponential``) and the fast
    ``Gamma`` against K^-1 (e^{K dt} - I); ``Phi`` against e^{K dt}."""
    k = _random_generator(seed)
    dts = torch.tensor(DTS, dtype=F64)
    augmented = m.augmented_exponential(k, dts)
    phi, gamma = m.zoh_propagators(k, dts)
    gaps = {"augmented": 0.0, "gamma": 0.0, "phi": 0.0}
    for i, dt in enumerate(DTS):
        expm = torch.from_numpy(scipy.linalg.expm(k.numpy() * dt))
        expected = torch.linalg.solve(k, expm - torch.eye(8, dtype=F64))
        gaps["augmented"] = max(gaps["augmented"], float((augmented[i, :8, 8:] - expected).abs().max()))
        gaps["gamma"] = max(gaps["gamma"], float((gamma[i] - expected).abs().max()))
        gaps["phi"] = max(gaps["phi"], float((phi[i] - expm).abs().max()))
    return gaps


@pytest.mark.parametrize("seed", [0, 1])
def test_augmented_exponential_top_right_block_is_k_inverse_times_expm_minus_identity(seed):
    gaps = _identity_gaps(seed)
    assert gaps["augmented"] <= 1e-8 and gaps["gamma"] <= 1e-8 and gaps["phi"] <= 1e-10, gaps


def test_identity_check_fails_with_a_truncated_series(monkeypatch):
    monkeypatch.setattr(m, "series_terms", lambda dtype: 2)  # negative control on the fast propagators
    gaps = _identity_gaps(0)
    assert gaps["gamma"] > 1e-8 and gaps["phi"] > 1e-10


def test_identity_check_fails_with_a_first_order_matrix_exponential(monkeypatch):
    # negative control on augmented_exponential: torch's matrix_exp replaced by I + A
    monkeypatch.setattr(torch.linalg, "matrix_exp", lambda a: torch.eye(a.shape[-1], dtype=a.dtype) + a)
    assert _identity_gaps(0)["augmented"] > 1e-8


def test_propagators_gather_per_step_and_float32_stays_close():
    k = _random_generator(3)
    dt = torch.tensor([[0.1, 0.05, 0.1], [0.15, 0.1, 0.05]], dtype=F64)
    phi, gamma = m.zoh_propagators(k, dt)
    assert phi.shape == gamma.shape == (2, 3, 8, 8)
    assert torch.equal(phi[0, 0], phi[1, 1]) and torch.equal(gamma[0, 1], gamma[1, 2])
    phi32, gamma32 = m.zoh_propagators(k.float(), dt.float())
    assert torch.allclose(phi32.double(), phi, atol=1e-5) and torch.allclose(gamma32.double(), gamma, atol=1e-5)


# ----------------------------------------------------------------------------------------------------
# (a)3 stability of the parametrisation (through CodaBlock.generator, the path the model uses)
# ----------------------------------------------------------------------------------------------------

def _worst_real_eig_plus_eps(eps: float, n: int = 50) -> float:
    """The (a)3 check: max over random P, S of max Re eig(K) + eps (<= 0 when stable)."""
    block = m.CodaBlock(2, 2, gru_hidden=2, rank=8, eps=eps).double()
    worst = -float("inf")
    for seed in range(n):
        g = _rng(seed)
        with torch.no_grad():
            block.p.copy_(torch.randn(8, 8, generator=g, dtype=F64))
            block.s.copy_(torch.randn(8, 8, generator=g, dtype=F64))
        worst = max(worst, float(torch.linalg.eigvals(block.generator().detach()).real.max()) + eps)
    return worst


@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.5])
def test_parametrised_generator_is_stable(eps):
    assert _worst_real_eig_plus_eps(eps) <= 1e-10


def test_stability_check_fails_when_the_skew_part_is_not_skew(monkeypatch):
    # negative control: the library's K with S + S^T in place of S - S^T (adds 2 S^T to the correct K)
    correct = m.stable_generator
    monkeypatch.setattr(m, "stable_generator", lambda p, s, eps: correct(p, s, eps) + 2 * s.transpose(-1, -2))
    assert _worst_real_eig_plus_eps(1e-2) > 1e-10


def test_stable_generator_rejects_non_positive_eps():
    with pytest.raises(ValueError, match="eps"):
        m.stable_generator(torch.eye(2), torch.eye(2), 0.0)


# ----------------------------------------------------------------------------------------------------
# (a)4 Delta = 0 is the identity; gradients flow to P, S, B and the GRU
# ----------------------------------------------------------------------------------------------------

def _zero_step_keeps_state() -> bool:
    k = _random_generator(5)
    z, forcing = torch.randn(8, generator=_rng(1), dtype=F64), torch.randn(8, generator=_rng(2), dtype=F64)
    phi, gamma = m.zoh_propagators(k, torch.zeros(1, dtype=F64))
    return torch.equal(m.zoh_step(z, forcing, phi[0], gamma[0]), z)


def test_zero_step_keeps_the_state_exactly():
    assert _zero_step_keeps_state()


def test_zero_step_check_fails_when_gamma_is_taken_at_a_shifted_delta(monkeypatch):
    # negative control: the library's Gamma evaluated one timestamp tick (1 ms) late
    correct = m.zoh_propagators
    monkeypatch.setattr(m, "zoh_propagators", lambda k, dt: (correct(k, dt)[0], correct(k, dt + 1e-3)[1]))
    assert not _zero_step_keeps_state()


def _block64() -> m.CodaBlock:
    torch.manual_seed(0)
    return m.CodaBlock(in_dim=3, out_dim=4, gru_hidden=5, rank=3, eps=1e-2).double()


def _gradient_failures() -> list[str]:
    """The (a)4 gradient check: the parameters (P, S, B, GRU) whose autograd gradient is missing, zero, or off
    a central finite difference along a random direction by more than 1e-4 relative."""
    block = _block64()
    g = _rng(7)
    inputs = torch.randn(2, 6, 3, generator=g, dtype=F64)
    dt = (0.05 + 0.1 * torch.rand(2, 6, generator=g, dtype=F64))

    def loss() -> torch.Tensor:
        return block(inputs, dt).pow(2).sum()

    block.zero_grad()
    loss().backward()
    failures = []
    params = {"p": block.p, "s": block.s, "B": block.forcing.weight, "gru": block.gru.weight_hh_l0}
    for name, param in params.items():
        grad = param.grad.clone() if param.grad is not None else torch.zeros_like(param)
        direction = torch.randn(param.shape, generator=g, dtype=F64)
        h = 1e-6
        with torch.no_grad():
            param += h * direction
            up = float(loss())
            param -= 2 * h * direction
            down = float(loss())
            param += h * direction
        numeric, analytic = (up - down) / (2 * h), float((grad * direction).sum())
        if float(grad.abs().max()) == 0 or abs(numeric - analytic) > 1e-4 * max(1.0, abs(analytic)):
            failures.append(name)
    return failures


def test_gradients_reach_p_s_b_and_gru_and_match_finite_differences():
    assert _gradient_failures() == []


def test_gradient_check_fails_when_the_generator_is_detached(monkeypatch):
    # negative control: the library's CodaBlock.generator cut from autograd
    correct = m.CodaBlock.generator
    monkeypatch.setattr(m.CodaBlock, "generator", lambda self: correct(self).detach())
    assert _gradient_failures() == ["p", "s"]


# ----------------------------------------------------------------------------------------------------
# (a)5 nonlinear cell evaluations per step, counted by an instrumented forward (exact by construction)
# ----------------------------------------------------------------------------------------------------

def _count(layer) -> float:
    model = m.SequenceModel([layer], torch.nn.Linear(32, 1), "forecast")
    inputs, dt = torch.randn(3, 7, 4, generator=_rng(0)), torch.full((3, 7), 0.1)
    return m.count_nonlinear_evaluations(model, inputs, dt)


def _ltc_and_coda_counts() -> tuple[float, float]:
    torch.manual_seed(0)
    return _count(m.LTCLayer(4, 32, ode_unfolds=6)), _count(m.CodaBlock(4, 32, gru_hidden=16, rank=8))


def test_nonlinear_evaluations_per_step_per_model():
    assert _ltc_and_coda_counts() == (6.0, 1.0)
    torch.manual_seed(0)
    assert _count(m.LTCLayer(4, 32, ode_unfolds=3)) == 3.0
    assert _count(baselines.CfCLayer(4, 32)) == 1.0
    assert _count(baselines.GRULayer(4, 32)) == 1.0
    assert _count(baselines.ODERNNLayer(4, 32, rk4_steps=1)) == 5.0  # 4 RK4 stages + the GRU update
    assert _count(baselines.ODERNNLayer(4, 32, rk4_steps=2)) == 9.0


def test_count_check_fails_when_coda_reruns_its_gru_per_unfold(monkeypatch):
    # negative control: the library's CodaBlock.forward also re-running its GRU 5 more times per sequence
    correct = m.CodaBlock.forward

    def unfolded(self, inputs, dt):
        for _ in range(5):
            self.gru(inputs)
        return correct(self, inputs, dt)

    monkeypatch.setattr(m.CodaBlock, "forward", unfolded)
    assert _ltc_and_coda_counts() == (6.0, 6.0)


def test_count_check_fails_when_the_ltc_synapse_is_not_a_counted_cell(monkeypatch):
    # negative control: the counter follows real cell calls, not the layers' own bookkeeping
    monkeypatch.setattr(m, "NonlinearCell", type("Unrelated", (torch.nn.Module,), {}))
    assert _ltc_and_coda_counts() == (0.0, 1.0)


def test_two_layer_stacks_add_their_evaluations():
    torch.manual_seed(0)
    inputs, dt = torch.randn(2, 5, 4), torch.full((2, 5), 0.1)
    ltc = m.SequenceModel([m.LTCLayer(4, 8), m.LTCLayer(8, 8)], torch.nn.Linear(8, 1), "forecast")
    coda = m.SequenceModel([m.CodaBlock(4, 8, 4, 2), m.CodaBlock(8, 8, 4, 2)], torch.nn.Linear(8, 1), "forecast")
    assert m.count_nonlinear_evaluations(ltc, inputs, dt) == 12.0
    assert m.count_nonlinear_evaluations(coda, inputs, dt) == 2.0


# ----------------------------------------------------------------------------------------------------
# Layers, FLOPs and conversion
# ----------------------------------------------------------------------------------------------------

def test_ltc_layer_matches_the_fused_update_written_out():
    torch.manual_seed(0)
    layer = m.LTCLayer(2, 3, ode_unfolds=2).double()
    u = torch.randn(1, 1, 2, dtype=F64)
    dt = torch.tensor([[0.1]], dtype=F64)
    out = layer(u, dt)[0, 0]
    x = torch.zeros(3, dtype=F64)
    inv_tau = 1 / (torch.nn.functional.softplus(layer.log_tau) + 0.1)
    gain = torch.nn.functional.softplus(layer.synapse.raw_gain)
    for _ in range(2):
        f = gain * torch.sigmoid(layer.synapse.recurrent.weight @ x + layer.input_map(u[0, 0]))
        f_exc, f_inh = f[:3], f[3:]
        a_exc, a_inh = layer.reversal[:3], layer.reversal[3:]
        x = (x + 0.05 * (f_exc * a_exc + f_inh * a_inh)) / (1 + 0.05 * (inv_tau + f_exc + f_inh))
    assert torch.allclose(out, x, atol=1e-12)


def test_coda_forward_matches_a_step_by_step_reference():
    block = _block64()
    inputs, dt = torch.randn(1, 4, 3, generator=_rng(3), dtype=F64), torch.tensor([[0.1, 0.05, 0.15, 0.1]], dtype=F64)
    out = block(inputs, dt)
    memory = block.gru(inputs)[0][0]
    k, z = block.generator(), torch.zeros(3, dtype=F64)
    for step in range(4):
        z = m.zoh_step_augmented(z, block.forcing(memory[step]), k, float(dt[0, step]))
        expected = block.readout(torch.cat([z, memory[step]]))
        assert torch.allclose(out[0, step], expected, atol=1e-10)


def test_flop_counts_are_deterministic_and_coda_is_cheaper_at_inference():
    torch.manual_seed(0)
    inputs, dt = torch.randn(8, 10, 4), torch.round(torch.rand(8, 10) * 100) / 1000 + 0.05
    ltc = m.SequenceModel([m.LTCLayer(4, 32)], torch.nn.Linear(32, 1), "forecast")
    coda = m.SequenceModel([m.CodaBlock(4, 32, 16, 8)], torch.nn.Linear(32, 1), "forecast")
    first, again = m.forward_flops(ltc, inputs, dt), m.forward_flops(ltc, inputs, dt)
    assert first == again > 0
    assert m.forward_flops(coda, inputs, dt) < first
    train = m.training_step_flops(coda, inputs, dt, lambda out: out.pow(2).mean())
    assert train > m.forward_flops(coda, inputs, dt)
    assert all(p.grad is None for p in coda.parameters())


def test_layerwise_distillation_reduces_the_gap_to_the_teacher():
    torch.manual_seed(0)
    teacher = m.SequenceModel([m.LTCLayer(3, 8)], torch.nn.Linear(8, 1), "forecast")
    student = m.SequenceModel([m.CodaBlock(3, 8, 8, 4)], torch.nn.Linear(8, 1), "forecast")
    inputs, dt = torch.randn(32, 8, 3, generator=_rng(0)), torch.full((32, 8), 0.1)
    target = teacher.hidden_sequences(inputs, dt)[0].detach()
    with torch.no_grad():
        before = float((student.hidden_sequences(inputs, dt)[0] - target).pow(2).mean())
    losses = m.distill_layerwise(teacher, student, inputs, dt, epochs=30, batch_size=16, lr=1e-2,
                                 generator=_rng(0))
    assert losses[0] < 0.5 * before
    assert torch.equal(student.head.weight, teacher.head.weight)
    with pytest.raises(ValueError, match="layers"):
        m.distill_layerwise(teacher, m.SequenceModel([], torch.nn.Linear(3, 1), "forecast"), inputs, dt, 1, 8,
                            1e-2, _rng(0))
