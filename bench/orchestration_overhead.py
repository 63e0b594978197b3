"""Orchestration overhead: arm_ebm through Prefect + MLflow vs the same functions called directly.

    python bench/orchestration_overhead.py --profile cpu      (writes bench/results/overhead_<profile>.json)

Both sides run in a fresh temporary root (no cache hits), the same seeds, the same thread pool
size and torch threads. The flow side runs `python -m flows.stage` as DVC would, with the
embedded Prefect server (its start-up is part of the overhead) or PREFECT_API_URL if set.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from results_io import write_result  # noqa: E402


def direct(profile: str, seeds: list[int], root: Path) -> float:
    import torch

    from tasks.arm_ebm import experiment
    from tasks.common.params import resolve_run

    spec = resolve_run("arm_ebm", profile, seeds, REPO / "params.yaml")
    start = time.perf_counter()
    experiment.write_data(spec.config, spec.seeds, root / "data")
    from tasks.common.paper_flow import (
        WORKERS,  # the same parallelism as the flow
        torch_threads_per_worker,
    )

    torch.set_num_threads(torch_threads_per_worker(min(WORKERS, len(seeds))))
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        list(pool.map(lambda s: experiment.run_seed(spec.config, s, root / "data", root / "models"), spec.seeds))
    return time.perf_counter() - start


def orchestrated(profile: str, seeds: list[int], root: Path) -> float:
    root.mkdir(parents=True)
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    (root / "tasks").symlink_to(REPO / "tasks")
    env = dict(os.environ, REPRO_ROOT=str(root), PREFECT_HOME=str(root / ".prefect"),
               MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}", REPRO_MLARTIFACTS=str(root / "mla"))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "flows.stage", "arm_ebm", "--phase", "all", "--profile", profile,
                    "--seeds", *map(str, seeds)], cwd=REPO, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        flow_s = orchestrated(args.profile, args.seeds, Path(tmp) / "flow")
        print(f"through Prefect + MLflow: {flow_s:.1f} s", flush=True)
        direct_s = direct(args.profile, args.seeds, Path(tmp) / "direct")
    result = {"profile": args.profile, "seeds": args.seeds, "direct_s": round(direct_s, 1),
              "prefect_mlflow_s": round(flow_s, 1), "ratio": round(flow_s / direct_s, 3),
              "api": os.environ.get("PREFECT_API_URL", "embedded server")}
    write_result(f"overhead_{args.profile}", result)


if __name__ == "__main__":
    main()
