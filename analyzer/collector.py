"""Python's cycle collector, paused where a process keeps what it makes: a pass walks every
object still alive, and objects kept to the end of the process (imported modules, the
servers a fleet's process keeps until it finishes them) make each pass dearer and free nothing."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def paused() -> Iterator[None]:
    """The cycle collector off inside, on again after if it was on."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
