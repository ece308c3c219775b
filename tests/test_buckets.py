"""The run tables of a database read once and split by service bucket (analyzer.sources.buckets):
each partition reads from the bucket files exactly the rows its own selection in the database
gives, never going back to the database for them; the files live in a private folder that is
gone when the audit ends."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT, execute, interrupt_partitioned_audit, plant_env_secret

from analyzer.api import audit_in_partitions, open_sources, whole_input_facts
from analyzer.sources import buckets
from analyzer.sources.base import ReadOptions
from analyzer.sources.buckets import RUN_TABLES
from analyzer.sources.dstack_tables import JSON_PATHS, TABLE_COLUMNS
from analyzer.sources.partition import service_bucket
from analyzer.sources.sqlite import SqliteReader
from analyzer.synth import synthesize

FLEET = ROOT / "samples" / "fleet" / "server.db"  # 150 runs of many services
COUNT = 3


def _fleet(tmp_path: Path) -> Path:
    db = tmp_path / "server.db"
    shutil.copyfile(FLEET, db)
    return db


def _bucket_of_runs(db: Path) -> dict[str, int]:
    with sqlite3.connect(db) as connection:
        runs = connection.execute("SELECT id, project_id, run_name FROM runs").fetchall()
    return {run: service_bucket(project, name, COUNT) for run, project, name in runs}


def _rows(reader: SqliteReader, table: str) -> pl.DataFrame:
    """The rows of `table` the reader reads, in one order (SQLite's selection walks an index
    of its own choosing; the mapping sorts what it needs sorted)."""
    frame = reader.read_slim(table, TABLE_COLUMNS[table], JSON_PATHS.get(table, {}))
    return frame.cast(pl.Binary).sort(pl.all(), nulls_last=True)


def test_each_partition_reads_from_its_files_the_rows_it_selects_in_the_database(tmp_path):
    """Every run table, every partition: the same rows as the partition's own selection in
    SQLite; an event that targets runs of two buckets is in both."""
    db = _fleet(tmp_path)
    by_bucket: dict[int, list[str]] = {}
    for run, bucket in _bucket_of_runs(db).items():
        by_bucket.setdefault(bucket, []).append(run)
    with sqlite3.connect(db) as connection:
        event = connection.execute(
            "SELECT event_id FROM event_targets WHERE entity_type = 'RUN' AND entity_id = ?",
            (by_bucket[0][0],),
        ).fetchone()[0]
    execute(
        db,
        "INSERT INTO event_targets (id, event_id, entity_project_id, entity_type, entity_id, "
        "entity_name) SELECT 'planted-target', ?, project_id, 'RUN', id, run_name FROM runs "
        "WHERE id = ?",
        params=(event, by_bucket[1][0]),
    )
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        shared = whole_input_facts([db], COUNT, Path(folder))
        for index in range(COUNT):
            split = SqliteReader(db, options=ReadOptions(partition=(index, COUNT), shared=shared))
            selected = SqliteReader(db, options=ReadOptions(partition=(index, COUNT)))
            for table in RUN_TABLES:
                assert _rows(split, table).equals(_rows(selected, table)), (index, table)
            assert split._kept_runs is None  # no temporary tables: nothing asked of SQLite
            events = _rows(split, "events")["id"].to_list()
            assert (event.encode() in events) == (index in (0, 1))
            split.close()
            selected.close()


def test_event_targets_are_asked_of_the_database_once(tmp_path, monkeypatch):
    """The split reads event_targets from SQLite once: its batches are kept (in memory, or in
    files when they are many) while every event's buckets are found, split from there, and
    gone after (only the bucket files are left in the split's folder)."""
    db = _fleet(tmp_path)
    asked = []
    original = SqliteReader.batches
    monkeypatch.setattr(
        SqliteReader,
        "batches",
        lambda self, table, columns: asked.append(table) or original(self, table, columns),
    )
    with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
        split = whole_input_facts([db], COUNT, Path(folder)).known(f"buckets of {COUNT}", db)
        assert sorted(asked) == sorted(RUN_TABLES)
        written = {
            path for table in split.files.values() for paths in table.values() for path in paths
        }
        assert set(split.folder.iterdir()) == written


def test_event_targets_kept_in_files_are_split_as_those_kept_in_memory(tmp_path, monkeypatch):
    """Past buckets.KEPT_BYTES the batches of event_targets wait in files between the split's
    two passes, from the batch that crossed it on: each bucket's rows are the same as when
    every batch is held, in the same order, and no file of them is left."""
    db = _fleet(tmp_path)
    monkeypatch.setattr("analyzer.sources.sqlite.BATCH_ROWS", 400)  # several batches

    def split(kept_bytes: int, name: str) -> tuple[buckets.BucketFiles, list[Path]]:
        monkeypatch.setattr(buckets, "KEPT_BYTES", kept_bytes)
        written: list[Path] = []
        original = pl.DataFrame.write_ipc

        def write_ipc(frame, file, **options):
            if isinstance(file, str | Path):
                written.append(Path(file))
            return original(frame, file, **options)

        monkeypatch.setattr(pl.DataFrame, "write_ipc", write_ipc)
        folder = tmp_path / name
        folder.mkdir()
        facts = whole_input_facts([db], COUNT, folder)
        monkeypatch.setattr(pl.DataFrame, "write_ipc", original)
        return facts.known(f"buckets of {COUNT}", db), written

    held, written = split(1 << 40, "held")
    assert not [path for path in written if path.name.startswith("read-")]
    spilled, written = split(30_000, "spilled")  # crossed after the first batch or two
    read = [path for path in written if path.name.startswith("read-")]
    assert len(read) >= 3 and not any(path.exists() for path in read)
    for bucket in range(COUNT):
        for table in ("event_targets", "events"):
            assert spilled.read(table, bucket).equals(held.read(table, bucket)), (table, bucket)
    assert sum(spilled.read("event_targets", b).height for b in range(COUNT)) > 1000


def test_partitions_read_the_files_and_leave_no_folder(tmp_path, monkeypatch):
    """The audit in partitions reads every partition's run tables from the files, gives the
    one-process report, and removes the folder (made in TMPDIR, never beside the evidence)."""
    db = _fleet(tmp_path)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    read = []
    original = buckets.BucketFiles.read
    monkeypatch.setattr(
        buckets.BucketFiles, "read", lambda self, t, i: read.append((t, i)) or original(self, t, i)
    )
    merged = audit_in_partitions([db], COUNT)
    assert {index for _, index in read} == set(range(COUNT))
    assert {table for table, _ in read} == set(RUN_TABLES)
    assert not list(temporary.iterdir())
    assert sorted(p.name for p in db.parent.iterdir()) == ["server.db", "tmp"]
    whole = open_sources([db]).report
    assert merged.model_dump(exclude={"inputs"}) == whole.model_dump(exclude={"inputs"})


def test_damaged_run_tables_give_the_one_process_report(tmp_path):
    """Bytes that are not UTF-8 and a number that is not one, in rows of every bucket, and an
    event that targets no run (in no bucket): each input row's damage is found once, as the
    tables are split, and said with its place in the whole table; the merged report, its
    inputs' unparsed counts and notes and its damaged_values limitations included, is the one
    process's, byte for byte."""
    db = _damaged_fleet(tmp_path)
    execute(
        db,
        "INSERT INTO events (id, message, recorded_at, actor_user_id) SELECT 'orphan-event', "
        "X'ff', recorded_at, actor_user_id FROM events LIMIT 1",
    )
    whole = open_sources([db]).report
    merged = audit_in_partitions([db], COUNT)
    notes = whole.inputs[0].notes
    assert whole.inputs[0].unparsed == 579
    assert any(n.startswith("495 damaged value(s) in table events") for n in notes), notes
    assert merged.model_dump_json() == whole.model_dump_json()


def _damaged_fleet(tmp_path: Path) -> Path:
    db = _fleet(tmp_path)
    execute(
        db,
        "UPDATE jobs SET termination_reason_message = X'ff00fe' WHERE rowid % 7 = 0",
        "UPDATE runs SET deployment_num = 'NaN' WHERE rowid % 5 = 0",
        "UPDATE events SET message = X'c328' WHERE rowid % 11 = 0",
    )
    return db


def test_local_workers_give_the_one_process_report_of_a_damaged_database(tmp_path):
    """`--workers 2` (the same split, partitions on two local processes): the JSON report,
    damage accounting included, is the one process's, byte for byte."""
    (tmp_path / "evidence").mkdir()
    db = _damaged_fleet(tmp_path / "evidence")
    texts = []
    for given in ([], ["--workers", "2"]):
        out = tmp_path / f"report{len(given)}.json"
        command = [sys.executable, "-m", "analyzer", "audit", str(db), "-q", "--format", "json"]
        done = subprocess.run([*command, "-o", str(out), *given], capture_output=True, timeout=300)
        assert done.returncode == 0, done.stderr
        texts.append(out.read_text())
    assert '"unparsed": 578' in texts[0]
    assert texts[1] == texts[0]


def test_a_selection_in_sql_says_where_its_damage_was_counted(tmp_path):
    """--since narrows the audit on purpose, and each partition of it is selected in SQL (not
    split): each partition's damage is said as counted and numbered among the rows its
    selection keeps, every partition's note is kept, and the notes add up to the count."""
    db = _damaged_fleet(tmp_path)
    since = "2026-10-22"
    alone = open_sources([db], since=since).report.inputs[0]
    assert alone.notes[0].startswith(
        "21 damaged value(s) in table runs (rows selected by --since, numbered among them), "
    )
    merged = audit_in_partitions([db], COUNT, since=since)
    (source,) = [i for i in merged.inputs if i.kind == "sqlite"]
    counted = [int(note.split(" ", 1)[0]) for note in source.notes]
    assert len(counted) == 3 * COUNT and sum(counted) == source.unparsed > 0
    for index in range(COUNT):
        said = f"(rows selected by partition {index}/{COUNT} and --since, numbered among them)"
        assert sum(said in note for note in source.notes) == 3
        assert sum(said in lim.message for lim in merged.limitations) == 3


def test_fleets_and_instances_are_masked_once_with_every_secret(tmp_path, monkeypatch):
    """A token in the job specs of one bucket's runs, in every instance's name: one process
    masks it everywhere; in partitions the instances are masked once for the audit with all
    of the database's secrets (no partition masks them again), and the report is the same."""
    from analyzer.pipeline import evidence

    secret = "hf_PlantedInInstanceNames_4242"
    db = _fleet(tmp_path)
    runs = [run for run, bucket in _bucket_of_runs(db).items() if bucket == 1]
    plant_env_secret(db, secret, runs=runs)
    execute(db, "UPDATE instances SET name = name || '-' || ?", params=(secret,))
    whole = open_sources([db]).report
    said = []
    redact = evidence._redact

    def _redact(found, *, masked):
        said.append(masked)
        redact(found, masked=masked)

    monkeypatch.setattr(evidence, "_redact", _redact)
    merged = audit_in_partitions([db], COUNT)
    assert said == [True] * COUNT
    assert secret not in whole.model_dump_json()
    assert merged.model_dump_json() == whole.model_dump_json()


def test_ctrl_c_while_the_tables_are_split_leaves_no_folder(tmp_path):
    """Interrupted as soon as the first bucket file is written: exit 130, and the folder (in
    TMPDIR) is gone with every file in it; nothing is written beside the evidence."""
    synthesize(tmp_path / "server", 600, seed=7, log_formats=())
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    db, out = tmp_path / "server" / "server.db", tmp_path / "report.json"
    status, errors = interrupt_partitioned_audit(
        db, 8, out, temporary, "dstack-audit-buckets-*/*/*", poll=0.01
    )
    assert status == 130, errors
    assert not list(temporary.iterdir())
    assert not out.exists()
    assert {p.name for p in db.parent.iterdir()} == {"server.db", "truth.json", "logs"}


def test_each_event_is_in_each_bucket_of_its_targets_once():
    """buckets._events_by_bucket over batches of event_targets: an event goes to the bucket of
    every run and job it targets (and of the run its targets name), each bucket once, though
    its targets come in several batches (a bucket's rows are written in the table's order
    whatever the order of these pairs: _split)."""
    runs = pl.DataFrame({"id": [b"r1", b"r2"], buckets.BUCKET: [0, 1]})
    jobs = pl.DataFrame({"id": [b"j1", b"j2"], buckets.BUCKET: [0, 1]})

    def batch(rows: list[tuple]) -> pl.DataFrame:
        names = ["event_id", "entity_type", "entity_id", "entity_run_id"]
        return pl.DataFrame(rows, schema=dict.fromkeys(names, pl.Binary), orient="row")

    targets = [
        batch([(b"e1", b"RUN", b"r1", b"r1"), (b"e2", b"JOB", b"j2", b"r2")]),
        batch(
            [
                (b"e1", b"JOB", b"j2", b"r2"),  # its second bucket, in a later batch
                (b"e2", b"JOB", b"j2", b"r2"),  # the same bucket again: once
                (b"e3", b"JOB", b"j9", b"r1"),  # an unknown job: the run it names
                (b"e4", b"RUN", b"j1", None),  # a job's id as a RUN target: none
            ]
        ),
    ]
    found = buckets._events_by_bucket(iter(targets), runs, jobs, by_run_id=True)
    assert sorted(found.iter_rows()) == [(b"e1", 0), (b"e1", 1), (b"e2", 1), (b"e3", 0)]


def test_a_batch_of_several_chunks_is_written_as_the_whole_batch_would_be(tmp_path):
    """A batch as the driver hands it over (several Arrow batches: a frame of several chunks):
    each bucket's file holds that bucket's rows of the whole batch, in the batch's order, a row
    of two buckets in both, a bucket whose rows lie in several chunks too; a bucket of no row
    has no file."""
    parts = [(0, 4), (4, 7), (7, 12)]
    batch = pl.concat(
        [
            pl.DataFrame(
                {
                    "id": [f"r{i}".encode() for i in range(low, high)],
                    "body": [f"{i}" * i for i in range(low, high)],
                }
            )
            for low, high in parts
        ],
        rechunk=False,
    )
    assert batch.n_chunks() == len(parts)
    listed = [(0, 2), (1, 0), (3, 2), (3, 0), (4, 1), (4, 0), (4, 2), (6, 2), (7, 0), (7, 2)]
    listed += [(8, 0), (8, 2), (11, 1)]  # each chunk's first row in several buckets
    rows = pl.DataFrame(
        listed, schema={buckets.ROW: pl.UInt32, buckets.BUCKET: pl.Int64}, orient="row"
    )
    store = buckets.BucketFiles(tmp_path, 4, {"runs": batch.columns}, {"runs": {}})
    store._write("runs", batch, rows, 7)
    whole = batch.rechunk()
    assert sorted(store.files["runs"]) == [0, 1, 2]
    for bucket in range(4):
        mine = [row for row, of in listed if of == bucket]
        if not mine:
            assert bucket not in store.files["runs"]
            continue
        assert store.read("runs", bucket).equals(whole[mine]), bucket


def test_emptying_removes_the_bucket_files_meanwhile_and_keeps_the_folder(tmp_path):
    """The bucket files go on a thread while the merge runs (buckets.emptying); the folder
    stays for its owner to remove, and an error removing them is raised on leaving."""
    split = tmp_path / "split-1"
    split.mkdir()
    (split / "jobs-0-0.arrow").write_bytes(b"x" * 1000)
    (tmp_path / "read-0.arrow").write_bytes(b"y")
    with buckets.emptying(tmp_path):
        pass
    assert tmp_path.is_dir() and not any(tmp_path.iterdir())
    with pytest.raises(FileNotFoundError), buckets.emptying(tmp_path / "gone"):
        pass
