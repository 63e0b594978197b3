"""Every claim's number of new_paper, derived from the measurements only (costs seconds to change)."""

from __future__ import annotations

from tasks.common.results import SeedResult
from tasks.new_paper.config import NewPaperConfig


def claim_metrics(cfg: NewPaperConfig, result: SeedResult) -> dict[str, float]:
    m = result.metrics
    return {"excess_risk": m["test_mse"] - m["noise_floor"],
            "gd_over_closed_form_risk": m["test_mse"] / m["closed_form_test_mse"]}
