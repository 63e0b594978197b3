"""Device choice: cuda, then mps, then cpu; never assumed."""

from __future__ import annotations

import os


def pick_device(requested: str = "auto") -> str:
    """Return a torch device string. ``auto`` picks the best available; an explicit request that the
    machine cannot satisfy is an error rather than a silent fallback."""
    import torch

    if requested == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device: 'cuda' requested but torch.cuda.is_available() is False")
    if requested not in ("cpu", "cuda", "mps"):
        raise ValueError(f"device: must be auto|cpu|cuda|mps, got {requested!r}")
    return requested


def describe_device(device: str) -> str:
    import torch

    if device == "cuda":
        return f"cuda:{torch.cuda.get_device_name(0)}"
    return f"{device}:{os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
