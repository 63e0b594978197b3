"""The procedural omni-world of the cpu profile **[reconstructed]**: images, short videos, tone-word speech and
the request templates of the sessions. Everything is a deterministic function of a spec and a seed.

- image: 16 x 16 RGB, a 2 x 2 grid of 8 x 8 cells, each empty or holding one sprite (circle, square,
  triangle; red, green, blue) with a +-1 px offset, pixel noise; 1-4 sprites;
- video: 4 frames of 16 x 16, one 5 x 5 sprite moving 2 px per frame left, right, up or down;
- speech: each word is a 60 ms tone pair (DTMF-like) at 8 kHz plus noise; an utterance is its words in order;
- requests: paraphrase templates, split into the ones the controller trains on and held-out ones.
"""

from __future__ import annotations

import numpy as np

from tasks.llm_orchestration.method import COLOURS, DIRECTIONS, SHAPES

IMAGE_SIZE, CELL, FRAMES, SPRITE = 16, 8, 4, 5
SAMPLE_RATE, WORD_SAMPLES = 8000, 480
RGB = {"red": (1.0, 0.1, 0.1), "green": (0.1, 1.0, 0.1), "blue": (0.1, 0.1, 1.0)}
STEP = {"left": (0, -2), "right": (0, 2), "up": (-2, 0), "down": (2, 0)}
EMPTY = "empty"

COUNT_ATTRS = ("", *COLOURS, *SHAPES)
TEMPLATES = {
    "count": (["how many {a} objects are in the picture", "count the {a} objects in the picture",
               "what number of {a} objects does the picture show"],
              ["tell me how many {a} objects the picture has"]),
    "direction": (["which way is the object moving in the video", "what direction is the object moving in the video",
                   "which direction does the object in the video go"],
                  ["where is the object heading in the video"]),
    "followup_count": (["and how many {a} objects were in that picture", "also count the {a} objects in that picture"],
                       ["now tell me how many {a} objects that picture had"]),
    "followup_direction": (["and which way was the object moving in that video",
                            "also which direction did the object in that video go"],
                           ["now tell me where that video object was heading"]),
    "chat": (["hello there", "thank you very much", "how are you today"], ["good morning to you"]),
}
SPEAK_SUFFIX = (["out loud"], ["say it aloud"])


def vocabulary() -> list[str]:
    """Every word a request can contain (the ASR's and the controller's word vocabulary), sorted."""
    found = set()
    for train, held in (*TEMPLATES.values(), SPEAK_SUFFIX):
        for template in train + held:
            for attr in COUNT_ATTRS:
                found.update(template.format(a=attr).split())
    return sorted(found)


def _sprite_mask(shape: str) -> np.ndarray:
    yy, xx = np.mgrid[0:SPRITE, 0:SPRITE] - (SPRITE - 1) / 2
    if shape == "circle":
        return (yy**2 + xx**2) <= 4.5
    if shape == "square":
        return np.ones((SPRITE, SPRITE), dtype=bool)
    return np.abs(xx) <= (yy + 2.0) / 2.0  # triangle, apex up


def render_image(cells: list[str], rng: np.random.Generator, noise: float) -> np.ndarray:
    """(3, 16, 16) float32 image of ``cells`` (four ``"colour shape"`` or ``"empty"``), row-major cells."""
    image = np.zeros((3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    for index, cell in enumerate(cells):
        if cell == EMPTY:
            continue
        colour, shape = cell.split()
        top = (index // 2) * CELL + 1 + int(rng.integers(0, 3))
        left = (index % 2) * CELL + 1 + int(rng.integers(0, 3))
        mask = _sprite_mask(shape)
        for channel, value in enumerate(RGB[colour]):
            image[channel, top:top + SPRITE, left:left + SPRITE][mask] = value
    return image + noise * rng.standard_normal(image.shape).astype(np.float32)


def render_video(colour: str, shape: str, direction: str, rng: np.random.Generator, noise: float) -> np.ndarray:
    """(4, 3, 16, 16) float32 frames of one sprite moving 2 px per frame in ``direction``."""
    dy, dx = STEP[direction]
    span = IMAGE_SIZE - SPRITE
    lo_y, hi_y = max(0, -dy * (FRAMES - 1)), span - max(0, dy * (FRAMES - 1))
    lo_x, hi_x = max(0, -dx * (FRAMES - 1)), span - max(0, dx * (FRAMES - 1))
    y, x = int(rng.integers(lo_y, hi_y + 1)), int(rng.integers(lo_x, hi_x + 1))
    frames = np.zeros((FRAMES, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.float32)
    mask = _sprite_mask(shape)
    for t in range(FRAMES):
        for channel, value in enumerate(RGB[colour]):
            frames[t, channel, y + t * dy:y + t * dy + SPRITE, x + t * dx:x + t * dx + SPRITE][mask] = value
    return frames + noise * rng.standard_normal(frames.shape).astype(np.float32)


def word_tones(vocab: list[str]) -> dict[str, tuple[float, float]]:
    """A distinct (low, high) tone pair per word: lows 300-800 Hz, highs 1000-2800 Hz, 100 / 200 Hz apart."""
    lows = [300.0 + 100.0 * i for i in range(6)]
    highs = [1000.0 + 200.0 * j for j in range(10)]
    if len(vocab) > len(lows) * len(highs):
        raise ValueError(f"{len(vocab)} words exceed the {len(lows) * len(highs)} tone pairs")
    return {w: (lows[i % len(lows)], highs[i // len(lows)]) for i, w in enumerate(vocab)}


def render_speech(text: str, tones: dict[str, tuple[float, float]], rng: np.random.Generator,
                  noise: float) -> np.ndarray:
    """(n_words, 480) float32: one 60 ms frame per word, tone pair with random phase, +-10 Hz jitter, noise."""
    t = np.arange(WORD_SAMPLES) / SAMPLE_RATE
    frames = []
    for word in text.split():
        low, high = tones[word]
        jitter = rng.uniform(-10, 10, size=2)
        phase = rng.uniform(0, 2 * np.pi, size=2)
        wave = (np.sin(2 * np.pi * (low + jitter[0]) * t + phase[0])
                + np.sin(2 * np.pi * (high + jitter[1]) * t + phase[1]))
        frames.append(wave + noise * rng.standard_normal(WORD_SAMPLES))
    return np.asarray(frames, dtype=np.float32)


def spectrum(frames: np.ndarray) -> np.ndarray:
    """Magnitude spectrum per 60 ms frame, (n, 241), scaled by 1/sqrt(480)."""
    return (np.abs(np.fft.rfft(frames, axis=-1)) / np.sqrt(WORD_SAMPLES)).astype(np.float32)


def sample_cells(rng: np.random.Generator) -> list[str]:
    """Four cells with 1-4 sprites at random positions, random colour and shape each."""
    n = int(rng.integers(1, 5))
    occupied = set(rng.choice(4, size=n, replace=False).tolist())
    return [f"{COLOURS[rng.integers(3)]} {SHAPES[rng.integers(3)]}" if i in occupied else EMPTY for i in range(4)]


def sample_motion(rng: np.random.Generator) -> tuple[str, str, str]:
    return COLOURS[rng.integers(3)], SHAPES[rng.integers(3)], DIRECTIONS[rng.integers(4)]


def request_text(kind: str, rng: np.random.Generator, held_out: bool, speak: bool) -> str:
    """A request of ``kind`` from the training or held-out paraphrases, optionally asking for speech."""
    template = rng.choice(TEMPLATES[kind][1 if held_out else 0])
    text = " ".join(str(template).format(a=COUNT_ATTRS[rng.integers(len(COUNT_ATTRS))]).split())
    if speak:
        text += " " + str(rng.choice(SPEAK_SUFFIX[1 if held_out else 0]))
    return text
