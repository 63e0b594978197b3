"""Training step of multi_model_curation: the loops whose generators are trained.

- the neural loop (``neural``): 2-layer MLP generators refit by Adam on each other's curated outputs
  every round (``method.iterate_neural``); their alignment is measured every round inside the loop
  (curves ``neural_A<i>``), and the final generators are saved (``loops.NEURAL_CHECKPOINT``);
- the paper profile's LM loop (``hub``): chat LMs fine-tuned on each other's curated generations
  (``hub.run_hub_loop``; curves ``hub_A<i>``, generators saved under ``generator<i>/``).

The K -> infinity recursion and the sample-based Gaussian loops refit closed-form estimates, not
trained models: they are measurements of the evaluation step. A profile without ``neural`` and
``hub`` trains nothing.
"""

from __future__ import annotations

from pathlib import Path

from tasks.common.results import Progress, SeedResult, no_progress
from tasks.multi_model_curation import data, method
from tasks.multi_model_curation.config import MultiModelCurationConfig, NeuralConfig
from tasks.multi_model_curation.loops import (
    NEURAL_EVAL_SIZE,
    NEURAL_STREAM,
    loop_rng,
    neural_spec,
    save_neural_generators,
)


def train_neural(cfg: NeuralConfig, seed: int, real: method.RealData, model_dir: Path, progress: Progress
                 ) -> dict[str, list[float]]:
    """The neural loop on the conditional task; saves the final generators, returns A_i(t) per model."""
    spec = neural_spec(cfg)

    def on_round(done: int) -> None:
        progress(done / cfg.rounds, f"seed {seed}: neural refit round {done}/{cfg.rounds}")

    history, models = method.iterate_neural(spec, cfg.rounds, cfg.k, cfg.n_samples, real, loop_rng(seed, NEURAL_STREAM),
                                            cfg.hidden, cfg.steps_per_round, cfg.lr, seed, NEURAL_EVAL_SIZE,
                                            progress=on_round)
    save_neural_generators(models, model_dir)
    return {f"neural_A{i + 1}": history[:, i].tolist() for i in range(spec.n_models)}


def train(config: MultiModelCurationConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    result = SeedResult(seed)
    if config.neural is not None:
        real = data.read_real_conditional(config, seed, Path(data_dir))
        with result.stage("neural"):
            curves = train_neural(config.neural, seed, real, Path(model_dir), progress)
        result.add(curves=curves)
    if config.hub is not None:
        from tasks.multi_model_curation import hub

        with result.stage("hub"):
            curves = hub.run_hub_loop(config.hub, seed, device, Path(model_dir), progress)
        result.add(curves=curves)
    return result
