"""Evaluation step of mive: layer probes of the frozen VLM, then every DiT variant on the held-out phrasings
(validation losses, Euler-sampled edits and their metrics). Derives no claim numbers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tasks.common.io import load_state_dict
from tasks.common.results import Progress, SeedResult, no_progress
from tasks.common.tiny_vlm import load_vlm
from tasks.mive import data, method, model
from tasks.mive.config import MiveConfig
from tasks.mive.train import VLM_DIR, editor_file, needed_layers


def object_patch_index(masks: np.ndarray, image_size: int) -> np.ndarray:
    """``(N, 2)`` index of the 4x4 patch holding each object's mask centroid in the reference (frame 0)."""
    first = masks[:, :, 0]
    ys, xs = np.mgrid[:image_size, :image_size]
    count = first.sum((2, 3))
    cy = (first * ys).sum((2, 3)) / count
    cx = (first * xs).sum((2, 3)) / count
    grid = image_size // model.PATCH
    return (np.floor(cy).astype(int) // model.PATCH) * grid + np.floor(cx).astype(int) // model.PATCH


def probe_inputs(frame, arrays: dict[str, np.ndarray], states: list[torch.Tensor], image_size: int
                 ) -> dict[str, object]:
    """Per layer: object-patch features (2 rows per clip) with their reference hue as (cos, sin), image tokens
    concatenated with both objects' centroids, text-token means with the side and new-bin labels, and every token
    of every clip (the reference spread of the collapse measure)."""
    per_frame = (image_size // model.PATCH) ** 2
    reference, n_img = slice(per_frame, 2 * per_frame), 2 * per_frame  # VLM input: [source frame 0][reference]
    patch = torch.from_numpy(object_patch_index(arrays["masks"], image_size))
    new_hue = frame["new_hue"].to_numpy()
    target = frame["target_object"].to_numpy()
    hues = np.stack([np.where(target == k, new_hue, frame[f"source_hue_{k}"].to_numpy()) for k in range(2)], 1)
    angle = torch.from_numpy(np.deg2rad(hues.reshape(-1)))
    first = arrays["masks"][:, :, 0]
    ys, xs = np.mgrid[:image_size, :image_size]
    count = first.sum((2, 3))
    centroids = np.concatenate([(first * ys).sum((2, 3)) / count, (first * xs).sum((2, 3)) / count], 1)
    rows = torch.arange(len(patch))[:, None].expand(-1, 2)
    return {"object": [h[:, reference][rows, patch].reshape(-1, h.shape[-1]) for h in states],
            "hue": torch.stack([angle.cos(), angle.sin()], 1),
            "image": [h[:, reference].reshape(len(h), -1) for h in states],
            "centroids": torch.from_numpy(centroids),
            "text": [h[:, n_img:].mean(1) for h in states],
            "tokens": [h.reshape(-1, h.shape[-1]) for h in states],
            "side": torch.from_numpy(target), "bin": torch.from_numpy(frame["new_bin"].to_numpy())}


def layer_probes(fit: dict, test: dict, ridge: float) -> list[dict[str, float]]:
    rows = []
    for layer in range(len(fit["object"])):
        side = method.ridge_probe_accuracy(fit["text"][layer], fit["side"], test["text"][layer], test["side"], 2, ridge)
        new_bin = method.ridge_probe_accuracy(fit["text"][layer], fit["bin"], test["text"][layer], test["bin"],
                                              len(data.BINS), ridge)
        feats = test["object"][layer]
        rows.append({"layer": layer,  # probes on features standardised on the fit split (scale-invariant)
                     "hue_r2": method.ridge_probe_r2(fit["object"][layer], fit["hue"], feats, test["hue"], ridge),
                     "position_r2": method.ridge_probe_r2(fit["image"][layer], fit["centroids"], test["image"][layer],
                                                          test["centroids"], ridge),
                     "side_accuracy": side, "bin_accuracy": new_bin, "semantic_accuracy": (side + new_bin) / 2,
                     "relative_std": method.between_clip_spread(feats, test["tokens"][layer])})
    return rows


def evaluate(cfg: MiveConfig, seed: int, data_dir: Path, model_dir: Path, device: str = "cpu",
             progress: Progress = no_progress) -> SeedResult:
    if cfg.hub is not None:
        from tasks.mive import hub

        return hub.evaluate_hub(cfg, seed, model_dir)
    d = cfg.data
    result = SeedResult(seed)
    vlm = load_vlm(Path(model_dir) / VLM_DIR)
    test_frame = data.load_split(data_dir, "test", seed)
    fit_frame = data.load_split(data_dir, "train", seed).head(cfg.probe.n_fit)
    test_arrays = data.clip_arrays(test_frame, d.frames, d.image_size)
    fit_arrays = data.clip_arrays(fit_frame, d.frames, d.image_size)
    images, ids = model.vlm_images(test_arrays), torch.from_numpy(test_arrays["ids"])
    test_states = model.vlm_hidden_states(vlm, images, ids)
    fit_states = model.vlm_hidden_states(vlm, model.vlm_images(fit_arrays), torch.from_numpy(fit_arrays["ids"]))
    with result.stage("probes"):
        probes = layer_probes(probe_inputs(fit_frame, fit_arrays, fit_states, d.image_size),
                              probe_inputs(test_frame, test_arrays, test_states, d.image_size), cfg.probe.ridge)
    result.add(vlm_caption_accuracy=model.caption_accuracy(vlm, images, ids,
                                                           torch.from_numpy(data.caption_ids(test_frame))))
    progress(0.2, "probes done")

    test_set = model.edit_set(test_arrays, test_states, needed_layers(cfg, len(test_states)))
    source, target = torch.from_numpy(test_arrays["source"]), torch.from_numpy(test_arrays["target"])
    masks = torch.from_numpy(test_arrays["masks"])
    target_object = torch.from_numpy(test_frame["target_object"].to_numpy())
    edit_masks = masks[torch.arange(len(masks)), target_object]
    by_reference = test_frame["by_reference"].to_numpy()
    rows, samples = [], {}
    for k, variant in enumerate(cfg.dit.variants):
        editor = model.Editor(cfg, variant, test_set.tensors["residual"].shape[1])
        load_state_dict(editor, Path(model_dir) / editor_file(variant))
        editor.eval()
        with result.stage(f"sample_{variant}"):
            val = model.validation_losses(editor, test_set, cfg.dit.val_batches, seed)
            edited = model.sample_edits(editor, test_set, cfg.dit.sample_steps, seed, d.frames, d.image_size)
        hue = method.object_hue_error(edited, target, edit_masks).numpy()
        selected = method.target_selected(edited, source, target, masks, target_object).numpy()
        row = {"variant": variant, "val_loss": val["full"], "val_loss_region": val["region"],
               "val_loss_region_shuffled": val["region_shuffled"],
               "conditioning_gap": val["region_shuffled"] - val["region"],
               "hue_error": float(hue.mean()), "hue_error_by_reference": float(hue[by_reference].mean()),
               "target_selection": float(selected.mean()), "target_selected_count": int(selected.sum()),
               "unedited_mse": float(method.unedited_mse(edited, target, edit_masks).mean()),
               "motion_drift": float(method.change_centroid_drift(edited, source, edit_masks).mean())}
        rows.append(row)
        result.add({f"{key}_{variant}": value for key, value in row.items() if key != "variant"})
        samples[variant] = edited[:4, 0].reshape(4, -1).tolist()
        progress(0.2 + 0.8 * (k + 1) / len(cfg.dit.variants), f"{variant}: hue error {row['hue_error']:.1f} deg")
    result.add(test_count=len(test_frame))
    grid = [{"clip": i, "kind": kind, "pixels": pixels}
            for kind, frames in [("source", source[:4, 0]), ("reference", target[:4, 0])]
            for i, pixels in enumerate(frames.reshape(4, -1).tolist())]
    grid += [{"clip": i, "kind": v, "pixels": p} for v, s in samples.items() for i, p in enumerate(s)]
    return result.add(tables={"probes": probes, "variants": rows, "sample_grid": grid})
