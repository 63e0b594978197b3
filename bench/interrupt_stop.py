"""Seconds from Ctrl-C (or another signal) to the exit of a run in training, per Prefect server and runner.

    python bench/interrupt_stop.py [--slug arm_ebm] [--profile cpu] [--seeds 0 1 2] [--into-training 30]
                                   [--signal SIGINT] [--modes embedded-threads embedded-dask persistent-threads]
    (writes bench/results/interrupt_stop_<profile>.json)

Each mode runs in a scratch project root (params.yaml of this checkout at ``--profile``): the data phase, then
``python -m flows.stage <slug> --phase train`` in a session of its own, as a shell runs it; ``--into-training``
seconds after the first seed reported training progress, the signal goes to the whole process group (what
Ctrl-C in a terminal does; SIGTERM/SIGHUP likewise). Reported per mode: the seconds to exit, the exit status,
the processes of the run still alive 5 s later, the Prefect flow run's state (read from the server's SQLite
database), and the lines printed after the handler's "stopping" line. ``embedded`` is the server a run without
PREFECT_API_URL starts for itself; ``persistent`` a ``prefect server start`` of the scratch root.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from results_io import write_result  # noqa: E402

MODES = ("embedded-threads", "embedded-dask", "persistent-threads", "persistent-dask")


def scratch_root(base: Path, profile: str) -> Path:
    base.mkdir(parents=True)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["profile"] = profile
    (base / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    (base / "tasks").symlink_to(REPO / "tasks", target_is_directory=True)
    return base


def base_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    bin_dir = Path(sys.executable).parent
    env.update(REPRO_ROOT=str(root), PREFECT_HOME=str(root / ".prefect"), PYTHONPATH=str(REPO),
               MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", PATH=f"{bin_dir}{os.pathsep}{env['PATH']}")
    return env


def start_persistent_server(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 240
    import urllib.request

    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return server, url
        except OSError:
            time.sleep(1)
    server.kill()
    raise RuntimeError("the persistent Prefect server did not start")


def processes_of(root: Path, exclude: set[int]) -> list[str]:
    found = []
    for process in psutil.process_iter():
        try:
            if (process.pid not in exclude and process.status() != psutil.STATUS_ZOMBIE
                    and process.environ().get("REPRO_ROOT") == str(root)):
                found.append(" ".join(process.cmdline())[:160])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def flow_run_states(prefect_home: Path, slug: str) -> list[str]:
    with sqlite3.connect(f"file:{prefect_home / 'prefect.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT flow_run.state_type FROM flow_run JOIN flow ON flow.id = flow_run.flow_id "
                          "WHERE flow.name = ?", (slug,)).fetchall()
    return [state for (state,) in rows]


def measure(mode: str, args: argparse.Namespace, work: Path) -> dict:
    server_kind, runner = mode.split("-")
    root = scratch_root(work / mode, args.profile)
    env = base_env(root)
    server = None
    if server_kind == "persistent":
        server, env["PREFECT_API_URL"] = start_persistent_server(env)
    seeds = ["--seeds", *map(str, args.seeds)]
    stage = [sys.executable, "-m", "flows.stage", args.slug, *seeds, "--profile", args.profile]
    try:
        data = subprocess.run([*stage, "--phase", "data"], cwd=root, env=env, capture_output=True, text=True)
        if data.returncode:
            return {"error": f"data phase failed: {data.stderr[-1000:]}"}
        run = subprocess.Popen([*stage, "--phase", "train", "--runner", runner], cwd=root, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(run.stdout.readline, "")), daemon=True)
        reader.start()
        deadline = time.monotonic() + 900
        while not any(f"[{args.slug}] train seed" in line for line in lines):
            if run.poll() is not None or time.monotonic() > deadline:
                return {"error": "the run ended or stalled before training: " + "".join(lines[-20:])}
            time.sleep(0.2)
        time.sleep(args.into_training)
        if run.poll() is not None:
            return {"error": "the run ended before the signal: " + "".join(lines[-20:])}
        sent = time.monotonic()
        os.killpg(run.pid, signal.Signals[args.signal])
        try:
            run.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait()
        stopped_after = time.monotonic() - sent
        reader.join(timeout=5)
        time.sleep(5)
        output = "".join(lines)
        after = output.split(f"{args.signal}: stopping")[-1] if f"{args.signal}: stopping" in output else output
        return {"seconds_to_exit": round(stopped_after, 2), "exit_status": run.returncode,
                "left_alive_after_5s": processes_of(root, {server.pid} if server else set()),
                "flow_run_states": flow_run_states(root / ".prefect", args.slug),
                "lines_after_stopping": len(after.strip().splitlines()),
                "tracebacks_after_stopping": after.count("Traceback")}
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slug", default="arm_ebm")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--into-training", type=float, default=30.0)
    parser.add_argument("--signal", default="SIGINT", choices=["SIGINT", "SIGTERM", "SIGHUP"])
    parser.add_argument("--modes", nargs="+", default=list(MODES[:3]), choices=MODES)
    args = parser.parse_args()
    # Launched in the background (`cmd &`, nohup), this process ignores SIGINT/SIGHUP and its runs would inherit
    # that (an ignored signal stays ignored): the runs must see the signal as a terminal's Ctrl-C delivers it.
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    with tempfile.TemporaryDirectory(prefix="interrupt-stop-") as tmp:
        results = {mode: measure(mode, args, Path(tmp)) for mode in args.modes}
    write_result(f"interrupt_stop_{args.profile}", {"slug": args.slug, "profile": args.profile, "seeds": args.seeds,
                                                     "signal": args.signal, "into_training_s": args.into_training,
                                                     "modes": results})


if __name__ == "__main__":
    main()
