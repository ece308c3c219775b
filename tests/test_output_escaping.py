"""Output cannot be made to act (issue 23): text from the evidence (a termination message is the
workload's own free text, a file name is whatever the folder holds) never reaches an output as
an escape sequence, a bell or a bidirectional override, in any renderer or on stderr."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import execute

ROOT = Path(__file__).resolve().parents[1]
# clear the screen, set the terminal's title, ring the bell, reverse the text's direction
PLANTED = "Fleet is at capacity \x1b[2J\x1b]0;pwned\x07 \u202eevil\u2066x\u2069 \u200bend"
ACTING = ["\x1b", "\x07", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))]


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer", *args],
        capture_output=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"},
        timeout=300,
        check=False,
    )


def acting(data: bytes) -> list[str]:
    text = data.decode("utf-8", errors="replace")
    return [repr(c) for c in ACTING if c in text]


@pytest.fixture
def planted(copy_db, tmp_path) -> Path:
    """The seed capture, its culprit's termination message the workload's hostile text."""
    db = copy_db("v0.22.5/seed")
    execute(
        db,
        "UPDATE jobs SET termination_reason_message = ? WHERE termination_reason_message != ''",
        params=(PLANTED,),
    )
    evidence = tmp_path / "evidence"  # outputs go beside it, never into its folder
    evidence.mkdir()
    return db.rename(evidence / "server.db")


@pytest.mark.parametrize(
    "args",
    [
        ("audit", "{db}"),
        ("audit", "{db}", "--format", "markdown"),
        ("timeline", "web", "{db}"),
        ("timeline", "web", "{db}", "--format", "csv"),
        ("exposure", "{db}"),
    ],
    ids=["table", "markdown", "timeline", "timeline-csv", "exposure"],
)
def test_no_renderer_lets_the_evidence_act(planted, tmp_path, args):
    done = cli(*(a.format(db=planted) for a in args), cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    assert acting(done.stdout) == [] and acting(done.stderr) == []
    assert b"Fleet is at capacity" in done.stdout or args[0] == "exposure"


@pytest.mark.parametrize("name", ["report.html", "web.svg"])
def test_files_written_let_nothing_act(planted, tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    args = ("report", str(planted)) if name.endswith(".html") else ("plot", "web", str(planted))
    done = cli(*args, "-o", str(out / name), cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    written = (out / name).read_bytes()
    assert b"Fleet is at capacity" in written
    assert acting(written) == [] and acting(done.stderr) == []


def test_a_file_name_with_escape_sequences_reaches_no_terminal_raw(copy_db, tmp_path):
    """`-v` names every file it reads: a folder called to retitle the terminal is shown inert."""
    folder = tmp_path / "evidence\x1b]0;pwned\x07\u202e"
    folder.mkdir()
    db = copy_db("v0.22.5/seed")
    db.rename(folder / "server.db")
    done = cli("audit", str(folder), "-v", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    assert b"server.db" in done.stderr  # it did name the file
    assert acting(done.stderr) == [] and acting(done.stdout) == []
