"""What each worker of a local Dask cluster (`--workers N` on partitions) runs as it starts: the
pipeline imported then, not when its first task arrives, and Ctrl-C left to the client."""

from __future__ import annotations

import signal
from typing import Any

import analyzer.api  # noqa: F401  (imported while the client learns the whole inputs)


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, in the worker's process: SIGINT ignored there. A Ctrl-C typed in a
    terminal reaches the whole foreground group, and a worker would print its KeyboardInterrupt
    traceback; the client stops its workers itself (as a local fleet's workers are stopped:
    cluster_local._serve)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
