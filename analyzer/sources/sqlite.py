"""A dstack SQLite database file (`server.db` / `sqlite.db`), opened read-only.

`mode=ro` never creates a missing file and never writes. A database in WAL mode (dstack's
default) may keep recent commits in `<db>-wal`, and even a read-only connection would create
`-wal`/`-shm` files beside it: such a database is first copied (with its `-wal`) into a private
temporary folder and the copy is read, so nothing is ever written beside the evidence.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path
from urllib.parse import quote

import polars as pl

from analyzer.errors import AuditInputError
from analyzer.magic import SQLITE_MAGIC
from analyzer.model import CLOSED_TEXT, parse_db_time
from analyzer.redact import Redactor
from analyzer.sources import cells
from analyzer.sources.adbc import AdbcStatement, release_freed
from analyzer.sources.base import (
    InputInfo,
    InputKind,
    LoadContext,
    ReadOptions,
    SourceData,
    WholeInputFacts,
    facts_meanwhile,
    file_facts,
    file_head,
    remembered,
)
from analyzer.sources.buckets import RUN_TABLES, BucketFiles, split_by_bucket
from analyzer.sources.dstack_tables import (
    ALIVE_COLUMNS,
    CELLS,
    JSON_PATHS,
    TABLE_COLUMNS,
    learn_fleet_tables,
    learn_projects,
    load_tables,
    looks_like_dstack,
    raw_secrets,
)
from analyzer.sources.partition import service_hashes

FETCH_ROWS = 50_000
ARROW_BATCH_ROWS = 65_536
"""Rows per Arrow batch the ADBC driver hands over (its default: 1,024). Polars keeps each
batch's buffers as they come, so fewer, larger batches are less memory and less work: at
16k runs the events and their targets take 65 MB less, and 0.1 s less CPU to read."""
BATCH_ROWS = 250_000
"""Rows of a table read at a time when it is split by bucket (SqliteReader.batches)."""


def _slim_json(column: str, paths: tuple[str, ...]) -> str:
    """SQL that rebuilds the JSON text `column` with only `paths` (nested as in the original);
    NULL when the column is NULL, and NULL (not an error) when it is not valid JSON. `->`
    gives JSON (not a string) to json_object as it is: wrapping it in json() would parse
    every value again."""
    tree: dict = {}
    for path in paths:
        node = tree
        parts = path.removeprefix("$.").split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = path

    def render(node: dict) -> str:
        items = []
        for key, value in node.items():
            inner = render(value) if isinstance(value, dict) else f"\"{column}\" -> '{value}'"
            items.append(f"'{key}', {inner}")
        return f"json_object({', '.join(items)})"

    return f'CASE WHEN json_valid("{column}") THEN {render(tree)} END'


def _sniff(path: Path) -> bool:
    head = file_head(path)
    return head is not None and head.startswith(SQLITE_MAGIC)


class SqliteReader:
    """All-text reads of the columns the audit needs; absent columns come back null."""

    def __init__(
        self, path: Path, label: str | None = None, options: ReadOptions | None = None
    ) -> None:
        options = options or ReadOptions()
        narrowed = bool(options.partition or options.project or options.since)
        self.label = label or str(path)
        self._path = path
        uri = f"file:{quote(str(path.resolve()))}?mode=ro"
        try:
            self._db = sqlite3.connect(uri, uri=True)
            self._db.text_factory = _lenient_text  # names and latest times; values come as bytes
            if not narrowed:
                self._db.execute("PRAGMA query_only = ON")
            rows = self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            self._tables = {name for (name,) in rows}
        except (sqlite3.Error, UnicodeDecodeError) as error:
            raise AuditInputError(
                self.label, f"cannot read the SQLite database ({error})", "is the file complete?"
            ) from None
        self._columns: dict[str, set[str]] = {}
        self._filters: dict[str, str] = {}
        self._later_partition = bool(options.partition and options.partition[0])
        self._arrow = _arrow_connection(uri)
        self._shared = options.shared
        self.narrowed = narrowed and {"runs", "jobs"} <= self._tables
        self._kept_runs: str | None = None  # the kept run ids (JSON) once selected
        self._selected_on_db = False  # are their temporary tables on the sqlite3 connection?
        # this partition's share of the run tables, written once by the audit's client
        self._buckets = self._bucket_files(options) if self.narrowed else None
        self._unselected: ReadOptions | None = None  # the selection, not made yet
        self._bucket = options.partition[0] if options.partition else 0
        self._selected_by = cells.selected_by(options)
        if self._buckets is not None:
            self._filters = self._run_filters()
            self._unselected = options
        elif self.narrowed:
            self._select_runs(options)

    def _bucket_files(self, options: ReadOptions) -> BucketFiles | None:
        """The run tables split by bucket for this audit's partitions, when its client split
        them (analyzer.sources.buckets) and the partition is all the narrowing."""
        if options.partition is None or options.since or options.project or not self._shared:
            return None
        files = self._shared.known(f"buckets of {options.partition[1]}", self._path)
        return files if isinstance(files, BucketFiles) else None

    def _run_filters(self) -> dict[str, str]:
        """What keeps a run table's rows to the selected runs (_keep_selection)."""
        filters = {
            "runs": "id IN (SELECT id FROM audit_runs)",
            "jobs": "run_id IN (SELECT id FROM audit_runs)",
            "probes": "job_id IN (SELECT id FROM audit_jobs)",
        }
        if {"events", "event_targets"} <= self._tables:
            filters["events"] = "id IN (SELECT id FROM audit_events)"
            filters["event_targets"] = "event_id IN (SELECT id FROM audit_events)"
        return filters

    def _select_runs(self, options: ReadOptions) -> None:
        """Read only the runs the audit keeps (--project, --since, a partition of whole
        services) with their jobs and events. Their ids go into temporary tables (SQLite's
        private temp store, never beside the file; `mode=ro` keeps the database unwritable)."""
        keep = pl.lit(True)
        if options.partition:
            index, count = options.partition
            runs = remembered(options.shared, "runs by service", self._path, self._runs_by_service)
            keep = keep & (pl.col("service_hash") % count == index)
        else:
            runs = self._runs()
        if options.since:
            keep = keep & (parse_db_time(pl.col("last_processed_at")) >= options.since)
        if options.project and "projects" in self._tables:
            projects = self._text(
                "SELECT CAST(id AS BLOB), CAST(name AS BLOB), CAST(original_name AS BLOB) "
                'FROM "projects"',
                ["id", "name", "original_name"],
            )
            wanted = projects.filter(
                (pl.col("name") == options.project) | (pl.col("original_name") == options.project)
            )["id"]
            keep = keep & pl.col("project_id").is_in(wanted.implode())
        self._kept_runs = json.dumps(runs.filter(keep)["id"].to_list())
        self._filters = self._run_filters()
        if self._arrow is not None:
            try:
                self._keep_selection(self._arrow.execute)
                return
            except Exception:  # a driver without temp tables or json_each: sqlite3
                self._arrow.close()
                self._arrow = None
        self._select_on_db()

    def _select_on_db(self) -> None:
        self._keep_selection(self._db.execute)
        self._selected_on_db = True

    def _runs(self) -> pl.DataFrame:
        return self._text(
            "SELECT CAST(id AS BLOB), CAST(project_id AS BLOB), CAST(run_name AS BLOB), "
            'CAST(last_processed_at AS BLOB) FROM "runs"',
            ["id", "project_id", "run_name", "last_processed_at"],
        )

    def _runs_by_service(self) -> pl.DataFrame:
        """Every run with the hash of its service (its partition among any number of them):
        hashed once per audit when its partitions share what was learnt of the database."""
        runs = self._runs()
        hashes = service_hashes(runs, "project_id", "run_name")
        return runs.with_columns(hashes.alias("service_hash"))

    def _keep_selection(self, execute: Callable) -> None:
        """The kept runs, their jobs and their events as temporary tables of one connection.
        `+entity_type` keeps SQLite off the entity_type index (a few values, each matching
        most targets) and on the entity_id one: a partition's targets are a small share."""
        execute("CREATE TEMP TABLE audit_runs (id TEXT PRIMARY KEY)")
        execute(f"INSERT INTO audit_runs SELECT value FROM json_each({_literal(self._kept_runs)})")
        execute("CREATE TEMP TABLE audit_jobs (id TEXT PRIMARY KEY)")
        execute(
            "INSERT INTO audit_jobs SELECT id FROM jobs WHERE run_id IN (SELECT id FROM audit_runs)"
        )
        if "events" not in self._filters:
            return
        by_run = (
            " OR entity_run_id IN (SELECT id FROM audit_runs)"
            if "entity_run_id" in self.columns("event_targets")
            else ""
        )
        execute("CREATE TEMP TABLE audit_events (id TEXT PRIMARY KEY)")
        execute(
            "INSERT OR IGNORE INTO audit_events SELECT event_id FROM event_targets WHERE "
            "(+entity_type = 'RUN' AND entity_id IN (SELECT id FROM audit_runs))"
            " OR (+entity_type = 'JOB' AND entity_id IN (SELECT id FROM audit_jobs))" + by_run
        )

    def latest_times(self) -> list[str]:
        """The latest time each table records, over the whole database (not one partition):
        one scan per table (a lone indexed column is a lookup)."""
        found = []
        for table, columns in ALIVE_COLUMNS.items():
            present = [c for c in columns if table in self._tables and c in self.columns(table)]
            if present:
                latest = ", ".join(f'max("{column}")' for column in present)
                values = self._db.execute(f'SELECT {latest} FROM "{table}"').fetchone()
                found += [str(value) for value in values if value is not None]
        return found

    def latest(self) -> datetime | None:
        """The latest of `latest_times`, parsed."""
        times = pl.Series(self.latest_times(), dtype=pl.String).to_frame("t")
        return times.select(parse_db_time(pl.col("t")).max())["t"][0]

    def tables(self) -> set[str]:
        return self._tables

    def counts_damage(self, table: str) -> bool:
        """Whether this read counts the damage found in `table`: a table every partition
        reads whole (instances, projects, ...) is counted by the first partition only."""
        return table in self._filters or not self._later_partition

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            try:
                info = self._db.execute(f'SELECT name FROM pragma_table_info("{table}")')
                self._columns[table] = {name for (name,) in info}
            except (sqlite3.Error, UnicodeDecodeError) as error:
                raise AuditInputError(self.label, f"cannot read table {table} ({error})") from None
        return self._columns[table]

    def remember(self, name: str, compute: Callable[[], object]) -> object:
        """What the mapping makes of tables every partition reads whole (fleets, instances),
        made once per audit when partitions share what they learn (`shared`)."""
        return remembered(self._shared, name, self._path, compute)

    def read(self, table: str, columns: list[str]) -> pl.DataFrame:
        return self.read_slim(table, columns, {})

    def read_slim(
        self, table: str, columns: list[str], json_paths: dict[str, tuple[str, ...]]
    ) -> pl.DataFrame:
        """Every column as bytes, JSON documents in `json_paths` reduced to those paths in SQL;
        a table every partition reads whole is read once per audit (`shared`)."""
        if self._shared is not None and table not in RUN_TABLES and table not in self._filters:
            key = f"table {table}: {columns} {sorted(json_paths.items())}"
            read = partial(self._read_slim, table, columns, json_paths)
            return remembered(self._shared, key, self._path, read)
        return self._read_slim(table, columns, json_paths)

    def _read_slim(
        self,
        table: str,
        columns: list[str],
        json_paths: dict[str, tuple[str, ...]],
        where: str | None = None,
    ) -> pl.DataFrame:
        """Every column as bytes, JSON documents in `json_paths` reduced to those paths in SQL.

        Bytes, not text: SQLite keeps whatever bytes it was given in a TEXT column, and ADBC
        would hand bytes that are not UTF-8 to polars as a string (undefined behaviour: the
        audit died of signal 11 with nothing said). analyzer.sources.cells decodes and checks
        every value. A JSON document over cells.JSON_LIMIT is never parsed: its length comes
        in its place. `where`: only the rows it keeps."""
        if self._buckets is not None and table in self._filters:
            if self._buckets.holds(table, columns, json_paths):
                return self._buckets.read(table, self._bucket)
            self._select_unselected()
        have = self.columns(table)

        def query(size: Callable[[str], str]) -> str:
            def column(name: str) -> str:
                if name not in have:
                    return f'NULL AS "{name}"'
                if name in json_paths:
                    marker = f"char(1) || '{cells.JSON_OVER_LIMIT[1:]}' || {size(name)}"
                    return (
                        f"CASE WHEN {size(name)} > {cells.JSON_LIMIT} THEN CAST({marker} AS BLOB) "
                        f'ELSE CAST({_slim_json(name, json_paths[name])} AS BLOB) END AS "{name}"'
                    )
                return f'CAST("{name}" AS BLOB) AS "{name}"'

            text = f'SELECT {", ".join(column(c) for c in columns)} FROM "{table}"'
            kept = [self._filters[table]] if table in self._filters else []
            kept += [where] if where else []
            return text + (f" WHERE {' AND '.join(kept)}" if kept else "")

        try:
            return self._fetch(query, columns)
        except sqlite3.Error as error:
            raise AuditInputError(self.label, f"cannot read table {table} ({error})") from None

    def _select_unselected(self) -> None:
        """The selection of the runs in temporary tables, made when a run table is asked for
        otherwise than the bucket files hold it."""
        if self._unselected is not None:
            options, self._unselected, self._buckets = self._unselected, None, None
            self._select_runs(options)

    def batches(self, table: str, columns: list[str]) -> Iterator[pl.DataFrame]:
        """Every row of `table` as `read_slim` reads it (its JSON documents reduced to the
        paths the mapping reads), about BATCH_ROWS at a time in rowid ranges (a lookup each),
        every column as bytes; in the table's order."""
        rows, low, high = self._db.execute(
            f'SELECT count(*), min(rowid), max(rowid) FROM "{table}"'
        ).fetchone()
        if not rows:
            return
        step = -(-(high - low + 1) // -(-rows // BATCH_ROWS))
        paths = {c: p for c, p in JSON_PATHS.get(table, {}).items() if c in columns}
        for start in range(low, high + 1, step):
            where = f"rowid >= {start} AND rowid < {start + step}"
            frame = self._read_slim(table, columns, paths, where)
            yield frame.cast(dict.fromkeys(columns, pl.Binary))

    def split(self, count: int, folder: Path, tables: tuple[str, ...] = RUN_TABLES) -> BucketFiles:
        """The run `tables` written by bucket among `count` into a new folder in `folder`
        (analyzer.sources.buckets), as the partitions read them; with every secret value the
        database holds (load_tables collects them per partition), read on the way."""
        columns = {t: TABLE_COLUMNS[t] for t in RUN_TABLES if t in self._tables}
        json_paths = {t: JSON_PATHS.get(t, {}) for t in columns}
        by_run_id = "event_targets" in self._tables and (
            "entity_run_id" in self.columns("event_targets")
        )
        secrets: set[str] = set()
        if "users" in self._tables:
            secrets |= raw_secrets("users", self.read("users", TABLE_COLUMNS["users"]))
        damage = cells.Ledger()

        def batches(table: str, names: list[str]) -> Iterator[pl.DataFrame]:
            read = 0
            for batch in self.batches(table, names):
                if names == TABLE_COLUMNS[table]:
                    if table in ("runs", "jobs"):
                        secrets.update(raw_secrets(table, batch))
                    # every row's damage once, as one process finds it reading the table
                    cells.checked(batch, table, "", CELLS[table], damage, first_row=read)
                read += batch.height
                yield batch

        store = split_by_bucket(
            batches,
            columns,
            json_paths,
            remembered(self._shared, "runs by service", self._path, self._runs_by_service),
            count,
            Path(tempfile.mkdtemp(dir=folder)),
            by_run_id=by_run_id,
            tables=tables,
        )
        store.secrets = frozenset(secrets)
        store.damage = {table: parts for (_, table), parts in damage.found.items()}
        return store

    def selection(self, table: str) -> str | None:
        """The selection in SQL this read of `table` went through (cells.selected_by), or
        None: read whole, or from the bucket files (whose damage was found in every row)."""
        return self._selected_by if table in self._filters and self._buckets is None else None

    def whole_damage(self, table: str) -> list[pl.DataFrame] | None:
        """The damage of the whole `table`, when this partition reads its share of the table
        from the bucket files: every row's, found once when the table was split, said and
        counted by the first partition alone (an empty list for the others), as one process
        says and counts it; None when this read finds and counts its own."""
        if self._buckets is None or table not in self._filters:
            return None
        return self._buckets.damage.get(table, []) if not self._later_partition else []

    def mask_fleet_tables(self, data: SourceData, server: str) -> None:
        """A partition's fleets and instances (every partition holds them whole) masked once
        per audit, with all of the database's secret values (combine masks them no more): as
        one process masks them."""
        if self._buckets is None:
            return
        redactor = Redactor()
        redactor.add(self._buckets.secrets)
        tables = [data.fleets, data.instances]
        fleets, instances = self.remember(
            f"fleets and instances of {server}, masked",
            lambda: tuple(redactor.apply_frames(tables, CLOSED_TEXT)),
        )
        data.fleets, data.instances = fleets, instances
        data.masked_with = frozenset(redactor.values)

    def _fetch(self, query: Callable[[Callable[[str], str]], str], columns: list[str]):
        """Through ADBC straight into Arrow when it can (no Python object per value), else
        chunk by chunk into polars, so Python objects never hold a whole table. `query` is
        given how its SQLite spells a value's length in bytes."""
        if self._arrow is not None:
            try:
                frame = self._arrow.query(query(_octet_length))
                return frame.rename(dict(zip(frame.columns, columns, strict=True)))
            except Exception:  # e.g. a column NULL in its first batch, then text
                self._arrow.close()
                self._arrow = None
        if self._kept_runs is not None and not self._selected_on_db:
            self._select_on_db()  # ADBC gave up after the selection: sqlite3 needs it too
        size = _octet_length if sqlite3.sqlite_version_info >= (3, 43) else _blob_length
        cursor = self._db.execute(query(size))
        schema = {c: pl.Binary for c in columns}
        chunks = [pl.DataFrame(schema=schema)]
        while rows := cursor.fetchmany(FETCH_ROWS):
            chunks.append(pl.DataFrame(rows, schema=schema, orient="row"))
        return pl.concat(chunks, rechunk=True)

    def _text(self, sql: str, columns: list[str]) -> pl.DataFrame:
        """A query of the narrowing (its values read as bytes) as text; a value that is not
        UTF-8 is null here, and reported when its table is read."""
        return cells.decode(self._fetch(lambda _size: sql, columns))[0]

    def close(self) -> None:
        self._db.close()
        if self._arrow is not None:
            self._arrow.close()


def _octet_length(column: str) -> str:
    """A value's length in bytes, without reading it (SQLite 3.43+)."""
    return f'octet_length("{column}")'


def _blob_length(column: str) -> str:
    return f'length(CAST("{column}" AS BLOB))'


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _literal(text: str) -> str:
    """A string as an SQL literal (the kept run ids as JSON: inlined, as ADBC's low-level
    statement binds parameters only from Arrow arrays)."""
    return "'" + text.replace("'", "''") + "'"


def _arrow_connection(uri: str) -> AdbcStatement | None:
    """A second read-only connection through ADBC (Arrow out), when the driver is installed:
    its low-level statement (analyzer.sources.adbc says why not the DB-API wrapper)."""
    try:
        import adbc_driver_sqlite

        options = {"adbc.sqlite.query.batch_rows": str(ARROW_BATCH_ROWS)}
        return AdbcStatement(adbc_driver_sqlite.connect(uri), options=options)
    except Exception:  # the driver is not installed, or cannot open the file
        return None


def _is_wal(path: Path) -> bool:
    with path.open("rb") as handle:
        header = handle.read(20)
    return len(header) == 20 and header[18] == 2 and header[19] == 2


def _load(given: str, ctx: LoadContext) -> SourceData:
    path = Path(given)
    facts = facts_meanwhile(path, "sqlite", ctx.options.shared)  # hashed while it is read
    try:
        return _load_hashing(path, ctx, facts)
    except Exception:
        facts()  # a file that cannot be hashed says so, as when it was hashed before the read
        raise


def _load_hashing(path: Path, ctx: LoadContext, facts: Callable[[], InputInfo]) -> SourceData:
    # The write-ahead log lies beside the database itself, not beside a symlink to it.
    real = Path(os.path.realpath(path))
    wal = real.with_name(real.name + "-wal")
    if _is_wal(path) or wal.exists():
        with tempfile.TemporaryDirectory(prefix="dstack-audit-") as folder:
            copy = Path(folder) / path.name
            shutil.copyfile(path, copy)
            notes = []
            if wal.exists():
                shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
                wal_info = file_facts(wal, "sqlite-wal")
                wal_info.notes.append("write-ahead log read together with its database (on a copy)")
                notes.append(f"read with its write-ahead log {wal.name} (on a private copy)")
            data = _read_database(copy, path, ctx, facts, notes)
            if wal.exists():
                data.inputs.append(wal_info)
            return data
    return _read_database(path, path, ctx, facts, [])


def _read_database(
    path: Path, shown: Path, ctx: LoadContext, facts: Callable[[], InputInfo], notes: list[str]
) -> SourceData:
    """The database at `path` (`shown`: the file given, of which `facts` are the hash and
    stat), `notes` said of it first."""
    server, options = ctx.server, ctx.options
    partition = options.partition
    reader = SqliteReader(path, label=str(shown), options=options)
    try:
        if not looks_like_dstack(reader.tables()):
            raise AuditInputError(
                str(shown),
                "a SQLite database, but not a dstack one (no runs and jobs tables)",
                "point at the dstack server's data/sqlite.db",
            )
        data = load_tables(reader, server)
        reader.mask_fleet_tables(data, server)
        if reader.narrowed:
            shared = options.shared if path == shown else None  # a WAL copy: read each time
            whole = remembered(shared, "latest", path, reader.latest)
            if whole is not None:
                data.latest_time[server] = max(whole, data.latest_time.get(server, whole))
            if partition is not None:
                notes.append(f"partition {partition[0]}/{partition[1]} (whole services)")
    finally:
        reader.close()
        release_freed()
    info = facts()
    info.notes.extend(notes)
    info.records = data.runs.height + data.jobs.height + data.events.height
    info.server_version = data.server_version
    cells.apply_to(info, data)
    data.inputs.insert(0, info)
    return data


def _learn(path: Path, shared: WholeInputFacts) -> None:
    """What every partition reads of the whole database, learnt once: its hash,
    its runs by service, its latest times and the tables read whole, and its run tables split
    by bucket (the parts `shared` learns: LEARNING_PARTS; a database with a write-ahead log
    is read from a fresh copy each time: only its hash is shared). The hash is taken on a
    thread while the tables are read, as a read in one process takes it (facts_meanwhile:
    100k runs, 4.7 GB, its 3.1 s beside the split)."""
    hashed = facts_meanwhile(path, "sqlite", shared) if shared.learns_rest else None
    _learn_tables(path, shared)
    if hashed is not None:
        hashed()


def _learn_tables(path: Path, shared: WholeInputFacts) -> None:
    """`_learn`'s tables."""
    rest = shared.learns_rest
    real = Path(os.path.realpath(path))
    if _is_wal(path) or real.with_name(real.name + "-wal").exists():
        return
    reader = SqliteReader(path, options=ReadOptions(shared=shared))
    try:
        tables = reader.tables()
        if not looks_like_dstack(tables):
            return
        remembered(shared, "runs by service", path, reader._runs_by_service)
        split = tuple(table for table in RUN_TABLES if shared.splits(table))
        if shared.split is not None and split:
            count, folder = shared.split
            learn = partial(reader.split, count, folder, split)
            remembered(shared, f"buckets of {count}", path, learn)
        if not rest:
            return
        remembered(shared, "latest", path, reader.latest)
        for table in sorted((TABLE_COLUMNS.keys() & tables) - set(RUN_TABLES)):
            reader.read_slim(table, TABLE_COLUMNS[table], JSON_PATHS.get(table, {}))
        learn_fleet_tables(reader, learn_projects(reader))
    finally:
        reader.close()


SOURCE = InputKind(kind="sqlite", load=_load, sniff=_sniff, learn=_learn)
