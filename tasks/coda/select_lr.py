"""Per-model-kind learning rate of coda's cpu test bed, chosen on a validation split only (README, "Learning
rates"; issue 18, review finding 4).

Each model kind of the plan (LTC, CoDA, the no-ODE ablation, the GRU baseline) is trained from scratch on every
task of a SELECTION seed that no claim evaluates (its data are drawn with that seed, so they are disjoint from
the evaluated seeds' data), at each learning rate of a small grid, under the profile's own early-stopping rule.
The lr kept per kind minimises the geometric mean over tasks of best-validation-loss / the best over the grid on
that task (``choose_lr``): scale-free, so no task's loss units dominate. Test splits are never read.

Run offline, not by the pipeline (its cost is outside the cpu budget):
``python -m tasks.coda.select_lr --lr 0.005 --out a.json`` (one grid value per process, so two cores can share
the grid), then ``python -m tasks.coda.select_lr --combine a.json b.json ... --out reports/coda/lr_selection.json``.
The chosen values are copied by hand into params.yaml's ``coda.cpu.train.lr_by_model``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from tasks.coda import claim_metrics, data, evaluate, train
from tasks.coda.config import CONFIG, CodaConfig
from tasks.coda.model import ABLATION, CODA, REFERENCE, split_part, task_splits
from tasks.common.params import params_section

SELECTION_SEED = 100  # not among the evaluated seeds (params.yaml coda.seeds)
GRID = (5e-3, 2e-2, 5e-2)


def with_lr(cfg: CodaConfig, kind: str, lr: float) -> CodaConfig:
    """The profile with ``lr`` for ``kind`` (every other setting unchanged)."""
    return cfg.model_copy(update={"train": cfg.train.model_copy(update={"lr_by_model": {kind: lr}})})


def selection_rows(cfg: CodaConfig, seed: int, lr: float, kinds: list[str]) -> list[dict]:
    """Train each kind on each task of ``seed`` at ``lr``; one row per (task, kind): best validation loss,
    epochs run and whether it converged (``claim_metrics.has_converged``, against the untrained model's validation
    loss; the committed reports/coda/lr_selection.json was made with the first-epoch reference, see README)."""
    rows = []
    for name in cfg.data.tasks:
        task = data.make_task(cfg.data, name, seed)
        fit_split, val_split = task_splits(task, "cpu")[0], split_part(task, "val", "cpu")
        for kind in kinds:
            run_cfg = with_lr(cfg, kind, lr)
            start = time.process_time()
            _, curves, row = train.fit(kind, 1, task, fit_split, val_split, run_cfg, seed)
            untrained = evaluate.untrained_validation_loss(kind, 1, task, run_cfg, seed, "cpu")
            rows.append({"task": name, "model": kind, "lr": lr, "best_val_loss": row["best_val_loss"],
                         "epochs": row["epochs"],
                         "converged": claim_metrics.has_converged(curves["val_loss"], untrained, run_cfg.train),
                         "cpu_seconds": time.process_time() - start})
    return rows


def choose_lr(rows: list[dict]) -> dict[str, dict]:
    """Per model kind, the lr of the lowest geometric mean over tasks of best_val_loss / min over lrs of
    best_val_loss (same task and kind; losses floored at 1e-12). Returns {kind: {"lr", "score_by_lr"}}; ties go
    to the smaller lr."""
    chosen = {}
    for kind in sorted({r["model"] for r in rows}):
        mine = [r for r in rows if r["model"] == kind]
        tasks = {r["task"] for r in mine}
        best = {t: min(max(r["best_val_loss"], 1e-12) for r in mine if r["task"] == t) for t in tasks}
        scores = {}
        for lr in sorted({r["lr"] for r in mine}):
            at = [r for r in mine if r["lr"] == lr]
            if {r["task"] for r in at} != set(best):
                raise ValueError(f"{kind} at lr {lr}: not every task was run")
            scores[lr] = math.exp(sum(math.log(max(r["best_val_loss"], 1e-12) / best[r["task"]]) for r in at) / len(at))
        chosen[kind] = {"lr": min(scores, key=lambda lr: (scores[lr], lr)), "score_by_lr": scores}
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lr", type=float, help="one grid value to run")
    parser.add_argument("--combine", nargs="+", type=Path, help="row files of earlier --lr runs")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--profile", default="cpu")
    args = parser.parse_args()
    if args.combine:
        rows = [row for path in args.combine for row in json.loads(path.read_text())["rows"]]
        result = {"selection_seed": SELECTION_SEED, "grid": sorted({r["lr"] for r in rows}),
                  "criterion": "geometric mean over tasks of best validation loss / best over the grid",
                  "chosen": choose_lr(rows), "rows": rows}
    else:
        cfg = CONFIG.model_validate(params_section("coda")[args.profile])
        kinds = [REFERENCE, CODA, *([ABLATION] if cfg.study.ablation else []), *cfg.study.baselines]
        result = {"rows": selection_rows(cfg, SELECTION_SEED, args.lr, kinds)}
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
