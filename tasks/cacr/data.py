"""Procedural "instructional videos" of cacr (smoke/cpu profiles): consecutive steps of a coloured square
performing one motion, with direct, right-after / right-before and ordinal questions, each answered by exactly
one step. The design is the project's stand-in for the paper's instructional-video benchmarks (reconstructed).

A video is stored as its step list (object, action, start, end) and the square's start position; frames are
rendered deterministically from it (``render_video``), so the parquet files stay small.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from tasks.cacr.config import ACTIONS, OBJECTS, QUESTION_TYPES, CacrConfig, DataConfig
from tasks.common.io import write_parquet

COLOURS = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]], dtype=np.uint8) * 255
BASE_SIZE = 4
ORDINAL_WORDS = ("first", "second", "third")
# Question words: a relation word, then the object and action words of the referenced step.
RELATION_WORDS = ("when", "after", "before", *ORDINAL_WORDS)


@dataclass(frozen=True)
class Step:
    obj: int
    act: int
    start: int
    end: int  # inclusive


def step_lengths(rng: np.random.Generator, d: DataConfig) -> list[int]:
    """A random composition of ``frames`` into n in [min_steps, max_steps] parts in [min_step_len, max_step_len]."""
    feasible = [n for n in range(d.min_steps, d.max_steps + 1)
                if n * d.min_step_len <= d.frames <= n * d.max_step_len]
    n = int(rng.choice(feasible))
    lengths = np.full(n, d.min_step_len)
    for _ in range(d.frames - n * d.min_step_len):
        room = np.flatnonzero(lengths < d.max_step_len)
        lengths[rng.choice(room)] += 1
    return rng.permutation(lengths).tolist()


def make_video(rng: np.random.Generator, d: DataConfig) -> tuple[list[Step], int, int]:
    """Steps over a small palette (so steps share the object or the action); consecutive steps differ."""
    objs = rng.choice(len(OBJECTS), d.objects_per_video, replace=False)
    acts = rng.choice(len(ACTIONS), d.actions_per_video, replace=False)
    pairs = [(int(o), int(a)) for o in objs for a in acts]
    steps, start, previous = [], 0, None
    for length in step_lengths(rng, d):
        choices = [p for p in pairs if p != previous]
        previous = choices[rng.integers(len(choices))]
        steps.append(Step(previous[0], previous[1], start, start + length - 1))
        start += length
    return steps, int(rng.integers(d.image_size)), int(rng.integers(d.image_size))


def question_options(steps: list[Step]) -> list[dict]:
    """Every question with exactly one answer step: direct / after / before about a step whose (object, action)
    occurs once; ordinal ("the k-th time X") about an (object, action) that occurs at least twice."""
    occurrences: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(steps):
        occurrences.setdefault((s.obj, s.act), []).append(i)
    options = []
    for (obj, act), idx in occurrences.items():
        if len(idx) == 1:
            i = idx[0]
            options.append(dict(qtype="direct", relation="when", obj=obj, act=act, ref_step=i, answer_step=i))
            if i + 1 < len(steps):
                options.append(dict(qtype="after", relation="after", obj=obj, act=act, ref_step=i, answer_step=i + 1))
            if i > 0:
                options.append(dict(qtype="before", relation="before", obj=obj, act=act, ref_step=i, answer_step=i - 1))
        else:
            for k, i in enumerate(idx[:len(ORDINAL_WORDS)]):
                options.append(dict(qtype="ordinal", relation=ORDINAL_WORDS[k], obj=obj, act=act, ref_step=i,
                                    answer_step=i))
    return options


def make_questions(rng: np.random.Generator, steps: list[Step], count: int) -> list[dict]:
    """``count`` distinct questions: a type drawn uniformly among the feasible ones, then a question of it."""
    options = question_options(steps)
    chosen: list[dict] = []
    while len(chosen) < count and options:
        types = sorted({o["qtype"] for o in options}, key=QUESTION_TYPES.index)
        qtype = types[rng.integers(len(types))]
        pool = [o for o in options if o["qtype"] == qtype]
        pick = pool[rng.integers(len(pool))]
        options.remove(pick)
        answer = steps[pick["answer_step"]]
        chosen.append({**pick, "gt_start": answer.start, "gt_end": answer.end})
    return chosen


def make_split(cfg: CacrConfig, seed: int) -> dict[str, pl.DataFrame]:
    """Videos and questions of the train and test splits of one seed."""
    rng = np.random.default_rng([seed, 2606_08436])
    frames: dict[str, pl.DataFrame] = {}
    for split, n in (("train", cfg.data.n_train_videos), ("test", cfg.data.n_test_videos)):
        videos, questions = [], []
        for vid in range(n):
            steps, x0, y0 = make_video(rng, cfg.data)
            videos.append({"video": vid, "x0": x0, "y0": y0, "obj": [s.obj for s in steps],
                           "act": [s.act for s in steps], "start": [s.start for s in steps],
                           "end": [s.end for s in steps]})
            questions += [{"video": vid, **q} for q in make_questions(rng, steps, cfg.data.questions_per_video)]
        frames[f"{split}_videos"] = pl.DataFrame(videos)
        frames[f"{split}_questions"] = pl.DataFrame(questions)
    return frames


def write_data(cfg: CacrConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    written = []
    for seed in seeds:
        for name, frame in make_split(cfg, seed).items():
            written.append(write_parquet(frame, Path(data_dir) / f"{name}_seed{seed}.parquet"))
    return written


def load_split(data_dir: Path, split: str, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(videos, questions) of one split."""
    read = lambda name: pl.read_parquet(Path(data_dir) / f"{split}_{name}_seed{seed}.parquet")
    return read("videos"), read("questions")


def steps_of(video: dict) -> list[Step]:
    return [Step(o, a, s, e) for o, a, s, e in zip(video["obj"], video["act"], video["start"], video["end"])]


def render_video(steps: list[Step], x0: int, y0: int, image_size: int) -> np.ndarray:
    """(T, 3, S, S) uint8 frames: the square moves one pixel per frame (left/right/up/down, wrapping round the
    frame), grows through sizes 3-6 (grow), or shows on every other frame (blink); else it is still."""
    total = steps[-1].end + 1
    video = np.zeros((total, 3, image_size, image_size), dtype=np.uint8)
    x, y = x0, y0
    moves = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
    for step in steps:
        action = ACTIONS[step.act]
        for t in range(step.start, step.end + 1):
            local = t - step.start
            dx, dy = moves.get(action, (0, 0))
            x, y = (x + dx) % image_size, (y + dy) % image_size
            size = 3 + local % 4 if action == "grow" else BASE_SIZE
            if action == "blink" and local % 2:
                continue
            rows = (y + np.arange(size)) % image_size
            cols = (x + np.arange(size)) % image_size
            video[t][:, rows[:, None], cols[None, :]] = COLOURS[step.obj][:, None, None]
    return video


def frame_labels(steps: list[Step]) -> np.ndarray:
    """(T,) class of each frame's step, obj * len(ACTIONS) + act (the VLP's description index)."""
    labels = np.zeros(steps[-1].end + 1, dtype=np.int64)
    for s in steps:
        labels[s.start:s.end + 1] = s.obj * len(ACTIONS) + s.act
    return labels


def render_split(videos: pl.DataFrame, image_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, T, 3, S, S) uint8 frames and (N, T) frame labels of every video of a split."""
    rows = videos.to_dicts()
    frames = np.stack([render_video(steps_of(v), v["x0"], v["y0"], image_size) for v in rows])
    labels = np.stack([frame_labels(steps_of(v)) for v in rows])
    return frames, labels
