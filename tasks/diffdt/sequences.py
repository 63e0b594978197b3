"""Event sequences over (age, token) for the backbone, from a cohort's arrays (Delphi's input format).

A sequence holds: the sex token at age 40; the SDoH codes at their onset ages (if ``with_sdoh``); the disease codes
at their ages; a no-event token every 5 years and at the baseline visit; one sensor token per imaged organ at the
baseline visit (if ``with_sensors``); and a no-event token at the end of follow-up unless death ended it.
``cut_at_baseline`` keeps what is known at the baseline visit (the prefix a prediction or an intervention starts
from). Ties in age are ordered sex, events, no-event, sensors.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.diffdt import cohort
from tasks.diffdt.data import Cohort
from tasks.diffdt.method import Vocabulary

_RANK_SEX, _RANK_EVENT, _RANK_PAD, _RANK_SENSOR = 0, 1, 2, 3


def vocabulary(n_sdoh: int, n_codes: int) -> Vocabulary:
    return Vocabulary(n_sdoh=n_sdoh, n_disease=n_codes)


def build_sequences(data: Cohort, vocab: Vocabulary, follow_up: float, with_sdoh: bool, with_sensors: bool,
                    cut_at_baseline: bool, insert_sdoh: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, ages), right-padded with token 0 (its age repeats the last real age). ``insert_sdoh = j`` adds SDoH
    j at the baseline visit for subjects who do not have it yet (the intervention's edited history)."""
    rows = []
    for i in range(data.n):
        base = float(data.baseline[i])
        death = data.event_age[i, -1]
        end = base if cut_at_baseline else (float(death) if np.isfinite(death) else base + follow_up)
        items = [(cohort.START_AGE, _RANK_SEX, vocab.MALE if data.male[i] else vocab.FEMALE)]
        if with_sdoh:
            for j in np.flatnonzero(np.isfinite(data.sdoh_onset[i])):
                if data.sdoh_onset[i, j] <= end:
                    items.append((float(data.sdoh_onset[i, j]), _RANK_EVENT, vocab.sdoh(int(j))))
            if insert_sdoh is not None and not np.isfinite(data.sdoh_onset[i, insert_sdoh]):
                items.append((base, _RANK_EVENT, vocab.sdoh(insert_sdoh)))
        for k in np.flatnonzero(np.isfinite(data.event_age[i])):
            if data.event_age[i, k] <= end:
                items.append((float(data.event_age[i, k]), _RANK_EVENT, vocab.disease(int(k))))
        pad = cohort.START_AGE + cohort.PAD_EVERY
        while pad < end:
            items.append((pad, _RANK_PAD, vocab.NO_EVENT))
            pad += cohort.PAD_EVERY
        items.append((base, _RANK_PAD, vocab.NO_EVENT))
        if with_sensors:
            items += [(base, _RANK_SENSOR, vocab.sensor(o)) for o in vocab.organs if data.imaged[o][i]]
        if not cut_at_baseline and not np.isfinite(death):
            items.append((end, _RANK_PAD, vocab.NO_EVENT))
        items.sort(key=lambda item: (item[0], item[1]))
        rows.append(items)
    length = max(len(r) for r in rows)
    tokens = torch.zeros(len(rows), length, dtype=torch.long)
    ages = torch.zeros(len(rows), length, dtype=torch.float32)
    for i, items in enumerate(rows):
        tokens[i, :len(items)] = torch.tensor([t for _, _, t in items])
        ages[i, :len(items)] = torch.tensor([a for a, _, _ in items])
        ages[i, len(items):] = items[-1][0]
    return tokens, ages


def last_positions(tokens: torch.Tensor) -> torch.Tensor:
    """Index of the last real token of each right-padded row."""
    return (tokens != 0).sum(dim=1) - 1
