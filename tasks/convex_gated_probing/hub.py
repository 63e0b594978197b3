"""Paper profile pieces: the BAT checkpoint and the audio datasets by hub name (not yet wired into the flow).

- ``load_bat_encoder``: ``lrauch/BAT-vit-b16-pretrainedAS2M`` through ``transformers`` (trust_remote_code; input
  (B, 1, 1024, 128) fbank), returning the model whose ``hidden_states`` the probes read;
- ``hidden_state_features``: every block's hidden states (B, 1 + N, D), cls first, as the probes' (patch, cls);
- ``load_audio_split`` / ``clips_from_rows``: ESC-50 (``ashraq/esc50``), Speech Commands
  (``google/speech_commands``, v0.02) etc. through ``datasets``, as fixed-length mono waveforms and multi-hot labels.

Tests use local stand-ins only (a tiny ``transformers`` ViT saved to a temporary folder, in-memory rows)."""

from __future__ import annotations

import numpy as np
import torch

BAT_CHECKPOINT = "lrauch/BAT-vit-b16-pretrainedAS2M"


def load_bat_encoder(name_or_path: str = BAT_CHECKPOINT, trust_remote_code: bool = True):
    """The pretrained encoder (eval mode) by hub name or local path."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(name_or_path, trust_remote_code=trust_remote_code).eval()


@torch.no_grad()
def hidden_state_features(model, inputs: torch.Tensor, input_name: str = "pixel_values"
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(patch (B, L, N, D), cls (B, L, D)) from every block's hidden states (the embedding output excluded)."""
    outputs = model(**{input_name: inputs}, output_hidden_states=True)
    stacked = torch.stack(outputs.hidden_states[1:], dim=1)
    return stacked[:, :, 1:], stacked[:, :, 0]


def clips_from_rows(rows: list[dict], audio_column: str, label_column: str, n_classes: int, n_samples: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a ``datasets`` audio split -> waveforms (n, n_samples), cropped or zero-padded, and multi-hot labels
    (an int label or a list of ints per row)."""
    waves = np.zeros((len(rows), n_samples), dtype=np.float32)
    labels = np.zeros((len(rows), n_classes), dtype=np.float32)
    for i, row in enumerate(rows):
        audio = np.asarray(row[audio_column]["array"], dtype=np.float32)
        if audio.ndim > 1:
            audio = audio.mean(axis=0)
        waves[i, :min(n_samples, audio.size)] = audio[:n_samples]
        targets = row[label_column]
        for label in targets if isinstance(targets, list | tuple) else [targets]:
            if not 0 <= int(label) < n_classes:
                raise ValueError(f"{label_column}: label {label} outside [0, {n_classes})")
            labels[i, int(label)] = 1.0
    return waves, labels


def load_audio_split(name: str, split: str, sample_rate: int, config: str | None = None):
    """A hub audio dataset split with its audio column resampled to ``sample_rate`` (network at run time)."""
    from datasets import Audio, load_dataset

    dataset = load_dataset(name, config, split=split)
    audio_column = next(k for k, v in dataset.features.items() if isinstance(v, Audio))
    return dataset.cast_column(audio_column, Audio(sampling_rate=sample_rate)), audio_column
