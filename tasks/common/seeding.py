"""Seeding of every random source a run touches (python, numpy, torch).

Seeds of one paper run on parallel threads, and torch's default generator is process-wide:
module initialisation (``nn.Linear`` draws from it) must therefore happen under
``torch_init_seed``, which holds a lock and restores the global generator afterwards. Everything
else draws from explicit ``numpy.random.Generator`` / ``torch.Generator`` objects.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator

import numpy as np

_TORCH_INIT_LOCK = threading.Lock()


def seed_everything(seed: int) -> np.random.Generator:
    """Seed python, numpy and torch globally (single-threaded entry points); return a Generator."""
    random.seed(seed)
    np.random.seed(seed % (2**32))
    import torch

    torch.manual_seed(seed)
    return np.random.default_rng(seed)


@contextlib.contextmanager
def torch_init_seed(seed: int) -> Iterator[None]:
    """Thread-safe seeded block for code that draws from torch's global generator (module init)."""
    import torch

    with _TORCH_INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
