"""Text-only captioners of covip (controls that need no model): the correct caption, recite-all and
random-subset, and the empty caption (the judge's blanked-caption precondition)."""

from __future__ import annotations

import numpy as np

from tasks.covip.data import Episode


def correct_caption(ep: Episode) -> list[str]:
    """The target: ``NAME PLACE EVENT ;`` per present concept in cell order (score = number present)."""
    return ep.target_caption


def recite_all_caption(ep: Episode) -> list[str]:
    """The textual shortcut: every context concept's facts, in context order."""
    return ep.caption_of(list(range(len(ep.identities))))


def random_subset_caption(ep: Episode, rng: np.random.Generator) -> list[str]:
    """As many context concepts as are present, chosen at random (no look at the query)."""
    chosen = rng.choice(len(ep.identities), size=len(ep.present), replace=False)
    return ep.caption_of([int(c) for c in chosen])


def empty_caption(ep: Episode) -> list[str]:
    return []
