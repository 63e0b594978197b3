"""Time of `make test` on a fresh clone, install included (what CI pays).

    python bench/fresh_clone_test.py     (clones HEAD into a temporary folder; takes ~15-25 min)
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        start = time.perf_counter()
        install = subprocess.run(["make", "install"], cwd=clone, capture_output=True, text=True)
        install_s = time.perf_counter() - start
        test = subprocess.run(["make", "test"], cwd=clone, capture_output=True, text=True)
        total_s = time.perf_counter() - start
    tail = test.stdout.strip().splitlines()[-1:] if test.stdout else []
    result = {"install_s": round(install_s), "make_test_total_s": round(total_s),
              "suite_s": round(total_s - install_s), "returncode": [install.returncode, test.returncode],
              "summary": tail}
    out = REPO / "bench" / "results" / "fresh_clone_test.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
