"""A database's run tables read once and split by service bucket, for an audit in partitions.

Every partition of an audit reads whole services (analyzer.sources.partition): its runs, their
jobs and probes, and the events that target them (with all of those events' targets). Asked of
the database one partition at a time, each partition selected its runs into temporary tables
and scanned the events tables again (at 100k runs, 64 partitions: most of the audit's time).
Here each of those tables is read once, a batch of rows at a time, and each row written to the
Arrow IPC files of its bucket (an event to the bucket of every service it targets) in a private
folder; a partition then reads its own files, rows in the table's order as the database gave
them. The rows are the reader's raw bytes: every partition checks and maps its share as it
would have read it from the database.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate, pairwise
from pathlib import Path

import polars as pl

from analyzer.model import own_buffers

BUCKET = "_bucket"
ROW = "_row"
RUN_TABLES = ("runs", "jobs", "probes", "events", "event_targets")
"""The tables a partition reads only its share of; every other table it reads whole."""
FILE_LEVEL = pl.CompatLevel.oldest()
"""The Arrow layout the bucket files are written in: plain binary arrays (offsets and values),
not polars' own views, which cost more to write from rows gathered out of a batch (measured,
250k rows of event_targets into 64 files: 0.14-0.15 s of CPU against 0.22-0.29 s, 46 MB
against 55 MB) and are read back as the same frame in the same time. The 100k-run database
split in 64 buckets: 40.8-44.9 s of CPU against 44.2-46.7 s, two runs each in turn."""

Batches = Callable[[str, list[str]], Iterator[pl.DataFrame]]
"""(table, columns) -> the table's rows of those columns as raw bytes, a batch at a time, in
the table's order (JSON documents reduced to the paths the mapping reads)."""


@dataclass
class BucketFiles:
    """The files of each bucket of `count`, per table, and the columns they hold (with the
    JSON paths their documents were reduced to)."""

    folder: Path
    count: int
    columns: dict[str, list[str]]
    json_paths: dict[str, dict[str, tuple[str, ...]]]
    files: dict[str, dict[int, list[Path]]] = field(default_factory=dict)
    secrets: frozenset[str] = frozenset()  # every secret value of the database (its reader's)
    # per table: the damage of every row of the whole table, found once as it was split (rows
    # of no bucket too), placed as one process places it (analyzer.sources.cells.checked)
    damage: dict[str, list[pl.DataFrame]] = field(default_factory=dict)

    def holds(self, table: str, columns: list[str], json_paths: dict) -> bool:
        """Whether the files hold `table` as it is asked for (and are still there: a worker
        on another machine does not see this machine's folder)."""
        asked = (columns, json_paths)
        return asked == (self.columns.get(table), self.json_paths.get(table)) and (
            self.folder.is_dir()
        )

    def joined(self, other: BucketFiles) -> BucketFiles:
        """These files and `other`'s, of other tables of the same database and buckets (split
        by two processes at once: analyzer.sources.base.LEARNING_PARTS)."""
        return BucketFiles(
            self.folder,
            self.count,
            {**self.columns, **other.columns},
            {**self.json_paths, **other.json_paths},
            {**self.files, **other.files},
            self.secrets | other.secrets,
            {**self.damage, **other.damage},
        )

    def read(self, table: str, index: int) -> pl.DataFrame:
        """Bucket `index`'s rows of `table`, in the table's order: its files (one a batch of
        the table) in one scan, not read one at a time (100k runs, a partition's 38 files:
        18 ms of CPU against 35 ms)."""
        paths = self.files.get(table, {}).get(index, [])
        if not paths:
            return pl.DataFrame(schema=dict.fromkeys(self.columns[table], pl.Binary))
        return pl.scan_ipc(paths, glob=False).collect().rechunk()

    def _write(self, table: str, batch: pl.DataFrame, rows: pl.DataFrame, number: int) -> None:
        """One batch's rows, each to the file of its bucket: `rows` (ROW, BUCKET) says which
        row goes where, in the batch's order; a row is taken out of the batch one bucket at a
        time, so no second copy of the whole batch is made. A bucket's rows are gathered out
        of each of the batch's chunks (the driver's Arrow batches) apart, and written as that
        many record batches: a gather across a frame's chunks costs several times one inside
        a chunk (a 240k-row batch of event_targets in 4 chunks into 64 buckets: 104 ms,
        against 22 ms chunk by chunk)."""
        pieces = _chunk_pieces(batch, rows)
        for bucket, parts in pieces.items():
            path = self.folder / f"{table}-{bucket}-{number}.arrow"
            frame = pl.concat([chunk[where] for chunk, where in parts], rechunk=False)
            frame.write_ipc(path, compression="uncompressed", compat_level=FILE_LEVEL)
            self.files.setdefault(table, {}).setdefault(bucket, []).append(path)


def _chunk_pieces(
    batch: pl.DataFrame, rows: pl.DataFrame
) -> dict[int, list[tuple[pl.DataFrame, pl.Series]]]:
    """Per bucket, in the order its first row comes, each chunk of `batch` holding some of its
    rows and their places in that chunk, in order. `rows` (ROW, BUCKET) is in ROW order (a
    row of several buckets is listed once for each). A chunk is a zero-copy slice of the
    batch where its first column's chunks lie (a column chunked otherwise is only gathered
    the slower way, not wrongly)."""
    starts = [0, *accumulate(batch.to_series(0).chunk_lengths())] if batch.width else [0]
    bounds = rows[ROW].search_sorted(pl.Series(starts, dtype=rows.schema[ROW]), side="left")
    pieces: dict[int, list[tuple[pl.DataFrame, pl.Series]]] = {}
    for index, (start, end) in enumerate(pairwise(starts)):
        listed = rows.slice(bounds[index], bounds[index + 1] - bounds[index])
        if listed.is_empty():
            continue
        chunk = batch.slice(start, end - start)
        for (bucket,), where in listed.partition_by(BUCKET, as_dict=True).items():
            pieces.setdefault(bucket, []).append((chunk, where[ROW] - start))
    return pieces


def split_by_bucket(
    batches: Batches,
    columns: dict[str, list[str]],
    json_paths: dict[str, dict[str, tuple[str, ...]]],
    runs_by_service: pl.DataFrame,
    count: int,
    folder: Path,
    *,
    by_run_id: bool,
    tables: Collection[str] = RUN_TABLES,
) -> BucketFiles:
    """Write the run tables `columns` names (runs and jobs at least) into `folder` by the
    bucket among `count` of each row's service: a run's by `runs_by_service` (its id and
    service hash), a job's by its run, a probe's by its job, an event's by every run and job
    it targets (and, `by_run_id`, every run its targets name as `entity_run_id`), as
    dstack's targets point at them: entity_type RUN or JOB (the database's enum names). Only
    the run tables among `tables` are written (the others another process splits)."""
    kept = {table: names for table, names in columns.items() if table in RUN_TABLES}
    kept = {table: names for table, names in kept.items() if table in tables}
    store = BucketFiles(folder, count, kept, {table: json_paths[table] for table in kept})
    runs = runs_by_service.select(
        pl.col("id").cast(pl.Binary), (pl.col("service_hash") % count).alias(BUCKET)
    ).filter(pl.col("id").is_not_null())
    if "runs" in store.columns:
        _split(store, batches("runs", store.columns["runs"]), "runs", runs, "id")
    events = {"events", "event_targets"} <= store.columns.keys()
    if "jobs" in store.columns:
        jobs = _split(
            store, batches("jobs", store.columns["jobs"]), "jobs", runs, "run_id", keep="id"
        )
    else:
        jobs = _buckets_of(batches, "jobs", runs, "run_id", "id") if events else runs.clear()
    if "probes" in store.columns:
        _split(store, batches("probes", store.columns["probes"]), "probes", jobs, "job_id")
    if events:
        kept = _Kept(folder)
        targets = kept.passed(batches("event_targets", store.columns["event_targets"]))
        events = _events_by_bucket(targets, runs, jobs, by_run_id=by_run_id)
        _split(store, kept.taken(), "event_targets", events, "event_id")
        _split(store, batches("events", store.columns["events"]), "events", events, "id")
    else:
        store.columns.pop("events", None)
        store.columns.pop("event_targets", None)
    return store


def _split(
    store: BucketFiles,
    batches: Iterable[pl.DataFrame],
    table: str,
    buckets: pl.DataFrame,
    key: str,
    keep: str | None = None,
) -> pl.DataFrame:
    """`table`'s `batches` written by the bucket its `key` has in `buckets` (id, bucket); a
    row whose key has several buckets is written to each. Returns (`keep`, bucket) of the rows
    written: the buckets of what points at them."""
    kept = []
    for number, batch in enumerate(batches):
        rows = (
            batch.select(key)
            .with_row_index(ROW)
            .join(buckets.rename({"id": key}), on=key, maintain_order="left")
            .select(ROW, BUCKET)
        )
        store._write(table, batch, rows, number)
        if keep is not None:
            kept.append(
                rows.select(batch[keep].gather(rows[ROW]), BUCKET).filter(
                    pl.col(keep).is_not_null()
                )
            )
    if keep is None:
        return buckets.clear()
    return pl.concat(kept).rename({keep: "id"}) if kept else buckets.clear()


def _buckets_of(
    batches: Batches, table: str, buckets: pl.DataFrame, key: str, keep: str
) -> pl.DataFrame:
    """(`keep`, bucket) of `table`'s rows by the bucket their `key` has in `buckets`, as
    `_split` returns them, read from those two columns alone and written nowhere."""
    found = [
        batch.join(buckets.rename({"id": key}), on=key, maintain_order="left")
        .select(pl.col(keep).alias("id"), BUCKET)
        .filter(pl.col("id").is_not_null())
        for batch in batches(table, [keep, key])
    ]
    return pl.concat(found) if found else buckets.clear()


KEPT_BYTES = 128 * 1024 * 1024
"""How much of event_targets the split holds in memory between its two passes over the table;
from the batch that crosses it on, every batch waits in a file. At 16k runs the whole table is
96 MB: held, not written and read back (--workers 2, ten runs each: 0.1-0.4 s less CPU, the
learning part the other process waits for); at 100k runs (about 600 MB) it goes to files once
its first 128 MB are read (the audit's peak, 921-933 MB, as before)."""


class _Kept:
    """event_targets' batches kept between the split's two passes: the first finds every
    event's buckets, the second writes each row to them. The table is read from the database
    once: its batches are held in memory while they are few (KEPT_BYTES), else written to
    files of `folder`, a batch at a time, and read back from there in order."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._held: list[pl.DataFrame] = []
        self._size = 0
        self._paths: list[Path] = []

    def passed(self, batches: Iterator[pl.DataFrame]) -> Iterator[pl.DataFrame]:
        """Each batch, kept as it goes by."""
        for batch in batches:
            self._size += batch.estimated_size()
            self._held.append(batch)
            if self._size > KEPT_BYTES:  # from then on, every batch
                self._spill()
            yield batch

    def _spill(self) -> None:
        for batch in self._held:
            path = self._folder / f"read-{len(self._paths)}.arrow"
            batch.write_ipc(path, compression="uncompressed", compat_level=FILE_LEVEL)
            self._paths.append(path)
        self._held.clear()

    def taken(self) -> Iterator[pl.DataFrame]:
        """The batches again, in order, each let go once it is given (its file removed)."""
        held, self._held = self._held, []  # none once any went to a file
        while held:
            yield held.pop(0)
        for path in self._paths:
            batch = pl.read_ipc(path)
            path.unlink()
            yield batch
        self._paths.clear()


def _events_by_bucket(
    targets: Iterable[pl.DataFrame], runs: pl.DataFrame, jobs: pl.DataFrame, *, by_run_id: bool
) -> pl.DataFrame:
    """(event id, bucket) of every event that targets a run or a job of a bucket, once per
    bucket, from event_targets' `targets` batches."""
    columns = ["event_id", "entity_type", "entity_id"] + (["entity_run_id"] if by_run_id else [])
    found = []
    for batch in (whole.select(columns) for whole in targets):
        kind = pl.col("entity_type")
        hits = [
            batch.filter(kind == pl.lit(b"RUN"))
            .join(runs, left_on="entity_id", right_on="id")
            .select("event_id", BUCKET),
            batch.filter(kind == pl.lit(b"JOB"))
            .join(jobs, left_on="entity_id", right_on="id")
            .select("event_id", BUCKET),
        ]
        if by_run_id:
            hits.append(
                batch.join(runs, left_on="entity_run_id", right_on="id").select("event_id", BUCKET)
            )
        # its own buffers: else the few ids kept would hold every batch's whole id column
        found.append(own_buffers(pl.concat(hits).unique()))
    if not found:
        return runs.clear()
    return (
        pl.concat([part.lazy() for part in found])
        .unique(maintain_order=True)
        .rename({"event_id": "id"})
        .collect()
    )


@contextmanager
def emptying(folder: Path) -> Iterator[None]:
    """`folder`'s bucket files removed on a thread once every partition is audited (no
    process reads them again) while the command merges and writes the report (an unlink
    frees the GIL: at 16k runs 0.07-0.1 s for 293 MB, at 100k runs 0.9 s), not when it leaves
    the folder after the report is written; the folder itself is removed then. Its error is
    raised on leaving."""
    failed: list[BaseException] = []

    def work() -> None:
        try:
            for entry in folder.iterdir():
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        except BaseException as error:  # raised by the caller
            failed.append(error)

    thread = threading.Thread(target=work, name="emptying the bucket files", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    if failed:
        raise failed[0]
