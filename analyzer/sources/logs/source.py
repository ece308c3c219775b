"""Server logs as a source: any file (plain or .gz) that reads as a dstack log, by content."""

from __future__ import annotations

import gzip
import hashlib
import itertools
import os
import queue
import sys
import threading
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import polars as pl

from analyzer.magic import GZIP_MAGIC, MATTER_WORDS
from analyzer.sources import cells
from analyzer.sources.base import (
    InputInfo,
    InputKind,
    Limitation,
    LoadContext,
    SourceData,
    file_head,
    file_version,
)
from analyzer.sources.logs.messages import ADMIN_TOKEN, EventCollector
from analyzer.sources.logs.quiet import SetAside
from analyzer.sources.logs.reader import (
    SNIFF_BYTES,
    LogStream,
    RecognisedLog,
    certainly_log,
    file_blocks,
    recognise_log,
)

STDIN = "-"

# Logs recognised whole from their head (file, size, mtime): their parse, for the load that
# follows the recognition; a few at a time (a folder's logs are each loaded after sniffing).
_PARSED: dict[tuple[Path, int, int], RecognisedLog] = {}
_PARSED_KEPT = 8


def _sniff(path: Path) -> bool:
    """Cached per file version: a folder's files are asked again by the API export's folder
    walk and by the registry, and a log's head is parsed to be recognised."""
    version = file_version(path)
    return version is not None and _sniff_file(path, *version)


@lru_cache(maxsize=4096)
def _sniff_file(path: Path, size: int, mtime_ns: int) -> bool:
    head = file_head(path)
    if head is None:
        return False
    head = head[:SNIFF_BYTES]
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as handle:
                head = handle.read(SNIFF_BYTES)
        except (OSError, EOFError, zlib.error):  # read raw, as the reader reads it then
            pass
    if not head.strip():
        return _empty_log_name(path)
    if size > SNIFF_BYTES and certainly_log(head):  # the head's parse would not be used
        return True
    recognised = recognise_log(head, str(path), MATTER_WORDS)
    if recognised is not None and len(recognised.head) == size:
        while len(_PARSED) >= _PARSED_KEPT:
            del _PARSED[next(iter(_PARSED))]
        _PARSED[path, size, mtime_ns] = recognised
    return recognised is not None


def _empty_log_name(path: Path) -> bool:
    """An empty file is only taken as a log when nothing else could be meant (a file named
    like a log): it then says, as a limitation, that it holds nothing."""
    return ".log" in path.name


def _load(given: str, ctx: LoadContext) -> SourceData:
    """`-` (claimed) is standard input; anything else a log file sniffed."""
    if given == STDIN:
        return load_stdin(ctx.server)
    return _load_file(Path(given), ctx.server)


def _load_file(path: Path, server: str) -> SourceData:
    """The file read once: its SHA-256 and size are of exactly the bytes read (a log still
    being written grows meanwhile), and a file that changed while it was read says so."""
    with path.open("rb") as handle:
        before = os.fstat(handle.fileno())
        info = InputInfo(path=str(path), kind="log", sha256=None, size=0, mtime=before.st_mtime)
        with _Digest() as digest:
            blocks = _hashed(file_blocks(handle), digest, info)
            parsed = _PARSED.pop((path, before.st_size, before.st_mtime_ns), None)
            if parsed is not None and parsed.stream.display_path == info.path:
                parsed, blocks = _still_head(parsed, blocks)
            else:
                parsed = None
            data = _stream(info, blocks, server, parsed)
            after = os.fstat(handle.fileno())
            info.sha256 = digest.hexdigest()
    change = _changed(path, before, after, info.size or 0)
    if change is not None:
        info.notes.append(change)
        data.limitations.append(
            Limitation(
                "input_changed_while_read",
                f"{change}: the audit and the SHA-256 recorded are of the bytes read, which "
                "a later copy of the file will not match",
                str(path),
            )
        )
    return data


def _still_head(
    parsed: RecognisedLog, blocks: Iterator[bytes]
) -> tuple[RecognisedLog | None, Iterator[bytes]]:
    """The recognition's parse when the file read is still exactly the bytes it parsed
    (read here, hashed); else None and the bytes to parse, those read first again."""
    taken: list[bytes] = []
    size = 0
    for block in blocks:
        taken.append(block)
        size += len(block)
        if size > len(parsed.head):
            break
    if size == len(parsed.head) and b"".join(taken) == parsed.head:
        return parsed, iter(())
    return None, itertools.chain(taken, blocks)


def _hashed(blocks: Iterable[bytes], digest: _Digest, info: InputInfo) -> Iterator[bytes]:
    for block in blocks:
        digest.update(block)
        info.size = (info.size or 0) + len(block)
        yield block


class _Digest:
    """The SHA-256 of the blocks read, worked out on a thread of its own while they are
    parsed (hashing releases the GIL): a 1 GB log's half second of hashing overlaps its parse
    instead of adding to it. Blocks are handed over a few MB at a time, and at most
    `_WAITING` hand-overs wait (the hash runs several times faster than the parse). What
    stopped the hash is raised by `hexdigest`, never a hash of part of the bytes; the
    thread drains what it is given till the end, so the reader never waits on it."""

    _BATCH = 8 * 1024 * 1024
    _WAITING = 4

    def __init__(self) -> None:
        self._digest = hashlib.sha256()
        self._held: list[bytes] = []
        self._size = 0
        self._error: BaseException | None = None
        self._finished = False
        self._queue: queue.Queue[list[bytes] | None] = queue.Queue(self._WAITING)
        self._thread = threading.Thread(target=self._work, name="sha256 log", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (blocks := self._queue.get()) is not None:
            if self._error is not None:
                continue
            try:
                for block in blocks:
                    self._digest.update(block)
            except BaseException as error:  # raised by hexdigest, in the reader's thread
                self._error = error

    def update(self, block: bytes) -> None:
        self._held.append(block)
        self._size += len(block)
        if self._size >= self._BATCH:
            self._queue.put(self._held)
            self._held, self._size = [], 0

    def hexdigest(self) -> str:
        """The hash of every block given (the thread ends: nothing more may be given)."""
        self._finish()
        if self._error is not None:
            raise self._error
        return self._digest.hexdigest()

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._queue.put(self._held)
            self._held = []
            self._queue.put(None)
            self._thread.join()

    def __enter__(self) -> _Digest:
        return self

    def __exit__(self, *exc: object) -> None:
        self._finish()


def _changed(path: Path, before: os.stat_result, after: os.stat_result, read: int) -> str | None:
    """How the file changed while it was read (None: it did not)."""
    try:
        now = path.stat()
    except OSError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino):
        return f"the file was replaced or removed while it was read ({read} bytes were read)"
    if after.st_size != read or after.st_size != before.st_size:
        return (
            f"the file changed while it was read: {before.st_size} bytes when opened, "
            f"{read} read, {after.st_size} now"
        )
    if after.st_mtime_ns != before.st_mtime_ns:
        return f"the file was written to while it was read ({read} bytes were read)"
    return None


def load_stdin(server: str) -> SourceData:
    """Standard input, streamed like a file; its hash and size are taken as it goes by."""
    info = InputInfo(path="-", kind="log", sha256=None, size=0, mtime=None)
    with _Digest() as digest:
        data = _stream(info, _hashed(file_blocks(sys.stdin.buffer), digest, info), server)
        info.sha256 = digest.hexdigest()
    return data


def _stream(
    info: InputInfo, blocks: Iterable[bytes], server: str, parsed: RecognisedLog | None = None
) -> SourceData:
    """Each chunk of records straight into the event collector: only the kept events, the
    counts and the unparsed lines' places outlive their chunk. Lines that cannot matter (no
    ``MATTER_WORDS``) are set aside before they are classified: only counted. A log whose
    recognition parsed it whole (``parsed``, the same reading) is not parsed again."""
    path = info.path
    if parsed is not None:
        stream, chunks = parsed.stream, iter(parsed.chunks)
    else:
        stream = LogStream(path, matter_words=MATTER_WORDS)
        chunks = stream.chunks(blocks)
    collector = EventCollector(path, server)
    secrets: set[str] = set()
    launches: list[pl.DataFrame] = []
    for records, aside in _batches(chunks):
        collector.add(records, aside)
        secrets.update(records["message"].str.extract(ADMIN_TOKEN, 1).drop_nulls().to_list())
        if collector.facts.relevant == 0:  # hints serve a log without lifecycle lines only
            launches.append(_hinted_jobs(records))
    read = stream.result()
    events, facts = collector.finish()
    data = _from_read(info, read, facts, events)
    if facts.relevant == 0 and launches:
        data.limitations.extend(_warning_hints(pl.concat(launches), path))
    text = read.unparsed["text"].drop_nulls()
    data.secrets.update(secrets, text.str.extract(ADMIN_TOKEN, 1).drop_nulls().to_list())
    return data


# A chunk of a busy log keeps few records once its irrelevant lines are set aside, and each
# chunk handed to the collector costs it some hundred small queries: chunks are handed over
# together until they hold this many records or lines set aside (about 40 MB of the latter).
_BATCH_RECORDS = 50_000
_BATCH_SET_ASIDE = 1_000_000


def _batches(
    chunks: Iterable[tuple[pl.DataFrame, SetAside]],
) -> Iterator[tuple[pl.DataFrame, SetAside]]:
    """The chunks' records and set-aside lines, concatenated in order into fewer, larger
    pieces (the collector's result does not depend on how its input is cut)."""
    held: list[tuple[pl.DataFrame, SetAside]] = []
    records = aside = 0
    for chunk in chunks:
        held.append(chunk)
        records += chunk[0].height
        aside += chunk[1].height
        if records >= _BATCH_RECORDS or aside >= _BATCH_SET_ASIDE:
            yield _joined(held)
            held, records, aside = [], 0, 0
    if held:
        yield _joined(held)


def _joined(held: list[tuple[pl.DataFrame, SetAside]]) -> tuple[pl.DataFrame, SetAside]:
    if len(held) == 1:
        return held[0]
    # one chunk per column: string functions over a concatenation of several chunks' string
    # views can fail inside polars (an index assertion in its view arrays)
    return pl.concat([r for r, _ in held], rechunk=True), SetAside.joined([a for _, a in held])


def _from_read(info: InputInfo, read, facts, events: pl.DataFrame) -> SourceData:
    path = info.path
    info.kind = (
        f"log ({read.format or 'empty'}" + (f", {read.wrapper}" if read.wrapper else "") + ")"
    )
    info.records = facts.relevant
    info.unparsed = read.unparsed.height
    info.server_version = facts.server_version
    info.notes.append(
        f"{read.lines_total} lines: {read.record_count} records "
        f"({facts.relevant} relevant, {facts.irrelevant} irrelevant, "
        f"{facts.unrecognised} unrecognised dstack lines), {read.lines_irrelevant} blank/logo, "
        f"{read.unparsed.height} unparsed"
    )
    info.notes.extend(read.damage)
    if facts.repeated_records:
        info.notes.append(
            f"{facts.repeated_records} kept record(s) repeat an identical earlier one (the same "
            "line again: an overlapping rotated file or a log written twice): each kept once, "
            "its places as provenance"
        )
    if facts.probe_lines_unattributed:
        info.notes.append(
            f"{facts.probe_lines_unattributed} probe result line(s) name a job that no other "
            "line of this log names: no job to give them to, not used"
        )
    for shape, count in list(facts.unrecognised_shapes.items())[:20]:
        first = facts.unrecognised_first.get(shape)
        info.notes.append(
            f"unrecognised dstack line x{count}: {shape}"
            + (f" (first at {first})" if first else "")
        )
    events, cut = cells.cut_long(events, ("message", "termination_message"))
    data = SourceData(events=events, inputs=[info])
    data.log_reads.append((read, facts))
    if cut.len():
        first = events["provenance"][int(cut[0])]
        data.limitations.append(
            Limitation(
                "huge_values",
                f"{cut.len()} log message(s) over {cells.TEXT_LIMIT} bytes kept as their first "
                f"{cells.HEAD_BYTES} bytes, their length and SHA-256 (first at "
                f"{first[0] if first is not None and len(first) else path})",
                path,
            )
        )
    if facts.ambiguous_jobs:
        data.limitations.append(
            Limitation(
                "log_run_attribution_ambiguous",
                f"{facts.ambiguous_jobs} job(s) appeared while several runs of the same name were "
                "alive (log lines carry no project): each was given to the run whose job-creating "
                "event came last; a database of the same server removes the ambiguity",
                path,
            )
        )
    if facts.relevant == 0:
        levels = ", ".join(f"{k}: {v}" for k, v in sorted(facts.levels.items())) or "no records"
        data.limitations.append(
            Limitation(
                "log_without_run_evidence",
                "this log holds no run or job lifecycle line (" + levels + "); at dstack's "
                "WARNING level no run's status change is logged, so it cannot show whether an "
                "incident happened, only hint at one (run the server at INFO, dstack server's "
                "default)",
                path,
            )
        )
    return data


@dataclass(frozen=True)
class WarningHint:
    """A WARNING line that names a job (`job(<6 hex>)<name>: ...`) and says something that may
    have failed its run: which runs to look at when the log holds no lifecycle line."""

    code: str  # the limitation's code
    literal: str  # a literal every such line holds: narrows the lines first
    pattern: str  # anchored; its first group is the job's name
    said: str  # what the lines say, for the hint's text
    counted: str  # what each line is, counted per job
    dstack: str  # the dstack code that logs it


WARNING_HINTS = (
    WarningHint(
        "log_capacity_hint",
        "NoCapacityError",
        r"^job\([0-9a-f]{6}\)(\S+): .+ launch in \S+ failed: NoCapacityError\b",
        "the cloud refused launches for lack of capacity (NoCapacityError)",
        "launch(es) refused",
        "jobs_submitted (0.22.5 `_provision_new_capacity`; 0.19 process_submitted_jobs): a "
        "backend refusing an offer is logged at WARNING",
    ),
    WarningHint(
        "log_unreachable_hint",
        "unreachable",
        r"^job\([0-9a-f]{6}\)(\S+): (?:is unreachable, waiting for the instance|failed "
        r"because instance is unreachable)",
        "the job's instance was unreachable (a replica that stays unreachable fails with "
        "INSTANCE_UNREACHABLE)",
        "line(s) saying its instance was unreachable",
        "jobs_running (process_running_jobs): a job whose instance does not answer is logged "
        "at WARNING, and failed once the instance stays unreachable (reference 9)",
    ),
)
_HINT_RUNS = 20


def _hinted_jobs(records: pl.DataFrame) -> pl.DataFrame:
    """Per hint and job of a chunk: its first such line (line, time as written) and how many
    there were; a handful of rows, whatever the chunk's size."""
    frames = [
        records.lazy()
        .filter(pl.col("message").str.contains(hint.literal, literal=True))
        .select(
            pl.lit(hint.code).alias("code"),
            pl.col("message").str.extract(hint.pattern, 1).alias("job"),
            "line",
            pl.col("local_time").cast(pl.String).alias("time"),
        )
        .drop_nulls("job")
        .group_by("code", "job")
        .agg(pl.col("line").first(), pl.col("time").first(), pl.len().alias("lines"))
        for hint in WARNING_HINTS
    ]
    return pl.concat(pl.collect_all(frames))


def _warning_hints(lines: pl.DataFrame, path: str) -> list[Limitation]:
    """A log with no lifecycle line (dstack at WARNING) still names jobs that may have failed
    their run: a launch the cloud refused, an instance that did not answer. If one was the
    surge replica of a service's rolling deployment, dstack failed the run and stopped its
    healthy replicas (#4186), but nothing here says it was: which runs to look at, as a hint,
    never as a finding."""
    hints = []
    for hint in WARNING_HINTS:
        mine = lines.filter(pl.col("code") == hint.code)
        if mine.is_empty():
            continue
        per_job = (
            mine.group_by("job")
            .agg(
                pl.col("line").min(), pl.col("time").sort_by("line").first(), pl.col("lines").sum()
            )
            .with_columns(pl.col("job").str.replace(r"-\d+-\d+$", "").alias("run"))
            .sort("line")
        )
        items = [
            f"run {r['run']} (job {r['job']}: {r['lines']} {hint.counted}, first at "
            f"{r['time'] or 'an unknown time'}, {path}:{r['line']})"
            for r in per_job.head(_HINT_RUNS).iter_rows(named=True)
        ]
        more = per_job.height - _HINT_RUNS
        hints.append(
            Limitation(
                hint.code,
                f"this log has no run or job lifecycle line, but {hint.said} for "
                + "; ".join(items)
                + (f"; and {more} more job(s)" if more > 0 else "")
                + ". If such a job was the new replica of a service's rolling deployment, "
                "dstack may have failed the run and stopped its healthy replicas: a hint, not a "
                "finding; the database or a log at INFO decides",
                path,
            )
        )
    return hints


SOURCE = InputKind(kind="log", load=_load, sniff=_sniff, claims=lambda given: given == STDIN)
