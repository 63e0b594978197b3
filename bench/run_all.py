"""Run every benchmark (`make bench`); results land in bench/results/*.json and are summarised by
hand in docs/performance.md with the machine they were measured on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

for script in ("noop_repro.py", "paper_times.py", "fresh_clone_test.py"):
    subprocess.run([sys.executable, str(HERE / script)], check=True)
