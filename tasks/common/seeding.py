"""Seeding of every random source a run touches (python, numpy, torch)."""

from __future__ import annotations

import os
import random

import numpy as np


def seed_everything(seed: int) -> np.random.Generator:
    """Seed python, numpy and torch; return a numpy Generator for explicit use.

    Torch is seeded only when it is already importable, so pure-numpy callers stay light.
    """
    random.seed(seed)
    np.random.seed(seed % (2**32))
    os.environ["PYTHONHASHSEED"] = str(seed)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a hard dependency of the project
        pass
    else:
        torch.manual_seed(seed)
        torch.use_deterministic_algorithms(True, warn_only=True)
    return np.random.default_rng(seed)
