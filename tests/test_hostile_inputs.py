"""Hostile and damaged inputs get precise answers (issue 12, section 4), on copies of the real
captures: each case names the file and the place, exits 2 where the input is unusable, and
audits the rest where it can."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import CAPTURES, execute
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from analyzer import open_sources
from analyzer.cli import main
from analyzer.errors import AuditInputError
from analyzer.sources.logs import lines, reader
from analyzer.sources.logs.reader import read_log_bytes

SEED = CAPTURES / "v0.22.5" / "seed"
SEED_VICTIM = ("collateral_termination", "699fe818-acc2-4e08-b121-d16ed8fd32f1")


def _audit(*args: str):
    return CliRunner().invoke(main, ["audit", *args])


def _one_line_error(result, *expected: str) -> str:
    """Exit 2 with one line on stderr naming what is expected, never a traceback."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _evidence(tmp_path: Path) -> Path:
    """Where a test's evidence goes: outputs may not be written beside it (issue 12)."""
    folder = tmp_path / "evidence"
    folder.mkdir(exist_ok=True)
    return folder


def _outputs(tmp_path: Path) -> Path:
    folder = tmp_path / "out"
    folder.mkdir(exist_ok=True)
    return folder


def _victims(report) -> set[tuple[str, str]]:
    return {(f.category, v.job_id) for f in report.findings for v in f.victims}


# --- symlink loops ----------------------------------------------------------------------------


def test_symlink_loops_are_listed_as_unreadable_and_the_rest_is_audited(tmp_path):
    folder = tmp_path / "capture"
    folder.mkdir()
    shutil.copyfile(SEED / "server.db", folder / "server.db")
    (folder / "a").symlink_to("b")
    (folder / "b").symlink_to("a")
    (folder / "self").symlink_to(".")
    (folder / "up").symlink_to("..")
    (folder / "gone").symlink_to("nowhere")
    result = _audit(str(folder), "--format", "json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert {(f["category"], v["job_id"]) for f in report["findings"] for v in f["victims"]} == {
        SEED_VICTIM
    }
    by_path = {Path(i["path"]).name: i for i in report["inputs"]}
    for name in ("a", "b", "self", "up"):
        assert by_path[name]["kind"] == "unreadable"
        assert "symlink loop" in by_path[name]["notes"][0]
    assert "dangling symlink" in by_path["gone"]["notes"][0]
    assert by_path["server.db"]["kind"] == "sqlite"


def test_a_symlink_loop_given_alone_is_named_as_one(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    _one_line_error(_audit(str(tmp_path / "a")), "a: symlink loop")


# --- a compressed log damaged from its start -----------------------------------------------


def _damaged_gzip(path: Path) -> Path:
    """A gzip member's header, then bytes that are no deflate stream, then a trailer."""
    path.write_bytes(gzip.compress(b"")[:10] + b"\xde\xad\xbe\xef" * 100 + bytes(8))
    return path


def test_a_gzip_file_that_does_not_decompress_is_named_so(tmp_path):
    """Given alone: one line saying why, never an internal error; in a folder: listed with the
    same words and the rest audited (its magic bytes are gzip's, so the log source's sniff
    opened it as gzip and met zlib's error)."""
    damaged = _damaged_gzip(_evidence(tmp_path) / "server.log.gz")
    _one_line_error(_audit(str(damaged)), "server.log.gz: a gzip file whose data does not decomp")
    shutil.copyfile(SEED / "server.db", damaged.parent / "server.db")
    result = _audit(str(damaged.parent), "--format", "json", "-o", str(_outputs(tmp_path) / "r"))
    assert result.exit_code == 0, result.output
    inputs = json.loads((tmp_path / "out" / "r").read_text())["inputs"]
    listed = next(i for i in inputs if i["path"] == str(damaged))
    assert listed["kind"] == "unrecognised"
    assert listed["notes"][0].startswith("a gzip file whose data does not decompress (")


# --- folders of many files -----------------------------------------------------------------------


def test_a_folder_of_many_empty_files_lists_each_and_audits_the_rest(tmp_path):
    """Each empty file is listed as unrecognised (speed: benchmarks/folder_walk.py)."""
    folder = tmp_path / "many"
    folder.mkdir()
    for index in range(500):
        (folder / f"f{index}").touch()
    shutil.copyfile(SEED / "server.db", folder / "server.db")
    report = open_sources([folder]).report
    assert sum(i.kind == "unrecognised" for i in report.inputs) == 500
    assert _victims(report) == {SEED_VICTIM}


# --- table exports ------------------------------------------------------------------------------


def _tables(tmp_path: Path) -> Path:
    folder = tmp_path / "tables"
    shutil.copytree(SEED / "tables", folder)
    return folder


def test_csv_exports_with_a_utf8_bom_are_read(tmp_path):
    folder = _tables(tmp_path)
    for csv in folder.glob("*.csv"):
        if csv.stat().st_size:
            csv.write_bytes(b"\xef\xbb\xbf" + csv.read_bytes())
    report = open_sources([folder]).report
    assert _victims(report) == {SEED_VICTIM}


def test_a_semicolon_delimited_table_is_named(tmp_path):
    folder = _tables(tmp_path)
    runs = folder / "runs.csv"
    frame = pl.read_csv(runs, infer_schema=False)
    frame.write_csv(runs, separator=";")
    _one_line_error(_audit(str(folder)), f"{runs}: ';'-delimited", "header reads as one column")


def test_a_truncated_parquet_table_is_named(tmp_path):
    folder = _tables(tmp_path)
    jobs = folder / "jobs.parquet"
    pl.read_csv(folder / "jobs.csv", infer_schema=False).write_parquet(jobs)
    (folder / "jobs.csv").unlink()
    jobs.write_bytes(jobs.read_bytes()[: jobs.stat().st_size // 2])
    _one_line_error(_audit(str(folder)), f"{jobs}: not a readable Parquet file", "truncated")


def test_a_broken_table_inside_a_capture_folder_is_named_not_passed_over(tmp_path):
    capture = tmp_path / "capture"
    capture.mkdir()
    shutil.copyfile(SEED / "server.db", capture / "server.db")
    folder = _tables(capture)
    (folder / "jobs.csv").write_text("id;run_id;job_name\n1;2;web-0-0\n")
    _one_line_error(_audit(str(capture)), "jobs.csv: ';'-delimited")


# --- times out of range: one rule for damaged times (issue 23) ----------------------------------


def _damaged_time(result, *expected: str) -> None:
    """The audit goes on; the time is read as unknown and the row named in a limitation."""
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    (limitation,) = [lim for lim in report["limitations"] if lim["code"] == "damaged_values"]
    for text in expected:
        assert text in limitation["message"], limitation["message"]


@pytest.mark.parametrize("year", ["-001", "0000", "10000"])
def test_a_database_time_out_of_range_names_the_table_and_row(copy_db, year):
    db = copy_db("v0.22.5/seed")
    execute(
        db,
        f"UPDATE jobs SET submitted_at = '{year}-01-01 00:00:00.000000' "
        "WHERE id = '699fe818acc24e08b121d16ed8fd32f1'",
    )
    _damaged_time(
        _audit(str(db), "--format", "json"),
        "table jobs",
        "id 699fe818acc24e08b121d16ed8fd32f1",
        f"submitted_at: '{year}-01-01",
        "years 1 and 9999",
    )
    _one_line_error(
        _audit(str(db), "--strict"),
        f"{db}: damaged input under --strict",
        "table jobs",
        "id 699fe818acc24e08b121d16ed8fd32f1",
        "submitted_at",
    )


def test_a_csv_time_out_of_range_names_the_file_and_row(tmp_path):
    folder = _tables(tmp_path)
    runs = folder / "runs.csv"
    frame = pl.read_csv(runs, infer_schema=False)
    frame.with_columns(pl.lit("-001-11-02 09:00:00.000000").alias("submitted_at")).write_csv(runs)
    _damaged_time(
        _audit(str(folder), "--format", "json"), "table runs: row 1", "submitted_at: '-001-11-02"
    )
    _one_line_error(_audit(str(folder), "--strict"), f"{runs}: damaged input", "row 1")


@pytest.mark.parametrize("fmt", ["standard", "json", "docker"])
@pytest.mark.parametrize("year", ["0000", "-001", "10000"])
def test_a_log_line_with_a_time_out_of_range_is_quarantined(tmp_path, fmt, year):
    source = SEED / "logs" / f"server-info.{'json' if fmt == 'json' else 'standard'}.log"
    lines = source.read_text().splitlines(keepends=True)
    target = next(i for i, line in enumerate(lines) if "Emitting event: Run submitted" in line)
    if fmt == "docker":
        lines = [f"2026-11-02T09:00:00.000000Z {line}" for line in lines]
        lines[target] = lines[target].replace(
            "2026-11-02T09:00:00.000000Z", f"{year}-01-01T00:00:00Z"
        )
    else:
        lines[target] = lines[target].replace("2026-11-02", f"{year}-11-02", 1)
    log = _evidence(tmp_path) / "server.log"
    log.write_text("".join(lines))
    quarantine = _outputs(tmp_path) / "quarantine.txt"
    result = _audit(str(log), "--format", "json", "--quarantine", str(quarantine))
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["inputs"][0]["unparsed"] == 1
    assert quarantine.read_text().splitlines()[0].startswith(f"{log}:{target + 1}\t")


def test_out_of_range_check_leaves_every_real_capture_alone():
    for db in sorted(CAPTURES.glob("v*/*/server.db")):
        assert open_sources([db]).report.inputs[0].kind == "sqlite", db
    for tables in sorted(CAPTURES.glob("v*/*/tables")):
        assert open_sources([tables]).report.runs, tables
    assert os.path.isdir(CAPTURES)


# --- logs: bounded memory, over-long lines ------------------------------------------------------

LOGS = sorted(CAPTURES.glob("v*/*/logs/*.log"))


def _docker(data: bytes) -> bytes:
    return b"".join(
        b"2026-11-02T09:00:%02d.5Z " % (i % 60) + line
        for i, line in enumerate(data.splitlines(keepends=True))
    )


@pytest.mark.parametrize("chunk", [700, 4096])
@pytest.mark.parametrize("log", LOGS, ids=lambda p: "/".join(p.parts[-4:]))
def test_reading_in_small_chunks_gives_what_one_read_gives(monkeypatch, log, chunk):
    """Chunk boundaries fall inside records, tracebacks and rich folds: the records, the
    account of every line and the damage notes are those of reading the log at once."""
    data = log.read_bytes()
    variants = {"plain": data, "docker": _docker(data), "gzip": gzip.compress(data)}
    whole = {name: read_log_bytes(body, "x.log") for name, body in variants.items()}
    monkeypatch.setattr(lines, "CHUNK_BYTES", chunk)
    monkeypatch.setattr(lines, "BLOCK_BYTES", 97)
    for name, body in variants.items():
        parts = read_log_bytes(body, "x.log")
        assert_frame_equal(parts.records, whole[name].records)
        assert_frame_equal(parts.unparsed, whole[name].unparsed)
        assert (parts.lines_total, parts.lines_irrelevant, parts.damage, parts.rich_width) == (
            whole[name].lines_total,
            whole[name].lines_irrelevant,
            whole[name].damage,
            whole[name].rich_width,
        )


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=6),
    chunk=st.integers(min_value=64, max_value=3000),
)
@example(cuts=[2419], chunk=360)  # once folded by the width of its first chunk's lines only
def test_any_chunk_size_keeps_every_line_accounted(monkeypatch, cuts, chunk):
    """Generated damage (lines cut anywhere, joined to the next) in the real rich log, read in
    generated chunk sizes: parsed + irrelevant + unparsed = lines, and the same as one read."""
    data = bytearray((SEED / "logs" / "server-info.rich.log").read_bytes())
    for cut in sorted(cuts, reverse=True):
        at = cut % len(data)
        if data[at : at + 1] == b"\n":
            del data[at]
    whole = read_log_bytes(bytes(data), "x.log")
    with monkeypatch.context() as patch:  # undone before the next example
        patch.setattr(lines, "CHUNK_BYTES", chunk)
        patch.setattr(lines, "BLOCK_BYTES", 61)
        parts = read_log_bytes(bytes(data), "x.log")
    counted = int(parts.records["line_count"].sum() or 0)
    assert counted + parts.lines_irrelevant + parts.unparsed.height == parts.lines_total
    if not any("longer than" in note for note in parts.damage):
        assert_frame_equal(parts.records, whole.records)


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("where", ["middle", "last"])
def test_a_line_over_the_limit_is_counted_and_quarantined_never_held(tmp_path, compress, where):
    lines = (SEED / "logs" / "server-info.standard.log").read_bytes().splitlines(keepends=True)
    huge = b"INFO 2026-11-02T09:00:00.000 dstack._internal.server x " + b"A" * (3 << 20)
    at = len(lines) // 2 if where == "middle" else len(lines)
    lines.insert(at, huge + (b"\n" if where == "middle" else b""))
    body = b"".join(lines)
    log = _evidence(tmp_path) / ("server.log.gz" if compress else "server.log")
    log.write_bytes(gzip.compress(body) if compress else body)
    quarantine = _outputs(tmp_path) / "quarantine.txt"
    result = _audit(str(log), "--format", "json", "--quarantine", str(quarantine))
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert {(f["category"], v["job_id"]) for f in report["findings"] for v in f["victims"]} == {
        ("collateral_termination", "699fe8")
    }
    info = report["inputs"][0]
    assert info["unparsed"] == 1
    assert any("1 lines over the 1048576 byte limit" in note for note in info["notes"])
    (line,) = quarantine.read_text().splitlines()
    assert line.startswith(f"{log}:{at + 1}\t[a line of {len(huge)} bytes, over the 1048576")
    assert "AAAA" not in line
    assert quarantine.stat().st_size < 1000


def test_unparsed_text_past_the_budget_keeps_its_place(monkeypatch, tmp_path):
    garbage = b"".join(b"\x00junk line %d\n" % i for i in range(50))
    monkeypatch.setattr(reader, "QUARANTINE_TEXT_BYTES", 100)
    read = read_log_bytes(garbage, "x.log")
    assert read.unparsed.height == 50
    assert read.unparsed["line"].to_list() == list(range(1, 51))
    kept = read.unparsed["text"].drop_nulls()
    assert 0 < kept.len() < 50 and int(kept.str.len_bytes().sum()) <= 100
    log = _evidence(tmp_path) / "server.log"
    log.write_bytes((SEED / "logs" / "server-info.standard.log").read_bytes() + garbage[:200])
    quarantine = _outputs(tmp_path) / "quarantine.txt"
    assert _audit(str(log), "--format", "json", "--quarantine", str(quarantine)).exit_code == 0
    written = quarantine.read_text().splitlines()
    assert len(written) == garbage[:200].count(b"\n") and written[0].startswith(f"{log}:")
    assert written[-1].endswith(reader.QUARANTINE_NOT_KEPT)


# --- duplicate keys that disagree ---------------------------------------------------------------

VICTIM_ROW = "699fe818acc24e08b121d16ed8fd32f1"
SEED_RUN = "6e42c918-3c60-472e-bb0c-51610650d517"


def _jobs_frame() -> pl.DataFrame:
    return pl.read_csv(SEED / "tables" / "jobs.csv", infer_schema=False)


def _as_done_by_runner(frame: pl.DataFrame) -> pl.DataFrame:
    victim = pl.col("id") == VICTIM_ROW
    return frame.filter(victim).with_columns(
        pl.lit("DONE").alias("status"), pl.lit("DONE_BY_RUNNER").alias("termination_reason")
    )


def _disputed(report) -> None:
    assert report.findings == []
    (run,) = report.runs
    assert run.verdict == "inconclusive"
    assert "duplicate rows disagree" in run.why and "would say collateral_termination" in run.why
    (limitation,) = [lim for lim in report.limitations if lim.code == "conflicting_duplicate_rows"]
    assert "jobs" in limitation.message and VICTIM_ROW in limitation.message
    assert "status (done vs terminated)" in limitation.message
    assert "termination_reason (done_by_runner vs terminated_by_server)" in limitation.message


def test_a_job_row_that_disagrees_between_two_inputs_makes_the_run_inconclusive(tmp_path):
    folder = _tables(tmp_path)
    _as_done_by_runner(_jobs_frame()).vstack(
        _jobs_frame().filter(pl.col("id") != VICTIM_ROW)
    ).write_csv(folder / "jobs.csv")
    _disputed(open_sources([SEED / "server.db", folder]).report)


def test_a_job_row_twice_in_one_export_that_disagrees_makes_the_run_inconclusive(tmp_path):
    folder = _tables(tmp_path)
    _jobs_frame().vstack(_as_done_by_runner(_jobs_frame())).write_csv(folder / "jobs.csv")
    _disputed(open_sources([folder]).report)
    result = _audit(str(folder), "--format", "json")
    assert result.exit_code == 0
    codes = [lim["code"] for lim in json.loads(result.output)["limitations"]]
    assert "conflicting_duplicate_rows" in codes


def test_duplicate_rows_that_agree_on_what_the_verdict_reads_stay_one_row(tmp_path):
    folder = _tables(tmp_path)
    other = (
        _jobs_frame()
        .filter(pl.col("id") == VICTIM_ROW)
        .with_columns(
            pl.lit("2026-11-02 09:09:30.000000").alias("runner_timestamp"),
            pl.lit("2026-11-02 09:09:31.000000").alias("volumes_detached_at"),
        )
    )
    _jobs_frame().vstack(other).write_csv(folder / "jobs.csv")
    report = open_sources([SEED / "server.db", folder]).report
    assert _victims(report) == {SEED_VICTIM}
    assert all(lim.code != "conflicting_duplicate_rows" for lim in report.limitations)


def test_a_run_row_that_disagrees_makes_that_run_inconclusive(tmp_path):
    folder = _tables(tmp_path)
    runs = pl.read_csv(folder / "runs.csv", infer_schema=False)
    runs.vstack(runs.with_columns(pl.lit("TERMINATED").alias("status"))).write_csv(
        folder / "runs.csv"
    )
    report = open_sources([folder]).report
    assert report.findings == []
    assert [(r.run_id, r.verdict) for r in report.runs] == [(SEED_RUN, "inconclusive")]
    assert any(
        lim.code == "conflicting_duplicate_rows" and "runs" in lim.message
        for lim in report.limitations
    )


# --- fuzz: any value in any column a reader reads (issue 23) -------------------------------------

# Bytes that are not UTF-8 (a lone continuation, a cut sequence, a surrogate, an overlong form),
# numeric and time edge values, empty and blank text, JSON fragments, a bidi override.
HOSTILE_VALUES = [
    b"\xff\x00\xfe",
    b"\x80",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\xc0\xaf",
    b"\x00",
    "NaN",
    "-inf",
    "1e23",
    "1e400",
    "-1e400",
    "9223372036854775808",
    "-0",
    "2.5",
    "",
    " ",
    "2026-13-45",
    "garbage-time",
    "10000-01-01 00:00:00",
    "-001-01-01",
    "infinity",
    "{",
    "null",
    "[]",
    "\u202e",
]


def _read_columns(db: Path) -> list[tuple[str, str]]:
    import sqlite3

    from analyzer.sources.dstack_tables import TABLE_COLUMNS

    with sqlite3.connect(db) as connection:
        present = {
            (table, name)
            for table in TABLE_COLUMNS
            for (name,) in connection.execute(f'SELECT name FROM pragma_table_info("{table}")')
        }
    return sorted(
        (t, c) for t, columns in TABLE_COLUMNS.items() for c in columns if (t, c) in present
    )


SEED_COLUMNS = _read_columns(SEED / "server.db")


def _rendered(report) -> None:
    from analyzer.render.markdown import render_markdown
    from analyzer.render.screen import render_table

    assert render_table(report, width=100, all_runs=True)
    assert render_markdown(report)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    target=st.sampled_from(SEED_COLUMNS),
    value=st.one_of(st.sampled_from(HOSTILE_VALUES), st.binary(max_size=8)),
    every_row=st.booleans(),
)
@example(target=("runs", "id"), value="", every_row=True)
@example(target=("runs", "id"), value=b"-", every_row=False)  # normalises to no id
@example(target=("jobs", "ready"), value=b"\xff\x00\xfe", every_row=True)
def test_fuzz_any_value_in_any_column_read_is_named_damage_never_a_crash(
    tmp_path, target, value, every_row
):
    """The whole audit and its rendering, whatever a cell holds: never an exception (a value a
    column cannot hold is a damaged_values limitation, counted as unparsed)."""
    table, column = target
    db = tmp_path / "fuzz.db"
    shutil.copyfile(SEED / "server.db", db)
    where = "" if every_row else f' WHERE rowid = (SELECT min(rowid) FROM "{table}")'
    # OR IGNORE: a key given one value in every row keeps it in the first row only
    execute(db, f'UPDATE OR IGNORE "{table}" SET "{column}" = ?{where}', params=(value,))
    report = open_sources([db]).report
    damaged = [lim for lim in report.limitations if lim.code == "damaged_values"]
    assert bool(damaged) == bool(report.inputs[0].unparsed)
    if damaged:
        assert f"table {table}" in " ".join(lim.message for lim in damaged)
    _rendered(report)


CSV_TABLES = sorted(p.stem for p in (SEED / "tables").glob("*.csv") if p.stat().st_size)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    table=st.sampled_from(CSV_TABLES),
    pick=st.integers(min_value=0, max_value=60),
    value=st.one_of(st.sampled_from(HOSTILE_VALUES), st.binary(max_size=8)),
)
def test_fuzz_any_value_in_any_csv_field_is_named_damage_never_a_crash(
    tmp_path, table, pick, value
):
    """The same in a real CSV export: the field written as raw bytes, quoted as CSV quotes."""
    folder = tmp_path / "tables"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(SEED / "tables", folder)
    path = folder / f"{table}.csv"
    frame = pl.read_csv(path, infer_schema=False)
    column = frame.columns[pick % frame.width]
    marker = "\x1ffuzz\x1f"
    frame.with_columns(pl.lit(marker).alias(column)).write_csv(path)
    raw = value if isinstance(value, bytes) else value.encode()
    quoted = b'"' + raw.replace(b'"', b'""') + b'"'
    path.write_bytes(path.read_bytes().replace(marker.encode(), quoted))
    try:
        report = open_sources([folder]).report
    except AuditInputError as error:
        assert str(path) in str(error)  # e.g. a NUL the CSV reader cannot take
    else:
        damaged = [lim for lim in report.limitations if lim.code == "damaged_values"]
        assert bool(damaged) == any(i.unparsed for i in report.inputs)
        _rendered(report)
