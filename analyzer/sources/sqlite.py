"""A dstack SQLite database file (`server.db` / `sqlite.db`), opened read-only.

`mode=ro` never creates a missing file and never writes; a `-wal` beside the file is read
by SQLite as part of the database (copy db, -wal and -shm together, never a live server's).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote

import polars as pl

from analyzer.errors import AuditInputError
from analyzer.sources import Source, SourceData, file_facts
from analyzer.sources.dstack_tables import load_tables, looks_like_dstack

SQLITE_MAGIC = b"SQLite format 3\x00"


def _sniff(path: Path) -> bool:
    if not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            return handle.read(16) == SQLITE_MAGIC
    except OSError:
        return False


class SqliteReader:
    """All-text reads of the columns the audit needs; absent columns come back null."""

    def __init__(self, path: Path) -> None:
        self.label = str(path)
        uri = f"file:{quote(str(path.resolve()))}?mode=ro"
        try:
            self._db = sqlite3.connect(uri, uri=True)
            self._db.execute("PRAGMA query_only = ON")
            rows = self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            self._tables = {name for (name,) in rows}
        except sqlite3.DatabaseError as error:
            raise AuditInputError(
                self.label, f"cannot read the SQLite database ({error})", "is the file complete?"
            ) from None
        self._columns: dict[str, set[str]] = {}

    def tables(self) -> set[str]:
        return self._tables

    def columns(self, table: str) -> set[str]:
        if table not in self._columns:
            info = self._db.execute(f'SELECT name FROM pragma_table_info("{table}")')
            self._columns[table] = {name for (name,) in info}
        return self._columns[table]

    def read(self, table: str, columns: list[str]) -> pl.DataFrame:
        have = self.columns(table)
        select = ", ".join(
            f'CAST("{c}" AS TEXT) AS "{c}"' if c in have else f'NULL AS "{c}"' for c in columns
        )
        try:
            rows = self._db.execute(f'SELECT {select} FROM "{table}"').fetchall()
        except sqlite3.DatabaseError as error:
            raise AuditInputError(self.label, f"cannot read table {table} ({error})") from None
        return pl.DataFrame(rows, schema={c: pl.String for c in columns}, orient="row")

    def close(self) -> None:
        self._db.close()


def _load(path: Path, server: str) -> SourceData:
    info = file_facts(path, "sqlite")
    reader = SqliteReader(path)
    try:
        if not looks_like_dstack(reader.tables()):
            raise AuditInputError(
                str(path),
                "a SQLite database, but not a dstack one (no runs and jobs tables)",
                "point at the dstack server's data/sqlite.db",
            )
        data = load_tables(reader, server)
    finally:
        reader.close()
    info.records = data.runs.height + data.jobs.height + data.events.height
    info.server_version = data.server_version
    data.inputs.append(info)
    return data


SOURCE = Source(kind="sqlite", sniff=_sniff, load=_load)
