"""Read dstack server logs into ``LOG_RECORDS_SCHEMA`` rows, whatever captured them.

The server writes its log to stdout only (reference 1 and 9.2) in one of three layouts: ``rich``
(the default: time-only column, message folded at the console width), ``standard`` (one line
per record, tracebacks below it) or ``json`` (python-json-logger, one object per line). What an
operator hands over is whatever captured stdout: a plain file, ``docker logs --timestamps`` or
``kubectl logs --timestamps`` output, ``journalctl -o json``, rotated and gzipped copies. All of
it is recognised by content, never by file name, and parsed with vectorised polars expressions
(no Python loop per line).

How lines are classified (each physical line on its own, then in sequence):

- standard and json lines describe themselves, so they are records wherever they occur;
- a rich record starts with ``[HH:MM:SS] LEVEL`` or 11 spaces + LEVEL and owns the following
  lines that start with 20 spaces (the folded message column);
- a standard record owns the following lines that do not start a record (tracebacks,
  multi-line messages) until a line looks damaged (control bytes, a broken record start);
- a json record owns nothing after it.

So a capture that mixes formats (a server restarted with another ``DSTACK_SERVER_LOG_FORMAT``
into the same docker log) yields the records of every format, each row tagged with its own
format; ``LogRead.format`` names the majority and ``damage`` says that formats were mixed.
Blank lines between records and the start-up logo are irrelevant; every other line is
unparsed. Every physical line is counted exactly once:
``sum(records.line_count) + lines_irrelevant + unparsed.height == lines_total``.
"""

from __future__ import annotations

import re
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analyzer.model import LOG_RECORDS_SCHEMA, UTC_TIME, conform

UNPARSED_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.String(),
    "line": pl.Int64(),  # 1-based physical line
    "text": pl.String(),  # the line as read (for journald: the whole journal entry)
}

SNIFF_BYTES = 64 * 1024

_LEVELS = "DEBUG|INFO|WARNING|ERROR|CRITICAL"
# standard: %(levelname)s %(asctime)s.%(msecs)03d %(name)s %(message)s (reference 9.2); the
# message is sliced off after the match.
_STD_RE = (
    rf"^(?P<std_level>{_LEVELS}) "
    r"(?P<std_ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) (?P<std_logger>\S+)(?: |$)"
)
# rich: 10-char time column (or 10 spaces when the time repeats), space, 8-char level, space.
_RICH_RE = (
    r"^(?:\[(?P<r_time>\d\d:\d\d:\d\d)\]| {10}) "
    r"(?P<r_level>DEBUG   |INFO    |WARNING |ERROR   |CRITICAL)(?: |$)"
)
_RICH_LOGGER_RE = r"(?s)^(?P<rl_logger>[A-Za-z_][\w.]*):\d+(?:\s(?P<rl_msg>.*))?$"
_RICH_INDENT = 20  # time (10) + space + level (8) + space
# docker/kubectl --timestamps: RFC 3339 (docker trims trailing zeros of the nanoseconds).
_DOCKER_PREFIX = r"^-?\d+-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) ?"
_DOCKER_RE = (
    r"(?s)^(?P<d_time>-?\d+-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d))"
    r"(?: (?P<d_rest>.*))?$"
)
_JOURNAL_RE = r'^\s*\{.*"__REALTIME_TIMESTAMP"\s*:'
_ANSI_RE = r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]"
# A line that cannot be a traceback or message continuation: control bytes (NUL, binary
# junk) or the beginning of a record that did not parse (a line cut while being written).
_SUSPECT_RE = (
    r"[\x00-\x08\x0b-\x1f\x7f]"
    rf"|^(?:(?:{_LEVELS}) -?\d|\{{\s*\"|\[\d\d:\d\d| {{10}} (?:{_LEVELS}) )"
)
# Lines that open a part of a Python traceback (used to restore newlines in folded rich text).
_TRACEBACK_PART_RE = (
    r"^(?:Traceback \(most recent call last\):|During handling of the above exception|"
    r"The above exception was the direct cause|"
    r"[A-Za-z_][\w.]*(?:Error|Exception|Warning|Exit|Interrupt|Group)\b(?::|$))"
)
_LONE_SURROGATE_RE = r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}"
_STARTUP_RE = (
    r"^(?:The admin token is|The dstack server|The server is running|Applying |"
    r"Initializing the default configuration|Initialized the default configuration|"
    r"Configured the )"
)

# The start-up logo is printed with console.print, outside logging, in every format
# (src/dstack/_internal/server/app.py _print_dstack_logo): box-drawing art up to 0.20.6,
# ASCII art from 0.20.7. Compared after trailing whitespace is removed.
LOGO_LINES = (
    "╱╱╭╮╱╱╭╮╱╱╱╱╱╱╭╮",
    "╱╱┃┃╱╭╯╰╮╱╱╱╱╱┃┃",
    "╭━╯┣━┻╮╭╋━━┳━━┫┃╭╮",
    "┃╭╮┃━━┫┃┃╭╮┃╭━┫╰╯╯",
    "┃╰╯┣━━┃╰┫╭╮┃╰━┫╭╮╮",
    "╰━━┻━━┻━┻╯╰┻━━┻╯╰╯",
    "╭━━┳━━┳━┳╮╭┳━━┳━╮",
    "┃━━┫┃━┫╭┫╰╯┃┃━┫╭╯",
    "┣━━┃┃━┫┃╰╮╭┫┃━┫┃",
    "╰━━┻━━┻╯╱╰╯╰━━┻╯",
    "     _     _             _",
    "  __| |___| |_ __ _  ___| | __  ___  ___ _ ____   _____ _ __",
    r" / _` / __| __/ _` |/ __| |/ / / __|/ _ \ '__\ \ / / _ \ '__|",
    r"| (_| \__ \ || (_| | (__|   <  \__ \  __/ |   \ V /  __/ |",
    r" \__,_|___/\__\__,_|\___|_|\_\ |___/\___|_|    \_/ \___|_|",
)

_MAX_CLOCK_NOTES = 10
_ROLLOVER_STEP = 3600  # seconds: a rich time going back further than this is the next day


@dataclass
class LogRead:
    """One log file read: its records, and an account of every physical line."""

    path: str  # display path as given (file path, "-" for stdin, or the rotated member's path)
    format: str | None  # "rich" | "standard" | "json" | None (nothing recognisable)
    wrapper: str | None  # "docker" (docker/kubectl --timestamps) | "journald" | None
    records: pl.DataFrame  # LOG_RECORDS_SCHEMA, one row per log record
    lines_total: int  # physical lines read (journald: journal entries)
    lines_irrelevant: int  # recognised but not records: blank lines, the start-up logo
    unparsed: pl.DataFrame  # UNPARSED_SCHEMA: lines that are neither
    damage: list[str]  # human-readable notes on what was wrong with the input
    rich_width: int | None  # detected console width for rich


# ---------------------------------------------------------------------------------------------
# public API


def sniff_log(head: bytes) -> bool:
    """True when these first bytes look like a dstack server log (any format or wrapper).

    Used to route unknown files: it needs a dstack-specific line (a standard or json record, a
    rich record with dstack's ``logger:lineno`` prefix, a start-up line or the logo) and at least
    half of the non-blank lines recognised, so a document quoting one log line is not a log.
    """
    head = head[:SNIFF_BYTES]
    if head.startswith(b"\x1f\x8b"):
        head = _gunzip_prefix(head)
    cut = head.rfind(b"\n")
    if 0 <= cut < len(head) - 1:
        head = head[: cut + 1]  # drop a partial last line
    if not head.strip():
        return False
    read, frame = _read(head, "-")
    if read.records.height == 0 and not frame["logo"].any():
        return False
    recognised = int(read.records["line_count"].sum() or 0) + int(frame["logo"].sum())
    non_blank = int((frame["raw"].str.strip_chars() != "").sum())
    if recognised * 2 < non_blank:
        return False
    rec = read.records
    dstack_like = (
        rec["format"].is_in(["standard", "json"])
        | rec["logger"].is_not_null()
        | rec["message"].str.contains(_STARTUP_RE)
    ).fill_null(False)
    return bool(dstack_like.any()) or bool(frame["logo"].any())


def read_log(path: str | Path, *, display_path: str | None = None) -> LogRead:
    """Read one log file ("-" = stdin); gzip is recognised by its magic bytes, not its name."""
    if str(path) == "-":
        data = sys.stdin.buffer.read()
        shown = display_path or "-"
    else:
        data = Path(path).read_bytes()
        shown = display_path if display_path is not None else str(path)
    return read_log_bytes(data, shown)


def read_log_bytes(data: bytes, display_path: str) -> LogRead:
    """Parse the bytes of one log (plain or gzip); never raises on bad input."""
    return _read(data, display_path)[0]


def rotated_set(path: Path) -> list[Path]:
    """The rotated family of a log, oldest first: ``[p.N(.gz), ..., p.1, p]``.

    Ordered by the numeric suffix (logrotate / RotatingFileHandler numbering: higher = older),
    not by name or mtime, which copies do not preserve. Missing members are simply absent.
    """
    path = Path(path)
    pattern = re.compile(re.escape(path.name) + r"\.(\d+)(\.gz)?$")
    members: list[tuple[int, str, Path]] = []
    if path.parent.is_dir():
        for candidate in path.parent.iterdir():
            match = pattern.fullmatch(candidate.name)
            if match and candidate.is_file():
                members.append((int(match.group(1)), candidate.name, candidate))
    members.sort(key=lambda member: (-member[0], member[1]))
    result = [member[2] for member in members]
    if path.is_file():
        result.append(path)
    return result


# ---------------------------------------------------------------------------------------------
# bytes -> physical lines


def _gunzip(data: bytes) -> tuple[bytes, str | None]:
    """Decompress gzip (multi-member too) as far as it goes; the second value says what broke."""
    out: list[bytes] = []
    rest = data
    problem: str | None = None
    chunk = 1 << 16
    while rest:
        decoder = zlib.decompressobj(wbits=31)
        try:
            for start in range(0, len(rest), chunk):
                out.append(decoder.decompress(rest[start : start + chunk]))
                if decoder.eof:
                    break
        except zlib.error as exc:
            problem = f"corrupt gzip stream ({exc})"
            break
        if not decoder.eof:
            problem = "truncated gzip stream"
            break
        rest = decoder.unused_data
        if rest and not rest.startswith(b"\x1f\x8b"):
            if rest.strip(b"\x00"):
                problem = f"{len(rest)} bytes of trailing junk after the gzip stream ignored"
            break
    return b"".join(out), problem


def _gunzip_prefix(head: bytes) -> bytes:
    """Decompress the start of a gzip file for sniffing (the stream is cut by design)."""
    decoder = zlib.decompressobj(wbits=31)
    try:
        return decoder.decompress(head, SNIFF_BYTES)
    except zlib.error:
        return b""


def _split_lines(data: bytes) -> tuple[pl.Series, bool]:
    """Physical lines (``\\n``-separated, one trailing ``\\r`` removed, a BOM dropped) and
    whether the UTF-8 was bad (bad bytes become U+FFFD)."""
    if not data:
        return pl.Series("raw", [], dtype=pl.String), False
    try:
        data.decode("utf-8")
        invalid = False
    except UnicodeDecodeError:
        invalid = True
    body = data.removeprefix(b"\xef\xbb\xbf")
    raw = _split_with_csv_reader(body)
    return (raw if raw is not None else _split_text(body)), invalid


def _split_with_csv_reader(body: bytes) -> pl.Series | None:
    """Fast path: polars' CSV reader, with a separator absent from the data and no quoting,
    splits lines in parallel, several times faster than ``str.split``. None when it cannot be
    used or its row count disagrees with the newline count."""
    # It would drop a BOM, and it decompresses data that opens like zlib, zstd or gzip.
    if not body or b"\x1f" in body or body.startswith((b"\xef\xbb\xbf", b"x", b"(\xb5/\xfd")):
        return None
    expected = body.count(b"\n") + (0 if body.endswith(b"\n") else 1)
    try:
        raw = pl.read_csv(
            body,
            has_header=False,
            separator="\x1f",
            quote_char=None,
            new_columns=["raw"],
            encoding="utf8-lossy",
            infer_schema=False,
            raise_if_empty=False,
        )["raw"].fill_null("")
    except (pl.exceptions.PolarsError, ValueError, OSError):
        return None
    return raw if raw.len() == expected else None


def _split_text(body: bytes) -> pl.Series:
    """Fallback: decode (bad bytes replaced) and split the text in polars."""
    text = body.decode("utf-8", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]
    return pl.Series("raw", [text]).str.split("\n").explode().str.strip_suffix("\r")


def _in_range(time: pl.Expr) -> pl.Expr:
    """A parsed time, or null when its year is outside 1-9999 (``0000-...``, ``-001-...``):
    such a line is no record (it is quarantined), since no report could show its time."""
    return pl.when(time.dt.year().is_between(1, 9999)).then(time)


# ---------------------------------------------------------------------------------------------
# wrappers: docker/kubectl --timestamps, journalctl -o json


def _unwrap(raw: pl.Series, damage: list[str]) -> tuple[pl.DataFrame, str | None]:
    """Detect the wrapper by content (a majority of non-blank lines) and peel it off.

    Returns line, raw, content (the log line inside the wrapper), wrapper_time (UTC) and
    wrapped (this line carried the wrapper).
    """
    frame = pl.DataFrame({"raw": raw}).with_row_index("line", offset=1)
    frame = frame.with_columns(pl.col("line").cast(pl.Int64))
    non_blank = int((raw.str.strip_chars() != "").sum())
    if non_blank:
        if int(raw.str.contains(_JOURNAL_RE).sum()) * 2 > non_blank:
            return _unwrap_journald(frame, damage), "journald"
        if int(raw.str.contains(_DOCKER_PREFIX).sum()) * 2 > non_blank:
            return _unwrap_docker(frame, damage), "docker"
    frame = frame.with_columns(
        content=pl.col("raw"),
        wrapper_time=pl.lit(None, UTC_TIME),
        wrapped=pl.lit(False),
    )
    return frame, None


def _unwrap_docker(frame: pl.DataFrame, damage: list[str]) -> pl.DataFrame:
    """``docker logs -t`` / ``kubectl logs --timestamps``: an RFC 3339 time (Z or an offset)
    and one space before each line; the time is kept as UTC."""
    frame = frame.with_columns(pl.col("raw").str.extract_groups(_DOCKER_RE).alias("d")).unnest("d")
    stamp = pl.col("d_time").str.replace(r"Z$", "+00:00")
    frame = (
        frame.with_columns(
            wrapper_time=_in_range(
                stamp.str.to_datetime("%Y-%m-%dT%H:%M:%S%.f%:z", time_unit="us", strict=False)
            ).dt.convert_time_zone("UTC"),
        )
        .with_columns(
            wrapped=pl.col("wrapper_time").is_not_null(),
        )
        .with_columns(
            content=pl.when(pl.col("wrapped"))
            .then(pl.col("d_rest").fill_null(""))
            # a prefix whose time is out of range: a control byte makes it no continuation
            .when(pl.col("d_time").is_not_null())
            .then(pl.lit("\x00") + pl.col("raw"))
            .otherwise(pl.col("raw")),
        )
    )
    missing = frame.filter(~pl.col("wrapped") & (pl.col("raw").str.strip_chars() != "")).height
    if missing:
        damage.append(f"{missing} lines without the docker/kubectl timestamp prefix")
    return frame.drop("d_time", "d_rest")


def _unwrap_journald(frame: pl.DataFrame, damage: list[str]) -> pl.DataFrame:
    """``journalctl -o json``: MESSAGE is a string, or an array of bytes when it is not
    printable UTF-8 (invalid bytes, ANSI colour); __REALTIME_TIMESTAMP is epoch microseconds."""
    raw = pl.col("raw")
    is_entry = raw.str.contains(_JOURNAL_RE)
    frame = frame.with_columns(
        entry=is_entry,
        message=pl.when(is_entry).then(raw.str.json_path_match("$.MESSAGE")),
        as_bytes=is_entry & raw.str.contains(r'"MESSAGE"\s*:\s*\['),
        wrapper_time=pl.from_epoch(
            raw.str.json_path_match("$.__REALTIME_TIMESTAMP").cast(pl.Int64, strict=False),
            time_unit="us",
        ).dt.replace_time_zone("UTC"),
    )
    arrays = frame.filter(pl.col("as_bytes") & pl.col("message").is_not_null())
    if arrays.height:
        try:
            decoded, bad = _decode_byte_arrays(arrays["message"])
        except (pl.exceptions.PolarsError, ValueError):  # not an array of integers
            decoded, bad = pl.Series("bytes_text", [None] * arrays.height, pl.String), 0
        fixed = pl.DataFrame({"line": arrays["line"], "bytes_text": decoded})
        frame = frame.join(fixed, on="line", how="left", maintain_order="left").with_columns(
            message=pl.when(pl.col("as_bytes"))
            .then(pl.col("bytes_text"))
            .otherwise(pl.col("message"))
        )
        if bad:
            damage.append(f"invalid UTF-8 in {bad} journal entries (MESSAGE byte arrays)")
    null_message = frame.filter(pl.col("entry") & pl.col("message").is_null()).height
    if null_message:
        damage.append(
            f"{null_message} journal entries without a MESSAGE text (journalctl -o json prints "
            "null for fields over 4096 bytes unless --all is given)"
        )
    foreign = frame.filter(~pl.col("entry") & (raw.str.strip_chars() != "")).height
    if foreign:
        damage.append(f"{foreign} lines that are not journal entries")
    frame = frame.with_columns(
        content=pl.when(pl.col("entry")).then(pl.col("message")).otherwise(raw),
        wrapped=pl.col("entry"),
    )
    return frame.select("line", "raw", "content", "wrapper_time", "wrapped")


def _decode_byte_arrays(arrays: pl.Series) -> tuple[pl.Series, int]:
    """JSON byte arrays -> text (invalid UTF-8 replaced), in one decode of one buffer.

    Entries are joined with ``\\n`` (a newline byte inside an entry becomes a space: journald's
    stdout stream already splits lines there) so the buffer splits back into the same entries.
    """
    element = pl.element()
    values = arrays.str.json_decode(pl.List(pl.Int64))
    cleaned = pl.DataFrame({"v": values}).select(
        pl.concat_list(
            [
                pl.col("v").list.eval(
                    pl.when(element == 10)
                    .then(32)
                    .when(element.is_between(0, 255))
                    .then(element)
                    .otherwise(63)
                ),
                pl.lit(10),
            ]
        ).alias("v")
    )["v"]
    blob = bytes(cleaned.explode().fill_null(63).to_list())
    text = blob.decode("utf-8", errors="replace")
    series = pl.Series("bytes_text", text.split("\n")[:-1], dtype=pl.String)
    bad = int(series.str.contains("\ufffd", literal=True).sum()) if "\ufffd" in text else 0
    return series, bad


# ---------------------------------------------------------------------------------------------
# classification and records


def _read(data: bytes, display_path: str) -> tuple[LogRead, pl.DataFrame]:
    """Parse bytes; also return the per-line frame (for sniffing)."""
    damage: list[str] = []
    gz_problem: str | None = None
    if data.startswith(b"\x1f\x8b"):
        unpacked, gz_problem = _gunzip(data)
        if not unpacked and gz_problem:
            damage.append(f"gzip magic bytes but no readable gzip stream ({gz_problem}); read raw")
            gz_problem = None
        else:
            data = unpacked
    raw, invalid_utf8 = _split_lines(data)
    lines_total = raw.len()
    if gz_problem:
        damage.append(f"{gz_problem} after {lines_total} lines")
    if invalid_utf8:
        bad = int(raw.str.contains("\ufffd", literal=True).sum())
        damage.append(f"invalid UTF-8 on {bad} lines (decoded with replacement characters)")
    nul = int(raw.str.contains("\x00", literal=True).sum())
    if nul:
        damage.append(f"NUL bytes on {nul} lines")

    frame, wrapper = _unwrap(raw, damage)
    frame = _classify(frame)
    records, rich_width = _records(frame, display_path, wrapper, damage)

    unparsed = frame.filter(pl.col("kind") == "unparsed").select(
        pl.lit(display_path, pl.String).alias("file"), "line", pl.col("raw").alias("text")
    )
    irrelevant = int((frame["kind"] == "irrelevant").sum())
    if (
        lines_total
        and unparsed.height
        and unparsed["line"][-1] == lines_total
        and data[-1:] != b"\n"
    ):
        damage.append(f"last line {lines_total} is cut (no line break at the end) and unparsed")

    counts = records["format"].value_counts() if records.height else None
    fmt: str | None = None
    if counts is not None:
        by_format = dict(zip(counts["format"].to_list(), counts["count"].to_list(), strict=True))
        fmt = max(("standard", "json", "rich"), key=lambda name: by_format.get(name, 0))
        if len(by_format) > 1:
            listed = ", ".join(f"{by_format[name]} {name}" for name in sorted(by_format))
            damage.append(f"mixed formats: {listed} records")
    read = LogRead(
        path=display_path,
        format=fmt,
        wrapper=wrapper,
        records=records,
        lines_total=lines_total,
        lines_irrelevant=irrelevant,
        unparsed=unparsed,
        damage=damage,
        rich_width=rich_width,
    )
    return read, frame


def _classify(frame: pl.DataFrame) -> pl.DataFrame:
    """Per line: which format starts a record here, and whether the line belongs to one.

    Sequence rules use global running sums instead of per-record windows: a record's lines are
    contiguous, so "a bad line since this record started" is the running count of bad lines
    minus its value at the record start.
    """
    content = pl.col("content")
    if frame.height and bool(frame["content"].str.contains("\x1b", literal=True).any()):
        frame = frame.with_columns(content.str.replace_all(_ANSI_RE, ""))
    frame = frame.with_columns(
        content.str.extract_groups(_STD_RE).alias("s"),
        content.str.extract_groups(_RICH_RE).alias("r"),
        blank=(content.str.strip_chars() == "").fill_null(False),
        logo=content.str.strip_chars_end().is_in(LOGO_LINES).fill_null(False),
    ).unnest("s", "r")
    frame = _json_fields(frame)
    head_len = (
        pl.col("std_level").str.len_chars()
        + pl.col("std_ts").str.len_chars()
        + pl.col("std_logger").str.len_chars()
        + 2
    )
    frame = frame.with_columns(
        std_time=_in_range(
            pl.col("std_ts").str.to_datetime("%Y-%m-%dT%H:%M:%S%.3f", time_unit="ms", strict=False)
        ),
        # the message is what follows "LEVEL time logger " (sliced, cheaper than a capture)
        std_msg=content.str.slice(head_len).str.strip_prefix(" "),
        json_time=_in_range(
            pl.col("j_ts")
            .str.replace(",", ".", literal=True)
            .str.to_datetime("%Y-%m-%d %H:%M:%S%.3f", time_unit="ms", strict=False)
        ),
        rich_tod=pl.col("r_time").str.to_time("%H:%M:%S", strict=False),
    )
    is_std = pl.col("std_time").is_not_null()
    is_json = (
        pl.col("json_time").is_not_null()
        & pl.col("j_level").is_not_null()
        & pl.col("j_msg").is_not_null()
    )
    is_rich = pl.col("r_level").is_not_null() & (
        pl.col("r_time").is_null() | pl.col("rich_tod").is_not_null()
    )
    frame = frame.with_columns(
        fmt=pl.when(is_std)
        .then(pl.lit("standard"))
        .when(is_json)
        .then(pl.lit("json"))
        .when(is_rich)
        .then(pl.lit("rich"))
    )
    start = pl.col("fmt").is_not_null()
    frame = frame.with_columns(
        start=start,
        rec_id=start.cast(pl.Int64).cum_sum(),
        rec_fmt=pl.col("fmt").forward_fill(),
    )
    accept = (
        pl.when(pl.col("rec_fmt") == "rich")
        .then(content.str.starts_with(" " * _RICH_INDENT) & ~pl.col("blank"))
        .when(pl.col("rec_fmt") == "standard")
        .then(~pl.col("blank") & ~pl.col("logo") & ~content.str.contains(_SUSPECT_RE))
        .otherwise(pl.lit(False))
        .fill_null(False)
    )
    bad = (~pl.col("start") & ~accept & ~pl.col("blank")).cast(pl.Int64).cum_sum()
    bad_at_start = pl.when(pl.col("start")).then(bad).forward_fill()
    frame = frame.with_columns(
        accept=accept,
        broken=((bad - bad_at_start) > 0).fill_null(True),
    )
    frame = frame.with_columns(
        cont=~pl.col("start") & pl.col("accept") & ~pl.col("broken") & (pl.col("rec_id") > 0)
    )
    # a blank line belongs to its record when a continuation of the same record follows it
    next_is_cont = (
        pl.when(pl.col("cont")).then(pl.lit(True)).when(pl.col("start")).then(pl.lit(False))
    ).backward_fill()
    blank_in = pl.col("blank") & ~pl.col("broken") & next_is_cont.fill_null(False)
    in_record = pl.col("start") | pl.col("cont") | blank_in
    return frame.with_columns(
        kind=pl.when(in_record)
        .then(pl.lit("record"))
        .when(pl.col("blank") | pl.col("logo"))
        .then(pl.lit("irrelevant"))
        .otherwise(pl.lit("unparsed"))
    )


def _json_fields(frame: pl.DataFrame) -> pl.DataFrame:
    """python-json-logger fields of lines that start with ``{`` (others get nulls).

    The message goes through a JSON parser (``json_path_match``, null when the line is not
    valid JSON, so it also validates the line); timestamp, level and logger never need escapes
    and come from a regex anchored at a key position; exc_info and stack_info are parsed only on
    the few lines that carry them.
    """
    names = ("j_ts", "j_level", "j_logger", "j_msg", "j_exc", "j_stack")
    candidates = frame.filter(pl.col("content").str.starts_with("{")).select("line", "content")
    if candidates.height == 0:
        return frame.with_columns([pl.lit(None, pl.String).alias(name) for name in names])
    content = pl.col("content")

    def plain(key: str) -> pl.Expr:
        return content.str.extract(rf'[{{,]\s*"{key}"\s*:\s*"([^"\\]*)"', 1)

    candidates = candidates.with_columns(
        j_ts=plain("timestamp"),
        j_level=plain("level"),
        j_logger=plain("logger"),
        j_msg=content.str.json_path_match("$.message"),
    )
    # A lone surrogate escape (\ud800) makes the whole object unreadable: retry those lines
    # with the escape replaced by U+FFFD.
    retry = pl.col("j_msg").is_null() & content.str.contains(_LONE_SURROGATE_RE)
    if bool(candidates.select(retry.any()).item()):
        patched = content.str.replace_all(_LONE_SURROGATE_RE, r"\\ufffd")
        candidates = candidates.with_columns(
            j_msg=pl.when(retry).then(patched.str.json_path_match("$.message")).otherwise("j_msg")
        )
    for name, key in (("j_exc", "exc_info"), ("j_stack", "stack_info")):
        has_key = content.str.contains(f'"{key}"', literal=True)
        subset = candidates.filter(has_key & pl.col("j_msg").is_not_null())
        if subset.height:
            values = subset.select("line", content.str.json_path_match(f"$.{key}").alias(name))
            candidates = candidates.join(values, on="line", how="left", maintain_order="left")
        else:
            candidates = candidates.with_columns(pl.lit(None, pl.String).alias(name))
    return frame.join(candidates.drop("content"), on="line", how="left", maintain_order="left")


def _rich_width(rows: pl.DataFrame) -> int:
    """Console width: the common raw length of rich lines (rich pads every line to the full
    width) when at least half the lines share it and none is longer; otherwise the trailing
    spaces were stripped and the longest line is the best estimate."""
    lengths = rows["content"].str.len_chars()
    stripped = rows["content"].str.strip_chars_end().str.len_chars()
    longest = int(stripped.max() or 0)
    common = int(lengths.mode().max() or 0)
    share = float((lengths == common).mean() or 0.0)
    if share >= 0.5 and common >= longest:
        return common
    return longest


def _rich_pieces(frame: pl.DataFrame, width: int) -> pl.DataFrame:
    """Message-column text of each rich line and the separator that re-joins it.

    rich (rich/_wrap.py divide_line) breaks a line at a space and drops that space when it
    falls beyond the width, and cuts a token longer than the whole column anywhere (the token
    then fills whole lines alone). Hard newlines of the message start new lines too. So, with
    W the message-column width and P the previous line of the record:
    - the line is blank or indented beyond column 20 -> a hard newline ("\\n");
    - P is a record's first line holding exactly ``logger:lineno`` at full width and this line
      does not go on with digits -> the path token fitted exactly and the space after it was
      dropped (" "); (a folded path would go on with the rest of the line number);
    - P fills W and is one token without spaces -> the fold of an over-long token ("");
    - P fills W otherwise -> a wrap whose space was dropped (" ");
    - the line opens a traceback part (``Traceback (most recent call last):``, ``XError: ...``,
      the chained-exception sentences) -> a hard newline ("\\n");
    - this line's first word would have fitted after P -> rich did not wrap here, the message
      had a newline ("\\n");
    - otherwise a wrap at a space (" ").
    Only whitespace can come out different from the original message: a word of exactly W
    characters alone on a line (taken as a fold), or runs of several spaces at a wrap.
    """
    column = max(width - _RICH_INDENT, 1)
    text = pl.col("content").str.slice(_RICH_INDENT)
    frame = frame.with_columns(vis=text.str.strip_chars_end())
    vis = pl.col("vis")
    body = vis.str.strip_chars_start()
    frame = frame.with_columns(
        vis_len=vis.str.len_chars().cast(pl.Int64),
        lead=(vis.str.len_chars() - body.str.len_chars()).cast(pl.Int64),
        has_space=body.str.contains(" ", literal=True),
        first_word=body.str.extract(r"^(\S*)", 1).str.len_chars().cast(pl.Int64),
        path_only=pl.col("start") & vis.str.contains(r"^[A-Za-z_][\w.]*:\d+$"),
        digit_first=vis.str.contains(r"^\d"),
        traceback_part=vis.str.contains(_TRACEBACK_PART_RE),
    )
    # rows are the record lines in file order; a start ignores its predecessor
    prev_len = pl.col("vis_len").shift(1)
    prev_space = pl.col("has_space").shift(1)
    prev_path_only = pl.col("path_only").shift(1)
    separator = (
        pl.when(pl.col("start"))
        .then(pl.lit(""))
        .when((pl.col("vis_len") == 0) | (pl.col("lead") > 0))
        .then(pl.lit("\n"))
        .when((prev_len >= column) & prev_path_only & ~pl.col("digit_first"))
        .then(pl.lit(" "))
        .when((prev_len >= column) & ~prev_space)
        .then(pl.lit(""))
        .when(prev_len >= column)
        .then(pl.lit(" "))
        .when(pl.col("traceback_part"))
        .then(pl.lit("\n"))
        .when(prev_len + 1 + pl.col("first_word") <= column)
        .then(pl.lit("\n"))
        .otherwise(pl.lit(" "))
    )
    return frame.with_columns(piece=separator + vis)


def _records(
    frame: pl.DataFrame, display_path: str, wrapper: str | None, damage: list[str]
) -> tuple[pl.DataFrame, int | None]:
    """One row per record: the start line's fields, the stitched message, the line count and,
    for rich, the carried-forward time and the day roll-overs; plus the detected rich width."""
    rows = frame.filter(pl.col("kind") == "record")
    if rows.height == 0:
        return pl.DataFrame(schema=LOG_RECORDS_SCHEMA), None

    rich_width: int | None = None
    rich_rows = rows.filter(pl.col("rec_fmt") == "rich")
    if rich_rows.height:
        rich_width = _rich_width(rich_rows.filter(~pl.col("blank")))
        rich_rows = _rich_pieces(rich_rows, rich_width).select("line", "piece")

    json_message = pl.col("j_msg")
    for extra in ("j_exc", "j_stack"):
        json_message = (
            pl.when(pl.col(extra).is_not_null())
            .then(pl.concat_str([json_message, pl.lit("\n"), pl.col(extra)]))
            .otherwise(json_message)
        )
    piece = (
        pl.when(pl.col("rec_fmt") == "json")
        .then(json_message)
        .when(pl.col("start"))
        .then(pl.col("std_msg").fill_null(""))
        .otherwise(pl.lit("\n") + pl.col("content"))
    )
    rows = rows.with_columns(piece=piece)
    if rich_rows.height:
        rows = rows.join(
            rich_rows.rename({"piece": "rich_piece"}), on="line", how="left", maintain_order="left"
        ).with_columns(
            piece=pl.when(pl.col("rec_fmt") == "rich")
            .then(pl.col("rich_piece"))
            .otherwise(pl.col("piece"))
        )

    start_fields = (
        "rec_id",
        "line",
        "fmt",
        "std_level",
        "std_logger",
        "std_time",
        "j_level",
        "j_logger",
        "json_time",
        "r_level",
        "rich_tod",
        "wrapper_time",
        "wrapped",
    )
    grouped = rows.filter(pl.col("start")).select(
        *start_fields, pl.col("piece").alias("message"), pl.lit(1, pl.Int64).alias("line_count")
    )
    # Only records with more than one line need stitching: group those rows (record rows are
    # contiguous, so a start followed by a row of the same record opens a multi-line one).
    multi = ~pl.col("start") | (pl.col("rec_id").shift(-1) == pl.col("rec_id")).fill_null(False)
    stitched = (
        rows.filter(multi)
        .group_by("rec_id", maintain_order=True)
        .agg(
            pl.len().cast(pl.Int64).alias("n_lines"),
            pl.col("piece").str.join("").alias("joined"),
        )
    )
    if stitched.height:
        grouped = grouped.join(
            stitched, on="rec_id", how="left", maintain_order="left"
        ).with_columns(
            message=pl.coalesce("joined", "message"),
            line_count=pl.coalesce("n_lines", "line_count"),
        )
    is_rich = pl.col("fmt") == "rich"
    grouped = grouped.with_columns(
        pl.when(is_rich).then(pl.col("message").str.extract_groups(_RICH_LOGGER_RE)).alias("rl")
    ).unnest("rl")

    # rich: carry the last printed time forward; a step back of more than an hour is the
    # next day, a smaller one a clock problem worth a note.
    tod = pl.when(is_rich).then(pl.col("rich_tod")).forward_fill().over("fmt")
    grouped = grouped.with_columns(tod=tod)
    seconds = (
        pl.col("tod").dt.hour().cast(pl.Int64) * 3600
        + pl.col("tod").dt.minute().cast(pl.Int64) * 60
        + pl.col("tod").dt.second().cast(pl.Int64)
    )
    step = (seconds - seconds.shift(1)).over("fmt")
    grouped = grouped.with_columns(
        rollover=(is_rich & (step < -_ROLLOVER_STEP)).fill_null(False),
        backwards=(is_rich & (step < 0) & (step >= -_ROLLOVER_STEP)).fill_null(False),
    )
    back_lines = grouped.filter(pl.col("backwards"))["line"].to_list()
    for line in back_lines[:_MAX_CLOCK_NOTES]:
        damage.append(f"clock went backwards at {display_path}:{line}")
    if len(back_lines) > _MAX_CLOCK_NOTES:
        damage.append(f"clock went backwards {len(back_lines) - _MAX_CLOCK_NOTES} more times")

    local_time = (
        pl.when(pl.col("fmt") == "standard")
        .then(pl.col("std_time"))
        .when(pl.col("fmt") == "json")
        .then(pl.col("json_time"))
    )
    records = grouped.select(
        pl.lit(display_path, pl.String).alias("file"),
        "line",
        "line_count",
        pl.col("fmt").alias("format"),
        pl.when(pl.col("wrapped")).then(pl.lit(wrapper, pl.String)).alias("wrapper"),
        local_time.alias("local_time"),
        pl.when(is_rich).then(pl.col("tod")).otherwise(local_time.dt.time()).alias("time_of_day"),
        pl.when(is_rich)
        .then(pl.col("rollover").cast(pl.Int64).cum_sum().over("fmt"))
        .alias("day_offset"),
        "wrapper_time",
        pl.when(pl.col("fmt") == "standard")
        .then(pl.col("std_level"))
        .when(pl.col("fmt") == "json")
        .then(pl.col("j_level"))
        .otherwise(pl.col("r_level").str.strip_chars_end())
        .alias("level"),
        pl.when(pl.col("fmt") == "standard")
        .then(pl.col("std_logger"))
        .when(pl.col("fmt") == "json")
        .then(pl.col("j_logger"))
        .otherwise(pl.col("rl_logger"))
        .alias("logger"),
        pl.when(is_rich & pl.col("rl_logger").is_not_null())
        .then(pl.col("rl_msg").fill_null(""))
        .otherwise(pl.col("message"))
        .alias("message"),
    )
    return conform(records, LOG_RECORDS_SCHEMA).collect(), rich_width
