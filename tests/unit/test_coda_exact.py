"""coda method: exact values on non-degenerate inputs (a two-layer stack, a full 2x2 generator), computed
by hand beside the library, each with a negative control that monkeypatches a broken variant into
`method` (issue 20: layer-wise distillation on a stack of more than one layer)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tasks.coda import method

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
