"""Procedural episodes of covip: sprite identities with per-episode re-bound personal facts.

An identity is shape x colour x pattern (8 x 8 x 3 = 192). An episode holds K context identities, each
a 16x16 sprite followed by a dialogue ``NAME PLACE EVENT`` whose facts are drawn afresh per
episode (no identity has fixed facts), and a query: a 2x2 grid of 16x16 cells holding 1..max_present
context concepts, one hard distractor that shares exactly one of {shape, colour} with a context concept
and equals none, and blanks. The target caption lists ``NAME PLACE EVENT ;`` per present concept in
cell order. Each concept has three QAs (keyed PLACE -> NAME, NAME -> PLACE, NAME -> EVENT) with options
from the episode's other concepts plus D; absent concepts' QAs have answer D.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl
import torch

from tasks.common.io import write_parquet
from tasks.covip.config import CovipConfig, DataConfig
from tasks.covip.method import LETTERS, QA

N_SHAPES, N_COLOURS, N_PATTERNS = 8, 8, 3
N_IDENTITIES = N_SHAPES * N_COLOURS * N_PATTERNS
CELL = 16
GRID_CELLS = 4
BLANK, DISTRACTOR = -1, -2
SPECIALS = ("<pad>", "<eos>", ";", "<d>", "</d>", "<cap>")
PAD, EOS, SEP, DIALOGUE_OPEN, DIALOGUE_CLOSE, CAPTION = range(len(SPECIALS))
COLOURS = np.array([[1, 0.1, 0.1], [0.1, 0.9, 0.1], [0.2, 0.3, 1], [1, 1, 0.1], [1, 0.1, 1], [0.1, 1, 1],
                    [1, 0.55, 0.1], [0.95, 0.95, 0.95]], dtype=np.float32)
SPLITS = {"train": 0, "test": 1, "val": 2}


def identity(shape: int, colour: int, pattern: int) -> int:
    return (shape * N_COLOURS + colour) * N_PATTERNS + pattern


def attributes(ident: int) -> tuple[int, int, int]:
    """(shape, colour, pattern) of an identity."""
    return ident // (N_COLOURS * N_PATTERNS), (ident // N_PATTERNS) % N_COLOURS, ident % N_PATTERNS


class Vocab:
    """Word <-> id: the special tokens, then n0.., p0.., e0.."""

    def __init__(self, data: DataConfig) -> None:
        self.words = [*SPECIALS, *(f"n{i}" for i in range(data.n_names)), *(f"p{i}" for i in range(data.n_places)),
                      *(f"e{i}" for i in range(data.n_events))]
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def ids(self, words: list[str]) -> list[int]:
        return [self.index[w] for w in words]

    def decode(self, ids: list[int]) -> list[str]:
        """Words up to the first EOS (pads dropped)."""
        out = []
        for i in ids:
            if i == EOS:
                break
            if i != PAD:
                out.append(self.words[i])
        return out


@dataclass(frozen=True)
class Episode:
    """One episode's specification; images are rendered from it (``render_seed``)."""

    identities: tuple[int, ...]
    names: tuple[int, ...]
    places: tuple[int, ...]
    events: tuple[int, ...]
    cells: tuple[int, ...]  # per query cell: context index, BLANK or DISTRACTOR
    distractor: int
    render_seed: int
    option_seed: int

    @property
    def present(self) -> list[int]:
        """Context indices in the query, in cell order."""
        return [c for c in self.cells if c >= 0]

    @property
    def absent(self) -> list[int]:
        return [k for k in range(len(self.identities)) if k not in self.cells]

    def facts(self, k: int) -> tuple[str, str, str]:
        return f"n{self.names[k]}", f"p{self.places[k]}", f"e{self.events[k]}"

    def dialogue(self, k: int) -> list[str]:
        """The dialogue turn after context image k: its facts (the ``<d>``/``</d>`` markers of the design are
        dropped at cpu to keep the image-to-fact distance at one position)."""
        return list(self.facts(k))

    def caption_of(self, concepts: list[int]) -> list[str]:
        """``NAME PLACE EVENT ;`` per concept."""
        return [w for k in concepts for w in (*self.facts(k), ";")]

    @property
    def target_caption(self) -> list[str]:
        return self.caption_of(self.present)


def make_episode(rng: np.random.Generator, data: DataConfig) -> Episode:
    k = data.n_context
    idents = rng.choice(N_IDENTITIES, size=k, replace=False)
    n_present = int(rng.integers(1, data.max_present + 1))
    present = rng.choice(k, size=n_present, replace=False)
    attrs = [attributes(int(i)) for i in idents]
    while True:  # a hard distractor: shares exactly one of {shape, colour} with a context concept
        anchor = attrs[int(rng.integers(k))]
        keep_shape = bool(rng.integers(2))
        shape = anchor[0] if keep_shape else int(rng.integers(N_SHAPES))
        colour = int(rng.integers(N_COLOURS)) if keep_shape else anchor[1]
        candidate = (shape, colour)
        if all(candidate != a[:2] for a in attrs):
            break
    distractor = identity(shape, colour, int(rng.integers(N_PATTERNS)))
    slots = rng.permutation(GRID_CELLS)
    cells = [BLANK] * GRID_CELLS
    for slot, concept in zip(slots, [*present.tolist(), DISTRACTOR]):
        cells[int(slot)] = int(concept)
    return Episode(tuple(int(i) for i in idents), tuple(int(i) for i in rng.choice(data.n_names, k, replace=False)),
                   tuple(int(i) for i in rng.choice(data.n_places, k, replace=False)),
                   tuple(int(i) for i in rng.choice(data.n_events, k, replace=False)),
                   tuple(cells), int(distractor), int(rng.integers(2**31)), int(rng.integers(2**31)))


def episodes(data: DataConfig, seed: int, split: str, n: int) -> list[Episode]:
    rng = np.random.default_rng([seed, SPLITS[split]])
    return [make_episode(rng, data) for _ in range(n)]


def qas(episode: Episode) -> tuple[list[QA], list[QA]]:
    """Present-concept and absent-concept QAs (three per concept: PLACE->NAME, NAME->PLACE, NAME->EVENT);
    the two wrong options are other context concepts' values, shuffled with ``option_seed``."""
    rng = np.random.default_rng(episode.option_seed)
    present, absent = [], []
    k = len(episode.identities)
    for c in range(k):
        name, place, event = episode.facts(c)
        others = [o for o in range(k) if o != c]
        for key_field, key, target_field, index in (("place", place, "name", 0), ("name", name, "place", 1),
                                                    ("name", name, "event", 2)):
            wrong = [episode.facts(int(o))[index] for o in rng.choice(others, size=2, replace=False)]
            options = [episode.facts(c)[index], *wrong]
            order = rng.permutation(3)
            options = [options[int(i)] for i in order]
            answer = LETTERS[int(np.argmax(order == 0))] if c in episode.cells else "D"
            qa = QA(key_field, key, target_field, tuple(options), answer, c)
            (present if c in episode.cells else absent).append(qa)
    return present, absent


# ----------------------------------------------------------------------------- rendering


def _shape_mask(shape: int) -> np.ndarray:
    """12x12 boolean mask of one of 8 shapes (circle, square, triangle, diamond, star, cross, hexagon, ring)."""
    y, x = np.mgrid[-1:1:12j, -1:1:12j]
    r, theta = np.hypot(x, y), np.arctan2(y, x)
    masks = [r < 0.95, np.maximum(abs(x), abs(y)) < 0.75, (y > -0.8) & (abs(x) < (0.9 - y) * 0.55) & (y < 0.9),
             abs(x) + abs(y) < 1.0, r < 0.5 + 0.45 * np.cos(5 * theta) ** 2, (abs(x) < 0.3) | (abs(y) < 0.3),
             (abs(x) < 0.9) & (abs(x) * 0.5 + abs(y) * 0.87 < 0.85), (r < 0.95) & (r > 0.55)]
    return masks[shape]


_MASKS = [_shape_mask(s) for s in range(N_SHAPES)]


def _template(ident: int) -> np.ndarray:
    """(3, 12, 12) sprite of an identity: the shape mask in the colour, modulated by the pattern."""
    shape, colour, pattern = attributes(ident)
    yy, xx = np.mgrid[0:12, 0:12]
    modulation = {0: np.ones((12, 12)), 1: np.where(yy % 4 < 2, 1.0, 0.35),
                  2: np.where((yy // 2 + xx // 2) % 2 == 0, 1.0, 0.35)}[pattern]
    return (_MASKS[shape][None] * modulation[None] * COLOURS[colour][:, None, None]).astype(np.float32)


_TEMPLATES = np.stack([_template(i) for i in range(N_IDENTITIES)])


def render_sprites(idents: np.ndarray, rng: np.random.Generator, jitter: int, noise_sd: float) -> np.ndarray:
    """(n, 3, 16, 16) float32 cells: each identity's template shifted by up to ``jitter`` pixels (an
    identity < 0 is a blank cell), plus Gaussian noise."""
    idents = np.asarray(idents)
    out = np.zeros((len(idents), 3, CELL, CELL), dtype=np.float32)
    shifts = rng.integers(-jitter, jitter + 1, size=(len(idents), 2)) if jitter else np.zeros((len(idents), 2), int)
    for row, (ident, (dy, dx)) in enumerate(zip(idents, shifts)):
        if ident >= 0:
            out[row, :, 2 + dy:14 + dy, 2 + dx:14 + dx] = _TEMPLATES[ident]
    if noise_sd:
        out += rng.normal(0, noise_sd, out.shape).astype(np.float32)
    return out


@dataclass
class EpisodeBatch:
    """Tensors of B episodes: context images (B, K, 3, 16, 16), dialogue ids (B, K, 5), query cells
    (B, 4, 3, 16, 16), target caption ids (B, L) right-padded with EOS then PAD, and its mask (B, L)."""

    context_images: torch.Tensor
    dialogue_ids: torch.Tensor
    query_cells: torch.Tensor
    caption_ids: torch.Tensor
    caption_mask: torch.Tensor

    def blinded(self) -> EpisodeBatch:
        """The blind control: query cells blanked (all zeros)."""
        return replace(self, query_cells=torch.zeros_like(self.query_cells))


def render_batch(batch: list[Episode], data: DataConfig, vocab: Vocab) -> EpisodeBatch:
    k = len(batch[0].identities)
    contexts, queries, dialogues, captions = [], [], [], []
    for ep in batch:
        rng = np.random.default_rng(ep.render_seed)
        cells = [-1 if c == BLANK else ep.distractor if c == DISTRACTOR else ep.identities[c] for c in ep.cells]
        sprites = render_sprites(np.array([*ep.identities, *cells]), rng, data.jitter, data.noise_sd)
        contexts.append(sprites[:k])
        queries.append(sprites[k:])
        dialogues.append([vocab.ids(ep.dialogue(j)) for j in range(k)])
        captions.append(vocab.ids(ep.target_caption) + [EOS])
    length = max(len(c) for c in captions)
    ids = torch.full((len(batch), length), PAD, dtype=torch.long)
    mask = torch.zeros((len(batch), length), dtype=torch.bool)
    for row, cap in enumerate(captions):
        ids[row, :len(cap)] = torch.tensor(cap)
        mask[row, :len(cap)] = True
    return EpisodeBatch(torch.from_numpy(np.stack(contexts)), torch.tensor(dialogues, dtype=torch.long),
                        torch.from_numpy(np.stack(queries)), ids, mask)


def swap_bindings(ep: Episode, shift: int = 1) -> Episode:
    """Binding swap: context image slot k now shows the identity of slot (k + shift) mod K; dialogues stay,
    the query is unchanged. A query cell showing old concept j now matches slot (j - shift) mod K, whose
    dialogue is the new truth."""
    k = len(ep.identities)
    idents = tuple(ep.identities[(s + shift) % k] for s in range(k))
    cells = tuple(c if c < 0 else (c - shift) % k for c in ep.cells)
    return replace(ep, identities=idents, cells=cells)


# ----------------------------------------------------------------------------- the data step

COLUMNS = ("identities", "names", "places", "events", "cells", "distractor", "render_seed", "option_seed")


def to_frame(eps: list[Episode]) -> pl.DataFrame:
    return pl.DataFrame({c: [list(getattr(e, c)) if isinstance(getattr(e, c), tuple) else getattr(e, c)
                             for e in eps] for c in COLUMNS})


def from_frame(frame: pl.DataFrame) -> list[Episode]:
    rows = frame.to_dicts()
    return [Episode(*(tuple(r[c]) if isinstance(r[c], list) else r[c] for c in COLUMNS)) for r in rows]


def write_data(cfg: CovipConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Episode specifications per seed (train, validation for early stopping, test); images are rendered
    from them on load. The paper profile reads its benchmark from the hub instead (``hub.py``)."""
    if cfg.data is None:
        return []
    written = []
    for seed in seeds:
        for split, n in (("train", cfg.data.n_train), ("val", cfg.sft.n_val), ("test", cfg.data.n_test)):
            written.append(write_parquet(to_frame(episodes(cfg.data, seed, split, n)),
                                         Path(data_dir) / f"{split}_seed{seed}.parquet"))
    return written


def load_episodes(data_dir: Path, split: str, seed: int) -> list[Episode]:
    return from_frame(pl.read_parquet(Path(data_dir) / f"{split}_seed{seed}.parquet"))
