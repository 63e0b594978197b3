"""Training step of certificate_pruning: nothing to train. CGP and its baselines optimise a noisy black
box; their runs are the measurement and happen in ``evaluate.py``."""

from __future__ import annotations

from pathlib import Path

from tasks.certificate_pruning.config import CertificatePruningConfig
from tasks.common.results import Progress, SeedResult, no_progress


def train(cfg: CertificatePruningConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    """Writes nothing under ``model_dir`` and returns an empty result."""
    return SeedResult(seed)
