"""Deterministic checks of the CoDA library (brief coda.md, acceptance section (a)).

Every key check has a negative control: a deliberately broken variant that must fail the same check.
"""

from __future__ import annotations

import pytest
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


def _euler_step(z, forcing, k, dt):
    """Negative control: a first-order Euler step in place of the matrix exponential."""
    return z + dt * (k @ z + forcing)


# ----------------------------------------------------------------------------------------------------
# (a)1 exact ZOH propagation == fine RK4 of the same linear ODE
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_zoh_step_equals_fine_rk4_and_euler_does_not(seed):
    g = _rng(100 + seed)
    k = _random_generator(seed)
    z0, forcing = torch.randn(8, generator=g, dtype=F64), torch.randn(8, generator=g, dtype=F64)
    for dt in torch.linspace(0.05, 0.15, 5, dtype=F64).tolist():
        phi, gamma = m.zoh_propagators(k, torch.tensor([dt], dtype=F64))
        exact = m.zoh_step(z0, forcing, phi[0], gamma[0])
        reference = m.rk4_integrate(lambda z: k @ z + forcing, z0, dt, 400)
        assert float((exact - reference).abs().max()) <= 1e-5
        # the brief's own form, expm([[K, B h], [0, 0]] dt), agrees too
        assert torch.allclose(m.zoh_step_augmented(z0, forcing, k, dt), exact, atol=1e-12)
        assert float((_euler_step(z0, forcing, k, dt) - reference).abs().max()) > 1e-5


def test_rk4_is_fourth_order_on_a_scalar_exponential():
    exact = torch.exp(torch.tensor(-1.0, dtype=F64))
    errors = [abs(float(m.rk4_integrate(lambda y: -y, torch.tensor(1.0, dtype=F64), 1.0, n)) - float(exact))
              for n in (4, 8)]
    assert 12 < errors[0] / errors[1] < 20  # 2^4 = 16


# ----------------------------------------------------------------------------------------------------
# (a)2 augmented-exponential identity
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1])
def test_augmented_exponential_top_right_block_is_k_inverse_times_expm_minus_identity(seed):
    k = _random_generator(seed)
    dts = torch.tensor([0.05, 0.1, 0.15, 2.5], dtype=F64)
    reference = m.augmented_exponential(k, dts)
    phi, gamma = m.zoh_propagators(k, dts)
    eye = torch.eye(8, dtype=F64)
    for i, dt in enumerate(dts):
        expected_gamma = torch.linalg.solve(k, torch.linalg.matrix_exp(k * dt) - eye)
        assert torch.allclose(reference[i, :8, 8:], expected_gamma, atol=1e-8, rtol=0)
        assert torch.allclose(gamma[i], expected_gamma, atol=1e-8, rtol=0)  # the scaled series, same identity
        assert torch.allclose(phi[i], torch.linalg.matrix_exp(k * dt), atol=1e-10, rtol=0)
        # negative control: the first-order integral dt * I misses the identity
        assert not torch.allclose(dt * eye, expected_gamma, atol=1e-8, rtol=0)


def test_propagators_gather_per_step_and_float32_stays_close():
    k = _random_generator(3)
    dt = torch.tensor([[0.1, 0.05, 0.1], [0.15, 0.1, 0.05]], dtype=F64)
    phi, gamma = m.zoh_propagators(k, dt)
    assert phi.shape == gamma.shape == (2, 3, 8, 8)
    assert torch.equal(phi[0, 0], phi[1, 1]) and torch.equal(gamma[0, 1], gamma[1, 2])
    phi32, gamma32 = m.zoh_propagators(k.float(), dt.float())
    assert torch.allclose(phi32.double(), phi, atol=1e-5) and torch.allclose(gamma32.double(), gamma, atol=1e-5)


# ----------------------------------------------------------------------------------------------------
# (a)3 stability of the parametrisation
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [1e-3, 1e-2, 0.5])
def test_parametrised_generator_is_stable_and_unconstrained_one_is_not(eps):
    worst = -float("inf")
    for seed in range(50):
        k = _random_generator(seed, r=8, eps=eps)
        worst = max(worst, float(torch.linalg.eigvals(k).real.max()))
    assert worst <= -eps + 1e-10
    # negative control: dropping the sign of the symmetric part (an unstable parametrisation)
    g = _rng(0)
    p, s = torch.randn(8, 8, generator=g, dtype=F64), torch.randn(8, 8, generator=g, dtype=F64)
    unstable = (p @ p.T + eps * torch.eye(8, dtype=F64)) + (s - s.T)
    assert float(torch.linalg.eigvals(unstable).real.max()) > -eps


def test_stable_generator_rejects_non_positive_eps():
    with pytest.raises(ValueError, match="eps"):
        m.stable_generator(torch.eye(2), torch.eye(2), 0.0)


# ----------------------------------------------------------------------------------------------------
# (a)4 Delta = 0 is the identity; gradients flow to P, S, B and the GRU
# ----------------------------------------------------------------------------------------------------

def test_zero_step_keeps_the_state_exactly():
    k = _random_generator(5)
    z, forcing = torch.randn(8, generator=_rng(1), dtype=F64), torch.randn(8, generator=_rng(2), dtype=F64)
    phi, gamma = m.zoh_propagators(k, torch.zeros(1, dtype=F64))
    assert torch.equal(m.zoh_step(z, forcing, phi[0], gamma[0]), z)
    # negative control: a step that adds the forcing regardless of Delta moves the state
    assert not torch.equal(z + forcing, z)


def _block64() -> m.CodaBlock:
    torch.manual_seed(0)
    return m.CodaBlock(in_dim=3, out_dim=4, gru_hidden=5, rank=3, eps=1e-2).double()


def test_gradients_reach_p_s_b_and_gru_and_match_finite_differences():
    block = _block64()
    g = _rng(7)
    inputs = torch.randn(2, 6, 3, generator=g, dtype=F64)
    dt = (0.05 + 0.1 * torch.rand(2, 6, generator=g, dtype=F64))

    def loss() -> torch.Tensor:
        return block(inputs, dt).pow(2).sum()

    block.zero_grad()
    loss().backward()
    params = {"p": block.p, "s": block.s, "B": block.forcing.weight, "gru": block.gru.weight_hh_l0}
    for name, param in params.items():
        grad = param.grad.clone()
        assert float(grad.abs().max()) > 0, name
        direction = torch.randn(param.shape, generator=g, dtype=F64)
        h = 1e-6
        with torch.no_grad():
            param += h * direction
            up = float(loss())
            param -= 2 * h * direction
            down = float(loss())
            param += h * direction
        numeric, analytic = (up - down) / (2 * h), float((grad * direction).sum())
        assert abs(numeric - analytic) <= 1e-4 * max(1.0, abs(analytic)), name
    # negative control: a detached generator cuts the gradient to P and S
    assert not m.zoh_propagators(block.generator().detach(), dt)[0].requires_grad


# ----------------------------------------------------------------------------------------------------
# (a)5 nonlinear cell evaluations per step, counted by an instrumented forward
# ----------------------------------------------------------------------------------------------------

def _count(layer) -> float:
    model = m.SequenceModel([layer], torch.nn.Linear(32 if not isinstance(layer, m.CodaBlock) else 32, 1),
                            "forecast")
    inputs, dt = torch.randn(3, 7, 4, generator=_rng(0)), torch.full((3, 7), 0.1)
    return m.count_nonlinear_evaluations(model, inputs, dt)


def test_nonlinear_evaluations_per_step_per_model():
    torch.manual_seed(0)
    assert _count(m.LTCLayer(4, 32, ode_unfolds=6)) == 6.0
    assert _count(m.LTCLayer(4, 32, ode_unfolds=3)) == 3.0
    assert _count(m.CodaBlock(4, 32, gru_hidden=16, rank=8)) == 1.0
    assert _count(baselines.CfCLayer(4, 32)) == 1.0
    assert _count(baselines.GRULayer(4, 32)) == 1.0
    assert _count(baselines.ODERNNLayer(4, 32, rk4_steps=1)) == 5.0  # 4 RK4 stages + the GRU update
    assert _count(baselines.ODERNNLayer(4, 32, rk4_steps=2)) == 9.0


class _NonlinearOdeCoda(m.CodaBlock):
    """Negative control: a 'CoDA' whose latent ODE is nonlinear and unfolded like the LTC (6 evaluations)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.latent_ode = baselines.ODEFunc(self.rank)

    def forward(self, inputs, dt):
        memory, _ = self.gru(inputs)
        z, states = inputs.new_zeros(inputs.shape[0], self.rank), []
        for k in range(inputs.shape[1]):
            for _ in range(6):
                z = z + dt[:, k:k + 1] / 6 * (self.latent_ode(z) + self.forcing(memory[:, k]))
            states.append(z)
        return self.readout(torch.cat([torch.stack(states, 1), memory], -1))


def test_instrumented_count_catches_a_nonlinear_latent_ode():
    torch.manual_seed(0)
    assert _count(_NonlinearOdeCoda(4, 32, gru_hidden=16, rank=8)) == 7.0


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
