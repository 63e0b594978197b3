"""The method as a pure library (no Prefect, no MLflow): ridge regression, closed form and by gradient descent.

Ridge objective (the paper's Eq. <n>): L(w) = (1/n) ||X w - y||^2 + lambda ||w||^2, minimised by
w* = (X^T X / n + lambda I)^{-1} X^T y / n.
"""

from __future__ import annotations

import torch


def ridge_objective(w: torch.Tensor, x: torch.Tensor, y: torch.Tensor, ridge: float) -> torch.Tensor:
    """L(w) = mean((x w - y)^2) + ridge ||w||^2."""
    return torch.mean((x @ w - y) ** 2) + ridge * torch.sum(w**2)


def ridge_closed_form(x: torch.Tensor, y: torch.Tensor, ridge: float) -> torch.Tensor:
    """w* = (X^T X / n + ridge I)^{-1} X^T y / n, the unique minimiser of ``ridge_objective``."""
    n, d = x.shape
    gram = x.T @ x / n + ridge * torch.eye(d, dtype=x.dtype)
    return torch.linalg.solve(gram, x.T @ y / n)


def fit_gradient_descent(x: torch.Tensor, y: torch.Tensor, ridge: float, steps: int, lr: float
                         ) -> tuple[torch.Tensor, list[float]]:
    """Full-batch gradient descent from w = 0; returns w and the objective before each step."""
    w = torch.zeros(x.shape[1], dtype=x.dtype, requires_grad=True)
    losses = []
    for _ in range(steps):
        loss = ridge_objective(w, x, y, ridge)
        losses.append(float(loss))
        (grad,) = torch.autograd.grad(loss, w)
        with torch.no_grad():
            w -= lr * grad
    return w.detach(), losses
