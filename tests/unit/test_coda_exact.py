"""coda method: exact values on non-degenerate inputs (a two-layer stack, a full 2x2 generator), computed
by hand beside the library, each with a negative control that monkeypatches a broken variant into
`method` (issue 20: layer-wise distillation on a stack of more than one layer)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tasks.coda import method
from tasks.common.seeding import torch_init_seed

F64 = torch.float64


class AffineLayer(nn.Module):
    """y = x W^T + 0.1 dt: a sequence layer with the (inputs, dt) signature and a hand-checkable gradient."""

    def __init__(self, weight: list[list[float]]):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor(weight, dtype=F64))

    def forward(self, x: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.T + 0.1 * dt[..., None]


TEACHER_W = ([[1.0, -0.5], [0.3, 0.8]], [[0.6, 0.2], [-0.4, 1.1]])
STUDENT_W = ([[0.2, 0.1], [0.0, 0.5]], [[-0.3, 0.7], [0.9, 0.1]])
INPUTS = torch.tensor([[[0.5, -1.0], [1.5, 0.2]], [[-0.7, 0.4], [0.3, 0.9]], [[1.1, 1.0], [-0.2, -0.6]]], dtype=F64)
DT = torch.tensor([[0.1, 0.5], [1.0, 0.2], [0.3, 0.7]], dtype=F64)
LR = 0.01


def models() -> tuple[method.SequenceModel, method.SequenceModel]:
    teacher = method.SequenceModel([AffineLayer(w) for w in TEACHER_W], nn.Linear(2, 3).double(), "coda")
    student = method.SequenceModel([AffineLayer(w) for w in STUDENT_W], nn.Linear(2, 3).double(), "coda")
    return teacher, student


def by_hand() -> tuple[list[float], list[torch.Tensor]]:
    """Losses (one epoch, one full batch: the loss before the step) and weights after one Adam step."""
    t1 = INPUTS @ torch.tensor(TEACHER_W[0], dtype=F64).T + 0.1 * DT[..., None]
    t2 = t1 @ torch.tensor(TEACHER_W[1], dtype=F64).T + 0.1 * DT[..., None]
    losses, weights = [], []
    for w, source, target in zip(STUDENT_W, (INPUTS, t1), (t1, t2)):
        w = torch.tensor(w, dtype=F64)
        residual = source @ w.T + 0.1 * DT[..., None] - target
        losses.append(float(residual.pow(2).mean()))
        grad = 2.0 / residual.numel() * torch.einsum("bto,bti->oi", residual, source)
        # Adam's first step: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps)
        weights.append(w - LR * grad / (grad.abs() + 1e-8))
    return losses, weights


def distill_check() -> bool:
    teacher, student = models()
    losses = method.distill_layerwise(teacher, student, INPUTS, DT, epochs=1, batch_size=3, lr=LR,
                                      generator=torch.Generator().manual_seed(0))
    want_losses, want_weights = by_hand()
    return (len(losses) == 2 and all(abs(a - b) < 1e-12 for a, b in zip(losses, want_losses))
            and all(torch.allclose(layer.weight, w, atol=1e-12) for layer, w in zip(student.layers, want_weights))
            and torch.equal(student.head.weight, teacher.head.weight)
            and torch.equal(student.head.bias, teacher.head.bias))


def test_layerwise_distillation_on_a_two_layer_stack_exact():
    assert distill_check()


def test_negative_control_second_layer_trained_on_the_inputs_fails(monkeypatch):
    original = method.SequenceModel.hidden_sequences

    def shifted(self, inputs, dt):  # targets of layer 2 computed from the raw inputs
        outs = original(self, inputs, dt)
        return [outs[0], self.layers[1](inputs, dt)]

    monkeypatch.setattr(method.SequenceModel, "hidden_sequences", shifted)
    assert not distill_check()


def test_negative_control_hidden_sequences_skipping_a_layer_fails(monkeypatch):
    def last_only(self, inputs, dt):
        return [self.layers[0](inputs, dt), self.layers[0](self.layers[0](inputs, dt), dt)]

    monkeypatch.setattr(method.SequenceModel, "hidden_sequences", last_only)
    assert not distill_check()


def test_distillation_epochs_and_mismatched_stacks():
    teacher, student = models()
    losses = method.distill_layerwise(teacher, student, INPUTS, DT, epochs=30, batch_size=2, lr=0.05,
                                      generator=torch.Generator().manual_seed(0))
    assert all(loss < first for loss, first in zip(losses, by_hand()[0]))
    short = method.SequenceModel([AffineLayer(STUDENT_W[0])], nn.Linear(2, 3).double(), "coda")
    with pytest.raises(ValueError):
        method.distill_layerwise(teacher, short, INPUTS, DT, 1, 2, LR, torch.Generator())


def test_sequence_model_forward_is_the_head_of_the_last_layer():
    teacher, _ = models()
    t1 = INPUTS @ torch.tensor(TEACHER_W[0], dtype=F64).T + 0.1 * DT[..., None]
    t2 = t1 @ torch.tensor(TEACHER_W[1], dtype=F64).T + 0.1 * DT[..., None]
    hidden = teacher.hidden_sequences(INPUTS, DT)
    assert len(hidden) == 2 and torch.allclose(hidden[0], t1) and torch.allclose(hidden[1], t2)
    assert torch.allclose(teacher(INPUTS, DT), teacher.head(t2))


# The linear ODE, by hand ---------------------------------------------------------------------------

def test_stable_generator_exact_2x2():
    p = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=F64)
    s = torch.tensor([[0.3, 0.7], [-0.2, 0.4]], dtype=F64)
    # P P^T = [[5, -1.5], [-1.5, 1.25]]; S - S^T = [[0, 0.9], [-0.9, 0]]
    want = [[-5.0 - 0.1, 1.5 + 0.9], [1.5 - 0.9, -1.25 - 0.1]]
    assert torch.allclose(method.stable_generator(p, s, 0.1), torch.tensor(want, dtype=F64), atol=1e-15)


def test_zoh_propagators_exact_for_a_diagonal_generator():
    k = torch.tensor([[-2.0, 0.0], [0.0, -0.5]], dtype=F64)
    dt = torch.tensor([[0.3, 1.7]], dtype=F64)
    phi, gamma = method.zoh_propagators(k, dt)
    for j, step in enumerate((0.3, 1.7)):
        for i, rate in enumerate((-2.0, -0.5)):
            assert float(phi[0, j, i, i]) == pytest.approx(math.exp(rate * step), abs=1e-14)
            assert float(gamma[0, j, i, i]) == pytest.approx((math.exp(rate * step) - 1) / rate, abs=1e-14)
    assert float(phi[0, 0, 0, 1]) == 0.0
    z = torch.tensor([1.0, -2.0], dtype=F64)
    forcing = torch.tensor([0.5, 3.0], dtype=F64)
    step = method.zoh_step(z, forcing, phi[0, 0], gamma[0, 0])
    want = [math.exp(-0.6) * 1.0 + (math.exp(-0.6) - 1) / -2.0 * 0.5,
            math.exp(-0.15) * -2.0 + (math.exp(-0.15) - 1) / -0.5 * 3.0]
    assert torch.allclose(step, torch.tensor(want, dtype=F64), atol=1e-14)
    assert torch.allclose(method.zoh_step_augmented(z, forcing, k, 0.3), step, atol=1e-12)


def test_rk4_one_step_by_hand():
    # dy/dt = -2 y + 1 from y0 = 0.5, one step h = 0.1
    h, y = 0.1, 0.5
    k1 = -2 * y + 1
    k2 = -2 * (y + h / 2 * k1) + 1
    k3 = -2 * (y + h / 2 * k2) + 1
    k4 = -2 * (y + h * k3) + 1
    want = y + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    got = method.rk4_integrate(lambda v: -2 * v + 1, torch.tensor([0.5], dtype=F64), 0.2, 2)
    y2 = want
    k1 = -2 * y2 + 1
    k2 = -2 * (y2 + h / 2 * k1) + 1
    k3 = -2 * (y2 + h / 2 * k2) + 1
    k4 = -2 * (y2 + h * k3) + 1
    assert float(got) == pytest.approx(y2 + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), abs=1e-15)
    per_row = method.rk4_integrate(lambda v: -2 * v + 1, torch.tensor([[0.5], [0.5]], dtype=F64),
                                   torch.tensor([0.1, 0.0], dtype=F64), 1)
    assert per_row[:, 0].tolist() == pytest.approx([want, 0.5], abs=1e-15)


def test_series_terms_by_dtype():
    assert method.series_terms(torch.float64) == 18 and method.series_terms(torch.float32) == 10


def test_coda_block_accepts_the_smallest_sizes():
    block = method.CodaBlock(2, 3, gru_hidden=1, rank=1)
    out = block(torch.randn(2, 4, 2), torch.rand(2, 4))
    assert out.shape == (2, 4, 3) and torch.isfinite(out).all()
    for bad in ({"gru_hidden": 0}, {"rank": 0}):
        with pytest.raises(ValueError):
            method.CodaBlock(2, 3, **bad)


# Survivors of the full mutation run (issue 20, second pass) ------------------------------------------------------

THIRD_TEACHER_W, THIRD_STUDENT_W = [[0.9, -0.1], [0.4, 0.3]], [[0.5, 0.5], [-0.2, 0.1]]


def affine(x: torch.Tensor, w: list[list[float]]) -> torch.Tensor:
    return x @ torch.tensor(w, dtype=F64).T + 0.1 * DT[..., None]


def check_distillation_losses_over_batches_and_three_layers() -> None:
    """lr = 0 leaves every layer as it is, so each epoch loss is the layer's MSE over all 3 samples, from batches of
    2 and 1 weighted by their sizes; a three-layer stack gets three losses, layer 3 fed the teacher's layer 2."""
    teacher_w, student_w = (*TEACHER_W, THIRD_TEACHER_W), (*STUDENT_W, THIRD_STUDENT_W)
    teacher = method.SequenceModel([AffineLayer(w) for w in teacher_w], nn.Linear(2, 3).double(), "coda")
    student = method.SequenceModel([AffineLayer(w) for w in student_w], nn.Linear(2, 3).double(), "coda")
    losses = method.distill_layerwise(teacher, student, INPUTS, DT, epochs=2, batch_size=2, lr=0.0,
                                      generator=torch.Generator().manual_seed(0))
    targets, x = [], INPUTS
    for w in teacher_w:
        x = affine(x, w)
        targets.append(x)
    sources = [INPUTS, *targets[:-1]]
    want = [float((affine(s, w) - t).pow(2).mean()) for w, s, t in zip(student_w, sources, targets, strict=True)]
    assert len(losses) == 3 and losses == pytest.approx(want, abs=1e-14)


def test_distillation_losses_over_batches_and_three_layers():
    check_distillation_losses_over_batches_and_three_layers()


@pytest.mark.parametrize("broken", ["last_batch_only", "two_sources"])
def test_negative_control_broken_distillation_bookkeeping_is_caught(monkeypatch, broken):
    def distill(teacher, student, inputs, dt, epochs, batch_size, lr, generator):
        with torch.no_grad():
            targets = teacher.hidden_sequences(inputs, dt)
        sources = [inputs, targets[0]] if broken == "two_sources" else [inputs, *targets[:-1]]
        final = []
        for layer, source, target in zip(student.layers, sources, targets):
            optimiser = torch.optim.Adam(layer.parameters(), lr=lr)
            for _ in range(epochs):
                order = torch.randperm(len(inputs), generator=generator)
                total = 0.0
                for start in range(0, len(order), batch_size):
                    batch = order[start:start + batch_size]
                    loss = nn.functional.mse_loss(layer(source[batch], dt[batch]), target[batch])
                    optimiser.zero_grad(set_to_none=True)
                    loss.backward()
                    optimiser.step()
                    contribution = float(loss.detach()) * len(batch)
                    total = contribution if broken == "last_batch_only" else total + contribution
                epoch_loss = total / len(order)
            final.append(epoch_loss)
        return final

    monkeypatch.setattr(method, "distill_layerwise", distill)
    with pytest.raises(AssertionError):
        check_distillation_losses_over_batches_and_three_layers()


def propagator_flops(k: torch.Tensor, dt: torch.Tensor) -> int:
    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        method.zoh_propagators(k, dt)
    return int(counter.get_total_flops())


def check_propagator_cost() -> None:
    """The propagators cost (series terms + 2 squarings) batched r x r products of 2 r^3 FLOPs per distinct Delta.
    Squarings: ceil(log2(||K Delta_max||_1 / 0.5)) when the 1-norm (largest column sum) exceeds 1/2, else 0.
    K has column sums 2.5 and 0.6 (1-norm 2.5, infinity norm 2.1), two distinct steps, r = 2, u = 2."""
    k = torch.tensor([[-2.0, 0.1], [0.5, -0.5]], dtype=F64)
    per_product = 2 * 2 * 2**3
    # Delta_max 1.7: ||K Delta||_1 = 4.25 -> ceil(log2(8.5)) = 4 squarings (the infinity norm 3.57 would give 3)
    assert propagator_flops(k, torch.tensor([[0.3, 1.7]], dtype=F64)) == per_product * (18 + 2 * 4)
    # Delta_max 0.2: 0.5 exactly -> no squaring (the test is "> 0.5")
    assert propagator_flops(k, torch.tensor([[0.1, 0.2]], dtype=F64)) == per_product * 18
    # Delta_max 0.21: 0.525 -> ceil(log2(1.05)) = 1 squaring; float32 uses 10 terms
    assert propagator_flops(k.float(), torch.tensor([[0.1, 0.21]])) == per_product * (10 + 2 * 1)


def test_propagator_cost_follows_the_norm_of_k_delta():
    check_propagator_cost()


@pytest.mark.parametrize("norm_dim", [-1, None])
def test_negative_control_another_norm_is_caught(monkeypatch, norm_dim):
    """A propagator that picks its squarings by the infinity norm (or squares once more) fails the cost check."""
    def propagators(k, dt):
        r = k.shape[-1]
        unique, inverse = torch.unique(dt.reshape(-1), return_inverse=True)
        step = unique.to(k.dtype).view(-1, 1, 1)
        a = k.expand(len(unique), r, r) * step
        norm = float(a.abs().sum(dim=norm_dim if norm_dim is not None else -2).max())
        squarings = max(0, math.ceil(math.log2(norm / 0.5))) if norm > 0.5 else 0
        squarings += 1 if norm_dim is None else 0
        a = a / 2**squarings
        eye = torch.eye(r, dtype=k.dtype).expand_as(a)
        term, phi, gamma_sum = eye, eye, eye
        for n in range(1, method.series_terms(k.dtype) + 1):
            term = term @ a / n
            phi = phi + term
            gamma_sum = gamma_sum + term / (n + 1)
        gamma = gamma_sum * (step / 2**squarings)
        for _ in range(squarings):
            gamma = gamma + phi @ gamma
            phi = phi @ phi
        return phi[inverse].reshape(*dt.shape, r, r), gamma[inverse].reshape(*dt.shape, r, r)

    monkeypatch.setattr(method, "zoh_propagators", propagators)
    with pytest.raises(AssertionError):
        check_propagator_cost()


def check_coda_structure_and_defaults() -> None:
    """The layers' documented defaults and parameter shapes: CodaBlock (GRU 16, rank 8, eps 1e-2, B without bias,
    P ~ N(0, 1/r), S ~ N(0, 0.25/r)), LiquidSynapse (2 channels, gain 2, W_x without bias), LTCLayer (A_c = +1 then
    -1; one unfold allowed), SequenceModel keeps its kind."""
    block = method.CodaBlock(2, 3)
    assert (block.gru.hidden_size, block.rank, block.eps, block.forcing.bias) == (16, 8, 1e-2, None)
    torch.manual_seed(0)
    wide = method.CodaBlock(2, 3, rank=64)
    assert 0.9 < float(wide.p.detach().std() * 8) < 1.1 and 0.45 < float(wide.s.detach().std() * 8) < 0.55
    synapse = method.LiquidSynapse(4)
    assert synapse.recurrent.out_features == 8 and synapse.recurrent.bias is None
    assert torch.allclose(nn.functional.softplus(synapse.raw_gain), torch.full((8,), 2.0))
    ltc = method.LTCLayer(2, 3, ode_unfolds=1)
    assert ltc.reversal.tolist() == [1.0, 1.0, 1.0, -1.0, -1.0, -1.0]
    assert method.SequenceModel([ltc], nn.Linear(3, 1), "forecast").kind == "forecast"


def test_coda_structure_and_defaults():
    check_coda_structure_and_defaults()


@pytest.mark.parametrize("broken", ["rank_9", "forcing_bias", "three_channels"])
def test_negative_control_structure_and_defaults(monkeypatch, broken):
    real_block, real_synapse = method.CodaBlock.__init__, method.LiquidSynapse.__init__
    if broken == "rank_9":
        monkeypatch.setattr(method.CodaBlock, "__init__", lambda self, i, o, gru_hidden=16, rank=9, eps=1e-2:
                            real_block(self, i, o, gru_hidden, rank, eps))
    elif broken == "forcing_bias":
        def init(self, *args, **kwargs):
            real_block(self, *args, **kwargs)
            self.forcing = nn.Linear(self.forcing.in_features, self.rank)
        monkeypatch.setattr(method.CodaBlock, "__init__", init)
    else:
        monkeypatch.setattr(method.LiquidSynapse, "__init__", lambda self, units, channels=3, initial_gain=2.0:
                            real_synapse(self, units, channels, initial_gain))
    with pytest.raises(AssertionError):
        check_coda_structure_and_defaults()


def check_linear_ode_helpers_exact() -> None:
    """Exact (rtol 0) generator in float64; batched P, S and batched z; float32 K keeps float32 propagators even
    for float64 steps; an empty dt; a 0-d RK4 state stays 0-d; an LTC with reversal potentials other than +-1."""
    p = torch.tensor([[1.0, 2.0], [0.5, -1.0]], dtype=F64)
    s = torch.tensor([[0.3, 0.7], [-0.2, 0.4]], dtype=F64)
    want = torch.tensor([[-5.0 - 0.1, 1.5 + 0.9], [1.5 - 0.9, -1.25 - 0.1]], dtype=F64)
    assert torch.allclose(method.stable_generator(p, s, 0.1), want, rtol=0.0, atol=1e-15)
    batched = method.stable_generator(torch.stack([p, 2 * p]), torch.stack([s, -s]), 0.1)
    assert torch.equal(batched[0], method.stable_generator(p, s, 0.1))
    assert torch.equal(batched[1], method.stable_generator(2 * p, -s, 0.1))
    k = torch.tensor([[-2.0, 0.1], [0.5, -0.5]], dtype=F64)
    phi, gamma = method.zoh_propagators(k, torch.tensor([[0.3, 1.7]], dtype=F64))
    z, forcing = torch.tensor([[1.0, -2.0], [0.5, 0.25]], dtype=F64), torch.tensor([[0.5, 3.0], [-1.0, 2.0]], dtype=F64)
    stepped = method.zoh_step(z, forcing, phi[0], gamma[0])
    assert stepped.shape == (2, 2)
    for row in range(2):
        assert torch.equal(stepped[row], method.zoh_step(z[row], forcing[row], phi[0, row], gamma[0, row]))
    phi32, gamma32 = method.zoh_propagators(k.float(), torch.tensor([[0.3, 1.7]], dtype=F64))
    assert phi32.dtype == gamma32.dtype == torch.float32
    assert method.augmented_exponential(k.float(), torch.tensor([0.3], dtype=F64)).dtype == torch.float32
    empty_phi, empty_gamma = method.zoh_propagators(k, torch.zeros(1, 0, dtype=F64))
    assert empty_phi.shape == empty_gamma.shape == (1, 0, 2, 2)
    assert method.rk4_integrate(lambda v: -v, torch.tensor(1.0, dtype=F64), torch.tensor(0.1, dtype=F64), 1).shape == ()
    ltc = method.LTCLayer(1, 2, ode_unfolds=1).double()
    with torch.no_grad():
        ltc.reversal.copy_(torch.tensor([0.5, 2.0, -0.25, -4.0], dtype=F64))
    inputs, dt = torch.tensor([[[0.3]]], dtype=F64), torch.tensor([[0.2]], dtype=F64)
    f = ltc.synapse(torch.zeros(1, 2, dtype=F64), ltc.input_map(inputs)[:, 0]).view(1, 2, 2)
    inv_tau = 1.0 / (nn.functional.softplus(ltc.log_tau) + 0.1)
    x = (0.2 * (f * ltc.reversal.view(2, 2)).sum(1)) / (1 + 0.2 * inv_tau + 0.2 * f.sum(1))
    assert torch.allclose(ltc(inputs, dt)[:, 0], x, rtol=0.0, atol=1e-15)


def test_linear_ode_helpers_exact():
    check_linear_ode_helpers_exact()


@pytest.mark.parametrize("broken", ["float32_eye", "unbatched_transpose", "float64_steps"])
def test_negative_control_linear_ode_helpers(monkeypatch, broken):
    real_generator, real_propagators = method.stable_generator, method.zoh_propagators
    if broken == "float32_eye":
        monkeypatch.setattr(method, "stable_generator", lambda p, s, eps: -(p @ p.transpose(-1, -2) + eps * torch.eye(
            p.shape[-2])) + (s - s.transpose(-1, -2)))
    elif broken == "unbatched_transpose":
        monkeypatch.setattr(method, "stable_generator", lambda p, s, eps: real_generator(p, s, eps) if p.dim() == 2
                            else -(p @ p + eps * torch.eye(p.shape[-2], dtype=p.dtype)) + (s - s.transpose(1, -2)))
    else:
        monkeypatch.setattr(method, "zoh_propagators", lambda k, dt: real_propagators(k.to(dt.dtype), dt))
    with pytest.raises(AssertionError):
        check_linear_ode_helpers_exact()


def check_distillation_uses_its_generator_and_epochs() -> None:
    """The batch order comes from the given generator only (the global seed does not matter); 0 epochs give nan."""
    results = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        teacher, student = models()
        losses = method.distill_layerwise(teacher, student, INPUTS, DT, epochs=3, batch_size=1, lr=0.05,
                                          generator=torch.Generator().manual_seed(7))
        results.append((losses, [layer.weight.detach().clone() for layer in student.layers]))
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))
    teacher, student = models()
    assert all(math.isnan(v) for v in method.distill_layerwise(teacher, student, INPUTS, DT, 0, 2, LR,
                                                               torch.Generator()))


def test_distillation_uses_its_generator_and_epochs():
    check_distillation_uses_its_generator_and_epochs()


def test_negative_control_distillation_on_the_global_generator(monkeypatch):
    real = method.distill_layerwise
    def on_global(teacher, student, inputs, dt, epochs, batch_size, lr, generator):  # ignores the given generator
        seeded = torch.Generator().manual_seed(int(torch.randint(0, 1000, ())))
        return real(teacher, student, inputs, dt, epochs, batch_size, lr, seeded)

    monkeypatch.setattr(method, "distill_layerwise", on_global)
    with pytest.raises(AssertionError):
        check_distillation_uses_its_generator_and_epochs()


def test_flop_counters_print_nothing(capsys):
    model = method.SequenceModel([AffineLayer(TEACHER_W[0])], nn.Linear(2, 3).double(), "coda")
    assert method.forward_flops(model, INPUTS, DT) > 0
    assert method.training_step_flops(model, INPUTS, DT, lambda out: out.pow(2).mean()) > 0
    assert capsys.readouterr().out == ""


def test_negative_control_printing_flop_counter_is_caught(monkeypatch, capsys):
    def printing(model, inputs, dt):
        with torch.no_grad(), torch.utils.flop_counter.FlopCounterMode(display=True) as counter:
            model(inputs, dt)
        return int(counter.get_total_flops())

    monkeypatch.setattr(method, "forward_flops", printing)
    with pytest.raises(AssertionError):
        test_flop_counters_print_nothing(capsys)


# ------------------------------------------------------------- the no-ODE ablation and the stopping rules


def test_left_initial_plateau_exact_cases():
    """min(L) <= (1 - drop) x L_1 on a first loss that is not 1, at the boundary and on both sides of it."""
    assert method.left_initial_plateau([2.0, 1.5, 1.7], 0.2) is True  # 1.5 <= 1.6
    assert method.left_initial_plateau([2.0, 1.7, 1.65], 0.2) is False  # 1.65 > 1.6
    assert method.left_initial_plateau([2.0, 1.6], 0.2) is True  # 1.6 <= 1.6: the boundary passes
    assert method.left_initial_plateau([2.0, 1.5], 0.2) is True  # the reference is epoch 1, not epoch 2
    assert method.left_initial_plateau([], 0.2) is False


@pytest.mark.parametrize("broken", [
    lambda losses, drop: bool(losses) and min(losses) < (1.0 - drop) * losses[0],
    lambda losses, drop: bool(losses) and min(losses) <= (1.0 + drop) * losses[0],
    lambda losses, drop: bool(losses) and min(losses) <= (1.0 - drop) * losses[-1],
])
def test_negative_control_left_initial_plateau(monkeypatch, broken):
    monkeypatch.setattr(method, "left_initial_plateau", broken)
    with pytest.raises(AssertionError):
        test_left_initial_plateau_exact_cases()


def test_should_stop_at_exactly_min_epochs():
    """[3, 2, 2, 2]: two epochs without improvement (tolerance 0); with min_epochs = len it stops, one more not."""
    assert method.epochs_since_improvement([3.0, 2.0, 2.0, 2.0], 0.0) == 2
    assert method.should_stop([3.0, 2.0, 2.0, 2.0], min_epochs=4, patience=2, min_rel_improvement=0.0) is True
    assert method.should_stop([3.0, 2.0, 2.0, 2.0], min_epochs=5, patience=2, min_rel_improvement=0.0) is False
    assert method.should_stop([3.0, 2.0, 2.0, 2.0], min_epochs=4, patience=3, min_rel_improvement=0.0) is False


def test_negative_control_should_stop_strict_warm_up(monkeypatch):
    def strict(val_losses, min_epochs, patience, min_rel_improvement):
        return len(val_losses) > min_epochs and method.epochs_since_improvement(
            val_losses, min_rel_improvement) >= patience

    monkeypatch.setattr(method, "should_stop", strict)
    with pytest.raises(AssertionError):
        test_should_stop_at_exactly_min_epochs()


def brute_force_width(in_dim: int, out_dim: int, gru_hidden: int, rank: int) -> int:
    target = method.coda_parameters(in_dim, out_dim, gru_hidden, rank)
    return min(range(1, 1000), key=lambda w: (abs(method.gru_dense_parameters(in_dim, out_dim, w) - target), w))


# (1, 1, 1, 1): target 18, widths 1 -> 14 and 2 -> 33, so width 1; rank > gru_hidden in the next two.
@pytest.mark.parametrize("dims, width", [((1, 1, 1, 1), 1), ((3, 2, 2, 5), 4), ((2, 3, 4, 8), 8), ((5, 3, 16, 8), 18)])
def test_matched_ablation_hidden_exact(dims, width):
    assert method.coda_parameters(1, 1, 1, 1) == 18 and method.gru_dense_parameters(1, 1, 1) == 14
    assert brute_force_width(*dims) == width
    assert method.matched_ablation_hidden(*dims) == width


def test_negative_control_matched_ablation_hidden(monkeypatch):
    def from_two(in_dim, out_dim, gru_hidden, rank):
        target = method.coda_parameters(in_dim, out_dim, gru_hidden, rank)
        return min(range(2, 100), key=lambda w: (abs(method.gru_dense_parameters(in_dim, out_dim, w) - target), w))

    monkeypatch.setattr(method, "matched_ablation_hidden", from_two)
    with pytest.raises(AssertionError):
        test_matched_ablation_hidden_exact((1, 1, 1, 1), 1)


def manual_gru_dense(block: method.GruDenseBlock, x: torch.Tensor) -> torch.Tensor:
    """PyTorch's GRU equations written out over the time axis 1 (batch first), then the dense read-out."""
    gru = block.gru
    w_ir, w_iz, w_in = gru.weight_ih_l0.chunk(3)
    w_hr, w_hz, w_hn = gru.weight_hh_l0.chunk(3)
    b_ir, b_iz, b_in = gru.bias_ih_l0.chunk(3)
    b_hr, b_hz, b_hn = gru.bias_hh_l0.chunk(3)
    h = torch.zeros(x.shape[0], gru.hidden_size, dtype=x.dtype)
    outs = []
    for t in range(x.shape[1]):
        xt = x[:, t]
        r = torch.sigmoid(xt @ w_ir.T + b_ir + h @ w_hr.T + b_hr)
        z = torch.sigmoid(xt @ w_iz.T + b_iz + h @ w_hz.T + b_hz)
        n = torch.tanh(xt @ w_in.T + b_in + r * (h @ w_hn.T + b_hn))
        h = (1 - z) * n + z * h
        outs.append(h)
    memory = torch.stack(outs, dim=1)
    return memory @ block.readout.weight.T + block.readout.bias


def gru_dense_inputs(gru_hidden: int) -> tuple[method.GruDenseBlock, torch.Tensor]:
    torch_gen = torch.Generator().manual_seed(3)
    with torch_init_seed(3):
        block = method.GruDenseBlock(2, 3, gru_hidden).double()
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=torch_gen, dtype=F64) * 0.7)
    x = torch.randn(2, 4, 2, generator=torch_gen, dtype=F64)  # batch 2, 4 steps: batch and time differ
    return block, x


@pytest.mark.parametrize("gru_hidden", [1, 3])
def test_gru_dense_block_matches_the_written_out_gru(gru_hidden):
    block, x = gru_dense_inputs(gru_hidden)
    out = block(x, torch.ones(2, 4, dtype=F64))
    assert out.shape == (2, 4, 3)
    torch.testing.assert_close(out, manual_gru_dense(block, x), rtol=1e-12, atol=1e-12)
    assert sum(p.numel() for p in block.parameters()) == method.gru_dense_parameters(2, 3, gru_hidden)


def test_negative_control_gru_dense_block_time_major(monkeypatch):
    original = method.GruDenseBlock.__init__

    def time_major(self, in_dim, out_dim, gru_hidden):
        original(self, in_dim, out_dim, gru_hidden)
        self.gru.batch_first = False

    monkeypatch.setattr(method.GruDenseBlock, "__init__", time_major)
    with pytest.raises(AssertionError):
        test_gru_dense_block_matches_the_written_out_gru(3)
