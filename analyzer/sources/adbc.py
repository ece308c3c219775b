"""One statement of ADBC's low-level API over a driver's database handle: SQL in, a polars frame
out through the Arrow C stream (no pyarrow, no Python object per value). The SQLite and the
PostgreSQL readers share it. Not ADBC's DB-API wrapper: on the main thread that wrapper puts a
SIGINT handler of its own around each call (apache/arrow-adbc#1522), and a Ctrl-C landing in a
call that then completes is consumed by it and lost. Here Python's own handler stays: the
interrupt is raised as soon as the call in hand returns."""

from __future__ import annotations

import contextlib
import ctypes
from typing import Any

import polars as pl


def release_freed() -> None:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`; elsewhere
    nothing). An ADBC driver allocates the Arrow buffers it hands over with the C library's
    malloc, and polars keeps them as they are; once the frames are mapped and dropped, their
    pages stay in the C heap, where polars' own allocator never reuses them. Called when a
    database has been read: at 16k runs the audit's memory from then on is 150-250 MB lower;
    and before the merge of partitions audited in one process (api.partitions_merged), for
    what their Python objects and reads freed."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):  # not glibc
        return
    trim(0)


class AdbcStatement:
    """A connection to `database` (a driver's `connect(...)`, closed with the rest) and one
    statement on it. `autocommit=False`: the driver opens one transaction that every statement
    runs in, rolled back on close (nothing is ever written). `options`: the statement's, as
    its driver names them."""

    def __init__(
        self, database: Any, *, autocommit: bool = True, options: dict[str, str] | None = None
    ) -> None:
        import adbc_driver_manager

        self._handles: list = [database]  # database, connection, statement: closed in reverse
        self._transaction = not autocommit
        try:
            connection = adbc_driver_manager.AdbcConnection(database)
            self._handles.append(connection)
            if self._transaction:
                connection.set_autocommit(False)
            self._statement = adbc_driver_manager.AdbcStatement(connection)
            self._handles.append(self._statement)
            if options:
                self._statement.set_options(**options)
        except BaseException:
            self.close()
            raise

    def execute(self, sql: str) -> None:
        self._statement.set_sql_query(sql)
        self._statement.execute_update()

    def query(self, sql: str) -> pl.DataFrame:
        self._statement.set_sql_query(sql)
        stream, _ = self._statement.execute_query()
        return pl.DataFrame(stream)

    def close(self) -> None:
        while self._handles:
            handle = self._handles.pop()
            if self._transaction and hasattr(handle, "rollback"):
                with contextlib.suppress(Exception):
                    handle.rollback()  # nothing was written; end the snapshot cleanly
            with contextlib.suppress(Exception):
                handle.close()
