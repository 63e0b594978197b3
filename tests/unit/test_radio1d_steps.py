"""radio1d steps: the digit scenes, the teachers' standardisation, the baselines' pooling, the evaluation
measures, the claim numbers and the paper profile's hub evaluation (local stand-ins, no network)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from pydantic import ValidationError

from tasks.common.results import SeedResult
from tasks.radio1d import baselines, claim_metrics, data, evaluate, hub
from tasks.radio1d.config import Radio1DConfig
from tasks.radio1d.train import Teachers

CPU_LIKE = {
    "data": {"n_train": 40, "n_test": 30, "n_queries": 20, "min_digits": 2, "max_digits": 4,
             "digit_test_fraction": 0.2, "split_seed": 0},
    "teacher": {"epochs": 1, "batch_size": 20, "lr": 3e-3, "summary_dim": 8, "dense_dim": 4},
    "student": {"patch_size": 2, "width": 8, "heads": 2, "depth_before": 1, "depth_after": 1, "registers": 1,
                "decoder_depth_before": 1, "decoder_depth_after": 0, "plain_depth": 1},
    "train": {"epochs": 1, "batch_size": 20, "lr": 3e-3, "weight_decay": 0.0, "warmup_fraction": 0.0,
              "sampler": "triangle", "fixed_ks": [16, 1]},
    "eval": {"ks": [1, 2, 4, 8, 16], "probe_steps": 5, "probe_lr": 0.1, "retrieval_k": 4, "ridge": 1e-3}}


def test_scenes_place_digits_in_their_quadrants_and_the_gallery_matches_layouts():
    cfg = Radio1DConfig(**CPU_LIKE)
    frames = data.make_scenes(cfg.data, seed=3)
    pools = data.digit_pools(cfg.data)
    assert len(pools["test"][1]) == round(0.2 * 1797) and len(pools["train"][1]) == 1797 - 359
    train = np.asarray(frames["train"]["image"].to_list()).reshape(-1, 16, 16)
    layouts = np.asarray(frames["train"]["layout"].to_list())
    assert train.shape == (40, 16, 16) and layouts.shape == (40, 4)
    occupied = (layouts != data.EMPTY).sum(1)
    assert occupied.min() >= 2 and occupied.max() <= 4
    for image, layout in zip(train, layouts, strict=True):
        for q in range(4):
            row, col = divmod(q, 2)
            block = image[8 * row:8 * row + 8, 8 * col:8 * col + 8]
            assert (block.sum() == 0) == (layout[q] == data.EMPTY)
    test_layouts = np.asarray(frames["test"]["layout"].to_list())
    gallery_layouts = np.asarray(frames["gallery"]["layout"].to_list())
    assert np.array_equal(test_layouts[:20], gallery_layouts)
    test_images = np.asarray(frames["test"]["image"].to_list())[:20]
    gallery_images = np.asarray(frames["gallery"]["image"].to_list())
    assert not np.any(np.all(test_images == gallery_images, axis=1))  # other instances, not copies


def test_compose_and_presence_exact():
    pool = (np.arange(2 * 64).reshape(2, 8, 8) / 128.0, np.array([7, 3]))
    canvas = data.compose(pool, np.array([-1, 1, 0, -1]))
    assert np.array_equal(canvas[:8, 8:], pool[0][1]) and np.array_equal(canvas[8:, :8], pool[0][0])
    assert canvas[:8, :8].sum() == 0 and canvas[8:, 8:].sum() == 0
    assert data.layouts_of(np.array([[-1, 1, 0, -1]]), pool[1]).tolist() == [[10, 3, 7, 10]]
    scenes = data.Scenes(torch.zeros(1, 1, 16, 16), torch.tensor([[10, 3, 7, 3]]))
    assert scenes.presence.tolist() == [[0, 0, 0, 1, 0, 0, 0, 1, 0, 0]]


def test_teacher_standardisation_gives_zero_mean_and_unit_energy():
    torch.manual_seed(0)
    teachers = Teachers(6, 4)
    images = torch.rand(50, 1, 16, 16)
    teachers.fit_standardisation(images)
    summary, dense = teachers.targets(images)
    assert torch.allclose(summary.mean(0), torch.zeros(6), atol=1e-4)  # float32 round-off at unit scale
    assert float((summary ** 2).sum(-1).mean()) == pytest.approx(1.0, rel=1e-4)
    assert torch.allclose(dense.mean((0, 1)), torch.zeros(4), atol=1e-4)
    assert float((dense ** 2).sum(-1).mean()) == pytest.approx(1.0, rel=1e-4)


def test_pool_grid_exact_and_plain_vit_shapes():
    tokens = torch.arange(64, dtype=torch.float32).view(1, 64, 1)  # value = 8 * row + col
    quadrants = baselines.pool_grid(tokens, 8, 4)[0, :, 0]
    # top-left mean: rows 0-3, cols 0-3 -> 8 * 1.5 + 1.5
    assert quadrants.tolist() == [13.5, 17.5, 45.5, 49.5]
    assert baselines.pool_grid(tokens, 8, 1)[0, 0, 0] == 31.5
    assert baselines.pool_grid(tokens, 8, 2)[0, :, 0].tolist() == [29.5, 33.5]
    with pytest.raises(ValueError, match="pooling shape"):
        baselines.pool_grid(tokens, 8, 3)
    model = baselines.PlainViT(16, 2, 8, 2, 1, 5, 3).eval()
    images = torch.rand(2, 1, 16, 16)
    assert model.pooled_tokens(images, 4).shape == (2, 4, 8)
    assert model.reconstruct(images, 16).shape == (2, 64, 3)
    summary, dense = model(images)
    assert summary.shape == (2, 5) and dense.shape == (2, 64, 3)
    # k = 64 pooling is the identity, so the reconstruction equals the direct dense head
    assert torch.allclose(model.reconstruct(images, 64), dense, atol=1e-6)


def test_teacher_heads_shapes():
    images = torch.rand(3, 1, 16, 16)
    assert baselines.SummaryTeacher(6)(images).shape == (3, 10)
    assert baselines.SummaryTeacher(6).features(images).shape == (3, 6)
    assert baselines.DenseTeacher(4)(images).shape == (3, 4, 11)
    assert baselines.DenseTeacher(4).features(images).shape == (3, 64, 4)


def test_relative_error_exact():
    target = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]])  # mean 0, energy 1 per location
    assert evaluate.relative_error(target.clone(), target) == 0.0
    assert evaluate.relative_error(torch.zeros_like(target), target) == pytest.approx(1.0)
    assert evaluate.relative_error(2 * target, target) == pytest.approx(1.0)


def fake_result(**overrides: float) -> SeedResult:
    ks = [1, 2, 4, 8, 16]
    metrics = {"teacher_r2_dense_from_summary": 0.3, "teacher_r2_summary_from_dense": 0.7,
               "teacher_summary_map": 0.95, "teacher_dense_quadrant_accuracy": 0.9,
               "elastic_p_at_1_tokens": 0.6, "elastic_p_at_1_cls": 0.2, "plain_p_at_1_tokens": 0.7,
               "elastic_p_at_1_mean": 0.45}
    for model, probe, recon in (("elastic", [0.8, 0.85, 0.9, 0.9, 0.95], [0.8, 0.6, 0.5, 0.55, 0.4]),
                                ("fixed16", [0.5, 0.6, 0.7, 0.9, 0.96], [1.0, 0.9, 0.8, 0.6, 0.3]),
                                ("fixed1", [0.82, 0.8, 0.8, 0.8, 0.8], [0.7, 0.7, 0.7, 0.7, 0.7]),
                                ("plain", [0.7] * 5, [0.9, 0.8, 0.6, 0.5, 0.4])):
        for i, (k, p, r) in enumerate(zip(ks, probe, recon, strict=True)):
            metrics[f"{model}_probe_map_k{k}"] = p
            metrics[f"{model}_recon_error_k{k}"] = r
            # read-out errors differ from the decoder errors: the recon curve scaled and shifted per model
            metrics[f"{model}_readout_error_k{k}"] = 0.5 * r + 0.1 * (i % 2)
            metrics[f"{model}_summary_cosine_k{k}"] = {"elastic": 0.4, "fixed1": 0.25}.get(model, 0.5) + 0.01 * i
    metrics.update(overrides)
    return SeedResult(0).add(metrics)


def test_claim_metrics_exact():
    cfg = Radio1DConfig(**CPU_LIKE)
    out = claim_metrics.claim_metrics(cfg, fake_result())
    assert out["teacher_r2_max"] == 0.7 and out["teacher_quality_min"] == 0.9
    assert out["elastic_map_k1_over_kmax"] == pytest.approx(0.8 / 0.95)
    assert out["elastic_minus_full_fixed_map_k1"] == pytest.approx(0.3)
    assert out["full_fixed_map_drop_k1"] == pytest.approx(0.46)
    assert out["elastic_minus_small_fixed_map_k1"] == pytest.approx(-0.02)
    assert out["elastic_minus_plain_map_k1"] == pytest.approx(0.1)
    assert out["elastic_recon_violations"] == 1.0
    # trapezoids over log2 k = 0..4, divided by 4
    elastic_area = ((0.8 + 0.6) + (0.6 + 0.5) + (0.5 + 0.55) + (0.55 + 0.4)) / 2 / 4
    fixed_area = ((1.0 + 0.9) + (0.9 + 0.8) + (0.8 + 0.6) + (0.6 + 0.3)) / 2 / 4
    assert out["elastic_recon_area"] == pytest.approx(elastic_area)
    assert out["elastic_over_full_fixed_recon_area"] == pytest.approx(elastic_area / fixed_area)
    assert out["full_fixed_recon_k1_over_kmax"] == pytest.approx(1.0 / 0.3)
    assert out["elastic_over_small_fixed_recon_k1"] == pytest.approx(0.8 / 0.7)
    assert out["elastic_retrieval_tokens_minus_cls"] == pytest.approx(0.4)
    assert out["elastic_retrieval_tokens_minus_plain_pooled"] == pytest.approx(-0.1)
    assert out["fixed1_recon_area"] == pytest.approx(0.7)
    # consecutive differences of the elastic curve: -0.2, -0.1, +0.05, -0.15 -> the largest is +0.05
    assert out["elastic_recon_max_increase"] == pytest.approx(0.05)
    assert out["small_fixed_minus_elastic_summary_cosine_k1"] == pytest.approx(0.25 - 0.4)
    assert out["elastic_retrieval_tokens_minus_mean"] == pytest.approx(0.15)
    assert out["elastic_retrieval_mean"] == 0.45
    # read-out curves: 0.5 * recon + 0.1 at k = 2 and k = 8
    bump = (0.1 + 0.1 + 0.1 + 0.1) / 2 / 4
    elastic_readout, fixed_readout = 0.5 * elastic_area + bump, 0.5 * fixed_area + bump
    plain_area = ((0.9 + 0.8) + (0.8 + 0.6) + (0.6 + 0.5) + (0.5 + 0.4)) / 2 / 4
    assert out["elastic_readout_area"] == pytest.approx(elastic_readout)
    assert out["elastic_over_full_fixed_readout_area"] == pytest.approx(elastic_readout / fixed_readout)
    assert out["elastic_over_plain_readout_area"] == pytest.approx(elastic_readout / (0.5 * plain_area + bump))
    assert out["full_fixed_readout_k1_over_kmax"] == pytest.approx(0.5 / 0.15)


def test_readout_error_exact():
    # dense map y = 2 x0 - x1 + 1 per location (2 locations, 1 channel): a linear image of the tokens -> error 0
    x_train = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 3.0], [3.0, 1.0], [1.0, 2.0]])[:, None, :]
    dense = lambda x: torch.stack([2 * x[:, 0, 0] - x[:, 0, 1] + 1, x[:, 0, 1]], dim=1)[..., None]  # noqa: E731
    x_test = torch.tensor([[4.0, 0.0], [0.0, 4.0]])[:, None, :]
    assert evaluate.readout_error(x_train, dense(x_train), x_test, dense(x_test), 1e-12) == \
        pytest.approx(0.0, abs=1e-9)
    # constant features carry nothing: prediction = train mean; error = SSE / SST about that mean = 1
    const = torch.ones(5, 1, 2)
    y_test = torch.tensor([[[0.0], [5.0]], [[4.0], [-1.0]]])
    assert evaluate.readout_error(const, dense(x_train), torch.ones(2, 1, 2), y_test, 1e-3) == pytest.approx(1.0)
    # standardisation: rescaling one feature column leaves the (ridge) read-out unchanged
    scaled_train, scaled_test = x_train * torch.tensor([100.0, 1.0]), x_test * torch.tensor([100.0, 1.0])
    y_noisy = dense(x_train) + torch.tensor([0.3, -0.2, 0.1, 0.0, -0.4])[:, None, None]
    assert evaluate.readout_error(scaled_train, y_noisy, scaled_test, dense(x_test), 0.1) == \
        pytest.approx(evaluate.readout_error(x_train, y_noisy, x_test, dense(x_test), 0.1), rel=1e-6)


def test_negative_control_unstandardised_readout_is_caught(monkeypatch):
    # without standardisation a fixed ridge penalises a small-scale feature more: the read-out then depends on units
    monkeypatch.setattr(evaluate, "standardise", lambda train, test: (train, test))
    x_train = torch.tensor([[0.0, 1.0], [1.0, 0.0], [2.0, 3.0], [3.0, 1.0], [1.0, 2.0]])[:, None, :]
    y = (2 * x_train[:, 0, 0] - x_train[:, 0, 1] + torch.tensor([0.3, -0.2, 0.1, 0.0, -0.4]))[:, None, None]
    x_test = torch.tensor([[4.0, 0.0], [0.0, 4.0]])[:, None, :]
    y_test = (2 * x_test[:, 0, 0] - x_test[:, 0, 1])[:, None, None]
    scale = torch.tensor([0.01, 1.0])
    assert evaluate.readout_error(x_train * scale, y, x_test * scale, y_test, 0.1) != \
        pytest.approx(evaluate.readout_error(x_train, y, x_test, y_test, 0.1), rel=1e-3)


def test_config_rejects_bad_values_by_key():
    with pytest.raises(ValidationError, match="fixed_ks"):
        Radio1DConfig(**{**CPU_LIKE, "train": {**CPU_LIKE["train"], "fixed_ks": [17]}})
    with pytest.raises(ValidationError, match="strictly increasing"):
        Radio1DConfig(**{**CPU_LIKE, "eval": {**CPU_LIKE["eval"], "ks": [4, 2]}})
    with pytest.raises(ValidationError, match="min_digits"):
        Radio1DConfig(**{**CPU_LIKE, "data": {**CPU_LIKE["data"], "min_digits": 4, "max_digits": 3}})
    with pytest.raises(ValidationError, match="required unless hub"):
        Radio1DConfig(eval=CPU_LIKE["eval"])
    with pytest.raises(ValidationError, match="n_train"):
        Radio1DConfig(**{**CPU_LIKE, "data": {**CPU_LIKE["data"], "n_train": "many"}})


def test_knn_leave_one_out_exact():
    features = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9], [0.8, 0.2]])
    labels = torch.tensor([0, 0, 1, 1, 1])
    # 1-NN: 0->1 (ok), 1->0 (ok), 2->3 (ok), 3->2 (ok), 4->1 (label 0, wrong)
    assert hub.knn_leave_one_out_accuracy(features, labels, 1) == pytest.approx(4 / 5)


class StandInRadio(torch.nn.Module):
    """forward_encoder(images, num_tokens=k): token j is the mean intensity of column band j (a 1D code)."""

    def forward_encoder(self, images: torch.Tensor, num_tokens: int) -> torch.Tensor:
        bands = images.mean(dim=(1, 2)).unfold(1, 4, 4).mean(-1)  # (B, 8)
        return torch.stack([bands, 1 - bands], dim=-1)[:, :num_tokens]


def test_hub_evaluation_with_a_local_stand_in():
    cfg = Radio1DConfig(eval={**CPU_LIKE["eval"], "ks": [1, 2, 8]},
                        hub={"model": "local/stand-in", "dataset": "local", "split": "validation", "n_images": 12,
                             "image_size": 32, "batch_size": 5, "knn_k": 1})
    rows = []
    for i in range(12):
        pixels = np.zeros((32, 32, 3), dtype=np.uint8)
        if i % 2:
            pixels[:, :16] = 200 + i  # label 1: left half bright
        else:
            pixels[:, 16:] = 200 + i  # label 0: right half bright
        rows.append({"image": Image.fromarray(pixels), "label": i % 2})
    result = hub.evaluate_hub(cfg, 0, data_dir=None, model=StandInRadio(), rows=rows)
    # k = 1 and 2 see only left bands: they separate the halves; at k = 8 the token mean is symmetric in the
    # halves, both labels get the same feature up to intensity, and kNN is at chance
    assert result.metrics["hub_knn_accuracy_k1"] == 1.0
    assert result.metrics["hub_knn_accuracy_k2"] == 1.0
    assert result.metrics["hub_knn_accuracy_k8"] < 0.8
    assert [row["k"] for row in result.tables["hub_knn"]] == [1, 2, 8]
    with pytest.raises(ValueError, match="expected"):
        hub.first_k_tokens(StandInRadio(), torch.zeros(1, 3, 32, 32), 9)


def test_hub_loader_asks_for_remote_code(monkeypatch):
    seen = {}

    class FakeAutoModel:
        @staticmethod
        def from_pretrained(name, **kwargs):
            seen.update(name=name, **kwargs)
            return torch.nn.Linear(1, 1)

    import transformers
    monkeypatch.setattr(transformers, "AutoModel", FakeAutoModel)
    model = hub.load_hub_model("nvidia/C-RADIOv4-1D-H", "bfloat16")
    assert seen == {"name": "nvidia/C-RADIOv4-1D-H", "trust_remote_code": True, "dtype": torch.bfloat16}
    assert not model.training


def test_vlm_proxy_reads_the_quadrant_a_token_carries():
    """Token j one-hot-encodes the digit of quadrant j (j < 4), tokens 4.. are noise: with k = 1 only quadrant
    0 is answerable (accuracy about 1/4 + 3/4 * chance), with k = 4 every question is."""
    from tasks.radio1d.config import VLMProxyConfig
    from tasks.radio1d.vlm_proxy import vlm_accuracy_vs_k

    g = torch.Generator().manual_seed(0)
    layouts = torch.randint(0, 11, (600, 4), generator=g)
    tokens = torch.randn(600, 8, 11, generator=g) * 0.1
    tokens[:, :4] = torch.nn.functional.one_hot(layouts, 11).float()
    # 300 steps at lr 1e-2 reached only 0.74 at k = 4 with one torch thread (another reduction order than with
    # two); 400 steps at 5e-3 reach 1.0 with either, so the check does not hang on float rounding.
    cfg = VLMProxyConfig(steps=400, batch_size=64, lr=5e-3, width=16, layers=1)
    rows = vlm_accuracy_vs_k(cfg, tokens[:400], layouts[:400], tokens[400:], layouts[400:], (1, 4), seed=0)
    accuracy = {row["k"]: row["vlm_accuracy"] for row in rows}
    assert accuracy[4] > 0.9
    assert accuracy[1] < 0.5
