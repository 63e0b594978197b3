"""tasks/common/checkpoints.py: GPT-2 checkpoints load bit-identically, also on parallel threads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tasks.common import tiny_lm
from tasks.common.checkpoints import load_gpt2

INPUT = torch.tensor([[1, 2, 3, 4, 5, 6]])


def saved_model(directory, tied: bool, seed: int = 3):
    config = tiny_lm.tiny_gpt2_config(12, 8, n_layer=1, n_head=2, n_embd=16)
    config.tie_word_embeddings = tied
    model = tiny_lm.build_tiny_gpt2(config, seed=seed).eval()
    tiny_lm.save_model(model, directory)
    return model


@pytest.mark.parametrize("tied", [True, False])
def test_parallel_loads_are_bit_identical_to_the_saved_model(tmp_path, tied):
    model = saved_model(tmp_path / "m", tied)
    with torch.no_grad():
        want = model(INPUT).logits
    with ThreadPoolExecutor(max_workers=3) as pool:
        loaded = list(pool.map(lambda _: load_gpt2(tmp_path / "m"), range(12)))
    with torch.no_grad():
        assert all(torch.equal(m(INPUT).logits, want) for m in loaded)
    assert all((m.lm_head.weight is m.transformer.wte.weight) == tied for m in loaded)


def test_a_checkpoint_that_does_not_match_its_config_is_refused(tmp_path):
    saved_model(tmp_path / "m", tied=False)
    config = (tmp_path / "m" / "config.json").read_text().replace('"n_embd": 16', '"n_embd": 8')
    (tmp_path / "m" / "config.json").write_text(config)
    with pytest.raises(Exception, match="size mismatch|does not match"):
        load_gpt2(tmp_path / "m")
