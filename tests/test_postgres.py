"""A live PostgreSQL database as input: the real pg_dump captures restored into a real server.

The server is `DSTACK_AUDIT_TEST_PG` (a URL of a role that may create databases and roles) or a
throwaway cluster started here from the Debian binaries (`.ci/postgres.sh` installs them):
unprivileged user, 127.0.0.1 on a free port, trust auth plus one password-auth role. Without
either, the server tests are skipped with the reason (pytest -ra lists it).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, urlsplit

import polars as pl
import pytest
from conftest import CAPTURES, ROOT, expected_victims, found_victims, load_truth

from analyzer import open_sources
from analyzer.errors import AuditInputError
from analyzer.sources import postgres
from analyzer.sources.dstack_tables import TABLE_COLUMNS

DUMPS = sorted((CAPTURES / "postgres").glob("*.sql"))
SCENARIOS = [dump.stem for dump in DUMPS]
TEST_USER = "audit"  # superuser of the throwaway cluster (trust auth)
PASSWORD_USER = "audit_pw"  # the one role that must give a password
RESTRICT_LINE = re.compile(r"^\\(?:un)?restrict\b")
# psql releases that know \restrict / \unrestrict (Aug 2025: 13.22, 14.19, 15.14, 16.10, 17.6)
RESTRICT_SINCE = {13: 22, 14: 19, 15: 14, 16: 10, 17: 6}


# ------------------------------------------------------------------------------------------------
# The server


@dataclass
class PgServer:
    host: str
    port: int
    admin: str  # userinfo of a role that may create databases ("user" or "user:password")
    psql: str
    origin: str  # what started it, for messages
    password_user: str | None = None
    password: str | None = None
    params: str = ""  # query string of DSTACK_AUDIT_TEST_PG (sslmode, ...)
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    databases: dict[str, str] = field(default_factory=dict)  # scenario -> database name
    roles: list[str] = field(default_factory=list)

    def url(self, database: str, *, userinfo: str | None = None, scheme: str = "postgresql"):
        url = f"{scheme}://{userinfo or self.admin}@{self.host}:{self.port}/{database}"
        return f"{url}?{self.params}" if self.params else url

    def psql_run(self, database: str, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            [self.psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", self.url(database), *args],
            input=stdin,
            capture_output=True,
            text=True,
            env={**os.environ, "PGCONNECT_TIMEOUT": "10"},
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(f"psql {' '.join(args)[:80]} failed: {done.stderr.strip()}")
        return done.stdout

    def sql(self, database: str, statement: str) -> str:
        return self.psql_run(database, "-A", "-t", "-c", statement).strip()

    def new_database(self, name: str) -> str:
        database = f"dstack_audit_{self.token}_{re.sub(r'[^a-z0-9]', '_', name.lower())}"
        self.sql("postgres", f'CREATE DATABASE "{database}"')
        self.databases[name] = database
        return database

    def load_dump(self, dump: Path, name: str, *, filter_restrict: bool | None = None) -> str:
        database = self.new_database(name)
        if filter_restrict is None:
            filter_restrict = not psql_knows_restrict(self.psql)
        if filter_restrict:
            self.psql_run(database, "-f", "-", stdin=without_restrict(dump.read_text()))
        else:
            self.psql_run(database, "-f", str(dump))
        if self.password_user:
            self.sql(
                database, f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{self.password_user}"'
            )
        return database

    def drop_all(self) -> None:
        for database in self.databases.values():
            with contextlib.suppress(Exception):
                self.sql("postgres", f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        for role in self.roles:
            with contextlib.suppress(Exception):
                self.sql("postgres", f'DROP ROLE IF EXISTS "{role}"')


def without_restrict(text: str) -> str:
    """The dump without pg_dump 15.14+'s `\\restrict KEY` / `\\unrestrict KEY` lines, for an
    older psql (which stops on an unknown meta-command with ON_ERROR_STOP)."""
    return "".join(line for line in text.splitlines(True) if not RESTRICT_LINE.match(line))


def psql_knows_restrict(psql: str) -> bool:
    out = subprocess.run([psql, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"(\d+)\.(\d+)", out)
    if not found:
        return False
    major, minor = int(found[1]), int(found[2])
    return major >= 18 or minor >= RESTRICT_SINCE.get(major, 10**6)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def find_bin(name: str) -> str | None:
    found = sorted(
        glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
        key=lambda p: int(re.search(r"/(\d+)/bin/", p)[1]),  # type: ignore[index]
    )
    return found[-1] if found else shutil.which(name)


def _server_from_env(url: str) -> PgServer:
    parts = urlsplit(url)
    psql = find_bin("psql")
    if psql is None:
        pytest.skip("DSTACK_AUDIT_TEST_PG is set but no psql client is installed")
    userinfo = parts.netloc.rpartition("@")[0] or pwd.getpwuid(os.getuid()).pw_name
    server = PgServer(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 5432,
        admin=userinfo,
        psql=psql,
        origin="DSTACK_AUDIT_TEST_PG",
        params=parts.query,
    )
    role, password = f"dstack_audit_pw_{server.token}", secrets.token_urlsafe(12)
    try:
        server.sql("postgres", f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{password}'")
        server.roles.append(role)
        server.password_user, server.password = role, password
    except RuntimeError:
        pass  # no CREATEROLE: the password tests skip
    return server


def _unprivileged_user() -> tuple[int, int] | None:
    """(uid, gid) to run the cluster as when we are root: `postgres` if the Debian package made
    it, else a system user created for this."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "dstack-audit-pg"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "dstack-audit-pg"],
        check=True,
        capture_output=True,
    )
    entry = pwd.getpwnam("dstack-audit-pg")
    return entry.pw_uid, entry.pw_gid


@contextlib.contextmanager
def throwaway_cluster() -> Iterator[PgServer]:
    initdb, pg_ctl = find_bin("initdb"), find_bin("pg_ctl")
    psql = find_bin("psql")
    if not (initdb and pg_ctl and psql):
        pytest.skip(
            "no PostgreSQL server binaries (initdb/pg_ctl under /usr/lib/postgresql/*/bin; "
            "run .ci/postgres.sh) and DSTACK_AUDIT_TEST_PG is not set"
        )
    try:
        ids = _unprivileged_user()
    except (OSError, subprocess.CalledProcessError) as error:
        pytest.skip(f"running as root and cannot create an unprivileged user for initdb: {error}")
    parent = Path(tempfile.gettempdir())
    if ids is not None and not all(p.stat().st_mode & 0o001 for p in (parent, *parent.parents)):
        parent = Path("/tmp")  # TMPDIR is not reachable by the cluster's user
    base = Path(tempfile.mkdtemp(prefix="dstack-audit-pg-", dir=parent))
    as_user: dict = {}
    if ids is not None:
        os.chown(base, *ids)
        as_user = {"user": ids[0], "group": ids[1], "extra_groups": []}
    data, log = base / "data", base / "server.log"
    env = {**os.environ, "LC_ALL": "C", "HOME": str(base)}
    password = secrets.token_urlsafe(12)

    def run(*cmd: str) -> None:
        done = subprocess.run(
            cmd, cwd=base, env=env, capture_output=True, text=True, timeout=120, **as_user
        )
        if done.returncode != 0:
            tail = log.read_text()[-400:] if log.exists() else ""
            raise RuntimeError(f"{cmd[0]} failed: {done.stderr.strip()} {tail}".strip())

    started = False
    try:
        port = free_port()
        try:
            run(initdb, "-D", str(data), "-U", TEST_USER, "-A", "trust", "-E", "UTF8")
            with (data / "postgresql.conf").open("a") as conf:
                conf.write(
                    f"listen_addresses = '127.0.0.1'\nport = {port}\n"
                    "unix_socket_directories = ''\nfsync = off\nsynchronous_commit = off\n"
                    "full_page_writes = off\nmax_connections = 30\n"
                )
            (data / "pg_hba.conf").write_text(
                f"host all {PASSWORD_USER} 127.0.0.1/32 scram-sha-256\n"
                "host all all 127.0.0.1/32 trust\n"
            )
            run(pg_ctl, "-D", str(data), "-l", str(log), "-w", "-t", "60", "start")
            started = True
        except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
            pytest.skip(f"could not start a throwaway PostgreSQL cluster: {error}")
        server = PgServer(
            host="127.0.0.1",
            port=port,
            admin=TEST_USER,
            psql=psql,
            origin=f"throwaway cluster ({Path(initdb).parent})",
            password_user=PASSWORD_USER,
            password=password,
        )
        server.sql("postgres", f"CREATE ROLE {PASSWORD_USER} LOGIN PASSWORD '{password}'")
        yield server
    finally:
        if started:
            with contextlib.suppress(Exception):
                run(pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    given = os.environ.get("DSTACK_AUDIT_TEST_PG")
    if given:
        server = _server_from_env(given)
        try:
            yield server
        finally:
            server.drop_all()
    else:
        with throwaway_cluster() as server:
            yield server


@pytest.fixture(scope="session")
def loaded(pg: PgServer) -> dict[str, str]:
    """scenario -> URL of a database restored from its dump with psql."""
    return {dump.stem: pg.url(pg.load_dump(dump, dump.stem)) for dump in DUMPS}


def _checksums(pg: PgServer, database: str) -> dict[str, str]:
    tables = pg.sql(
        database, "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1"
    ).split()
    return {
        table: pg.sql(
            database,
            f"SELECT count(*) || ' ' || md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), "
            f"'')) FROM public.\"{table}\" t",
        )
        for table in tables
    }


def _rows_in_audited_tables(pg: PgServer, database: str) -> int:
    total = " + ".join(f'(SELECT count(*) FROM public."{t}")' for t in TABLE_COLUMNS)
    return int(pg.sql(database, f"SELECT {total}"))


def _one_clean_line(error: AuditInputError, *, secret: str | None = None) -> str:
    text = str(error)
    assert "\n" not in text and "\r" not in text, text
    assert "Traceback" not in text
    if secret:
        assert secret not in text
        assert secret not in repr(error.args)
        assert secret not in (error.hint or "") + error.problem + error.source
    return text


def _closed_port() -> int:
    return free_port()  # nothing listens there once the probe socket is closed


# ------------------------------------------------------------------------------------------------
# URLs (no server needed)


@pytest.mark.parametrize(
    ("url", "shown", "conninfo"),
    [
        (
            "postgresql+asyncpg://dstack:s3cr%40t@db.internal:5432/dstack",
            "postgresql+asyncpg://dstack:***@db.internal:5432/dstack",
            "postgresql://dstack:s3cr%40t@db.internal:5432/dstack?connect_timeout=10",
        ),
        (
            "postgres://u@h/db?connect_timeout=3",
            "postgres://u@h/db?connect_timeout=3",
            "postgresql://u@h/db?connect_timeout=3&application_name",
        ),
        (
            "postgresql://u:p@w:d@h:1/db",  # an unescaped @ in the password stays in it
            "postgresql://u:***@h:1/db",
            "postgresql://u:p%40w%3Ad@h:1/db",
        ),
        (
            "postgresql+asyncpg://u@h/db?ssl=true&password=hunter2",
            "postgresql+asyncpg://u@h/db?ssl=true&password=***",
            "postgresql://u:hunter2@h/db?sslmode=require",
        ),
    ],
)
def test_url_forms_and_redaction(url, shown, conninfo):
    target = postgres.parse_url(url)
    assert target.shown == shown
    assert target.conninfo.startswith(conninfo)
    assert "application_name=dstack-audit" in target.conninfo
    for secret in ("s3cr", "p@w", "hunter2"):
        assert secret not in target.shown


@pytest.mark.parametrize(
    ("url", "kept"),
    [
        ("postgresql+asyncpg://u:pw@h:5432/db", "postgresql+asyncpg://u@h:5432/db"),
        ("postgres://u@h/db?password=pw&sslmode=require", "postgres://u@h/db?sslmode=require"),
        ("postgresql://:pw@h/db", "postgresql://h/db"),
        ("postgresql://h/db", "postgresql://h/db"),
    ],
)
def test_url_without_password(url, kept):
    assert postgres.url_without_password(url) == kept


def test_driver_text_is_scrubbed_to_one_line():
    text = postgres._one_line(
        'IO: [libpq] Failed to connect: password=hunter2 "hunter2" failed\n\tagain', ("hunter2",)
    )
    assert "hunter2" not in text and "\n" not in text


def test_restrict_lines_filtered_for_an_older_psql():
    text = DUMPS[0].read_text()
    assert RESTRICT_LINE.search(text.splitlines()[4]) or "\\restrict" in text
    filtered = without_restrict(text)
    assert "\\restrict" not in filtered and "\\unrestrict" not in filtered
    assert len(filtered.splitlines()) == len(text.splitlines()) - 2


# ------------------------------------------------------------------------------------------------
# Errors that need no server


def test_closed_port_is_one_clean_line():
    port = _closed_port()
    with pytest.raises(AuditInputError) as caught:
        open_sources([f"postgresql://someone:hunter2-pw@127.0.0.1:{port}/dstack"])
    text = _one_clean_line(caught.value, secret="hunter2-pw")
    assert f"127.0.0.1:{port}" in text and "connection refused" in text
    assert "/dstack" in text


def test_black_holed_host_times_out():
    """A host that takes the connection and never answers: the connect timeout ends it."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # never accepted: the handshake completes, nothing is ever said
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(AuditInputError) as caught:
            postgres.load_url(f"postgresql://u@127.0.0.1:{port}/db?connect_timeout=2", "s")
        assert time.monotonic() - started < 20
    text = _one_clean_line(caught.value)
    assert f"127.0.0.1:{port}" in text and "no answer" in text


def test_cli_closed_port_exit_2_one_line():
    url = f"postgresql+asyncpg://someone:hunter2-pw@127.0.0.1:{_closed_port()}/dstack"
    done = subprocess.run(
        [sys.executable, "-m", "analyzer", "audit", url],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "127.0.0.1" in lines[0] and "hunter2-pw" not in done.stderr + done.stdout


# ------------------------------------------------------------------------------------------------
# Against the server


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_dump_gives_truth(pg, loaded, scenario):
    truth = load_truth(CAPTURES / "postgres" / scenario / "truth.json")
    report = open_sources([loaded[scenario]]).report
    assert found_victims(report) == expected_victims(truth)
    assert len(report.runs) == len(truth["runs"])
    (info,) = report.inputs
    assert info.kind == "postgresql" and info.sha256 is None
    assert info.server_version == "0.22.1-0.22.5"  # 0.22.1 to 0.22.5 share one alembic head
    database = urlsplit(loaded[scenario]).path.lstrip("/")
    assert info.records == _rows_in_audited_tables(pg, database) > 0


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_database_and_its_exports_agree(loaded, scenario):
    from_db = open_sources([loaded[scenario]]).report
    from_csv = open_sources([CAPTURES / "postgres" / scenario / "tables"]).report
    exclude = {"inputs", "limitations"}
    assert from_db.model_dump(exclude=exclude) == from_csv.model_dump(exclude=exclude)


@pytest.mark.parametrize("scheme", ["postgresql+asyncpg", "postgres"])
def test_other_url_forms(pg, loaded, scheme):
    url = pg.url(urlsplit(loaded["seed"]).path.lstrip("/"), scheme=scheme)
    report = open_sources([url]).report
    assert found_victims(report) == expected_victims(
        load_truth(CAPTURES / "postgres" / "seed" / "truth.json")
    )
    assert report.inputs[0].path.startswith(scheme + "://")


def test_dump_loaded_without_restrict_lines(pg):
    """The path for a psql older than 15.14: the same dump with the lines filtered out."""
    dump = CAPTURES / "postgres" / "seed.sql"
    database = pg.load_dump(dump, "seed-filtered", filter_restrict=True)
    report = open_sources([pg.url(database)]).report
    assert found_victims(report) == expected_victims(
        load_truth(CAPTURES / "postgres" / "seed" / "truth.json")
    )


def test_audit_leaves_the_database_unchanged(pg, loaded):
    database = urlsplit(loaded["seed"]).path.lstrip("/")
    before = _checksums(pg, database)
    open_sources([loaded["seed"]])
    assert _checksums(pg, database) == before
    assert {"runs", "jobs", "events"} <= set(before)


def test_reader_session_is_a_read_only_snapshot(loaded):
    reader = postgres.PostgresReader(postgres.parse_url(loaded["seed"]))
    try:
        engine = reader._engine
        assert engine is not None
        settings = engine.query(
            "SELECT current_setting('transaction_read_only') AS ro, "
            "current_setting('transaction_isolation') AS iso"
        )
        assert settings.row(0) == ("on", "repeatable read")
        with pytest.raises(engine.errors, match="read-only transaction"):
            engine.execute("CREATE TABLE audit_was_here (x int)")
    finally:
        reader.close()


@pytest.mark.parametrize("engine", postgres.ENGINES)
def test_engines_read_the_same_text(loaded, engine):
    if engine not in postgres.available_engines():
        pytest.skip(f"{engine} is not installed")
    url = loaded["seed"]
    first = postgres.available_engines()[0]
    frames = {}
    for name in (first, engine):
        reader = postgres.PostgresReader(postgres.parse_url(url), name)
        try:
            frames[name] = {t: reader.read(t, TABLE_COLUMNS[t]) for t in reader.tables()}
        finally:
            reader.close()
    for table, frame in frames[first].items():
        other = frames[engine][table]
        assert frame.schema == other.schema == pl.Schema(dict.fromkeys(frame.columns, pl.String))
        assert frame.sort(frame.columns).equals(other.sort(other.columns)), table
    jobs = frames[engine]["jobs"]
    assert set(jobs["ready"].drop_nulls()) <= {"true", "false"}
    assert jobs["id"].str.contains("-").all()  # native uuid text is dashed


def _need_password_user(pg: PgServer) -> tuple[str, str]:
    if not (pg.password_user and pg.password):
        pytest.skip(f"{pg.origin}: no role with a password could be created")
    database = pg.databases["seed"]
    try:
        postgres.load_url(pg.url(database, userinfo=f"{pg.password_user}:wrong"), "s")
    except AuditInputError:
        pass
    else:
        pytest.skip(f"{pg.origin} lets {pg.password_user} in without its password (trust)")
    return pg.password_user, pg.password


def test_wrong_password(pg, loaded):
    user, _ = _need_password_user(pg)
    database = urlsplit(loaded["seed"]).path.lstrip("/")
    wrong = "not-the-" + secrets.token_hex(4)
    with pytest.raises(AuditInputError) as caught:
        postgres.load_url(pg.url(database, userinfo=f"{user}:{wrong}"), "s")
    text = _one_clean_line(caught.value, secret=wrong)
    assert "authentication failed" in text
    assert f"{pg.host}:{pg.port}" in text and database in text


@pytest.mark.parametrize("how", ["url", "PGPASSWORD", "PGPASSFILE"])
def test_password_sources(pg, loaded, tmp_path, monkeypatch, how):
    user, password = _need_password_user(pg)
    database = urlsplit(loaded["seed"]).path.lstrip("/")
    userinfo = user
    if how == "url":
        userinfo = f"{user}:{quote(password, safe='')}"
    elif how == "PGPASSWORD":
        monkeypatch.setenv("PGPASSWORD", password)
    else:
        passfile = tmp_path / "pgpass"
        passfile.write_text(f"{pg.host}:{pg.port}:{database}:{user}:{password}\n")
        passfile.chmod(0o600)
        monkeypatch.setenv("PGPASSFILE", str(passfile))
    data = postgres.load_url(pg.url(database, userinfo=userinfo), "s")
    assert data.runs.height >= 1
    assert password not in data.inputs[0].path
    assert ("***" in data.inputs[0].path) == (how == "url")


def test_missing_password(pg, loaded, monkeypatch):
    user, _ = _need_password_user(pg)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    monkeypatch.setenv("PGPASSFILE", "/nonexistent")
    database = urlsplit(loaded["seed"]).path.lstrip("/")
    with pytest.raises(AuditInputError, match=r"authentication failed.*none was given"):
        postgres.load_url(pg.url(database, userinfo=user), "s")


def test_not_a_dstack_database(pg):
    database = pg.new_database("empty")
    with pytest.raises(AuditInputError) as caught:
        open_sources([pg.url(database)])
    text = _one_clean_line(caught.value)
    assert "not a dstack database" in text and database in text


def test_database_does_not_exist(pg):
    with pytest.raises(AuditInputError) as caught:
        postgres.load_url(pg.url(f"no_such_db_{pg.token}"), "s")
    text = _one_clean_line(caught.value)
    assert f"no_such_db_{pg.token} does not exist" in text and f"{pg.port}" in text


def test_permission_denied_names_the_table(pg, loaded):
    database = urlsplit(loaded["seed"]).path.lstrip("/")
    role = f"dstack_audit_ro_{pg.token}"
    try:
        pg.sql(database, f'CREATE ROLE "{role}" LOGIN')
    except RuntimeError as error:
        pytest.skip(f"{pg.origin}: cannot create a role ({error})")
    pg.roles.append(role)
    granted = [t for t in TABLE_COLUMNS if t != "jobs"]
    pg.sql(database, f'GRANT SELECT ON {", ".join(granted)} TO "{role}"')
    with pytest.raises(AuditInputError) as caught:
        postgres.load_url(pg.url(database, userinfo=role), "s")
    text = _one_clean_line(caught.value)
    assert "permission denied on table jobs" in text and "GRANT SELECT" in text


def test_only_the_audited_columns_are_read(pg, loaded):
    """A role that may read exactly TABLE_COLUMNS (column grants) audits the dump fully."""
    database = urlsplit(loaded["seed"]).path.lstrip("/")
    role = f"dstack_audit_cols_{pg.token}"
    try:
        pg.sql(database, f'CREATE ROLE "{role}" LOGIN')
    except RuntimeError as error:
        pytest.skip(f"{pg.origin}: cannot create a role ({error})")
    pg.roles.append(role)
    for table, columns in TABLE_COLUMNS.items():
        present = set(
            pg.sql(
                database,
                "SELECT column_name FROM information_schema.columns "
                f"WHERE table_schema = 'public' AND table_name = '{table}'",
            ).split()
        )
        granted = ", ".join(f'"{c}"' for c in columns if c in present)
        if granted:
            pg.sql(database, f'GRANT SELECT ({granted}) ON public."{table}" TO "{role}"')
    report = open_sources([pg.url(database, userinfo=role)]).report
    truth = load_truth(CAPTURES / "postgres" / "seed" / "truth.json")
    assert found_victims(report) == expected_victims(truth)


def test_project_since_and_partitions_are_pushed_down(loaded):
    """--project, --since and partitions filter in SQL: fewer rows read, the same answer."""
    from datetime import UTC, datetime

    from analyzer.api import audit_in_partitions

    url = loaded["seed"]
    whole = open_sources([url]).report
    (whole_info,) = whole.inputs
    (finding,) = whole.findings
    other = open_sources([url], project="nobody").report
    assert other.runs == [] and other.inputs[0].records < whole_info.records
    mine = open_sources([url], project=finding.project).report
    assert mine.model_dump(exclude={"inputs"}) == whole.model_dump(exclude={"inputs"})
    late = open_sources([url], since=datetime(2100, 1, 1, tzinfo=UTC)).report
    assert late.runs == []
    merged = audit_in_partitions([url], 3)
    assert merged.model_dump(exclude={"inputs"}) == whole.model_dump(exclude={"inputs"})


def test_verbose_lines_never_show_the_password(pg, loaded):
    """`-v` names the database as the reader shows it (issue 23): the password in no form,
    whether or not it looks like a secret (a plain word is no secret shape)."""
    from click.testing import CliRunner

    from analyzer.cli import main

    user, password = _need_password_user(pg)
    database = urlsplit(loaded["seed"]).path.lstrip("/")
    url = pg.url(database, userinfo=f"{user}:{quote(password, safe='')}")
    result = CliRunner().invoke(main, ["audit", "-v", url])
    assert result.exit_code == 0 and "collateral_termination" in result.output, result.output
    assert "dstack-audit: read postgresql://" in result.output
    assert password not in result.output and quote(password, safe="") not in result.output


# ------------------------------------------------------------------------------------------------
# Bad bytes and damaged values (issue 23): only what a PostgreSQL database can hold


def test_a_utf8_database_refuses_bytes_that_are_not_utf8(pg):
    """Why the reader reads text as text in a UTF8 database: such bytes cannot get in."""
    database = pg.load_dump(CAPTURES / "postgres" / "seed.sql", "utf8-refuses")
    with pytest.raises(RuntimeError, match="invalid byte sequence"):
        pg.sql(database, "UPDATE runs SET termination_reason = E'\\xff\\xfe'")


@pytest.mark.parametrize("engine", postgres.ENGINES)
def test_a_sql_ascii_database_holding_bytes_that_are_not_utf8(pg, engine):
    """A SQL_ASCII database stores any bytes: read as bytea, such a value is read as unknown
    and named (analyzer.sources.cells), and the rest is audited."""
    if engine not in postgres.available_engines():
        pytest.skip(f"{engine} is not installed")
    database = f"dstack_audit_{pg.token}_sql_ascii_{engine}"
    pg.sql(
        "postgres",
        f"CREATE DATABASE \"{database}\" ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' "
        "TEMPLATE template0",
    )
    pg.databases[f"sql_ascii_{engine}"] = database
    dump = (CAPTURES / "postgres" / "seed.sql").read_text()
    pg.psql_run(
        database, "-f", "-", stdin=dump if psql_knows_restrict(pg.psql) else without_restrict(dump)
    )
    pg.sql(database, "UPDATE instances SET status = E'\\xff\\xfe'")
    data = postgres.load_url(pg.url(database), "default", engine=engine)
    (limitation,) = [lim for lim in data.limitations if lim.code == "damaged_values"]
    assert "table instances" in limitation.message and "status: invalid UTF-8" in limitation.message
    assert data.inputs[0].unparsed == 1
    report = open_sources([pg.url(database)]).report
    assert found_victims(report) == expected_victims(
        load_truth(CAPTURES / "postgres" / "seed" / "truth.json")
    )


def test_an_infinite_time_is_a_damaged_value(pg):
    """`infinity` is a timestamp PostgreSQL holds and no audit can place: read as unknown and
    named, and the audit goes on (one rule for damaged times)."""
    database = pg.load_dump(CAPTURES / "postgres" / "seed.sql", "infinite-time")
    pg.sql(database, "UPDATE jobs SET remove_at = 'infinity'")
    report = open_sources([pg.url(database)]).report
    (limitation,) = [lim for lim in report.limitations if lim.code == "damaged_values"]
    assert "table jobs" in limitation.message and "remove_at: 'infinity'" in limitation.message
    assert report.inputs[0].unparsed == limitation.message.count("remove_at")


def test_damage_in_partitions_selected_in_sql_is_said_per_partition(pg):
    """PostgreSQL's partitions are selected in SQL (its tables are not split by bucket): a
    damaged value is said as counted, and its row numbered, among the rows of the partition
    that read it; a job is of one run, so it is counted once, as in one process. Every
    partition's share is added up (before, only the first partition's input was kept), and the
    rows of no partition (the seed's events of instances and fleets) are read by the first:
    the records are the one process's."""
    from analyzer.api import audit_in_partitions

    database = pg.load_dump(CAPTURES / "postgres" / "seed.sql", "infinite-time-partitions")
    pg.sql(database, "UPDATE jobs SET remove_at = 'infinity'")
    whole = open_sources([pg.url(database)]).report
    merged = audit_in_partitions([pg.url(database)], 3)
    assert merged.inputs[0].unparsed == whole.inputs[0].unparsed > 0
    assert merged.inputs[0].records == whole.inputs[0].records
    shares = [n for n in merged.inputs[0].notes if n.startswith("snapshot of ")]
    assert len(shares) == 3  # each partition read a snapshot of its own
    (limitation,) = [lim for lim in merged.limitations if lim.code == "damaged_values"]
    selected = r"table jobs \(rows selected by partition [0-2]/3, numbered among them\): row 1 "
    assert re.match(selected, limitation.message), limitation.message
    assert merged.findings == whole.findings
