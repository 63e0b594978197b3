"""Curves reach MLflow whole, step by step, in as few log_batch calls as MLflow's 1,000-metric limit allows
(tasks/common/tracking.py log_curves)."""

from __future__ import annotations

import pytest

from tasks.common import tracking


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("REPRO_MLARTIFACTS", str(tmp_path / "mlartifacts"))
    return tmp_path


def history(run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tracking._client().get_metric_history(run_id, key))


def test_every_point_of_every_curve_is_logged_at_its_step(store, monkeypatch):
    calls = []
    client = tracking._client()
    real = client.log_batch
    monkeypatch.setattr(type(client), "log_batch", lambda self, run_id, **kw: (calls.append(len(kw.get("metrics", ()))),
                                                                                real(run_id, **kw))[1])
    run_id = tracking.start_run("paper_x", "seed-0", {})
    loss = [1.0 / (1 + step) for step in range(1200)]
    accuracy = [0.5, 0.75, 0.875]
    tracking.log_curves(run_id, {"curve/loss": loss, "curve/accuracy": accuracy})
    tracking.end_run(run_id)
    assert calls[-2:] == [1000, 203]  # 1,203 points in two calls, not one call per curve
    assert history(run_id, "curve/accuracy") == [(0, 0.5), (1, 0.75), (2, 0.875)]
    logged = history(run_id, "curve/loss")
    assert len(logged) == 1200 and logged[0] == (0, 1.0) and logged[999] == (999, 0.001)
    assert logged[1199] == (1199, 1 / 1200)
