"""Procedural data of quatro: the sum-to-target task (vocabulary, prompts, reward) and the per-seed prompt streams.

Tokens: digits 0-9 are ids 0-9 and "=" is 10, nothing else. A prompt is the target's two decimal digits then "="
(T = 17: ``1 7 =``); a response is exactly n_digits tokens, correct iff they are all digits summing to T. There is
no EOS and no target-specific token: in a first design (one token per target, responses ended by EOS) negative
advantages on failed samples leaked probability into EOS and the target tokens, and every algorithm, on-policy GRPO
included, collapsed to malformed responses; with 11 tokens the only malformed response contains "=".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

from tasks.common.io import write_parquet
from tasks.quatro.config import QuatroConfig, TaskConfig

SEP = 10
VOCAB_SIZE = 11
PROMPT_LENGTH = 3


def sequence_length(task: TaskConfig) -> int:
    return PROMPT_LENGTH + task.n_digits


def targets(task: TaskConfig) -> list[int]:
    return list(range(task.min_target, task.max_target + 1))


def prompt_ids(target_values: torch.Tensor, task: TaskConfig) -> torch.Tensor:
    """(B,) targets -> (B, 3) prompt token ids: tens digit, units digit, "="."""
    t = target_values.long()
    return torch.stack([t // 10, t % 10, torch.full_like(t, SEP)], dim=1)


def all_responses(task: TaskConfig) -> torch.Tensor:
    """Every possible response, (VOCAB_SIZE ** n_digits, n_digits): what the exact KL enumerates (121 at 2 digits)."""
    return torch.cartesian_prod(*[torch.arange(VOCAB_SIZE)] * task.n_digits).reshape(-1, task.n_digits)


def rewards(completion_ids: torch.Tensor, target_values: torch.Tensor, task: TaskConfig) -> torch.Tensor:
    """1.0 iff the row's n_digits response tokens are all digits summing to its target; (N,) float32."""
    if completion_ids.shape[1] != task.n_digits:
        raise ValueError(f"responses have {completion_ids.shape[1]} tokens, expected n_digits = {task.n_digits}")
    well_formed = (completion_ids < SEP).all(dim=1)
    return (well_formed & (completion_ids.sum(dim=1) == target_values.long())).float()


def sft_batch(task: TaskConfig, batch: int, generator: torch.Generator) -> torch.Tensor:
    """(B, 3 + n_digits) sequences [prompt, uniform digits]: the format, with no information about the sum."""
    t = torch.randint(task.min_target, task.max_target + 1, (batch,), generator=generator)
    digits = torch.randint(0, 10, (batch, task.n_digits), generator=generator)
    return torch.cat([prompt_ids(t, task), digits], dim=1)


def prompt_stream(cfg: QuatroConfig, seed: int) -> np.ndarray:
    """(steps, prompts_per_step) training targets, uniform over the target range, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    t = cfg.task
    return rng.integers(t.min_target, t.max_target + 1, size=(cfg.rl.steps, cfg.rl.prompts_per_step))


def write_data(cfg: QuatroConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    if cfg.hub is not None:
        from tasks.quatro import hub  # the paper profile: MATH prompts by hub name

        return hub.write_hub_data(cfg.hub, seeds, Path(data_dir))
    written = []
    for seed in seeds:
        stream = prompt_stream(cfg, seed)
        frame = pl.DataFrame({"step": np.repeat(np.arange(stream.shape[0]), stream.shape[1]),
                              "target": stream.reshape(-1)})
        written.append(write_parquet(frame, Path(data_dir) / f"train_prompts_seed{seed}.parquet"))
    written.append(write_parquet(pl.DataFrame({"target": targets(cfg.task)}), Path(data_dir) / "eval_targets.parquet"))
    return written


def load_prompt_stream(data_dir: Path, seed: int) -> np.ndarray:
    frame = pl.read_parquet(Path(data_dir) / f"train_prompts_seed{seed}.parquet").sort("step", maintain_order=True)
    steps = frame["step"].max() + 1
    return frame["target"].to_numpy().reshape(steps, -1)


def load_eval_targets(data_dir: Path) -> list[int]:
    return pl.read_parquet(Path(data_dir) / "eval_targets.parquet")["target"].to_list()
