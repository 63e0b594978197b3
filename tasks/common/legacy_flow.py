"""The flow body of papers not yet moved to the train/evaluate contract (tasks/common/contract.py).

Temporary: removed once every paper implements the contract.

A paper plugs in through three functions of its own package (the contract of every paper folder):

- ``tasks.<slug>.experiment.write_data(config, seeds, data_dir) -> list[Path]``  (data phase)
- ``tasks.<slug>.experiment.run_seed(config, seed, data_dir, model_dir, device, progress) -> dict``
  returning ``{"seed", "metrics": {name: float}, "curves": {...}, "tables": {...}}``
- ``tasks.<slug>.figures.make_figures(config, results, figures_dir, plots_dir) -> list[Path]``

The run phase fans the seeds out on the flow's task runner (threads by default, Dask with
``--runner dask``). Each seed is a cached Prefect task: a killed run restarted skips finished seeds.
The cache key holds a hash of the code a seed depends on (``seed_code_version``), because Prefect's
``TASK_SOURCE`` hashes only the task function and would miss a change in the paper's method.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE
from prefect.futures import as_completed

from tasks.common.devices import pick_device
from tasks.common.env import configure, repo_root
from tasks.common.io import remove_partials, write_json
from tasks.common.params import RunSpec, resolve_run
from tasks.common.provenance import hash_files
from tasks.common.steps import PaperPaths, log_seed_run, paper_paths, parent_run, publish_claims

Phase = Literal["data", "run", "all"]
# Files of tasks/common that a seed's numbers can depend on. figures, report, tracking and steps are
# left out on purpose: changing a plot must not recompute the seeds.
COMMON_SEED_CODE = ("tiny_lm", "seeding", "params", "io", "devices")
# Files of a paper folder that only draw or describe results.
PRESENTATION_FILES = ("figures.py",)
# Seeds run at once on the thread runner. Three even on 2 cores: each seed computes with one torch
# thread, and a third worker beats leaving a core idle while the last seed runs alone.
WORKERS = 3


def paper_module(slug: str, name: str) -> ModuleType:
    return importlib.import_module(f"tasks.{slug}.{name}")


def seed_code_files(slug: str, root: Path | None = None) -> list[str]:
    """Every .py of the paper folder except its figures, plus the common modules seeds use."""
    root = root or repo_root()
    own = sorted(p.relative_to(root).as_posix() for p in (root / "tasks" / slug).glob("*.py")
                 if p.name not in PRESENTATION_FILES)
    return own + [f"tasks/common/{name}.py" for name in COMMON_SEED_CODE]


def seed_code_version(slug: str) -> str:
    return hash_files(seed_code_files(slug))


def seed_result_path(model_dir: Path, seed: int) -> Path:
    """The per-seed result file; its presence marks a seed as finished (the resume logic below)."""
    return Path(model_dir) / f"seed{seed}" / "result.json"


def torch_threads_per_worker(workers: int) -> int:
    """Seeds run on parallel threads; torch's pool is process-wide, so split the cores between them."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def seed_datasets(data_dir: Path, seed: int) -> list[str]:
    """The data files a seed reads, logged as its MLflow inputs: its own ``*seed<k>.parquet`` and the
    parquet files shared by every seed (no ``seed<n>`` in the name)."""
    files = sorted(Path(data_dir).glob("*.parquet"))
    return [str(p) for p in files if p.name.endswith(f"seed{seed}.parquet") or not re.search(r"seed\d+", p.name)]


@task(name="prepare-data")
def prepare_data(slug: str, spec: RunSpec, data_dir: str) -> list[str]:
    experiment = paper_module(slug, "experiment")
    return [str(p) for p in experiment.write_data(spec.config, spec.seeds, Path(data_dir))]


# Cached on the inputs, which carry the seed-code hash: a killed run restarted skips the seeds
# already finished, and a change in the paper's code recomputes them.
@task(name="run-seed", task_run_name="run-seed-{seed}", cache_policy=INPUTS + TASK_SOURCE, persist_result=True)
def run_seed(slug: str, config: Any, seed: int, data_dir: str, model_dir: str, device: str,
             code_version: str) -> dict:
    artifact = create_progress_artifact(0.0, description=f"{slug}: seed {seed}")

    def progress(fraction: float, message: str) -> None:
        update_progress_artifact(artifact, 100.0 * min(max(fraction, 0.0), 1.0))
        print(f"[{slug}] seed {seed}: {message}", flush=True)

    experiment = paper_module(slug, "experiment")
    return experiment.run_seed(config, seed, Path(data_dir), Path(model_dir), device, progress)


@task(name="make-figures")
def make_figures(slug: str, config: Any, results: list[dict], figures_dir: str, plots_dir: str) -> list[str]:
    figures = paper_module(slug, "figures")
    return [str(p) for p in figures.make_figures(config, results, Path(figures_dir), Path(plots_dir))
            if p is not None]


def run_all_seeds(spec: RunSpec, paths: PaperPaths, device: str, code_version: str) -> list[dict]:
    """Submit every seed, collect results as they finish, write each seed's marker; sorted by seed."""
    progress = create_progress_artifact(0.0, description=f"{spec.slug}: seeds finished")
    futures = []
    for seed in spec.seeds:
        # A cached result whose files were deleted is recomputed rather than trusted.
        missing = not seed_result_path(paths.models, seed).exists()
        futures.append(run_seed.with_options(refresh_cache=missing).submit(
            spec.slug, spec.config, seed, str(paths.data), str(paths.models), device, code_version))
    results = []
    for done, future in enumerate(as_completed(futures), start=1):
        result = future.result()
        # The marker is written only once Prefect has persisted the cached result, so a seed with a
        # marker is always a cache hit after a kill.
        marker = seed_result_path(paths.models, result["seed"])
        if not marker.exists():
            write_json(marker, result)
        results.append(result)
        update_progress_artifact(progress, 100.0 * done / len(futures))
        print(f"[{spec.slug}] seed {result['seed']} done ({done}/{len(futures)})", flush=True)
    return sorted(results, key=lambda r: r["seed"])


def run_paper(slug: str, title: str, profile: str | None, seeds: Sequence[int] | None, phase: Phase,
              workers: int = WORKERS) -> dict:
    """The paper's flow body: data phase, then seeds, MLflow child runs, figures and claims."""
    spec = resolve_run(slug, profile, seeds)
    configure(spec.profile)
    paths = paper_paths(slug)
    # Temp files of a run killed mid-write (never a final output) are cleared before anything is written.
    for folder in (paths.data, paths.models, paths.reports):
        remove_partials(folder)
    if phase in ("data", "all"):
        prepare_data(slug, spec, str(paths.data))
    if phase == "data":
        return {"phase": "data", "data": str(paths.data)}
    device = pick_device(spec.config.device)
    import torch

    torch.set_num_threads(torch_threads_per_worker(min(workers, len(spec.seeds))))
    with parent_run(spec, device) as parent_id:
        results = run_all_seeds(spec, paths, device, seed_code_version(slug))
        for result in results:
            marker = str(seed_result_path(paths.models, result["seed"]))
            log_seed_run(spec, parent_id, result, device, [marker], seed_datasets(paths.data, result["seed"]))
        made = make_figures(slug, spec.config, results, str(paths.figures), str(paths.plots))
        rows = publish_claims(spec, parent_id, results, str(repo_root() / "tasks" / slug / "claims.yaml"),
                              str(paths.reports), title, made)
    return {"phase": phase, "parent_run_id": parent_id, "verdicts": {r["id"]: r["verdict"] for r in rows}}
