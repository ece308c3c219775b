"""Bad bytes and huge cells (issue 23): every case is built from a copy of a real capture (its
database changed with SQL, its CSV exports edited as bytes) and run as the user runs it, in a
process of its own, so a signal or a panic shows as what it is. Each case: the exit code, no
traceback, no panic, no signal; a damaged value named (table, column, row id) in a limitation
and counted, so that --strict refuses it with one line naming the file and the place."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from conftest import CAPTURES, ROOT, execute

SEED = CAPTURES / "v0.22.5" / "seed"
VICTIM = "699fe818acc24e08b121d16ed8fd32f1"
CULPRIT = "3c73cf0e8f6543848454bf631aa727ae"
RUN = "6e42c9183c60472ebb0c51610650d517"
SEED_VICTIMS = [("collateral_termination", "699fe818-acc2-4e08-b121-d16ed8fd32f1")]
# Starts the CLI and writes its peak resident memory (KiB) to the file named first.
PEAK = (
    "import atexit, resource, sys; out = sys.argv.pop(1); atexit.register(lambda: "
    "open(out, 'w').write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))); "
    "from analyzer.cli import main; sys.argv[0] = 'dstack-audit'; main()"
)


def _cli(*args: str, peak: Path | None = None) -> subprocess.CompletedProcess:
    command = ["-c", PEAK, str(peak)] if peak else ["-m", "analyzer"]
    return subprocess.run(
        [sys.executable, *command, "audit", *args],
        capture_output=True,
        text=True,
        errors="replace",
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"},
    )


def _no_crash(result: subprocess.CompletedProcess) -> None:
    assert result.returncode >= 0, f"killed by signal {-result.returncode}"
    for text in ("Traceback", "panicked", "internal error"):
        assert text not in result.stderr, result.stderr


def _one_line(result: subprocess.CompletedProcess, *expected: str) -> str:
    """Exit 2 with one line on stderr naming the file and the place."""
    _no_crash(result)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _report(result: subprocess.CompletedProcess) -> dict:
    _no_crash(result)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return json.loads(result.stdout)


def _victims(report: dict) -> list[tuple[str, str]]:
    return [(f["category"], v["job_id"]) for f in report["findings"] for v in f["victims"]]


def _limitation(report: dict, code: str) -> str:
    (found,) = [lim["message"] for lim in report["limitations"] if lim["code"] == code]
    return found


def _damaged(source: Path, *named: str, unparsed: int | None = None) -> dict:
    """The audit goes on; the damage is named in one damaged_values limitation and counted;
    --strict refuses the input with one line naming it and the first place."""
    report = _report(_cli(str(source), "--format", "json"))
    message = _limitation(report, "damaged_values")
    for text in named:
        assert text in message, message
    counted = sum(i["unparsed"] for i in report["inputs"])
    assert counted == (unparsed if unparsed is not None else counted) and counted > 0
    _one_line(_cli(str(source), "--strict"), "damaged input under --strict", *named[:2])
    return report


# --- bytes that are not UTF-8 in a database ---------------------------------------------------


@pytest.mark.parametrize(
    ("table", "column", "row"),
    [
        ("runs", "termination_reason", RUN),
        ("instances", "status", None),
        ("jobs", "job_name", VICTIM),
        ("jobs", "ready", VICTIM),
        ("jobs", "termination_reason_message", CULPRIT),
        ("events", "message", None),
        ("event_targets", "entity_name", None),
        ("users", "name", None),
    ],
)
def test_bytes_that_are_not_utf8_are_one_named_damaged_value(copy_db, table, column, row):
    db = copy_db("v0.22.5/seed")
    where = (
        f" WHERE id = '{row}'" if row else " WHERE rowid = (SELECT min(rowid) FROM " + table + ")"
    )
    execute(db, f"UPDATE {table} SET {column} = X'ff00fe'{where}")
    report = _damaged(db, f"table {table}", f"{column}: invalid UTF-8", unparsed=1)
    if row:
        assert f"(id {row})" in _limitation(report, "damaged_values")
    if (table, column) == ("jobs", "job_name"):  # named as dstack names a job
        assert [v["job_name"] for f in report["findings"] for v in f["victims"]] == ["web-0-0"]


def test_a_run_id_that_is_not_utf8_leaves_the_row_out_and_the_jobs_in(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE runs SET id = X'ff00fe'")
    report = _damaged(db, "table runs", "row 1 has no id (invalid UTF-8) and is left out")
    assert _victims(report) == SEED_VICTIMS  # once, from the jobs and events that remain


def test_an_empty_run_id_leaves_the_row_out(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE runs SET id = ''")
    report = _damaged(db, "table runs", "row 1 has no id and is left out", unparsed=1)
    assert _victims(report) == SEED_VICTIMS


# --- values a column cannot hold ------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "column", "value", "shown"),
    [
        ("jobs", "job_num", "'NaN'", "'NaN' is not an integer"),
        ("jobs", "replica_num", "1e23", "'1.0e+23' is not an integer"),
        ("jobs", "submission_num", "'1e400'", "'Inf' is not an integer"),  # SQLite's REAL
        ("jobs", "exit_status", "2.5", "'2.5' is not an integer"),
        ("instances", "total_blocks", "'NaN'", "'NaN' is not an integer"),
        ("instances", "price", "'inf'", "'inf' is not a finite number"),
        ("jobs", "ready", "'maybe'", "'maybe' is not a boolean"),
    ],
)
def test_a_number_or_flag_a_column_cannot_hold_is_named(copy_db, table, column, value, shown):
    db = copy_db("v0.22.5/seed")
    execute(db, f"UPDATE {table} SET {column} = {value}")
    _damaged(db, f"table {table}", f"{column}: {shown}: read as unknown")


@pytest.mark.parametrize(
    "value", ["NaN", "2026-13-45", "garbage-time", "10000-01-01 00:00:00", "-001-01-01"]
)
@pytest.mark.parametrize(
    ("table", "column"),
    [("jobs", "submitted_at"), ("events", "recorded_at"), ("instances", "created_at")],
)
def test_every_damaged_time_follows_one_rule(copy_db, table, column, value):
    """Said and named, read as unknown, the audit goes on (never a silent null, never a stop)."""
    db = copy_db("v0.22.5/seed")
    execute(db, f"UPDATE {table} SET {column} = '{value}'")
    _damaged(db, f"table {table}", f"{column}: '{value}' is not a time between years 1 and 9999")


# --- exports ------------------------------------------------------------------------------


def _tables(tmp_path: Path) -> Path:
    folder = tmp_path / "tables"
    shutil.copytree(SEED / "tables", folder)
    return folder


def test_a_csv_cut_inside_its_last_quoted_field_is_refused_under_strict(tmp_path):
    folder = _tables(tmp_path)
    runs = folder / "runs.csv"
    data = runs.read_bytes()
    cut = data.index(b'"{""run_name""') + 300  # inside the last row's run spec
    runs.write_bytes(data[:cut])
    assert pl.read_csv(runs, infer_schema=False).height == 1  # the reader alone takes it
    report = _damaged(
        folder, "table runs", "row 1 (id ", "run_spec: truncated", "inside a quoted field"
    )
    (info,) = [i for i in report["inputs"] if i["path"] == str(runs)]
    assert info["unparsed"] == 1


@pytest.mark.parametrize(
    ("table", "end", "column", "where"),
    [
        # the case: cut between the two quotes of `""`, so the quotes stay paired
        ("runs", b'"{""0"', "desired_replica_counts", "without the line break"),
        # not in the issue: cut just after a whole quoted field, and inside an unquoted one
        ("runs", b'"{""0"": 1}"', "desired_replica_counts", "without the line break"),
        ("runs", b'"{""0"": 1}",,,,', "desired_replica_counts", "without the line break"),
        ("jobs", b',"{""', "", "inside a quoted field"),
    ],
)
def test_a_csv_cut_in_its_last_row_is_named_whatever_field_it_ends_in(
    tmp_path, table, end, column, where
):
    """A CSV export ends with a line break after every row (sqlite3 -csv, psql COPY CSV): one
    cut anywhere in its last row is damage, named with its file and row; --strict refuses."""
    folder = _tables(tmp_path)
    path = folder / f"{table}.csv"
    data = path.read_bytes()
    cut = data.rindex(end) + len(end)
    path.write_bytes(data[:cut])
    rows = data[:cut].count(b"\n")  # the header's line break counts the last row once
    named = ["truncated: the file ends " + where, f"table {table}"]
    if column:
        named.append(f"{column}: truncated")
    report = _damaged(folder, *named, unparsed=1)
    message = _limitation(report, "damaged_values")
    assert f"row {pl.read_csv(path, infer_schema=False).height} " in message, message
    assert rows == pl.read_csv(path, infer_schema=False).height, rows


def test_a_csv_byte_that_is_not_utf8_is_one_named_damaged_value(tmp_path):
    folder = _tables(tmp_path)
    jobs = folder / "jobs.csv"
    jobs.write_bytes(jobs.read_bytes().replace(b"Fleet is at capacity", b"Fleet \xff at capacity"))
    report = _damaged(
        folder, "table jobs", f"(id {CULPRIT}), termination_reason_message: invalid UTF-8"
    )
    assert _victims(report) == SEED_VICTIMS


def test_a_parquet_byte_column_that_is_not_utf8_is_one_named_damaged_value(tmp_path):
    folder = _tables(tmp_path)
    frame = pl.read_csv(folder / "jobs.csv", infer_schema=False)
    (folder / "jobs.csv").unlink()
    names = frame["job_name"].cast(pl.Binary).to_list()
    names[0] = b"\xff\x00\xfe"
    frame.with_columns(pl.Series("job_name", names, dtype=pl.Binary)).write_parquet(
        folder / "jobs.parquet"
    )
    _damaged(folder, "table jobs", "row 1 (id ", "job_name: invalid UTF-8", unparsed=1)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        byte, number = number & 0x7F, number >> 7
        out.append(byte | (0x80 if number else 0))
        if not number:
            return bytes(out)


def test_a_parquet_footer_claiming_two_billion_rows_is_one_line(tmp_path):
    """The file's and its row group's num_rows (Thrift i64 fields: header 0x16, then the
    zigzag varint) claim 2e9 rows: polars would panic asserting what it decoded."""
    folder = _tables(tmp_path)
    frame = pl.read_csv(folder / "events.csv", infer_schema=False)
    (folder / "events.csv").unlink()
    parquet = folder / "events.parquet"
    frame.write_parquet(parquet)
    data = parquet.read_bytes()
    (length,) = struct.unpack("<I", data[-8:-4])
    footer = data[-8 - length : -8]
    real, claimed = b"\x16" + _varint(frame.height * 2), b"\x16" + _varint(4_000_000_000)
    first, last = footer.index(real), footer.rindex(real)
    assert first != last
    footer = footer[:first] + claimed + footer[first + len(real) : last] + claimed
    footer += data[-8 - length : -8][last + len(real) :]
    parquet.write_bytes(data[: -8 - length] + footer + struct.pack("<I", len(footer)) + b"PAR1")
    assert pl.scan_parquet(parquet).select(pl.len()).collect().item() == 2_000_000_000
    _one_line(
        _cli(str(folder)),
        f"{parquet}: not a readable Parquet file",
        "claims 2000000000 rows for the file",
    )


# --- huge cells ---------------------------------------------------------------------------


def test_a_30_mb_termination_message_is_a_table_in_seconds(copy_db):
    db = copy_db("v0.22.5/seed")
    message = "x" * 30_000_000
    execute(
        db,
        f"UPDATE jobs SET termination_reason_message = ? WHERE id = '{CULPRIT}'",
        params=(message,),
    )
    started = time.monotonic()
    result = _cli(str(db))
    elapsed = time.monotonic() - started
    _no_crash(result)
    assert result.returncode == 0 and result.stderr == ""
    assert elapsed < 60, f"{elapsed:.0f} s"
    assert len(result.stdout) < 50_000
    digest = hashlib.sha256(message.encode()).hexdigest()
    flat = " ".join(result.stdout.split())
    assert f"cut at 1024 of 30000000 bytes; sha256 {digest}" in flat
    assert "[huge_values] table jobs" in flat and f"(id {CULPRIT})" in flat


def test_a_huge_run_name_is_kept_cut_and_said(copy_db):
    db = copy_db("v0.22.5/seed")
    name = "web-" + "é" * 20_000
    execute(db, "UPDATE runs SET run_name = ?", params=(name,))
    report = _report(_cli(str(db), "--format", "json"))
    message = _limitation(report, "huge_values")
    assert f"table runs: row 1 (id {RUN}), run_name: kept [cut at 1024 of 40004 bytes" in message
    assert hashlib.sha256(name.encode()).hexdigest() in message
    (run,) = report["runs"]
    assert run["run_name"].startswith("web-éé") and len(run["run_name"].encode()) < 1200
    assert report["inputs"][0]["unparsed"] == 0  # kept, not lost: --strict lets it through
    assert _cli(str(db), "--strict", "--format", "json").returncode == 0


def test_a_json_document_over_32_mib_is_read_as_unknown(copy_db):
    db = copy_db("v0.22.5/seed")
    spec = json.dumps({"commands": ["x" * (33 << 20)]})
    execute(db, f"UPDATE jobs SET job_spec_data = ? WHERE id = '{CULPRIT}'", params=(spec,))
    report = _report(_cli(str(db), "--format", "json"))
    message = _limitation(report, "huge_values")
    assert f"(id {CULPRIT}), job_spec_data: a JSON document of {len(spec)} bytes" in message
    assert report["inputs"][0]["unparsed"] == 1
    _one_line(_cli(str(db), "--strict"), str(db), "job_spec_data")


def test_a_huge_csv_field_holds_little_of_itself(tmp_path):
    """Memory grows by a few times the field, not the 36 times it once did (3.4 GB for 100 MB)."""
    folder = _tables(tmp_path)
    base = tmp_path / "base.peak"
    _report(_cli(str(folder), "--format", "json", peak=base))
    field = 40_000_000
    jobs = folder / "jobs.csv"
    jobs.write_bytes(jobs.read_bytes().replace(b"Fleet is at capacity", b"y" * field))
    grown = tmp_path / "grown.peak"
    report = _report(_cli(str(folder), "--format", "json", peak=grown))
    assert f"cut at 1024 of {field} bytes" in _limitation(report, "huge_values")
    growth_kib = int(grown.read_text()) - int(base.read_text())
    assert growth_kib * 1024 < 8 * field, f"{growth_kib // 1024} MiB more for a {field} B field"


def test_a_huge_message_in_a_log_line_is_kept_cut_and_said(tmp_path):
    """The same cap for a log (a line under the reader's 1 MiB limit, its message 900 KB)."""
    log = tmp_path / "evidence" / "server.log"
    log.parent.mkdir()
    text = (SEED / "logs" / "server-info.standard.log").read_text()
    log.write_text(text.replace("(Fleet is at capacity)", "(" + "x" * 900_000 + ")"))
    report = _report(_cli(str(log), "--format", "json"))
    message = _limitation(report, "huge_values")
    assert "1 log message(s) over 16384 bytes" in message and f"{log}:21" in message
    assert len(json.dumps(report)) < 100_000


def test_damage_in_a_table_every_partition_reads_is_counted_once(copy_db):
    from analyzer import open_sources
    from analyzer.api import audit_in_partitions

    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE instances SET status = X'ff00fe'", "UPDATE jobs SET job_num = 'NaN'")
    whole = open_sources([db]).report
    merged = audit_in_partitions([db], 3)
    assert whole.inputs[0].unparsed == merged.inputs[0].unparsed == 3
    assert merged.findings == whole.findings
