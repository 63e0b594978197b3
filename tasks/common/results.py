"""Typed results of one seed: what ``train`` and ``evaluate`` return (docs/adding_a_paper.md).

A ``SeedResult`` holds final metrics (floats), curves (lists of floats, e.g. a training loss per
step) and tables (lists of row dicts, e.g. a sweep). ``add`` collects them and ``stage`` times a
named step as ``seconds_<name>``, the one way papers time their work.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# progress(fraction in [0, 1], message): the flow turns it into a Prefect progress artifact and a log line.
Progress = Callable[[float, str], None]


def no_progress(fraction: float, message: str) -> None:
    """The default progress callback of library code run outside a flow."""


@dataclass
class SeedResult:
    """Measurements of one seed. Metrics are floats (NaN allowed, booleans become 0/1)."""

    seed: int
    metrics: dict[str, float] = field(default_factory=dict)
    curves: dict[str, list[float]] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def add(self, metrics: Mapping[str, float] | None = None, *, curves: Mapping[str, Sequence[float]] | None = None,
            tables: Mapping[str, Sequence[Mapping[str, Any]]] | None = None, **named: float) -> SeedResult:
        """Add metrics (a mapping and/or keywords), curves and tables; a name given twice is an error."""
        for name, value in {**(metrics or {}), **named}.items():
            self._put(self.metrics, name, _as_float(name, value))
        for name, values in (curves or {}).items():
            self._put(self.curves, name, [float(v) for v in values])
        for name, rows in (tables or {}).items():
            self._put(self.tables, name, [dict(r) for r in rows])
        return self

    @staticmethod
    def _put(store: dict, name: str, value: Any) -> None:
        if name in store:
            raise KeyError(f"result already holds {name!r}: two steps produce the same name")
        store[name] = value

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as metric ``seconds_<name>`` (wall clock, perf_counter)."""
        start = time.perf_counter()
        yield
        self.add({f"seconds_{name}": time.perf_counter() - start})

    def merged(self, other: SeedResult) -> SeedResult:
        """A new result with both results' entries (same seed; no name may appear in both)."""
        if other.seed != self.seed:
            raise ValueError(f"cannot merge results of seeds {self.seed} and {other.seed}")
        out = SeedResult(self.seed).add(self.metrics, curves=self.curves, tables=self.tables)
        return out.add(other.metrics, curves=other.curves, tables=other.tables)

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "metrics": dict(self.metrics), "curves": dict(self.curves),
                "tables": dict(self.tables)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SeedResult:
        return cls(int(data["seed"])).add(data.get("metrics", {}), curves=data.get("curves", {}),
                                          tables=data.get("tables", {}))


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric {name!r} must be a number, got {value!r}") from None
    return number if not math.isnan(number) else math.nan
