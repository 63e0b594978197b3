"""Procedural data of convex_gated_probing.

1. Synthetic sound-event clips: 10 classes (3 pure tones, up chirp, down chirp, harmonic stack, 4 Hz AM noise
   band, 20 Hz click train, 3-3.8 kHz noise burst, vibrato tone); each clip has 1-3 events of 0.1-0.4 s at random
   onsets over pink noise at a random SNR, so events are short and dispersed (the pooling bottleneck CGP's
   min/max pooling addresses). Multi-label targets. Clips go through ``method.log_mel_frontend`` and are stored as
   spectrograms, one unlabelled / train / test set per seed.
2. The planted-layer features (acceptance check (a)5): frozen features of L layers where class evidence sits
   only in one layer, in 1-2 random patch tokens per clip.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

from tasks.common.io import write_parquet
from tasks.convex_gated_probing.config import ConvexGatedProbingConfig, DataConfig, PlantedConfig
from tasks.convex_gated_probing.method import log_mel_frontend

CLASS_NAMES = ("tone_700", "tone_1000", "tone_1400", "chirp_up", "chirp_down", "harmonic_stack",
               "am_noise_4hz", "clicks_20hz", "noise_burst_3k", "vibrato")
N_CLASSES = len(CLASS_NAMES)
SPLITS = ("unlabelled", "train", "test")


def band_noise(rng: np.random.Generator, n: int, sample_rate: int, low: float, high: float) -> np.ndarray:
    """White noise band-limited to [low, high] Hz by zeroing FFT bins."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    freqs = np.fft.rfftfreq(n, 1 / sample_rate)
    spectrum[(freqs < low) | (freqs > high)] = 0
    return np.fft.irfft(spectrum, n)


def pink_noise(rng: np.random.Generator, n: int) -> np.ndarray:
    """1/f power noise (amplitude 1/sqrt(f)), unit RMS."""
    spectrum = np.fft.rfft(rng.standard_normal(n))
    spectrum[1:] /= np.sqrt(np.arange(1, spectrum.size))
    spectrum[0] = 0
    noise = np.fft.irfft(spectrum, n)
    return noise / noise.std()


def event(label: int, n: int, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """One event of class ``label``, n samples long, unit RMS, with a Hann envelope."""
    t = np.arange(n) / sample_rate
    duration = n / sample_rate
    if label < 3:
        x = np.sin(2 * np.pi * (700.0, 1000.0, 1400.0)[label] * t)
    elif label in (3, 4):
        f0, f1 = (300.0, 2500.0) if label == 3 else (2500.0, 300.0)
        x = np.sin(2 * np.pi * (f0 * t + (f1 - f0) * t**2 / (2 * duration)))
    elif label == 5:
        x = sum(np.sin(2 * np.pi * 250.0 * h * t) / h for h in range(1, 7))
    elif label == 6:
        x = band_noise(rng, n, sample_rate, 1000.0, 1500.0) * (1 + np.sin(2 * np.pi * 4.0 * t))
    elif label == 7:
        x = np.zeros(n)
        x[:: max(1, sample_rate // 20)] = 1.0
    elif label == 8:
        x = band_noise(rng, n, sample_rate, 3000.0, 3800.0)
    else:
        x = np.sin(2 * np.pi * (1200.0 * t + 100.0 / 6.0 * (1 - np.cos(2 * np.pi * 6.0 * t))))
    x = x * np.hanning(n)
    return x / max(float(np.sqrt(np.mean(x**2))), 1e-12)


def synth_clips(cfg: DataConfig, n_clips: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Waveforms (n, T) and multi-hot labels (n, 10)."""
    n_samples = int(round(cfg.sample_rate * cfg.clip_seconds))
    waves = np.empty((n_clips, n_samples), dtype=np.float32)
    labels = np.zeros((n_clips, N_CLASSES), dtype=np.float32)
    for i in range(n_clips):
        clip = pink_noise(rng, n_samples)
        for label in rng.choice(N_CLASSES, size=int(rng.integers(1, 4)), replace=False):
            length = int(rng.uniform(0.1, 0.4) * cfg.sample_rate)
            onset = int(rng.integers(0, n_samples - length))
            gain = 10 ** (rng.uniform(cfg.snr_db_low, cfg.snr_db_high) / 20)
            clip[onset:onset + length] += gain * event(int(label), length, cfg.sample_rate, rng)
            labels[i, label] = 1.0
        waves[i] = clip
    return waves, labels


def spectrograms(cfg: DataConfig, waves: np.ndarray) -> np.ndarray:
    """The BAT front end (``method.log_mel_frontend``) on a batch of waveforms."""
    spec = log_mel_frontend(torch.from_numpy(waves), cfg.sample_rate, cfg.n_fft, cfg.hop, cfg.n_mels, cfg.n_frames)
    return spec.numpy().astype(np.float32)


def make_splits(cfg: DataConfig, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng([seed, 2602_16305])
    sizes = {"unlabelled": cfg.n_unlabelled, "train": cfg.n_train, "test": cfg.n_test}
    out = {}
    for name in SPLITS:
        waves, labels = synth_clips(cfg, sizes[name], rng)
        out[name] = (spectrograms(cfg, waves), labels)
    return out


def write_data(cfg: ConvexGatedProbingConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    written = []
    for seed in seeds:
        for name, (spec, labels) in make_splits(cfg.data, seed).items():
            frame = pl.DataFrame({"spec": spec.reshape(spec.shape[0], -1), "labels": labels})
            written.append(write_parquet(frame, Path(data_dir) / f"{name}_seed{seed}.parquet"))
    return written


def load_split(cfg: DataConfig, data_dir: Path, name: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Spectrograms (n, frames, mels) and labels (n, 10) of one split."""
    frame = pl.read_parquet(Path(data_dir) / f"{name}_seed{seed}.parquet")
    spec = frame["spec"].to_numpy().reshape(-1, cfg.n_frames, cfg.n_mels)
    return torch.from_numpy(np.ascontiguousarray(spec, dtype=np.float32)), \
        torch.from_numpy(np.ascontiguousarray(frame["labels"].to_numpy(), dtype=np.float32))


def planted_layer_features(cfg: PlantedConfig, n_clips: int, rng: np.random.Generator
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Synthetic frozen features for the planted-layer test: patch (n, L, N, D), cls (n, L, D), labels (n, C).

    Every token of every layer is isotropic Gaussian noise. Each clip has 1-2 classes; for each, one random
    patch token of layer ``planted_layer`` (1-indexed) is replaced by signal * class direction + noise. The
    cls tokens carry no evidence, so a last-layer cls probe is at chance and only a probe that reads the
    planted layer's patch tokens can classify."""
    layers, tokens, dim = cfg.n_layers, cfg.n_tokens, cfg.dim
    directions = np.random.default_rng(0).standard_normal((cfg.n_classes, dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    patch = rng.standard_normal((n_clips, layers, tokens, dim)) / np.sqrt(dim)
    cls = rng.standard_normal((n_clips, layers, dim)) / np.sqrt(dim)
    labels = np.zeros((n_clips, cfg.n_classes), dtype=np.float32)
    for i in range(n_clips):
        classes = rng.choice(cfg.n_classes, size=int(rng.integers(1, 3)), replace=False)
        slots = rng.choice(tokens, size=classes.size, replace=False)
        for label, slot in zip(classes, slots, strict=True):
            patch[i, cfg.planted_layer - 1, slot] += cfg.signal * directions[label]
            labels[i, label] = 1.0
    return (torch.from_numpy(patch.astype(np.float32)), torch.from_numpy(cls.astype(np.float32)),
            torch.from_numpy(labels))
