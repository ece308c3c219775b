"""A small input is audited on one polars thread, on one core, and polars' in-memory engine
(issue 38 §6): its audit is a couple of thousand queries of a few rows each, and waking the
pool's threads on another core, or setting up a streaming pipeline, for each cost CPU. All are
chosen before polars is imported, so each case runs in a fresh interpreter."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from analyzer.cli.options import ONE_CORE_BYTES, SMALL_INPUT_BYTES, SQLITE_WORK_SHARE

SEED = ROOT / "samples" / "v0.22.5" / "seed"
# the cores: the most any thread of the process may run on, once a query has started the pool
SIZED = (
    "import os, sys; from analyzer import collector; "
    "from analyzer.cli.options import polars_for_small_inputs as size; "
    "collector.ENDS_WITH_COMMAND = True; "  # as the console script's process
    "size(tuple(sys.argv[1:])); import polars; polars.LazyFrame({'a': [1]}).collect(); "
    "print(polars.thread_pool_size(), "
    "polars.Config.state(if_set=True).get('POLARS_ENGINE_AFFINITY'), "
    "max(len(os.sched_getaffinity(int(t))) for t in os.listdir('/proc/self/task')))"
)
CORES = len(os.sched_getaffinity(0))  # every core this process may run on
SETTINGS = ("POLARS_MAX_THREADS", "POLARS_ENGINE_AFFINITY")


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in SETTINGS}
    return subprocess.run(
        [sys.executable, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**environment, **env},
        timeout=120,
    )


def _polars(*sources: str, **env: str) -> tuple[int, str]:
    """The thread pool's size and the engine polars runs a query on (`None`: its own choice)."""
    return _sized(*sources, **env)[:2]


def _sized(*sources: str, **env: str) -> tuple[int, str, int]:
    """`_polars`, and how many cores the process's threads may run on."""
    result = _run(["-c", SIZED, *sources], **env)
    assert result.returncode == 0, result.stderr
    assert not result.stderr  # polars' allocator did not see fewer cores than there are
    threads, engine, cores = result.stdout.split()
    return int(threads), engine, int(cores)


def _threads(*sources: str, **env: str) -> int:
    return _polars(*sources, **env)[0]


def test_the_seed_sample_s_audit_runs_on_one_thread_in_memory(tmp_path):
    """The README's first command, as a whole process: one polars thread, the in-memory engine,
    the same report."""
    said = _seed_audit_saying(
        tmp_path,
        "import atexit, sys; "
        "atexit.register(lambda: print(sys.modules['polars'].thread_pool_size(), "
        "sys.modules['polars'].Config.state(if_set=True).get('POLARS_ENGINE_AFFINITY'), "
        "file=sys.stderr)); ",
    )
    assert said == "1 in-memory"


@pytest.mark.skipif(CORES < 2, reason="one core: nothing to keep to")
def test_the_seed_sample_s_audit_keeps_to_one_core(tmp_path):
    """Every thread of the audit's process, polars' pool among them, on the one core."""
    said = _seed_audit_saying(
        tmp_path,
        "import atexit, os, sys; "
        "atexit.register(lambda: print(sorted({len(os.sched_getaffinity(int(t))) "
        "for t in os.listdir('/proc/self/task')}), file=sys.stderr)); ",
    )
    assert said == "[1]"


# what a process's polars runs with, said at its exit: the pool, the engine, the cores
_SETTINGS_AT_EXIT = (
    "import atexit, os, sys; "
    "atexit.register(lambda: print(sys.modules['polars'].thread_pool_size(), "
    "sys.modules['polars'].Config.state(if_set=True).get('POLARS_ENGINE_AFFINITY'), "
    "max(len(os.sched_getaffinity(int(t))) for t in os.listdir('/proc/self/task')), "
    "file=sys.stderr)); "
)


@pytest.mark.parametrize(
    "command",
    [
        ["timeline", "web"],
        ["report", "-o", "{tmp}/report.html"],
        ["exposure", "--format", "json"],
        ["ingest", "--to", "{tmp}/dataset"],
    ],
    ids=lambda command: command[0],
)
def test_every_command_reading_a_small_input_sizes_polars_for_it(tmp_path, command):
    """Not the audit alone: each command that reads SOURCE... gives the seed sample one
    thread, the in-memory engine and one core (not `plot`, whose arguments are RUN and SOURCE...
    or, with --fleet, SOURCE... alone)."""
    argv = [part.format(tmp=tmp_path) for part in command]
    code = _SETTINGS_AT_EXIT + "from analyzer.cli import main; main()"
    result = _run(["-c", code, *argv, str(SEED), "-q"])
    assert result.returncode in (0, 1), result.stderr  # 1: a report of findings
    assert result.stderr.splitlines()[-1] == "1 in-memory 1"


def _seed_audit_saying(tmp_path, probe: str) -> str:
    """What `probe` (Python run before the CLI, printing to standard error at exit) says of the
    seed sample's audit as a whole process, the audit's report checked."""
    code = probe + "from analyzer.cli import main; main()"
    out = tmp_path / "report.json"
    result = _run(["-c", code, "audit", str(SEED), "--format", "json", "-o", str(out), "-q"])
    assert result.returncode == 0, result.stderr
    assert '"findings": 1' in out.read_text()
    return result.stderr.strip()


def test_the_audit_s_library_is_set_aside_from_the_cycle_collector(tmp_path):
    """The modules the audit imports live as long as the process: their objects are frozen
    (gc.freeze) so that no pass of the collector walks them again, and the collector runs on
    for what the audit makes (enabled again, no pass of the older generations over them)."""
    frozen, enabled, oldest = _seed_audit_saying(
        tmp_path,
        "import atexit, gc, sys; passes = []; "
        "gc.callbacks.append(lambda phase, info: phase == 'stop' and gc.get_freeze_count() "
        "and passes.append(info['generation'])); "
        "atexit.register(lambda: print(gc.get_freeze_count(), gc.isenabled(), "
        "max(passes, default=0), file=sys.stderr)); ",
    ).split()
    assert int(frozen) > 50_000  # polars', pydantic's and the library's objects
    assert enabled == "True"
    assert oldest == "0"  # only young objects were walked after the freeze


def test_an_audit_in_one_process_imports_only_what_it_runs(tmp_path):
    """Start-up is paid by every audit: one in one process imports neither the fleet's tasks
    (analyzer.cluster, analyzer.cluster_local), nor the partitions' merge, nor the story the
    renderers of one run draw."""
    said = _seed_audit_saying(
        tmp_path,
        "import atexit, sys; atexit.register(lambda: print(sorted(sys.modules.keys() & "
        "{'analyzer.cluster', 'analyzer.cluster_local', 'analyzer.pipeline.partitions', "
        "'analyzer.pipeline.story', 'analyzer.pipeline.assemble'}), file=sys.stderr)); ",
    )
    assert said == "['analyzer.pipeline.assemble']"  # the probe sees what the audit imported


def test_the_audit_does_not_search_the_installed_packages_for_pydantic_plugins(tmp_path):
    """Building the first model would read every installed package's entry points looking for
    pydantic plugins: the command skips that search (no third-party code sees its records)."""
    said = _seed_audit_saying(
        tmp_path,
        "import atexit, sys; atexit.register(lambda: print("
        "sys.modules['pydantic.plugin._loader']._plugins, file=sys.stderr)); ",
    )
    assert said == "None"  # never searched (an empty search leaves {})


def _sparse(path, size: int) -> str:
    """A file as large as it says, without writing it."""
    with path.open("wb") as handle:
        handle.truncate(size)
    return str(path)


def test_a_larger_input_keeps_every_core(tmp_path):
    default = _threads()  # nothing given: polars' own default
    big = _sparse(tmp_path / "server.db", ONE_CORE_BYTES)
    assert _sized(big) == (default, "None", CORES)  # polars' own choice
    assert _sized(str(SEED), big) == (default, "None", CORES)  # the inputs together count
    assert _sized(str(SEED)) == (1, "in-memory", 1)


def test_a_middling_input_keeps_one_core_and_polars_own_engine(tmp_path):
    """Up to a server log of a few thousand runs: one thread, one core, and the engine polars
    chooses (the streaming one pays for itself on a scan of some megabytes)."""
    log = _sparse(tmp_path / "server.log", SMALL_INPUT_BYTES)
    assert _sized(log) == (1, "None", 1)
    assert _sized(_sparse(tmp_path / "bigger.log", ONE_CORE_BYTES - 1)) == (1, "None", 1)


def _headed(path, head: bytes, size: int, tail: bytes = b"") -> str:
    """A file of `size` bytes that opens with `head` and ends with `tail`, mostly unwritten."""
    with path.open("wb") as handle:
        handle.write(head)
        handle.truncate(size - len(tail))
        handle.seek(0, os.SEEK_END)
        handle.write(tail)
    return str(path)


def test_a_database_counts_a_quarter_of_its_size(tmp_path):
    """Its audit's work per byte is a fraction of a log's (cli.options.SQLITE_WORK_SHARE): a
    2k-4k-run database (93-185 MB) on one core, a larger one on every core; a file that only
    bears the name is counted whole."""
    default = _threads()
    magic = b"SQLite format 3\x00"
    within = _headed(tmp_path / "server.db", magic, ONE_CORE_BYTES * SQLITE_WORK_SHARE - 1)
    assert _sized(within) == (1, "None", 1)
    beyond = _headed(tmp_path / "bigger.db", magic, ONE_CORE_BYTES * SQLITE_WORK_SHARE)
    assert _sized(beyond) == (default, "None", CORES)
    assert _sized(_sparse(tmp_path / "named.db", ONE_CORE_BYTES)) == (default, "None", CORES)


def test_a_gzip_log_counts_what_it_decompresses_to(tmp_path):
    """As its trailer says it: the audit works on those bytes (a 16k-run log is 8 MB gzipped)."""
    default = _threads()
    small = tmp_path / "small.log.gz"
    small.write_bytes(gzip.compress((SEED / "logs" / "server-info.json.log").read_bytes()))
    assert _sized(str(small)) == (1, "in-memory", 1)
    isize = ONE_CORE_BYTES.to_bytes(4, "little")
    big = _headed(tmp_path / "big.log.gz", b"\x1f\x8b\x08", 1 << 20, isize)
    assert _sized(big) == (default, "None", CORES)


ACCESS = b'INFO 2026-10-01T00:00:00.000 uvicorn.access 10.0.0.1:41000 - "POST /api/x" 200\n'
LIFECYCLE = (
    b"INFO 2026-10-01T00:00:00.000 dstack._internal.server.services.events Emitting event: "
    b"Job created on new replica submission. Event targets: job(1a2b3c)web-0-0-0\n"
)


def _log(path, lines: bytes, size: int, every: int = 0) -> str:
    """A log of `size` bytes or a little more, of `lines` over and over, a LIFECYCLE line
    after every `every` of them (0: none)."""
    block = lines * (every or 1000) + (LIFECYCLE if every else b"")
    with path.open("wb") as handle:
        for _ in range(size // len(block) + 1):
            handle.write(block)
    return str(path)


def test_a_busy_log_s_quiet_lines_do_not_count(tmp_path):
    """The records holding none of the words that can matter (a busy server's access lines),
    which its reader sets aside by the thousand, do not count (cli.options._quiet): such a log
    past ONE_CORE_BYTES keeps one core, in each layout (a rich one's lines of no printed time);
    the same log of lifecycle lines, or of rich access lines that each print their time (read
    line by line: each moves the clock), or of quiet lines among more bytes of lifecycle lines
    than the budget holds, keeps every core."""
    default = _threads()
    size = ONE_CORE_BYTES + (1 << 20)
    busy = _log(tmp_path / "busy.log", ACCESS, size, every=100)
    assert _sized(busy) == (1, "None", 1)
    assert _sized(_log(tmp_path / "dense.log", LIFECYCLE, size)) == (default, "None", CORES)
    rich = b'[00:00:00] INFO     uvicorn.access 10.0.0.1:41000 - "POST /api/x" 200\n'
    assert _sized(_log(tmp_path / "rich.log", rich, size)) == (default, "None", CORES)
    rich_untimed = b'           INFO     uvicorn.access:476 10.0.0.1:41000 - "POST /api/x" 200\n'
    busy_rich = _log(tmp_path / "busy.rich.log", rich_untimed, size, every=100)
    assert _sized(busy_rich) == (1, "None", 1)
    json_access = (
        b'{"timestamp": "2026-10-01 00:00:00,000", "logger": "uvicorn.access", "level": "INFO", '
        b'"message": "10.0.0.1:41000 - \\"POST /api/x\\" 200"}\n'
    )
    assert _sized(_log(tmp_path / "busy.json.log", json_access, size, every=100)) == (1, "None", 1)
    mixed = _log(tmp_path / "mixed.log", ACCESS, 2 * ONE_CORE_BYTES, every=1)
    assert _sized(mixed) == (default, "None", CORES)  # half its lines quiet, 62 MiB not
    gzipped = tmp_path / "busy.log.gz"
    with gzip.open(gzipped, "wb", compresslevel=1) as handle:
        handle.write((ACCESS * 99 + LIFECYCLE) * (size // (100 * len(ACCESS)) + 1))
    assert _sized(str(gzipped)) == (1, "None", 1)


def test_what_cannot_be_sized_keeps_every_core(tmp_path):
    default = _threads()
    many = tmp_path / "many"
    many.mkdir()
    for number in range(1_001):  # more files than are looked through first
        (many / f"{number}.log").touch()
    assert _threads(str(many)) == default
    assert _threads("postgresql://dstack@127.0.0.1/dstack") == default
    assert _threads("-") == default
    assert _threads(str(tmp_path / "missing.db")) == default
    link = tmp_path / "linked"
    link.mkdir()
    (link / "seed").symlink_to(SEED)
    assert _threads(str(link)) == default


def test_a_pool_or_an_engine_the_user_chose_is_kept():
    assert _polars(str(SEED), POLARS_MAX_THREADS="2") == (2, "in-memory")
    assert _polars(str(SEED), POLARS_ENGINE_AFFINITY="streaming") == (1, "streaming")
    both = {"POLARS_MAX_THREADS": "2", "POLARS_ENGINE_AFFINITY": "auto"}
    assert _polars(str(SEED), **both) == (2, "auto")
    assert _sized(str(SEED), POLARS_MAX_THREADS="2")[2] == CORES  # two threads: every core
