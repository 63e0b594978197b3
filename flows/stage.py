"""Entry point of the DVC stages and of ``repro run``: validate params, then run one paper's flow.

    python -m flows.stage arm_ebm --phase data
    python -m flows.stage arm_ebm --phase run --profile smoke --seeds 0 1 2

Parameters are validated before Prefect, MLflow or torch is imported, so a bad value fails in about
a second with a one-line error naming the key, and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from tasks.common.params import ParamsError, resolve_run


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m flows.stage", description=__doc__.splitlines()[0])
    parser.add_argument("slug")
    parser.add_argument("--phase", choices=["data", "run", "all"], default="all")
    parser.add_argument("--profile", default=None)
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    return parser.parse_args(argv)


def run_stage(slug: str, phase: str, profile: str | None, seeds: list[int] | None) -> int:
    try:
        spec = resolve_run(slug, profile, seeds)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from tasks.common.env import configure

    configure(spec.profile)
    from flows.registry import load_flow

    result = load_flow(slug)(profile=spec.profile, seeds=list(spec.seeds), phase=phase)
    if phase != "data":
        verdicts = result.get("verdicts", {})
        print(f"[{slug}] profile={spec.profile} seeds={list(spec.seeds)}: "
              + ", ".join(f"{k}={v}" for k, v in verdicts.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    return run_stage(args.slug, args.phase, args.profile, args.seeds)


if __name__ == "__main__":
    sys.exit(main())
