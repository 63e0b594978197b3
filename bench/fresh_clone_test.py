"""Time of `make test` on a fresh clone, install included (what CI pays).

    python bench/fresh_clone_test.py     (clones HEAD into a temporary folder; takes ~15-25 min)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from results_io import write_result  # noqa: E402


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
    write_result("fresh_clone_test", result)


if __name__ == "__main__":
    main()
