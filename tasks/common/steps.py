"""Prefect tasks shared by every paper flow: the parent MLflow run, per-seed child runs, claims,
metrics and plot files. Flows compose these with the paper's own tasks."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from tasks.common import interrupts, tracking
from tasks.common.claims import claims_markdown, evaluate_claims, headline_metrics, load_claims, write_claims
from tasks.common.devices import describe_device
from tasks.common.env import repo_root
from tasks.common.io import write_json
from tasks.common.params import ParamsError, RunSpec, read_params

CURVE_PREFIX = "curve/"


@dataclass(frozen=True)
class PaperPaths:
    data: Path
    models: Path
    reports: Path

    @property
    def figures(self) -> Path:
        return self.reports / "figures"

    @property
    def plots(self) -> Path:
        return self.reports / "plots"


OTHER_PROFILES_DIR = "runs"


def committed_profile(root: Path) -> str | None:
    """The profile of ``params.yaml`` (``profile:``): the one whose results live in data/, models/, reports/
    and are committed; None when the file cannot be read (the run's own validation reports why)."""
    try:
        return read_params(root / "params.yaml").get("profile")
    except ParamsError:
        return None


def paper_paths(slug: str, profile: str | None = None, root: Path | None = None) -> PaperPaths:
    """Where one paper's data, checkpoints and reports live.

    At the committed profile (``params.yaml``'s ``profile``, what ``dvc repro`` runs) they are
    ``data/<slug>``, ``models/<slug>`` and ``reports/<slug>``. A run at another profile
    (``repro run <slug> --profile smoke``) writes under ``runs/<profile>/`` instead, so it never overwrites
    the committed results nor the checkpoints DVC tracks, and the report never mixes profiles.
    """
    root = root or repo_root()
    base = root if profile is None or profile == committed_profile(root) else root / OTHER_PROFILES_DIR / profile
    return PaperPaths(base / "data" / slug, base / "models" / slug, base / "reports" / slug)


def current_flow_run_id() -> str | None:
    from prefect.runtime import flow_run

    return str(flow_run.id) if flow_run.id else None


@contextlib.contextmanager
def parent_run(spec: RunSpec, device: str) -> Iterator[str]:
    """One MLflow parent run per flow run, ended FAILED if the flow raises."""
    tags = tracking.provenance_tags(spec.profile, spec.seeds, spec.params_hash, describe_device(device),
                                    current_flow_run_id())
    run_id = tracking.start_run(spec.slug, f"{spec.slug}-{spec.profile}", tags | {"kind": "flow"})
    interrupts.opened(mlflow_run_id=run_id)
    link_mlflow_run(spec.slug, run_id)
    status = "FAILED"
    try:
        tracking.log_params(run_id, {"profile": spec.profile, "seeds": list(spec.seeds)}
                            | spec.config.model_dump(mode="json"))
        yield run_id
        status = "FINISHED"
    finally:
        tracking.end_run(run_id, status)
        interrupts.closed(mlflow_run_id=run_id)


def link_mlflow_run(slug: str, run_id: str) -> None:
    """A link artifact on the Prefect flow run pointing at its MLflow parent run (the MLflow run carries
    the flow run's URL in its ``prefect_flow_run_url`` tag), so each UI leads to the other."""
    if current_flow_run_id() is None:
        return
    create_link_artifact(link=tracking.run_url_of(run_id), link_text=f"MLflow run of {slug}",
                         key=f"mlflow-run-{slug.replace('_', '-')}",
                         description="The MLflow parent run of this flow run (open it with `repro ui`).")


@task(name="log-seed-run")
def log_seed_run(spec: RunSpec, parent_run_id: str, result: Mapping[str, Any], device: str,
                 artifacts: Sequence[str] = (), datasets: Sequence[str] = ()) -> str:
    """A child run for one seed: its params, final metrics, curves, result files and input datasets
    (parquet files, logged as MLflow dataset inputs)."""
    seed = int(result["seed"])
    tags = tracking.provenance_tags(spec.profile, (seed,), spec.params_hash, describe_device(device),
                                    current_flow_run_id())
    run_id = tracking.start_run(spec.slug, f"seed-{seed}", tags | {"kind": "seed", "seed": str(seed)},
                                parent_run_id=parent_run_id)
    try:
        tracking.log_params(run_id, {"seed": seed} | spec.config.model_dump(mode="json"))
        tracking.log_metrics(run_id, result["metrics"])
        # Curves go under their own prefix: a curve named like a final metric would otherwise become
        # that metric's latest value in MLflow.
        tracking.log_curves(run_id, {f"{CURVE_PREFIX}{name}": values
                                     for name, values in result.get("curves", {}).items()})
        for path in artifacts:
            tracking.log_artifact(run_id, path)
        for path in datasets:
            tracking.log_dataset(run_id, path, context="training")
    except BaseException:
        tracking.end_run(run_id, "FAILED")
        raise
    tracking.end_run(run_id)
    return run_id


def summarise_metrics(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """metrics.json: mean, std and per-seed value of every metric (DVC shows the means)."""
    names = sorted({k for r in results for k in r["metrics"]})
    summary: dict[str, Any] = {"mean": {}, "std": {}, "per_seed": {}}
    for name in names:
        values = [float(r["metrics"][name]) for r in results if name in r["metrics"]]
        summary["mean"][name] = float(np.mean(values))
        summary["std"][name] = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
        summary["per_seed"][name] = {str(r["seed"]): float(r["metrics"][name]) for r in results
                                     if name in r["metrics"]}
    return summary


@task(name="publish-claims")
def publish_claims(spec: RunSpec, parent_run_id: str, results: Sequence[Mapping[str, Any]],
                   claims_file: str, reports_dir: str, title: str, figures: Sequence[str] = ()) -> list[dict]:
    """Verdicts over seeds -> claims.json/claims.md/metrics.json/headline.json, and the same into MLflow and
    Prefect."""
    out = Path(reports_dir)
    rows = evaluate_claims(load_claims(claims_file), {int(r["seed"]): r["metrics"] for r in results},
                           spec.profile, spec.slug)
    write_claims(rows, out, title)
    summary = summarise_metrics(results)
    write_json(out / "metrics.json", summary["mean"] | {"n_seeds": len(results), "profile": spec.profile})
    write_json(out / "metrics_per_seed.json", summary)
    write_json(out / "headline.json", headline_metrics(rows, len(results)))
    tracking.log_metrics(parent_run_id, {f"mean.{k}": v for k, v in summary["mean"].items()})
    tracking.log_table(parent_run_id, rows, "claims.json")
    tracking.log_artifact(parent_run_id, out / "claims.md")
    tracking.log_artifact(parent_run_id, out / "metrics_per_seed.json")
    for fig in figures:
        tracking.log_artifact(parent_run_id, fig, "figures")
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["verdict"]] = counts.get(row["verdict"], 0) + 1
    # MLflow shows tag keys verbatim; "verdicts.not testable at this profile" is awkward to filter on.
    tracking.set_tags(parent_run_id, {f"verdicts.{k.replace(' ', '_')}": str(v) for k, v in counts.items()})
    create_table_artifact(
        key=f"{spec.slug.replace('_', '-')}-claims",
        table=[{k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in row.items()
                if k in ("id", "kind", "claim", "paper_value", "check", "mean", "ci_low", "ci_high", "verdict",
                         "seeds_needed")}
               for row in rows],
        description=f"{spec.slug} claims at profile {spec.profile}")
    create_markdown_artifact(key=f"{spec.slug.replace('_', '-')}-claims-md", markdown=claims_markdown(rows))
    return rows
