"""The only module that talks to MLflow.

One experiment per paper, one parent run per flow run, one child run per seed (or variant)
linked by the ``mlflow.parentRunId`` tag. Runs are addressed by explicit run ids through
``MlflowClient`` because MLflow's "active run" is thread-local and Prefect tasks run on threads.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tasks.common.env import repo_root
from tasks.common.provenance import cpu_model, git_state, package_versions, torch_cpu_capability

PARENT_TAG = "mlflow.parentRunId"
# The experiment's kind, for MLflow 3's kind inference. MLflow 3.17's UI does not land by it: a click on an
# experiment opens the GenAI overview until "Model training" is chosen in the UI (kept by the browser), so
# `repro ui` says so and prints each experiment's runs-table URL (tests/pipeline/test_browser_uis.py).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"


_READY_STORES: set[str] = set()


def _ensure_store(uri: str) -> None:
    """Create a SQLite store's tables under a file lock, once per process.

    Two flows starting at once on a fresh store would otherwise both run MLflow's schema
    migrations and one of them fails.
    """
    if uri in _READY_STORES or not uri.startswith("sqlite:///"):
        return
    import fcntl

    from mlflow.tracking import MlflowClient

    db_path = Path(uri.removeprefix("sqlite:///"))
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with open(db_path.with_name(db_path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            _retry(lambda: MlflowClient(tracking_uri=uri).search_experiments(max_results=1))
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _READY_STORES.add(uri)


def _client():
    from mlflow.tracking import MlflowClient

    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    _ensure_store(uri)
    return MlflowClient(tracking_uri=uri or None)


def artifact_location(slug: str) -> str | None:
    """Artifacts of the local SQLite store go to ``<repo>/mlartifacts/<slug>``; a remote tracking
    server chooses its own (``None``)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith("sqlite:") or uri.startswith("file:") or not uri:
        root = Path(os.environ.get("REPRO_MLARTIFACTS", repo_root() / "mlartifacts"))
        return (root / slug).resolve().as_uri()
    return None


def get_or_create_experiment(slug: str) -> str:
    client = _client()
    found = client.get_experiment_by_name(slug)
    if found is not None:
        if found.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # a store written before the tag existed
            _retry(client.set_experiment_tag, found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return found.experiment_id
    try:
        return client.create_experiment(slug, artifact_location=artifact_location(slug),
                                        tags={"paper": slug, EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except Exception:
        # Two flows creating the experiment at once: the loser reads the winner's.
        found = client.get_experiment_by_name(slug)
        if found is None:
            raise
        return found.experiment_id


def mlflow_ui_base() -> str:
    """Where the MLflow UI of this store answers: the tracking server itself when the store is one
    (``http(s)://``), otherwise ``repro ui``'s local server (``REPRO_MLFLOW_PORT``, default 5000)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    return f"http://127.0.0.1:{os.environ.get('REPRO_MLFLOW_PORT', '5000')}"


def experiment_runs_url(experiment_id: str) -> str:
    """The runs table of one experiment in the MLflow UI (a hash route of MLflow 3's single-page app)."""
    return f"{mlflow_ui_base()}/#/experiments/{experiment_id}/runs"


def run_url(experiment_id: str, run_id: str) -> str:
    return f"{mlflow_ui_base()}/#/experiments/{experiment_id}/runs/{run_id}"


def prefect_api_url_in_use() -> str | None:
    """The Prefect API the current flow run talks to: its engine's client (a `repro server start` server, the
    tests' server, or a temporary one started for this process), else ``PREFECT_API_URL``."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    client = getattr(context, "client", None) if context is not None else None
    url = str(client.api_url) if client is not None and getattr(client, "api_url", None) else None
    return url or os.environ.get("PREFECT_API_URL") or None


def prefect_flow_run_url(flow_run_id: str | None) -> str | None:
    """The flow run's page in the Prefect UI (the API URL without ``/api``, or ``PREFECT_UI_URL``), or None
    outside a flow or without a server. A temporary server's page lasts as long as the process that ran it;
    `repro server start` keeps one up."""
    if not flow_run_id:
        return None
    api = prefect_api_url_in_use()
    if not api or not api.startswith(("http://", "https://")):
        return None
    ui = os.environ.get("PREFECT_UI_URL") or api.rstrip("/").removesuffix("/api")
    return f"{ui.rstrip('/')}/runs/flow-run/{flow_run_id}"


def provenance_tags(profile: str, seeds: tuple[int, ...] | list[int], params_hash: str, device: str,
                    flow_run_id: str | None = None) -> dict[str, str]:
    commit, dirty = git_state()
    tags = {
        "git_commit": commit,
        "git_dirty": str(dirty).lower(),
        "params_hash": params_hash,
        "profile": profile,
        "seeds": ",".join(str(s) for s in seeds),
        "device": device,
        "prefect_flow_run_id": flow_run_id or "none",
        "prefect_flow_run_url": prefect_flow_run_url(flow_run_id) or "none",
        "cpu_model": cpu_model(),
        "torch_cpu_capability": torch_cpu_capability(),
    }
    tags.update({f"version.{k}": v for k, v in package_versions().items()})
    return tags


class TrackingStoreError(RuntimeError):
    """The MLflow store cannot be used (a SQLite file locked past the retries, or damaged): the command line
    prints this one-line message, which names the file and the next step, instead of a traceback."""


def _sqlite_path() -> Path | None:
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def store_problem(err: BaseException, attempts: int) -> TrackingStoreError | None:
    """A user-facing error for the store failures a user can act on; None for anything else."""
    text, db = str(err).lower(), _sqlite_path()
    where = str(db) if db else os.environ.get("MLFLOW_TRACKING_URI", "the MLflow store")
    if "locked" in text:
        return TrackingStoreError(
            f"{where} stayed locked through {attempts} retries: another process holds a write on it (a second "
            f"flow, or an `mlflow server`/`repro ui` mid-write); find it with `fuser {where}`, let it finish "
            "or stop it, then rerun (finished seeds are kept)")
    if "malformed" in text or "not a database" in text:
        return TrackingStoreError(
            f"{where} is damaged ({str(err).splitlines()[0][:120]}); move it aside "
            f"(`mv {where} {where}.broken`) and rerun: a new store is created and the runs are logged again")
    return None


def _retry(fn, *args, attempts: int = 8, **kwargs):
    # SQLite serialises writers; two flows logging at once can see "database is locked".
    delay = 0.2
    for attempt in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - MLflow wraps the sqlite error in its own types
            if "locked" in str(err).lower() and attempt < attempts - 1:
                time.sleep(delay)
                delay *= 2
                continue
            problem = store_problem(err, attempts)
            if problem is not None:
                raise problem from err
            raise
    raise AssertionError("unreachable")


def start_run(slug: str, run_name: str, tags: Mapping[str, str], parent_run_id: str | None = None) -> str:
    """Create a run (a child when ``parent_run_id`` is given) and return its id."""
    experiment_id = get_or_create_experiment(slug)
    all_tags = dict(tags)
    if parent_run_id:
        all_tags[PARENT_TAG] = parent_run_id
    run = _retry(_client().create_run, experiment_id, tags=all_tags, run_name=run_name)
    return run.info.run_id


def run_url_of(run_id: str) -> str:
    """The MLflow UI page of a run, by id."""
    run = _retry(_client().get_run, run_id)
    return run_url(run.info.experiment_id, run_id)


def experiments_runs_urls() -> dict[str, str]:
    """Every experiment of the store (but MLflow's empty "Default"), by name, with its runs-table URL."""
    experiments = _retry(_client().search_experiments)
    return {e.name: experiment_runs_url(e.experiment_id) for e in experiments if e.name != "Default"}


def end_run(run_id: str, status: str = "FINISHED") -> None:
    _retry(_client().set_terminated, run_id, status=status)


def flatten(prefix: str, obj: Any) -> dict[str, Any]:
    """``{"a": {"b": 1}} -> {"a.b": 1}``: MLflow params and metrics are flat."""
    if isinstance(obj, Mapping):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(flatten(f"{prefix}.{key}" if prefix else str(key), value))
        return out
    return {prefix: obj}


def log_params(run_id: str, params: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    flat = flatten("", params)
    items = [Param(k, json.dumps(v) if isinstance(v, list | tuple) else str(v)) for k, v in flat.items()]
    for start in range(0, len(items), 100):  # MLflow caps a batch at 100 params
        _retry(_client().log_batch, run_id, params=items[start:start + 100])


def log_metrics(run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, step) for k, v in flatten("", metrics).items()
             if isinstance(v, int | float) and not isinstance(v, bool)]
    for start in range(0, len(items), 1000):
        _retry(_client().log_batch, run_id, metrics=items[start:start + 1000])


MLFLOW_BATCH_METRICS = 1000  # MLflow's limit of metrics per log_batch request


def log_curves(run_id: str, curves: Mapping[str, Sequence[float]]) -> None:
    """Per-step curves as metrics with steps, in as few ``log_batch`` calls as MLflow allows (1,000
    metrics each): each call is one transaction of the tracking store, and one call per curve made
    logging a seed's curves cost seconds on SQLite (docs/performance.md)."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(key, float(v), now, step) for key, values in curves.items() for step, v in enumerate(values)]
    for start in range(0, len(items), MLFLOW_BATCH_METRICS):
        _retry(_client().log_batch, run_id, metrics=items[start:start + MLFLOW_BATCH_METRICS])


def set_tags(run_id: str, tags: Mapping[str, str]) -> None:
    from mlflow.entities import RunTag

    _retry(_client().log_batch, run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_artifact(run_id: str, path: str | Path, artifact_path: str | None = None) -> None:
    _retry(_client().log_artifact, run_id, str(path), artifact_path=artifact_path)


def log_table(run_id: str, rows: list[Mapping[str, Any]], artifact_file: str) -> None:
    """A table (list of row dicts) shown by the MLflow UI's table view."""
    columns: dict[str, list[Any]] = {}
    for row in rows:
        for key in row:
            columns.setdefault(key, [])
    for row in rows:
        for key in columns:
            value = row.get(key)
            columns[key].append(json.dumps(value) if isinstance(value, dict | list) else value)
    _retry(_client().log_table, run_id, data=columns, artifact_file=artifact_file)


def log_dataset(run_id: str, path: str | Path, context: str) -> None:
    """Record a parquet file as a run input (MLflow dataset tracking: name, digest, schema, source)."""
    import warnings

    import mlflow.data
    import polars as pl
    from mlflow.entities import DatasetInput, InputTag

    path = Path(path)
    with warnings.catch_warnings():
        # MLflow repeats, for every file of every seed, that a file:// source "can be interpreted in multiple
        # ways" (two registered local-file source types) before taking the local artifact source.
        warnings.filterwarnings("ignore", message="The specified dataset source can be interpreted in multiple ways")
        dataset = mlflow.data.from_polars(pl.read_parquet(path), source=path.resolve().as_uri(), name=path.stem)
    entity = DatasetInput(dataset._to_mlflow_entity(), tags=[InputTag("mlflow.data.context", context)])
    _retry(_client().log_inputs, run_id, datasets=[entity])


def find_runs(slug: str, filter_string: str = "") -> list[Any]:
    client = _client()
    experiment = client.get_experiment_by_name(slug)
    if experiment is None:
        return []
    return client.search_runs([experiment.experiment_id], filter_string=filter_string)
