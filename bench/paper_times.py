"""Wall time of every paper's flow, per task runner, and the orchestration overhead, from one run.

    python bench/paper_times.py                         # every paper of params.yaml, cpu, threads + dask
    python bench/paper_times.py --profile smoke --papers arm_ebm coda --runners threads
    python bench/paper_times.py --direct                # also the same steps called without Prefect/MLflow
    python bench/paper_times.py --dvc-repro             # also a whole `dvc repro` of a fresh clone of HEAD
    python bench/paper_times.py --runners --dvc-repro   # only the `dvc repro`, with its per-stage times
    python bench/paper_times.py --from-log repro.log    # per-stage times of a `dvc repro` timed earlier

Each measurement starts from an empty output folder (no cache hit): `python -m flows.stage <slug>
--phase all --runner <runner>` with the paper's own seeds, against the Prefect server in
PREFECT_API_URL (start one with `repro server start`; an embedded server adds ~15 s per flow).
`--direct` runs data, train, evaluate and claim metrics of every seed on a thread pool of the flow's
size, with no Prefect, MLflow, figures or claims: flow / direct is the orchestration overhead.
`--dvc-repro` clones HEAD into a temporary folder and times `dvc repro` there from nothing (every paper of
`papers`, the report stage included): what `make reproduce` costs after the install. Each line DVC prints
is stamped with the time it arrived (bench/results/dvc_repro_<profile>.log, "<epoch seconds> <line>"), and
each stage's time runs from its "Running stage" line to the next one: the per-paper wall times inside the
whole reproduction, where papers run one after another as `make reproduce` runs them.
Results: bench/results/paper_times_<profile>.json and a markdown table on stdout, with the projection to
the 19 papers of the project at the measured mean (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import re
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

from results_io import RESULTS, write_result  # noqa: E402


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


STAGE_START = re.compile(r"Running stage '([^']+)'")


def stage_seconds(timed_lines: list[tuple[float, str]], end: float) -> dict[str, float]:
    """Wall seconds of each DVC stage, from its "Running stage" line to the next stage's (the last one to
    ``end``). DVC's own bookkeeping between two stages (hashing outputs, writing dvc.lock) counts to the
    stage before, which is where it is caused."""
    starts = [(t, m.group(1)) for t, line in timed_lines if (m := STAGE_START.search(line))]
    bounds = [t for t, _ in starts[1:]] + [end]
    return {name: round(stop - start, 1) for (start, name), stop in zip(starts, bounds, strict=True)}


def paper_phase_seconds(stages: dict[str, float]) -> dict[str, dict[str, float]]:
    """{paper: {data, train, evaluate, total}} from stage names ``<phase>-<paper>``; stages of another
    form (the report) are left out."""
    papers: dict[str, dict[str, float]] = {}
    for name, seconds in stages.items():
        phase, _, slug = name.partition("-")
        if phase in ("data", "train", "evaluate") and slug:
            papers.setdefault(slug, {})[phase] = seconds
    for phases in papers.values():
        phases["total"] = round(sum(phases.values()), 1)
    return papers


def read_timed_log(path: Path) -> tuple[list[tuple[float, str]], float]:
    """The lines of a log written as "<epoch seconds> <line>" and the time of its last line."""
    timed = []
    for raw in path.read_text().splitlines():
        stamp, _, line = raw.partition(" ")
        try:
            timed.append((float(stamp), line))
        except ValueError:  # a line without a stamp (a trailer such as "rc=0 wall=...")
            continue
    return timed, timed[-1][0] if timed else 0.0


def dvc_repro_seconds(profile: str, root: Path, log: Path) -> tuple[float, dict[str, float]]:
    """A whole `dvc repro` of a fresh clone of HEAD at ``profile`` (committed files only, empty caches):
    its wall seconds and each stage's, with every output line stamped into ``log``."""
    import yaml

    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(root)], check=True)
    params_file = root / "params.yaml"
    params = yaml.safe_load(params_file.read_text())
    if params["profile"] != profile:
        params_file.write_text(params_file.read_text().replace(f"profile: {params['profile']}",
                                                               f"profile: {profile}", 1))
    env = dict(os.environ, REPRO_ROOT=str(root))
    env.pop("MLFLOW_TRACKING_URI", None)
    timed: list[tuple[float, str]] = []
    start = time.perf_counter()
    with subprocess.Popen([str(Path(sys.executable).parent / "dvc"), "repro", "--force"], cwd=root, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process, \
            log.open("w") as stamped:
        for line in process.stdout:
            timed.append((time.time(), line.rstrip("\n")))
            stamped.write(f"{timed[-1][0]:.3f} {timed[-1][1]}\n")
    if process.returncode != 0:
        raise SystemExit(f"dvc repro failed (exit {process.returncode}); its output: {log}")
    return time.perf_counter() - start, stage_seconds(timed, time.time())


def projection(rows: list[dict], column: str) -> dict[str, float]:
    """Mean per paper of ``column`` and that mean times the project's 19 papers, in minutes."""
    times = [r[column] for r in rows if column in r]
    mean = sum(times) / len(times) if times else float("nan")
    return {"mean_per_paper_s": round(mean, 1), "projected_19_papers_min": round(mean * PROJECT_PAPERS / 60, 1)}


BUDGET_S = 180  # the per-paper cpu budget (docs/performance.md); up to 600 s with the reason in the README


def print_markdown(rows: list[dict]) -> None:
    columns = list(rows[0]) if rows else []
    print("\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")


def repro_rows(stages: dict[str, float]) -> list[dict]:
    """One row per paper of a timed `dvc repro`: its phases, total and whether it is within the budget."""
    return [{"paper": slug, **phases, "within_180_s": phases["total"] <= BUDGET_S}
            for slug, phases in paper_phase_seconds(stages).items()]


def report_repro(wall: float, stages: dict[str, float], papers: int) -> dict:
    rows = repro_rows(stages)
    print_markdown(rows)
    flows = round(sum(r["total"] for r in rows), 1)
    print(f"\ndvc repro ({papers} papers, report included): {wall:.1f} s = {wall / 60:.1f} min; "
          f"paper stages {flows} s; {sum(not r['within_180_s'] for r in rows)} papers over {BUDGET_S} s")
    return {"dvc_repro_s": round(wall, 1), "dvc_repro_stages": stages, "dvc_repro_papers": rows}


def main() -> None:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--papers", nargs="+", default=None)
    parser.add_argument("--runners", nargs="*", default=["threads", "dask"], choices=["threads", "dask"],
                        help="flow runners to time per paper; none with a bare --runners")
    parser.add_argument("--direct", action="store_true")
    parser.add_argument("--dvc-repro", action="store_true", help="also time `dvc repro` of a fresh clone")
    parser.add_argument("--from-log", type=Path, default=None,
                        help="only print the per-stage times of a stamped `dvc repro` log")
    args = parser.parse_args()
    if args.from_log is not None:
        timed, end = read_timed_log(args.from_log)
        stages = stage_seconds(timed, end)
        result = report_repro(end - timed[0][0], stages, len(paper_phase_seconds(stages)))
        write_result(f"dvc_repro_{args.profile}", {"profile": args.profile, "log": str(args.from_log), **result})
        return
    papers = args.papers or yaml.safe_load((REPO / "params.yaml").read_text())["papers"]
    rows = []
    repro: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for slug in papers if args.runners else []:
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
        if args.dvc_repro:
            RESULTS.mkdir(parents=True, exist_ok=True)
            wall, stages = dvc_repro_seconds(args.profile, Path(tmp) / "clone",
                                             RESULTS / f"dvc_repro_{args.profile}.log")
    summary = {}
    if rows:
        print_markdown(rows)
        summary = projection(rows, f"{args.runners[0]}_s")
        print(f"\nmean {summary['mean_per_paper_s']} s per paper on {args.runners[0]}: "
              f"{summary['projected_19_papers_min']} min projected for {PROJECT_PAPERS} papers")
    if args.dvc_repro:
        repro = report_repro(wall, stages, len(papers))
    write_result(f"paper_times_{args.profile}", {"profile": args.profile, "rows": rows, **summary, **repro,
                                                  "api": os.environ.get("PREFECT_API_URL", "embedded server")})


if __name__ == "__main__":
    main()
