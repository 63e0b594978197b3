"""Benchmarks of the certificate_pruning experiment (procedural, numpy; no Hugging Face data is needed,
the paper profile uses the same functions at larger budgets and dimensions).

Every benchmark is turned into a *maximisation* problem on [0, 1]^d rescaled to [0, 1]:
g(u) = (f_worst - f(x(u))) / (f_worst - f_best), with f_best the known minimum and f_worst the
largest of the offline samples, so g(x*) = 1 and the simple regret is 1 - g(x_hat). The Lipschitz
constant of g in cube coordinates is estimated offline (max slope over random samples x 1.2, README.md),
here from forward-difference gradient norms at ``lipschitz_samples`` uniform points.

- needle2d: a flat plateau 0 with a cone of height 1 and radius ``width`` (L = 1 / width); its centre
  is drawn per seed in [0.15, 0.85]^2, so a coarse grid misses it.
- branin, hartmann3, hartmann6, rosenbrock<d>, levy<d>, ackley<d>: the standard test functions
  (Surjanovic & Bingham's library definitions and domains).
- svm: 3-fold cross-validated accuracy of an RBF SVC on (a subsample of) scikit-learn's bundled
  ``load_digits``, tabulated on a (log10 C, log10 gamma) grid and bilinearly interpolated. Tabulating
  is the project's budget choice: one evaluation costs ~40 ms, too much for 7 methods x T queries.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tasks.certificate_pruning.config import CertificatePruningConfig
from tasks.common.io import read_json, write_json, write_parquet

# ------------------------------------------------------------------------------------------------
# Test functions (minimisation form, original coordinates, vectorised over rows)
# ------------------------------------------------------------------------------------------------

HARTMANN3_A = np.array([[3.0, 10, 30], [0.1, 10, 35], [3.0, 10, 30], [0.1, 10, 35]])
HARTMANN3_P = 1e-4 * np.array([[3689, 1170, 2673], [4699, 4387, 7470], [1091, 8732, 5547], [381, 5743, 8828]])
HARTMANN6_A = np.array([[10, 3, 17, 3.5, 1.7, 8], [0.05, 10, 17, 0.1, 8, 14], [3, 3.5, 1.7, 10, 17, 8],
                        [17, 8, 0.05, 10, 0.1, 14]])
HARTMANN6_P = 1e-4 * np.array([[1312, 1696, 5569, 124, 8283, 5886], [2329, 4135, 8307, 3736, 1004, 9991],
                               [2348, 1451, 3522, 2883, 3047, 6650], [4047, 8828, 8732, 5743, 1091, 381]])
HARTMANN_ALPHA = np.array([1.0, 1.2, 3.0, 3.2])


def branin(x: np.ndarray) -> np.ndarray:
    x1, x2 = x[:, 0], x[:, 1]
    b, c = 5.1 / (4 * np.pi**2), 5 / np.pi
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - 1 / (8 * np.pi)) * np.cos(x1) + 10


def hartmann(x: np.ndarray, a: np.ndarray, p: np.ndarray) -> np.ndarray:
    inner = np.sum(a[None] * (x[:, None, :] - p[None]) ** 2, axis=2)
    return -np.sum(HARTMANN_ALPHA[None] * np.exp(-inner), axis=1)


def rosenbrock(x: np.ndarray) -> np.ndarray:
    return np.sum(100 * (x[:, 1:] - x[:, :-1] ** 2) ** 2 + (x[:, :-1] - 1) ** 2, axis=1)


def levy(x: np.ndarray) -> np.ndarray:
    w = 1 + (x - 1) / 4
    middle = np.sum((w[:, :-1] - 1) ** 2 * (1 + 10 * np.sin(np.pi * w[:, :-1] + 1) ** 2), axis=1)
    return (np.sin(np.pi * w[:, 0]) ** 2 + middle
            + (w[:, -1] - 1) ** 2 * (1 + np.sin(2 * np.pi * w[:, -1]) ** 2))


def ackley(x: np.ndarray) -> np.ndarray:
    d = x.shape[1]
    return (-20 * np.exp(-0.2 * np.sqrt(np.sum(x**2, axis=1) / d))
            - np.exp(np.sum(np.cos(2 * np.pi * x), axis=1) / d) + 20 + np.e)


@dataclass(frozen=True)
class AnalyticFunction:
    """A minimisation test function on a box with its known minimiser."""

    dim: int
    low: np.ndarray
    high: np.ndarray
    fn: Callable[[np.ndarray], np.ndarray]
    x_min: np.ndarray  # one global minimiser, original coordinates

    @property
    def f_best(self) -> float:
        return float(self.fn(self.x_min[None])[0])


def analytic_function(name: str) -> AnalyticFunction:
    """The analytic benchmarks by name: branin, hartmann3, hartmann6, rosenbrock<d>, levy<d>, ackley<d>."""
    if name == "branin":
        return AnalyticFunction(2, np.array([-5.0, 0.0]), np.array([10.0, 15.0]), branin, np.array([np.pi, 2.275]))
    if name == "hartmann3":
        return AnalyticFunction(3, np.zeros(3), np.ones(3), lambda x: hartmann(x, HARTMANN3_A, HARTMANN3_P),
                            np.array([0.114614, 0.555649, 0.852547]))
    if name == "hartmann6":
        return AnalyticFunction(6, np.zeros(6), np.ones(6), lambda x: hartmann(x, HARTMANN6_A, HARTMANN6_P),
                            np.array([0.20169, 0.150011, 0.476874, 0.275332, 0.311652, 0.6573]))
    match = re.fullmatch(r"(rosenbrock|levy|ackley)(\d+)", name)
    if match:
        family, dim = match.group(1), int(match.group(2))
        half = {"rosenbrock": 2.048, "levy": 10.0, "ackley": 32.768}[family]
        fn = {"rosenbrock": rosenbrock, "levy": levy, "ackley": ackley}[family]
        x_min = np.zeros(dim) if family == "ackley" else np.ones(dim)
        return AnalyticFunction(dim, np.full(dim, -half), np.full(dim, half), fn, x_min)
    raise ValueError(f"unknown test function {name!r}")


FUNCTION_NAME = re.compile(r"^(needle2d|branin|hartmann3|hartmann6|svm|(rosenbrock|levy|ackley)([2-9]|[1-9]\d+))$")


def function_dim(name: str) -> int:
    if not FUNCTION_NAME.fullmatch(name):
        raise ValueError(f"unknown benchmark {name!r}")
    if name in ("needle2d", "svm"):
        return 2
    return analytic_function(name).dim


# ------------------------------------------------------------------------------------------------
# Rescaled benchmark on the unit cube
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Benchmark:
    """g: [0, 1]^d -> about [0, 1], maximised at ``x_star`` (cube coordinates) with g(x_star) = 1."""

    name: str
    dim: int
    value: Callable[[np.ndarray], np.ndarray]  # noise-free g on rows of cube points
    x_star: np.ndarray
    lipschitz: float

    def noisy(self, noise_sd: float, rng: np.random.Generator) -> Callable[[np.ndarray], float]:
        return lambda u: float(self.value(np.atleast_2d(u))[0] + noise_sd * rng.standard_normal())

    def regret(self, x: np.ndarray) -> float:
        return float(1.0 - self.value(np.atleast_2d(x))[0])


def needle_value(centre: np.ndarray, width: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda u: np.maximum(0.0, 1.0 - np.linalg.norm(u - centre, axis=1) / width)


def needle_centre(seed: int) -> np.ndarray:
    return np.random.default_rng([seed, 2]).uniform(0.15, 0.85, size=2)


def shifted_box(fn: AnalyticFunction, name: str, seed: int, max_shift: float = 0.15) -> tuple[np.ndarray, np.ndarray]:
    """The search box of one seed. Ackley, Levy and Rosenbrock boxes are translated by up to 15% of
    their side per coordinate, so that x* is not the box centre: HOO, DIRECT and other centre-sampling
    methods would otherwise hit Ackley's optimum with their first query (a benchmark artifact)."""
    if not re.fullmatch(r"(rosenbrock|levy|ackley)\d+", name):
        return fn.low, fn.high
    shift = np.random.default_rng([seed, 3]).uniform(-max_shift, max_shift, size=fn.dim) * (fn.high - fn.low)
    return fn.low + shift, fn.high + shift


def rescaled(fn: Callable[[np.ndarray], np.ndarray], low: np.ndarray, high: np.ndarray, f_best: float,
             f_worst: float) -> Callable[[np.ndarray], np.ndarray]:
    span = f_worst - f_best
    return lambda u: (f_worst - fn(low + u * (high - low))) / span


def estimate_lipschitz(value: Callable[[np.ndarray], np.ndarray], dim: int, n_samples: int, safety: float,
                       rng: np.random.Generator, step: float = 1e-6) -> float:
    """safety x the largest forward-difference gradient norm at ``n_samples`` uniform points."""
    largest = 0.0
    for chunk in np.array_split(rng.random((n_samples, dim)) * (1 - step), max(1, n_samples // 8192)):
        base = value(chunk)
        grads = np.stack([(value(chunk + step * np.eye(dim)[k]) - base) / step for k in range(dim)], axis=1)
        largest = max(largest, float(np.linalg.norm(grads, axis=1).max()))
    return safety * largest


# ------------------------------------------------------------------------------------------------
# SVM tuning table
# ------------------------------------------------------------------------------------------------


def svm_accuracy_table(grid_size: int, n_samples: int, folds: int, log10_c: tuple[float, float],
                       log10_gamma: tuple[float, float], seed: int = 0) -> pl.DataFrame:
    """k-fold CV accuracy of SVC(C, gamma) on a fixed random subsample of load_digits, on a grid."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import KFold, cross_val_score
    from sklearn.svm import SVC

    x, y = load_digits(return_X_y=True)
    idx = np.random.default_rng(seed).permutation(len(x))[:n_samples]
    x, y = x[idx] / 16.0, y[idx]
    cv = KFold(folds, shuffle=True, random_state=seed)
    rows = []
    for i, lc in enumerate(np.linspace(*log10_c, grid_size)):
        for j, lg in enumerate(np.linspace(*log10_gamma, grid_size)):
            acc = cross_val_score(SVC(C=10**lc, gamma=10**lg), x, y, cv=cv).mean()
            rows.append({"i": i, "j": j, "log10_c": float(lc), "log10_gamma": float(lg), "accuracy": float(acc)})
    return pl.DataFrame(rows)


def svm_surface(table: pl.DataFrame) -> tuple[Callable[[np.ndarray], np.ndarray], np.ndarray]:
    """Bilinear interpolation of the accuracy table on the unit square, rescaled to [0, 1]; and its
    maximiser (a grid node: a bilinear interpolant attains its maximum at a node)."""
    from scipy.interpolate import RegularGridInterpolator

    n = int(table["i"].max()) + 1
    acc = table.sort(["i", "j"])["accuracy"].to_numpy().reshape(n, n)
    scaled = (acc - acc.min()) / max(acc.max() - acc.min(), 1e-12)
    axis = np.linspace(0.0, 1.0, n)
    interp = RegularGridInterpolator((axis, axis), scaled, method="linear")
    best = np.unravel_index(int(np.argmax(scaled)), scaled.shape)
    return (lambda u: interp(np.clip(u, 0.0, 1.0))), np.array([axis[best[0]], axis[best[1]]])


# ------------------------------------------------------------------------------------------------
# The per-seed benchmark table (the data phase) and its reader
# ------------------------------------------------------------------------------------------------


def benchmark_rows(functions: list[str], seed: int, needle_width: float, lipschitz_samples: int,
                   lipschitz_safety: float, svm_table: pl.DataFrame | None) -> pl.DataFrame:
    """One row per function: dim, rescaling constants, x* (cube coordinates), L, needle centre."""
    rng = np.random.default_rng([seed, 1])
    rows = []
    for name in functions:
        row = {"name": name, "dim": function_dim(name), "f_best": None, "f_worst": None,
               "needle_width": None, "low": None, "high": None}
        if name == "needle2d":
            centre = needle_centre(seed)
            value = needle_value(centre, needle_width)
            x_star = centre
            row["needle_width"] = needle_width
        elif name == "svm":
            if svm_table is None:
                raise ValueError("svm: the accuracy table is required")
            value, x_star = svm_surface(svm_table)
        else:
            tf = analytic_function(name)
            low, high = shifted_box(tf, name, seed)
            samples = tf.fn(low + rng.random((lipschitz_samples, tf.dim)) * (high - low))
            row["f_best"], row["f_worst"] = tf.f_best, float(samples.max())
            row["low"], row["high"] = low.tolist(), high.tolist()
            value = rescaled(tf.fn, low, high, row["f_best"], row["f_worst"])
            x_star = (tf.x_min - low) / (high - low)
        row["x_star"] = [float(v) for v in x_star]
        row["lipschitz"] = estimate_lipschitz(value, row["dim"], lipschitz_samples, lipschitz_safety, rng)
        rows.append(row)
    return pl.DataFrame(rows, schema={"name": pl.String, "dim": pl.Int64, "f_best": pl.Float64,
                                      "f_worst": pl.Float64, "needle_width": pl.Float64,
                                      "low": pl.List(pl.Float64), "high": pl.List(pl.Float64),
                                      "x_star": pl.List(pl.Float64), "lipschitz": pl.Float64})


def benchmark_from_row(row: dict, svm_table: pl.DataFrame | None) -> Benchmark:
    name = row["name"]
    x_star = np.asarray(row["x_star"], dtype=float)
    if name == "needle2d":
        value = needle_value(x_star, row["needle_width"])
    elif name == "svm":
        if svm_table is None:
            raise ValueError("svm: the accuracy table is missing from the data directory")
        value, _ = svm_surface(svm_table)
    else:
        tf = analytic_function(name)
        value = rescaled(tf.fn, np.asarray(row["low"]), np.asarray(row["high"]), row["f_best"], row["f_worst"])
    return Benchmark(name, int(row["dim"]), value, x_star, float(row["lipschitz"]))


# ------------------------------------------------------------------------------------------------
# The data step: files of every seed, and the reader that checks them against the config
# ------------------------------------------------------------------------------------------------


def data_signature(cfg: CertificatePruningConfig) -> dict[str, Any]:
    """The config keys the data step depends on; ``load_benchmarks`` refuses data written for other values."""
    return {
        "functions": all_functions(cfg),
        "needle_width": cfg.needle_width,
        "lipschitz_samples": cfg.lipschitz_samples,
        "lipschitz_safety": cfg.lipschitz_safety,
        "svm": cfg.svm.model_dump(mode="json") if cfg.svm is not None else None,
    }


def all_functions(cfg: CertificatePruningConfig) -> list[str]:
    extra = cfg.trust_region.functions if cfg.trust_region is not None else []
    return list(dict.fromkeys([*cfg.functions, *extra]))


def write_data(cfg: CertificatePruningConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Per seed: the benchmark table (rescaling constants, x*, offline L, needle centre); once: the SVM
    accuracy table (seed-independent) and a manifest of the data-relevant config."""
    data_dir = Path(data_dir)
    written = []
    svm_table = None
    if cfg.svm is not None:
        s = cfg.svm
        svm_table = svm_accuracy_table(s.grid_size, s.n_samples, s.folds, s.log10_c, s.log10_gamma)
        written.append(write_parquet(svm_table, data_dir / "svm_table.parquet"))
    for seed in seeds:
        rows = benchmark_rows(all_functions(cfg), seed, cfg.needle_width, cfg.lipschitz_samples,
                              cfg.lipschitz_safety, svm_table)
        written.append(write_parquet(rows, data_dir / f"benchmarks_seed{seed}.parquet"))
    written.append(write_json(data_dir / "manifest.json", data_signature(cfg) | {"seeds": list(seeds)}))
    return written


def load_benchmarks(cfg: CertificatePruningConfig, seed: int, data_dir: Path) -> dict[str, Benchmark]:
    """Benchmarks of one seed, after checking that the data directory was written for this config."""
    data_dir = Path(data_dir)
    manifest_path = data_dir / "manifest.json"
    if not manifest_path.exists():
        raise FileNotFoundError(f"data_dir: {manifest_path} not found: run the data phase first")
    manifest = read_json(manifest_path)
    for key, expected in data_signature(cfg).items():
        if manifest.get(key) != expected:
            raise ValueError(f"certificate_pruning.{key}: the data in {data_dir} was written for "
                             f"{manifest.get(key)!r}, the config says {expected!r}: rerun the data phase")
    table_path = data_dir / f"benchmarks_seed{seed}.parquet"
    if not table_path.exists():
        raise FileNotFoundError(f"seeds: no data for seed {seed} in {data_dir}: rerun the data phase")
    svm_table = pl.read_parquet(data_dir / "svm_table.parquet") if cfg.svm is not None else None
    rows = pl.read_parquet(table_path).to_dicts()
    return {row["name"]: benchmark_from_row(row, svm_table) for row in rows}
