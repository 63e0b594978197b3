"""token_merging: inference throughput (images/s) vs retention r, per merging method.

    python bench/token_merging_throughput.py [--profile cpu] [--threads 1] [--batch 256] [--repeats 5]
    (writes bench/results/token_merging_throughput_<profile>.json)

The ViT has the shape of the profile's digits model, randomly initialised (throughput does not depend on
the weights). Merging costs a matching step per block but shrinks every later block; the speed-up is
the point of token merging, the accuracy side is in the claims report.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from results_io import write_result  # noqa: E402


def images_per_second(model, images, merge, schedule, repeats: int) -> float:
    import torch

    with torch.no_grad():
        model.forward_merged(images, merge, schedule)  # warm-up
        start = time.perf_counter()
        for _ in range(repeats):
            model.forward_merged(images, merge, schedule)
    return repeats * len(images) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="cpu", choices=["smoke", "cpu"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import torch

    from tasks.common.params import params_section
    from tasks.token_merging import baselines, method, model
    from tasks.token_merging.config import CONFIG

    torch.set_num_threads(args.threads)
    section = params_section("token_merging", REPO / "params.yaml")
    cfg = CONFIG.model_validate(section[args.profile])
    vit = model.build_vit(cfg.vit, cfg.data, seed=0).eval()
    images = torch.randn(args.batch, 1, cfg.data.image_size, cfg.data.image_size,
                         generator=torch.Generator().manual_seed(0))
    rows = []
    for r in cfg.merge.retentions:
        schedule = method.merge_schedule(vit.shape.n_patches, vit.shape.depth, r)
        for merge in (baselines.PROPORTIONAL, method.SQRT_R, method.PER_CLUSTER_KAPPA, baselines.MLERP):
            rate = images_per_second(vit, images, merge, schedule, args.repeats)
            rows.append({"retention": r, "method": merge.name, "images_per_s": round(rate, 1)})
            print(f"r={r:<5g} {merge.name}: {rate:8.1f} images/s", flush=True)
    base = next(row["images_per_s"] for row in rows if row["retention"] == 1.0 and row["method"] == "M2")
    for row in rows:
        row["speedup_vs_unmerged_m2"] = round(row["images_per_s"] / base, 3)
    write_result(f"token_merging_throughput_{args.profile}",
                 {"profile": args.profile, "threads": args.threads, "batch": args.batch, "repeats": args.repeats,
                  "vit": cfg.vit.model_dump(), "rows": rows})


if __name__ == "__main__":
    main()
