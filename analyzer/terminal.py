"""The terminal side of the CLI: consoles that colour only on a terminal (never with NO_COLOR or
--no-color), progress bars on stderr (only on a terminal, never with -q) and -v timings.

The bars only ever write to stderr and never take over stdout (rich's Progress redirects
sys.stdout by default: `audit --format json > out.json` then painted the JSON on the screen).

rich is imported here only, so the library and the JSON paths never pay for it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

from analyzer.progress import LISTENER


@dataclass
class Settings:
    """What the common options (-q, -v, --no-color) asked for, for this command."""

    quiet: bool = False
    verbose: bool = False
    no_color: bool = False


SETTINGS = Settings()


def colour_wanted(stream: IO[str]) -> bool:
    """Colour only for a terminal, and never when NO_COLOR (any value) or --no-color says no."""
    if SETTINGS.no_color or "NO_COLOR" in os.environ:
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def console(
    stream: IO[str] | None = None,
    *,
    width: int | None = None,
    colour: bool | None = None,
    color_system: str = "auto",
) -> Any:
    """A rich console writing to `stream`: plain text unless it is a colour terminal (or
    `colour` says otherwise); never markup, emoji or highlighting taken from the data."""
    from rich.console import Console

    stream = stream if stream is not None else sys.stdout
    colour = colour_wanted(stream) if colour is None else colour
    return Console(
        file=stream,
        width=width,
        force_terminal=colour,
        no_color=not colour,
        color_system=color_system if colour else None,
        highlight=False,
        emoji=False,
        markup=False,
        soft_wrap=False,
        legacy_windows=False,
    )


def _counted_column() -> Any:
    """'3/35 files': what a stage counts, with its unit; nothing for a stage that counts
    nothing (rich's own column says '0/?')."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class Counted(ProgressColumn):
        def render(self, task: Any) -> Any:
            if task.total is None:
                return Text("")
            unit = task.fields.get("unit", "")
            unit = unit[:-1] if task.total == 1 and unit.endswith("s") else unit
            return Text(f"{int(task.completed)}/{int(task.total)} {unit}".rstrip())

    return Counted()


class _Listener:
    """Progress bars for the library's stages on stderr, and with -v one line per stage."""

    def __init__(self, bars: bool, verbose: bool) -> None:
        self.err = console(sys.stderr)
        self.bars = bars
        self.verbose = verbose
        self.progress: Any = None
        self.tasks: list[tuple[Any, float]] = []

    def begin(self, description: str, total: int | None, unit: str = "") -> None:
        task = None
        if self.bars:
            if self.progress is None:
                from rich.progress import (
                    BarColumn,
                    Progress,
                    SpinnerColumn,
                    TextColumn,
                    TimeElapsedColumn,
                )

                self.progress = Progress(
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    BarColumn(),
                    _counted_column(),
                    TimeElapsedColumn(),
                    console=self.err,
                    transient=True,
                    redirect_stdout=False,  # the output is the command's, never the display's
                    redirect_stderr=False,
                )
                self.progress.start()
            task = self.progress.add_task(description, total=total, unit=unit)
        self.tasks.append((task, time.perf_counter()))

    def step(self, note: str | None = None, count: int = 1) -> None:
        task = self.tasks[-1][0] if self.tasks else None
        if self.progress is not None and task is not None and count:
            shown = next(t for t in self.progress.tasks if t.id == task)
            done = shown.completed + count
            # a symlinked folder inside a folder is read but not counted ahead: never past total
            self.progress.update(task, completed=min(done, shown.total or done))
        if self.verbose and note:
            self._say(note)

    def end(self, description: str) -> None:
        task, started = self.tasks.pop()
        if self.progress is not None and task is not None:
            self.progress.remove_task(task)
        if self.verbose:
            self._say(f"{description}: {time.perf_counter() - started:.2f}s")
        if not self.tasks:  # between stages (and while the output is written) no display
            self.close()

    def _say(self, text: str) -> None:
        """One -v line: a file name with escape sequences or a secret's shape shows inert."""
        from analyzer.redact import Redactor, without_controls

        line = Redactor().apply(without_controls(f"dstack-audit: {text}"))
        if self.progress is not None:
            self.progress.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            self.err.print(line, markup=False, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


@contextmanager
def reporting() -> Iterator[None]:
    """Listen to the library's stages for the duration of a command."""
    bars = not SETTINGS.quiet and sys.stderr.isatty()
    if not bars and not SETTINGS.verbose:
        yield
        return
    listener = _Listener(bars, SETTINGS.verbose and not SETTINGS.quiet)
    token = LISTENER.set(listener)
    try:
        yield
    finally:
        LISTENER.reset(token)
        listener.close()
