"""Time of a no-op `dvc repro` (everything up to date) in this checkout, median of 3.

    python bench/noop_repro.py      (run after `make reproduce`)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from results_io import write_result  # noqa: E402


def main() -> None:
    dvc = str(Path(sys.executable).parent / "dvc")
    times = []
    for _ in range(3):
        start = time.perf_counter()
        out = subprocess.run([dvc, "repro"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        times.append(time.perf_counter() - start)
        if "Running stage" in out:
            raise SystemExit("dvc repro was not a no-op: run `make reproduce` first\n" + out)
    result = {"noop_dvc_repro_s": round(statistics.median(times), 2), "runs": [round(t, 2) for t in times]}
    write_result("noop_repro", result)


if __name__ == "__main__":
    main()
