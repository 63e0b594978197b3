"""Where benchmark scripts write their measurements: bench/results/<name>.json (git-ignored;
the numbers worth keeping go to docs/performance.md with the machine they came from)."""

from __future__ import annotations

import json
import platform
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(name: str, result: dict) -> Path:
    result = {**result, "machine": f"{platform.machine()}, {platform.python_version()}"}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result))
    return out
