"""new_paper method: exact values, identities, and a negative control that breaks the library
(copy to tests/unit/test_<slug>_method.py)."""

from __future__ import annotations

import torch

from tasks.new_paper import method


def example() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    return x, y


def closed_form_check() -> bool:
    """By hand: X^T X / 3 = [[2, 1], [1, 5]] / 3, X^T y / 3 = [4, 7] / 3; with ridge 1/3 the system is
    [[3, 1], [1, 6]] w = [4, 7], so w* = [17, 17] / 17 = [1, 1]."""
    x, y = example()
    w = method.ridge_closed_form(x, y, 1 / 3)
    return torch.allclose(w, torch.tensor([1.0, 1.0], dtype=torch.float64), atol=1e-12)


def test_closed_form_exact_value():
    assert closed_form_check()


def test_closed_form_has_zero_gradient():
    x, y = example()
    w = method.ridge_closed_form(x, y, 0.1).requires_grad_(True)
    (grad,) = torch.autograd.grad(method.ridge_objective(w, x, y, 0.1), w)
    assert grad.abs().max() < 1e-12


def test_gradient_descent_reaches_the_closed_form():
    x, y = example()
    w, losses = method.fit_gradient_descent(x, y, 0.1, steps=2000, lr=0.1)
    assert torch.allclose(w, method.ridge_closed_form(x, y, 0.1), atol=1e-9)
    assert losses[0] == float(torch.mean(y**2))  # w = 0 at the start


def test_negative_control_dropped_ridge_term_is_caught(monkeypatch):
    monkeypatch.setattr(method, "ridge_closed_form", lambda x, y, ridge: torch.linalg.lstsq(x, y).solution)
    assert not closed_form_check()
