"""The cores this process's threads run on. A query on polars' pool of one thread is a wait of
the calling thread for the pool's: across two cores each such wait wakes the other core, and the
pool's thread spins there before it sleeps (rayon), which costs CPU time and no wall time is won
when the pool has one thread. Kept on one core, the two threads hand over in place."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


def usable() -> list[int]:
    """The cores this process may run on, in order; none where the system cannot say."""
    if not hasattr(os, "sched_getaffinity"):
        return []
    return sorted(os.sched_getaffinity(0))


def current() -> int | None:
    """The core this thread last ran on (the 39th field of /proc/self/stat), or None."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            return int(stat.read().rsplit(b")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return None


def keep_to(cores: set[int]) -> None:
    """Every thread of this process, and every thread it starts from then on, kept to `cores`
    (nothing where the system cannot). Polars is imported first: its allocator counts the
    cores as it loads, and warns when it finds fewer than the machine has."""
    if not hasattr(os, "sched_setaffinity"):
        return
    import polars  # noqa: F401

    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        return
    for thread in threads:
        try:
            os.sched_setaffinity(int(thread), cores)
        except (OSError, ValueError):  # a thread that ended meanwhile
            continue


@contextmanager
def kept_to(cores: set[int]) -> Iterator[None]:
    """`keep_to(cores)` while inside; on leaving, every thread given back the cores this process
    had before (a notebook's process keeps its cores once an audit is done)."""
    had = usable()
    keep_to(cores)
    try:
        yield
    finally:
        keep_to(set(had))


def one_core() -> set[int] | None:
    """The core the calling thread runs on, to keep every thread to; None when this process
    may run on one core only, or the system cannot say which."""
    if len(usable()) < 2 or (core := current()) is None:
        return None
    return {core}


@contextmanager
def on_one_core() -> Iterator[None]:
    """Every thread kept on `one_core()` while inside (`kept_to`), for work that is a long run
    of small queries; nothing where there is none."""
    if (core := one_core()) is None:
        yield
        return
    with kept_to(core):
        yield
