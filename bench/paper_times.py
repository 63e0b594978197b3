"""Wall time of every paper's flow, per task runner, and the orchestration overhead, from one run.

    python bench/paper_times.py                         # every paper of params.yaml, cpu, threads + dask
    python bench/paper_times.py --profile smoke --papers arm_ebm coda --runners threads
    python bench/paper_times.py --direct                # also the same steps called without Prefect/MLflow
    python bench/paper_times.py --dvc-repro             # also a whole `dvc repro` of a fresh clone of HEAD

Each measurement starts from an empty output folder (no cache hit): `python -m flows.stage <slug>
--phase all --runner <runner>` with the paper's own seeds, against the Prefect server in
PREFECT_API_URL (start one with `repro server start`; an embedded server adds ~15 s per flow).
`--direct` runs data, train, evaluate and claim metrics of every seed on a thread pool of the flow's
size, with no Prefect, MLflow, figures or claims: flow / direct is the orchestration overhead.
`--dvc-repro` clones HEAD into a temporary folder and times `dvc repro` there from nothing (every paper of
`papers`, the report stage included): what `make reproduce` costs after the install.
Results: bench/results/paper_times_<profile>.json and a markdown table on stdout, with the projection to
the 19 papers of the project at the measured mean (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from results_io import write_result  # noqa: E402


def isolated_root(root: Path) -> dict[str, str]:
    """An output root that shares the code but nothing else (data, models, reports, stores)."""
    root.mkdir(parents=True)
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    (root / "tasks").symlink_to(REPO / "tasks")
    return dict(os.environ, REPRO_ROOT=str(root), MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}",
                REPRO_MLARTIFACTS=str(root / "mla"))


def children_cpu_seconds() -> float:
    """User + system CPU seconds of every finished child process so far (Dask workers included once they exit)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def flow_seconds(slug: str, profile: str, runner: str, root: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one paper's whole flow. The CPU seconds do not grow with other jobs on
    the machine, so on a loaded machine they bound what two idle cores would need: wall >= cpu / 2."""
    env = isolated_root(root)
    cpu_before = children_cpu_seconds()
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "flows.stage", slug, "--phase", "all", "--profile", profile,
                    "--runner", runner], cwd=REPO, env=env, check=True, capture_output=True)
    return time.perf_counter() - start, children_cpu_seconds() - cpu_before


def direct_seconds(slug: str, profile: str, root: Path) -> float:
    import torch

    from tasks.common.contract import load_paper
    from tasks.common.paper_flow import WORKERS, seed_dir, torch_threads_per_worker
    from tasks.common.params import resolve_run
    from tasks.common.results import no_progress

    spec = resolve_run(slug, profile, None, REPO / "params.yaml")
    paper = load_paper(slug)
    start = time.perf_counter()
    paper.write_data(spec.config, spec.seeds, root / "data")
    torch.set_num_threads(torch_threads_per_worker(min(WORKERS, len(spec.seeds))))

    def one_seed(seed: int) -> None:
        folder = seed_dir(root / "models", seed)
        result = paper.train(spec.config, seed, root / "data", folder, "cpu", no_progress)
        result = result.merged(paper.evaluate(spec.config, seed, root / "data", folder, "cpu", no_progress))
        paper.claim_metrics(spec.config, result)

    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        list(pool.map(one_seed, spec.seeds))
    return time.perf_counter() - start


PROJECT_PAPERS = 19  # the papers this project reproduces when complete (README)


def dvc_repro_seconds(profile: str, root: Path) -> float:
    """A whole `dvc repro` of a fresh clone of HEAD at ``profile`` (committed files only, empty caches)."""
    import yaml

    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(root)], check=True)
    params_file = root / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    if params["profile"] != profile:
        params_file.write_text(params_file.read_text().replace(f"profile: {params['profile']}",
                                                               f"profile: {profile}", 1))
    env = dict(os.environ, REPRO_ROOT=str(root))
    env.pop("MLFLOW_TRACKING_URI", None)
    start = time.perf_counter()
    subprocess.run([str(Path(sys.executable).parent / "dvc"), "repro", "--force"], cwd=root, env=env, check=True,
                   capture_output=True)
    return time.perf_counter() - start


def projection(rows: list[dict], column: str) -> dict[str, float]:
    """Mean per paper of ``column`` and that mean times the project's 19 papers, in minutes."""
    times = [r[column] for r in rows if column in r]
    mean = sum(times) / len(times) if times else float("nan")
    return {"mean_per_paper_s": round(mean, 1), "projected_19_papers_min": round(mean * PROJECT_PAPERS / 60, 1)}


def main() -> None:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--papers", nargs="+", default=None)
    parser.add_argument("--runners", nargs="+", default=["threads", "dask"], choices=["threads", "dask"])
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--dvc-repro", action="store_true", help="also time `dvc repro` of a fresh clone")
    args = parser.parse_args()
    papers = args.papers or yaml.safe_load((REPO / "params.yaml").read_text())["papers"]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for slug in papers:
            row = {"paper": slug}
            for runner in args.runners:
                wall, cpu = flow_seconds(slug, args.profile, runner, Path(tmp) / slug / runner)
                row[f"{runner}_s"], row[f"{runner}_cpu_s"] = round(wall, 1), round(cpu, 1)
                print(f"{slug}: {runner} {wall:.1f} s wall, {cpu:.1f} s CPU (load {os.getloadavg()[0]:.1f})",
                      flush=True)
            if args.direct:
                row["direct_s"] = round(direct_seconds(slug, args.profile, Path(tmp) / slug / "direct"), 1)
                row["overhead_ratio"] = round(row[f"{args.runners[0]}_s"] / row["direct_s"], 3)
            rows.append(row)
        whole = round(dvc_repro_seconds(args.profile, Path(tmp) / "clone"), 1) if args.dvc_repro else None
    columns = list(rows[0]) if rows else []
    print("\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row[c]) for c in columns) + " |")
    summary = projection(rows, f"{args.runners[0]}_s")
    print(f"\nmean {summary['mean_per_paper_s']} s per paper on {args.runners[0]}: "
          f"{summary['projected_19_papers_min']} min projected for {PROJECT_PAPERS} papers")
    if whole is not None:
        print(f"dvc repro of a fresh clone ({len(papers)} papers, report included): {whole} s")
    write_result(f"paper_times_{args.profile}", {"profile": args.profile, "rows": rows, **summary,
                                                  "dvc_repro_s": whole,
                                                  "api": os.environ.get("PREFECT_API_URL", "embedded server")})


if __name__ == "__main__":
    main()
