"""Evaluation step of radio1d: reads the checkpoints and measures, per model and token count k, the linear-probe
mAP of the mean of the k tokens, the reconstruction error of the dense teacher's features from k tokens and the
composition-retrieval P@1; plus how far the two teachers are linear images of each other."""

from __future__ import annotations

from pathlib import Path

import torch

from tasks.common.io import load_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.radio1d import method
from tasks.radio1d.baselines import PlainViT, pool_grid
from tasks.radio1d.config import Radio1DConfig
from tasks.radio1d.data import Scenes, load_scenes
from tasks.radio1d.train import TEACHERS, Teachers, build_plain, build_student, build_teachers, student_specs
from tasks.radio1d.vlm_proxy import vlm_accuracy_vs_k

EVAL_BATCH = 500


def in_batches(fn, images: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
    outs = [fn(images[i:i + EVAL_BATCH]) for i in range(0, len(images), EVAL_BATCH)]
    if isinstance(outs[0], tuple):
        return tuple(torch.cat(parts) for parts in zip(*outs, strict=True))
    return torch.cat(outs)


def relative_error(prediction: torch.Tensor, target: torch.Tensor) -> float:
    """Mean squared error over samples and locations divided by the target's variance about its mean: the
    fraction of the dense teacher's feature variance the reconstruction misses (0 = perfect, 1 = the mean)."""
    centre = target.mean(dim=(0, 1), keepdim=True)
    return float(((prediction - target) ** 2).sum(-1).mean() / ((target - centre) ** 2).sum(-1).mean())


def teacher_measures(cfg: Radio1DConfig, teachers: Teachers, train: Scenes, test: Scenes) -> dict[str, float]:
    """Teacher quality on test scenes, and the held-out R^2 of each teacher's features from the other's."""
    with torch.no_grad():
        presence_scores = in_batches(teachers.summary, test.images)
        quadrant_logits = in_batches(teachers.dense, test.images)
        s_train, d_train = in_batches(teachers.targets, train.images)
        s_test, d_test = in_batches(teachers.targets, test.images)
    ridge = cfg.eval.ridge
    flat = lambda t: t.flatten(1)  # noqa: E731
    return {"teacher_summary_map": method.mean_average_precision(presence_scores, test.presence),
            "teacher_dense_quadrant_accuracy": float((quadrant_logits.argmax(-1) == test.layouts).double().mean()),
            "teacher_r2_dense_from_summary": method.held_out_r2(s_train, flat(d_train), s_test, flat(d_test), ridge),
            "teacher_r2_summary_from_dense": method.held_out_r2(flat(d_train), s_train, flat(d_test), s_test, ridge)}


def student_tables(cfg: Radio1DConfig, name: str, model: method.Radio1D | PlainViT, teachers: Teachers,
                   train: Scenes, test: Scenes) -> list[dict]:
    """One row per k: probe mAP (mean of the k tokens), dense reconstruction error, summary cosine."""
    ks = cfg.eval.ks
    with torch.no_grad():
        s_test, d_test = in_batches(teachers.targets, test.images)
        tokens_train = in_batches(lambda x: model.encode(x)[1], train.images)
        tokens_test = in_batches(lambda x: model.encode(x)[1], test.images)
    rows = []
    for k in ks:
        if isinstance(model, PlainViT):
            f_train = pool_grid(tokens_train, model.grid, k).mean(1)
            f_test = pool_grid(tokens_test, model.grid, k).mean(1)
            with torch.no_grad():
                dense = in_batches(lambda x, k=k: model.reconstruct(x, k), test.images)
                summary = in_batches(lambda x: model(x)[0], test.images)
        else:
            f_train, f_test = tokens_train[:, :k].mean(1), tokens_test[:, :k].mean(1)
            with torch.no_grad():
                summary, dense = in_batches(lambda x, k=k: model(x, torch.full((len(x),), k)), test.images)
        logits = method.fit_linear_probe(f_train, train.presence, f_test, cfg.eval.probe_steps, cfg.eval.probe_lr)
        rows.append({"model": name, "k": k, "probe_map": method.mean_average_precision(logits, test.presence),
                     "recon_error": relative_error(dense, d_test),
                     "summary_cosine": float(torch.nn.functional.cosine_similarity(summary, s_test, dim=-1).mean())})
    return rows


def retrieval_rows(cfg: Radio1DConfig, name: str, model: method.Radio1D | PlainViT, test: Scenes,
                   gallery: Scenes) -> list[dict]:
    """P@1 of composition retrieval (relevant = same digit-or-empty per quadrant) with k tokens concatenated
    in order, and with the cls token alone."""
    k = cfg.eval.retrieval_k
    queries = Scenes(test.images[:len(gallery.images)], test.layouts[:len(gallery.images)])
    with torch.no_grad():
        if isinstance(model, PlainViT):
            tokens = lambda x: model.pooled_tokens(x, k).flatten(1)  # noqa: E731
            cls = lambda x: model.encode(x)[0]  # noqa: E731
        else:
            tokens = lambda x: model.encode(x)[1][:, :k].flatten(1)  # noqa: E731
            cls = lambda x: model.encode(x)[0][:, 0]  # noqa: E731
        rows = []
        for rep, fn in (("tokens", tokens), ("cls", cls)):
            p1 = method.precision_at_1(in_batches(fn, queries.images), in_batches(fn, gallery.images),
                                       queries.layouts, gallery.layouts)
            rows.append({"model": name, "representation": rep, "k": k if rep == "tokens" else 0, "p_at_1": p1,
                         "hits": round(p1 * len(queries.images)), "queries": len(queries.images)})
    return rows


def vlm_rows(cfg: Radio1DConfig, seed: int, model_dir: Path, train: Scenes, test: Scenes) -> list[dict]:
    """C6 proxy: one tiny GPT-2 per encoder (elastic, and B1 = fixed k = 16) answering quadrant questions."""
    rows = []
    for spec in student_specs(cfg):
        if spec.name not in ("elastic", f"fixed{max(cfg.train.fixed_ks)}"):
            continue
        model = load_state_dict(build_student(cfg, seed), model_dir / spec.checkpoint).eval()
        with torch.no_grad():
            tokens_train = in_batches(lambda x, m=model: m.encode(x)[1], train.images)
            tokens_test = in_batches(lambda x, m=model: m.encode(x)[1], test.images)
        rows += [{"model": spec.name, **row} for row in vlm_accuracy_vs_k(
            cfg.vlm, tokens_train, train.layouts, tokens_test, test.layouts, cfg.eval.ks, seed)]
    return rows


def evaluate(cfg: Radio1DConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        from tasks.radio1d.hub import evaluate_hub
        return evaluate_hub(cfg, seed, data_dir, device, progress)
    train, test, gallery = (load_scenes(data_dir, name, seed) for name in ("train", "test", "gallery"))
    teachers = load_state_dict(build_teachers(cfg, seed), Path(model_dir) / TEACHERS).eval()
    result = SeedResult(seed).add(teacher_measures(cfg, teachers, train, test))
    per_k, retrieval = [], []
    specs = student_specs(cfg)
    for i, spec in enumerate(specs):
        model = build_plain(cfg, seed) if spec.plain else build_student(cfg, seed)
        model = load_state_dict(model, Path(model_dir) / spec.checkpoint).eval()
        with result.stage(f"eval_{spec.name}"):
            per_k += student_tables(cfg, spec.name, model, teachers, train, test)
            retrieval += retrieval_rows(cfg, spec.name, model, test, gallery)
        progress((i + 1) / len(specs), f"evaluated {spec.name}")
    if cfg.vlm is not None:
        with result.stage("vlm_proxy"):
            vlm = vlm_rows(cfg, seed, Path(model_dir), train, test)
        result.add({f"{r['model']}_vlm_accuracy_k{r['k']}": r["vlm_accuracy"] for r in vlm}, tables={"vlm": vlm})
    for row in per_k:
        result.add({f"{row['model']}_{m}_k{row['k']}": row[m] for m in ("probe_map", "recon_error", "summary_cosine")})
    for row in retrieval:
        result.add({f"{row['model']}_p_at_1_{row['representation']}": row["p_at_1"],
                    f"{row['model']}_hits_{row['representation']}": row["hits"]})
    return result.add(retrieval_queries=len(gallery.images), tables={"per_k": per_k, "retrieval": retrieval})
