"""Entry point of the DVC stages and of ``repro run``: validate params, then run one paper's flow.

    python -m flows.stage arm_ebm --phase data
    python -m flows.stage arm_ebm --phase train          # checkpoints under models/arm_ebm/seed<N>/
    python -m flows.stage arm_ebm --phase evaluate       # measurements, claims, figures, MLflow runs
    python -m flows.stage arm_ebm --phase all --profile smoke --seeds 0 1 2
    python -m flows.stage arm_ebm --phase run --runner dask [--dask-address tcp://host:8786]

Under ``dvc repro`` the runner comes from REPRO_RUNNER / REPRO_DASK_ADDRESS (see flows/runners.py).

Parameters are validated before Prefect, MLflow or torch is imported, so a bad value fails in about
a second with a one-line error naming the key, and exit status 2.
"""

from __future__ import annotations

import argparse
import gc
import sys

from flows.runners import RUNNERS, RunnerError, preferred_runner, resolve_runner, with_runner
from tasks.common.params import ParamsError, resolve_run

# The phases of tasks/common/paper_flow.py (kept here so that validation imports no Prefect).
PHASES = ("data", "train", "evaluate", "run", "all")


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runner", choices=RUNNERS, default=None,
                        help="task runner for the seeds: threads or dask (default: the paper's measured-fastest, "
                             "see flows/runners.py PREFERRED_RUNNERS; threads for most)")
    parser.add_argument("--dask-address", default=None,
                        help="scheduler of an existing Dask cluster (default: a local cluster of 2 workers)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m flows.stage", description=__doc__.splitlines()[0])
    parser.add_argument("slug")
    parser.add_argument("--phase", choices=PHASES, default="all",
                        help="data | train | evaluate | run (train then evaluate) | all (data too)")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    add_runner_arguments(parser)
    return parser.parse_args(argv)


def run_stage(slug: str, phase: str, profile: str | None, seeds: list[int] | None,
              runner: str | None = None, dask_address: str | None = None) -> int:
    try:
        spec = resolve_run(slug, profile, seeds)
        runner, dask_address = resolve_runner(runner, dask_address, preferred_runner(slug, spec.profile))
    except (ParamsError, RunnerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from tasks.common.env import configure

    configure(spec.profile)
    from flows.registry import load_flow

    # The data phase is one small task: it always runs on threads.
    flow = with_runner(load_flow(slug), runner if phase != "data" else "threads", dask_address)
    from flows.servers import start_embedded_prefect, using_prefect_api
    from tasks.common import interrupts
    from tasks.common.paper_flow import RunError, say_user_errors_once
    from tasks.common.tracking import TrackingStoreError

    # This command prints a user error as its last line (below): the terminal need not show Prefect's copies.
    say_user_errors_once()
    previous_handlers = interrupts.install()
    try:
        # After install(): a Ctrl-C while the embedded server starts stops it too.
        with using_prefect_api(start_embedded_prefect()):
            result = flow(profile=spec.profile, seeds=list(spec.seeds), phase=phase)
    except (RunError, TrackingStoreError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    finally:
        interrupts.forget_all()
        interrupts.restore(previous_handlers)
    if phase not in ("data", "train"):
        print(run_summary(slug, spec.profile, list(spec.seeds), result))
    return 0


def run_summary(slug: str, profile: str, seeds: list[int], result: dict) -> str:
    """The lines a finished evaluation ends with: verdict counts, where the claims table is, the MLflow run."""
    from collections import Counter

    from tasks.common import tracking
    from tasks.common.steps import paper_paths

    counts = Counter(result.get("verdicts", {}).values())
    claims_md = paper_paths(slug, profile).reports / "claims.md"
    try:
        run_url = tracking.run_url_of(result["parent_run_id"])
    except Exception as err:  # noqa: BLE001 - the summary must not fail a finished run
        run_url = f"(not available: {type(err).__name__})"
    return (f"[{slug}] {profile}, seeds {seeds}: " + ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
            + f"\n[{slug}] claims: {claims_md}\n[{slug}] MLflow run: {run_url} (open with `repro ui`)")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    return run_stage(args.slug, args.phase, args.profile, args.seeds, args.runner, args.dask_address)


def exit_without_final_collection(status: int) -> None:
    """Exit with ``status``, skipping the interpreter's last garbage collections over the ~550,000 objects
    torch, Prefect and MLflow leave behind: they took 3-5 s per stage, minutes over the 57 stages of
    `dvc repro` (docs/performance.md). Frozen objects are still released by reference counting, so files
    close as usual; everything a stage writes is already on disk when its flow returns."""
    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":
    exit_without_final_collection(main())
