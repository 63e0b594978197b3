"""An unusable MLflow store gives one line naming the file and the next step (tasks/common/tracking.py)."""

from __future__ import annotations

import sqlite3

import pytest

from tasks.common import tracking


@pytest.fixture
def store(tmp_path, monkeypatch):
    db = tmp_path / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.setenv("REPRO_MLARTIFACTS", str(tmp_path / "mlartifacts"))
    monkeypatch.setattr(tracking.time, "sleep", lambda s: None)  # the retries' back-off, not waited here
    return db


def test_a_damaged_store_names_the_file_and_how_to_move_it_aside(store):
    store.write_bytes(b"this is not a SQLite database, it was truncated or overwritten" * 100)
    with pytest.raises(tracking.TrackingStoreError) as caught:
        tracking.start_run("paper_x", "run", {})
    message = str(caught.value)
    assert message.startswith(f"{store} is damaged (") and f"`mv {store} {store}.broken`" in message
    assert "\n" not in message


def test_a_store_locked_past_the_retries_names_the_file_and_the_holder_hint(store):
    attempts = []

    def locked():
        attempts.append(1)
        # what SQLAlchemy raises when another connection holds SQLite's write lock
        raise sqlite3.OperationalError("database is locked")

    with pytest.raises(tracking.TrackingStoreError) as caught:
        tracking._retry(locked, attempts=3)
    assert len(attempts) == 3  # retried with back-off before giving up
    message = str(caught.value)
    assert message.startswith(f"{store} stayed locked through 3 retries") and f"fuser {store}" in message


def test_a_lock_released_during_the_retries_is_waited_out(store):
    attempts = []

    def locked_twice():
        attempts.append(1)
        if len(attempts) < 3:
            raise sqlite3.OperationalError("database is locked")
        return "written"

    assert tracking._retry(locked_twice, attempts=8) == "written"


def test_other_errors_pass_through_unchanged(store):
    def broken():
        raise ValueError("a bug, not the store")

    with pytest.raises(ValueError, match="a bug, not the store"):
        tracking._retry(broken)
    assert tracking.store_problem(ValueError("database is locked"), 8) is not None
    assert tracking.store_problem(ValueError("no such table: runs"), 8) is None
