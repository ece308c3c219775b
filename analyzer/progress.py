"""Stages of long work, reported to whoever listens (the CLI's progress bars and -v timings).

The library marks its stages (`with stage("reading", total=n) as step: ... step(note)`); with
no listener installed (library use, tests, -q) a stage costs nothing and prints nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Protocol


class Listener(Protocol):
    def begin(self, description: str, total: int | None) -> None: ...
    def step(self, note: str | None) -> None: ...
    def end(self, description: str) -> None: ...


LISTENER: ContextVar[Listener | None] = ContextVar("progress_listener", default=None)


def _ignore(note: str | None = None) -> None:
    return None


@contextmanager
def stage(description: str, total: int | None = None) -> Iterator[Callable[..., None]]:
    """A stage of work; the yielded function marks one of its `total` steps done."""
    listener = LISTENER.get()
    if listener is None:
        yield _ignore
        return
    listener.begin(description, total)
    try:
        yield listener.step
    finally:
        listener.end(description)
