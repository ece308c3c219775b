"""Forensic integrity and hostile input (issue 5): evidence untouched (WAL included), bad input
named in one line, --strict, bundles that re-verify, and fuzzed parsers that never crash."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import CAPTURES, ROOT
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from analyzer import AuditInputError, open_sources
from analyzer.cli import main
from analyzer.sources.logs.messages import records_to_events
from analyzer.sources.logs.reader import read_log_bytes

SEED = CAPTURES / "v0.22.5" / "seed"


def _snapshot(folder: Path) -> dict:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def _wal_evidence(tmp_path: Path) -> Path:
    """A WAL-mode database whose last commit lives only in its -wal file, copied as a careful
    operator copies a live server's (db and -wal together) while the writer is still open."""
    live = tmp_path / "live"
    live.mkdir()
    shutil.copyfile(SEED / "server.db", live / "server.db")
    writer = sqlite3.connect(live / "server.db")
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute(
        "INSERT INTO runs SELECT '" + "ab" * 16 + "', project_id, repo_id, user_id, submitted_at,"
        " 'late-run', 'RUNNING', run_spec, 0, last_processed_at, gateway_id, NULL, service_spec,"
        " fleet_id, resubmission_attempt, priority, 0, desired_replica_count, next_triggered_at,"
        " desired_replica_counts, lock_expires_at, lock_token, lock_owner,"
        " skip_min_processing_interval FROM runs"
    )
    writer.commit()
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    shutil.copyfile(live / "server.db", evidence / "server.db")
    shutil.copyfile(live / "server.db-wal", evidence / "server.db-wal")
    writer.close()
    return evidence


def test_wal_database_is_read_with_its_log_and_left_untouched(tmp_path):
    evidence = _wal_evidence(tmp_path)
    before = _snapshot(evidence)
    report = open_sources([evidence / "server.db"]).report
    assert {v.run_name for v in report.runs} == {"web", "late-run"}  # the WAL-only commit
    assert report.summary.victims == 1
    assert _snapshot(evidence) == before  # no -shm, no checkpoint, same bytes and mtimes
    kinds = {i.kind for i in report.inputs}
    assert kinds == {"sqlite", "sqlite-wal"}


def test_wal_mode_database_without_its_wal_file(tmp_path):
    evidence = _wal_evidence(tmp_path)
    (evidence / "server.db-wal").unlink()
    before = _snapshot(evidence)
    report = open_sources([evidence / "server.db"]).report
    assert {v.run_name for v in report.runs} == {"web"}
    assert _snapshot(evidence) == before


def test_unknown_schema(tmp_path):
    db = tmp_path / "odd.db"
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TABLE runs (id TEXT, name TEXT)")
        connection.execute("CREATE TABLE jobs (id TEXT)")
    with pytest.raises(AuditInputError, match="unknown database schema: table runs lacks"):
        open_sources([db]).report  # noqa: B018


def _cli(*args: str, user: str | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "analyzer", *args]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: p / "missing.db",
        lambda p: (p / "empty.db").write_bytes(b"") or p / "empty.db",
        lambda p: (p / "text.db").write_text("not a database\n") or p / "text.db",
        lambda p: (
            (p / "cut.db").write_bytes((SEED / "server.db").read_bytes()[:4096]) or p / "cut.db"
        ),
        lambda p: (p / "folder").mkdir() or p / "folder",
    ],
    ids=["missing", "empty", "text", "truncated", "empty-folder"],
)
def test_bad_input_one_line_with_a_hint_exit_2(tmp_path, make):
    path = make(tmp_path)
    process = _cli("audit", str(path))
    assert process.returncode == 2
    lines = process.stderr.strip().splitlines()
    assert len(lines) == 1, process.stderr
    assert str(path) in lines[0]
    assert "Traceback" not in process.stderr and process.stdout == ""


def test_unreadable_file(tmp_path):
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the check as an unprivileged user")
    locked = tmp_path / "server.db"
    shutil.copyfile(SEED / "server.db", locked)
    locked.chmod(0)
    tmp_path.chmod(0o755)
    command = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        sys.executable,
        "-m",
        "analyzer",
        "audit",
        str(locked),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME="/tmp")
    process = subprocess.run(command, capture_output=True, text=True, cwd="/", env=env, check=False)
    if "No module named" in process.stderr:
        pytest.skip("the unprivileged user cannot import the installed packages here")
    assert process.returncode == 2, process.stderr
    assert "permission denied" in process.stderr and str(locked) in process.stderr


def test_strict_turns_damage_into_exit_2(tmp_path):
    lines = (SEED / "logs" / "server-info.standard.log").read_bytes().splitlines(keepends=True)
    log = tmp_path / "server.log"
    log.write_bytes(b"".join([*lines[:5], b"\x00\x01 broken\n", *lines[5:]]))
    lenient = CliRunner().invoke(main, ["audit", str(log)])
    assert lenient.exit_code == 0
    strict = CliRunner().invoke(main, ["audit", str(log), "--strict"])
    assert strict.exit_code == 2
    assert "1 unparsed line(s)" in strict.output and "--quarantine" in strict.output


def test_bundle_verifies_and_names_differences(tmp_path):
    evidence = tmp_path / "evidence"
    shutil.copytree(SEED, evidence)
    bundle = tmp_path / "bundle"
    made = CliRunner().invoke(main, ["audit", str(evidence / "server.db"), "--bundle", str(bundle)])
    assert made.exit_code == 0
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["inputs"][0]["sha256"]
    assert manifest["tool"].startswith("dstack-audit ")
    verified = CliRunner().invoke(main, ["verify", str(bundle)])
    assert verified.exit_code == 0 and "verified:" in verified.output

    report = json.loads((bundle / "report.json").read_text())
    report["findings"][0]["victims"][0]["job_name"] = "tampered"
    (bundle / "report.json").write_text(json.dumps(report))
    tampered = CliRunner().invoke(main, ["verify", str(bundle)])
    assert tampered.exit_code == 1
    assert (
        "finding changed: collateral_termination" in tampered.output
        and "victims" in tampered.output
    )

    with sqlite3.connect(evidence / "server.db") as connection:
        connection.execute("UPDATE runs SET run_name = 'renamed'")
    changed = CliRunner().invoke(main, ["verify", str(bundle)])
    assert changed.exit_code == 1 and "input changed:" in changed.output


# ---- fuzzing: parsers never crash, never lose a valid line, account for every invalid one


REAL_LINES = [
    line
    for fmt in ("standard", "json", "rich")
    for line in (SEED / "logs" / f"server-info.{fmt}.log").read_bytes().splitlines()
]
STANDARD = (SEED / "logs" / "server-info.standard.log").read_bytes().splitlines()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.sampled_from(STANDARD),
            st.binary(max_size=300),
            st.sampled_from(REAL_LINES).map(lambda b: b[: len(b) // 2]),
        ),
        max_size=60,
    )
)
def test_fuzz_log_to_events_accounts_for_every_record(lines):
    read = read_log_bytes(b"\n".join(lines) + b"\n", "fuzz.log")
    _, facts = records_to_events(read.records, "fuzz.log", "default")
    assert facts.relevant + facts.irrelevant + facts.unrecognised == read.records.height
    assert facts.relevant <= read.records.height


@settings(max_examples=60, deadline=None)
@given(st.permutations(STANDARD), st.integers(min_value=0, max_value=len(STANDARD)))
def test_fuzz_reordered_and_duplicated_lines_keep_every_valid_line(order, cut):
    data = b"\n".join(order + order[:cut]) + b"\n"  # overlapping rotated files
    read = read_log_bytes(data, "fuzz.log")
    assert read.unparsed.height == 0
    assert read.records.height == len(order) + cut
    report_ready = records_to_events(read.records, "fuzz.log", "default")[0]
    assert report_ready.height > 0


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(min_size=1, max_size=2000), st.integers(min_value=0, max_value=620_000))
@example(junk=b"\x00", offset=142212)  # an instance left with no created_at: exposure crashed
def test_fuzz_corrupted_sqlite_never_crashes(tmp_path, junk, offset):
    data = bytearray((SEED / "server.db").read_bytes())
    data[offset : offset + len(junk)] = junk
    db = tmp_path / "fuzz.db"
    db.write_bytes(bytes(data))
    try:
        report = open_sources([db]).report
    except AuditInputError as error:
        assert str(db) in str(error)
    else:
        assert report.summary.runs <= 1


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=3000))
def test_fuzz_csv_exports_never_crash(tmp_path, junk):
    folder = tmp_path / "tables"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(SEED / "tables", folder)
    target = folder / "jobs.csv"
    target.write_bytes(target.read_bytes()[:500] + junk)
    try:
        report = open_sources([folder]).report
    except AuditInputError as error:
        assert str(folder) in str(error)
    else:
        assert isinstance(report.summary.runs, int)


def test_fuzz_figures_are_recorded():
    """The number of fuzzed inputs is fixed by the settings above (see the closing note)."""
    assert pl.__version__


def test_ingest_then_audit_the_dataset_and_its_partitions(tmp_path):
    sources = [
        str(CAPTURES / "v0.22.5" / s / "server.db")
        for s in ("seed", "multi-replica-crash", "rolling-ok")
    ]
    direct = open_sources(sources).report
    result = CliRunner().invoke(
        main, ["ingest", *sources, "--to", str(tmp_path / "ds"), "--buckets", "4"]
    )
    assert result.exit_code == 0, result.output
    from_dataset = open_sources([tmp_path / "ds"]).report
    assert from_dataset.model_dump(include={"runs", "findings"}) == direct.model_dump(
        include={"runs", "findings"}
    )
    assert {i.sha256 for i in direct.inputs} <= {i.sha256 for i in from_dataset.inputs}
    parts = [open_sources([tmp_path / "ds"], partition=(i, 2)).report for i in range(2)]
    assert sorted(v.run_id for p in parts for v in p.runs) == sorted(v.run_id for v in direct.runs)
    assert sorted(f.run_id for p in parts for f in p.findings) == sorted(
        f.run_id for f in direct.findings
    )


def test_partitions_of_whole_services_merge_into_the_same_report():
    from analyzer.api import audit_in_partitions

    sources = [CAPTURES / "v0.22.5" / s / "server.db" for s in ("seed", "multi-replica-crash")]
    sources += [CAPTURES / "v0.22.5" / s / "server.db" for s in ("scale-up-fails", "rolling-ok")]
    whole = open_sources(sources).report
    for count in (2, 3):
        merged = audit_in_partitions(sources, count)
        assert merged.model_dump(exclude={"inputs"}) == whole.model_dump(exclude={"inputs"})
    result = CliRunner().invoke(
        main, ["audit", *map(str, sources), "--partitions", "3", "--format", "json"]
    )
    assert result.exit_code == 0
    assert json.loads(result.output)["summary"]["victims"] == whole.summary.victims
