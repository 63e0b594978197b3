"""Paper profile of select_to_think: the Qwen2.5 pair on MATH / GSM8K (GPU, hub access).

The same library as the cpu profile (method.decode with S2T, Takeover, S2T-Local), one problem at a time
(prompts differ in length and the decoder takes unpadded rows; the official collection is step-wise too).
``train_hub`` collects S2T-Local groups and fine-tunes the SLM (the pair itself is not retrained, so only
``slm_local/`` is written); ``evaluate_hub`` reloads the pair from the hub and S2T-Local from the seed's folder.
Deviations: full fine-tuning of the SLM replaces LoRA (``peft`` is not a dependency of the project), and
answers are compared as normalised strings (no symbolic equivalence). Never run in CI; tests run both steps
on tiny local stand-ins (tests/unit/test_select_to_think_experiment.py)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tasks.common import tiny_lm
from tasks.common.results import Progress, SeedResult
from tasks.select_to_think import data, method
from tasks.select_to_think.config import SelectToThinkConfig
from tasks.select_to_think.model import (
    LOCAL,
    class_chance_counts,
    exact_chance_hits,
    hit_counts,
    policy_for,
    scorer_counts,
)


def prompt_ids(tokenizer: Any, question: str, max_tokens: int) -> torch.Tensor:
    messages = [{"role": "user", "content": question + "\nPlease reason step by step, and put your final answer "
                 "within \\boxed{}."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    return ids[:, -max_tokens:]


def reserved_rows(model: Any, tokenizer: Any, n_bins: int) -> list[int]:
    """Score bins on output rows beyond the tokenizer's vocabulary (Qwen2.5 pads its embedding matrix)."""
    rows = model.get_output_embeddings().weight.shape[0]
    if rows - len(tokenizer) < n_bins:
        raise ValueError(f"select_to_think.local.n_bins: the SLM has only {rows - len(tokenizer)} unused output rows")
    return list(range(len(tokenizer), len(tokenizer) + n_bins))


class HubRun:
    """One seed at the paper profile: its problems, the hub pair and the decoding of one split, problem by problem."""

    def __init__(self, config: SelectToThinkConfig, seed: int, data_dir: Path, device: str):
        self.config, self.device = config, device
        self.splits = data.read_hub_problems(config.hub, data_dir, seed)
        slm, llm, self.tokenizer = data.load_pair(config.hub.slm, config.hub.llm, config.hub.dtype)
        self.slm, self.llm = slm.to(device), llm.to(device)
        self.reserved = reserved_rows(self.slm, self.tokenizer, config.local.n_bins)

    def run(self, model: Any, split: str, policy: method.DecodePolicy, use_llm: bool, **kwargs: Any
            ) -> tuple[float, list[method.DecodeTrace]]:
        """Accuracy and traces of ``model`` under ``policy`` on every problem of ``split``."""
        hub, correct, traces = self.config.hub, [], []
        for row in self.splits[split]:
            ids = prompt_ids(self.tokenizer, row["question"], hub.max_prefix_tokens).to(self.device)
            trace = method.decode(model, ids, hub.max_new_tokens, policy, llm=self.llm if use_llm else None,
                                  reserved=self.reserved, vocab_size=len(self.tokenizer),
                                  eos_id=self.tokenizer.eos_token_id, **kwargs)
            text = self.tokenizer.decode(trace.tokens[0], skip_special_tokens=True)
            correct.append(data.final_answer(text) == row["answer"])
            traces.append(trace)
        return float(np.mean(correct)), traces

    def policy(self, action: str, trigger: str, threshold: float = math.inf) -> method.DecodePolicy:
        return policy_for(self.config.s2t, action, trigger, threshold)

    def threshold(self, model: Any, trigger: str) -> float:
        """The ``s2t.quantile`` of the trigger score along ``model``'s greedy paths on the calibration problems."""
        _, traces = self.run(model, "calibration", self.policy("greedy", trigger), trigger == "kl")
        return method.calibrate_threshold([s for t in traces for s in t.scores], self.config.s2t.quantile)


def train_hub(config: SelectToThinkConfig, seed: int, data_dir: Path, model_dir: Path, device: str,
              progress: Progress) -> SeedResult:
    """S2T-Local: groups collected along S2T paths (KL trigger) on the collection problems, then a full fine-tune
    of a copy of the SLM; writes ``slm_local/``."""
    run, local, s2t = HubRun(config, seed, data_dir, device), config.local, config.s2t
    result = SeedResult(seed)
    with result.stage("collect"):
        kl_threshold = run.threshold(run.slm, "kl")
        _, collected = run.run(run.slm, "collection", run.policy("s2t", "kl", kl_threshold), True,
                               collect_k=s2t.k_collect)
        groups = method.concat_groups([g for t in collected for g in t.groups], pad_id=run.tokenizer.eos_token_id)
    progress(0.3, f"{len(groups)} S2T-Local groups collected")
    with result.stage("local_train"):
        local_model = copy.deepcopy(run.slm)
        before = local_model.get_output_embeddings().weight.detach().clone()
        log = method.train_s2t_local(local_model, groups, run.reserved, local.epochs, local.batch_groups, local.lr,
                                     local.weight_decay, method.LocalLossWeights(local.kl_weight,
                                                                                 local.frozen_kl_weight,
                                                                                 local.hinge_margin), seed,
                                     pad_id=run.tokenizer.eos_token_id)
    tiny_lm.save_model(local_model, Path(model_dir) / LOCAL)  # atomic, safetensors
    progress(1.0, "trained")
    return result.add(local_groups=float(len(groups)),
                      local_frozen_rows_max_change=method.frozen_rows_change(
                          before, local_model.get_output_embeddings().weight.detach(), run.reserved),
                      curves={"local_train_loss": log.total, "local_ce": log.ce, "local_hinge": log.hinge})


def load_local(config: SelectToThinkConfig, model_dir: Path, device: str) -> Any:
    from transformers import AutoModelForCausalLM

    path = Path(model_dir) / LOCAL
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, config.hub.dtype)).eval().to(device)


def evaluate_hub(config: SelectToThinkConfig, seed: int, data_dir: Path, model_dir: Path, device: str,
                 progress: Progress) -> SeedResult:
    """SLM greedy, the LLM alone (the teacher check of C1, C2, C4a, C4b), S2T (with hit@K, and the test problems'
    trigger steps collected as held-out S2T-Local groups) and Takeover at the KL trigger, S2T-Local with the
    entropy trigger (no LLM), the fine-tuned body alone, and S2T-Local's scorer on the held-out groups (C5's
    preconditions). C1's class-only chance ranker: natural text has no token classes here, so it ranks the whole
    vocabulary uniformly (hit@K = K / |V|)."""
    run, s2t = HubRun(config, seed, data_dir, device), config.s2t
    result = SeedResult(seed)
    with result.stage("s2t"):
        greedy, _ = run.run(run.slm, "test", run.policy("greedy", "none"), False)
        llm_accuracy, _ = run.run(run.llm, "test", run.policy("greedy", "none"), False)
        test_count = float(len(run.splits["test"]))
        kl_threshold = run.threshold(run.slm, "kl")
        s2t_accuracy, traces = run.run(run.slm, "test", run.policy("s2t", "kl", kl_threshold), True,
                                       hit_ks=s2t.hit_ks, collect_k=s2t.k_collect)
        takeover_accuracy, takeover_traces = run.run(run.slm, "test", run.policy("takeover", "kl", kl_threshold),
                                                     True)
    pooled = {k: [h for t in traces for h in t.hits[k]] for k in s2t.hit_ks}
    hits = {k: float(np.mean(v)) if v else math.nan for k, v in pooled.items()}
    differ = [not torch.equal(a.tokens[0], b.tokens[0]) for a, b in zip(traces, takeover_traces)]
    result.add({f"hit_at_{k}": hits[k] for k in s2t.hit_ks}, slm_greedy_accuracy=greedy, test_count=test_count,
               slm_greedy_correct_count=float(round(greedy * test_count)), kl_threshold=kl_threshold,
               llm_accuracy=llm_accuracy, llm_correct_count=float(round(llm_accuracy * test_count)),
               s2t_accuracy=s2t_accuracy, takeover_accuracy=takeover_accuracy,
               s2t_takeover_differ_count=float(sum(differ)), s2t_takeover_differ_rate=float(np.mean(differ)),
               tables={"hit_at_k": [{"k": k, "hit": hits[k]} for k in s2t.hit_ks]})
    result.add(hit_counts(pooled, s2t.hit_ks))
    vocab, triggers = len(run.tokenizer), len(pooled[s2t.hit_ks[0]])
    result.add(class_chance_counts([vocab] * triggers, [True] * triggers, s2t.hit_ks, vocab,
                                   np.random.default_rng([seed, 4_004])))
    result.add(exact_chance_hits([vocab] * triggers, [True] * triggers, s2t.hit_ks, vocab))  # K / |V| per step
    progress(0.7, "S2T / Takeover done")
    with result.stage("local_eval"):
        local_model = load_local(config, model_dir, device)
        entropy_threshold = run.threshold(local_model, "entropy")
        accuracy, entropy_traces = run.run(local_model, "test", run.policy("local", "entropy", entropy_threshold),
                                           False)
        body_greedy, _ = run.run(local_model, "test", run.policy("greedy", "none"), False)
        heldout = method.concat_groups([g for t in traces for g in t.groups], pad_id=run.tokenizer.eos_token_id)
        result.add(scorer_counts(local_model, heldout, run.reserved, config.local.batch_groups,
                                 pad_id=run.tokenizer.eos_token_id))
    progress(1.0, "evaluated")
    return result.add(local_entropy_accuracy=accuracy, local_body_greedy_accuracy=body_greedy,
                      local_entropy_llm_evaluations=float(sum(t.llm_row_evaluations for t in entropy_traces)))
