"""Inputs are evidence: opened read-only, detected by content, and bad ones named clearly."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3

import pytest
from conftest import CAPTURES, ROOT

from analyzer import AuditInputError, open_sources


def _fingerprint(folder):
    return {
        p: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_audit_leaves_every_input_byte_and_mtime_unchanged(tmp_path):
    folder = tmp_path / "seed"
    shutil.copytree(CAPTURES / "v0.22.5" / "seed", folder)
    before = _fingerprint(folder)
    open_sources([folder]).report  # noqa: B018
    assert _fingerprint(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        p.name for p in (CAPTURES / "v0.22.5" / "seed").iterdir()
    )  # no -journal, -wal or -shm left behind


def test_detected_by_content_not_by_name(tmp_path):
    renamed = tmp_path / "evidence.bin"
    shutil.copyfile(CAPTURES / "v0.22.5" / "seed" / "server.db", renamed)
    report = open_sources([renamed]).report
    assert report.inputs[0].kind == "sqlite"
    assert report.summary.victims == 1


def test_parquet_exports(tmp_path):
    import polars as pl

    source = CAPTURES / "v0.22.5" / "seed" / "tables"
    for csv in source.glob("*.csv"):
        if csv.stat().st_size:
            pl.read_csv(csv, infer_schema=False).write_parquet(tmp_path / f"{csv.stem}.parquet")
    report = open_sources([tmp_path]).report
    assert {i.kind for i in report.inputs} == {"table-export"}
    assert report.summary.victims == 1


def test_sha256_and_size_of_each_input():
    db = CAPTURES / "v0.22.5" / "seed" / "server.db"
    (info,) = open_sources([db]).report.inputs
    assert info.sha256 == hashlib.sha256(db.read_bytes()).hexdigest()
    assert info.size == db.stat().st_size
    assert info.server_version == "0.22.1-0.22.5"  # 0.22.1 to 0.22.5 share one alembic head


@pytest.mark.parametrize(
    ("head", "release"),
    [
        ("620892d149b5", "0.21.3-0.21.5"),  # read from the 0.21.3, 0.21.4 and 0.21.5 wheels
        ("652af7a3c9c9", "0.22.0"),
        ("ecc9e8a0bfac", "0.21.0"),
    ],
)
def test_alembic_head_names_the_release(tmp_path, head, release):
    db = tmp_path / "server.db"
    shutil.copy(CAPTURES / "v0.22.5" / "seed" / "server.db", db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (head,))
    report = open_sources([db]).report
    assert report.inputs[0].server_version == release
    assert "unknown_schema_release" not in {lim.code for lim in report.limitations}


def test_unknown_alembic_head_is_a_limitation_not_silence(tmp_path):
    db = tmp_path / "server.db"
    shutil.copy(CAPTURES / "v0.22.5" / "seed" / "server.db", db)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'abcdef012345'")
    report = open_sources([db]).report
    assert report.inputs[0].server_version == "unknown (alembic abcdef012345)"
    (limitation,) = [lim for lim in report.limitations if lim.code == "unknown_schema_release"]
    assert "abcdef012345" in limitation.message


def _error(path) -> str:
    with pytest.raises(AuditInputError) as caught:
        open_sources([path]).report  # noqa: B018
    return str(caught.value)


def test_missing_path_is_named_and_not_created(tmp_path):
    missing = tmp_path / "nope.db"
    assert "no such file" in _error(missing)
    assert not missing.exists()


def test_empty_file(tmp_path):
    empty = tmp_path / "server.db"
    empty.write_bytes(b"")
    message = _error(empty)
    assert str(empty) in message and "not a recognised input" in message


def test_text_file_given_as_database(tmp_path):
    text = tmp_path / "server.db"
    text.write_text("hello\n")
    assert "not a recognised input" in _error(text)


def test_sqlite_that_is_not_dstack(tmp_path):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE things (id TEXT)")
    assert "not a dstack one" in _error(other)


def test_truncated_sqlite(tmp_path):
    source = (CAPTURES / "v0.22.5" / "seed" / "server.db").read_bytes()
    cut = tmp_path / "cut.db"
    cut.write_bytes(source[:8192])
    message = _error(cut)
    assert str(cut) in message


def test_folder_with_nothing_recognisable(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here\n")
    assert "nothing recognisable" in _error(tmp_path)


def test_unrecognised_files_in_a_folder_are_listed_not_hidden():
    report = open_sources([CAPTURES / "v0.22.5" / "seed"]).report
    unrecognised = [i.path for i in report.inputs if i.kind == "unrecognised"]
    assert any(p.endswith("truth.json") for p in unrecognised)


def test_arrow_and_sqlite3_readers_agree(monkeypatch):
    """SQLite is read through ADBC (Arrow) when installed, else through sqlite3: same report."""
    import analyzer.sources.sqlite as sqlite_source

    db = CAPTURES / "v0.22.5" / "multi-replica-crash" / "server.db"
    assert sqlite_source._arrow_connection(f"file:{db}?mode=ro") is not None
    with_arrow = open_sources([db]).report
    monkeypatch.setattr(sqlite_source, "_arrow_connection", lambda uri: None)
    without = open_sources([db]).report
    assert with_arrow.model_dump() == without.model_dump()


def test_a_partition_reads_the_same_through_arrow_and_sqlite3(monkeypatch):
    """A partition's reads name the kept runs' temporary tables: ADBC holds them too."""
    import analyzer.sources.sqlite as sqlite_source
    from analyzer.sources.base import ReadOptions

    db = ROOT / "samples" / "fleet" / "server.db"  # 150 runs of many services
    reader = sqlite_source.SqliteReader(db, options=ReadOptions(partition=(0, 2)))
    reader.columns("runs")
    sqlite3_connection, reader._db = reader._db, None  # only ADBC is left to read with
    runs = reader.read("runs", ["id"])
    reader._db = sqlite3_connection
    reader.close()
    parts = [open_sources([db], partition=(index, 2)).report for index in range(2)]
    assert runs.height == len(parts[0].runs)
    assert sum(len(part.runs) for part in parts) == len(open_sources([db]).report.runs)
    assert all(part.runs for part in parts)
    monkeypatch.setattr(sqlite_source, "_arrow_connection", lambda uri: None)
    for index, part in enumerate(parts):
        without = open_sources([db], partition=(index, 2)).report
        assert without.model_dump() == part.model_dump()


def test_a_partition_falls_back_to_sqlite3_after_its_selection(monkeypatch):
    """ADBC giving up after the kept runs were selected on it (a damaged row): sqlite3
    selects them too and reads the same rows."""
    import analyzer.sources.sqlite as sqlite_source
    from analyzer.sources.base import ReadOptions

    class GivingUp:
        def cursor(self):
            raise RuntimeError("unreadable row")

        def close(self):
            pass

    db = ROOT / "samples" / "fleet" / "server.db"
    reader = sqlite_source.SqliteReader(db, options=ReadOptions(partition=(1, 2)))
    through_arrow = reader.read("events", ["id", "message"])
    reader._arrow.close()
    reader._arrow = GivingUp()
    through_sqlite3 = reader.read("events", ["id", "message"])
    reader.close()
    assert through_arrow.height > 0
    assert through_sqlite3.sort("id").equals(through_arrow.sort("id"))


def test_partitions_hash_a_file_once_and_again_when_it_changes(tmp_path, monkeypatch):
    """The partitions of one audit share a database's hash, keyed by the file's identity."""
    import analyzer.sources.base as base
    from analyzer.sources.base import WholeInputFacts, file_facts

    db = tmp_path / "server.db"
    shutil.copyfile(CAPTURES / "v0.22.5" / "seed" / "server.db", db)
    hashed = []
    sha256 = base._sha256
    monkeypatch.setattr(base, "_sha256", lambda path: hashed.append(path) or sha256(path))
    shared = WholeInputFacts()
    first = file_facts(db, "sqlite", shared).sha256
    assert file_facts(db, "sqlite", shared).sha256 == first
    assert len(hashed) == 1
    with db.open("ab") as handle:
        handle.write(b"\0")
    changed = file_facts(db, "sqlite", shared).sha256
    assert changed != first
    assert changed == hashlib.sha256(db.read_bytes()).hexdigest()
    assert len(hashed) == 2
