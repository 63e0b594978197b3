"""Data of the coda experiment.

smoke / cpu: six procedural, irregularly sampled stand-ins for "LTC applications" (README, "Data"):
four forecasting tasks (Lotka-Volterra, Lorenz-63 with a 10-step free-run horizon, Van der Pol with a control
input, Bergman's minimal glucose-insulin model with meal and insulin inputs) and two classification tasks
(three noisy oscillator regimes, an occupancy-like thresholded sensor label). Elapsed times
Delta_k ~ U[dt_low, dt_high], logged on a ``dt_resolution`` grid. Every sequence has T steps; at step k the
model sees the observation of step k-1 (or the current reading, for classification), held inputs, and Delta_k.
The simulators integrate with 8 RK4 sub-steps per observation interval.

paper: also the tokenised text blocks of the LFM2 study (``hub.write_text_blocks``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from tasks.coda.config import TASKS, CodaConfig, DataConfig
from tasks.common.io import write_parquet

SUBSTEPS = 8
FINGERPRINT_KEYS = ("n_train", "n_val", "n_test", "seq_len", "dt_low", "dt_high", "dt_resolution", "noise",
                    "forecast_horizon")


@dataclass(frozen=True)
class TaskArrays:
    """One task's standardised arrays. ``targets``: (n, T, d_out) for forecasting, (n,) labels otherwise."""

    name: str
    kind: str  # "forecast" | "classify"
    inputs: np.ndarray  # (n, T, d_in) float32, the last feature is the scaled elapsed time
    dt: np.ndarray  # (n, T) float32, elapsed time before each step
    targets: np.ndarray
    mask: np.ndarray  # (n, T) float32: which steps the forecasting loss scores
    split: np.ndarray  # (n,) "train" | "val" | "test"
    n_outputs: int  # output dim (forecast) or number of classes


# ------------------------------------------------------------------------------------------------
# Simulation helpers
# ------------------------------------------------------------------------------------------------

def sample_dt(cfg: DataConfig, rng: np.random.Generator, n: int) -> np.ndarray:
    raw = rng.uniform(cfg.dt_low, cfg.dt_high, size=(n, cfg.seq_len))
    return np.clip(np.round(raw / cfg.dt_resolution) * cfg.dt_resolution, cfg.dt_low, cfg.dt_high)


def simulate(rhs: Callable[[np.ndarray, np.ndarray], np.ndarray], x0: np.ndarray, dt: np.ndarray,
             controls: np.ndarray | None = None) -> np.ndarray:
    """States at t_0 and after each interval: (n, T + 1, dim). ``controls`` (n, T, c) are held per interval."""
    n, steps = dt.shape
    states = [x0]
    x = x0
    for k in range(steps):
        h = (dt[:, k] / SUBSTEPS)[:, None]
        u = controls[:, k] if controls is not None else np.zeros((n, 0))
        for _ in range(SUBSTEPS):
            k1 = rhs(x, u)
            k2 = rhs(x + 0.5 * h * k1, u)
            k3 = rhs(x + 0.5 * h * k2, u)
            k4 = rhs(x + h * k3, u)
            x = x + h / 6.0 * (k1 + 2 * k2 + 2 * k3 + k4)
        states.append(x)
    return np.stack(states, axis=1)


def piecewise_pulses(rng: np.random.Generator, n: int, steps: int, rate: float, low: float, high: float,
                     length: int = 3) -> np.ndarray:
    """Held input levels: pulses of ``length`` intervals starting with probability ``rate`` per interval."""
    out = np.zeros((n, steps))
    starts = rng.random((n, steps)) < rate
    amplitude = rng.uniform(low, high, size=(n, steps))
    for offset in range(length):
        out[:, offset:] += (starts * amplitude)[:, :steps - offset]
    return out


def dt_feature(cfg: DataConfig, dt: np.ndarray) -> np.ndarray:
    mid, half = (cfg.dt_high + cfg.dt_low) / 2, (cfg.dt_high - cfg.dt_low) / 2
    return ((dt - mid) / half)[..., None]


def noisy(rng: np.random.Generator, x: np.ndarray, scale: float) -> np.ndarray:
    return x + scale * rng.standard_normal(x.shape)


def forecast_task(cfg: DataConfig, rng: np.random.Generator, observed: np.ndarray, states: np.ndarray,
                  dt: np.ndarray, held: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Step k sees the noisy observation of t_{k-1} (plus held inputs and Delta_k) and predicts the state at t_k."""
    scale = observed.std(axis=(0, 1), keepdims=True)
    obs = noisy(rng, observed[:, :-1], cfg.noise * scale)
    parts = [obs] + ([held] if held is not None else []) + [dt_feature(cfg, dt)]
    return {"inputs": np.concatenate(parts, axis=-1), "targets": states[:, 1:], "mask": np.ones(dt.shape)}


# ------------------------------------------------------------------------------------------------
# The six tasks
# ------------------------------------------------------------------------------------------------

def lotka_volterra(cfg: DataConfig, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    alpha, gamma = rng.uniform(1.5, 2.5, (2, n, 1))
    beta, delta = rng.uniform(1.0, 1.5, (2, n, 1))

    def rhs(x, _u):
        prey, predator = x[:, :1], x[:, 1:]
        return np.concatenate([alpha * prey - beta * prey * predator, delta * prey * predator - gamma * predator], 1)

    dt = sample_dt(cfg, rng, n)
    states = simulate(rhs, rng.uniform(0.5, 1.5, (n, 2)), dt)
    return forecast_task(cfg, rng, states, states, dt) | {"dt": dt}


def lorenz(cfg: DataConfig, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Lorenz-63 (sigma 10, rho 28, beta 8/3) on a time axis slowed 5x, started on the attractor; the last
    ``forecast_horizon`` steps are unobserved (zero input, flag 0) and only they are scored."""
    slow = 0.2

    def rhs(x, _u):
        a, b, c = x[:, :1], x[:, 1:2], x[:, 2:]
        return slow * np.concatenate([10.0 * (b - a), a * (28.0 - c) - b, a * b - 8.0 / 3.0 * c], 1)

    burn_in = np.full((n, 40), 0.25)
    start = simulate(rhs, rng.normal(0, 5, (n, 3)) + np.array([0, 0, 25.0]), burn_in)[:, -1]
    dt = sample_dt(cfg, rng, n)
    states = simulate(rhs, start, dt) / 10.0
    task = forecast_task(cfg, rng, states, states, dt)
    horizon = cfg.forecast_horizon
    observed_flag = np.ones((n, cfg.seq_len, 1))
    observed_flag[:, -horizon:] = 0.0
    inputs = task["inputs"].copy()
    inputs[:, -horizon:, :3] = 0.0
    mask = np.zeros((n, cfg.seq_len))
    mask[:, -horizon:] = 1.0
    inputs = np.concatenate([inputs[..., :3], observed_flag, inputs[..., 3:]], axis=-1)
    return task | {"inputs": inputs, "mask": mask, "dt": dt}


def van_der_pol(cfg: DataConfig, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """x'' = mu (1 - x^2) x' - x + u(t), time running 2x; only x is observed, u is a known held input."""
    mu = rng.uniform(0.5, 2.0, (n, 1))
    control = piecewise_pulses(rng, n, cfg.seq_len, rate=0.15, low=-1.5, high=1.5, length=4)[..., None]

    def rhs(x, u):
        pos, vel = x[:, :1], x[:, 1:]
        return 2.0 * np.concatenate([vel, mu * (1 - pos**2) * vel - pos + u], 1)

    dt = sample_dt(cfg, rng, n)
    states = simulate(rhs, rng.uniform(-2, 2, (n, 2)), dt, control)
    return forecast_task(cfg, rng, states[..., :1], states[..., :1], dt, held=control) | {"dt": dt}


def glucose_insulin(cfg: DataConfig, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Bergman's minimal model in scaled units (basal G = I = 1): G' = -p1 (G - 1) - X G + meal,
    X' = -p2 X + p3 (I - 1), I' = -n_i (I - 1) + insulin; CGM-like observation of G."""
    p1, p3 = rng.uniform(0.5, 1.5, (2, n, 1))
    p2 = rng.uniform(1.0, 2.0, (n, 1))
    clearance = rng.uniform(2.0, 4.0, (n, 1))
    meal = piecewise_pulses(rng, n, cfg.seq_len, rate=0.08, low=1.0, high=3.0)
    insulin = piecewise_pulses(rng, n, cfg.seq_len, rate=0.08, low=1.0, high=4.0, length=2)
    held = np.stack([meal, insulin], axis=-1)

    def rhs(x, u):
        g, x_act, i = x[:, :1], x[:, 1:2], x[:, 2:]
        return np.concatenate([-p1 * (g - 1) - x_act * g + u[:, :1], -p2 * x_act + p3 * (i - 1),
                               -clearance * (i - 1) + u[:, 1:]], 1)

    dt = sample_dt(cfg, rng, n)
    x0 = np.concatenate([rng.uniform(0.8, 1.6, (n, 1)), np.zeros((n, 1)), rng.uniform(0.8, 1.4, (n, 1))], 1)
    states = simulate(rhs, x0, dt, held)
    return forecast_task(cfg, rng, states[..., :1], states[..., :1], dt, held=held) | {"dt": dt}


def oscillator_regimes(cfg: DataConfig, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Three classes, gesture-like: harmonic, damped, and saturated (square-like) oscillations, noisy."""
    dt = sample_dt(cfg, rng, n)
    t = np.cumsum(dt, axis=1)
    labels = rng.integers(0, 3, n)
    omega = rng.uniform(2.0, 3.0, (n, 1))
    phase = rng.uniform(0, 2 * np.pi, (n, 1))
    amplitude = rng.uniform(0.7, 1.3, (n, 1))
    decay = rng.uniform(0.4, 0.8, (n, 1))
    wave = np.sin(omega * t + phase)
    signal = np.select([labels[:, None] == 0, labels[:, None] == 1],
                       [wave, np.exp(-decay * t) * wave], np.tanh(3.0 * wave))
    observed = noisy(rng, amplitude * signal, 5 * cfg.noise)[..., None]
    return {"inputs": np.concatenate([observed, dt_feature(cfg, dt)], -1), "targets": labels,
            "mask": np.ones(dt.shape), "dt": dt}


def occupancy(cfg: DataConfig, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Latent occupancy switches at rate 0.5; light follows it, CO2 low-passes it (tau 1), temperature slowly
    (tau 3), humidity is a distractor random walk. Label: the latent CO2 level at the last step > 0.5."""
    dt = sample_dt(cfg, rng, n)
    occupied = np.empty((n, cfg.seq_len))
    state = rng.random(n) < 0.5
    for k in range(cfg.seq_len):
        state = np.where(rng.random(n) < 1 - np.exp(-0.5 * dt[:, k]), ~state, state)
        occupied[:, k] = state

    def rhs(x, u):
        return np.concatenate([(u - x[:, :1]) / 1.0, (u - x[:, 1:]) / 3.0], 1)

    latent = simulate(rhs, rng.uniform(0, 1, (n, 2)), dt, occupied[..., None])[:, 1:]
    humidity = np.cumsum(0.1 * rng.standard_normal((n, cfg.seq_len)), axis=1)
    sensors = np.stack([noisy(rng, occupied, 10 * cfg.noise), noisy(rng, latent[..., 0], 10 * cfg.noise),
                        noisy(rng, latent[..., 1], 5 * cfg.noise), humidity], axis=-1)
    labels = (latent[:, -1, 0] > 0.5).astype(np.int64)
    return {"inputs": np.concatenate([sensors, dt_feature(cfg, dt)], -1), "targets": labels,
            "mask": np.ones(dt.shape), "dt": dt}


GENERATORS: dict[str, Callable[[DataConfig, np.random.Generator, int], dict[str, np.ndarray]]] = {
    "lotka_volterra": lotka_volterra, "lorenz": lorenz, "van_der_pol": van_der_pol,
    "glucose_insulin": glucose_insulin, "oscillator_regimes": oscillator_regimes, "occupancy": occupancy,
}
CLASSIFICATION = {"oscillator_regimes": 3, "occupancy": 2}


def standardise(raw: dict[str, np.ndarray], n_train: int, kind: str) -> dict[str, np.ndarray]:
    """Inputs (except the elapsed-time feature) and forecasting targets to zero mean, unit variance, with the
    statistics of the training sequences only."""
    out = dict(raw)
    inputs = raw["inputs"].copy()
    mean = inputs[:n_train, :, :-1].mean(axis=(0, 1))
    std = inputs[:n_train, :, :-1].std(axis=(0, 1)) + 1e-6
    inputs[..., :-1] = (inputs[..., :-1] - mean) / std
    out["inputs"] = inputs
    if kind == "forecast":
        targets = raw["targets"]
        t_mean, t_std = targets[:n_train].mean(axis=(0, 1)), targets[:n_train].std(axis=(0, 1)) + 1e-6
        out["targets"] = (targets - t_mean) / t_std
    return out


def make_task(cfg: DataConfig, name: str, seed: int) -> TaskArrays:
    rng = np.random.default_rng([seed, TASKS.index(name)])
    n = cfg.n_train + cfg.n_val + cfg.n_test
    kind = "classify" if name in CLASSIFICATION else "forecast"
    arrays = standardise(GENERATORS[name](cfg, rng, n), cfg.n_train, kind)
    targets = arrays["targets"]
    return TaskArrays(
        name=name, kind=kind, inputs=arrays["inputs"].astype(np.float32), dt=arrays["dt"].astype(np.float32),
        targets=targets.astype(np.int64 if kind == "classify" else np.float32), mask=arrays["mask"].astype(np.float32),
        split=np.array(["train"] * cfg.n_train + ["val"] * cfg.n_val + ["test"] * cfg.n_test),
        n_outputs=CLASSIFICATION.get(name, targets.shape[-1] if kind == "forecast" else 0))


# ------------------------------------------------------------------------------------------------
# Parquet round trip, with the data config stored so a stale directory is caught
# ------------------------------------------------------------------------------------------------

def task_path(data_dir: Path, name: str, seed: int) -> Path:
    return Path(data_dir) / f"{name}_seed{seed}.parquet"


def task_frame(cfg: DataConfig, task: TaskArrays) -> pl.DataFrame:
    n = len(task.split)
    columns: dict[str, object] = {
        "split": task.split, "dt": task.dt, "inputs": task.inputs.reshape(n, -1), "mask": task.mask,
        "kind": [task.kind] * n, "n_outputs": [task.n_outputs] * n, "d_in": [task.inputs.shape[-1]] * n,
    }
    columns["targets"] = task.targets if task.kind == "classify" else task.targets.reshape(n, -1)
    for key in FINGERPRINT_KEYS:
        columns[f"cfg_{key}"] = [getattr(cfg, key)] * n
    return pl.DataFrame(columns)


def write_task(cfg: DataConfig, name: str, seed: int, data_dir: Path) -> Path:
    return write_parquet(task_frame(cfg, make_task(cfg, name, seed)), task_path(data_dir, name, seed))


def read_task(cfg: DataConfig, name: str, seed: int, data_dir: Path) -> TaskArrays:
    """Read one task and check that it was written with this data config (naming the key that differs)."""
    path = task_path(data_dir, name, seed)
    if not path.exists():
        raise FileNotFoundError(f"coda.data: {path} is missing; run the data phase first")
    frame = pl.read_parquet(path)
    for key in FINGERPRINT_KEYS:
        stored = frame[f"cfg_{key}"][0]
        expected = getattr(cfg, key)
        if stored != expected:
            raise ValueError(f"coda.data.{key}: {path.name} was written with {stored!r}, the config says "
                             f"{expected!r}; rerun the data phase")
    n, steps = frame.height, cfg.seq_len
    kind = frame["kind"][0]
    d_in = frame["d_in"][0]
    targets = frame["targets"].to_numpy()
    return TaskArrays(
        name=name, kind=kind, inputs=frame["inputs"].to_numpy().reshape(n, steps, d_in).astype(np.float32),
        dt=frame["dt"].to_numpy().astype(np.float32),
        targets=targets.astype(np.int64) if kind == "classify" else targets.reshape(n, steps, -1).astype(np.float32),
        mask=frame["mask"].to_numpy().astype(np.float32), split=frame["split"].to_numpy(),
        n_outputs=int(frame["n_outputs"][0]))


def write_data(cfg: CodaConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Data phase: every task for every seed (each seed draws its own sequences); at the paper profile also
    the tokenised text blocks of the LFM study, shared by every seed."""
    paths = [write_task(cfg.data, name, seed, Path(data_dir)) for seed in seeds for name in cfg.data.tasks]
    if cfg.lfm is not None:
        from tasks.coda import hub

        paths += hub.write_text_blocks(cfg.lfm, Path(data_dir))
    return paths
