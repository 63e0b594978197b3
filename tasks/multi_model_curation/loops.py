"""The experiment's design, shared by multi_model_curation's train, evaluate and claim_metrics steps: the
beta_1 ranges of the canonical coupled configs, the random stream of every loop, and the neural
generators' loop spec and checkpoint (README, "What is measured").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tasks.common.io import load_state_dict, save_state_dict
from tasks.multi_model_curation import method
from tasks.multi_model_curation.config import NeuralConfig

# beta_1 ranges of the canonical coupled configs (low -> high; the high end is the canonical beta_1).
BETA1_RANGE = {"dampen": (0.0, 5.0), "cross_invert": (0.0, 5.0), "self_invert": (0.6, 4.0)}
CONVERGENT_CONFIGS = ("isolated", "dampen", "cross_invert", "self_invert", "self_invert_isolated")
K_LABELS = ("ksmall", "klarge")
NEURAL_CHECKPOINT = "neural_generators.safetensors"
NEURAL_EVAL_SIZE = 4096  # inputs of the neural loop's alignment sample (``method.iterate_neural``'s default)
NEURAL_STREAM = 6
SURVEY_DRAW_STREAM = 8  # the prior's configurations of a seed
SURVEY_LOOP_STREAM = 9  # the survey's sampled loops: (seed, 9, configuration index, K)
MIXTURE_STREAM = 10  # the mixture-generator loops: (seed, 10, components, K) coupled, (seed, 11, components, K) alone


def loop_rng(seed: int, *stream: int) -> np.random.Generator:
    """One stream per (seed, experiment, K). The low- and high-beta runs of a pair share it (common
    random numbers), so their difference is not swamped by independent sampling noise."""
    return np.random.default_rng([seed, *stream])


def spec_with_beta1(spec: method.LoopSpec, beta1: float) -> method.LoopSpec:
    beta = spec.beta.copy()
    beta[0] = beta1
    return spec.with_beta(beta)


def neural_spec(cfg: NeuralConfig) -> method.LoopSpec:
    """The conditional version of the configured coupled config (a_i = mu_i e_1: the 1-D fixed point)."""
    return method.canonical_specs()[cfg.coupled_config].with_dim(cfg.dim)


def new_neural_generators(cfg: NeuralConfig, seed: int) -> list[method.NeuralGaussian]:
    """The generators ``method.iterate_neural`` starts from (the same initialisation seeds)."""
    spec = neural_spec(cfg)
    return [method.NeuralGaussian(spec.dim, cfg.hidden, spec.real_var, seed * 100 + i) for i in range(spec.n_models)]


def neural_eval_features(cfg: NeuralConfig, seed: int) -> np.ndarray:
    """The inputs on which the neural loop measures alignment: the first draw of its stream."""
    return method.draw_features(cfg.dim, NEURAL_EVAL_SIZE, loop_rng(seed, NEURAL_STREAM))


def _holder(models: list[method.NeuralGaussian]):
    import torch

    holder = torch.nn.Module()
    holder.nets = torch.nn.ModuleList([model.net for model in models])
    holder.log_vars = torch.nn.ParameterList([model.log_var for model in models])
    return holder


def save_neural_generators(models: list[method.NeuralGaussian], model_dir: Path) -> Path:
    """The neural generators' weights (one safetensors file, atomic): ``nets.<i>.*`` and ``log_vars.<i>``."""
    return save_state_dict(_holder(models), Path(model_dir) / NEURAL_CHECKPOINT)


def load_neural_generators(cfg: NeuralConfig, seed: int, model_dir: Path) -> list[method.NeuralGaussian]:
    """The generators ``save_neural_generators`` wrote (every weight read from the checkpoint)."""
    models = new_neural_generators(cfg, seed)
    load_state_dict(_holder(models), Path(model_dir) / NEURAL_CHECKPOINT)
    return models
