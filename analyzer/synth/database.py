"""The server.db writer: dstack 0.22.5's schema, rows in dstack's encodings."""

from __future__ import annotations

import queue
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import numpy as np
import polars as pl

from analyzer.synth.constants import DB_TIME, EPOCH, US
from analyzer.synth.entities import _Job
from analyzer.synth.templates import Templates


def _job_order(job: _Job) -> tuple:
    return (job.replica_num, job.submission_num)


_DAY_CACHE: dict[int, str] = {}


def _fmt_db(us: int) -> str:
    """dstack's SQLite time text: naive UTC, microseconds always written."""
    seconds, micro = divmod(us, US)
    day, rest = divmod(seconds, 86400)
    date = _DAY_CACHE.get(day)
    if date is None:
        date = (EPOCH + timedelta(days=day)).strftime("%Y-%m-%d")
        _DAY_CACHE[day] = date
    hour, rest = divmod(rest, 3600)
    minute, second = divmod(rest, 60)
    return f"{date} {hour:02d}:{minute:02d}:{second:02d}.{micro:06d}"


# ---------------------------------------------------------------------------------------------
# writers


def _bulk_ids(gen: np.random.Generator, n: int) -> list[str]:
    """n random uuid4 ids as 32 lowercase hex characters (vectorised)."""
    if n == 0:
        return []
    raw = gen.integers(0, 256, size=(n, 16), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80
    text = raw.tobytes().hex()
    return [text[i : i + 32] for i in range(0, 32 * n, 32)]


def _times(values: Sequence[int], fmt: str, zone: str | None = None) -> list[str]:
    series = pl.Series(values=values, dtype=pl.Int64).cast(pl.Datetime("us"))
    if zone is not None and zone != "UTC":
        series = series.dt.replace_time_zone("UTC").dt.convert_time_zone(zone)
    return series.dt.strftime(fmt).to_list()


class _Database:
    """server.db: the capture's DDL, statement by statement; indexes after the bulk load.

    Rows are written by one background thread (sqlite3 releases the GIL while SQLite works),
    in the order they are handed over, so the file is the same for the same seed."""

    def __init__(self, path: Path, tpl: Templates, seed: int):
        self.tpl = tpl
        self.path = path
        self.counts: Counter[str] = Counter()
        self.gen = np.random.Generator(np.random.PCG64(seed + 0x5EED))
        self.queue: queue.Queue = queue.Queue(maxsize=3)
        self.error: BaseException | None = None
        self.cpu = 0.0
        self.thread = threading.Thread(target=self._work, name="synth-db", daemon=True)
        self.thread.start()

    # -- the writer thread --------------------------------------------------------------------

    def _work(self) -> None:
        con = None
        began = time.thread_time()
        try:
            con = sqlite3.connect(self.path, isolation_level=None)
            con.execute("PRAGMA journal_mode=OFF")
            con.execute("PRAGMA synchronous=OFF")
            con.execute("PRAGMA cache_size=-262144")
            con.execute("PRAGMA threads=4")
            con.execute("BEGIN")
            for kind, _, sql in self.tpl.schema:
                if kind == "table":
                    con.execute(sql)
            while True:
                job = self.queue.get()
                if job is None:
                    break
                job(con)
            con.execute(
                "INSERT INTO alembic_version (version_num) VALUES (?)", (self.tpl.alembic_version,)
            )
            self.counts["alembic_version"] += 1
            for kind, _, sql in self.tpl.schema:
                if kind != "table":
                    con.execute(sql)
            con.execute("COMMIT")
            con.execute("PRAGMA journal_mode=DELETE")
        except BaseException as exc:  # handed to the caller at the next call
            self.error = exc
            while self.queue.get() is not None:
                pass
        finally:
            if con is not None:
                con.close()
            self.cpu = time.thread_time() - began

    def _put(self, job) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put(job)

    # -- what the simulation hands over ------------------------------------------------------

    def insert(self, table: str, rows: list[dict], times: Sequence[str] = ()) -> None:
        """Rows as dicts; the columns named in `times` hold microseconds, written as text."""
        if not rows:
            return
        columns = self.tpl.columns[table]
        sql = (
            f'INSERT INTO "{table}" ({", ".join(columns)}) VALUES ({", ".join("?" * len(columns))})'
        )

        def job(con: sqlite3.Connection) -> None:
            values = [[r[c] for r in rows] for c in columns]
            for column in times:
                index = columns.index(column)
                values[index] = _times(values[index], DB_TIME)
            con.executemany(sql, sorted(zip(*values, strict=True)))
            self.counts[table] += len(rows)

        self._put(job)

    def events(
        self,
        ev_t: list[int],
        ev_msg: list[str],
        ev_actor: list[str | None],
        tg_ev: list[int],
        tg: list[tuple],
        keep_after: int | None,
    ) -> None:
        n, m = len(ev_t), len(tg)
        if n == 0:
            return
        ids = _bulk_ids(self.gen, n + m)

        def job(con: sqlite3.Connection) -> None:
            events = pl.DataFrame(
                {
                    "id": ids[:n],
                    "message": ev_msg,
                    "recorded_at": pl.Series(ev_t, dtype=pl.Int64),
                    "actor_user_id": pl.Series(ev_actor, dtype=pl.String),
                }
            ).with_row_index("e")
            kind, entity, name, project, run, fleet, _ = zip(*tg, strict=True)
            targets = pl.DataFrame(
                {
                    "id": ids[n:],
                    "e": pl.Series(tg_ev, dtype=pl.UInt32),
                    "entity_project_id": pl.Series(project, dtype=pl.String),
                    "entity_type": pl.Series(kind, dtype=pl.String),
                    "entity_id": pl.Series(entity, dtype=pl.String),
                    "entity_name": pl.Series(name, dtype=pl.String),
                    "entity_run_id": pl.Series(run, dtype=pl.String),
                    "entity_fleet_id": pl.Series(fleet, dtype=pl.String),
                }
            )
            if keep_after is not None:
                events = events.filter(pl.col("recorded_at") >= keep_after)
                targets = targets.join(events.select("e"), on="e", how="semi")
            targets = targets.with_columns(
                pl.col("e").replace_strict(events["e"], events["id"]).alias("event_id")
            )
            events = events.with_columns(
                pl.col("recorded_at").cast(pl.Datetime("us")).dt.strftime(DB_TIME)
            ).sort("id")
            targets = targets.sort("id")
            con.executemany(
                "INSERT INTO events (id, message, recorded_at, actor_user_id) VALUES (?, ?, ?, ?)",
                events.select("id", "message", "recorded_at", "actor_user_id").iter_rows(),
            )
            con.executemany(
                "INSERT INTO event_targets (id, event_id, entity_project_id, entity_type, "
                "entity_id, entity_name, entity_run_id, entity_fleet_id, entity_gateway_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                targets.select(
                    "id",
                    "event_id",
                    "entity_project_id",
                    "entity_type",
                    "entity_id",
                    "entity_name",
                    "entity_run_id",
                    "entity_fleet_id",
                ).iter_rows(),
            )
            self.counts["events"] += events.height
            self.counts["event_targets"] += targets.height

        self._put(job)

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error
