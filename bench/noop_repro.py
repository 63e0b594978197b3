"""Time of a no-op `dvc repro` (everything up to date) in this checkout, median of 3.

    python bench/noop_repro.py      (run after `make reproduce`)
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
    out_file = REPO / "bench" / "results" / "noop_repro.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
