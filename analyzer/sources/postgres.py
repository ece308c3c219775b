"""A live dstack PostgreSQL database (`DSTACK_DATABASE_URL`), read in one read-only snapshot.

Accepts `postgresql://`, `postgres://` and dstack's own `postgresql+asyncpg://` form (the
`+driver` is dropped; asyncpg's `ssl=` becomes libpq's `sslmode=`). The password comes from the
URL, or libpq finds it in `PGPASSWORD` / `~/.pgpass` / a service file as usual.

Everything is read inside one `REPEATABLE READ, READ ONLY` transaction, so runs, jobs and events
come from the same instant of a live server and nothing can be written. Only the tables and
columns in `TABLE_COLUMNS` are read, each cast to text in SQL, so the frames are all-text like the
SQLite reader's (PostgreSQL's text forms: dashed uuids, `2026-11-02 09:00:41.3`, `true`/`false`).

Bytes that are not UTF-8: a UTF8 database (dstack's, and initdb's default) cannot hold any (the
server refuses them on the way in), and a database in another real encoding (LATIN1, ...) is
converted by the server to the session's `client_encoding`, set to UTF8 here. Only SQL_ASCII
stores bytes unchecked and sends them unconverted: there every value is read as `bytea`
(`convert_to(value::text, 'SQL_ASCII')`, the bytes as stored) and analyzer.sources.cells decodes
and checks it, as it does SQLite's. Values the server's types cannot hold (NaN in an integer
column) cannot occur either; a time can still be `infinity`, which cells reads as damaged.

Rows go straight into Arrow with ADBC's libpq driver: on a 1M-row `jobs`-shaped table it was
the fastest reader (as fast as the server can send, level with connectorx, about 1.7x psycopg),
and unlike connectorx it keeps libpq's password lookup and runs every read in one transaction.
psycopg is the fallback when ADBC is not installed. JSON documents travel whole: reducing them
on the server (`read_slim`) would make PostgreSQL parse every one as jsonb, 3x slower.

The password is never shown: the input is named by the URL with the password replaced by `***`,
and driver messages are scrubbed before they become one-line `AuditInputError`s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC
from urllib.parse import parse_qsl, quote, unquote, urlencode

import polars as pl

from analyzer.errors import AuditInputError
from analyzer.sources import cells
from analyzer.sources.adbc import AdbcStatement, release_freed
from analyzer.sources.base import (
    NO_OPTIONS,
    InputInfo,
    InputKind,
    LoadContext,
    ReadOptions,
    SourceData,
)
from analyzer.sources.dstack_tables import TABLE_COLUMNS, load_tables, looks_like_dstack
from analyzer.sources.partition import sql_service_bucket

DATABASE_URL = re.compile(r"^postgres(?:ql)?(?:\+\w+)?://")
CONNECT_TIMEOUT_S = 10
LOCK_TIMEOUT = "30s"
ENGINES = ("adbc", "psycopg")  # the first one installed is used
BYTEA = 17  # the type oid psycopg reports for a bytea column

_URL = re.compile(
    r"^(?P<scheme>postgres(?:ql)?)(?:\+(?P<driver>\w+))?://(?P<rest>.*)$", re.I | re.S
)
# asyncpg's `ssl=` values -> libpq's `sslmode=` (libpq rejects an `ssl` parameter)
_ASYNCPG_SSL = {
    "true": "require",
    "1": "require",
    "false": "disable",
    "0": "disable",
    "disable": "disable",
    "allow": "allow",
    "prefer": "prefer",
    "require": "require",
    "verify-ca": "verify-ca",
    "verify_ca": "verify-ca",
    "verify-full": "verify-full",
    "verify_full": "verify-full",
}


@dataclass(frozen=True)
class Target:
    """A parsed database URL: what to connect to and how to name it without the password."""

    conninfo: str  # libpq URI; holds the password when the URL had one
    shown: str  # the URL as given, with the password replaced by ***
    anonymous: str  # the URL as given, without the password
    where: str  # host:port, for messages
    database: str
    user: str | None
    secrets: tuple[str, ...]  # forms of the password to scrub from any text


def parse_url(url: str) -> Target:
    match = _URL.match(url.strip())
    if match is None:
        raise AuditInputError(
            _redact_loose(url), "not a PostgreSQL URL", "expected postgresql://user@host:port/db"
        )
    scheme, rest = match["scheme"], match["rest"]
    # A password may hold a raw / # ? or @ (seen: DSTACK_DATABASE_URL values are rarely
    # percent-encoded): after `user:`, the password runs to the last @ of the URL, so no part
    # of it is ever taken for the host, path, query or fragment (and shown).
    userinfo, at = "", ""
    user_part = re.match(r"[^:/?#@]*:", rest)
    if user_part and "@" in rest[user_part.end() :]:
        userinfo, at, rest = rest.rpartition("@")
    rest, _, fragment = rest.partition("#")
    rest, _, query = rest.partition("?")
    netloc, slash, path = rest.partition("/")
    if not at:
        userinfo, at, netloc = netloc.rpartition("@")
    hostspec = netloc
    user_raw, colon, password_raw = userinfo.partition(":")
    user = unquote(user_raw) or None
    password = unquote(password_raw) if colon else None

    params: list[tuple[str, str]] = []
    shown_params: list[tuple[str, str]] = []
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "password":
            password = value
            shown_params.append((key, ""))
            continue
        shown_params.append((key, value))
        if key == "ssl":  # asyncpg's spelling
            key, value = "sslmode", _ASYNCPG_SSL.get(value.lower(), value)
        params.append((key, value))
    names = {key for key, _ in params}
    if "connect_timeout" not in names:
        params.append(("connect_timeout", str(CONNECT_TIMEOUT_S)))
    if "application_name" not in names:
        params.append(("application_name", "dstack-audit"))

    credentials = ""
    if user is not None or password is not None:
        credentials = quote(user or "", safe="")
        if password is not None:
            credentials += ":" + quote(password, safe="")
        credentials += "@"
    conninfo = f"postgresql://{credentials}{hostspec}/{path}"
    if params:
        conninfo += "?" + urlencode(params, quote_via=quote)

    def rebuilt(mask: str | None) -> str:
        """The URL as given; the password replaced by `mask`, or left out when mask is None."""
        text = scheme + (f"+{match['driver']}" if match["driver"] else "") + "://"
        if at and (user_raw or (colon and mask is not None)):
            text += user_raw + (f":{mask}" if colon and mask is not None else "") + "@"
        text += hostspec + slash + path
        kept = [
            f"{key}={mask if key == 'password' else quote(value, safe='/:,._-')}"
            for key, value in shown_params
            if key != "password" or mask is not None
        ]
        if kept:
            text += "?" + "&".join(kept)
        return text + (f"#{fragment}" if fragment else "")

    secrets = tuple(
        s for s in {password, password_raw if colon else None, quote(password or "", safe="")} if s
    )
    given = dict(params)  # libpq lets host, port, user and dbname come as parameters too
    user = given.get("user") or user or os.environ.get("PGUSER")
    database = (
        given.get("dbname")
        or unquote(path)
        or os.environ.get("PGDATABASE")
        or user
        or "(default database)"
    )
    return Target(
        conninfo=conninfo,
        shown=rebuilt("***"),
        anonymous=rebuilt(None),
        where=_where(given.get("host") or unquote(hostspec), given.get("port")),
        database=database,
        user=user,
        secrets=secrets,
    )


def url_without_password(url: str) -> str:
    """The URL to keep (a bundle's manifest) with no password at all: whoever runs it again
    gives the password through PGPASSWORD or ~/.pgpass."""
    return parse_url(url).anonymous


def _where(host: str, port: str | None) -> str:
    host = host or os.environ.get("PGHOST") or "localhost"
    if "," in host or host.startswith("/"):
        return host
    if port is None and re.search(r"(\]|^[^:\[]+):\d+$", host):
        return host
    return f"{host}:{port or os.environ.get('PGPORT', '5432')}"


def _redact_loose(url: str) -> str:
    """Best effort for a URL that cannot be parsed: hide anything between ':' and '@'."""
    return re.sub(r"(//[^/@:]*:).*@", r"\1***@", url, flags=re.S)


# ------------------------------------------------------------------------------------------------
# Engines: one connection, one transaction, text columns straight into polars.


class _Engine:
    name: str
    errors: tuple[type[BaseException], ...]

    def execute(self, sql: str) -> None:
        raise NotImplementedError

    def query(self, sql: str) -> pl.DataFrame:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class _Adbc(_Engine):
    """ADBC's libpq driver: the server sends binary COPY, the driver builds Arrow in C, and polars
    takes the stream through the Arrow C interface (no pyarrow). Autocommit off: the driver
    opens one transaction that every statement runs in."""

    name = "adbc"

    def __init__(self, conninfo: str) -> None:
        import adbc_driver_manager
        import adbc_driver_postgresql

        self.errors = (adbc_driver_manager.Error,)
        self._statement = AdbcStatement(adbc_driver_postgresql.connect(conninfo), autocommit=False)

    def execute(self, sql: str) -> None:
        self._statement.execute(sql)

    def query(self, sql: str) -> pl.DataFrame:
        return self._statement.query(sql)

    def close(self) -> None:
        self._statement.close()


class _Psycopg(_Engine):
    """psycopg 3 (binary wheel): rows as tuples, then one polars frame."""

    name = "psycopg"

    def __init__(self, conninfo: str) -> None:
        import psycopg

        self.errors = (psycopg.Error,)
        self._conn = psycopg.connect(conninfo, autocommit=False)

    def execute(self, sql: str) -> None:
        self._conn.execute(sql)

    def query(self, sql: str) -> pl.DataFrame:
        with self._conn.cursor() as cursor:
            cursor.execute(sql)
            rows = cursor.fetchall()
            schema = {
                column.name: pl.Binary if column.type_code == BYTEA else pl.String
                for column in cursor.description or []
            }
        return pl.DataFrame(rows, schema=schema, orient="row")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._conn.rollback()
        with contextlib.suppress(Exception):
            self._conn.close()


_ENGINE_MODULES = {"adbc": "adbc_driver_postgresql", "psycopg": "psycopg"}
_ENGINE_CLASSES: dict[str, Callable[[str], _Engine]] = {"adbc": _Adbc, "psycopg": _Psycopg}


def available_engines() -> list[str]:
    return [name for name in ENGINES if importlib.util.find_spec(_ENGINE_MODULES[name])]


# ------------------------------------------------------------------------------------------------
# Errors: one line, named by host/db, never the password.


def _one_line(text: str, secrets: tuple[str, ...]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    text = re.sub(r"^(?:[A-Z_]+: )?\[libpq\] ", "", text.strip())
    text = re.sub(r"^(?:Failed to connect|connection failed): ", "", text)
    text = re.sub(r"(?i)(password=)\S+", r"\1***", text)
    text = re.sub(r"\s*\n\s*", "; ", text)
    text = re.sub(r"\s+", " ", text).strip(" ;.")
    return text[:300]


def _connect_problem(target: Target, text: str, sqlstate: str | None) -> tuple[str, str | None]:
    low = text.lower()
    where, db = target.where, target.database
    user = target.user or "the current user"
    if "connection refused" in low:
        return (
            f"cannot connect to {where}: connection refused",
            "is PostgreSQL running there and accepting TCP/IP connections?",
        )
    if "timeout expired" in low or "timed out" in low:
        return (
            f"cannot connect to {where}: no answer within the connect timeout",
            f"host unreachable or firewalled? (connect_timeout={CONNECT_TIMEOUT_S} s by default)",
        )
    if "could not translate host name" in low or "name or service not known" in low:
        return f"cannot connect to {where}: unknown host name", "check the host in the URL"
    if any(s in low for s in ("no route to host", "network is unreachable", "host is unreachable")):
        return f"cannot connect to {where}: host unreachable", "check the host and the network"
    if sqlstate == "28P01" or "password authentication failed" in low:
        return (
            f"authentication failed for user {user} on {where}/{db}",
            "check the password in the URL, PGPASSWORD or ~/.pgpass",
        )
    if "no password supplied" in low:
        return (
            f"authentication failed for user {user} on {where}/{db}: the server wants a password "
            "and none was given",
            "put it in the URL, PGPASSWORD or ~/.pgpass",
        )
    if sqlstate == "3D000" or re.search(r'database ".*" does not exist', low):
        return f"database {db} does not exist on {where}", "check the database name in the URL"
    if re.search(r'role ".*" does not exist', low) or "pg_hba.conf" in low or sqlstate == "28000":
        return (
            f"authentication failed for user {user} on {where}/{db} "
            f"({_one_line(text, target.secrets)})",
            None,
        )
    return f"cannot connect to {where}/{db} ({_one_line(text, target.secrets)})", None


def _sqlstate(error: BaseException) -> str | None:
    state = getattr(error, "sqlstate", None)
    if state:
        return str(state)
    diag = getattr(error, "diag", None)  # psycopg
    return getattr(diag, "sqlstate", None) if diag is not None else None


# ------------------------------------------------------------------------------------------------
# The reader.


class PostgresReader:
    """All-text reads of the columns the audit needs, in one read-only snapshot transaction."""

    def __init__(
        self, target: Target, engine: str | None = None, options: ReadOptions = NO_OPTIONS
    ) -> None:
        self.label = target.shown
        self.target = target
        self._rows: dict[str, int] = {}  # table -> rows read
        names = [engine] if engine else available_engines()
        if not names:
            raise AuditInputError(
                self.label,
                "no PostgreSQL driver is installed",
                "pip install adbc-driver-postgresql (or psycopg[binary])",
            )
        self.engine_name = names[0]
        self._engine: _Engine | None = None
        problem: tuple[str, str | None] | None = None
        try:
            self._engine = _ENGINE_CLASSES[self.engine_name](target.conninfo)
        except ImportError:
            problem = (f"the PostgreSQL driver {self.engine_name} is not installed", None)
        except Exception as error:  # the driver's own error types are known only once imported
            problem = _connect_problem(target, str(error), _sqlstate(error))
        if problem is not None:  # raised outside `except`: no driver text in the chain
            raise AuditInputError(self.label, *problem)
        self._run(
            lambda e: e.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"),
            "start a read-only transaction",
        )
        self._run(lambda e: e.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"), "set up")
        self._run(lambda e: e.execute("SET LOCAL client_encoding = 'UTF8'"), "set up")
        encoding = self._run(
            lambda e: e.query("SELECT current_setting('server_encoding')::text AS encoding"),
            "read the database's encoding",
        )
        self.raw_bytes = encoding.item() == "SQL_ASCII"  # text is whatever bytes were stored
        self._columns, self._unreadable = self._discover()
        facts = self._run(
            lambda e: e.query(
                "SELECT (now() AT TIME ZONE 'UTC')::text AS snapshot, "
                "current_setting('server_version')::text AS version"
            ),
            "read the server's clock",
        )
        self.snapshot_at, self.postgres_version = facts.row(0)
        self._filters = self._pushdown(options)
        self._later_partition = bool(options.partition and options.partition[0])
        self._selected_by = cells.selected_by(options) if self._filters else None

    def _pushdown(self, options: ReadOptions) -> dict[str, str]:
        """WHERE clauses that read only the runs the audit keeps (--project, --since, a
        partition of whole services) and their jobs and events: same answer, fewer rows."""
        conditions = []
        if options.project:
            name = _literal(options.project)
            conditions.append(
                "project_id IN (SELECT id FROM projects WHERE name = "
                f"{name} OR original_name = {name})"
            )
        if options.since:
            since = _literal(options.since.astimezone(UTC).replace(tzinfo=None).isoformat(" "))
            conditions.append(f"last_processed_at >= {since}::timestamp")
        if options.partition:
            index, count = options.partition
            bucket = sql_service_bucket("project_id::text", "run_name")
            conditions.append(f"{bucket} % {count} = {index}")
        if not conditions:
            return {}
        runs = f"SELECT id FROM runs WHERE {' AND '.join(conditions)}"
        filters = {"runs": " AND ".join(conditions), "jobs": f"run_id IN ({runs})"}
        # a row of no partition (a job of no run, a probe of no job, an event of neither) is
        # read by the first partition, so that every row is read, and checked, once
        first = bool(options.partition) and options.partition[0] == 0 and len(conditions) == 1
        if first:
            filters["jobs"] += " OR run_id IS NULL OR run_id NOT IN (SELECT id FROM runs)"
        jobs = f"SELECT id FROM jobs WHERE {filters['jobs']}"
        filters["probes"] = f"job_id IN ({jobs})"
        if first:
            filters["probes"] += " OR job_id IS NULL OR job_id NOT IN (SELECT id FROM jobs)"
        if {"events", "event_targets"} <= set(self._columns):

            def targeting(runs: str, jobs: str) -> str:
                by_run = f" OR entity_run_id IN ({runs})" if run_ids else ""
                return (
                    "SELECT event_id FROM event_targets WHERE event_id IS NOT NULL AND ("
                    f"(entity_type = 'RUN' AND entity_id IN ({runs})) OR "
                    f"(entity_type = 'JOB' AND entity_id IN ({jobs})){by_run})"
                )

            run_ids = "entity_run_id" in self._columns["event_targets"]
            events = targeting(runs, jobs)
            filters["events"] = f"id IN ({events})"
            filters["event_targets"] = f"event_id IN ({events})"
            if first:  # an event of no run and no job: an instance's, a fleet's
                anyone = targeting("SELECT id FROM runs", "SELECT id FROM jobs")
                filters["events"] += f" OR id NOT IN ({anyone})"
                filters["event_targets"] += f" OR event_id NOT IN ({anyone})"
        return filters

    def _run(self, action: Callable[[_Engine], object], what: str, table: str | None = None):
        assert self._engine is not None
        problem: tuple[str, str | None] | None = None
        try:
            return action(self._engine)
        except self._engine.errors as error:
            text, state = str(error), _sqlstate(error)
            low = text.lower()
            user = self.target.user or "the audit user"
            if state == "42501" or "permission denied" in low:
                problem = (
                    f"permission denied on table {table or '?'} in {self.target.database}",
                    f"GRANT SELECT ON {table or 'the dstack tables'} TO {user}",
                )
            elif state == "55P03" or "lock timeout" in low:
                problem = (
                    f"table {table} stayed locked for {LOCK_TIMEOUT} (a migration running?)",
                    "retry when the server is idle",
                )
            else:
                problem = (f"cannot {what} ({_one_line(text, self.target.secrets)})", None)
        if problem is not None:
            self.close()
            raise AuditInputError(self.label, *problem)
        return None

    def _discover(self) -> tuple[dict[str, set[str]], dict[str, list[str]]]:
        """Tables and columns the audit needs, as the connection's search_path resolves them.

        pg_catalog rather than information_schema.columns: the latter hides tables the user has
        no privilege on, which would turn "permission denied" into "not a dstack database".
        """
        wanted = ", ".join(_literal(name) for name in TABLE_COLUMNS)
        sql = (
            "SELECT c.relname::text AS table_name, a.attname::text AS column_name, "
            "has_column_privilege(c.oid, a.attnum, 'SELECT')::text AS readable "
            "FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid "
            "AND a.attnum > 0 AND NOT a.attisdropped "
            f"WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND c.relname IN ({wanted}) "
            "AND pg_catalog.pg_table_is_visible(c.oid)"
        )
        frame = self._run(lambda e: e.query(sql), "list the tables")
        columns: dict[str, set[str]] = {}
        unreadable: dict[str, list[str]] = {}
        for table, column, readable in frame.iter_rows():
            columns.setdefault(table, set()).add(column)
            if column in TABLE_COLUMNS[table] and readable != "true":
                unreadable.setdefault(table, []).append(column)
        return columns, unreadable

    def tables(self) -> set[str]:
        return set(self._columns)

    def selection(self, table: str) -> str | None:
        """The selection in SQL this read of `table` went through (cells.selected_by), or
        None: read whole."""
        return self._selected_by if table in self._filters else None

    def counts_damage(self, table: str) -> bool:
        """A table every partition reads whole is counted by the first partition only."""
        return table in self._filters or not self._later_partition

    def columns(self, table: str) -> set[str]:
        return self._columns.get(table, set())

    def check_access(self) -> None:
        if self._unreadable:
            tables = sorted(self._unreadable)
            user = self.target.user or "the audit user"
            problem = (
                f"permission denied on table{'s' if len(tables) > 1 else ''} "
                f"{', '.join(tables)} in {self.target.database}",
                f"GRANT SELECT ON {', '.join(tables)} TO {user}",
            )
            self.close()
            raise AuditInputError(self.label, *problem)

    def read(self, table: str, columns: list[str]) -> pl.DataFrame:
        have = self.columns(table)

        def value(column: str) -> str:
            text = f"{_ident(column)}::text" if column in have else "NULL::text"
            return f"convert_to({text}, 'SQL_ASCII')" if self.raw_bytes else text

        select = ", ".join(f"{value(c)} AS {_ident(c)}" for c in columns)
        where = f" WHERE {self._filters[table]}" if table in self._filters else ""
        frame = self._run(
            lambda e: e.query(f"SELECT {select} FROM {_ident(table)}{where}"),
            f"read {table}",
            table,
        )
        self._rows[table] = frame.height
        return frame.select(
            pl.col(c) if frame.schema[c] == pl.Binary else pl.col(c).cast(pl.String)
            for c in columns
        )

    @property
    def rows_read(self) -> int:
        """The rows read, as the merge of partitions adds them up: a table every partition
        reads whole counted by the first partition only (counts_damage)."""
        return sum(rows for table, rows in self._rows.items() if self.counts_damage(table))

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()
            self._engine = None


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def load_url(
    url: str, server: str, *, engine: str | None = None, options: ReadOptions = NO_OPTIONS
) -> SourceData:
    """Audit input from a live PostgreSQL database URL (read-only, one snapshot)."""
    target = parse_url(url)
    reader = PostgresReader(target, engine, options)
    try:
        if not looks_like_dstack(reader.tables()):
            raise AuditInputError(
                target.shown,
                f"connected to {target.where}/{target.database}, but it is not a dstack database "
                "(no runs and jobs tables)",
                "use the database of the server's DSTACK_DATABASE_URL",
            )
        reader.check_access()
        data = load_tables(reader, server)
    finally:
        reader.close()
        release_freed()
    info = InputInfo(
        path=target.shown,
        kind="postgresql",
        sha256=None,
        size=None,
        mtime=None,
        records=reader.rows_read,
        server_version=data.server_version,
    )
    info.notes.append(
        f"snapshot of {target.where}/{target.database} at {reader.snapshot_at} UTC, read in one "
        f"REPEATABLE READ, READ ONLY transaction (PostgreSQL {reader.postgres_version}, "
        f"reader {reader.engine_name})"
    )
    if options.partition:  # its records and damage are its share: the merge adds them up
        info.notes.append(
            f"partition {options.partition[0]}/{options.partition[1]} (whole services)"
        )
    cells.apply_to(info, data)
    data.inputs.append(info)
    data.secrets.update(target.secrets)  # the password is a known value: masked wherever it shows
    return data


def _claims(given: str) -> bool:
    return DATABASE_URL.match(given) is not None


def _load(given: str, ctx: LoadContext) -> SourceData:
    return load_url(given, ctx.server, options=ctx.options)


SOURCE = InputKind(kind="postgresql", load=_load, claims=_claims)
