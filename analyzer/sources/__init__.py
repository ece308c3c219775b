"""Source registry: each kind of input registers a content sniffer and a loader here.

Adding an input format is adding a module with a `Source` and one line in `_REGISTRY`; nothing
else changes. Sniffers look at content, never at file names.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import polars as pl

from analyzer.errors import AuditInputError
from analyzer.model import (
    EVENTS_SCHEMA,
    FLEETS_SCHEMA,
    INSTANCES_SCHEMA,
    JOBS_SCHEMA,
    RUNS_SCHEMA,
    conform,
    empty_frame,
)

DATABASE_URL = re.compile(r"^postgres(?:ql)?(?:\+\w+)?://")
DATASET_URL = re.compile(r"^(?:s3|gs|gcs|az|abfs|abfss|https?|file)://")
LIVE_URL = re.compile(r"^(?:https?://|dstack:)")


@dataclass(frozen=True)
class ReadOptions:
    """What a source may push down into its reads (the audit filters again regardless)."""

    partition: tuple[int, int] | None = None  # (index, count): buckets with b % count == index
    since: datetime | None = None
    project: str | None = None


READ_OPTIONS: ContextVar[ReadOptions | None] = ContextVar("read_options", default=None)


def read_options() -> ReadOptions:
    return READ_OPTIONS.get() or ReadOptions()


@dataclass
class InputInfo:
    """Chain-of-custody facts about one input as it was read."""

    path: str
    kind: str
    sha256: str | None
    size: int | None
    mtime: float | None
    records: int = 0
    unparsed: int = 0
    server_version: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass
class Limitation:
    code: str
    message: str
    source: str


_EMPTY: dict[str, pl.DataFrame] = {}


def _empty(name: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """One shared empty frame per table: polars frames are immutable, and building one costs
    milliseconds, which a folder of thousands of unrecognised files would pay per file."""
    if name not in _EMPTY:
        _EMPTY[name] = empty_frame(schema)
    return _EMPTY[name]


@dataclass
class SourceData:
    """What one input contributes to the canonical model."""

    runs: pl.DataFrame = field(default_factory=lambda: _empty("runs", RUNS_SCHEMA))
    jobs: pl.DataFrame = field(default_factory=lambda: _empty("jobs", JOBS_SCHEMA))
    events: pl.DataFrame = field(default_factory=lambda: _empty("events", EVENTS_SCHEMA))
    fleets: pl.DataFrame = field(default_factory=lambda: _empty("fleets", FLEETS_SCHEMA))
    instances: pl.DataFrame = field(default_factory=lambda: _empty("instances", INSTANCES_SCHEMA))
    has_fleet_tables: bool = False  # holds the fleets and instances tables (may be empty)
    inputs: list[InputInfo] = field(default_factory=list)
    limitations: list[Limitation] = field(default_factory=list)
    has_tables: bool = False  # holds runs/jobs rows (a database or its exports)
    server_version: str | None = None
    log_reads: list = field(default_factory=list)  # (LogRead, LogFacts) of each log read
    secrets: set[str] = field(default_factory=set)  # values never to show (see redact.py)
    events_table_of: set[str] = field(default_factory=set)  # servers whose events table it holds
    # per server: the latest moment the whole input shows it alive (beyond a partition)
    latest_time: dict[str, datetime] = field(default_factory=dict)

    def conformed(self) -> SourceData:
        self.runs = conform(self.runs, RUNS_SCHEMA).collect()
        self.jobs = conform(self.jobs, JOBS_SCHEMA).collect()
        self.events = conform(self.events, EVENTS_SCHEMA).collect()
        self.fleets = conform(self.fleets, FLEETS_SCHEMA).collect()
        self.instances = conform(self.instances, INSTANCES_SCHEMA).collect()
        return self


@dataclass(frozen=True)
class Source:
    kind: str
    sniff: Callable[[Path], bool]
    load: Callable[[Path, str], SourceData]  # (path, server label) -> data


def file_facts(path: Path, kind: str) -> InputInfo:
    """Hash and stat a file without changing it (read-only, streamed)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    stat = path.stat()
    return InputInfo(
        path=str(path), kind=kind, sha256=digest.hexdigest(), size=stat.st_size, mtime=stat.st_mtime
    )


def _registry() -> list[Source]:
    from analyzer.sources import api, dataset, live, sqlite, tables
    from analyzer.sources.logs import source as logs

    return [sqlite.SOURCE, dataset.SOURCE, tables.SOURCE, live.SOURCE, api.SOURCE, logs.SOURCE]


def sniff(path: Path) -> Source | None:
    for source in _registry():
        if source.sniff(path):
            return source
    return None


def _unrecognised(path: Path) -> SourceData:
    info = InputInfo(path=str(path), kind="unrecognised", sha256=None, size=None, mtime=None)
    info.notes.append("not a dstack database, table export or server log; not audited")
    return SourceData(inputs=[info])


def _unreadable(path: Path, why: str) -> SourceData:
    """An entry of a folder that cannot be read (a symlink loop, a dangling link): listed with
    why, so the rest of the folder is still audited and nothing is skipped silently."""
    info = InputInfo(path=str(path), kind="unreadable", sha256=None, size=None, mtime=None)
    info.notes.append(f"{why}; not audited")
    return SourceData(inputs=[info])


def _broken_link(path: Path, folders: tuple[str, ...]) -> str | None:
    """Why a symlink inside a folder cannot be audited, or None when it can.

    A link that resolves to a folder being walked (``self -> .``, ``up -> ..``) would repeat
    that folder forever; a chain that never ends (``a -> b -> a``) fails with ELOOP; a link to
    nothing is dangling."""
    if not path.is_symlink():
        return None
    try:
        target = os.path.realpath(path, strict=True)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return f"symlink loop ({path.name} -> {os.readlink(path)} never reaches a file)"
        return f"dangling symlink (-> {os.readlink(path)})"
    if target in folders:
        return f"symlink loop ({path.name} -> {os.readlink(path)} is a folder being audited)"
    return None


def load_path(
    given: str | Path,
    server: str,
    *,
    inside_folder: bool = False,
    folders: tuple[str, ...] = (),
) -> list[SourceData]:
    """Load one path: a recognised file or folder, or a folder of recognisable things.

    Inside a folder, things that are not recognised are listed as such in the inputs, and
    things that cannot be read (symlink loops, dangling links) as unreadable with why (nothing
    is skipped silently); a path given by the user that is not recognised is an error.
    ``folders`` are the real paths of the folders being walked (to see loops).
    """
    if str(given) == "-":
        from analyzer.sources.logs.source import load_stdin

        return [load_stdin(server).conformed()]
    if isinstance(given, str) and DATABASE_URL.match(given):
        from analyzer.sources.postgres import load_url

        return [load_url(given, server).conformed()]
    if isinstance(given, str) and LIVE_URL.match(given):  # a dstack server, else a dataset
        from analyzer.sources.live import load_server

        return [load_server(given, server).conformed()]
    if isinstance(given, str) and DATASET_URL.match(given):
        from analyzer.sources.dataset import load_location

        return [load_location(given, server).conformed()]
    path = Path(given)
    if inside_folder and (why := _broken_link(path, folders)):
        return [_unreadable(path, why)]
    try:
        if not path.exists():
            why = _broken_link(path, folders) if path.is_symlink() else None
            raise AuditInputError(str(path), why or "no such file or folder")
        if path.is_file():
            with path.open("rb"):
                pass
        elif path.is_dir():
            os.listdir(path)
        source = sniff(path)
        if source is not None:
            return [source.load(path, server).conformed()]
    except PermissionError:
        raise AuditInputError(
            str(path), "permission denied", "run with read access to it"
        ) from None
    except OSError as error:
        raise AuditInputError(str(path), f"cannot read ({error.strerror or error})") from None
    if path.is_dir():
        found: list[SourceData] = []
        walking = (*folders, os.path.realpath(path))
        for child in sorted(path.iterdir()):
            if not child.name.startswith("."):
                found.extend(load_path(child, server, inside_folder=True, folders=walking))
        if any(
            item.inputs and item.inputs[0].kind not in ("unrecognised", "unreadable")
            for item in found
        ):
            return found
        if inside_folder:
            return [_unrecognised(path)]
        raise AuditInputError(
            str(path),
            "nothing recognisable in this folder",
            "expected a dstack server.db, table exports (runs.csv, jobs.csv, ...) or server logs",
        )
    if inside_folder:
        return [_unrecognised(path)]
    raise AuditInputError(
        str(path),
        "not a recognised input",
        "expected a dstack SQLite database, a folder of table exports, or a server log",
    )
