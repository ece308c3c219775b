"""Shared test data: the real dstack captures copied into tests/data/captures."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
CAPTURES = DATA / "captures"
ROOT = Path(__file__).resolve().parents[1]


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A key and a self-signed certificate for 127.0.0.1 (a day's), made by openssl in
    `folder`; the test is skipped when openssl cannot make one."""
    key, cert = folder / "key.pem", folder / "cert.pem"
    made = subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        capture_output=True,
        check=False,
    )
    if made.returncode != 0:
        pytest.skip("openssl could not make a self-signed certificate")
    return key, cert


def read_until_closed(leader: int, wait: float = 30) -> bytes:
    """What a child forked on a pseudo-terminal (pty.fork) shows from now until the terminal
    closes, or until it shows nothing for `wait` seconds."""
    chunks = []
    while True:
        try:
            ready, _, _ = select.select([leader], [], [], wait)
            if not ready or not (data := os.read(leader, 65536)):
                break
            chunks.append(data)
        except OSError:  # EIO: every follower side is closed
            break
    return b"".join(chunks)


def children_of(pid: int) -> set[int]:
    """The processes `pid` started (Linux: /proc)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(child) for child in (task / "children").read_text().split()}
    return found


def still_running(pids: set[int]) -> list[str]:
    """The command lines of those of `pids` still running (a zombie has none)."""
    lines = []
    for pid in pids:
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if line:
            lines.append(line.replace(b"\0", b" ").decode())
    return lines


def read_terminal(leader: int, process: subprocess.Popen, timeout: float = 120) -> bytes:
    """What `process` showed on the pseudo-terminal whose leader side is `leader`: read until
    the terminal closes or the process has exited and nothing is left (killed after
    `timeout` seconds)."""
    chunks = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # EIO: every follower side is closed
                break
            if not data:
                break
            chunks.append(data)
        elif process.poll() is not None:
            break
    else:
        process.kill()
    return b"".join(chunks)


def truth_files(pattern: str = "v*/*/truth.json") -> list[Path]:
    return sorted(CAPTURES.glob(pattern))


def capture_id(path: Path) -> str:
    return "/".join(path.parent.relative_to(CAPTURES).parts)


def expected_victims(truth: dict) -> set[tuple[str, str]]:
    """(category, job_id): strict victims are collateral_termination, the rest of the broad
    victims are same_deployment_collateral (the captures' README, issue 2)."""
    expected = set()
    for run in truth["runs"]:
        strict = {v["job_id"] for v in run["victims"]}
        for victim in run["broad_victims"]:
            category = (
                "collateral_termination"
                if victim["job_id"] in strict
                else "same_deployment_collateral"
            )
            expected.add((category, victim["job_id"]))
    return expected


def found_victims(report) -> set[tuple[str, str]]:
    return {(f.category, v.job_id) for f in report.findings for v in f.victims}


def short_ids(victims: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """(category, job id) as a log names the job: the six-character short id dstack logs."""
    return {(category, job_id.replace("-", "")[:6]) for category, job_id in victims}


def load_truth(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.fixture
def copy_db(tmp_path):
    """A writable copy of a capture's server.db, for building cases the captures lack."""

    def make(capture: str, name: str = "server.db") -> Path:
        target = tmp_path / name
        shutil.copyfile(CAPTURES / capture / "server.db", target)
        return target

    return make


def execute(db: Path, *statements: str, params: tuple = ()) -> None:
    with sqlite3.connect(db) as connection:
        for statement in statements:
            connection.execute(statement, params)


def plant_env_secret(db: Path, secret: str, runs: Sequence[str] | None = None) -> None:
    """Every job's spec (of `runs` only, if given) carries `secret` as its `HF_TOKEN` env
    value (what dstack's CLI fills from the user's shell)."""
    among, ids = _among(runs)
    execute(
        db,
        f"UPDATE jobs SET job_spec_data = json_set(job_spec_data, '$.env', json(?)) WHERE {among}",
        params=(f'{{"HF_TOKEN": "{secret}"}}', *ids),
    )


def plant_failure_message(db: Path, message: str, runs: Sequence[str] | None = None) -> None:
    """The failed jobs' termination message (of `runs` only, if given) is `message`."""
    among, ids = _among(runs)
    execute(
        db,
        f"UPDATE jobs SET termination_reason_message = ? WHERE status = 'FAILED' AND {among}",
        params=(message, *ids),
    )


def _among(runs: Sequence[str] | None) -> tuple[str, tuple[str, ...]]:
    """The SQL condition that a job belongs to one of `runs` (every job: None), its values."""
    if runs is None:
        return "TRUE", ()
    return f"run_id IN ({', '.join('?' * len(runs))})", tuple(runs)


def interrupt_partitioned_audit(
    db: Path, partitions: int, out: Path, temporary: Path, ready: str, poll: float = 0.05
) -> tuple[int, bytes]:
    """Audit `db` in `partitions` in a child process whose TMPDIR is `temporary`, and press
    Ctrl-C (SIGINT) as soon as a path under `temporary` matches the glob `ready`: the child's
    exit status and standard error."""
    audit = ["audit", str(db), "--partitions", str(partitions), "-o", str(out)]
    process = subprocess.Popen(
        [sys.executable, "-m", "analyzer", *audit],
        env={**os.environ, "TMPDIR": str(temporary)},
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not list(temporary.glob(ready)) and time.monotonic() < deadline:
        assert process.poll() is None, f"the audit ended before {ready} was in TMPDIR"
        time.sleep(poll)
    assert list(temporary.glob(ready)), f"no {ready} in TMPDIR"
    process.send_signal(signal.SIGINT)
    _, errors = process.communicate(timeout=60)
    return process.returncode, errors


def without_update(db: Path) -> Path:
    """`db` as if its run had never been updated: every job and the run at deployment 0, and
    no 'Run updated' event (a sibling crash with no update, #2660)."""
    execute(db, "UPDATE jobs SET deployment_num = 0", "UPDATE runs SET deployment_num = 0")
    execute(
        db,
        "DELETE FROM event_targets WHERE event_id IN "
        "(SELECT id FROM events WHERE message LIKE 'Run updated%')",
        "DELETE FROM events WHERE message LIKE 'Run updated%'",
    )
    return db


def one_line_error(result) -> str:
    """The one line an unusable input gets (exit 2, `dstack-audit: ...`, no traceback)."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dstack-audit: "), result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    return lines[0]


def where_sent(paths, label, options):
    """A fleet's server task that "audits" a server where it is sent: its head names the
    process and it takes a while, so both processes of a local fleet get servers."""
    from types import SimpleNamespace

    from analyzer._version import __version__

    time.sleep(0.3)
    head = SimpleNamespace(
        generated_by=f"dstack-audit {__version__}",
        secrets=frozenset(),
        runs=frozenset({label}),
        part=(label, os.getpid()),
    )
    return SimpleNamespace(head=head)


def where_kept(paths, label, options):
    """`where_sent`, its head's part also saying the cores each thread of its process may run
    on then."""
    audited = where_sent(paths, label, options)
    threads = os.listdir("/proc/self/task")
    kept = frozenset(frozenset(os.sched_getaffinity(int(thread))) for thread in threads)
    audited.head.part = (*audited.head.part, kept)
    return audited


def left_unchanged(audited, secrets):
    """A fleet's finishing task that finds nothing more to mask."""
    return None


def slower_in_a_worker(paths, label, options):
    """`where_sent`, a second longer in a worker process than in the command's own, its head
    holding a secret value of its own."""
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        time.sleep(1.0)
    audited = where_sent(paths, label, options)
    audited.head.secrets = frozenset({f"secret-of-{label}"})
    return audited


class LateHead:
    """A task's result whose head says whether the worker's word that the task is done
    (analyzer.cluster_local.AUDITED) was waiting at the client's end of the pipe (`client`,
    set by the test) when the head was built; `built` is set then (the test reads the word
    only after: read before, it would no longer be waiting)."""

    client = None
    built = threading.Event()

    @property
    def head(self) -> bool:
        waiting = LateHead.client.poll()
        LateHead.built.set()
        return waiting


def with_late_head(paths, label, options):
    """A fleet's server task whose result is a LateHead."""
    return LateHead()


LOOKED_AHEAD: list[tuple[str, frozenset[str]]] = []


def noted_ahead(audited, known):
    """A fleet's look-ahead (FleetTasks.ahead) that notes which server it was given, and
    what was known then, in LOOKED_AHEAD."""
    LOOKED_AHEAD.append((audited.head.part[0], known))
