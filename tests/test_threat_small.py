"""The smaller boundaries of issue 23 (docs/threat-model.md): `synth` over a folder kept, a WAL
database given through a symlink, a log that grows while it is read."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CAPTURES

from analyzer.cli import main

pytest.importorskip("numpy")  # synth's extra

SEED = CAPTURES / "v0.22.5" / "seed"
ROOT = Path(__file__).resolve().parents[1]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_synth_over_an_existing_folder_refuses_without_force(tmp_path):
    out = tmp_path / "server"
    out.mkdir()
    (out / "server.db").write_bytes(b"the evidence of another day")
    (out / "truth.json").write_text("{}")
    (out / "notes.txt").write_text("kept")
    before = snapshot(out)
    result = CliRunner().invoke(main, ["synth", str(out), "--runs", "2"])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith(f"dstack-audit: {out}: the folder is not empty") and "--force" in line
    assert snapshot(out) == before and sorted(p.name for p in tmp_path.iterdir()) == ["server"]
    forced = CliRunner().invoke(main, ["synth", str(out), "--runs", "2", "--force"])
    assert forced.exit_code == 0, forced.output
    assert {p.name for p in out.iterdir()} == {"server.db", "logs", "truth.json"}
    assert json.loads((out / "truth.json").read_text())["runs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server"]  # no staging left


def test_synth_refuses_a_file_or_the_working_directory(tmp_path, monkeypatch):
    """Not in the issue: OUT a file, and OUT the folder the command runs in (--force or not)."""
    afile = tmp_path / "server.db"
    afile.write_bytes(b"x")
    result = CliRunner().invoke(main, ["synth", str(afile), "--runs", "2", "--force"])
    assert result.exit_code == 2 and afile.read_bytes() == b"x"
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "keep").write_text("k")
    monkeypatch.chdir(tmp_path / "here")
    result = CliRunner().invoke(main, ["synth", ".", "--runs", "2", "--force"])
    assert result.exit_code == 2 and "working directory" in result.output
    assert (tmp_path / "here" / "keep").read_text() == "k"


def wal_evidence(tmp_path: Path) -> Path:
    """A WAL-mode database whose last commit ('late-run') lives only in its -wal file."""
    live = tmp_path / "live"
    live.mkdir()
    shutil.copyfile(SEED / "server.db", live / "server.db")
    writer = sqlite3.connect(live / "server.db")
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("UPDATE runs SET run_name = 'late-run'")
    writer.commit()
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    for name in ("server.db", "server.db-wal"):
        shutil.copyfile(live / name, evidence / name)
    writer.close()
    return evidence / "server.db"


def run_names(*args: str) -> set[str]:
    result = CliRunner().invoke(main, ["audit", *args, "--format", "json", "--all-runs"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert "sqlite-wal" in {i["kind"] for i in report["inputs"]}, report["inputs"]
    return {run["run_name"] for run in report["runs"]}


def test_a_wal_database_given_through_a_symlink_keeps_its_wal(tmp_path):
    db = wal_evidence(tmp_path)
    link = tmp_path / "link.db"
    link.symlink_to(db)
    assert run_names(str(link)) == {"late-run"}


def test_a_wal_database_through_a_chain_of_relative_links_in_a_folder(tmp_path):
    """Not in the issue: two relative links in other folders, the second inside a folder
    that is audited whole (the folder walk reaches the database through its link)."""
    db = wal_evidence(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "hop.db").symlink_to(os.path.relpath(db, tmp_path / "a"))
    (tmp_path / "b" / "server.db").symlink_to("../a/hop.db")
    assert run_names(str(tmp_path / "b")) == {"late-run"}
    assert not (tmp_path / "b" / "server.db-wal").exists()  # nothing made beside the link


def big_log(path: Path) -> None:
    """A real log made long (20 MB of lines no rule reads) so that reading it takes a while."""
    filler = (
        b"INFO 2026-11-02T09:00:00.000 uvicorn.access 127.0.0.1:5000 - "
        b'"GET /api/server/get_info HTTP/1.1" 200\n'
    )
    with path.open("wb") as out:
        out.write((SEED / "logs" / "server-info.standard.log").read_bytes())
        out.write(filler * (20 * 2**20 // len(filler)))


WHILE_READ = """
import json, os, sys, threading, time
from pathlib import Path
from analyzer import open_sources

path = Path(sys.argv[1]).resolve()
action = sys.argv[2]


def read_past(offset):
    # the audit's own descriptor of the log, once it has read past `offset` (past any sniff)
    while True:
        for fd in os.listdir("/proc/self/fd"):
            try:
                if os.readlink(f"/proc/self/fd/{fd}") != str(path):
                    continue
                pos = int(open(f"/proc/self/fdinfo/{fd}").readline().split()[1])
            except OSError:
                continue
            if pos > offset:
                return
        time.sleep(0.0005)


def change():
    read_past(4 * 2**20)
    if action == "grow":
        with path.open("ab") as log:
            log.write(b"INFO 2026-11-02T09:30:00.000 dstack._internal.server later line\\n" * 1000)
    else:
        os.rename(path, path.with_name(path.name + ".1"))
        path.write_bytes(b"")


threading.Thread(target=change, daemon=True).start()
report = open_sources([path]).report
print(report.model_dump_json())
"""


@pytest.mark.parametrize("action", ["grow", "rotate"])
def test_a_log_that_changes_while_read_is_hashed_as_read_and_said(tmp_path, action):
    """The log grows (or, not in the issue, is rotated away) while the audit reads it: the
    SHA-256 and size recorded are of exactly the bytes read, and the report says it changed."""
    log = tmp_path / "server.log"
    big_log(log)
    before = log.read_bytes()
    done = subprocess.run(
        [sys.executable, "-c", WHILE_READ, str(log), action],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (info,) = report["inputs"]
    kept = log.read_bytes() if action == "grow" else log.with_name("server.log.1").read_bytes()
    assert kept.startswith(before)
    if action == "grow":  # read on to the end, the growth too: what is recorded is what was read
        assert info["size"] == len(kept) > len(before)
    read = kept[: info["size"]]
    assert info["sha256"] == hashlib.sha256(read).hexdigest()
    codes = {lim["code"]: lim["message"] for lim in report["limitations"]}
    assert "input_changed_while_read" in codes
    expected = "changed while it was read" if action == "grow" else "replaced or removed"
    assert expected in codes["input_changed_while_read"]


def test_a_log_left_alone_says_nothing_changed(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes((SEED / "logs" / "server-info.standard.log").read_bytes())
    result = CliRunner().invoke(main, ["audit", str(log), "--format", "json"])
    report = json.loads(result.output)
    assert report["inputs"][0]["sha256"] == hashlib.sha256(log.read_bytes()).hexdigest()
    assert "input_changed_while_read" not in {lim["code"] for lim in report["limitations"]}
