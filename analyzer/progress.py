"""Stages of long work, reported to whoever listens (the CLI's progress bars and -v timings).

The library marks its stages (`with stage("reading", total=n, unit="files") as step: ...
step(note)`), naming what it counts; with no listener installed (library use, tests, -q) a
stage costs nothing and prints nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol


class Listener(Protocol):
    def begin(self, description: str, total: int | None, unit: str) -> None: ...
    def step(self, note: str | None = None, count: int = 1) -> None: ...
    def end(self, description: str) -> None: ...


LISTENER: ContextVar[Listener | None] = ContextVar("progress_listener", default=None)


def listening() -> bool:
    """Whether anyone shows the stages (a count that costs work is taken only then)."""
    return LISTENER.get() is not None


def current_step() -> Callable[..., None]:
    """The innermost stage's step function (a no-op outside any stage or without a listener):
    a reader deep in the library counts its files without being handed the step."""
    listener = LISTENER.get()
    return listener.step if listener is not None else _ignore


def _ignore(note: str | None = None, count: int = 1) -> None:
    return None


@contextmanager
def stage(
    description: str, total: int | None = None, unit: str = ""
) -> Iterator[Callable[..., None]]:
    """A stage of work counting `total` `unit`s (files, swimlanes); the yielded function marks
    `count` of them done (0: a -v note only)."""
    listener = LISTENER.get()
    if listener is None:
        yield _ignore
        return
    listener.begin(description, total, unit)
    try:
        yield listener.step
    finally:
        listener.end(description)


@contextmanager
def quiet_stages() -> Iterator[None]:
    """The stages of the work inside not shown (a whole task's, counted as one step of the
    stage around it)."""
    token = LISTENER.set(None)
    try:
        yield
    finally:
        LISTENER.reset(token)
