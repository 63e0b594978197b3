"""One figure style for every paper; atomic PNG writes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import polars as pl

matplotlib.use("Agg")  # headless: CI and servers have no display
import matplotlib.pyplot as plt  # noqa: E402

from tasks.common.io import write_with  # noqa: E402

STYLE = {
    "figure.figsize": (5.0, 3.4),
    "figure.dpi": 110,
    "savefig.dpi": 130,
    "savefig.bbox": "tight",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "font.size": 9,
    "axes.titlesize": 10,
    "legend.fontsize": 8,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
}
PALETTE = ["#1b6ca8", "#d1495b", "#2e933c", "#edae49", "#6c4f9c", "#00798c", "#7f7f7f"]


def new_figure(ncols: int = 1, nrows: int = 1, width: float | None = None, height: float | None = None):
    plt.rcParams.update(STYLE)
    plt.rcParams["axes.prop_cycle"] = matplotlib.cycler(color=PALETTE)
    w, h = STYLE["figure.figsize"]
    return plt.subplots(nrows, ncols, figsize=(width or w * ncols, height or h * nrows), squeeze=False)


def save_figure(fig, path: str | Path) -> Path:
    write_with(path, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)
    return Path(path)


def write_plot_csv(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """A DVC plot source (CSV) from row dicts."""
    frame = pl.DataFrame(list(rows))
    return write_with(path, lambda tmp: frame.write_csv(tmp))
