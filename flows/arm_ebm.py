"""Flow of arm_ebm: data (toy EBM tables, samples) then, per seed, E1-E4, then claims and figures."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from prefect import flow, task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import INPUTS, TASK_SOURCE
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from tasks.arm_ebm import experiment, figures
from tasks.common.devices import pick_device
from tasks.common.env import configure, repo_root
from tasks.common.params import RunSpec, resolve_run
from tasks.common.provenance import hash_files
from tasks.common.steps import log_seed_run, paper_paths, parent_run, publish_claims, write_plot_csv

SLUG = "arm_ebm"
# The code a seed's result depends on: its hash is part of the cache key of run-seed (figures,
# reports and flows can change without recomputing the seeds).
SEED_CODE = [f"tasks/{SLUG}/{name}.py" for name in ("method", "experiment", "data", "config")] + [
    f"tasks/common/{name}.py" for name in ("tiny_lm", "seeding", "params", "io", "devices")]
# Three seeds run at once even on 2 cores: each trains with one torch thread, and a third worker
# beats leaving a core idle while the last seed runs alone.
WORKERS = 3


@task(name="prepare-data")
def prepare_data(spec: RunSpec, data_dir: str) -> list[str]:
    return [str(p) for p in experiment.write_data(spec.config, spec.seeds, Path(data_dir))]


# Cached on the inputs, which carry a hash of the paper's and common code (TASK_SOURCE alone would
# miss a change in method.py): a killed run restarted skips the seeds already finished.
@task(name="run-seed", cache_policy=INPUTS + TASK_SOURCE, persist_result=True)
def run_seed(config, seed: int, data_dir: str, model_dir: str, device: str, code_version: str) -> dict:
    artifact = create_progress_artifact(0.0, description=f"{SLUG}: GPT-2 training of seed {seed}")

    def progress(fraction: float, message: str) -> None:
        update_progress_artifact(artifact, 100.0 * fraction)
        print(f"[{SLUG}] {message}", flush=True)

    return experiment.run_seed(config, seed, Path(data_dir), Path(model_dir), device, progress)


@task(name="make-figures")
def make_figures(spec: RunSpec, results: list[dict], figures_dir: str, plots_dir: str) -> list[str]:
    out, plots = Path(figures_dir), Path(plots_dir)
    made = [figures.kl_vs_horizon(results, out / "kl_vs_horizon.png"),
            figures.first_token_marginals(results, out / "first_token_marginals.png", spec.config.toy.b,
                                          spec.config.toy.c),
            figures.nll_curves(results, out / "nll_curves.png")]
    write_plot_csv([row | {"seed": r["seed"]} for r in results for row in r["tables"]["e4_kl_vs_T"]],
                   plots / "kl_vs_horizon.csv")
    if "gpt2_train_nll" in results[0]["curves"]:
        write_plot_csv([{"step": i, "seed": r["seed"], "nll": v} for r in results
                        for i, v in enumerate(r["curves"]["gpt2_train_nll"])], plots / "gpt2_train_nll.csv")
    return [str(p) for p in made if p is not None]


@flow(name="arm_ebm", task_runner=ThreadPoolTaskRunner(max_workers=WORKERS))
def arm_ebm(profile: str | None = None, seeds: list[int] | None = None,
            phase: Literal["data", "run", "all"] = "all") -> dict:
    """ARMs are secretly EBMs: bijection, soft Bellman, supervised equivalence, lookahead, distillation."""
    spec = resolve_run(SLUG, profile, seeds)
    configure(spec.profile)
    paths = paper_paths(SLUG)
    if phase in ("data", "all"):
        prepare_data(spec, str(paths.data))
    if phase == "data":
        return {"phase": "data", "data": str(paths.data)}
    device = pick_device(spec.config.device)
    import torch

    torch.set_num_threads(experiment.torch_threads_per_worker(min(WORKERS, len(spec.seeds))))
    code_version = hash_files(SEED_CODE)
    progress = create_progress_artifact(0.0, description=f"{SLUG}: seeds finished")
    with parent_run(spec, device) as parent_id:
        futures = []
        for seed in spec.seeds:
            # A cached result whose files were deleted is recomputed rather than trusted.
            missing = not experiment.seed_result_path(paths.models, seed).exists()
            futures.append(run_seed.with_options(refresh_cache=missing).submit(
                spec.config, seed, str(paths.data), str(paths.models), device, code_version))
        results = []
        for done, future in enumerate(as_completed(futures), start=1):
            result = future.result()
            # The marker is written only once Prefect has persisted the cached result, so a seed
            # with a marker is always a cache hit after a kill.
            if not experiment.seed_result_path(paths.models, result["seed"]).exists():
                experiment.save_seed_result(result, paths.models)
            results.append(result)
            update_progress_artifact(progress, 100.0 * done / len(futures))
            print(f"[{SLUG}] seed {result['seed']} done ({done}/{len(futures)})")
        results.sort(key=lambda r: r["seed"])
        for result in results:
            inputs = [str(p) for p in sorted(paths.data.glob(f"*_seed{result['seed']}.parquet"))]
            marker = str(experiment.seed_result_path(paths.models, result["seed"]))
            log_seed_run(spec, parent_id, result, device, [marker], inputs)
        made = make_figures(spec, results, str(paths.figures), str(paths.plots))
        rows = publish_claims(spec, parent_id, results, str(repo_root() / "tasks" / SLUG / "claims.yaml"),
                              str(paths.reports), "arm_ebm: Autoregressive LMs are secretly EBMs", made)
    return {"phase": phase, "parent_run_id": parent_id, "verdicts": {r["id"]: r["verdict"] for r in rows}}


FLOW = arm_ebm
