"""The body every paper flow shares, so that ``flows/<slug>.py`` is pure boilerplate.

A paper implements the contract of ``tasks/common/contract.py`` (data, train, evaluate,
claim_metrics, figures). The flow composes Prefect tasks:

    prepare-data -> train-seed-N (per seed) -> evaluate-seed-N (per seed) -> claim-metrics
                 -> log-seed-run (MLflow child runs) -> make-figures -> publish-claims

``train-seed-N`` is cached on the hash of only the code ``train.py`` imports (plus config and seed);
``evaluate-seed-N`` on the code ``evaluate.py`` imports and the hash of the seed's checkpoints. Each
writes a marker after Prefect persisted its result (``models/<slug>/seed<N>/train.json``,
``reports/<slug>/evaluation/seed<N>.json``): a killed run restarted skips what finished, and a
result whose marker or checkpoints are missing or changed is recomputed, never trusted blindly.

Phases: ``data``, ``train``, ``evaluate`` (claim metrics, figures, claims and the MLflow runs, from
the checkpoints the train phase left) and ``all``; ``run`` is train then evaluate. DVC runs the
phases as separate stages (see ``flows/dvc_yaml.py``).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from prefect import get_run_logger, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE
from prefect.futures import as_completed
from prefect.utilities.annotations import quote

from tasks.common import interrupts, progress_bars
from tasks.common.codehash import code_version
from tasks.common.contract import Paper, load_paper, step_module_name
from tasks.common.devices import pick_device
from tasks.common.env import configure, repo_root
from tasks.common.io import read_json, remove_partials, write_json
from tasks.common.params import RunSpec, resolve_run
from tasks.common.results import SeedResult
from tasks.common.steps import (
    PaperPaths,
    current_flow_run_id,
    log_seed_run,
    paper_paths,
    parent_run,
    publish_claims,
)

Phase = Literal["data", "train", "evaluate", "run", "all"]
PHASES: tuple[str, ...] = ("data", "train", "evaluate", "run", "all")
# Seeds run at once on the thread runner. Three even on 2 cores: each seed computes with one torch
# thread, and a third worker beats leaving a core idle while the last seed runs alone.
WORKERS = 3


class RunError(RuntimeError):
    """A condition the user fixes (a phase's input missing, an output folder not writable): the command line
    prints its message as one line and the next step, with no traceback."""


class UserErrorTracebackFilter(logging.Filter):
    """Prefect's flow engine logs every exception that ends a flow run with its traceback. For the errors a
    user fixes (``RunError``, an unusable MLflow store, a bad parameter) the message says what to do and the
    traceback only buries it: keep the log line (terminal and Prefect UI), drop the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from tasks.common.params import ParamsError
        from tasks.common.tracking import TrackingStoreError

        user_errors = (RunError, TrackingStoreError, ParamsError)
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, user_errors):
            record.exc_info, record.exc_text = None, None
            setattr(record, USER_ERROR_RECORD, True)
        elif record.levelno >= logging.INFO and any(f"{kind.__name__}: " in record.getMessage()
                                                    for kind in user_errors):
            # The engine's "Finished in state Failed('... RunError: <message>')" line repeats it once more.
            setattr(record, USER_ERROR_RECORD, True)
        return True


# ``extra`` of a flow-run log record that reports a user error the command line prints itself (flows/stage.py).
USER_ERROR_RECORD = "repro_user_error"


class DropUserErrorRecords(logging.Filter):
    """On the terminal's log handlers of a command that prints a user error as its own last line: drop Prefect's
    two records of the same error, so the terminal says it once (the Prefect UI still gets both)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, USER_ERROR_RECORD, False)


def say_user_errors_once() -> None:
    """Install ``DropUserErrorRecords`` on Prefect's terminal handlers (once each)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for name in ("", "prefect", "prefect.flow_runs"):
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, PrefectConsoleHandler) and not any(
                    isinstance(f, DropUserErrorRecords) for f in handler.filters):
                handler.addFilter(DropUserErrorRecords())


def quiet_user_error_tracebacks() -> None:
    """Install ``UserErrorTracebackFilter`` on Prefect's flow-run logger (once)."""
    flow_runs = logging.getLogger("prefect.flow_runs")
    if not any(isinstance(f, UserErrorTracebackFilter) for f in flow_runs.filters):
        flow_runs.addFilter(UserErrorTracebackFilter())


def check_parquet_files(slug: str, data_dir: Path) -> None:
    """Every parquet file of the data phase has a readable footer (a cheap read of its metadata), so a
    truncated file is named before any seed trains on it, not in a traceback from inside a seed."""
    import pyarrow.parquet as pq

    for path in sorted(data_dir.rglob("*.parquet")):
        try:
            pq.read_metadata(path)
        except (OSError, ValueError) as err:
            raise RunError(f"{path}: not a readable parquet file ({err}); regenerate the data: "
                           f"python -m flows.stage {slug} --phase data") from None


def check_writable(folders: Sequence[Path]) -> None:
    """Create each output folder and a file in it before any compute, so that a read-only or blocked
    ``reports/`` fails in a second, not after the seeds have trained (as root, ``os.access`` says yes to
    everything, so this writes for real)."""
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe = folder / f".write-probe-{os.getpid()}.partial"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise RunError(f"{folder}: not writable ({err.strerror or err}); fix its permissions or free the path "
                           "before running") from None
TRAIN_MARKER = "train.json"


def seed_dir(model_dir: Path, seed: int) -> Path:
    return Path(model_dir) / f"seed{seed}"


def train_marker(model_dir: Path, seed: int) -> Path:
    """Written after a seed's training finished and Prefect persisted it (the resume logic)."""
    return seed_dir(model_dir, seed) / TRAIN_MARKER


def evaluation_path(reports_dir: Path, seed: int) -> Path:
    return Path(reports_dir) / "evaluation" / f"seed{seed}.json"


def checkpoint_digest(folder: Path) -> dict[str, str]:
    """sha256 of every file a seed's training wrote (the marker itself excluded), by relative path."""
    folder = Path(folder)
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != TRAIN_MARKER
            and not p.name.endswith(".partial")}


def torch_threads_per_worker(workers: int) -> int:
    """Seeds run on parallel threads; torch's pool is process-wide, so split the cores between them."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def seed_datasets(data_dir: Path, seed: int) -> list[str]:
    """The data files a seed reads, logged as its MLflow inputs: its own ``*seed<k>.parquet`` and the
    parquet files shared by every seed (no ``seed<n>`` in the name)."""
    files = sorted(Path(data_dir).glob("*.parquet"))
    return [str(p) for p in files if p.name.endswith(f"seed{seed}.parquet") or not re.search(r"seed\d+", p.name)]


def progress_label(slug: str, seed: int, what: str) -> str:
    """``[arm_ebm] train seed 3``: the head of a seed's progress lines and the label of its terminal bar."""
    return f"[{slug}] {what} seed {seed}"


class SeedProgress:
    """A seed's progress, as the training and evaluation steps report it (``progress(fraction, message)``):
    a Prefect progress artifact (the UI's bar) and a line in the flow run's log (the UI and the terminal)
    at each tenth of the way (no closer than ``min_gap_s``), every ``every_s`` seconds of a slow tenth, and at
    the end, each with the
    elapsed time and an ETA extrapolated from it. Throttled, because a step that reports every training step
    would otherwise send thousands of log lines and artifact updates to the Prefect API.

    ``bar`` (``progress_bars.SeedBars.add``), when the log goes to a terminal: a live bar that follows every
    report (at most every ``bar_gap_s`` seconds or whole percent) with the same message and ETA."""

    def __init__(self, slug: str, seed: int, what: str, log: Any, set_percent: Any, every_s: float = 30.0,
                 min_gap_s: float = 2.0, clock: Any = None, bar: Any = None, bar_gap_s: float = 0.2):
        import time

        self.label = progress_label(slug, seed, what)
        self.seed_prefix = re.compile(rf"^seed {seed}:\s*")
        self.log, self.set_percent, self.every_s, self.min_gap_s = log, set_percent, every_s, min_gap_s
        self.bar, self.bar_gap_s = bar, bar_gap_s
        self.clock = clock or time.monotonic
        self.started = self.clock()
        self.last_time, self.last_tenth, self.last_percent = self.started, -1, -1
        self.last_bar_time, self.last_bar_percent = None, -1

    def eta(self, fraction: float, elapsed: float) -> str:
        if fraction <= 0.0:
            return "ETA -"
        if fraction >= 1.0:
            return "done"
        return f"ETA {elapsed * (1.0 - fraction) / fraction:.0f} s"

    def __call__(self, fraction: float, message: str) -> None:
        fraction = min(max(float(fraction), 0.0), 1.0)
        percent = int(100 * fraction)
        if percent != self.last_percent:
            self.set_percent(100.0 * fraction)
            self.last_percent = percent
        now, tenth = self.clock(), int(10 * fraction)
        if self.bar is not None:
            self._move_bar(fraction, percent, now, message)
        since = now - self.last_time
        # A new tenth is logged unless the last line is under min_gap_s old (a seconds-long smoke step would
        # otherwise print ten lines at once); the end is always logged.
        due = (tenth != self.last_tenth and (since >= self.min_gap_s or self.last_tenth < 0)) or since >= self.every_s
        if not due and fraction < 1.0:
            return
        self.last_time, self.last_tenth = now, tenth
        elapsed = now - self.started
        self.log(f"{self.label} {percent:3d}% {self.text_of(message)} ({elapsed:.0f} s, {self.eta(fraction, elapsed)})")

    def text_of(self, message: str) -> str:
        # Steps often start their message with "seed N:"; the label already says which seed.
        return self.seed_prefix.sub("", message)

    def _move_bar(self, fraction: float, percent: int, now: float, message: str) -> None:
        """Redraw the bar on a new percent, every ``bar_gap_s`` seconds and at the end (a step reporting every
        few milliseconds would otherwise spend its time formatting messages)."""
        if (percent == self.last_bar_percent and fraction < 1.0 and self.last_bar_time is not None
                and now - self.last_bar_time < self.bar_gap_s):
            return
        self.last_bar_time, self.last_bar_percent = now, percent
        self.bar(fraction, self.eta(fraction, now - self.started), self.text_of(message))


def _progress(slug: str, seed: int, what: str) -> SeedProgress:
    """A seed's progress reporter: Prefect artifact and log lines, and a terminal bar while ``progress_bars``
    draws (the log lines then skip the terminal, which shows the bar, and still reach the Prefect UI)."""
    artifact = create_progress_artifact(0.0, description=f"{slug}: {what} seed {seed}")
    logger = get_run_logger()
    bars = progress_bars.active()
    if bars is None:
        return SeedProgress(slug, seed, what, logger.info, lambda percent: update_progress_artifact(artifact, percent))
    return SeedProgress(slug, seed, what, lambda line: logger.info(line, extra={progress_bars.SHOWN_AS_BAR: True}),
                        lambda percent: update_progress_artifact(artifact, percent),
                        bar=bars.add(progress_label(slug, seed, what)))


def seed_bars() -> Any:
    """``progress_bars.on_terminal()`` where the seeds' tasks run in this process (the thread runner, which
    shares the terminal's bars); a no-op context under Dask, whose workers log their progress lines."""
    import contextlib

    from prefect.context import FlowRunContext
    from prefect.task_runners import ThreadPoolTaskRunner

    context = FlowRunContext.get()
    if context is not None and not isinstance(context.task_runner, ThreadPoolTaskRunner):
        return contextlib.nullcontext()
    return progress_bars.on_terminal()


@task(name="prepare-data")
def prepare_data(slug: str, spec: RunSpec, data_dir: str) -> list[str]:
    return [str(p) for p in load_paper(slug).write_data(spec.config, spec.seeds, Path(data_dir))]


# Cached on the inputs, which carry the hash of the code train.py imports: a killed run restarted
# skips the seeds already trained; a change in training code retrains; an evaluation change does not.
@task(name="train-seed", task_run_name="train-seed-{seed}", cache_policy=INPUTS + TASK_SOURCE, persist_result=True)
def train_seed(slug: str, config: Any, seed: int, data_dir: str, model_dir: str, device: str,
               code: str, params_hash: str) -> dict:
    folder = seed_dir(Path(model_dir), seed)
    result = load_paper(slug).train(config, seed, Path(data_dir), folder, device, _progress(slug, seed, "train"))
    return {"seed": seed, "params_hash": params_hash, "code_version": code,
            "checkpoints": checkpoint_digest(folder), "result": result.to_dict()}


@task(name="evaluate-seed", task_run_name="evaluate-seed-{seed}", cache_policy=INPUTS + TASK_SOURCE,
      persist_result=True)
def evaluate_seed(slug: str, config: Any, seed: int, data_dir: str, model_dir: str, device: str, code: str,
                  checkpoints: dict[str, str]) -> dict:
    folder = seed_dir(Path(model_dir), seed)
    result = load_paper(slug).evaluate(config, seed, Path(data_dir), folder, device,
                                       _progress(slug, seed, "evaluate"))
    return result.to_dict()


@task(name="claim-metrics")
def derive_claim_metrics(slug: str, config: Any, trained: list[dict], evaluated: list[dict]) -> list[dict]:
    """Per seed: training result + evaluation + the claim numbers ``claim_metrics`` derives from them."""
    paper = load_paper(slug)
    merged = []
    for train_record, evaluation in zip(trained, evaluated, strict=True):
        result = SeedResult.from_dict(train_record["result"]).merged(SeedResult.from_dict(evaluation))
        result.add(paper.claim_metrics(config, result))
        merged.append(result.to_dict())
    return merged


@task(name="make-figures")
def make_figures(slug: str, config: Any, results: list[dict], figures_dir: str, plots_dir: str) -> list[str]:
    made = load_paper(slug).make_figures(config, [SeedResult.from_dict(r) for r in results], Path(figures_dir),
                                         Path(plots_dir))
    return [str(p) for p in made if p is not None]


def train_record_problem(model_dir: Path, seed: int, code: str, params_hash: str) -> str | None:
    """Why a seed's training cannot be reused, or None when it can: its marker must match the code and
    params, and the checkpoints on disk must be the ones the marker recorded (sha256), so a truncated,
    changed or deleted checkpoint is retrained, never loaded."""
    marker = train_marker(model_dir, seed)
    if not marker.exists():
        return "not trained yet"
    try:
        record = read_json(marker)
    except (OSError, ValueError):
        return f"{marker} is unreadable (truncated?)"
    if record.get("code_version") != code:
        return "the code train.py imports has changed"
    if record.get("params_hash") != params_hash:
        return "the params have changed"
    recorded, on_disk = record.get("checkpoints") or {}, checkpoint_digest(seed_dir(model_dir, seed))
    changed = sorted(name for name in set(recorded) | set(on_disk) if recorded.get(name) != on_disk.get(name))
    if changed:
        return "checkpoint files differ from the ones training wrote (corrupt, changed or missing): " + ", ".join(
            str(seed_dir(model_dir, seed) / name) for name in changed)
    return None


def train_record_valid(model_dir: Path, seed: int, code: str, params_hash: str) -> bool:
    return train_record_problem(model_dir, seed, code, params_hash) is None


def train_all_seeds(spec: RunSpec, paths: PaperPaths, device: str) -> list[dict]:
    """Train every seed (cached), write each seed's marker once Prefect persisted it; sorted by seed."""
    code = code_version([step_module_name(spec.slug, "train")])
    problems = {s: train_record_problem(paths.models, s, code, spec.params_hash) for s in spec.seeds}
    for seed, problem in problems.items():
        if problem is not None and problem != "not trained yet":
            get_run_logger().warning("%s seed %d: training again: %s", spec.slug, seed, problem)
    records = []
    # A bar per seed in a terminal (the seeds' tasks find them through progress_bars.active()).
    with seed_bars():
        futures = [train_seed.with_options(refresh_cache=problems[s] is not None)
                   .submit(spec.slug, spec.config, s, str(paths.data), str(paths.models), device, code,
                           spec.params_hash)
                   for s in spec.seeds]
        for future in interrupts.interruptible(as_completed(futures)):
            record = future.result()
            marker = train_marker(paths.models, record["seed"])
            if not train_record_valid(paths.models, record["seed"], code, spec.params_hash):
                write_json(marker, record)
            records.append(record)
    return sorted(records, key=lambda r: r["seed"])


def read_train_records(spec: RunSpec, paths: PaperPaths) -> list[dict]:
    """The train phase's records, checked against the current code and params (evaluate phase)."""
    code = code_version([step_module_name(spec.slug, "train")])
    stale = [s for s in spec.seeds if not train_record_valid(paths.models, s, code, spec.params_hash)]
    if stale:
        raise RunError(f"{spec.slug}: no valid training for seeds {stale} under {paths.models} (missing, "
                           f"changed, or from other code/params): run the train phase first "
                           f"(python -m flows.stage {spec.slug} --phase train)")
    return [read_json(train_marker(paths.models, s)) for s in spec.seeds]


def evaluate_all_seeds(spec: RunSpec, paths: PaperPaths, device: str, trained: list[dict]) -> list[dict]:
    code = code_version([step_module_name(spec.slug, "evaluate")])
    futures, evaluated = [], {}
    with seed_bars():
        for record in trained:
            seed = record["seed"]
            missing = not evaluation_path(paths.reports, seed).exists()
            futures.append(evaluate_seed.with_options(refresh_cache=missing).submit(
                spec.slug, spec.config, seed, str(paths.data), str(paths.models), device, code,
                record["checkpoints"]))
        for future in interrupts.interruptible(as_completed(futures)):
            result = future.result()
            write_json(evaluation_path(paths.reports, result["seed"]), result)
            evaluated[result["seed"]] = result
    return [evaluated[r["seed"]] for r in trained]


def publish(spec: RunSpec, paths: PaperPaths, device: str, title: str, results: list[dict],
            parent_id: str) -> list[dict]:
    # quote(): Prefect would otherwise walk every element of the results (curves of thousands of points)
    # looking for futures; that walk took longer than the logging itself (docs/performance.md).
    for result in results:
        log_seed_run(spec, parent_id, quote(result), device, [str(evaluation_path(paths.reports, result["seed"]))],
                     seed_datasets(paths.data, result["seed"]))
    made = make_figures(spec.slug, spec.config, quote(results), str(paths.figures), str(paths.plots))
    return publish_claims(spec, parent_id, quote(results), str(repo_root() / "tasks" / spec.slug / "claims.yaml"),
                          str(paths.reports), title, made)


def run_paper(slug: str, profile: str | None, seeds: Sequence[int] | None, phase: Phase,
              workers: int = WORKERS) -> dict:
    """The paper's flow body: the phases asked for, in order."""
    if phase not in PHASES:
        raise ValueError(f"phase: must be one of {'|'.join(PHASES)}, got {phase!r}")
    quiet_user_error_tracebacks()
    spec = resolve_run(slug, profile, seeds)
    configure(spec.profile)
    interrupts.opened(flow_run_id=current_flow_run_id())
    # Again inside the flow: Prefect's engine puts its own SIGTERM bridge in place for the flow run, and a
    # thread-pool flow would otherwise wait for every seed to finish before stopping.
    interrupts.install()
    paper = load_paper(slug)
    paths = paper_paths(slug, spec.profile)
    writes = {"data": [paths.data], "train": [paths.models], "evaluate": [paths.reports],
              "run": [paths.reports, paths.models], "all": [paths.reports, paths.models, paths.data]}
    check_writable(writes[phase])
    # Temp files of a run killed mid-write (never a final output) are cleared before anything is written.
    for folder in (paths.data, paths.models, paths.reports):
        remove_partials(folder)
    if phase in ("data", "all"):
        prepare_data(slug, spec, str(paths.data))
    if phase == "data":
        return {"phase": "data", "data": str(paths.data)}
    if not paths.data.is_dir():
        raise RunError(f"{slug}: no data under {paths.data}: run the data phase first "
                       f"(python -m flows.stage {slug} --phase data)")
    check_parquet_files(slug, paths.data)
    device = pick_device(spec.config.device)
    import torch

    torch.set_num_threads(torch_threads_per_worker(min(workers, len(spec.seeds))))
    trained = train_all_seeds(spec, paths, device) if phase in ("train", "run", "all") else None
    if phase == "train":
        return {"phase": "train", "models": str(paths.models)}
    trained = trained or read_train_records(spec, paths)
    with parent_run(spec, device) as parent_id:
        evaluated = evaluate_all_seeds(spec, paths, device, trained)
        results = derive_claim_metrics(slug, spec.config, quote(trained), quote(evaluated))
        rows = publish(spec, paths, device, paper.title, results, parent_id)
    return {"phase": phase, "parent_run_id": parent_id, "verdicts": {r["id"]: r["verdict"] for r in rows}}


def flow_run_name() -> str:
    """``<paper>-<phase>-<profile>-seeds-<s1>-<s2>...`` for the Prefect UI's run list, from the flow run's
    parameters; the profile and seeds that params.yaml supplies when the caller gave none are spelled out."""
    from prefect.runtime import flow_run

    parameters = dict(flow_run.parameters or {})
    slug = flow_run.flow_name or "paper"
    try:
        spec = resolve_run(slug, parameters.get("profile"), parameters.get("seeds"))
        profile, seeds = spec.profile, list(spec.seeds)
    except Exception:  # noqa: BLE001 - an invalid run is named plainly; the flow body reports why
        profile, seeds = parameters.get("profile") or "default", list(parameters.get("seeds") or [])
    seeds_part = "-".join(str(s) for s in seeds) or "default"
    return f"{slug}-{parameters.get('phase', 'all')}-{profile}-seeds-{seeds_part}"


def flow_options(slug: str, workers: int = WORKERS) -> dict[str, Any]:
    """The ``@flow`` options of a paper's flow: named after the paper, described by its title, seeds on
    a thread pool (``--runner dask`` replaces it). Each ``flows/<slug>.py`` defines its own flow
    function, so that Prefect's deployments find it at ``flows/<slug>.py:<slug>``."""
    from prefect.task_runners import ThreadPoolTaskRunner

    title = getattr(importlib.import_module(f"tasks.{slug}.config"), "TITLE", slug)
    return {"name": slug, "description": title, "task_runner": ThreadPoolTaskRunner(max_workers=workers),
            "flow_run_name": flow_run_name}


__all__ = ["PHASES", "Paper", "Phase", "flow_options", "run_paper"]
