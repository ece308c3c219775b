"""Python's cycle collector, paused where a process keeps what it makes: a pass walks every
object still alive, and objects kept to the end of the process (imported modules, the
servers a fleet's process keeps until it finishes them) make each pass dearer and free nothing."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused(*, keep: bool = False) -> Iterator[None]:
    """The cycle collector off inside, on again after if it was on. `keep`: what was made
    inside is kept to the end of the process, so it is set aside first (gc.freeze) on leaving
    without an error: else the first pass after walks all of it, as none of it was ever in one
    (the CLI's imports make some 50,000 objects at once, which set off a pass of 10 ms in the
    seed sample's audit of 0.7 s; the first pass after a 16k-run audit walked its report's
    objects for 0.2 s; after a fleet of 8 servers of 2k runs, 0.1 s)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
        if keep:
            gc.freeze()
    finally:
        if was_on:
            gc.enable()


ENDS_WITH_COMMAND = False  # set by the console script, whose process ends when its command does
_KEPT: list[object] = []


def kept(*objects: object) -> None:
    """`objects` held to the end of a process that ends with its command (ENDS_WITH_COMMAND),
    so that leaving the command does not free them one by one (a fleet of 8 servers' merged
    report: 0.05 s, its process's end then takes none); elsewhere (a test's runner, a
    notebook) nothing is held."""
    if ENDS_WITH_COMMAND:
        _KEPT.extend(objects)
