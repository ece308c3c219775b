"""What you pipe is what you get (issue 24): typed in a terminal (stdin and stderr on a
pseudo-terminal, where the progress bars show), every command writes to its standard output,
a file or a pipe, the same bytes as without a terminal; Ctrl-C exits 130 and leaves no file."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import CAPTURES, ROOT, read_terminal, read_until_closed

SEED = CAPTURES / "v0.22.5" / "seed"
SEED_DB = str(SEED / "server.db")
ENV = {"COLUMNS": "100", "LINES": "40", "TERM": "xterm"}


def _env() -> dict[str, str]:
    env = {**os.environ, **ENV}
    env.pop("NO_COLOR", None)
    return env


def _typed(args: list[str], stdout: int) -> tuple[int, bytes]:
    """The CLI with stdin and stderr on a pseudo-terminal and stdout on `stdout`: its exit
    status and what the terminal showed."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "analyzer", *args],
        stdin=follower,
        stdout=stdout,
        stderr=follower,
        cwd=ROOT,
        env=_env(),
    )
    os.close(follower)
    screen = read_terminal(leader, process)
    status = process.wait(timeout=120)
    os.close(leader)
    return status, screen


def _untyped(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "analyzer", *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        cwd=ROOT,
        env=_env(),
        check=False,
    )


def _to_file(args: list[str], path: Path) -> tuple[int, bytes, bytes]:
    with path.open("wb") as handle:
        status, screen = _typed(args, handle.fileno())
    return status, path.read_bytes(), screen


def _to_pipe(args: list[str]) -> tuple[int, bytes, bytes]:
    read, write = os.pipe()
    got: list[bytes] = []

    def reader() -> None:
        with os.fdopen(read, "rb") as handle:
            got.append(handle.read())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        status, screen = _typed(args, write)
    finally:
        os.close(write)
    thread.join(timeout=120)
    return status, got[0], screen


SECONDS = re.compile(rb"\d+\.\d+s\b|\(\d+ pages/s\)")

COMMANDS = {
    "audit table": ["audit", SEED_DB],
    "audit json": ["audit", str(SEED), "--format", "json"],
    "audit markdown -o -": ["audit", SEED_DB, "-o", "-", "--format", "markdown"],
    "timeline": ["timeline", "web", SEED_DB],
    "timeline csv": ["timeline", "web", SEED_DB, "--format", "csv"],
    "exposure": ["exposure", SEED_DB],
    "exposure json": ["exposure", SEED_DB, "--format", "json"],
    "plot -o -": ["plot", "web", SEED_DB, "-o", "-"],
    "report -o -": ["report", SEED_DB, "-o", "-", "--max-plots", "1"],
}


@pytest.mark.parametrize("name", COMMANDS)
def test_a_terminal_never_swallows_the_output(name, tmp_path):
    args = COMMANDS[name]
    alone = _untyped(args)
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout
    status, written, screen = _to_file(args, tmp_path / "out")
    assert status == 0, screen
    assert written == alone.stdout
    status, piped, screen = _to_pipe(args)
    assert status == 0, screen
    assert piped == alone.stdout


def test_the_progress_shows_on_the_terminal_while_stdout_is_a_file(tmp_path):
    status, written, screen = _to_file(["audit", str(SEED), "--format", "json"], tmp_path / "o")
    assert status == 0 and written.startswith(b"{")
    assert b"reading" in screen and b'"schema_version"' not in screen


def test_the_commands_that_write_folders_say_the_same(tmp_path):
    """ingest, synth and verify write one summary line to stdout: the same under a terminal
    (timings aside)."""
    bundle = tmp_path / "bundle"
    assert _untyped(["audit", SEED_DB, "-o", os.devnull, "--bundle", str(bundle)]).returncode == 0
    cases = [
        (["verify", str(bundle)], None),
        (["ingest", SEED_DB, "--to", str(tmp_path / "{}")], "ds"),
        (["synth", str(tmp_path / "{}"), "--runs", "3"], "synth"),
    ]
    for args, folder in cases:
        plain = [a.replace("{}", f"{folder}-plain") for a in args] if folder else args
        typed = [a.replace("{}", f"{folder}-typed") for a in args] if folder else args
        alone = _untyped(plain)
        assert alone.returncode == 0, alone.stderr
        status, written, screen = _to_file(typed, tmp_path / "out")
        assert status == 0, screen
        expected = alone.stdout.replace(b"-plain", b"-typed")
        assert SECONDS.sub(b"", written) == SECONDS.sub(b"", expected)
        assert written


def test_ctrl_c_exits_130_and_leaves_no_partial_output(tmp_path):
    """Typed in a real terminal (the pty is the controlling terminal, so Ctrl-C is the tty's
    SIGINT to the foreground process), interrupted while it reads."""
    out = tmp_path / "report.json"
    pid, leader = pty.fork()
    if pid == 0:  # the child: a shell's foreground job
        os.chdir(ROOT)
        os.execve(
            sys.executable,
            [sys.executable, "-m", "analyzer", "audit", str(CAPTURES / "v0.22.5"), "-o", str(out)],
            _env(),
        )
    screen = b""
    deadline = time.monotonic() + 60
    while b"reading" not in screen and time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1)
        if ready:
            screen += os.read(leader, 65536)
    assert b"reading" in screen, screen
    os.write(leader, b"\x03")  # Ctrl-C, as typed
    screen += read_until_closed(leader)
    _, status = os.waitpid(pid, 0)
    os.close(leader)
    assert os.waitstatus_to_exitcode(status) == 130, screen
    assert b"interrupted" in screen and b"Traceback" not in screen
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_ends_a_collect_waiting_for_its_answer(tmp_path):
    """Not in the issue: Ctrl-C typed while `collect` waits for a page the server has not begun
    to send. polars, once imported, puts its own SIGINT handler in Python's place, one that
    restarts the main thread's wait (pola-rs/polars#21739): the Ctrl-C was seen only when the
    answer came. Exit 130 at once, nothing left in the target's folder."""
    import fake_dstack

    def silent(request):
        time.sleep(60)

    with fake_dstack.FakeDstack({"/api/runs/list": silent}) as server:
        pid, leader = pty.fork()
        if pid == 0:  # the child: a shell's foreground job
            os.chdir(ROOT)
            os.execve(
                sys.executable,
                [
                    sys.executable,
                    "-m",
                    "analyzer",
                    "collect",
                    server.url,
                    "--to",
                    str(tmp_path / "c"),
                ],
                {**_env(), "DSTACK_TOKEN": "5f0c3f6e-8d7a-4c1b-9e2f-0a1b2c3d4e5f"},
            )
        deadline = time.monotonic() + 60
        while "/api/runs/list" not in server.paths() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "/api/runs/list" in server.paths()
        time.sleep(0.3)  # the main thread waits for the page
        typed = time.monotonic()
        os.write(leader, b"\x03")  # Ctrl-C, as typed
        screen = read_until_closed(leader, wait=20)
        _, status = os.waitpid(pid, 0)
        waited = time.monotonic() - typed
        os.close(leader)
    assert os.waitstatus_to_exitcode(status) == 130, screen
    assert b"interrupted" in screen and b"Traceback" not in screen
    assert waited < 10, waited
    assert list(tmp_path.iterdir()) == []


def test_sigint_while_writing_leaves_no_file(tmp_path):
    """SIGINT however it comes (kill -INT), sent once the report is being drawn (the terminal
    shows that stage): exit 130 and no file, not even a temporary one."""
    out = tmp_path / "report.html"
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "analyzer", "report", str(CAPTURES / "v0.22.5"), "-o", str(out)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=follower,
        cwd=ROOT,
        env=_env(),
    )
    os.close(follower)
    screen = b""
    deadline = time.monotonic() + 60
    while b"drawing the report" not in screen and time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1)
        if ready:
            try:
                screen += os.read(leader, 65536)
            except OSError:
                break
    process.send_signal(signal.SIGINT)
    screen += read_terminal(leader, process, timeout=60)
    status = process.wait(timeout=60)
    os.close(leader)
    if b"wrote" in screen:  # finished before the signal came
        pytest.skip("the report was written before the signal")
    assert b"drawing the report" in screen, screen
    assert status == 130, screen
    assert list(tmp_path.iterdir()) == []


# A command of the real group whose way out takes a while: a resource closed as it stops (as
# the workers are, and the private folders removed), then an exit handler; each step leaves a
# mark in the folder given.
STOPPING = r"""
import atexit, sys, time, click
from pathlib import Path
from analyzer.cli.options import AuditGroup

marks = Path(sys.argv[1])
mark = lambda name: (marks / name).touch()

class SlowToClose:
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        mark("closing")
        time.sleep(1.0)
        mark("closed")

def exiting():
    mark("exiting")
    time.sleep(1.0)
    mark("exited")

@click.group(cls=AuditGroup)
def main():
    pass

@main.command()
def work():
    click.get_current_context().with_resource(SlowToClose())
    atexit.register(exiting)
    mark("working")
    time.sleep(60)

main(["work"])
"""


@pytest.mark.parametrize(
    ("first", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)]
)
def test_a_second_signal_does_not_cut_the_way_out_short(tmp_path, first, status):
    """Once a command is stopped, a signal that follows (Ctrl-C typed again, a SIGTERM) is
    ignored to its end: what it closes on the way out is closed whole, and it ends with its own
    status and one line, not a traceback or the signal's default action."""
    process = subprocess.Popen(
        [sys.executable, "-c", STOPPING, str(tmp_path)],
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )

    def when(name: str, then: signal.Signals) -> None:
        deadline = time.monotonic() + 30
        while not (tmp_path / name).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        process.send_signal(then)

    when("working", first)
    when("closing", signal.SIGINT)  # while it closes what it holds
    when("exiting", signal.SIGTERM)  # while Python runs its exit handlers
    _, errors = process.communicate(timeout=30)
    assert process.returncode == status, errors
    assert {path.name for path in tmp_path.iterdir()} == {
        "working",
        "closing",
        "closed",
        "exiting",
        "exited",
    }
    name = signal.Signals(first).name
    said = "interrupted" if first == signal.SIGINT else f"stopped by {name}"
    assert errors.decode() == f"dstack-audit: {said}\n"
