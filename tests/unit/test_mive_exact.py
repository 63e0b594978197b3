"""mive method: exact values where test_mive_method.py's inputs could not tell a right formula from a wrong one
(issue 20, survivors of the full mutation run), each with a negative control that breaks the library."""

from __future__ import annotations

import pytest
import torch

from tasks.mive import method


def check_losses_and_hue_exact() -> None:
    """Flow-matching and x0 losses by hand (mean squared error; a weighted mean whose weights sum to 0.5 < 1), and
    hues outside [0, 360) wrap by 360 degrees."""
    x0 = torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64)
    noise = torch.tensor([[1.0, 0.5], [-0.5, 1.5]], dtype=torch.float64)
    predicted = torch.tensor([[0.25, 1.0], [-2.0, 1.0]], dtype=torch.float64)
    err = (predicted - (noise - x0)) ** 2  # (0.0625, 0.25; 0.25, 0.0625)
    assert float(method.flow_matching_loss(predicted, x0, noise)) == pytest.approx(float(err.mean()), abs=1e-15)
    weight = torch.tensor([[0.25, 0.0], [0.0, 0.25]], dtype=torch.float64)
    assert float(method.flow_matching_loss(predicted, x0, noise, weight)) == pytest.approx(
        (0.25 * 0.0625 + 0.25 * 0.0625) / 0.5, abs=1e-15)
    x0_hat = torch.tensor([[1.0, -0.5], [1.0, 0.0]], dtype=torch.float64)
    assert float(method.x0_matching_loss(x0_hat, x0)) == pytest.approx((0.25 + 0.25 + 1.0 + 0.0625) / 4, abs=1e-15)
    assert float(method.x0_matching_loss(x0_hat, x0, weight)) == pytest.approx(
        (0.25 * 0.25 + 0.25 * 0.0625) / 0.5, abs=1e-15)
    assert torch.allclose(method.hue_to_rgb(torch.tensor([390.0, -30.0, 361.0])),
                          method.hue_to_rgb(torch.tensor([30.0, 330.0, 1.0])), atol=1e-6)


def test_losses_and_hue_exact():
    check_losses_and_hue_exact()


@pytest.mark.parametrize("broken", ["doubled_error", "weights_floored_at_one", "hue_mod_361"])
def test_negative_control_losses_and_hue(monkeypatch, broken):
    if broken == "doubled_error":
        monkeypatch.setattr(method, "x0_matching_loss", lambda x0_hat, x0, weight=None: ((x0_hat - x0) * 2).mean()
                            if weight is None else ((x0_hat - x0) * 2 * weight).sum() / weight.sum())
    elif broken == "weights_floored_at_one":
        real = method.flow_matching_loss
        monkeypatch.setattr(method, "flow_matching_loss", lambda p, x0, n, weight=None: real(p, x0, n) if weight is None
                            else (weight * (p - (n - x0)) ** 2).sum() / weight.sum().clamp_min(1.0))
    else:
        real_hue = method.hue_to_rgb
        monkeypatch.setattr(method, "hue_to_rgb", lambda hue, saturation=1.0, value=1.0: real_hue(
            hue % 361.0, saturation, value))
    with pytest.raises(AssertionError):
        check_losses_and_hue_exact()
