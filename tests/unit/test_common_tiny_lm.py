"""tasks/common/tiny_lm.load_model: the saved model, also when the flow's seed threads load at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tasks.common import tiny_lm


@pytest.fixture
def saved(tmp_path):
    config = tiny_lm.tiny_gpt2_config(vocab_size=11, n_positions=16, n_layer=2, n_head=2, n_embd=16)
    model = tiny_lm.build_tiny_gpt2(config, seed=5).eval()
    with torch.no_grad():  # move the weights off their initial values, so a fresh init cannot pass
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model, tiny_lm.save_model(model, tmp_path / "model")


def test_parallel_loads_are_all_the_saved_model(saved):
    model, path = saved
    ids = torch.tensor([[1, 4, 2, 9, 3, 3, 7, 0]])
    with torch.no_grad():
        want = model(input_ids=ids).logits

    def load_and_run(_):
        loaded = tiny_lm.load_model(path)
        tied = loaded.lm_head.weight is loaded.transformer.wte.weight
        with torch.no_grad():
            return tied and torch.equal(loaded(input_ids=ids).logits, want)

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert all(pool.map(load_and_run, range(24)))


def test_a_checkpoint_that_does_not_fit_its_config_is_refused(saved, tmp_path):
    _, path = saved
    other = tiny_lm.build_tiny_gpt2(tiny_lm.tiny_gpt2_config(vocab_size=11, n_positions=16, n_layer=1, n_head=2,
                                                             n_embd=16), seed=0)
    mixed = tmp_path / "mixed"
    tiny_lm.save_model(other, mixed)
    (mixed / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())  # 2 layers, config 1
    with pytest.raises(ValueError, match="does not match its config"):
        tiny_lm.load_model(mixed)
