"""Mutation testing of one paper's `method.py` against that paper's unit tests (`make mutation`).

    python tools/mutation.py <slug> [<slug> ...]   # one or more papers
    python tools/mutation.py                       # every paper in params.yaml's `papers`
    python tools/mutation.py <slug> --retry        # reuse the last run, re-test its survivors and equivalents
    python tools/mutation.py <slug> --sample 150   # a seeded random sample of the mutants (score +- CI)
    python tools/mutation.py <slug> --functions 'kappa*' 'merge*'   # only mutants of these functions
    python tools/mutation.py <slug> --tests method exact  # only test_<slug>_method.py, test_<slug>_exact.py

Per paper, mutmut 3 mutates exactly `tasks/<slug>/method.py` and runs, per mutant, only the tests
of `tests/unit/test_<slug>_*.py` that call the mutated function. No per-paper setup: each paper gets
a scratch folder `.mutation/<slug>/` (git-ignored) holding a copy of pyproject.toml with a generated
`[tool.mutmut]` section and links to `tasks/`, `tests/`, `flows/` and the top-level files tests
read; mutmut copies them into `.mutation/<slug>/mutants/` and runs there, so papers never share
mutmut's cache and two papers can be mutated from two worktrees at once.

The score excludes the equivalent mutants listed in docs/testing.md, one per line, in the form
    - `tasks.<slug>.method.x_<function>__mutmut_<n>`: <one-line reason>
and counts killed, timeout, segfault and type-check catches as detected; survived, "no tests"
(a mutated function no test calls) and suspicious as not detected. Statements starting with
`raise` are not mutated: their mutants only change an error message or exception type.
With --sample the score is an estimate from the sampled mutants, given with its 95% Wilson interval.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SCRATCH = REPO / ".mutation"
EQUIVALENTS_DOC = REPO / "docs" / "testing.md"
# Everything a unit test may read relative to the repository root; mutmut copies these into mutants/
# (reports/: a few tests check committed outputs, e.g. coda's recorded lr choice).
LINKED = ["tasks", "tests", "flows", "reports", "params.yaml", "dvc.yaml"]
EQUIVALENT_LINE = re.compile(r"^\s*-\s*`(tasks\.(?P<slug>\w+)\.method\.\S+__mutmut_\d+)`\s*:\s*(?P<reason>\S.*)$")
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}
# mutmut's exit-code meaning (mutmut/stats.py), kept here so the summary does not import mutmut.
STATUS_BY_EXIT_CODE = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 2: "interrupted", None: "not checked",
                       33: "no tests", 34: "skipped", 35: "suspicious", 36: "timeout", 37: "caught by type check",
                       -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault"}


def papers() -> list[str]:
    return list(yaml.safe_load((REPO / "params.yaml").read_text())["papers"])


def test_files(slug: str, kinds: list[str] | None = None) -> list[str]:
    """tests/unit/test_<slug>_<kind>.py for each kind glob (default: every kind)."""
    found = {p for kind in (kinds or ["*"]) for p in (REPO / "tests" / "unit").glob(f"test_{slug}_{kind}.py")}
    return sorted(str(p.relative_to(REPO)) for p in found)


def equivalents(slug: str) -> dict[str, str]:
    """Mutant name -> reason, for `slug`, parsed from docs/testing.md."""
    if not EQUIVALENTS_DOC.exists():
        return {}
    found = {}
    for line in EQUIVALENTS_DOC.read_text().splitlines():
        match = EQUIVALENT_LINE.match(line)
        if match and match["slug"] == slug:
            found[match.group(1)] = match["reason"]
    return found


def mutmut_section(slug: str, timeout_multiplier: float, kinds: list[str] | None) -> str:
    tests = test_files(slug, kinds)
    return "\n".join([
        "",
        "[tool.mutmut]",
        f'source_paths = ["tasks/{slug}/method.py"]',
        f"also_copy = {json.dumps(LINKED)}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        # -p no:timeout: pytest-timeout's signal handler would turn mutmut's CPU-time limit into a failure
        # report instead of a timeout; mutmut enforces its own limit (timeout_multiplier x clean duration).
        'pytest_add_cli_args = ["-p", "no:timeout", "-W", "ignore"]',
        f"timeout_multiplier = {timeout_multiplier}",
        "timeout_constant = 10.0",
        # Error messages and exception types are not formulas: a mutated message is equivalent by construction.
        """do_not_mutate_patterns = ['^\\s*raise\\s']""",
        # Fork every mutant's worker from mutmut's fork server, never from its main process: the main process
        # runs the clean tests and the stats in-process, and a library that started a thread pool there (polars'
        # rayon pool: constrained_unlearning's data.py) leaves the forked worker waiting forever on a latch of a
        # thread that does not exist in the child (a false "timeout"). The fork server only imports and collects
        # the tests (collect warm-up), so no pool has started when it forks.
        'process_isolation = "forkserver"',
        'forkserver_warmup = "collect"',
        "use_git_change_detection = false",
        'on_dependency_change = "rerun"',
        "",
    ])


def prepare(slug: str, fresh: bool, kinds: list[str] | None = None) -> Path:
    if not (REPO / "tasks" / slug / "method.py").is_file():
        raise SystemExit(f"mutation: tasks/{slug}/method.py does not exist")
    if not test_files(slug, kinds):
        raise SystemExit(f"mutation: no unit tests tests/unit/test_{slug}_{{{','.join(kinds or ['*'])}}}.py")
    work = SCRATCH / slug
    if fresh and work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        link = work / name
        if (REPO / name).exists() and not link.is_symlink():
            link.symlink_to(REPO / name)
    # pytest inside mutants/ must see the project's pytest settings (markers, addopts), hence a full copy.
    # Timeout: mutmut's CPU-time limit is (wall time of the tests in the clean run + 10) x 2 x 2; the clean-run
    # times are wall times on a shared machine (upper bounds of CPU time), so x2 is generous and keeps a
    # mutant that loops (a bound mutated) from holding a worker for minutes. The +10 s covers pytest's own
    # start-up in each worker (collection, imports), which a +1 s constant did not: cheap tests then hit
    # the limit and counted as false timeouts (seen on order_sensitivity's full run).
    (work / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text() + mutmut_section(slug, 2.0, kinds))
    return work


def mutmut(work: Path, args: list[str]) -> int:
    env = dict(os.environ)
    # The tests must import the mutated copy in mutants/, never the checkout (PYTHONPATH would put it first).
    env.pop("PYTHONPATH", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # One thread per worker: mutmut's timeout is CPU time, and torch's intra-op threads would make a mutant's
    # CPU time exceed the wall time its tests took in the clean run (a false timeout).
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[name] = "1"
    return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=work, env=env).returncode


def mutant_names(work: Path, slug: str) -> list[str]:
    """Every mutant mutmut makes of the paper's method.py, without running anything."""
    script = ("import json\nfrom pathlib import Path\nfrom mutmut.mutation.file_mutation import mutate_file_contents\n"
              "from mutmut.utils.format_utils import get_mutant_name\n"
              f"path = Path('tasks/{slug}/method.py')\n"
              "names = mutate_file_contents(str(path), path.read_text()).mutant_names\n"
              "print(json.dumps(sorted({get_mutant_name(path, name) for name in names})))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", script], cwd=work, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"mutation: could not list the mutants of {slug}:\n{out.stderr}")
    return json.loads(out.stdout)


def select(names: list[str], functions: list[str], sample: int | None, slug: str) -> list[str]:
    """Mutants of the functions matching `functions` (fnmatch on the function name), then a seeded sample."""
    if functions:
        names = [n for n in names if any(fnmatch.fnmatch(function_of(n), pattern) for pattern in functions)]
        if not names:
            raise SystemExit(f"mutation: no mutant of {slug} in a function matching {functions}")
    if sample is not None and sample < len(names):
        names = sorted(random.Random(f"mutation-{slug}").sample(names, sample))
    return names


def function_of(mutant: str) -> str:
    return mutant.rpartition(".")[2].removeprefix("x_").rsplit("__mutmut_", 1)[0]


def wilson(detected: int, n: int) -> tuple[float, float]:
    if n == 0:
        return float("nan"), float("nan")
    z, p = 1.96, detected / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def statuses(work: Path, slug: str) -> dict[str, str]:
    meta = work / "mutants" / "tasks" / slug / "method.py.meta"
    if not meta.exists():
        raise SystemExit(f"mutation: mutmut wrote no results for {slug} ({meta} missing); see its output above")
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: STATUS_BY_EXIT_CODE.get(code, "suspicious") for name, code in codes.items()}


def diffs(work: Path, slug: str, names: list[str]) -> str:
    """`mutmut show` for each name, in one process run inside the scratch folder."""
    if not names:
        return ""
    script = ("import sys\nfrom pathlib import Path\nfrom mutmut.mutation.diff_apply import get_diff_for_mutant\n"
              f"for name in sys.argv[1:]:\n    print(get_diff_for_mutant(name, path=Path('tasks/{slug}/method.py')))\n"
              "    print()\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", script, *names], cwd=work, env=env, capture_output=True,
                          text=True).stdout


def summarise(slug: str, work: Path, seconds: float, selected: list[str] | None, sampled: bool) -> dict:
    generated = statuses(work, slug)
    wanted = set(selected) if selected is not None else set(generated)
    status = {name: s for name, s in generated.items() if name in wanted}
    equivalent = equivalents(slug)
    stale = sorted(name for name in equivalent if name not in generated)
    detected_but_listed = sorted(name for name in equivalent if status.get(name) in DETECTED)
    counted = {name: s for name, s in status.items() if name not in equivalent}
    counts = Counter(counted.values())
    detected = sum(counts[s] for s in DETECTED)
    survivors = {name: s for name, s in sorted(counted.items()) if s not in DETECTED}
    score = detected / len(counted) if counted else float("nan")
    # Conservative reading: a timeout may come from a slow machine rather than a looping mutant.
    killed_only = (detected - counts["timeout"]) / len(counted) if counted else float("nan")
    low, high = wilson(detected, len(counted))
    # Every mutant not detected, listed equivalents included: what RETRY re-tests (see retry_targets).
    undetected_all = sorted(name for name, s in status.items() if s not in DETECTED)
    summary = {"slug": slug, "generated": len(generated), "mutants": len(status), "sampled": sampled,
               "equivalent": sum(1 for name in equivalent if name in status), "interval95": [low, high],
               "counted": len(counted), "detected": detected, "counts": dict(counts), "score": score,
               "score_without_timeouts": killed_only,
               "seconds": round(seconds, 1), "survivors": survivors, "undetected_all": undetected_all,
               "stale_equivalents": stale,
               "detected_but_listed_equivalent": detected_but_listed}
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    (work / "survivors.diff").write_text(diffs(work, slug, list(survivors)))
    return summary


def print_summary(summary: dict) -> None:
    counts = summary["counts"]
    print(f"\n== mutation {summary['slug']}: {summary['detected']}/{summary['counted']} detected "
          f"= {100 * summary['score']:.1f}% (equivalent excluded: {summary['equivalent']}; "
          f"{summary['mutants']} of {summary['generated']} mutants tested) in {summary['seconds']:.0f} s")
    if summary["sampled"]:
        low, high = summary["interval95"]
        print(f"   sampled: 95% interval of the score {100 * low:.1f}% .. {100 * high:.1f}%")
    print("   " + ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))
          + f"; score counting timeouts as not detected: {100 * summary['score_without_timeouts']:.1f}%")
    if summary["survivors"]:
        print(f"   not detected ({len(summary['survivors'])}), diffs in .mutation/{summary['slug']}/survivors.diff:")
        for name, status in summary["survivors"].items():
            print(f"     {name}: {status}")
    for name in summary["stale_equivalents"]:
        print(f"   WARNING: docs/testing.md lists {name} as equivalent, but mutmut made no such mutant (stale)")
    for name in summary["detected_but_listed_equivalent"]:
        print(f"   WARNING: docs/testing.md lists {name} as equivalent, but the tests detect it: remove it")


def retry_targets(previous_summary: dict, listed_equivalent: set[str]) -> list[str]:
    """The mutants RETRY re-tests: the last run's survivors, every mutant it left undetected (listed equivalents
    included, so that one whose listing was removed since is not kept as a stale "survived"), and the mutants
    listed as equivalent now (an older summary without "undetected_all" still re-tests them)."""
    names = set(previous_summary.get("survivors", {})) | set(previous_summary.get("undetected_all", []))
    return sorted(names | listed_equivalent)


def run_paper(slug: str, retry: bool, jobs: int, functions: list[str], sample: int | None,
              kinds: list[str] | None = None) -> dict:
    work = prepare(slug, fresh=not retry, kinds=kinds)
    start = time.monotonic()
    previous = retry_targets(json.loads((work / "summary.json").read_text()), set(equivalents(slug))) if retry and (
        work / "summary.json").exists() else []
    selected = select(mutant_names(work, slug), functions, sample, slug) if functions or sample else None
    if selected is not None:
        print(f"mutation {slug}: testing {len(selected)} selected mutants")
    code = mutmut(work, ["run", "--max-children", str(jobs), *(selected or [])])
    if retry and previous and code == 0:
        # mutmut keeps a verdict until the mutated function changes; re-test the old survivors (and listed
        # equivalents, see retry_targets) explicitly so that new tests and removed listings count. Names that
        # no longer exist (method.py edited) were re-run above.
        alive = [name for name in previous if name in statuses(work, slug)]
        if alive:
            code = mutmut(work, ["run", "--max-children", str(jobs), *alive])
    if code != 0:
        raise SystemExit(f"mutation: mutmut failed for {slug} (exit {code}); see its output above")
    if selected is not None and previous:
        selected = sorted(set(selected) | set(previous))
    summary = summarise(slug, work, time.monotonic() - start, selected, sampled=sample is not None)
    summary["tests"] = test_files(slug, kinds)
    (work / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("slugs", nargs="*", help="papers to mutate (default: every paper in params.yaml)")
    parser.add_argument("--retry", action="store_true", help="keep the last run's results, re-test its survivors")
    parser.add_argument("--jobs", type=int, default=int(os.environ.get("MUTATION_JOBS", "2")),
                        help="mutants tested in parallel (default 2, env MUTATION_JOBS)")
    parser.add_argument("--sample", type=int, default=None, help="test a seeded random sample of this many mutants")
    parser.add_argument("--functions", nargs="+", default=[], help="only mutants of functions matching these globs")
    parser.add_argument("--tests", nargs="+", default=None, metavar="KIND",
                        help="only tests/unit/test_<slug>_<KIND>.py (globs, e.g. method exact); default all")
    args = parser.parse_args(argv)
    known = papers()
    unknown = [s for s in args.slugs if s not in known and not (REPO / "tasks" / s / "method.py").is_file()]
    if unknown:
        parser.error(f"unknown paper(s) {unknown}: not in params.yaml papers and no tasks/<slug>/method.py")
    results = [run_paper(slug, args.retry, args.jobs, args.functions, args.sample, args.tests)
               for slug in (args.slugs or known)]
    if len(results) > 1:
        print("\n| paper | detected / counted | score | equivalent | mutants | seconds |")
        print("|---|---|---|---|---|---|")
        for r in results:
            print(f"| {r['slug']} | {r['detected']} / {r['counted']} | {100 * r['score']:.1f}% | {r['equivalent']} "
                  f"| {r['mutants']} | {r['seconds']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
