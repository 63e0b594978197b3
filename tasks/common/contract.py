"""The contract every paper folder implements (docs/adding_a_paper.md; templates/new_paper/).

``tasks/<slug>/`` holds one module per step, each with one function the flow calls:

- ``config.py``: ``CONFIG`` (a ``ProfileConfig`` model) and ``TITLE`` (the flow's title);
- ``data.py``: ``write_data(config, seeds, data_dir) -> list[Path]`` writes ``data/<slug>/``;
- ``train.py``: ``train(config, seed, data_dir, model_dir, device, progress) -> SeedResult`` writes the
  seed's checkpoints (safetensors) in ``model_dir`` = ``models/<slug>/seed<N>/`` and returns its curves
  and training metrics;
- ``evaluate.py``: ``evaluate(config, seed, data_dir, model_dir, device, progress) -> SeedResult`` reads
  the checkpoints and returns raw measurements (metrics, tables);
- ``claim_metrics.py``: ``claim_metrics(config, result) -> dict[str, float]`` derives every claim's
  number from the measurements only;
- ``figures.py``: ``make_figures(config, results, figures_dir, plots_dir) -> list[Path]``.

A paper with nothing to train has a ``train`` that writes nothing and returns an empty result. Each
step is cached on the hash of only the code it runs (``tasks/common/codehash.py``): a change to
``claim_metrics.py`` costs seconds, a change to ``evaluate.py`` never retrains.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from tasks.common.results import Progress, SeedResult

# step -> (module of tasks/<slug>, function it must define)
STEPS: dict[str, tuple[str, str]] = {
    "data": ("data", "write_data"),
    "train": ("train", "train"),
    "evaluate": ("evaluate", "evaluate"),
    "claim_metrics": ("claim_metrics", "claim_metrics"),
    "figures": ("figures", "make_figures"),
}


class WriteData(Protocol):
    def __call__(self, config: Any, seeds: tuple[int, ...], data_dir: Path) -> list[Path]: ...


class Train(Protocol):
    def __call__(self, config: Any, seed: int, data_dir: Path, model_dir: Path, device: str,
                 progress: Progress) -> SeedResult: ...


class Evaluate(Protocol):
    def __call__(self, config: Any, seed: int, data_dir: Path, model_dir: Path, device: str,
                 progress: Progress) -> SeedResult: ...


class ClaimMetrics(Protocol):
    def __call__(self, config: Any, result: SeedResult) -> dict[str, float]: ...


class MakeFigures(Protocol):
    def __call__(self, config: Any, results: list[SeedResult], figures_dir: Path, plots_dir: Path
                 ) -> list[Path]: ...


class ContractError(TypeError):
    """A paper folder that does not implement the contract (names the file and the missing function)."""


@dataclass(frozen=True)
class Paper:
    """The step functions of one paper folder, resolved and checked."""

    slug: str
    title: str
    write_data: WriteData
    train: Train
    evaluate: Evaluate
    claim_metrics: ClaimMetrics
    make_figures: MakeFigures


def step_module_name(slug: str, step: str) -> str:
    return f"tasks.{slug}.{STEPS[step][0]}"


def _module(slug: str, name: str) -> ModuleType:
    try:
        return importlib.import_module(f"tasks.{slug}.{name}")
    except ModuleNotFoundError as err:
        if err.name == f"tasks.{slug}.{name}":
            raise ContractError(f"tasks/{slug}/{name}.py is missing (docs/adding_a_paper.md)") from None
        raise


def load_paper(slug: str) -> Paper:
    """Import the step modules of ``tasks/<slug>`` and check each defines its function."""
    functions = {}
    for module_name, function_name in STEPS.values():
        function = getattr(_module(slug, module_name), function_name, None)
        if not callable(function):
            raise ContractError(f"tasks/{slug}/{module_name}.py must define {function_name}(...)")
        functions[function_name] = function
    config = _module(slug, "config")
    title = getattr(config, "TITLE", None)
    if not isinstance(title, str) or not title:
        raise ContractError(f"tasks/{slug}/config.py must define TITLE (the flow's title)")
    return Paper(slug=slug, title=title, **functions)
