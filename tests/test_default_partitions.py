"""A large SQLite database is audited in partitions unless told otherwise (one process would
hold its mapped tables whole), with the report one process writes; anything partitions cannot
split stays in one process; --strict holds in partitions too."""

from __future__ import annotations

import gzip
import shutil

import pytest
from click.testing import CliRunner
from conftest import CAPTURES, execute

import analyzer.api
import analyzer.cli.options as options
from analyzer.cli import main
from analyzer.cli.options import default_partitions

SEED = CAPTURES / "v0.22.5" / "seed"
DAMAGED_JOB = "699fe818acc24e08b121d16ed8fd32f1"


@pytest.fixture
def large_from(monkeypatch):
    """Every database over 0 bytes counts as large, in partitions of a third of `db`'s size."""

    def make(db):
        monkeypatch.setattr(options, "PARTITIONED_BYTES", 0)
        monkeypatch.setattr(options, "PARTITION_BYTES", -(-db.stat().st_size // 3))

    return make


def _audit(*args: str):
    return CliRunner().invoke(main, ["audit", *args], catch_exceptions=False)


def test_a_large_database_is_audited_in_partitions_with_one_process_report(
    copy_db, tmp_path_factory, large_from, monkeypatch
):
    db = copy_db("v0.22.5/seed")
    out = tmp_path_factory.mktemp("out")  # never in the evidence's folder
    whole, default = out / "whole.json", out / "default.json"
    assert _audit(str(db), "--partitions", "1", "-q", "-o", str(whole)).exit_code == 0
    large_from(db)
    counts = []
    merged = analyzer.api.partitions_merged

    def counted(sources, count, **kwargs):
        counts.append(count)
        return merged(sources, count, **kwargs)

    monkeypatch.setattr(analyzer.api, "partitions_merged", counted)
    assert _audit(str(db), "-q", "-o", str(default)).exit_code == 0
    assert counts == [3]
    assert default.read_bytes() == whole.read_bytes()
    # told otherwise: one process
    assert _audit(str(db), "--partitions", "1", "-q", "-o", str(default)).exit_code == 0
    assert counts == [3]


def test_what_partitions_cannot_split_stays_in_one_process(copy_db, tmp_path, large_from):
    db = copy_db("v0.22.5/seed")
    large_from(db)
    assert default_partitions((str(db),)) == 3
    assert default_partitions((str(db.parent),)) == 3  # a folder of it alone
    other = copy_db("v0.22.5/multi-replica-crash", "other.db")
    # several databases: a partition's share names them as servers (servers.assign_servers)
    assert default_partitions((str(db), str(other))) is None
    assert default_partitions((str(tmp_path),)) is None  # a folder holding both
    other.unlink()
    log = tmp_path / "server.log.gz"  # beside the database
    with next((SEED / "logs").iterdir()).open("rb") as source, gzip.open(log, "wb") as out:
        shutil.copyfileobj(source, out)
    assert default_partitions((str(db), str(log))) is None  # a log's runs: read whole
    assert default_partitions((str(tmp_path),)) is None  # a folder holding both
    assert default_partitions((str(SEED / "tables"),)) is None
    for given in ("-", "postgresql://auditor@db/dstack", str(tmp_path / "missing.db")):
        assert default_partitions((given,)) is None
    assert default_partitions(()) is None


def test_a_database_within_the_bound_stays_in_one_process(copy_db, monkeypatch):
    db = copy_db("v0.22.5/seed")
    monkeypatch.setattr(options, "PARTITIONED_BYTES", db.stat().st_size)
    assert default_partitions((str(db),)) is None
    monkeypatch.setattr(options, "PARTITIONED_BYTES", db.stat().st_size - 1)
    monkeypatch.setattr(options, "PARTITION_BYTES", db.stat().st_size)
    assert default_partitions((str(db),)) == 1  # over the bound: one partition of its size


@pytest.mark.parametrize("split", [["--partitions", "2"], []])
def test_strict_refuses_a_damaged_database_in_partitions(
    copy_db, tmp_path_factory, large_from, split
):
    db = copy_db("v0.22.5/seed")
    large_from(db)  # no --partitions: the default's
    report = tmp_path_factory.mktemp("out") / "report.json"  # never in the evidence's folder
    assert _audit(str(db), *split, "--strict", "-q", "-o", str(report)).exit_code == 0
    report.unlink()
    execute(db, f"UPDATE jobs SET submitted_at = '10000-01-01 00:00:00' WHERE id = '{DAMAGED_JOB}'")
    result = _audit(str(db), *split, "--strict", "-q", "-o", str(report))
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert f"{db}: damaged input under --strict" in line and DAMAGED_JOB in line
    assert not report.exists()
    assert _audit(str(db), *split, "-q", "-o", str(report)).exit_code == 0  # leniently
