"""What every source shares: the facts it returns (SourceData), how it is asked (LoadContext),
and the shape of a source (the Source protocol the registry holds a list of).

The registry (analyzer.sources) imports every source; sources import only this module and their
siblings, never the registry, so nothing in the layer goes round in a circle.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from stat import S_ISREG
from typing import Protocol

import polars as pl

from analyzer.model import (
    EVENTS_SCHEMA,
    FLEETS_SCHEMA,
    INSTANCES_SCHEMA,
    JOBS_SCHEMA,
    RUNS_SCHEMA,
    conform,
    conforms,
    empty_frame,
)
from analyzer.sources.buckets import BucketFiles


@dataclass(frozen=True)
class ReadOptions:
    """What a source may push down into its reads (the audit filters again regardless)."""

    partition: tuple[int, int] | None = None  # (index, count): buckets with b % count == index
    since: datetime | None = None
    project: str | None = None
    # Facts about whole inputs (a file's hash, a database's latest times) that the partitions
    # of one audit share, so each partition does not hash or scan the whole input again.
    shared: WholeInputFacts | None = field(default=None, compare=False, repr=False)


LEARNING_PARTS = {"events": ("event_targets", "events"), "runs": ("runs", "jobs", "probes")}
"""What is learnt of the whole inputs, in two parts two processes learn at once: each part
splits these run tables of each database by bucket (analyzer.sources.buckets), and the second
learns the rest too (hashes, latest times, the tables every partition reads whole). At 16k
runs the events part takes 1.55-1.8 s of CPU, the runs part with the rest 1.46-1.5 s: the
command waits for the heavier one about 0.2 s (2026-12-06)."""


class WholeInputFacts:
    """Facts about whole files, remembered for one audit run in partitions: learnt once by the
    client (`learn_whole_inputs`) and sent with every partition's task. A fact is keyed by
    the file's identity (device, inode, size, modification and change times), so a file that
    changed since, or that a worker on another machine sees as another file, is read again
    rather than trusted."""

    def __init__(self, split: tuple[int, Path] | None = None, part: str | None = None) -> None:
        self._facts: dict[tuple, object] = {}
        # (count, folder): the audit's partitions, and a private folder where a database's
        # run tables are written once by bucket (analyzer.sources.buckets), for each partition
        # to read its share from there; None: the partitions each read the database
        self.split = split
        # which of LEARNING_PARTS is learnt here, while another process learns the other;
        # None: all of it
        self.part = part

    def splits(self, table: str) -> bool:
        """Whether this run table is split by bucket here (LEARNING_PARTS)."""
        return self.part is None or table in LEARNING_PARTS.get(self.part, ())

    @property
    def learns_rest(self) -> bool:
        """Whether what is not split is learnt here (LEARNING_PARTS: the last part's)."""
        return self.part in (None, list(LEARNING_PARTS)[-1])

    def update(self, other: WholeInputFacts) -> None:
        """What `other` learnt (another process's part) added to what this holds: the bucket
        files of a database that each split tables of, joined."""
        for key, fact in other._facts.items():
            mine = self._facts.get(key)
            joined = isinstance(mine, BucketFiles) and isinstance(fact, BucketFiles)
            self._facts[key] = mine.joined(fact) if joined else fact

    def without(self, names: tuple[str, ...], instead: str) -> WholeInputFacts:
        """A copy of these facts, for another process, without those named with one of the
        prefixes `names` of a file whose fact `instead` is learnt (made from them: they are
        never read again)."""
        made = {key[1:] for key in self._facts if key[0] == instead}
        kept = WholeInputFacts(self.split, self.part)
        kept._facts = {
            key: fact
            for key, fact in self._facts.items()
            if not (key[0].startswith(names) and key[1:] in made)
        }
        return kept

    def through_files(self, folder: Path, stem: str) -> WholeInputFacts:
        """A copy of these facts for another process on this machine, which sees `folder`:
        each fact that can be sent through files there (a `through_files` of its own, as
        the mapped fleets and instances have) so sent, the rest as it is."""
        sent = WholeInputFacts(self.split, self.part)
        sent._facts = {
            key: fact.through_files(folder, f"{stem}-{number}")
            if hasattr(fact, "through_files")
            else fact
            for number, (key, fact) in enumerate(self._facts.items())
        }
        return sent

    def get(self, name: str, path: Path, compute: Callable[[], object]) -> object:
        key = self._key(name, path)
        if key not in self._facts:
            self._facts[key] = compute()
        return self._facts[key]

    def known(self, name: str, path: Path) -> object | None:
        """The fact learnt of this version of `path`, or None: never computed here (a
        partition does not split a database its client did not)."""
        return self._facts.get(self._key(name, path))

    @staticmethod
    def _key(name: str, path: Path) -> tuple:
        stat = path.stat()
        identity = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        return (name, str(path.resolve()), *identity)


def remembered(
    shared: WholeInputFacts | None, name: str, path: Path, compute: Callable[[], object]
) -> object:
    """`compute()`, or the fact `shared` remembers of this version of `path` (None: no
    partitions share what they learn, so compute)."""
    return shared.get(name, path, compute) if shared else compute()


NO_OPTIONS = ReadOptions()


@dataclass(frozen=True)
class LoadContext:
    """How one input is read: the server it is labelled as, and the read options a source may
    push down (passed along, never held in a global, so concurrent audits cannot mix them)."""

    server: str
    options: ReadOptions = NO_OPTIONS


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
    given: str | None = None  # the local path the user named that led to it (None: a URL, -)
    # per input path: values read as unknown (analyzer.sources.cells), and where the first is
    unparsed_values: dict[str, int] = field(default_factory=dict)
    damage_notes: dict[str, list[str]] = field(default_factory=dict)
    # the secret values (as a Redactor holds them) its fleets and instances are masked with
    # already: a partition's share of a database split by bucket holds them masked once per
    # audit with all of the database's; None: not masked yet
    masked_with: frozenset[str] | None = None

    def conformed(self) -> SourceData:
        """Every table in its canonical schema, in one collect (most of a small input's
        tables are the shared empty ones, conformed already)."""
        schemas = {
            "runs": RUNS_SCHEMA,
            "jobs": JOBS_SCHEMA,
            "events": EVENTS_SCHEMA,
            "fleets": FLEETS_SCHEMA,
            "instances": INSTANCES_SCHEMA,
        }
        pending = {
            name: conform(frame, schema)
            for name, schema in schemas.items()
            if (frame := getattr(self, name)) is not _EMPTY.get(name)
            and not conforms(frame, schema)
        }
        for name, frame in zip(pending, pl.collect_all(pending.values()), strict=True):
            setattr(self, name, frame)
        return self


class Source(Protocol):
    """One kind of input. `claims` takes what is not a path (a URL, `-`); `sniff` recognises a
    path by its content, never its name; `load` reads what either accepted."""

    kind: str

    def claims(self, given: str) -> bool: ...

    def sniff(self, path: Path) -> bool: ...

    def load(self, given: str, ctx: LoadContext) -> SourceData: ...


HEAD_BYTES = 64 * 1024  # what a source may look at to recognise a file


def file_version(path: Path) -> tuple[int, int] | None:
    """A regular file's size and modification time (what a cache of what was read of it is
    keyed by), or None: not a regular file, or not there."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return (stat.st_size, stat.st_mtime_ns) if S_ISREG(stat.st_mode) else None


def file_head(path: Path) -> bytes | None:
    """The first HEAD_BYTES of a regular file, read once per version of it (size and
    modification time): every source sniffs the same head, and a folder's files are asked
    again by the API export's folder walk. None: not a regular file, or unreadable."""
    version = file_version(path)
    return None if version is None else _head(path, *version)


# At most 32 MiB of heads are held: the sniffers' own results are remembered longer (a
# folder's files asked again after more than this many others are read again, not misread).
@lru_cache(maxsize=512)
def _head(path: Path, size: int, mtime_ns: int) -> bytes | None:
    try:
        with path.open("rb") as handle:
            return handle.read(HEAD_BYTES)
    except OSError:
        return None


def _no_path(path: Path) -> bool:
    return False


def _no_text(given: str) -> bool:
    return False


@dataclass(frozen=True)
class InputKind:
    """A Source made of functions: a file format sniffs, a URL scheme claims."""

    kind: str
    load: Callable[[str, LoadContext], SourceData]
    sniff: Callable[[Path], bool] = _no_path
    claims: Callable[[str], bool] = _no_text
    # what every partition reads of the whole file (its hash, its runs' services, its latest
    # times, its shared tables), learnt into the facts once
    learn: Callable[[Path, WholeInputFacts], None] | None = None


@dataclass
class Verification:
    """What `dstack-audit verify` found: same until a difference is recorded, one line each."""

    same: bool = True
    lines: list[str] = field(default_factory=list)

    def differ(self, line: str) -> None:
        self.same = False
        self.lines.append(line)


def file_facts(path: Path, kind: str, shared: WholeInputFacts | None = None) -> InputInfo:
    """Hash and stat a file without changing it (read-only, streamed); hashed once per audit
    when the partitions of the audit `shared` what they learnt of whole files."""
    sha256 = remembered(shared, "sha256", path, lambda: _sha256(path))
    stat = path.stat()
    return InputInfo(
        path=str(path), kind=kind, sha256=sha256, size=stat.st_size, mtime=stat.st_mtime
    )


def facts_meanwhile(
    path: Path, kind: str, shared: WholeInputFacts | None = None
) -> Callable[[], InputInfo]:
    """`file_facts` on a thread while the caller reads the file (hashing releases the GIL: at
    16k runs the database's 0.5 s of SHA-256 overlap its tables' read); the function returned
    waits for them, and raises what file_facts raised. A daemon thread: an interrupted audit
    does not wait for it."""
    done: dict[str, object] = {}

    def work() -> None:
        try:
            done["facts"] = file_facts(path, kind, shared)
        except BaseException as error:  # handed to the caller, who raises it
            done["error"] = error

    thread = threading.Thread(target=work, name=f"sha256 {path.name}", daemon=True)
    thread.start()

    def wait() -> InputInfo:
        thread.join()
        if "error" in done:
            raise done["error"]  # type: ignore[misc]
        return done["facts"]  # type: ignore[return-value]

    return wait


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
