"""analyzer.sources.adbc: the low-level statement both database readers share, and the memory
an ADBC read leaves in the C heap once its frames are dropped."""

from __future__ import annotations

import ctypes
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.sources import adbc

adbc_driver_sqlite = pytest.importorskip("adbc_driver_sqlite")
STATUS = Path("/proc/self/status")


@pytest.fixture
def table(tmp_path):
    """A table of 200,000 rows (about 30 MB as read)."""
    path = tmp_path / "t.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE t (id TEXT, note TEXT)")
        rows = ((f"{i:032x}", f"value {i} " * 4) for i in range(200_000))
        db.executemany("INSERT INTO t VALUES (?, ?)", rows)
    db.close()
    return path


def test_a_query_reads_every_row_as_it_is(table):
    statement = adbc.AdbcStatement(adbc_driver_sqlite.connect(f"file:{table}?mode=ro"))
    try:
        frame = statement.query("SELECT id, note FROM t WHERE rowid IN (1, 200000)")
    finally:
        statement.close()
    assert frame.rows() == [(f"{0:032x}", "value 0 " * 4), (f"{199_999:032x}", "value 199999 " * 4)]


# In a fresh process: a test process's heap holds whatever earlier tests left there.
MEASURED = """
import json, re, sys
from pathlib import Path
import adbc_driver_sqlite
from analyzer.sources import adbc

def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", Path("/proc/self/status").read_text())[1]) / 1024

statement = adbc.AdbcStatement(adbc_driver_sqlite.connect(f"file:{sys.argv[1]}?mode=ro"))
before = rss()
frame = statement.query("SELECT CAST(id AS BLOB), CAST(note AS BLOB) FROM t")
read, rows = rss() - before, frame.height
del frame
dropped = rss()
adbc.release_freed()
print(json.dumps({"read": read, "released": dropped - rss(), "rows": rows}))
statement.close()
"""


def _in_a_fresh_process(code: str, path: Path) -> dict:
    """What `code` prints (JSON) when run on `path` in a fresh Python process."""
    done = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=Path(__file__).parents[1],
    )
    return json.loads(done.stdout)


@pytest.mark.skipif(not STATUS.exists(), reason="no /proc: the resident size cannot be read")
def test_the_pages_of_dropped_frames_go_back_to_the_system(table):
    """The driver's Arrow buffers live in the C heap: dropping the frame leaves its pages
    there, and release_freed hands them back."""
    if not hasattr(ctypes.CDLL(None), "malloc_trim"):
        pytest.skip("not glibc: release_freed does nothing")
    measured = _in_a_fresh_process(MEASURED, table)
    assert measured["rows"] == 200_000
    assert measured["released"] >= measured["read"] / 4, measured


def test_without_glibc_nothing_is_released(monkeypatch):
    """A C library without malloc_trim (musl, macOS): the call is skipped, never an error."""

    class NoTrim:
        def __init__(self, _name):
            pass

    monkeypatch.setattr(adbc.ctypes, "CDLL", NoTrim)
    assert adbc.release_freed() is None


# A second load of the same database, its canonical frames held: what it leaves in the C heap
# (the first load pays for the imports).
HELD = """
import ctypes, json, sys
from analyzer.sources import load_path
from analyzer.sources.base import LoadContext, ReadOptions

class MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2

def in_use():
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd

load_path(sys.argv[1], LoadContext("default", ReadOptions()))
before = in_use()
(data,) = load_path(sys.argv[1], LoadContext("default", ReadOptions()))
frames = [data.runs, data.jobs, data.events, data.fleets, data.instances]
print(json.dumps({"held": in_use() - before, "rows": sum(f.height for f in frames)}))
"""


def test_the_canonical_frames_keep_none_of_the_driver_s_buffers(tmp_path):
    """A value passed through as read would keep the driver's whole batch of rows alive
    for the rest of the audit (cells.owned): at 100 runs, 50 MB of the C heap."""
    if not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("not glibc 2.33+: the C heap's use cannot be read")
    synthesize = pytest.importorskip("analyzer.synth.generate").synthesize
    synthesize(tmp_path / "server", 100, seed=7, log_formats=())
    measured = _in_a_fresh_process(HELD, tmp_path / "server" / "server.db")
    assert measured["rows"] > 3000
    assert measured["held"] < 2 * 1024 * 1024, measured
