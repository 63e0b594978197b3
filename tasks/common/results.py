"""The shape of what a paper's ``experiment.run_seed`` returns (see tasks/common/paper_flow.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# {"seed": int, "metrics": {name: float}, "curves": {name: [float]}, "tables": {name: [row dict]}}
SeedResult = dict[str, Any]
# progress(fraction in [0, 1], message): the flow turns it into a Prefect progress artifact.
Progress = Callable[[float, str], None]
