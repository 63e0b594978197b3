"""cacr method: exact values where test_cacr_method.py's inputs could not tell a right formula from a wrong one
(issue 20, found by mutation testing), each with a negative control that breaks the library."""

from __future__ import annotations

import pytest
import torch

from tasks.cacr import method


def check_decode_actions_returns_long_segments() -> None:
    """Segments are frame indices: (N, 2) long, also for an empty batch (torch.tensor([]) alone would be float32)."""
    empty = method.decode_actions(torch.zeros(0, 3, dtype=torch.long), torch.zeros(0, 2, 2, dtype=torch.long), 2, 64)
    assert empty.shape == (0, 2) and empty.dtype == torch.long
    segments = method.decode_actions(torch.tensor([[0, 3, 2]]), torch.tensor([[[10, 15], [1, 2]]]), 2, 64)
    assert segments.dtype == torch.long and segments.tolist() == [[11, 15]]  # candidate 0 refined by (+1, 0)


def test_decode_actions_returns_long_segments():
    check_decode_actions_returns_long_segments()


def test_negative_control_inferred_dtype_is_caught(monkeypatch):
    real = method.decode_actions
    monkeypatch.setattr(method, "decode_actions", lambda actions, candidates, max_offset, frames: torch.tensor(
        real(actions, candidates, max_offset, frames).tolist()).reshape(-1, 2))
    with pytest.raises(AssertionError):
        check_decode_actions_returns_long_segments()
