"""The per-stage timing of a stamped `dvc repro` log (bench/paper_times.py), on a hand-made log."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def paper_times():
    spec = importlib.util.spec_from_file_location("paper_times", REPO / "bench" / "paper_times.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOG = """100.0 Running stage 'data-arm_ebm':
100.5 > python -m flows.stage arm_ebm --phase data
110.0 Updating lock file 'dvc.lock'
112.0 Running stage 'train-arm_ebm':
300.0 Running stage 'evaluate-arm_ebm':
320.0 Running stage 'data-coda':
325.5 Running stage 'report':
330.0 Use `dvc push` to send your updates to remote storage.
rc=0 wall=230.1
"""


def test_each_stage_runs_to_the_next_ones_start(paper_times, tmp_path: Path):
    log = tmp_path / "repro.log"
    log.write_text(LOG)
    timed, end = paper_times.read_timed_log(log)
    assert end == 330.0 and len(timed) == 8  # the unstamped trailer is skipped
    stages = paper_times.stage_seconds(timed, end)
    assert stages == {"data-arm_ebm": 12.0, "train-arm_ebm": 188.0, "evaluate-arm_ebm": 20.0, "data-coda": 5.5,
                      "report": 4.5}
    papers = paper_times.paper_phase_seconds(stages)
    assert papers == {"arm_ebm": {"data": 12.0, "train": 188.0, "evaluate": 20.0, "total": 220.0},
                      "coda": {"data": 5.5, "total": 5.5}}
    rows = paper_times.repro_rows(stages)
    assert [r["within_180_s"] for r in rows] == [False, True]


def test_output_lines_inside_a_stage_do_not_split_it(paper_times):
    """A stage's own output (here at 4 s) does not end it: only the next "Running stage" line does."""
    timed = [(0.0, "Running stage 'data-a':"), (4.0, "some output"), (10.0, "Running stage 'train-a':")]
    assert paper_times.stage_seconds(timed, 15.0) == {"data-a": 10.0, "train-a": 5.0}
