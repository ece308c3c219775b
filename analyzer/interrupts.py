"""Python's own handlers of the stopping signals kept once polars is imported.

polars' runtime replaces Python's SIGINT handler with its own at import (signal-hook's,
pola-rs/polars#21739): it calls the one it replaced, but with SA_RESTART, so a main thread
waiting on a lock (a page on its way, a thread joined) is put back to sleep and a Ctrl-C typed
in a terminal was seen only when the wait ended (a `collect` from a server that had not
answered: never); and over SIG_IGN (a local worker's: the client stops it) it aborts the query
in hand with a KeyboardInterrupt all the same. Only the standard library is imported here.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

STOPS = ("SIGINT", "SIGTERM", "SIGHUP")  # the signals that stop a command, by name


class _AfterPolars:
    """A meta-path finder that only watches for `polars` (the pattern of post-import hooks):
    once polars' module has run, each of `signals` is given its handler again, which puts
    Python's own back (or SIG_IGN, where it was ignored)."""

    def __init__(self, signals: Sequence[int]) -> None:
        self.signals = list(signals)

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "polars":
            return None
        import importlib.util

        self.forget()
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            run = spec.loader.exec_module

            def exec_module(module: Any) -> None:
                run(module)
                self.restore()

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec

    def restore(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may set a handler (polars first imported elsewhere)
        for signum in self.signals:
            signal.signal(signum, signal.getsignal(signum))

    def forget(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def handlers_kept_after_polars(signals: Sequence[int]) -> _AfterPolars:
    """Watch for polars' import (until `forget`), to give `signals` their handlers again then;
    nothing to watch when polars is imported already (the handlers set since are the last)."""
    watch = _AfterPolars(signals)
    if signals and "polars" not in sys.modules:
        sys.meta_path.insert(0, watch)
    return watch
