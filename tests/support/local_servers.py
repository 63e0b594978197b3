"""Throwaway servers for pipeline tests: a PostgreSQL cluster and an ``mlflow server``.

Every server runs in its own process group bound to 127.0.0.1, logs to a file, and is stopped
(and its files removed) when its context manager exits, whatever happened inside.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as err:
        return f"<no log at {path}: {err}>"


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def stop_group(process: subprocess.Popen, sig: int = signal.SIGTERM, wait_s: float = 30.0) -> None:
    """Signal a process group started with ``start_new_session=True``; SIGKILL it if it lingers."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass
    # Children left behind in the group (server workers) go too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


def wait_until(ready: Callable[[], bool], process: subprocess.Popen, what: str, log: Path,
               timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode} before it was ready; "
                               f"log {log}:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} was not ready within {timeout_s:.0f} s; log {log}:\n{tail(log)}")
        time.sleep(0.5)


# --------------------------------------------------------------------------------------------
# PostgreSQL


def postgres_bin_dir() -> Path | None:
    """The newest Debian PostgreSQL server binaries (``/usr/lib/postgresql/<v>/bin``), or ``initdb``
    on PATH; ``None`` when PostgreSQL is not installed."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).resolve().parent if found else None


def _unprivileged_user() -> str | None:
    """PostgreSQL refuses to run as root: as root, run it as ``postgres`` (or ``nobody``)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return name
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL")


@contextlib.contextmanager
def postgres_cluster(database: str = "mlflow", timeout_s: float = 60.0) -> Iterator[str]:
    """A fresh PostgreSQL cluster on 127.0.0.1:<free port> with one database; yields its SQLAlchemy URI
    (``postgresql://repro@127.0.0.1:<port>/<database>``, trust authentication on loopback).

    SQLAlchemy 2.1 maps a plain ``postgresql://`` URI to the ``psycopg`` (version 3) driver, which is
    also what this helper connects with."""
    import psycopg

    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise FileNotFoundError("PostgreSQL server binaries (initdb, postgres) are not installed")
    user = _unprivileged_user()
    as_user = ["runuser", "-u", user, "--"] if user else []
    # A folder of its own under /tmp (pytest's tmp dirs are private to root, unreadable by 'postgres').
    base = Path(tempfile.mkdtemp(prefix="repro-pg-"))
    data, sockets, log = base / "data", base / "sock", base / "postgres.log"
    sockets.mkdir()
    log.touch()
    if user:
        entry = pwd.getpwnam(user)
        for path in (base, sockets, log):
            os.chown(path, entry.pw_uid, entry.pw_gid)
    process = None
    try:
        init = subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-U", "repro", "--auth=trust",
                               "-E", "UTF8", "--locale=C", "--no-sync"],
                              capture_output=True, text=True, timeout=120)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed ({init.returncode}):\n{init.stdout}\n{init.stderr}")
        port = free_port()
        # A throwaway cluster: durability settings off for speed, loopback only, sockets in our folder.
        with open(log, "ab") as handle:
            process = subprocess.Popen([*as_user, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port),
                                        "-k", str(sockets), "-c", "listen_addresses=127.0.0.1",
                                        "-c", "fsync=off", "-c", "synchronous_commit=off",
                                        "-c", "full_page_writes=off"],
                                       stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)

        def accepting() -> bool:
            try:
                psycopg.connect(host="127.0.0.1", port=port, user="repro", dbname="postgres",
                                connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                return False

        wait_until(accepting, process, "postgres", log, timeout_s)
        with psycopg.connect(host="127.0.0.1", port=port, user="repro", dbname="postgres",
                             autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{database}"')
        yield f"postgresql://repro@127.0.0.1:{port}/{database}"
    finally:
        if process is not None:
            if process.poll() is None:  # "fast" shutdown: roll back, close connections, exit
                subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "stop", "-m", "fast", "-w",
                                "-t", "30"], capture_output=True, timeout=60)
            stop_group(process, signal.SIGINT)
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# MLflow


@contextlib.contextmanager
def mlflow_server(command: list[str], log: Path, cwd: Path | None = None, env: dict[str, str] | None = None,
                  timeout_s: float = 180.0) -> Iterator[str]:
    """Run an ``mlflow server`` command line (from ``flows.servers.mlflow_ui_command``) and yield its
    base URL once ``/health`` answers; ``--port`` is read from the command.

    MLflow 3's job runner (seven ``huey`` consumer processes and a folder in /dev/shm, for GenAI
    judges) is turned off: the tests need none of it, and on two cores it slows everything down."""
    port = command[command.index("--port") + 1]
    env = dict(os.environ if env is None else env)
    env.setdefault("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
    url = f"http://127.0.0.1:{port}"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as handle:
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_until(lambda: http_ok(f"{url}/health"), process, "mlflow server", log, timeout_s)
        yield url
    finally:
        stop_group(process)


def port_free(port: int) -> bool:
    """Nothing listens on 127.0.0.1:<port> any more."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0
