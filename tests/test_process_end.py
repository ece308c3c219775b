"""The console script's process ends with its command (analyzer.cli.options: `_ended`): the
exit status, the exit handlers and the outputs are those of any exit; only the objects the
command made are not freed one by one. A test's runner and a notebook call the same group in
their own process, which keeps running: nothing is held for them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from click.testing import CliRunner
from conftest import CAPTURES, ROOT

from analyzer import collector
from analyzer.cli import main

SEED = str(CAPTURES / "v0.22.5" / "seed" / "server.db")

# The console script's own call (`main()`, as pip's entry point makes it), after what the test
# sets up in that process: an exit handler and, given a second argument, a thread still running.
CONSOLE = r"""
import atexit, os, sys, threading, time
marker = sys.argv[1]
def note(text):
    with open(marker, "a") as handle:
        handle.write(text + "\n")
class Freed:  # says when it is freed (a module's objects are, as Python tears it down)
    def __init__(self):
        self.handle = open(marker, "a")
    def __del__(self):
        self.handle.write("freed\n")
        self.handle.close()
held = Freed()
atexit.register(note, "exit handler")
if len(sys.argv) > 2:
    def late():  # still running when the command ends, however long its audit takes
        for _ in range(1200):
            if os.path.exists(marker + ".json"):  # the report is written: the command ends
                break
            time.sleep(0.05)
        time.sleep(0.2)
        note("thread")
    threading.Thread(target=late).start()
sys.argv = ["dstack-audit", "audit", SEED, "--format", "json", "-q", "--fail-on-findings",
            "-o", str(marker) + ".json"]
from analyzer.cli import main
main()
"""


def _console(tmp_path, *extra: str) -> tuple[subprocess.CompletedProcess, str, dict]:
    marker = tmp_path / "marker"
    marker.write_text("")
    code = CONSOLE.replace("SEED", repr(SEED))
    done = subprocess.run(
        [sys.executable, "-c", code, str(marker), *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads((tmp_path / "marker.json").read_text())
    return done, marker.read_text(), report


def test_the_console_script_ends_with_its_command_s_status_and_exit_handlers(tmp_path):
    done, marked, report = _console(tmp_path)
    assert done.returncode == 1, done.stderr  # findings under --fail-on-findings
    assert done.stderr == ""
    assert marked == "exit handler\n"  # and nothing freed one by one
    assert report["summary"]["findings"] >= 1


def test_a_thread_still_running_takes_python_s_own_way_out(tmp_path):
    """A thread that is not a daemon is waited for, as Python waits for it: ending the
    process at once would cut it short."""
    done, marked, _ = _console(tmp_path, "thread")
    assert done.returncode == 1, done.stderr
    assert marked == "thread\nexit handler\nfreed\n"


def test_a_runner_in_a_process_that_goes_on_holds_nothing():
    before = list(collector._KEPT)
    result = CliRunner().invoke(main, ["audit", SEED, "--format", "json", "-q"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["summary"]["findings"] >= 1
    assert not collector.ENDS_WITH_COMMAND
    assert collector._KEPT == before == []


def test_kept_holds_only_for_a_process_that_ends_with_its_command(monkeypatch):
    monkeypatch.setattr(collector, "_KEPT", [])
    thing = object()
    collector.kept(thing)
    assert collector._KEPT == []
    monkeypatch.setattr(collector, "ENDS_WITH_COMMAND", True)
    collector.kept(thing)
    assert collector._KEPT.count(thing) == 1 == len(collector._KEPT)


# A process that calls the command in itself, on a small input, before it has imported polars
RUNNER = r"""
import json, os, sys
from click.testing import CliRunner
from analyzer.cli import main
before = sorted(os.sched_getaffinity(0)), os.environ.get("POLARS_MAX_THREADS")
result = CliRunner().invoke(main, ["audit", sys.argv[1], "--format", "json", "-q"])
after = sorted(os.sched_getaffinity(0)), os.environ.get("POLARS_MAX_THREADS")
print(json.dumps([result.exit_code, before, after]))
"""


def test_a_runner_s_audit_of_a_small_input_leaves_its_process_cores_and_environment():
    """Sizing polars for a small input (one thread, one core: analyzer.cli.options) is for
    the console script's own process; a test's runner or a notebook goes on with its own."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("POLARS_")}
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, SEED],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    code, before, after = json.loads(done.stdout)
    assert code == 0
    assert after == before


# `ingest` of the seed sample, stopped by Ctrl-C as its `with outputs.build(...)` block is about
# to leave: the signal handler raises on the first line of contextlib's `__exit__`, before the
# generator (and its `finally`, which removes the staging folder) is resumed. Seen with a real
# Ctrl-C on a 16k-run ingest, there, every time of three.
STOPPED_AS_THE_BLOCK_LEAVES = r"""
import sys
from analyzer.outputs import Outputs
build = Outputs.build

class Stopped:
    def __init__(self, manager):
        self.manager = manager
    def __enter__(self):
        return self.manager.__enter__()
    def __exit__(self, kind, error, trace):
        if kind is None:
            raise KeyboardInterrupt  # where the signal handler raises it
        return self.manager.__exit__(kind, error, trace)

Outputs.build = lambda self, given, **options: Stopped(build(self, given, **options))
sys.argv = ["dstack-audit", "ingest", sys.argv[1], "-q", "--to", sys.argv[2]]
from analyzer.cli import main
main()
"""


def test_a_signal_as_a_block_leaves_still_removes_its_staging_folder(tmp_path):
    """The console script ends at once (os._exit) but not for a command a signal stopped:
    then a cleanup the signal cut off before it began runs as the stopped frames are freed
    (analyzer.cli.options._ended). Exit 130, no dataset and no staging folder beside it."""
    target = tmp_path / "dataset"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            STOPPED_AS_THE_BLOCK_LEAVES,
            str(CAPTURES / "v0.22.5" / "seed"),
            str(target),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == "dstack-audit: interrupted\n"
    assert list(tmp_path.iterdir()) == []
