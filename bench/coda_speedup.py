"""coda: wall-clock speed-up of CoDA over LTC, side by side in one process (1- and 2-layer stacks).

    python bench/coda_speedup.py [--profile cpu] [--threads 1] [--repeats 5]
    (writes bench/results/coda_speedup_<profile>.json)

Models have the profile's sizes, randomly initialised (time does not depend on the weights), on the
Lotka-Volterra task's shapes: median seconds of one training step (batch of train.batch_size) and of one
inference forward pass (batch of study.timing_batch, and a single sequence), alternating the models so that
load changes hit both alike (``evaluate.paired_timings``, the function the experiment's speed claims C5a, C5b
and C3c use on the trained models). This standalone run repeats that measurement with more repeats.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from results_io import write_result  # noqa: E402


def coda_section() -> dict:
    from tasks.common.params import params_section

    return params_section("coda", REPO / "params.yaml")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="cpu", choices=["smoke", "cpu", "paper"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from tasks.coda import data, evaluate, model
    from tasks.coda.config import CONFIG

    torch.set_num_threads(args.threads)
    cfg = CONFIG.model_validate(coda_section()[args.profile])
    task = data.make_task(cfg.data, "lotka_volterra", seed=0)
    train, test = model.task_splits(task, "cpu")
    batch = train.take(slice(0, cfg.train.batch_size))
    timing = test.take(slice(0, cfg.study.timing_batch))
    single = test.take(slice(0, 1))
    rows = []
    for layers in (1, 2):
        models = {kind: model.build_model(kind, layers, task, cfg.model, seed=0) for kind in ("ltc", "coda")}
        # the same side-by-side timing the experiment verdicts C5a, C5b and C3c on (alternating models)
        batched = evaluate.paired_timings(models, batch, timing, args.repeats)
        single_seq = evaluate.paired_timings(models, batch, single, args.repeats)
        medians = {k: {"train": batched[k]["train"], "batch": batched[k]["inference"],
                       "single": single_seq[k]["inference"]} for k in models}
        row = {"layers": layers, **{f"{kind}_{phase}_ms": round(1e3 * value, 3)
                                    for kind, phases in medians.items() for phase, value in phases.items()}}
        for phase in ("train", "batch", "single"):
            row[f"speedup_{phase}"] = round(medians["ltc"][phase] / medians["coda"][phase], 3)
        rows.append(row)
        print(row, flush=True)
    write_result(f"coda_speedup_{args.profile}", {
        "profile": args.profile, "threads": args.threads, "repeats": args.repeats, "rows": rows,
        "two_layer_speedup_at_least_one_layer": rows[1]["speedup_train"] >= rows[0]["speedup_train"]})


if __name__ == "__main__":
    main()
