"""Procedural reference-guided edit triplets of the cpu profile (exact ground truth).

A clip is T frames of S x S RGB: a static noisy low-saturation gradient background and two 5x5 sprites, one in
the left half and one in the right half (so they never overlap), each of its own shape (square, plus, diamond,
ring) and hue (continuous inside one of 6 coarse bins of 60 degrees, the two objects in different bins), each
moving vertically at its own speed. The edit recolours one object to an exact new hue in every frame; the
reference is the exactly edited first frame (the stand-in for FLUX.1 Kontext's edited frame). The instruction
names the object by position ("the left one") or by its coarse source colour ("the red one") and gives the new
colour as its coarse bin name or as "like the reference": the exact hue is only in the reference. Templates 0-4
are the DiT's training phrasings, 5-7 are held out (the VLM is pretrained on all eight). Pixels are uint8.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.io import write_parquet
from tasks.mive.config import MiveConfig

SPRITE = 5
SHAPES = ("square", "plus", "diamond", "ring")
BINS = ("red", "yellow", "green", "cyan", "blue", "magenta")
TEMPLATES = ("recolor the {d} {c}", "make the {d} {c}", "paint the {d} {c}", "turn the {d} {c}",
             "change the {d} to {c}", "the {d} should become {c}", "give the {d} a new colour {c}",
             "please colour the {d} {c}")
TRAIN_TEMPLATES = (0, 1, 2, 3, 4)
HELD_OUT_TEMPLATES = (5, 6, 7)
SIDES = ("left", "right")
SATURATION, VALUE = 0.9, 0.95
PAD, EOS = "<pad>", "<eos>"
MAX_WORDS = 10


def _vocabulary() -> tuple[str, ...]:
    words = {w for t in TEMPLATES for w in t.replace("{d}", "").replace("{c}", "").split()}
    words |= {"one", "like", "the", "reference", *SHAPES, *BINS, *SIDES}
    return (PAD, EOS, *sorted(words))


VOCAB = _vocabulary()
TOKEN = {w: i for i, w in enumerate(VOCAB)}


def sprite_masks() -> np.ndarray:
    """(4, 5, 5) boolean masks of the four shapes (distinct pixel counts: 25, 9, 13, 16)."""
    y, x = np.mgrid[:SPRITE, :SPRITE] - SPRITE // 2
    square = np.ones((SPRITE, SPRITE), bool)
    plus = (x == 0) | (y == 0)
    diamond = np.abs(x) + np.abs(y) <= 2
    ring = (np.abs(x) == 2) | (np.abs(y) == 2)
    return np.stack([square, plus, diamond, ring])


MASKS = sprite_masks()


def hsv_to_rgb(hue_deg: float) -> np.ndarray:
    """RGB in [0, 1] of a hue at the fixed saturation and value (same formula as method.hue_to_rgb)."""
    h = (hue_deg % 360.0) / 60.0
    c = VALUE * SATURATION
    k = np.array([(5 + h) % 6, (3 + h) % 6, (1 + h) % 6])
    return VALUE - c * np.clip(np.minimum(k, 4 - k), 0, 1)


def encode_words(text: str) -> list[int]:
    """Word ids right-padded with <pad> to MAX_WORDS."""
    ids = [TOKEN[w] for w in text.split()]
    if len(ids) > MAX_WORDS:
        raise ValueError(f"instruction {text!r} longer than {MAX_WORDS} words")
    return ids + [TOKEN[PAD]] * (MAX_WORDS - len(ids))


def make_clip(rng: np.random.Generator, frames: int, size: int, noise_sd: float, template: int) -> dict:
    """One edit triplet (source clip, instruction, reference, target clip) with its ground truth."""
    half = size // 2
    shapes = rng.choice(len(SHAPES), 2, replace=False)
    bins = rng.choice(len(BINS), 2, replace=False)
    hues = (bins * 60.0 + rng.uniform(-30, 30, 2)) % 360
    xs = np.array([rng.integers(0, half - SPRITE + 1), half + rng.integers(0, half - SPRITE + 1)])
    speeds = rng.choice([-2, -1, 1, 2], 2)
    span = np.abs(speeds) * (frames - 1)
    starts = np.array([rng.integers(0, size - SPRITE - s + 1) for s in span])
    starts = np.where(speeds < 0, starts + span, starts)
    target = int(rng.integers(2))
    new_bin = int(rng.choice([b for b in range(len(BINS)) if b != bins[target]]))
    new_hue = float((new_bin * 60.0 + rng.uniform(-30, 30)) % 360)

    yy, xx = np.mgrid[:size, :size] / size
    angle = rng.uniform(0, 2 * np.pi)
    ramp = 0.35 + 0.25 * (np.cos(angle) * xx + np.sin(angle) * yy)
    tint = rng.uniform(-0.05, 0.05, 3)
    background = ramp[..., None] + tint + noise_sd * rng.standard_normal((frames, size, size, 3))
    source = np.clip(background, 0, 1)
    masks = np.zeros((2, frames, size, size), bool)
    for k in range(2):
        for f in range(frames):
            y0 = starts[k] + speeds[k] * f
            masks[k, f, y0:y0 + SPRITE, xs[k]:xs[k] + SPRITE] = MASKS[shapes[k]]
    edited = source.copy()
    for k in range(2):
        source[masks[k]] = hsv_to_rgb(hues[k])
        edited[masks[k]] = hsv_to_rgb(new_hue if k == target else hues[k])
    source_u8 = np.round(source * 255).astype(np.uint8)
    target_u8 = np.round(edited * 255).astype(np.uint8)

    descriptor_kind = int(rng.integers(2))
    descriptor = (f"{SIDES[target]} one", f"{BINS[bins[target]]} one")[descriptor_kind]
    by_reference = bool(rng.integers(2))
    colour = "like the reference" if by_reference else BINS[new_bin]
    instruction = TEMPLATES[template].format(d=descriptor, c=colour)
    return {"source": source_u8.ravel(), "target": target_u8.ravel(), "masks": masks.ravel(),
            "instruction": instruction, "ids": encode_words(instruction),
            "template": template, "target_object": target, "descriptor_kind": descriptor_kind,
            "by_reference": by_reference, "new_hue": new_hue, "new_bin": new_bin,
            "source_hue_0": float(hues[0]), "source_hue_1": float(hues[1]),
            "shape_target": int(shapes[target]), "x_0": int(xs[0]), "x_1": int(xs[1])}


def make_split(rng: np.random.Generator, n: int, templates: tuple[int, ...], frames: int, size: int,
               noise_sd: float) -> pl.DataFrame:
    rows = [make_clip(rng, frames, size, noise_sd, int(rng.choice(templates))) for _ in range(n)]
    arrays = {k: np.stack([r.pop(k) for r in rows]) for k in ("source", "target", "masks")}
    frame = pl.DataFrame(rows)
    return frame.with_columns(pl.Series(k, v) for k, v in arrays.items())


def make_splits(cfg: MiveConfig, seed: int) -> dict[str, pl.DataFrame]:
    """``vlm`` (1 frame, all templates: VLM pretraining), ``train`` (templates 0-4), ``test`` (held-out 5-7)."""
    d = cfg.data
    rng = np.random.default_rng([seed, 30])
    every = tuple(range(len(TEMPLATES)))
    return {"vlm": make_split(rng, d.n_vlm, every, 1, d.image_size, d.noise_sd),
            "train": make_split(rng, d.n_train, TRAIN_TEMPLATES, d.frames, d.image_size, d.noise_sd),
            "test": make_split(rng, d.n_test, HELD_OUT_TEMPLATES, d.frames, d.image_size, d.noise_sd)}


def write_data(cfg: MiveConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    written = []
    for seed in seeds:
        for name, frame in make_splits(cfg, seed).items():
            written.append(write_parquet(frame, Path(data_dir) / f"{name}_seed{seed}.parquet"))
    return written


def load_split(data_dir: Path, name: str, seed: int) -> pl.DataFrame:
    return pl.read_parquet(Path(data_dir) / f"{name}_seed{seed}.parquet")


def clip_arrays(frame: pl.DataFrame, frames: int, size: int) -> dict[str, np.ndarray]:
    """Float arrays of a split: source/target ``(N, T, S, S, 3)`` in [0, 1], masks ``(N, 2, T, S, S)``,
    reference ``(N, S, S, 3)`` = the target's first frame, ids ``(N, MAX_WORDS)``."""
    n = frame.height
    shape = (n, frames, size, size, 3)
    source = frame["source"].to_numpy().astype(np.float32).reshape(shape) / 255
    target = frame["target"].to_numpy().astype(np.float32).reshape(shape) / 255
    masks = frame["masks"].to_numpy().astype(bool).reshape(n, 2, frames, size, size)
    return {"source": source, "target": target, "reference": target[:, 0], "masks": masks,
            "ids": np.asarray(frame["ids"].to_list(), np.int64)}


def caption_ids(frame: pl.DataFrame) -> np.ndarray:
    """VLM pretraining captions (edit semantics, phrase-invariant): [target side, new colour bin, <eos>]."""
    rows = zip(frame["target_object"].to_list(), frame["new_bin"].to_list(), strict=True)
    return np.array([[TOKEN[SIDES[t]], TOKEN[BINS[b]], TOKEN[EOS]] for t, b in rows])
