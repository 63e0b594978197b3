"""Models and checkpoints shared by arm_ebm's train and evaluate steps.

A seed's folder ``models/arm_ebm/seed<N>/`` holds what ``train.py`` fitted:

- ``gpt2_arm/``: the tiny GPT-2 ARM of E2 / E4 (``save_pretrained``, safetensors);
- ``neural_ebm.safetensors``: the MLP energy of E3 (neural), its parameters;
- ``tabular.safetensors``: E3's tabular ARM logit tables ``q<t>`` (X, V**t, V) and EBM energy table
  ``energy`` (X, V**T), float64.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from safetensors.torch import load_file as load_torch_file
from transformers import GPT2Config, GPT2LMHeadModel

from tasks.arm_ebm import data, method
from tasks.arm_ebm.config import TinyGPT2Config, ToyConfig
from tasks.common import tiny_lm
from tasks.common.io import load_state_dict, save_state_dict, write_with

GPT2_DIR = "gpt2_arm"
NEURAL_EBM = "neural_ebm.safetensors"
TABULAR = "tabular.safetensors"


def toy_rewards_and_target(toy: ToyConfig, seed: int) -> tuple[method.Tables, np.ndarray]:
    """The seed's toy EBM: per-step total rewards r_t and the exact log p_R(y|x), (X, V**T)."""
    _, total = method.toy_ebm_rewards(data.toy_spec(toy, seed))
    return total, method.ebm_log_probs(method.sequence_energy(total))


def gpt2_arm_config(toy: ToyConfig, g: TinyGPT2Config) -> GPT2Config:
    """The tiny GPT-2 ARM: V sequence tokens + one prompt token per prompt, T + 1 positions."""
    config = tiny_lm.tiny_gpt2_config(toy.vocab_size + toy.n_prompts, toy.horizon + 1, g.n_layer, g.n_head,
                                      g.n_embd)
    config.initializer_range = g.init_std
    # GPT-2's own activation (the tanh approximation of GELU) through torch's fused kernel instead of
    # transformers' elementwise "gelu_new": the same function, a training step about 18% cheaper.
    config.activation_function = "gelu_pytorch_tanh"
    return config


def load_gpt2_arm(model_dir: Path, toy: ToyConfig, g: TinyGPT2Config) -> GPT2LMHeadModel:
    """The trained GPT-2 ARM: built from the config (``tiny_lm.build_tiny_gpt2``, under the init lock), then
    the saved weights. Not ``from_pretrained``: with transformers 5.24, models loaded that way on parallel
    threads (the flow's seeds) come back with parameters missing and left uninitialised."""
    model = tiny_lm.build_tiny_gpt2(gpt2_arm_config(toy, g), seed=0)
    state = load_torch_file(str(Path(model_dir) / GPT2_DIR / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # save_pretrained drops the output layer, tied to the token embedding (GPT-2's tie_word_embeddings).
    if missing != ["lm_head.weight"] or unexpected or model.lm_head.weight is not model.transformer.wte.weight:
        raise ValueError(f"{model_dir}: GPT-2 checkpoint does not match the config (missing {missing}, "
                         f"unexpected {unexpected})")
    return model.eval()


def save_neural_ebm(energy_net: torch.nn.Module, model_dir: Path) -> Path:
    return save_state_dict(energy_net, Path(model_dir) / NEURAL_EBM)


def load_neural_ebm(model_dir: Path, toy: ToyConfig, hidden: int) -> torch.nn.Sequential:
    """The trained MLP energy: the architecture of ``method.neural_energy_net``, the saved parameters."""
    n_inputs = toy.n_prompts + toy.horizon * toy.vocab_size
    return load_state_dict(method.neural_energy_net(n_inputs, hidden, seed=0), Path(model_dir) / NEURAL_EBM)


def save_tabular(q: method.Tables, energy: np.ndarray, model_dir: Path) -> Path:
    arrays = {f"q{t}": np.ascontiguousarray(table) for t, table in enumerate(q)} | {
        "energy": np.ascontiguousarray(energy)}
    return write_with(Path(model_dir) / TABULAR, lambda tmp: save_file(arrays, str(tmp)))


def load_tabular(model_dir: Path) -> tuple[method.Tables, np.ndarray]:
    """(tabular ARM q tables, tabular EBM energy table) as ``save_tabular`` wrote them."""
    arrays = load_file(str(Path(model_dir) / TABULAR))
    return [arrays[f"q{t}"] for t in range(len(arrays) - 1)], arrays["energy"]
