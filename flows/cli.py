"""The ``repro`` command line. Paper modules (and torch) are imported only by the commands that
run them, so ``repro --help`` and ``repro list`` answer in about a second."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

from tasks.common.env import configure, repo_root
from tasks.common.params import ParamsError

PHASES_HELP = """phases (each a DVC stage of its own; `dvc repro` runs them in order):
  data      write the paper's procedural data under data/<slug>
  train     train every seed (reuses seeds already trained with the same code and params)
  evaluate  evaluate the trained seeds, derive claim metrics, write reports/<slug> and the MLflow runs
  run       train then evaluate (the data must exist)
  all       data, train and evaluate (the default)"""

UI_HINT = ("Prefect UI: run `repro server start` (http://127.0.0.1:4200)\n"
           "MLflow UI:  run `repro ui` (http://127.0.0.1:5000), or `mlflow ui` at the repo root")


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned columns as wide as their longest cell, two spaces apart; the last column is not padded."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths[:-1], strict=True)) + "  " + cells[-1]

    return "\n".join(line(r) for r in [header, *rows])


def cmd_list(_: argparse.Namespace) -> int:
    from flows.registry import fidelity, last_verdicts, papers

    rows = []
    for slug in papers():
        profile, counts = last_verdicts(slug)
        verdicts = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "-"
        rows.append([slug, fidelity(slug), profile, verdicts])
    print(format_table(["paper", "fidelity", "last run", "verdicts"], rows))
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from flows.stage import run_stage

    return run_stage(args.slug, args.phase, args.profile, args.seeds, args.runner, args.dask_address)


def cmd_report(_: argparse.Namespace) -> int:
    from flows.report import main

    return main()


def cmd_diff(args: argparse.Namespace) -> int:
    from flows.registry import papers
    from tasks.common.compare import diff_paper, format_diff

    reports = repo_root() / "reports"
    diffs = [diff_paper(slug, args.rev, reports) for slug in (args.slugs or papers())]
    print(format_diff(diffs, args.rev), end="")
    changed = any(d.verdict_changes for d in diffs)
    return 1 if changed and args.exit_code else 0


def cmd_server(args: argparse.Namespace) -> int:
    from flows import servers

    if args.action == "start":
        try:
            url = servers.start_prefect()
        except servers.ServerConflict as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print(f"Prefect server: {url} (UI http://127.0.0.1:{servers.PREFECT_PORT})\n"
              f"use it with: export PREFECT_API_URL={url}")
    elif args.action == "stop":
        print("stopped" if servers.stop_prefect() else "no server started by repro was found")
    else:
        up = servers.prefect_running()
        print(f"Prefect server at {servers.prefect_api_url()}: {'running' if up else 'not running'}")
        return 0 if up else 1
    return 0


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def cmd_ui(args: argparse.Namespace) -> int:
    """Both UIs on loopback. A taken MLflow port is an error before anything starts. Ctrl-C (or SIGTERM), at
    any moment, stops the MLflow server and the Prefect server this command started (one that was already
    running is left running), waits until their ports are free, and exits 130 without a traceback. If the
    MLflow server exits by itself, the Prefect server this command started is stopped too (exit status
    MLflow's)."""
    from flows import servers

    if not servers.port_free(args.port):
        print(f"error: --port {args.port}: the port is in use (another MLflow UI?); pick another, e.g. "
              f"repro ui --port {args.port + 1}", file=sys.stderr)
        return 2
    prefect_was_running = servers.own_server_port() == servers.PREFECT_PORT and servers.prefect_running()
    # What .prefect/server.pid said before: a different entry afterwards is the server this command started.
    pid_entry_before = servers.pid_file_entry()
    mlflow: subprocess.Popen | None = None
    status = 130
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            prefect_url = servers.start_prefect()
        except servers.ServerConflict as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        from tasks.common import tracking

        os.environ["REPRO_MLFLOW_PORT"] = str(args.port)
        print(f"Prefect UI: http://127.0.0.1:{servers.PREFECT_PORT}  (API {prefect_url})")
        print(f"MLflow UI:  http://127.0.0.1:{args.port}  (store {os.environ['MLFLOW_TRACKING_URI']}); "
              "Ctrl-C stops both", flush=True)
        print('  MLflow 3 opens an experiment on its GenAI overview until "Model training" is chosen (top left;\n'
              "  the browser remembers it). Each experiment's runs table:")
        for name, url in sorted(tracking.experiments_runs_urls().items()):
            print(f"  {name:<24}{url}")
        sys.stdout.flush()
        mlflow = servers.start_mlflow_ui(args.port)
        status = mlflow.wait()
        print(f"the MLflow UI exited with status {status}", file=sys.stderr)
        return status
    except KeyboardInterrupt:
        return 130
    finally:
        # A second Ctrl-C must not cut the shutdown short (and leave a server running).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stopped = []
        if mlflow is not None:
            if mlflow.poll() is None:
                stopped.append("the MLflow UI")
            servers.stop_group(mlflow.pid, args.port, wait_s=15.0)  # its workers too, even if it has exited
        started_prefect = servers.pid_file_entry() not in (None, pid_entry_before)
        if not prefect_was_running and started_prefect and servers.stop_prefect():
            stopped.append("the Prefect server")
        if stopped:
            print(("\n" if status == 130 else "") + "stopped " + " and ".join(stopped), file=sys.stderr)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def cmd_serve(args: argparse.Namespace) -> int:
    from tasks.common.params import validate_profile, validate_seeds

    validate_profile(args.profile, key="--profile")
    if args.seeds is not None:
        validate_seeds(args.seeds, key="--seeds")
    from flows.serve import serve_all

    serve_all(profile=args.profile, seeds=args.seeds, cron=args.cron)
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    from tasks.common.params import validate_profile, validate_seeds

    validate_profile(args.profile, key="--profile")
    if args.seeds is not None:
        validate_seeds(args.seeds, key="--seeds")
    from flows.deploy import deploy_all

    ids = deploy_all(args.pool, args.profile, args.seeds, args.cron)
    print(f"{len(ids)} deployments on work pool {args.pool!r}; start a worker with:\n"
          f"  prefect worker start --pool {args.pool}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="repro", description="Reproduce the claims of ICML 2026 papers.",
                                     epilog=UI_HINT, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="papers, fidelity, last verdicts").set_defaults(func=cmd_list)
    from flows.registry import papers

    run = sub.add_parser("run", help="run one paper's flow", formatter_class=argparse.RawDescriptionHelpFormatter,
                         epilog="papers: " + ", ".join(papers()) + "\n\n" + PHASES_HELP)
    run.add_argument("slug", help="the paper (see the list below)")
    run.add_argument("--profile", choices=None, help="smoke | cpu | paper (default: params.yaml)")
    run.add_argument("--seeds", type=int, nargs="+", help="default: params.yaml")
    from flows.stage import PHASES

    run.add_argument("--phase", choices=PHASES, default="all",
                     help="data | train | evaluate | run | all (default; see below)")
    from flows.stage import add_runner_arguments

    add_runner_arguments(run)
    run.set_defaults(func=cmd_run)
    sub.add_parser("report", help="build reports/index.md and index.html").set_defaults(func=cmd_report)
    diff = sub.add_parser("diff", help="verdicts and metrics that changed against a git revision")
    diff.add_argument("rev", nargs="?", default="HEAD", help="git revision to compare with (default HEAD)")
    diff.add_argument("--papers", dest="slugs", nargs="+", default=None, help="default: every paper")
    diff.add_argument("--exit-code", action="store_true", help="exit 1 when a verdict changed")
    diff.set_defaults(func=cmd_diff)
    server = sub.add_parser("server", help="the local Prefect server on 127.0.0.1")
    server.add_argument("action", choices=["start", "stop", "status"])
    server.set_defaults(func=cmd_server)
    ui = sub.add_parser("ui", help="Prefect UI and MLflow UI on localhost")
    ui.add_argument("--port", type=int, default=5000)
    ui.set_defaults(func=cmd_ui)
    serve = sub.add_parser("serve", help="a deployment per paper flow and reproduce-all, served here")
    serve.add_argument("--profile", default="smoke")
    serve.add_argument("--seeds", type=int, nargs="+", default=None)
    serve.add_argument("--cron", default=None, help="optional cron schedule, e.g. '0 3 * * *'")
    serve.set_defaults(func=cmd_serve)
    deploy = sub.add_parser("deploy", help="deployments on a Prefect process work pool (run by workers)")
    deploy.add_argument("--pool", default="repro-process")
    deploy.add_argument("--profile", default="smoke")
    deploy.add_argument("--seeds", type=int, nargs="+", default=None)
    deploy.add_argument("--cron", default=None)
    deploy.set_defaults(func=cmd_deploy)
    return parser


def main(argv: list[str] | None = None) -> int:
    configure()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
