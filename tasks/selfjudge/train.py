"""Training step of selfjudge: the tiny target and draft, then mining, labels and the judge heads.

Per seed: (1) target and draft GPT-2s trained from scratch on disjoint halves of the procedural corpus; (2) on
each task's mining prompts the target's greedy responses are mined for draft/target mismatches scored by
diff_N (method.py);
(3) tau_N = the configured quantile of diff_N, and one SelfJudge head per task is fitted on the target's hidden
states; (4) on the arithmetic task, the first ``n_autojudge`` prompts' mismatches also get AutoJudge-style labels
(answer changes after regeneration) and an AutoJudge head is fitted on them (baseline). Checkpoints: the two
models (safetensors) and the heads (npz)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import torch

from tasks.common import tiny_lm
from tasks.common.io import write_with
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.selfjudge import data, method
from tasks.selfjudge.config import SelfJudgeConfig, TinyLMConfig

TARGET, DRAFT = "target", "draft"
HEAD_FILE = "heads.npz"
HEADS = ("selfjudge_arith", "selfjudge_desc", "autojudge_arith")


def padded_corpus(frame: pl.DataFrame) -> torch.Tensor:
    """Prompt + response of every row, right-padded with <eos> (after eos comes eos: harmless at decoding)."""
    seqs = [p + r for p, r in zip(frame["prompt"].to_list(), frame["response"].to_list())]
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [data.EOS] * (width - len(s)) for s in seqs], dtype=torch.long)


def train_lm(spec: TinyLMConfig, corpus: torch.Tensor, seed: int) -> tuple[torch.nn.Module, list[float]]:
    config = tiny_lm.tiny_gpt2_config(len(data.VOCAB), corpus.shape[1] + 64, spec.n_layer, spec.n_head, spec.n_embd)
    model = tiny_lm.build_tiny_gpt2(config, seed)

    def batch(generator: torch.Generator) -> torch.Tensor:
        return corpus[torch.randint(0, corpus.shape[0], (spec.batch_size,), generator=generator)]

    losses = tiny_lm.train_causal_lm(model, batch, spec.steps, spec.lr, seed)
    return model, losses


def save_heads(heads: dict[str, method.JudgeHead], path: Path) -> Path:
    arrays = {}
    for name, head in heads.items():
        arrays |= {f"{name}.mean": head.mean, f"{name}.scale": head.scale, f"{name}.coef": head.coef,
                   f"{name}.intercept": np.array(head.intercept), f"{name}.c": np.array(head.c),
                   f"{name}.val_auroc": np.array(head.val_auroc)}

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            np.savez(handle, **arrays)

    return write_with(path, write)


def load_heads(path: Path) -> dict[str, method.JudgeHead]:
    with np.load(path) as z:
        names = sorted({key.split(".")[0] for key in z.files})
        return {n: method.JudgeHead(z[f"{n}.mean"], z[f"{n}.scale"], z[f"{n}.coef"], float(z[f"{n}.intercept"]),
                                    float(z[f"{n}.c"]), float(z[f"{n}.val_auroc"])) for n in names}


def mine_task(target: torch.nn.Module, draft: torch.nn.Module, frame: pl.DataFrame, cfg: SelfJudgeConfig
              ) -> tuple[list[dict], list[method.Mismatch], int, int]:
    """Mismatches of one task's mining prompts: rows for the tables, the mismatches, positions examined, matches."""
    prompts = frame["prompt"].to_list()
    responses = method.batch_greedy(target, prompts, cfg.decoding.max_new_tokens, data.EOS)
    rows, mismatches, examined = [], [], 0
    for index, (prompt, response) in enumerate(zip(prompts, responses)):
        sequence = prompt + response
        found = method.mine_mismatches(target, draft, sequence, len(prompt), cfg.mining.window)
        # diff_0 (the first term alone) on the same mismatches: reported beside diff_N, to show what the
        # semantic-preservation window adds on this data
        first_term = method.mine_mismatches(target, draft, sequence, len(prompt), 0)
        examined += max(0, len(sequence) - 1 - len(prompt))
        for mm, mm0 in zip(found, first_term, strict=True):
            original, substitute = data.VOCAB[mm.original], data.VOCAB[mm.substitute]
            rows.append({"prompt_index": index, "position": mm.position, "original": original,
                         "substitute": substitute, "kind": data.mismatch_kind(original, substitute),
                         "diff": mm.diff, "diff_0": mm0.diff, "sequence": sequence, "response_start": len(prompt)})
        mismatches += found
    return rows, mismatches, examined, examined - len(mismatches)


def answer_of_ids(ids: list[int]) -> int | None:
    return data.answer_of(data.decode(ids))


def train(cfg: SelfJudgeConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
          progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        from tasks.selfjudge import hub
        return hub.train_hub(cfg, seed, data_dir, model_dir, device, progress)
    result = SeedResult(seed)
    corpus = padded_corpus(data.load_split(data_dir, "train", seed))
    # disjoint halves: two models fit on the same sample copy its synonym frequencies and pick the same argmax on
    # every free choice; real draft / target pairs are trained on different data and differ on style
    target_rows, draft_rows = corpus[0::2], corpus[1::2]
    with result.stage("train_target"):
        target, target_losses = train_lm(cfg.target, target_rows, seed)
    progress(0.3, f"target trained, final loss {target_losses[-1]:.3f}")
    with result.stage("train_draft"):
        draft, draft_losses = train_lm(cfg.draft, draft_rows, seed + 1000)
    progress(0.5, f"draft trained, final loss {draft_losses[-1]:.3f}")
    tiny_lm.save_model(target, Path(model_dir) / TARGET)
    tiny_lm.save_model(draft, Path(model_dir) / DRAFT)

    mine = data.load_split(data_dir, "mine", seed)
    heads: dict[str, method.JudgeHead] = {}
    tables: dict[str, list[dict]] = {}
    mined: dict[str, list[method.Mismatch]] = {}
    metrics: dict[str, float] = {}
    with result.stage("mining"), torch.no_grad():
        for task in data.TASKS:
            rows, mismatches, examined, matches = mine_task(target, draft, mine.filter(pl.col("task") == task), cfg)
            if len(mismatches) < 2:  # an untrained smoke pair may stop at once: no head, no judge runs
                tau = float("nan")
            else:
                tau = method.label_threshold([mm.diff for mm in mismatches], cfg.mining.positive_quantile)
                x, y = method.head_training_set(mismatches, tau)
                heads[f"selfjudge_{task}"] = method.fit_judge_head(
                    x, y, cfg.head.validation_fraction, method.c_grid(cfg.head.c_grid_size), seed, cfg.head.max_iter)
            head = heads.get(f"selfjudge_{task}")
            kinds = [r["kind"] for r in rows]
            meaning = [r["diff"] for r in rows if r["kind"] == "meaning"]
            style = [r["diff"] for r in rows if r["kind"] == "style"]
            meaning_0 = [r["diff_0"] for r in rows if r["kind"] == "meaning"]
            style_0 = [r["diff_0"] for r in rows if r["kind"] == "style"]
            metrics |= {
                f"{task}_draft_agreement": matches / max(1, examined), f"{task}_positions_examined": examined,
                f"{task}_mismatches": len(mismatches), f"{task}_meaning_mismatches": kinds.count("meaning"),
                f"{task}_style_mismatches": kinds.count("style"), f"{task}_tau": tau,
                f"{task}_label_positive_rate": float(np.mean([mm.diff > tau for mm in mismatches]))
                if mismatches else float("nan"),
                f"{task}_diff_auroc_meaning_vs_style": method.auroc(meaning + style,
                                                                    [1] * len(meaning) + [0] * len(style)),
                f"{task}_diff0_auroc_meaning_vs_style": method.auroc(meaning_0 + style_0,
                                                                     [1] * len(meaning_0) + [0] * len(style_0)),
                f"{task}_head_val_auroc": head.val_auroc if head else float("nan"),
                f"{task}_head_c": head.c if head else float("nan")}
            for r in rows:
                r["label"] = int(r["diff"] > tau)
            tables[task], mined[task] = rows, mismatches
            progress(0.6 if task == "arith" else 0.7, f"{task}: {len(mismatches)} mismatches mined")
    with result.stage("autojudge"):
        chosen = [i for i, r in enumerate(tables["arith"]) if r["prompt_index"] < cfg.data.n_autojudge]
        arith_rows = [tables["arith"][i] for i in chosen]
        items = [(r["sequence"], r["position"], data.TOKEN_ID[r["substitute"]], r["response_start"])
                 for r in arith_rows]
        labels = method.autojudge_labels(target, items, cfg.decoding.max_new_tokens, data.EOS, answer_of_ids)
        for r, label in zip(arith_rows, labels):
            r["autojudge_label"] = label
        metrics |= {"autojudge_labelled": len(labels),
                    "autojudge_positive_rate": float(np.mean(labels)) if labels else np.nan,
                    "autojudge_agreement_auroc": method.auroc([r["diff"] for r in arith_rows], labels)}
        if len(set(labels)) == 2 and len(labels) >= 8:
            # AutoJudge's head: the same features, labelled by the answer check instead of diff_N
            picked = [mined["arith"][i] for i in chosen]
            x = np.stack([mm.hidden_sub for mm in picked] + [mm.hidden_orig for mm in picked])
            y = np.asarray(labels + [0] * len(picked), dtype=np.int64)
            heads["autojudge_arith"] = method.fit_judge_head(
                x, y, cfg.head.validation_fraction, method.c_grid(cfg.head.c_grid_size), seed, cfg.head.max_iter)
    metrics["autojudge_head_val_auroc"] = heads["autojudge_arith"].val_auroc if "autojudge_arith" in heads else np.nan
    save_heads(heads, Path(model_dir) / HEAD_FILE)
    progress(1.0, "heads fitted")
    mismatch_table = [{k: v for k, v in r.items() if k not in ("sequence",)} | {"task": task}
                      for task, rows in tables.items() for r in rows]
    return result.add(metrics, curves={"target_loss": target_losses, "draft_loss": draft_losses},
                      tables={"mismatches": mismatch_table})
