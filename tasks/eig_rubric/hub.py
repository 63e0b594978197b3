"""Paper profile: an open instruct model as question generator and evaluator on MT-Bench human judgments
(``lmsys/mt_bench_human_judgments``, split ``human``), through ``LLMPolicy``: in process, or a local
OpenAI-compatible server (vLLM, which returns prompt log-probs) at ``hub.server_url``. **[reconstructed]**

Items are model responses (question, turn, model); the human score of a response is its mean outcome over the
human pairwise judgments it appears in (win 1, tie 1/2, loss 0), binned into K = 5 quantile levels. The rubric
pool is generated once per seed by the model; likelihoods are fitted on the calibration responses (variant A) and,
for comparison, read from the model's own answers under hypothetical scores (variant B, label-free). Every
judging samples the Yes/No answer at ``hub.temperature``; the CoT baseline samples a free-form judgement.
Tested only with local stand-ins (a tiny GPT-2 and a local dataset folder); never the network in tests.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import polars as pl

from tasks.common.io import read_json, write_json, write_parquet
from tasks.common.llm_policy import LLMPolicy, OpenAIServerPolicy, TransformersPolicy
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.eig_rubric import llm_rubric, method
from tasks.eig_rubric.config import EigRubricConfig, HubConfig
from tasks.eig_rubric.data import CALIBRATION_STREAM, REJUDGING_STREAM
from tasks.eig_rubric.evaluate import Rejudgings, consistency_and_alignment, measure
from tasks.eig_rubric.train import RUBRICS, freeze_rubrics, load_rubrics

N_LEVELS = 5
TASK = "judge an AI assistant's answer in a multi-turn conversation with a user (MT-Bench)"
POOL = "pool.json"
# The fixed generic questionnaire of the paper profile (written without looking at the task's human scores).
GENERIC_QUESTIONS = (
    "Is the response helpful?", "Is the response accurate?", "Is the response relevant to the request?",
    "Is the response clear?", "Is the response detailed enough?", "Is the response harmless?",
    "Is the response well organised?", "Is the response concise?", "Is the response creative?",
    "Does the response fully answer the request?", "Is the response free of errors?",
    "Would an expert approve of the response?", "Is the tone appropriate?", "Does the response follow instructions?",
    "Is the reasoning sound?", "Is the response engaging?")
OUTCOME = {"model_a": (1.0, 0.0), "model_b": (0.0, 1.0)}  # any other winner value ("tie", ...) counts 1/2 each


def render_conversation(messages: list[dict], turn: int) -> str:
    """The conversation up to the assistant's reply of ``turn`` (1-based), one 'role: content' block each."""
    kept, replies = [], 0
    for message in messages:
        kept.append(f"{message['role']}: {message['content']}")
        if message["role"] == "assistant":
            replies += 1
            if replies == turn:
                break
    return "\n".join(kept)


def response_scores(rows: list[dict]) -> pl.DataFrame:
    """One row per (question_id, turn, model): its text and mean pairwise outcome over the human judgments."""
    outcomes: dict[tuple[int, int, str], list[float]] = defaultdict(list)
    texts: dict[tuple[int, int, str], str] = {}
    for row in rows:
        a, b = OUTCOME.get(row["winner"], (0.5, 0.5))
        for model, outcome, conversation in ((row["model_a"], a, row["conversation_a"]),
                                             (row["model_b"], b, row["conversation_b"])):
            key = (int(row["question_id"]), int(row["turn"]), model)
            outcomes[key].append(outcome)
            texts.setdefault(key, render_conversation(conversation, int(row["turn"])))
    keys = sorted(outcomes)
    return pl.DataFrame({"question_id": [k[0] for k in keys], "turn": [k[1] for k in keys],
                         "model": [k[2] for k in keys], "text": [texts[k] for k in keys],
                         "human_raw": [float(np.mean(outcomes[k])) for k in keys],
                         "n_judgments": [len(outcomes[k]) for k in keys]})


def tied_quantile_levels(raw: np.ndarray, n_levels: int) -> np.ndarray:
    """K quantile bins where equal values share a level (human win rates are coarse)."""
    cuts = np.quantile(raw, np.arange(1, n_levels) / n_levels)
    return np.searchsorted(cuts, raw, side="right").astype(np.int64)


def load_judgments(hub: HubConfig) -> list[dict]:
    from datasets import load_dataset

    return list(load_dataset(hub.dataset, split=hub.split))


def write_data(cfg: EigRubricConfig, seeds: tuple[int, ...], data_dir: Path) -> list[Path]:
    """Per seed: the responses in a seeded order, the first n_calibration labelled for calibration."""
    hub = cfg.hub
    frame = response_scores(load_judgments(hub))
    if frame.height < hub.n_calibration + 20:
        raise ValueError(f"eig_rubric.paper.hub: {frame.height} responses, need n_calibration + 20")
    frame = frame.with_columns(level=pl.Series(tied_quantile_levels(frame["human_raw"].to_numpy(), N_LEVELS)))
    written = []
    for seed in seeds:
        order = np.random.default_rng([seed, 0]).permutation(frame.height)[: hub.n_items]
        items = frame[order.tolist()].with_columns(
            split=pl.Series(np.where(np.arange(len(order)) < hub.n_calibration, "calibration", "evaluation")))
        written.append(write_parquet(items, Path(data_dir) / f"responses_seed{seed}.parquet"))
    return written


def load_policy(hub: HubConfig, device: str) -> LLMPolicy:
    """vLLM (or any server with prompt log-probs) at ``server_url``, else the model in process; a local folder
    is used as is, a hub name is downloaded first (paper profile only)."""
    if hub.server_url:
        return OpenAIServerPolicy(hub.server_url, hub.evaluator_model, chat=False)
    import torch

    path = Path(hub.evaluator_model)
    if not path.is_dir():
        from huggingface_hub import snapshot_download

        path = Path(snapshot_download(hub.evaluator_model))
    policy = TransformersPolicy.from_directory(path, dtype=getattr(torch, hub.dtype), device=device)
    policy.chat = getattr(policy.tokenizer, "chat_template", None) is not None
    return policy


def sample_answers(p_yes: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """One judging: each answer drawn from the tempered Yes/No distribution."""
    return (rng.random(p_yes.shape) < llm_rubric.tempered_yes_probability(p_yes, temperature)).astype(np.int8)


def _split(data_dir: Path, seed: int, split: str) -> pl.DataFrame:
    frame = pl.read_parquet(Path(data_dir) / f"responses_seed{seed}.parquet")
    return frame.filter(pl.col("split") == split)


def train(cfg: EigRubricConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress, policy: LLMPolicy | None = None) -> SeedResult:
    hub, result = cfg.hub, SeedResult(seed)
    policy = policy or load_policy(hub, device)
    calibration = _split(data_dir, seed, "calibration")
    with result.stage("generate"):
        questions = llm_rubric.generate_question_pool(policy, TASK, hub.pool_size, hub.max_new_tokens, seed)
    with result.stage("calibrate"):
        rng = np.random.default_rng([seed, CALIBRATION_STREAM])
        p_yes = llm_rubric.yes_probabilities(policy, calibration["text"].to_list(), questions)
        levels = calibration["level"].to_numpy().astype(np.int64)
        calibration_answers = sample_answers(p_yes, hub.temperature, rng)
        theta = method.laplace_likelihoods(calibration_answers, levels, N_LEVELS)
        prior = method.level_prior(levels, N_LEVELS)
        theta_label_free = method.likelihoods_from_evaluator(
            lambda j, s: llm_rubric.hypothetical_yes_probability(policy, questions[j], s, N_LEVELS),
            len(questions), N_LEVELS)
    with result.stage("select"):
        judge = cfg.judge.model_copy(update={"k": min(cfg.judge.k, len(questions)),
                                             "k_sweep_max": min(cfg.judge.k_sweep_max, len(questions))})
        p_fixed = llm_rubric.yes_probabilities(policy, calibration["text"].to_list(),
                                               GENERIC_QUESTIONS[: judge.k_sweep_max])
        theta_fixed = method.laplace_likelihoods(sample_answers(p_fixed, hub.temperature, rng), levels, N_LEVELS)
        rubrics = freeze_rubrics(theta, prior, judge, rng, calibration_answers, levels, theta_fixed)
        # Variant B uses no label at all: the model's own likelihoods and a uniform prior.
        label_free = method.greedy_eig_selection(theta_label_free, np.full(N_LEVELS, 1.0 / N_LEVELS), judge.k)
    rubrics["label_free_indices"] = list(label_free.indices)
    write_json(Path(model_dir) / RUBRICS, rubrics)
    write_json(Path(model_dir) / POOL, {"questions": questions, "theta_label_free": theta_label_free.tolist()})
    progress(1.0, f"{len(questions)} questions generated; EIG rubric {rubrics['eig_indices'][: judge.k]}")
    return result.add(pool_size=len(questions), eig_stopped_length=rubrics["eig_stopped_length"],
                      curves={"eig_gain_by_step": rubrics["eig_gains"]})


def evaluate(cfg: EigRubricConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress, policy: LLMPolicy | None = None) -> SeedResult:
    hub, result = cfg.hub, SeedResult(seed)
    policy = policy or load_policy(hub, device)
    items = _split(data_dir, seed, "evaluation")
    texts, human = items["text"].to_list(), items["level"].to_numpy().astype(np.int64)
    rubrics = load_rubrics(model_dir)
    pool = read_json(Path(model_dir) / POOL)
    questions, theta_label_free = pool["questions"], np.asarray(pool["theta_label_free"], dtype=np.float64)
    cfg = cfg.model_copy(update={"judge": cfg.judge.model_copy(update={
        "k": min(cfg.judge.k, len(questions)), "k_sweep_max": min(cfg.judge.k_sweep_max, len(questions))})})
    with result.stage("judge"):
        p_pool = llm_rubric.yes_probabilities(policy, texts, questions)
        p_fixed = llm_rubric.yes_probabilities(policy, texts, GENERIC_QUESTIONS[: cfg.judge.k_sweep_max])
        pool_answers, fixed_answers, cot, failures = [], [], [], 0
        for r in range(cfg.judge.n_rejudgings):
            rng = np.random.default_rng([seed, REJUDGING_STREAM, r])
            pool_answers.append(sample_answers(p_pool, hub.temperature, rng))
            fixed_answers.append(sample_answers(p_fixed, hub.temperature, rng))
            parsed = llm_rubric.cot_score(policy, texts, N_LEVELS, hub.temperature, hub.max_new_tokens,
                                          seed=1_000_000 * (seed + 1) + r * len(texts))
            failures += sum(level is None for level in parsed)
            # An unparseable judgement gets the scale's middle level (counted in cot_parse_failures).
            cot.append([N_LEVELS // 2 if level is None else level for level in parsed])
    passes = Rejudgings(pool_answers, fixed_answers, np.asarray(cot, dtype=np.float64).T)
    label_free = consistency_and_alignment(
        passes.naive_bayes(np.asarray(rubrics["label_free_indices"]), theta_label_free,
                           np.full(N_LEVELS, 1.0 / N_LEVELS)), human)
    result.add({f"{name}_eig_label_free": value for name, value in label_free.items()},
               cot_parse_failures=failures)
    return measure(cfg, seed, passes, rubrics, human, result, progress)
