"""Baselines the CoDA abstract compares against, own compact implementations (no ncps / torchdiffeq).

- ``CfCLayer``: closed-form continuous-depth cell (Hasani et al., Nature MI 2022), the "closed-form" baseline:
  h_k = sigma(-f Delta) g + (1 - sigma(-f Delta)) q, with f, g, q heads on one shared nonlinear backbone.
- ``ODERNNLayer``: ODE-RNN (Rubanova et al. 2019): between observations the hidden state follows a neural
  ODE dh/dt = f_theta(h) integrated by fixed-step RK4 (4 evaluations per RK4 step), then a GRU cell update.
- ``GRULayer``: a plain GRU (elapsed time enters as an input feature only).

Neural flows (GRU-flow), model-order reduction (POD/DMD) and variational formulations are not implemented.
"""

from __future__ import annotations

import torch
from torch import nn

from tasks.coda.method import NonlinearCell, rk4_integrate


class CfCBackbone(NonlinearCell):
    """The shared nonlinear backbone of a CfC cell and its three heads: one evaluation per step."""

    def __init__(self, in_dim: int, hidden: int):
        super().__init__()
        self.backbone = nn.Linear(in_dim + hidden, hidden)
        self.heads = nn.Linear(hidden, 3 * hidden)

    def forward(self, u: torch.Tensor, h: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        features = torch.tanh(self.backbone(torch.cat([u, h], dim=-1)))
        rate, g, q = self.heads(features).chunk(3, dim=-1)
        gate = torch.sigmoid(-rate * dt.unsqueeze(-1))  # the closed-form time gate
        return gate * torch.tanh(g) + (1.0 - gate) * torch.tanh(q)


class CfCLayer(nn.Module):
    def __init__(self, in_dim: int, hidden: int):
        super().__init__()
        self.hidden = hidden
        self.cell = CfCBackbone(in_dim, hidden)

    def forward(self, inputs: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        h = inputs.new_zeros(inputs.shape[0], self.hidden)
        outputs = []
        for k in range(inputs.shape[1]):
            h = self.cell(inputs[:, k], h, dt[:, k])
            outputs.append(h)
        return torch.stack(outputs, dim=1)


class ODEFunc(NonlinearCell):
    """f_theta of the ODE-RNN's latent ODE: a one-hidden-layer tanh MLP; one call = one evaluation."""

    def __init__(self, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, hidden))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.net(h)


class ODERNNLayer(nn.Module):
    def __init__(self, in_dim: int, hidden: int, rk4_steps: int = 1):
        super().__init__()
        if rk4_steps < 1:
            raise ValueError(f"rk4_steps must be >= 1, got {rk4_steps}")
        self.hidden, self.rk4_steps = hidden, rk4_steps
        self.ode = ODEFunc(hidden)
        self.update = nn.GRUCell(in_dim, hidden)

    def forward(self, inputs: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        h = inputs.new_zeros(inputs.shape[0], self.hidden)
        outputs = []
        for k in range(inputs.shape[1]):
            h = rk4_integrate(self.ode, h, dt[:, k], self.rk4_steps)
            h = self.update(inputs[:, k], h)
            outputs.append(h)
        return torch.stack(outputs, dim=1)


class GRULayer(nn.Module):
    def __init__(self, in_dim: int, hidden: int):
        super().__init__()
        self.gru = nn.GRU(in_dim, hidden, batch_first=True)

    def forward(self, inputs: torch.Tensor, dt: torch.Tensor) -> torch.Tensor:
        return self.gru(inputs)[0]
