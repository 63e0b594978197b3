"""convex_gated_probing paper-profile loaders, with local stand-ins only (no network)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tasks.convex_gated_probing import hub, method


def test_hidden_state_features_from_a_local_transformers_vit(tmp_path):
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=16, num_hidden_layers=3,
                       num_attention_heads=2, intermediate_size=32)
    ViTModel(config).save_pretrained(tmp_path)
    model = hub.load_bat_encoder(str(tmp_path), trust_remote_code=False)
    inputs = torch.rand(2, 1, 8, 8)
    patch, cls = hub.hidden_state_features(model, inputs)
    assert patch.shape == (2, 3, 4, 16) and cls.shape == (2, 3, 16)
    hidden = model(pixel_values=inputs, output_hidden_states=True).hidden_states
    assert torch.equal(cls[:, 1], hidden[2][:, 0]) and torch.equal(patch[:, 2], hidden[3][:, 1:])
    features = method.cgp_features(patch, cls, torch.ones(3), torch.randn(5, 16))
    assert features.shape == (2, 15)


def test_clips_from_rows_pads_crops_and_builds_multi_hot():
    rows = [{"audio": {"array": np.ones(5), "sampling_rate": 8}, "target": 2},
            {"audio": {"array": np.arange(12.0), "sampling_rate": 8}, "target": [0, 3]},
            {"audio": {"array": np.stack([np.ones(8), 3 * np.ones(8)]), "sampling_rate": 8}, "target": 1}]
    waves, labels = hub.clips_from_rows(rows, "audio", "target", 4, 8)
    assert np.array_equal(waves[0], [1, 1, 1, 1, 1, 0, 0, 0])
    assert np.array_equal(waves[1], np.arange(8.0))
    assert np.array_equal(waves[2], 2 * np.ones(8))  # stereo averaged to mono
    assert np.array_equal(labels, [[0, 0, 1, 0], [1, 0, 0, 1], [0, 1, 0, 0]])
    with pytest.raises(ValueError, match="target"):
        hub.clips_from_rows([{"audio": {"array": np.ones(3)}, "target": 7}], "audio", "target", 4, 8)
