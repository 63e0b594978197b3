"""Seeding of every random source a run touches (python, numpy, torch).

Seeds of one paper run on parallel threads, and torch's default generator is process-wide:
module initialisation (``nn.Linear`` draws from it) must therefore happen under
``torch_init_seed``, which holds a lock and restores the global generator afterwards. Everything
else draws from explicit ``numpy.random.Generator`` / ``torch.Generator`` objects.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_TORCH_INIT_LOCK = threading.Lock()


@contextlib.contextmanager
def torch_init_seed(seed: int) -> Iterator[None]:
    """Thread-safe seeded block for code that draws from torch's global generator (module init)."""
    import torch

    with _TORCH_INIT_LOCK, torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield
