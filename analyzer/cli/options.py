"""The options and helpers every command shares, as decorators (sqlite-utils' `output_options`).

Only click and light base modules are imported here: `dstack-audit --help` and `--version` must
not pay for polars, pydantic or the pipeline (issue 15); the commands import those in their bodies.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import zlib
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import cache, wraps
from pathlib import Path
from typing import Any, NoReturn

import click

from analyzer import collector, cores
from analyzer.errors import AuditInputError, Terminated, out_of_room
from analyzer.interrupts import STOPS, handlers_kept_after_polars
from analyzer.magic import GZIP_MAGIC, LEVEL_NAMES, MATTER_WORDS, RICH_LEVEL_COLUMNS, SQLITE_MAGIC
from analyzer.terminal import SETTINGS, reporting
from analyzer.times import EXAMPLES, parse_time

Command = Callable[..., Any]


class IsoTime(click.ParamType):
    """ISO 8601: 2026-11-02, 2026-11-02T09:00:00Z, ...+02:00, or the tool's own output."""

    name = "TIME"

    def convert(self, value: Any, param: Any, ctx: Any) -> datetime:
        try:
            return parse_time(value, param.name if param else "time")
        except AuditInputError:
            self.fail(f"{value!r} is not an ISO 8601 time ({EXAMPLES})", param, ctx)


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it; 1 means findings


def _stopped(signum: int, frame: Any) -> None:
    """The first Ctrl-C, SIGTERM or SIGHUP raised where the program is; any of them that comes
    after is ignored, to the process's end: its way out (the workers stopped and waited for,
    the private folders and partial outputs removed) runs whole, and it ends with its own exit
    status, not killed by a late signal once Python has put the default action back as it
    shuts down (a second Ctrl-C's, or one that reached the process twice, seen in the tests
    of --workers now and then)."""
    import signal

    for name in STOPS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(signum)


class AuditGroup(click.Group):
    """The `dstack-audit` group: Ctrl-C exits 130 on every command (click's own handling says
    "Aborted!" and exits 1, which a CI gate would read as findings), SIGTERM and SIGHUP 128 +
    the signal. Outputs are written under a temporary name (analyzer.outputs) and every signal
    is raised as an exception, so an interrupted or killed command leaves no partial file and
    no temporary folder (`kill -9` excepted); a second signal does not cut that short
    (`_stopped`)."""

    def main(self, args: Any = None, *rest: Any, **extra: Any) -> Any:
        """The console script's run: its process ends as soon as the command has (`_ended`).
        Called with arguments (a test's runner, a notebook), click's own."""
        if args is not None or rest or not extra.get("standalone_mode", True):
            return super().main(args, *rest, **extra)
        collector.ENDS_WITH_COMMAND = True
        try:
            return super().main(**extra)
        except SystemExit as status:
            _ended(status)

    def invoke(self, ctx: click.Context) -> Any:
        import signal
        import threading

        main_thread = threading.current_thread() is threading.main_thread()
        signals = [getattr(signal, name) for name in STOPS] if main_thread else []
        before = {signum: signal.signal(signum, _stopped) for signum in signals}
        watch = handlers_kept_after_polars(signals)
        try:
            return super().invoke(ctx)
        except Terminated as stopped:
            name = signal.Signals(stopped.signum).name
            click.echo(f"dstack-audit: stopped by {name}", err=True)
            sys.exit(128 + stopped.signum)
        except KeyboardInterrupt:
            click.echo("dstack-audit: interrupted", err=True)
            sys.exit(INTERRUPTED)
        finally:
            watch.forget()
            for signum, handler in before.items():
                if signal.getsignal(signum) is _stopped:  # not once stopped (`_stopped`)
                    signal.signal(signum, handler)


def _ended(status: SystemExit) -> NoReturn:
    """The process ended with `status` without tearing down what the command built: the exit
    handlers run and the standard streams are flushed, as at any exit, but the interpreter's
    objects are not freed one by one (a 16k-run audit's 0.06-0.09 s). Any other thread still
    running (not a daemon), or a stream that cannot be flushed, takes Python's own way out; so
    does a command a signal stopped (128 + the signal: `invoke`). A signal can land as a `with`
    block is about to leave, on the first line of contextlib's `__exit__`, before it resumes
    its generator: that cleanup (a private folder's removal, an output's staging folder) runs
    only when the stopped frames are freed, which `os._exit` skips (seen: an interrupted
    `ingest` left its staging folder beside the target)."""
    import threading

    code = status.code
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    if not (code is None or isinstance(code, int)) or any(not t.daemon for t in others):
        raise status
    if (code or 0) >= 128:  # stopped by a signal
        raise status
    import atexit

    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        raise status from None
    os._exit(code or 0)


def ui_options(command: Command) -> Command:
    """-q, -v and --no-color on every command; progress bars on stderr while it runs."""

    @wraps(command)
    def wrapper(*args: Any, quiet: bool, verbose: bool, no_color: bool, **kwargs: Any) -> Any:
        SETTINGS.quiet, SETTINGS.verbose, SETTINGS.no_color = quiet, verbose, no_color
        with reporting():
            return command(*args, **kwargs)

    wrapper = click.option(
        "--no-color", is_flag=True, help="No colour (also when NO_COLOR is set or not a terminal)."
    )(wrapper)
    wrapper = click.option(
        "-v", "--verbose", is_flag=True, help="Say what is read and how long each stage took."
    )(wrapper)
    return click.option(
        "-q", "--quiet", is_flag=True, help="No progress bars and no notes on stderr."
    )(wrapper)


def clean_errors(command: Command) -> Command:
    """Unusable input: one line on stderr, exit 2, never a traceback."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AuditInputError as error:
            _fail(f"dstack-audit: {error}")
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as error:
            if full := out_of_room(error):  # the machine's, not ours
                _fail(_no_room(error, full))
            _fail(  # a bug of ours: still one line, still exit 2
                f"dstack-audit: internal error while auditing ({type(error).__name__}: "
                f"{error}); please report it with the command line"
            )

    return wrapper


def _no_room(error: Exception, full: str) -> str:
    """What to say of a full disk met while writing (`full`: how): the file when the error
    names it, else where the working files go (an output's own write names it itself:
    analyzer.outputs)."""
    import tempfile

    if getattr(error, "filename", None):
        return f"dstack-audit: cannot write {error.filename}: {full}"
    return (
        f"dstack-audit: {full} while writing an output or a working file (under "
        f"{tempfile.gettempdir()}): free some space, or set TMPDIR to a folder with room"
    )


def _fail(message: str) -> None:
    """`message` masked and without control characters on stderr, then exit 2."""
    from analyzer.redact import Redactor, without_controls

    click.echo(Redactor().apply(without_controls(message)), err=True)
    sys.exit(2)


def tz_option(command: Command) -> Command:
    """--tz, the display zone, worded alike on every command."""
    return click.option(
        "--tz", help="Show times in this zone (IANA name, e.g. Europe/Berlin); default UTC."
    )(command)


def log_options(command: Command) -> Command:
    """--log-tz and --log-date: what a log alone cannot say about its own times."""
    command = click.option(
        "--log-tz",
        help="The zone of the server's local log times (IANA name such as Europe/Berlin, or "
        "+02:00), when no database in the audit lets the tool infer it.",
    )(command)
    command = click.option(
        "--log-date",
        type=click.DateTime(formats=["%Y-%m-%d"]),
        help="The date of a rich log's first line (rich logs carry times of day only).",
    )(command)
    return command


def run_selection_options(command: Command) -> Command:
    """--project, --run, --since, --until: which runs an audit or a report covers."""
    for option in reversed(
        (
            click.option("--project", help="Only runs of this project."),
            click.option("--run", help="Only runs with this name, project/name or id prefix."),
            click.option(
                "--since",
                type=IsoTime(),
                help="Only runs still active at or after this time (ISO 8601; UTC without a zone).",
            ),
            click.option(
                "--until",
                type=IsoTime(),
                help="Only runs submitted at or before this time (ISO 8601; UTC without a zone).",
            ),
        )
    ):
        command = option(command)
    return command


TOKEN_HELP = (
    "A dstack user token for a server URL (prefer DSTACK_TOKEN: a command line is visible to "
    "other users). Never printed or stored."
)


def token_option(command: Command) -> Command:
    """--token, passed to a command that talks to a server itself (collect, guard)."""
    return click.option("--token", help=TOKEN_HELP)(command)


def source_token_option(command: Command) -> Command:
    """--token on every command that reads SOURCE...: any SOURCE may be a server URL, which
    reads the token given here in preference to DSTACK_TOKEN while the command runs. Polars
    is sized for the SOURCE... first (`polars_for_small_inputs`: the token's module imports
    it)."""

    @wraps(command)
    def wrapper(*args: Any, token: str | None, **kwargs: Any) -> Any:
        polars_for_small_inputs(kwargs.get("sources", ()))
        from analyzer.sources.live import use_token

        reset = use_token(token)
        try:
            return command(*args, **kwargs)
        finally:
            reset()

    return click.option("--token", help=TOKEN_HELP)(wrapper)


def sources_argument(command: Command) -> Command:
    """SOURCE...: one name for the inputs on every command."""
    return click.argument("sources", nargs=-1, required=True, metavar="SOURCE...")(command)


def wrote(output: Path | None) -> None:
    """'wrote FILE' on stderr after a file is written (not for standard output or a device such
    as /dev/null, not with -q)."""
    if output is not None and str(output) != "-" and output.is_file() and not SETTINGS.quiet:
        click.echo(f"dstack-audit: wrote {output}", err=True)


def target_option(help: str) -> Callable[[Command], Command]:
    """--to DIR, the new folder ingest and collect write (it appears only once complete)."""
    return click.option(
        "--to",
        "target",
        required=True,
        type=click.Path(file_okay=False, path_type=Path),
        help=help,
    )


def output_option(help: str) -> Callable[[Command], Command]:
    """-o/--output FILE, - for standard output."""
    return click.option(
        "--output",
        "-o",
        type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
        help=help,
    )


def open_audit(sources: tuple[str, ...], log_tz: str | None, log_date: Any, **options: Any):
    """The library's `open_sources` with the shared log options applied; a --run or --project
    that selects no run is exit 2 on every command (analyzer.pipeline.selectors)."""
    from analyzer.api import open_sources
    from analyzer.pipeline.selectors import matched_something

    opened = open_sources(
        sources, log_tz=log_tz, log_date=log_date.date() if log_date else None, **options
    )
    matched_something(opened.runs, options.get("project"), options.get("run"))
    return opened


def time_zone(tz: str | None):
    """--tz as a ZoneInfo (None for UTC)."""
    if not tz:
        return None
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise AuditInputError("--tz", f"unknown time zone {tz!r}", "e.g. Europe/Berlin") from None


def width_option(command: Command) -> Command:
    """--width N on every command that draws a table or fits text to the screen."""
    return click.option(
        "--width",
        type=click.IntRange(min=40),
        help="Fit tables and text to N columns (default: the terminal's width; in a pipe "
        "COLUMNS, else 100). No figure, id or time is ever cut, at any width.",
        metavar="N",
    )(command)


def screen_width(output: Path | None, width: int | None = None) -> int:
    """--width when given; else the terminal's width when printing to one; COLUMNS or 100."""
    if width:
        return width
    if output is None or str(output) == "-":
        if sys.stdout.isatty():
            return max(shutil.get_terminal_size().columns, 40)
        if os.environ.get("COLUMNS", "").isdigit():
            return max(int(os.environ["COLUMNS"]), 40)
    return 100


def format_option(names: tuple[str, ...], default: str | None) -> Callable[[Command], Command]:
    """--format NAME: one of the registry's formats `names` (analyzer.render.formats), the same
    name on every command; without it, -o FILE's extension decides."""
    from analyzer.render.formats import listing

    fallback = f"default {default}; " if default else ""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(list(names)),
        help=f"Output format ({fallback}without it, -o FILE's extension decides): "
        f"{listing(names)}.",
    )


def output_format(
    fmt: str | None,
    output: Path | None,
    names: tuple[str, ...],
    default: str | None,
    command: str,
) -> str:
    """--format when given, else -o FILE's extension, else `default` (standard output, or a
    FILE without an extension). An extension none of `command`'s formats has is refused, one
    line naming those it has: `audit -o x.html` once wrote the terminal table under that name."""
    from analyzer.render.formats import by_suffix

    if fmt:
        return fmt
    suffixes = by_suffix(names)
    if output is None or str(output) == "-":
        return default or names[0]
    if default is not None and not output.suffix:
        return default
    found = suffixes.get(output.suffix.lower())
    if found is not None:
        return found
    *most, last = suffixes
    wanted = f"{', '.join(most)} or {last}" if most else last
    html = output.suffix.lower() in (".html", ".htm")
    raise AuditInputError(
        str(output),
        f"{command} writes {wanted} files, not {output.suffix or 'a name without an extension'}",
        f"the HTML report: dstack-audit report SOURCE... -o {output.name}"
        if html
        else "or give --format",
    )


def parse_server_labels(pairs: tuple[str, ...]) -> dict[str, str]:
    """--server-label NAME=SOURCE pairs as {source: name}."""
    labels = {}
    for pair in pairs:
        name, _, source = pair.partition("=")
        if not name or not source:
            raise AuditInputError(
                "--server-label", f"{pair!r} is not NAME=SOURCE", "e.g. prod=prod.db"
            )
        labels[source] = name
    return labels


def parse_partition(text: str | None) -> tuple[int, int] | None:
    """--partition I/N as (I, N)."""
    if not text:
        return None
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match or int(match.group(1)) >= int(match.group(2)):
        raise AuditInputError("--partition", f"{text!r} is not I/N with 0 <= I < N", "e.g. 0/4")
    return int(match.group(1)), int(match.group(2))


SMALL_INPUT_BYTES = 4 << 20
"""Inputs smaller than this in all (a capture, a sample) are audited on polars' in-memory
engine: their audit is a couple of thousand queries of a few rows each, and polars' own choice
of engine (`auto`) runs each as the streaming engine does, at several times the cost of the
in-memory one (a query of 10 rows, measured: 50-275 us in memory, 130-600 us on `auto`; the
seed sample's audit, warm: 0.31 s against 0.35 s)."""
ONE_CORE_BYTES = 48 << 20
"""Inputs smaller than this in all, as their audit's work counts them (`_work`: up to a server
log of 5k-6k runs, a database of about 4k), are audited on one polars thread, on one core
(`_on_one_core`): their queries are too small for the pool's threads to share out, and waking
a thread for each costs CPU time. Measured in turn on two cores, CPU and wall time, one core
against every core (medians): the seed sample 8% less CPU; a 4k-run json log (40 MB) 19% less
CPU and 6% less wall time, an 8k-run standard log (63 MB) 13% less CPU but 6% more wall time; a
2k-run database (93 MB) 12% less CPU, a 4k-run one (185 MB) 16% less, both the same wall time,
an 8k-run one (371 MB) 6% less CPU but 13% more wall time. Larger inputs keep every core and
polars' own choice of engine."""
SQLITE_WORK_SHARE = 4
"""A SQLite database counts a quarter of its size (`_work`): its pages hold indexes, free space
and JSON documents the audit's SQL reduces before polars sees them, so each of its bytes is 3-5
times less of the audit's work than a log's (2k runs: 93 MB, 1.8 s of CPU, against the 16 MB
standard log's 0.9 s; 16k runs: 748 MB, 7.7 s, against 127 MB, 6.7 s)."""
QUIET_SAMPLES = 8
QUIET_WINDOW_BYTES = 64 << 10
"""A plain log's lines are looked at in QUIET_SAMPLES windows of this many bytes spread over it
(a gzip log's: the first QUIET_SAMPLES windows' worth it decompresses to) when the inputs are
over ONE_CORE_BYTES: the share of them that are quiet is taken to be the whole log's (`_quiet`).
At most QUIET_SAMPLED_FILES logs, the largest first: 4 MiB read at most."""
QUIET_SAMPLED_FILES = 8
_SMALL_INPUT_ENTRIES = 1_000  # a folder of more files than this is not looked through first
_ONE_THREAD = {"POLARS_MAX_THREADS": "1"}
_SMALL_INPUT_POLARS = {**_ONE_THREAD, "POLARS_ENGINE_AFFINITY": "in-memory"}
_WORDS = tuple(word.encode() for word in MATTER_WORDS)


def polars_for_small_inputs(sources: tuple[str, ...]) -> None:
    """Size polars' thread pool and choose its engine for `sources` before polars is imported
    (it reads POLARS_MAX_THREADS then, once): one thread on one core when every source is a
    local file or folder and their audit's work (`_work`, less the quiet lines of large logs:
    `_quiet`) is less than ONE_CORE_BYTES, and the in-memory engine too under
    SMALL_INPUT_BYTES; a pool or an engine the user chose, and a URL or standard input (whose
    size is not known), leave them as they are. Only in a process that ends with its command
    (the console script: analyzer.collector.ENDS_WITH_COMMAND): a test's runner or a notebook
    calling the command in its own process keeps its environment and its cores."""
    if not collector.ENDS_WITH_COMMAND:
        return
    if "polars" in sys.modules or not sources or _SMALL_INPUT_POLARS.keys() <= os.environ.keys():
        return
    files = _local_files(sources)
    if files is None:
        return
    works = [(path, *_work(path, size)) for path, size in files]
    total = sum(work for _, work, _ in works)
    left = ONE_CORE_BYTES - total
    logs = sorted(
        (
            (work, path, kind == "gzip")
            for path, work, kind in works
            if kind != "sqlite" and work >= QUIET_WINDOW_BYTES
        ),
        reverse=True,  # the largest first
    )[:QUIET_SAMPLED_FILES]
    unsampled = sum(work for work, _, _ in logs)
    for work, path, gzipped in logs:
        if left > 0 or left + unsampled <= 0:  # fits, or cannot fit were the rest all quiet
            break
        unsampled -= work
        left += _quiet(path, work, gzipped)
    if left <= 0:
        return
    small = total < SMALL_INPUT_BYTES  # the quiet lines too: what is read
    for name, value in (_SMALL_INPUT_POLARS if small else _ONE_THREAD).items():
        os.environ.setdefault(name, value)
    if os.environ["POLARS_MAX_THREADS"] == "1":
        _on_one_core()


def _on_one_core() -> None:
    """Every thread of this process kept on the core it runs on (analyzer.cores: the seed
    sample's audit took 0.53-0.57 s of CPU on two cores against 0.44-0.46 s on one, its wall
    time as much less); its pool's threads, started later, take it on."""
    if (core := cores.one_core()) is not None:
        cores.keep_to(core)


PARTITIONED_BYTES = 1 << 30
"""A SQLite database larger than this is audited in partitions unless told otherwise
(`default_partitions`): one process holds a whole database's mapped tables, about as much
memory as the file's size (16k runs: 750 MB, 700 MB peak; 100k runs: 4.7 GB, 4.5 GB peak)."""
PARTITION_BYTES = 200 << 20
"""The share of a database each default partition takes. Fewer, larger partitions cost less
CPU (each reads, maps and masks the tables every partition shares again) at the same peak,
which the learning and the merge set: 100k runs (4.7 GB), two runs each in turn (2026-12-08),
in 24 partitions 77-78 s of CPU and 951-958 MB peak, in 32 80-81 s and 927-939 MB, in 48 78-80 s
and 967-984 MB, in 64 84-89 s and 939-947 MB; one run each, at a busier moment, in 16 80 s and
999 MB, in 8 82 s and 1,244 MB."""


def default_partitions(sources: tuple[str, ...]) -> int | None:
    """How many partitions an audit of `sources` given no --partitions, --workers or --cluster
    takes: one for every PARTITION_BYTES when they are one local SQLite database alone, over
    PARTITIONED_BYTES; None (one process) for anything else. A log, an export, a URL or
    standard input holds runs every partition would read whole (assemble.refuse_unsplit);
    several databases are named as servers apart by the runs each partition holds of them
    (servers.assign_servers: one that holds none there joins another of its folder), so their
    partitions may not name them as one process does."""
    files = _local_files(sources)
    if files is None or len(files) != 1:
        return None
    [(path, size)] = files
    if size <= PARTITIONED_BYTES or _work(path, size)[1] != "sqlite":
        return None
    return -(-size // PARTITION_BYTES)


def _local_files(sources: tuple[str, ...]) -> list[tuple[Path, int]] | None:
    """Every file of `sources` with its size (a folder looked through), or None when one is
    not a local file or folder, or a folder too large to look through (`_walked`)."""
    files: list[tuple[Path, int]] = []
    entries = [_SMALL_INPUT_ENTRIES]
    if not all(_walked(Path(source), files, entries) for source in sources):
        return None
    return files


def _walked(path: Path, files: list[tuple[Path, int]], entries: list[int]) -> bool:
    """The files at `path` (a file, or a folder's, looked through) added to `files` with their
    sizes, taking each entry out of `entries`; False for what is not a local file or folder, a
    symbolic link in a folder, a folder of more entries than are left, or what cannot be
    looked at."""
    try:
        if path.is_file():
            files.append((path, path.stat().st_size))
            return True
        if not path.is_dir():
            return False
        with os.scandir(path) as found:
            for entry in found:
                entries[0] -= 1
                if entries[0] < 0 or entry.is_symlink():
                    return False
                if not _walked(Path(entry.path), files, entries):
                    return False
    except OSError:
        return False
    return True


def _work(path: Path, size: int) -> tuple[int, str]:
    """The bytes a file of `size` counts in the budget, and what its first bytes say it is
    ("sqlite", "gzip" or "plain"): a SQLite database its size over SQLITE_WORK_SHARE; a gzip
    file the size it decompresses to, as its trailer says it (ISIZE: of its last member, modulo
    4 GiB; at least its own size), since the audit works on those bytes (a 16k-run standard
    log, 127 MB, is 8 MB gzipped: on one core it took 14% more wall time); any other file its
    size. A file shorter than SQLITE_MAGIC can be neither and is not opened (a folder of many
    empty files costs their stat alone)."""
    if size < len(SQLITE_MAGIC):
        return size, "plain"
    try:
        with path.open("rb") as file:
            head = file.read(len(SQLITE_MAGIC))
            if head == SQLITE_MAGIC:
                return size // SQLITE_WORK_SHARE, "sqlite"
            if head.startswith(GZIP_MAGIC) and size >= 18:  # a header and a trailer at least
                file.seek(-4, os.SEEK_END)
                return max(size, int.from_bytes(file.read(4), "little")), "gzip"
    except OSError:
        pass
    return size, "plain"


def _quiet(path: Path, work: int, gzipped: bool) -> int:
    """How many of a log's `work` bytes are quiet lines, estimated from samples of its lines
    (QUIET_SAMPLES windows): a standard, json or rich record's start that holds none of
    MATTER_WORDS and no escape byte, the lines the log's reader sets aside by the thousand,
    counted and not classified (analyzer.sources.logs.quiet.quiet_records). They do not count in
    the budget: a chunk of them is a few small queries one after the other, which a pool of
    threads cannot share out and only pays for by waking its threads. A busy server's log of
    access lines keeps one core (measured in turn on two cores, medians of 8: the 2k-run log
    padded to 1 GB with them, 16 MB of lifecycle lines, 15% less CPU and 3% less wall time than
    on every core; padded to 300 MB, 13% and 2%); a log of more lifecycle lines than the budget
    does not, however many quiet lines are around them (the 8k-run log, 63 MB of them, padded
    to 890 MB: on one core 11% less CPU but 3% more wall time). 0 for a file of no lines, or
    one that cannot be read."""
    whole = quiet = 0
    try:
        for window, first in _windows(path, gzipped):
            start = 0 if first else window.find(b"\n") + 1
            end = window.rfind(b"\n") + 1
            if end > start:
                whole += end - start
                quiet += _quiet_bytes(window[start:end])
    except (OSError, zlib.error):
        return 0
    return work * quiet // whole if whole else 0


def _quiet_bytes(text: bytes) -> int:
    """The bytes of the quiet lines of `text` (whole lines): every line that opens as a
    standard, json or rich record, less those that hold a word or an escape byte (found by
    searching for each, not by looking at every line)."""
    start_of, line_of = _record_patterns()
    quiet = sum(map(len, line_of.findall(text)))
    if not quiet:
        return 0
    noisy = set()
    for word in (*_WORDS, b"\x1b"):
        at = text.find(word)
        while at >= 0:  # `text` ends with a line break: every word's line ends before it
            noisy.add(text.rfind(b"\n", 0, at) + 1)
            at = text.find(word, text.index(b"\n", at) + 1)
    for start in noisy:
        if start_of.match(text, start):
            quiet -= text.find(b"\n", start) + 1 - start
    return quiet


@cache
def _record_patterns() -> tuple[re.Pattern[bytes], re.Pattern[bytes]]:
    """A standard record's start (its level, a space, a digit), a json one's (its time's key
    and a digit) or a rich one's of no printed time (ten spaces, its level as wide as the
    column, a logger's first letter), and a whole line opening so: compiled when a log is
    sampled, not at every command's start."""
    levels = "|".join(LEVEL_NAMES).encode()
    columns = "|".join(RICH_LEVEL_COLUMNS).encode()
    start = rb'(?:(?:%s) \d|\{"timestamp": "\d| {10} (?:%s) [A-Za-z_])' % (levels, columns)
    return re.compile(start), re.compile(rb"^" + start + rb"[^\n]*\n", re.MULTILINE)


def _windows(path: Path, gzipped: bool) -> Iterator[tuple[bytes, bool]]:
    """QUIET_SAMPLES windows of a log's text, each with whether it opens at a line's start: a
    plain file's spread over it, a gzip file's the first it decompresses to."""
    with path.open("rb") as file:
        if gzipped:
            decoder = zlib.decompressobj(wbits=31)
            text = b""
            wanted = QUIET_SAMPLES * QUIET_WINDOW_BYTES
            while len(text) < wanted and (block := file.read(QUIET_WINDOW_BYTES)):
                # capped at what is wanted: the input it leaves is never needed
                text += decoder.decompress(block, wanted - len(text))
                if decoder.eof:
                    break
            yield text, True
            return
        size = file.seek(0, os.SEEK_END)
        step = max(size - QUIET_WINDOW_BYTES, 0) // (QUIET_SAMPLES - 1)
        for number in range(QUIET_SAMPLES if step else 1):
            file.seek(number * step)
            yield file.read(QUIET_WINDOW_BYTES), number == 0
