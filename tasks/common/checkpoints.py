"""Loading saved GPT-2 checkpoints safely on the flow's parallel threads.

``GPT2LMHeadModel.from_pretrained`` (transformers 5.24) is not safe on parallel threads: measured in
this project, 52 of 60 loads on 3 threads returned parameters left uninitialised (its loading
patches module initialisation process-wide). ``load_gpt2`` builds the model from the saved config
under the project's init lock (tasks/common/seeding.py) and then loads the saved safetensors weights.
(``tiny_lm.load_model`` still calls ``from_pretrained``: use it only outside parallel seeds.)
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2LMHeadModel

from tasks.common.seeding import torch_init_seed

WEIGHTS = "model.safetensors"


def load_gpt2(directory: str | Path, dtype: torch.dtype = torch.float32) -> GPT2LMHeadModel:
    """The model ``save_pretrained`` wrote to ``directory``, in eval mode, bit-identical to the saved one.

    ``save_pretrained`` drops ``lm_head.weight`` when it is tied to the token embedding; it is the only
    key allowed to be missing, and only for a tied model."""
    directory = Path(directory)
    config = GPT2Config.from_json_file(str(directory / "config.json"))
    with torch_init_seed(0):  # the weights are overwritten below; the lock keeps init away from other threads
        model = GPT2LMHeadModel(config)
    missing, unexpected = model.load_state_dict(load_file(str(directory / WEIGHTS)), strict=False)
    tied = config.tie_word_embeddings and model.lm_head.weight is model.transformer.wte.weight
    if unexpected or missing not in ([], ["lm_head.weight"]) or (missing and not tied):
        raise ValueError(f"{directory}: checkpoint does not match its config (missing {missing}, "
                         f"unexpected {unexpected})")
    return model.to(dtype).eval()
