"""Terminal progress bars per seed (issue 22): drawn on Prefect's console handler when it writes to a
terminal, without the progress log lines doubling them there; the log lines still reach every other handler
(the Prefect API's: the UI's log tab), and off a terminal nothing changes."""

from __future__ import annotations

import io
import logging
import re

import pytest
from prefect.logging.handlers import PrefectConsoleHandler
from rich.console import Console
from rich.theme import Theme

from tasks.common import progress_bars
from tasks.common.paper_flow import SeedProgress, progress_label
from tasks.common.progress_bars import SHOWN_AS_BAR

CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")
PROGRESS_LINE = re.compile(r"\[arm_ebm\] train seed \d +\d+% .*\(\d+ s, (ETA \d+ s|done)\)")


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeTerminal(io.StringIO):
    """What a terminal receives, kept as text; it says it is a TTY as a terminal's file does."""

    def isatty(self) -> bool:
        return True


class Records(logging.Handler):
    """Stands for Prefect's API handler: every record that reaches it goes to the UI's log tab."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        self.records.append(record)


def console_handler(screen: io.StringIO, terminal: bool, term: str = "xterm") -> PrefectConsoleHandler:
    """Prefect's console handler on ``screen``, its console as Prefect builds it (no markup: PREFECT_LOGGING_MARKUP
    is off by default), 120 columns wide and without colours so that the frames compare as text."""
    handler = PrefectConsoleHandler(stream=screen)
    # Prefect's theme holds its log styles only (Theme(..., inherit=False)): none of rich's progress styles.
    handler.console = Console(file=screen, force_terminal=terminal, width=120, color_system=None, markup=False,
                              legacy_windows=False, _environ={"TERM": term},
                              theme=Theme({"log.info_level": "cyan"}, inherit=False))
    return handler


@pytest.fixture
def logger():
    """A logger with a terminal handler and an API-like handler, as the root logger has under Prefect."""
    log = logging.getLogger("tests.progress_bars")
    log.setLevel(logging.INFO)
    log.propagate = False
    yield log
    log.handlers.clear()


def run_two_seeds(log: logging.Logger, clock: FakeClock, bars) -> None:
    """Seed 0 reports all of 1000 steps, seed 1 half of them, interleaved as two threads would."""
    def reporter(seed: int) -> SeedProgress:
        if bars is None:
            return SeedProgress("arm_ebm", seed, "train", log.info, lambda _: None, clock=clock)
        return SeedProgress("arm_ebm", seed, "train", lambda line: log.info(line, extra={SHOWN_AS_BAR: True}),
                            lambda _: None, clock=clock, bar=bars.add(progress_label("arm_ebm", seed, "train")))

    seeds = [reporter(0), reporter(1)]
    for step in range(1, 1001):
        clock.now += 0.05
        seeds[0](step / 1000, f"seed 0: GPT-2 step {step}/1000, loss 0.5")
        if step <= 500:
            seeds[1](step / 1000, f"seed 1: GPT-2 step {step}/1000, loss 0.7")
    log.info("a line of Prefect's own")


def test_a_terminal_gets_one_bar_per_seed_and_no_doubled_progress_lines(logger):
    screen, clock, api = FakeTerminal(), FakeClock(), Records()
    handler = console_handler(screen, terminal=True)
    logger.addHandler(handler)
    logger.addHandler(api)
    with progress_bars.on_terminal(handler, clock=clock) as bars:
        assert bars is not None and progress_bars.active() is bars
        run_two_seeds(logger, clock, bars)
    assert progress_bars.active() is None
    # Each redraw moves the cursor up and clears lines: a control sequence ends a line of the frame.
    shown = CONTROL.sub("\n", screen.getvalue())
    lines = [line.rstrip() for line in shown.splitlines() if line.strip()]
    # The final frame: one bar per seed, with the step, the loss, the elapsed time and the ETA.
    assert lines[-2:] == [
        # (without colours the bar's unfinished part is blank; seed 1's ETA is from its last report, at 25 s)
        "[arm_ebm] train seed 0 ━━━━━━━━━━━━━━━━━━━━━━━━ 100% 0:00:50 done     GPT-2 step 1000/1000, loss 0.5",
        "[arm_ebm] train seed 1 ━━━━━━━━━━━━              50% 0:00:50 ETA 25 s GPT-2 step 500/1000, loss 0.7",
    ], lines[-2:]
    # No progress line in the terminal (the bars show them); Prefect's own lines print above the bars, once.
    assert not [line for line in lines if PROGRESS_LINE.search(line)], lines
    assert shown.count("a line of Prefect's own") == 1
    # Every other handler (the Prefect UI's log tab) gets the same lines as without a terminal.
    assert len([line for line in api.lines if line.startswith("[arm_ebm] train seed 0")]) == 11
    assert [line for line in api.lines if line.startswith("[arm_ebm] train seed 1")][-1] == \
        "[arm_ebm] train seed 1  50% GPT-2 step 500/1000, loss 0.7 (25 s, ETA 25 s)"
    # The terminal's cursor is shown again when the bars stop.
    assert screen.getvalue().endswith("\x1b[?25h") or "\x1b[?25h" in screen.getvalue()[-200:]


@pytest.mark.parametrize("why", ["not a terminal", "REPRO_PROGRESS=lines", "TERM=dumb"])
def test_off_a_terminal_the_output_is_the_log_lines_as_before(logger, monkeypatch, why):
    screen, clock = (FakeTerminal() if why != "not a terminal" else io.StringIO()), FakeClock()
    handler = console_handler(screen, terminal=why != "not a terminal", term="dumb" if why == "TERM=dumb" else "xterm")
    if why == "REPRO_PROGRESS=lines":
        monkeypatch.setenv("REPRO_PROGRESS", "lines")
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    with progress_bars.on_terminal(handler, clock=clock) as bars:
        assert bars is None and progress_bars.active() is None
        run_two_seeds(logger, clock, bars)
    shown = screen.getvalue().splitlines()
    # Exactly the throttled lines (11 for seed 0, 6 for seed 1) and Prefect's own line: no bar, no control code.
    assert len(shown) == 11 + 6 + 1, shown
    assert shown[0] == "[arm_ebm] train seed 0   0% GPT-2 step 1/1000, loss 0.5 (0 s, ETA 50 s)"
    assert shown[-2] == "[arm_ebm] train seed 0 100% GPT-2 step 1000/1000, loss 0.5 (50 s, done)"
    assert "\x1b[" not in screen.getvalue() and "━" not in screen.getvalue()


def test_nested_phases_share_one_display_until_the_outer_ends(logger):
    handler = console_handler(FakeTerminal(), terminal=True)
    with progress_bars.on_terminal(handler) as outer:
        with progress_bars.on_terminal(handler) as inner:
            assert inner is outer
        assert progress_bars.active() is outer
    assert progress_bars.active() is None
    assert sum(isinstance(f, progress_bars.DropShownAsBar) for f in handler.filters) == 1


def test_a_flow_task_reports_to_the_bar_and_marks_its_log_lines(monkeypatch, logger):
    """paper_flow._progress (what train_seed/evaluate_seed use) while bars are drawn, and when they are not."""
    from tasks.common import paper_flow

    api = Records()
    logger.addHandler(api)
    artifacts: list[float] = []
    monkeypatch.setattr(paper_flow, "get_run_logger", lambda: logger)
    monkeypatch.setattr(paper_flow, "create_progress_artifact", lambda *a, **k: "artifact")
    monkeypatch.setattr(paper_flow, "update_progress_artifact", lambda _artifact, percent: artifacts.append(percent))
    plain = paper_flow._progress("arm_ebm", 0, "evaluate")
    assert plain.bar is None
    screen = FakeTerminal()
    handler = console_handler(screen, terminal=True)
    logger.addHandler(handler)
    with progress_bars.on_terminal(handler):
        progress = paper_flow._progress("arm_ebm", 0, "evaluate")
        assert progress.bar is not None
        progress(1.0, "seed 0: evaluated")
    assert artifacts == [100.0]
    assert api.lines[-1].startswith("[arm_ebm] evaluate seed 0 100% evaluated")
    assert getattr(api.records[-1], SHOWN_AS_BAR, False) is True
    assert "[arm_ebm] evaluate seed 0" in CONTROL.sub("", screen.getvalue())
    assert "100% evaluated (" not in screen.getvalue()



def test_bars_only_where_the_seeds_run_in_this_process(monkeypatch):
    """Under the Dask runner the seeds run in worker processes, which cannot draw on this terminal's bars."""
    import contextlib
    from types import SimpleNamespace

    from prefect.context import FlowRunContext
    from prefect.task_runners import ThreadPoolTaskRunner

    from tasks.common import paper_flow

    class DaskLike:
        pass

    monkeypatch.setattr(FlowRunContext, "get", classmethod(lambda cls: SimpleNamespace(task_runner=DaskLike())))
    assert isinstance(paper_flow.seed_bars(), contextlib.nullcontext)
    monkeypatch.setattr(FlowRunContext, "get",
                        classmethod(lambda cls: SimpleNamespace(task_runner=ThreadPoolTaskRunner(max_workers=2))))
    assert not isinstance(paper_flow.seed_bars(), contextlib.nullcontext)
