"""Live progress bars, one per seed, when the run's log goes to a terminal.

``paper_flow.SeedProgress`` logs a line per tenth of a seed's training or evaluation: the right record for
the Prefect UI's log tab, DVC, CI and any log file, but 20-36 s of silence between two lines in a terminal.
When Prefect's console handler writes to an interactive terminal, each seed also gets a bar (step, loss,
elapsed time, ETA) that moves with every report, drawn with ``rich`` (Prefect's own dependency) on that
handler's console, so that Prefect's log lines print above the bars instead of through them. Those progress
lines then leave the terminal (the bar shows them) but still reach every other handler, the Prefect API's
included: the UI's log tab is the same with or without a terminal. Off a terminal nothing changes.

``REPRO_PROGRESS=lines`` keeps the log lines in a terminal too (no bars).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from rich.console import Console
from rich.default_styles import DEFAULT_STYLES
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Column
from rich.theme import Theme

# rich's own styles of progress bars and columns ("bar.back", "progress.percentage", ...).
PROGRESS_THEME = Theme({name: style for name, style in DEFAULT_STYLES.items()
                        if name.startswith(("bar.", "progress."))}, inherit=False)
# ``extra`` of a progress log record that a terminal bar already shows: the console handler drops it.
SHOWN_AS_BAR = "repro_shown_as_bar"
PROGRESS_ENV = "REPRO_PROGRESS"


class SeedBars:
    """One ``rich`` progress display with a bar per seed (``add``), live on ``console`` between ``start`` and
    ``stop``. Thread-safe: the seeds report from the task runner's threads."""

    def __init__(self, console: Console, clock: Callable[[], float] | None = None, auto_refresh: bool = True):
        columns: list[Any] = [
            TextColumn("{task.description}", markup=False),  # "[arm_ebm] ..." is a label, not rich markup
            BarColumn(bar_width=24),
            TaskProgressColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}", table_column=Column(no_wrap=True)),
            # The step's own message (step, loss); cut at the terminal's width rather than wrapped.
            TextColumn("{task.fields[status]}", markup=False,
                       table_column=Column(no_wrap=True, overflow="ellipsis")),
        ]
        kwargs: dict[str, Any] = {"get_time": clock} if clock is not None else {}
        self.progress = Progress(*columns, console=console, auto_refresh=auto_refresh, transient=False,
                                 refresh_per_second=4, **kwargs)

    def start(self) -> None:
        # Prefect's console has a theme of its own without rich's defaults (Theme(inherit=False)): the bar and
        # progress styles are lent to it while the bars draw, and nothing else of its theme changes.
        self.progress.console.push_theme(PROGRESS_THEME)
        self.progress.start()

    def stop(self) -> None:
        """Draw the bars' final state and give the terminal back (cursor shown again)."""
        try:
            self.progress.stop()
        finally:
            self.progress.console.pop_theme()

    def refresh(self) -> None:
        self.progress.refresh()

    def add(self, label: str) -> Callable[[float, str, str], None]:
        """A new bar labelled ``label``; returns its ``update(fraction, eta, status)``."""
        task: TaskID = self.progress.add_task(label, total=1.0, eta="ETA -", status="")

        def update(fraction: float, eta: str, status: str) -> None:
            self.progress.update(task, completed=min(max(fraction, 0.0), 1.0), eta=eta, status=status)

        return update


class DropShownAsBar(logging.Filter):
    """On the terminal's log handler: drop the progress lines a live bar already shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, SHOWN_AS_BAR, False)


def terminal_handler() -> logging.Handler | None:
    """Prefect's terminal log handler (on the root logger) when it writes to an interactive terminal and bars
    are not turned off; None otherwise (a pipe, a file, CI, ``REPRO_PROGRESS=lines``)."""
    from prefect.logging.handlers import PrefectConsoleHandler

    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and wants_bars(handler):
            return handler
    return None


def wants_bars(handler: logging.Handler) -> bool:
    """Whether ``handler`` (one with a ``rich`` console, as Prefect's is) draws on an interactive terminal: its
    file is a TTY (``FORCE_COLOR``, set in some CI logs for colours, does not make a log file a terminal) and
    rich sees no dumb terminal (``TERM=dumb``) or ``TTY_INTERACTIVE=0``."""
    if os.environ.get(PROGRESS_ENV, "").strip().lower() == "lines":
        return False
    console = getattr(handler, "console", None)
    if not isinstance(console, Console) or not console.is_interactive:
        return False
    try:
        return bool(console.file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file (end of a pytest run)
        return False


_lock = threading.Lock()
_active: SeedBars | None = None
_users = 0


def active() -> SeedBars | None:
    """The bars being drawn now (inside ``on_terminal``), or None."""
    return _active


@contextlib.contextmanager
def on_terminal(handler: logging.Handler | None = None,
                clock: Callable[[], float] | None = None) -> Iterator[SeedBars | None]:
    """Bars live for the ``with`` block, on the console of ``handler`` (default: Prefect's terminal handler),
    when that console is an interactive terminal; otherwise yields None and draws nothing. Nested blocks share
    one display, which stops when the outermost ends."""
    global _active, _users
    target = terminal_handler() if handler is None else handler if wants_bars(handler) else None
    with _lock:
        if _active is None and target is not None:
            if not any(isinstance(f, DropShownAsBar) for f in target.filters):
                target.addFilter(DropShownAsBar())
            _active = SeedBars(target.console, clock)  # type: ignore[attr-defined]
            _active.start()
        if _active is not None:
            _users += 1
        bars = _active
    try:
        yield bars
    finally:
        if bars is not None:
            with _lock:
                _users -= 1
                if _users == 0:
                    _stop_locked()


def _stop_locked() -> None:
    global _active, _users
    if _active is not None:
        with contextlib.suppress(Exception):  # the terminal may be gone; nothing to draw on then
            _active.stop()
    _active, _users = None, 0


def stop_active() -> None:
    """Stop the bars at once (a signal ends the process): the terminal gets its cursor back."""
    if _lock.acquire(timeout=1.0):
        try:
            _stop_locked()
        finally:
            _lock.release()
    elif _active is not None:  # held by a thread that will not let go before the process ends
        with contextlib.suppress(Exception):
            _active.stop()
