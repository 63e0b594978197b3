"""CoDA (continuous-depth acceleration), RECONSTRUCTED from the abstract and the lab's prior work.

The paper text was not available (README, reconstruction notice); every layer below is the reconstruction's:

- ``LTCLayer``: the liquid time-constant layer of Hasani et al. (AAAI 2021), dx/dt = -[1/tau + f(x, u)] x
  + f(x, u) A, advanced by ``ode_unfolds`` fused semi-implicit Euler unfolds per input step (the LTC paper's
  fused solver, its Eq. 3): x <- (x + delta f A) / (1 + delta (1/tau + f)), delta = Delta_k / unfolds.
- ``CodaBlock``: the Mori-Zwanzig / Koopman replacement (README, "Method"): memory and forcing by a
  compact GRU, h_k = GRU(u_k, h_{k-1}); a single low-dimensional linear ODE dz/dt = K z + B h_k solved exactly
  under zero-order hold, z_k = e^{K Delta_k} z_{k-1} + (int_0^{Delta_k} e^{K s} ds) B h_k; a dense read-out
  y_k = W [z_k; h_k] + b. K = -(P P^T + eps I) + (S - S^T) is stable by construction.
- ``SequenceModel``: a stack of such layers with one linear head, trained jointly by one backward pass
  ("unified backpropagation"); ``distill_layerwise`` converts a trained LTC stack into a CoDA stack.

This module is a plain library (no Prefect, no MLflow).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

Rhs = Callable[[torch.Tensor], torch.Tensor]


# ------------------------------------------------------------------------------------------------
# The linear ODE: stable generator and exact zero-order-hold propagation
# ------------------------------------------------------------------------------------------------

def stable_generator(p: torch.Tensor, s: torch.Tensor, eps: float) -> torch.Tensor:
    """K = -(P P^T + eps I) + (S - S^T) (README, "Method": CoDA block).

    The symmetric part of K is -(P P^T + eps I) <= -eps I, so every eigenvalue has Re(lambda) <= -eps: for an
    eigenpair (lambda, v), Re(lambda) |v|^2 = Re(v* K v) = v* sym(K) v.
    """
    if eps <= 0:
        raise ValueError(f"eps must be > 0 for strict stability, got {eps}")
    eye = torch.eye(p.shape[-2], dtype=p.dtype, device=p.device)
    return -(p @ p.transpose(-1, -2) + eps * eye) + (s - s.transpose(-1, -2))


def augmented_exponential(k: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
    """expm([[K, I], [0, 0]] Delta) for every Delta in the 1-D ``dt``, by ``torch.linalg.matrix_exp``: the
    reference the fast propagators are checked against (README, "Method": ZOH propagators)."""
    r = k.shape[-1]
    scale = dt.to(k.dtype).view(-1, 1, 1)
    eye = torch.eye(r, dtype=k.dtype, device=k.device).expand(len(dt), r, r)
    top = torch.cat([k.expand(len(dt), r, r) * scale, eye * scale], dim=-1)
    return torch.linalg.matrix_exp(torch.cat([top, torch.zeros_like(top)], dim=-2))


def series_terms(dtype: torch.dtype) -> int:
    """Taylor terms that reach the dtype's precision once ||K Delta / 2^s|| <= 1/2: 0.5^(m+1)/(m+1)! is
    below 1e-11 for m = 10 (float32) and 1e-23 for m = 18 (float64)."""
    return 18 if dtype == torch.float64 else 10


def zoh_propagators(k: torch.Tensor, dt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Phi(Delta) = e^{K Delta} and Gamma(Delta) = int_0^Delta e^{K s} ds for every entry of ``dt``.

    These are the top-left and top-right blocks of the augmented exponential expm([[K, I], [0, 0]] Delta)
    (README, "Method": ZOH propagators). Its block structure lets one evaluate them on r x r matrices directly, by
    scaling and squaring: with A = K Delta / 2^s scaled to ||A||_1 <= 1/2, Phi = sum_n A^n / n! and
    Gamma = (Delta / 2^s) sum_n A^n / (n + 1)! to the dtype's precision, then s doublings
    Gamma(2h) = Gamma(h) + Phi(h) Gamma(h), Phi(2h) = Phi(h)^2. It agrees with ``augmented_exponential`` to
    rounding (tested) and keeps every operation a plain matrix product, so autograd and the FLOP counter see
    all of it. The propagators do not depend on the GRU state: they are computed once per distinct Delta in
    the batch (timestamps logged at a finite resolution repeat) and gathered. Returns dt.shape + (r, r).
    """
    r = k.shape[-1]
    unique, inverse = torch.unique(dt.reshape(-1), return_inverse=True)
    step = unique.to(k.dtype).view(-1, 1, 1)
    a = k.expand(len(unique), r, r) * step
    norm = float(a.detach().abs().sum(dim=-2).max()) if len(unique) else 0.0
    squarings = max(0, math.ceil(math.log2(norm / 0.5))) if norm > 0.5 else 0
    a = a / 2**squarings
    eye = torch.eye(r, dtype=k.dtype, device=k.device).expand_as(a)
    term, phi, gamma_sum = eye, eye, eye
    for n in range(1, series_terms(k.dtype) + 1):
        term = term @ a / n
        phi = phi + term
        gamma_sum = gamma_sum + term / (n + 1)
    gamma = gamma_sum * (step / 2**squarings)
    for _ in range(squarings):
        gamma = gamma + phi @ gamma
        phi = phi @ phi
    return phi[inverse].reshape(*dt.shape, r, r), gamma[inverse].reshape(*dt.shape, r, r)


def zoh_step(z: torch.Tensor, forcing: torch.Tensor, phi: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """z_{k+1} = Phi z_k + Gamma (B h_k): the exact solution of dz/dt = K z + B h_k with B h_k held constant."""
    return (phi @ z.unsqueeze(-1) + gamma @ forcing.unsqueeze(-1)).squeeze(-1)


def zoh_step_augmented(z: torch.Tensor, forcing: torch.Tensor, k: torch.Tensor, dt: float) -> torch.Tensor:
    """The same step from expm([[K, B h], [0, 0]] Delta) (the CoDA block's ZOH step, README "Method"), for one vector z.

    The last column of the exponential's top block is Gamma (B h); used to cross-check ``zoh_propagators``.
    """
    r = k.shape[-1]
    top = torch.cat([k, forcing.view(r, 1)], dim=-1) * dt
    augmented = torch.cat([top, torch.zeros(1, r + 1, dtype=k.dtype, device=k.device)], dim=-2)
    exponential = torch.linalg.matrix_exp(augmented)
    return exponential[:r, :r] @ z + exponential[:r, r]


def rk4_integrate(rhs: Rhs, y0: torch.Tensor, duration: float | torch.Tensor, n_steps: int) -> torch.Tensor:
    """Classical fixed-step Runge-Kutta 4 of dy/dt = rhs(y) over ``duration`` (a scalar or one per row)."""
    h = duration / n_steps
    if isinstance(h, torch.Tensor) and h.dim() > 0:
        h = h.unsqueeze(-1)
    y = y0
    for _ in range(n_steps):
        k1 = rhs(y)
        k2 = rhs(y + 0.5 * h * k1)
        k3 = rhs(y + 0.5 * h * k2)
        k4 = rhs(y + h * k3)
        y = y + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y


# ------------------------------------------------------------------------------------------------
# Layers. Every layer maps (inputs (B, T, d_in), dt (B, T)) -> outputs (B, T, d_out).
# ------------------------------------------------------------------------------------------------

class NonlinearCell(nn.Module):
    """Marker base class: one call of a subclass is one nonlinear cell evaluation for one time step.

    ``count_nonlinear_evaluations`` hooks every instance, so the count does not rely on the layers'
    own bookkeeping.
    """


class LiquidSynapse(NonlinearCell):
    """The positive synaptic drive f(x, u) = g * sigmoid(W_x x + W_u u + b) of the LTC ODE, for ``channels``
    synapse groups per neuron (one evaluation computes all of them).

    The learnable positive gains g (softplus) play the role of the LTC's maximal conductances.
    """

    def __init__(self, units: int, channels: int = 2, initial_gain: float = 2.0):
        super().__init__()
        self.recurrent = nn.Linear(units, channels * units, bias=False)
        self.raw_gain = nn.Parameter(torch.full((channels * units,), math.log(math.expm1(initial_gain))))

    def forward(self, x: torch.Tensor, input_drive: torch.Tensor) -> torch.Tensor:
        gain = nn.functional.softplus(self.raw_gain)
        return gain * torch.sigmoid(torch.addmm(input_drive, x, self.recurrent.weight.t()))


class LTCLayer(nn.Module):
    """Liquid time-constant layer, fused semi-implicit Euler (Hasani et al. 2021, Eq. 3), own implementation.

    dx/dt = -[1/tau + sum_c f_c(x, u)] x + sum_c f_c(x, u) A_c with two synapse groups c (reversal potentials
    A_c initialised excitatory, +1, and inhibitory, -1, as in the LTC's wiring), so the input-dependent
    equilibrium can swing both ways. Per input step k with elapsed time Delta_k, ``ode_unfolds`` unfolds of
    size delta = Delta_k / ode_unfolds each evaluate f once:
    x <- (x + delta sum_c f_c A_c) / (1 + delta / tau + delta sum_c f_c). The layer's output is x.
    """

    def __init__(self, in_dim: int, units: int, ode_unfolds: int = 6):
        super().__init__()
        if ode_unfolds < 1:
            raise ValueError(f"ode_unfolds must be >= 1, got {ode_unfolds}")
        self.units, self.ode_unfolds = units, ode_unfolds
        self.input_map = nn.Linear(in_dim, 2 * units)  # the input part of f is linear: computed once per sequence
        self.synapse = LiquidSynapse(units, channels=2)
        self.log_tau = nn.Parameter(torch.zeros(units))  # tau = softplus(.) + 0.1 > 0
        self.reversal = nn.Parameter(torch.cat([torch.ones(units), -torch.ones(units)]))  # A_c

    def forward(self, inputs: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        drive = self.input_map(inputs)
        inv_tau = 1.0 / (nn.functional.softplus(self.log_tau) + 0.1)
        reversal = self.reversal.view(2, self.units)
        delta = (dt / self.ode_unfolds).unsqueeze(-1)  # (B, T, 1)
        leak = 1.0 + delta * inv_tau
        x = inputs.new_zeros(inputs.shape[0], self.units)
        outputs = []
        for k in range(inputs.shape[1]):
            step = delta[:, k]
            for _ in range(self.ode_unfolds):
                # per-neuron sums over the two synapse groups, elementwise (no dense matrix product)
                f = self.synapse(x, drive[:, k]).view(-1, 2, self.units)
                x = (x + step * (f * reversal).sum(1)) / (leak[:, k] + step * f.sum(1))
            outputs.append(x)
        return torch.stack(outputs, dim=1)


class CodaBlock(nn.Module):
    """CoDA block (README, "Method", reconstructed): GRU memory, one exact linear ODE, dense read-out.

    The GRU does not depend on z, so it runs fused over the whole sequence (one nonlinear cell evaluation per
    step); the linear ODE is a cheap linear recurrence z_k = Phi_k z_{k-1} + Gamma_k B h_k whose propagators
    come from one batched matrix exponential. Read-out y_k = W [z_k; h_k] + b (the propagated state z_k is used
    so that the output at step k reflects the elapsed time Delta_k).
    """

    def __init__(self, in_dim: int, out_dim: int, gru_hidden: int = 16, rank: int = 8, eps: float = 1e-2):
        super().__init__()
        if rank < 1 or gru_hidden < 1:
            raise ValueError(f"rank and gru_hidden must be >= 1, got {rank}, {gru_hidden}")
        self.rank, self.eps = rank, eps
        self.gru = nn.GRU(in_dim, gru_hidden, batch_first=True)
        self.p = nn.Parameter(torch.randn(rank, rank) / math.sqrt(rank))
        self.s = nn.Parameter(torch.randn(rank, rank) * 0.5 / math.sqrt(rank))
        self.forcing = nn.Linear(gru_hidden, rank, bias=False)  # B
        self.readout = nn.Linear(rank + gru_hidden, out_dim)  # W, b

    def generator(self) -> torch.Tensor:
        return stable_generator(self.p, self.s, self.eps)

    def forward(self, inputs: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        memory, _ = self.gru(inputs)
        phi, gamma = zoh_propagators(self.generator(), dt)
        drive = (gamma @ self.forcing(memory).unsqueeze(-1)).squeeze(-1)  # Gamma_k B h_k, all steps at once
        z = inputs.new_zeros(inputs.shape[0], self.rank)
        states = []
        for k in range(inputs.shape[1]):
            z = (phi[:, k] @ z.unsqueeze(-1)).squeeze(-1) + drive[:, k]
            states.append(z)
        return self.readout(torch.cat([torch.stack(states, dim=1), memory], dim=-1))


class GruDenseBlock(nn.Module):
    """Ablation of ``CodaBlock`` without its linear ODE: the same fused GRU memory and a dense read-out of h_k
    alone, y_k = W h_k + b (README, "Ablation"). At a matched parameter count (``matched_ablation_hidden``)
    it decides whether the linear ODE carries anything a slightly wider GRU does not."""

    def __init__(self, in_dim: int, out_dim: int, gru_hidden: int):
        super().__init__()
        if gru_hidden < 1:
            raise ValueError(f"gru_hidden must be >= 1, got {gru_hidden}")
        self.gru = nn.GRU(in_dim, gru_hidden, batch_first=True)
        self.readout = nn.Linear(gru_hidden, out_dim)

    def forward(self, inputs: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        memory, _ = self.gru(inputs)
        return self.readout(memory)


def gru_dense_parameters(in_dim: int, out_dim: int, gru_hidden: int) -> int:
    """Parameters of ``GruDenseBlock``: GRU 3H(in + H) weights + 6H biases, read-out H x out + out."""
    h = gru_hidden
    return 3 * h * (in_dim + h) + 6 * h + h * out_dim + out_dim


def coda_parameters(in_dim: int, out_dim: int, gru_hidden: int, rank: int) -> int:
    """Parameters of ``CodaBlock``: GRU, P and S (r x r each), B (r x H), read-out (r + H) x out + out."""
    h = gru_hidden
    return 3 * h * (in_dim + h) + 6 * h + 2 * rank * rank + rank * h + (rank + h) * out_dim + out_dim


def matched_ablation_hidden(in_dim: int, out_dim: int, gru_hidden: int, rank: int) -> int:
    """The GRU width of the no-ODE ablation whose parameter count is closest to the CoDA block's (ties: the
    smaller width): the ablation gets the ODE's parameters back as GRU units."""
    target = coda_parameters(in_dim, out_dim, gru_hidden, rank)
    widths = range(1, 4 * (gru_hidden + rank) + 1)
    return min(widths, key=lambda w: (abs(gru_dense_parameters(in_dim, out_dim, w) - target), w))


def epochs_since_improvement(val_losses: list[float], min_rel_improvement: float) -> int:
    """Early-stopping counter (README, "Training"): epochs since the last improving one, an epoch improving when
    its validation loss falls below (1 - min_rel_improvement) x the loss of the last improving epoch (the first
    epoch always improves; 0 for no epochs). Smaller gains do not move the reference, so a slow drift that adds
    up to more than the tolerance still counts. Training stops, and the model counts as converged, once this
    reaches the patience: its validation loss then stayed within the tolerance of its own best for that long."""
    reference, since = math.inf, 0
    for loss in val_losses:
        if loss < (1.0 - min_rel_improvement) * reference:
            reference, since = loss, 0
        else:
            since += 1
    return since


def should_stop(val_losses: list[float], min_epochs: int, patience: int, min_rel_improvement: float) -> bool:
    """Early stopping with a warm-up (README, "Training"): stop once at least ``min_epochs`` epochs ran AND
    ``epochs_since_improvement`` reached ``patience``. The warm-up keeps a model that sits on its initial
    plateau (e.g. near ln 3 on a 3-class task) from being stopped before it starts to learn."""
    return len(val_losses) >= min_epochs and epochs_since_improvement(val_losses, min_rel_improvement) >= patience


def left_initial_plateau(val_losses: list[float], min_initial_drop: float) -> bool:
    """The best validation loss is at least ``min_initial_drop`` below the first epoch's: min(L) <= (1 - drop) x
    L_1 (False for no epochs). A model whose best epoch is on its starting plateau, or one that diverged after
    epoch 1, fails it."""
    return bool(val_losses) and min(val_losses) <= (1.0 - min_initial_drop) * val_losses[0]


class SequenceModel(nn.Module):
    """A stack of sequence layers and a linear head (per-step outputs; classification reads the last step)."""

    def __init__(self, layers: list[nn.Module], head: nn.Linear, kind: str):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.head = head
        self.kind = kind

    def hidden_sequences(self, inputs: torch.Tensor, dt: torch.Tensor) -> list[torch.Tensor]:
        """The output sequence of every layer (what layer-wise distillation matches)."""
        outputs, x = [], inputs
        for layer in self.layers:
            x = layer(x, dt)
            outputs.append(x)
        return outputs

    def forward(self, inputs: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden_sequences(inputs, dt)[-1])


# ------------------------------------------------------------------------------------------------
# Cost counts (deterministic): nonlinear cell evaluations per step, FLOPs
# ------------------------------------------------------------------------------------------------

def count_nonlinear_evaluations(model: nn.Module, inputs: torch.Tensor, dt: torch.Tensor) -> float:
    """Nonlinear cell evaluations per input step, counted by forward hooks during one forward pass.

    One call of a ``NonlinearCell`` or ``nn.GRUCell`` advances one step (of the whole batch): it counts 1.
    One call of a fused ``nn.GRU`` over a sequence of length T counts T. The total is divided by T.
    """
    count = 0

    def per_call(_module, _args, _output) -> None:
        nonlocal count
        count += 1

    def per_sequence(_module, args, _output) -> None:
        nonlocal count
        count += args[0].shape[1]

    handles = []
    for module in model.modules():
        if isinstance(module, NonlinearCell | nn.GRUCell):
            handles.append(module.register_forward_hook(per_call))
        elif isinstance(module, nn.GRU):
            if not module.batch_first:
                raise ValueError("count_nonlinear_evaluations expects batch_first GRUs")
            handles.append(module.register_forward_hook(per_sequence))
    try:
        with torch.no_grad():
            model(inputs, dt)
    finally:
        for handle in handles:
            handle.remove()
    return count / inputs.shape[1]


def forward_flops(model: nn.Module, inputs: torch.Tensor, dt: torch.Tensor) -> int:
    """Matrix-product FLOPs of one forward pass (torch.utils.flop_counter: mm, addmm, bmm, GRU kernels)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(inputs, dt)
    return int(counter.get_total_flops())


def training_step_flops(model: nn.Module, inputs: torch.Tensor, dt: torch.Tensor,
                        loss_fn: Callable[[torch.Tensor], torch.Tensor]) -> int:
    """Matrix-product FLOPs of one forward + backward pass (gradients are discarded)."""
    with FlopCounterMode(display=False) as counter:
        loss_fn(model(inputs, dt)).backward()
    model.zero_grad(set_to_none=True)
    return int(counter.get_total_flops())


# ------------------------------------------------------------------------------------------------
# Conversion of a trained LTC stack (README, "Method": conversion)
# ------------------------------------------------------------------------------------------------

def distill_layerwise(teacher: SequenceModel, student: SequenceModel, inputs: torch.Tensor, dt: torch.Tensor,
                      epochs: int, batch_size: int, lr: float, generator: torch.Generator) -> list[float]:
    """Train student layer l to map the teacher's layer l-1 outputs to its layer l outputs (MSE), layer by
    layer, then copy the teacher's head. Returns the final-epoch distillation loss of every layer.
    """
    if len(teacher.layers) != len(student.layers):
        raise ValueError(f"teacher has {len(teacher.layers)} layers, student {len(student.layers)}")
    with torch.no_grad():
        targets = teacher.hidden_sequences(inputs, dt)
    sources = [inputs, *targets[:-1]]
    final_losses = []
    for layer, source, target in zip(student.layers, sources, targets):
        optimiser = torch.optim.Adam(layer.parameters(), lr=lr)
        epoch_loss = math.nan
        for _ in range(epochs):
            order = torch.randperm(len(inputs), generator=generator)
            total = 0.0
            for start in range(0, len(order), batch_size):
                batch = order[start:start + batch_size]
                loss = nn.functional.mse_loss(layer(source[batch], dt[batch]), target[batch])
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
                total += float(loss.detach()) * len(batch)
            epoch_loss = total / len(order)
        final_losses.append(epoch_loss)
    student.head.load_state_dict(teacher.head.state_dict())
    return final_losses
