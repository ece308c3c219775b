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

import io
import re
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import time
from pathlib import Path
from typing import BinaryIO

import polars as pl

from analyzer.model import LOG_RECORDS_SCHEMA, UTC_TIME, conform

UNPARSED_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.String(),
    "line": pl.Int64(),  # 1-based physical line
    "text": pl.String(),  # the line as read (for journald: the whole journal entry)
}

SNIFF_BYTES = 64 * 1024
# Reading streams: blocks of BLOCK_BYTES (compressed or plain) become chunks of about
# CHUNK_BYTES of whole lines, each parsed in columns and reduced before the next is read, so
# memory follows the chunk, not the log. A line longer than MAX_LINE_BYTES is never held: it is
# counted and quarantined by its place. 1 MiB is far above any line dstack writes (its longest
# are tracebacks and job specs of a few KiB; journald stores at most 48 KiB per line by default,
# docker splits its json-file lines at 16 KiB) and small beside a chunk, so a hostile line
# cannot grow memory.
BLOCK_BYTES = 256 * 1024
CHUNK_BYTES = 8 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
# The text of unparsed lines is kept for the quarantine file up to this much per log; past it,
# only their places are kept (the quarantine then points at the line in the file).
QUARANTINE_TEXT_BYTES = 64 * 1024 * 1024
QUARANTINE_NOT_KEPT = (
    f"[text not kept: past the {QUARANTINE_TEXT_BYTES >> 20} MiB of unparsed text kept per log; "
    "the line is at this place in the file]"
)
OVERLONG = "\x01"  # opens the stand-in of a line over MAX_LINE_BYTES (no record starts so)

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
    records: pl.DataFrame  # LOG_RECORDS_SCHEMA, one row per log record (empty when streamed)
    lines_total: int  # physical lines read (journald: journal entries)
    lines_irrelevant: int  # recognised but not records: blank lines, the start-up logo
    unparsed: pl.DataFrame  # UNPARSED_SCHEMA: lines that are neither (text null past the budget)
    damage: list[str]  # human-readable notes on what was wrong with the input
    rich_width: int | None  # detected console width for rich
    record_count: int = 0  # records read (also when they were streamed, not kept)


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
    stream = LogStream("-")
    chunks = list(stream.records([head]))
    rec = pl.concat(chunks) if chunks else pl.DataFrame(schema=LOG_RECORDS_SCHEMA)
    if rec.height == 0 and not stream.logo_lines:
        return False
    recognised = int(rec["line_count"].sum() or 0) + stream.logo_lines
    if recognised * 2 < stream.non_blank_lines:
        return False
    dstack_like = (
        rec["format"].is_in(["standard", "json"])
        | rec["logger"].is_not_null()
        | rec["message"].str.contains(_STARTUP_RE)
    ).fill_null(False)
    return bool(dstack_like.any()) or stream.logo_lines > 0


def read_log(path: str | Path, *, display_path: str | None = None) -> LogRead:
    """Read one log file ("-" = stdin) with all its records; gzip is recognised by its magic
    bytes, not its name. (The audit streams instead: see ``LogStream``.)"""
    if str(path) == "-":
        return _read_all(file_blocks(sys.stdin.buffer), display_path or "-")
    shown = display_path if display_path is not None else str(path)
    with Path(path).open("rb") as handle:
        return _read_all(file_blocks(handle), shown)


def read_log_bytes(data: bytes, display_path: str) -> LogRead:
    """Parse the bytes of one log (plain or gzip); never raises on bad input."""
    return _read_all(
        [data[i : i + BLOCK_BYTES] for i in range(0, len(data), BLOCK_BYTES)], display_path
    )


def _read_all(blocks: Iterable[bytes], display_path: str) -> LogRead:
    stream = LogStream(display_path)
    chunks = list(stream.records(blocks))
    records = pl.concat(chunks) if chunks else pl.DataFrame(schema=LOG_RECORDS_SCHEMA)
    return stream.result(records)


def detached(frame: pl.DataFrame) -> pl.DataFrame:
    """A copy that owns its text. A filtered string column still points into the whole
    chunk's buffers (polars' string views), so the few rows kept of a chunk would keep all of
    it alive; written out with plain (non-view) strings and read back, they hold their own."""
    buffer = io.BytesIO()
    frame.write_ipc(buffer, compat_level=pl.CompatLevel.oldest())
    buffer.seek(0)
    return pl.read_ipc(buffer)


def file_blocks(handle: BinaryIO) -> Iterator[bytes]:
    """A binary stream in blocks of BLOCK_BYTES."""
    while block := handle.read(BLOCK_BYTES):
        yield block


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


def _decoded(blocks: Iterable[bytes], problems: list[str]) -> Iterator[bytes]:
    """The log's bytes in bounded pieces: gzip (multi-member too) recognised by its magic
    bytes and decompressed as far as it goes (what broke goes to ``problems``), else as is."""
    blocks = iter(blocks)
    first = b""
    for block in blocks:
        first += block
        if len(first) >= 2:
            break
    if not first.startswith(b"\x1f\x8b"):
        if first:
            yield first
        yield from blocks
        return
    held: list[bytes] | None = [first]  # raw bytes, until the stream yields output
    produced = False
    for piece in _gunzip(_chain_first(first, blocks, held), problems):
        produced = True
        held = None
        yield piece
    if not produced and held is not None and problems:
        problems[-1:] = [f"gzip magic bytes but no readable gzip stream ({problems[-1]}); read raw"]
        yield from held
        yield from blocks


def _chain_first(
    first: bytes, blocks: Iterator[bytes], held: list[bytes] | None
) -> Iterator[bytes]:
    yield first
    for block in blocks:
        if held is not None and sum(map(len, held)) < SNIFF_BYTES:
            held.append(block)
        yield block


def _gunzip(blocks: Iterator[bytes], problems: list[str]) -> Iterator[bytes]:
    """Decompress with at most BLOCK_BYTES out per step (a small bomb cannot fill memory)."""
    decoder = zlib.decompressobj(wbits=31)
    between = False  # a member ended: what follows must be another member
    junk = 0
    nul_only = True
    for block in blocks:
        data = block
        while data:
            if junk or (between and len(data) >= 2 and not data.startswith(b"\x1f\x8b")):
                junk += len(data)
                nul_only = nul_only and not data.strip(b"\x00")
                break
            if between:
                decoder = zlib.decompressobj(wbits=31)
                between = False
            try:
                out = decoder.decompress(data, BLOCK_BYTES)
            except zlib.error as exc:
                problems.append(f"corrupt gzip stream ({exc})")
                return
            if out:
                yield out
            if decoder.eof:
                between = True
                data = decoder.unused_data
            else:
                data = decoder.unconsumed_tail
    if junk and not nul_only:
        problems.append(f"{junk} bytes of trailing junk after the gzip stream ignored")
    elif not between and not junk:
        problems.append("truncated gzip stream")


def _line_chunks(blocks: Iterable[bytes], ends: list[bool]) -> Iterator[bytes]:
    """Chunks of about CHUNK_BYTES ending at a line break (the last one maybe not). A line over
    MAX_LINE_BYTES is skipped as it streams by and replaced by a stand-in line that says its
    size (``OVERLONG``...). Python touches blocks, never lines: a block's inner lines are
    shorter than the limit since BLOCK_BYTES is. ``ends`` gets whether the last byte was a
    line break."""
    buffer = bytearray()
    tail = 0  # where the open (unfinished) line starts in buffer
    skipped: int | None = None  # bytes of an over-long line being skipped
    last = b""
    for block in blocks:
        if not block:
            continue
        last = block[-1:]
        while block:
            newline = block.find(b"\n")
            if skipped is not None:
                if newline < 0:
                    skipped += len(block)
                    break
                buffer += _overlong(skipped + newline) + b"\n"
                tail = len(buffer)
                skipped, block = None, block[newline + 1 :]
                continue
            open_bytes = len(buffer) - tail
            if newline < 0:
                if open_bytes + len(block) > MAX_LINE_BYTES:
                    skipped = open_bytes + len(block)
                    del buffer[tail:]
                else:
                    buffer += block
                break
            if open_bytes + newline > MAX_LINE_BYTES:
                del buffer[tail:]
                buffer += _overlong(open_bytes + newline) + b"\n"
                tail = len(buffer)
                block = block[newline + 1 :]
                continue
            buffer += block
            tail = len(buffer) - (len(block) - block.rfind(b"\n") - 1)
            break
        if tail >= CHUNK_BYTES:
            yield bytes(buffer[:tail])
            del buffer[:tail]
            tail = 0
    if skipped is not None:
        buffer += _overlong(skipped)
    ends.append(last == b"\n")
    if buffer:
        yield bytes(buffer)


def _overlong(size: int) -> bytes:
    return (
        f"{OVERLONG}[a line of {size} bytes, over the {MAX_LINE_BYTES} byte limit: counted, "
        "not read]"
    ).encode()


def _gunzip_prefix(head: bytes) -> bytes:
    """Decompress the start of a gzip file for sniffing (the stream is cut by design)."""
    decoder = zlib.decompressobj(wbits=31)
    try:
        return decoder.decompress(head, SNIFF_BYTES)
    except zlib.error:
        return b""


def _split_lines(data: bytes, first: bool) -> tuple[pl.Series, bool]:
    """Physical lines (``\\n``-separated, one trailing ``\\r`` removed, a BOM dropped from
    the first chunk) and whether the UTF-8 was bad (bad bytes become U+FFFD)."""
    if not data:
        return pl.Series("raw", [], dtype=pl.String), False
    try:
        data.decode("utf-8")
        invalid = False
    except UnicodeDecodeError:
        invalid = True
    body = data.removeprefix(b"\xef\xbb\xbf") if first else data
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


# What a wrapper line can be wrong with, per line (counted over the lines once, into notes).
_WRAPPER_DAMAGE = {
    "no_prefix": "{} lines without the docker/kubectl timestamp prefix",
    "bad_bytes": "invalid UTF-8 in {} journal entries (MESSAGE byte arrays)",
    "null_message": (
        "{} journal entries without a MESSAGE text (journalctl -o json prints null for fields "
        "over 4096 bytes unless --all is given)"
    ),
    "foreign": "{} lines that are not journal entries",
}


def _detect_wrapper(raw: pl.Series) -> str | None:
    """The wrapper by content: what a majority of the non-blank lines carry (or None)."""
    non_blank = int((raw.str.strip_chars() != "").sum())
    if non_blank:
        if int(raw.str.contains(_JOURNAL_RE).sum()) * 2 > non_blank:
            return "journald"
        if int(raw.str.contains(_DOCKER_PREFIX).sum()) * 2 > non_blank:
            return "docker"
    return None


def _unwrap(raw: pl.Series, wrapper: str | None, first_line: int) -> pl.DataFrame:
    """Peel the wrapper off each line.

    Returns line, raw, content (the log line inside the wrapper), wrapper_time (UTC), wrapped
    (this line carried the wrapper) and flag (a key of _WRAPPER_DAMAGE, or null).
    """
    frame = pl.DataFrame({"raw": raw}).with_row_index("line", offset=first_line)
    frame = frame.with_columns(pl.col("line").cast(pl.Int64))
    if wrapper == "journald":
        return _unwrap_journald(frame)
    if wrapper == "docker":
        return _unwrap_docker(frame)
    return frame.with_columns(
        content=pl.col("raw"),
        wrapper_time=pl.lit(None, UTC_TIME),
        wrapped=pl.lit(False),
        flag=pl.lit(None, pl.String),
    )


def _unwrap_docker(frame: pl.DataFrame) -> pl.DataFrame:
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
    missing = ~pl.col("wrapped") & (pl.col("raw").str.strip_chars() != "")
    frame = frame.with_columns(flag=pl.when(missing).then(pl.lit("no_prefix")))
    return frame.drop("d_time", "d_rest")


def _unwrap_journald(frame: pl.DataFrame) -> pl.DataFrame:
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
    bad_bytes = pl.lit(False)
    if arrays.height:
        try:
            decoded = _decode_byte_arrays(arrays["message"])
        except (pl.exceptions.PolarsError, ValueError):  # not an array of integers
            decoded = pl.Series("bytes_text", [None] * arrays.height, pl.String)
        fixed = pl.DataFrame({"line": arrays["line"], "bytes_text": decoded})
        frame = frame.join(fixed, on="line", how="left", maintain_order="left").with_columns(
            message=pl.when(pl.col("as_bytes"))
            .then(pl.col("bytes_text"))
            .otherwise(pl.col("message"))
        )
        bad_bytes = pl.col("as_bytes") & pl.col("bytes_text").str.contains("\ufffd", literal=True)
    frame = frame.with_columns(
        content=pl.when(pl.col("entry")).then(pl.col("message")).otherwise(raw),
        wrapped=pl.col("entry"),
        flag=pl.when(bad_bytes.fill_null(False))
        .then(pl.lit("bad_bytes"))
        .when(pl.col("entry") & pl.col("message").is_null())
        .then(pl.lit("null_message"))
        .when(~pl.col("entry") & (raw.str.strip_chars() != ""))
        .then(pl.lit("foreign")),
    )
    return frame.select("line", "raw", "content", "wrapper_time", "wrapped", "flag")


def _decode_byte_arrays(arrays: pl.Series) -> pl.Series:
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
    return pl.Series("bytes_text", text.split("\n")[:-1], dtype=pl.String)


# ---------------------------------------------------------------------------------------------
# classification and records


@dataclass
class _RichClock:
    """What a rich log's time carries from one chunk to the next."""

    tod: time | None = None  # the last printed time of day
    day: int = 0  # day roll-overs so far
    backwards: list[int] = field(default_factory=list)  # first lines where the clock went back
    backwards_total: int = 0


class LogStream:
    """One log read chunk by chunk (see CHUNK_BYTES): ``records`` yields each chunk's records,
    in order; the counts of every line, the damage, the unparsed lines' places (and text within
    QUARANTINE_TEXT_BYTES) and what crosses chunks (the record still open at a chunk's end, a
    rich log's clock and console width) are kept here. A record's lines are re-read with the
    next chunk when it is still open at the end of one, so chunking never changes a record; a
    record longer than a chunk is cut there (its further lines are then unparsed)."""

    def __init__(self, display_path: str) -> None:
        self.display_path = display_path
        self.wrapper: str | None = None
        self.lines_total = 0
        self.lines_irrelevant = 0
        self.record_count = 0
        self.logo_lines = 0
        self.non_blank_lines = 0
        self.formats: dict[str, int] = {}
        self.problems: list[str] = []  # of the byte stream (gzip)
        self.counts: dict[str, int] = {}  # damage note template -> lines
        self.cut_records: list[int] = []
        self.ends_with_newline = True
        self.last_unparsed: int | None = None
        self._unparsed: list[pl.DataFrame] = []
        self._kept_text = 0
        self._clock = _RichClock()
        self._widths: dict[int, int] = {}  # rich line length -> lines
        self._longest = 0
        self._wrapper_known = False

    def records(self, blocks: Iterable[bytes]) -> Iterator[pl.DataFrame]:
        ends: list[bool] = []
        carry = pl.Series("raw", [], dtype=pl.String)
        next_line = 1
        chunks = _line_chunks(_decoded(blocks, self.problems), ends)
        chunk = next(chunks, None)
        first = True
        while chunk is not None:
            following = next(chunks, None)
            raw, invalid = _split_lines(chunk, first)
            first = False
            self._count_raw(raw, invalid)
            start_line = next_line - carry.len()
            next_line += raw.len()
            self.lines_total += raw.len()
            raw = pl.concat([carry, raw]) if carry.len() else raw
            if not self._wrapper_known and bool((raw.str.strip_chars() != "").any()):
                self.wrapper = _detect_wrapper(raw)
                self._wrapper_known = True
            frame = _classify(_unwrap(raw, self.wrapper, start_line))
            carry = pl.Series("raw", [], dtype=pl.String)
            if following is not None:
                frame, carry = self._hold_open_record(frame)
            yield self._finish(frame)
            chunk = following
        self.ends_with_newline = not ends or ends[-1]

    def _count_raw(self, raw: pl.Series, invalid: bool) -> None:
        """Damage seen on the bytes of each new line (once per line)."""
        if invalid:
            self._count(
                "invalid UTF-8 on {} lines (decoded with replacement characters)",
                int(raw.str.contains("\ufffd", literal=True).sum()),
            )
        self._count("NUL bytes on {} lines", int(raw.str.contains("\x00", literal=True).sum()))
        self._count(
            "{} lines over the " + f"{MAX_LINE_BYTES} byte limit, counted and quarantined",
            int(raw.str.starts_with(OVERLONG).sum()),
        )

    def _count(self, template: str, lines: int) -> None:
        if lines:
            self.counts[template] = self.counts.get(template, 0) + lines

    def _hold_open_record(self, frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
        """Split off the last record's lines (it may go on in the next chunk) unless they are
        more than a chunk: then it is cut here."""
        starts = frame.filter(pl.col("start"))["line"]
        if starts.len() == 0:
            return frame, pl.Series("raw", [], dtype=pl.String)
        at = int(starts[-1]) - int(frame["line"][0])
        held = frame.slice(at)
        if int(held["raw"].str.len_bytes().sum() or 0) > CHUNK_BYTES:
            self.cut_records.append(int(starts[-1]))
            return frame, pl.Series("raw", [], dtype=pl.String)
        return frame.slice(0, at), held["raw"]

    def _finish(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Count a chunk's settled lines, keep its unparsed lines, return its records."""
        if frame.height == 0:
            return pl.DataFrame(schema=LOG_RECORDS_SCHEMA)
        kinds = dict(frame.group_by("kind").len().iter_rows())
        self.lines_irrelevant += kinds.get("irrelevant", 0)
        self.logo_lines += int(frame["logo"].sum())
        self.non_blank_lines += int((~frame["blank"]).sum())
        flagged = dict(frame.group_by("flag").len().drop_nulls("flag").iter_rows())
        for flag, template in _WRAPPER_DAMAGE.items():  # in the declared order, every time
            if flag in flagged:
                self._count(template, flagged[flag])
        unparsed = frame.filter(pl.col("kind") == "unparsed")
        if unparsed.height:
            self._keep_unparsed(unparsed)
        rich = frame.filter((pl.col("kind") == "record") & (pl.col("rec_fmt") == "rich"))
        if rich.height:
            self._measure_rich(rich.filter(~pl.col("blank")))
        records = _records(frame, self.display_path, self.wrapper, self._clock, self._width())
        self.record_count += records.height
        for name, count in records.group_by("format").len().iter_rows():
            self.formats[name] = self.formats.get(name, 0) + count
        return records

    def _keep_unparsed(self, unparsed: pl.DataFrame) -> None:
        text = (
            pl.when(pl.col("raw").str.starts_with(OVERLONG))
            .then(pl.col("raw").str.strip_prefix(OVERLONG))
            .otherwise(pl.col("raw"))
        )
        rows = unparsed.select(
            pl.lit(self.display_path, pl.String).alias("file"), "line", text.alias("text")
        )
        size = rows["text"].str.len_bytes().cum_sum() + self._kept_text
        rows = rows.with_columns(
            pl.when(size <= QUARANTINE_TEXT_BYTES).then(pl.col("text")).alias("text")
        )
        self._kept_text = int(size[-1])
        self.last_unparsed = int(rows["line"][-1])
        self._unparsed.append(detached(rows))

    def _measure_rich(self, rows: pl.DataFrame) -> None:
        for length, count in rows["content"].str.len_chars().value_counts().iter_rows():
            self._widths[length] = self._widths.get(length, 0) + count
        stripped = int(rows["content"].str.strip_chars_end().str.len_chars().max() or 0)
        self._longest = max(self._longest, stripped)

    def _width(self) -> int | None:
        """Console width: the common raw length of rich lines (rich pads every line to the
        full width) when at least half the lines share it and none is longer; otherwise the
        trailing spaces were stripped and the longest line is the best estimate. Measured over
        every rich line read so far."""
        if not self._widths:
            return None
        most = max(self._widths.values())
        common = max(length for length, count in self._widths.items() if count == most)
        share = most / sum(self._widths.values())
        if share >= 0.5 and common >= self._longest:
            return common
        return self._longest

    def result(self, records: pl.DataFrame | None = None) -> LogRead:
        """The account of the whole log (after ``records`` is exhausted)."""
        damage = [
            p if p.startswith("gzip magic") else f"{p} after {self.lines_total} lines"
            for p in self.problems
        ]
        damage += [template.format(lines) for template, lines in self.counts.items()]
        clock = self._clock
        damage += [
            f"clock went backwards at {self.display_path}:{line}" for line in clock.backwards
        ]
        if clock.backwards_total > len(clock.backwards):
            damage.append(
                f"clock went backwards {clock.backwards_total - len(clock.backwards)} more times"
            )
        damage += [
            f"record at {self.display_path}:{line} longer than {CHUNK_BYTES} bytes: cut there, "
            "its further lines unparsed"
            for line in self.cut_records
        ]
        if (
            self.last_unparsed == self.lines_total
            and self.lines_total
            and not self.ends_with_newline
        ):
            damage.append(
                f"last line {self.lines_total} is cut (no line break at the end) and unparsed"
            )
        fmt: str | None = None
        if self.formats:
            fmt = max(("standard", "json", "rich"), key=lambda name: self.formats.get(name, 0))
            if len(self.formats) > 1:
                listed = ", ".join(f"{self.formats[n]} {n}" for n in sorted(self.formats))
                damage.append(f"mixed formats: {listed} records")
        unparsed = (
            pl.concat(self._unparsed) if self._unparsed else pl.DataFrame(schema=UNPARSED_SCHEMA)
        )
        return LogRead(
            path=self.display_path,
            format=fmt,
            wrapper=self.wrapper,
            records=records if records is not None else pl.DataFrame(schema=LOG_RECORDS_SCHEMA),
            lines_total=self.lines_total,
            lines_irrelevant=self.lines_irrelevant,
            unparsed=unparsed,
            damage=damage,
            rich_width=self._width(),
            record_count=self.record_count,
        )


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
    frame: pl.DataFrame,
    display_path: str,
    wrapper: str | None,
    clock: _RichClock,
    rich_width: int | None,
) -> pl.DataFrame:
    """One row per record: the start line's fields, the stitched message, the line count and,
    for rich, the time carried forward (from ``clock`` across chunks) and the day roll-overs."""
    rows = frame.filter(pl.col("kind") == "record")
    if rows.height == 0:
        return pl.DataFrame(schema=LOG_RECORDS_SCHEMA)

    rich_rows = rows.filter(pl.col("rec_fmt") == "rich")
    if rich_rows.height:
        rich_rows = _rich_pieces(rich_rows, rich_width or 0).select("line", "piece")

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
    if clock.tod is not None:
        tod = pl.when(is_rich).then(tod.fill_null(pl.lit(clock.tod, pl.Time)))
    grouped = grouped.with_columns(tod=tod)
    seconds = (
        pl.col("tod").dt.hour().cast(pl.Int64) * 3600
        + pl.col("tod").dt.minute().cast(pl.Int64) * 60
        + pl.col("tod").dt.second().cast(pl.Int64)
    )
    before = (
        None
        if clock.tod is None
        else clock.tod.hour * 3600 + clock.tod.minute * 60 + clock.tod.second
    )
    step = (seconds - seconds.shift(1, fill_value=before)).over("fmt")
    grouped = grouped.with_columns(
        rollover=(is_rich & (step < -_ROLLOVER_STEP)).fill_null(False),
        backwards=(is_rich & (step < 0) & (step >= -_ROLLOVER_STEP)).fill_null(False),
    )
    back_lines = grouped.filter(pl.col("backwards"))["line"]
    room = _MAX_CLOCK_NOTES - len(clock.backwards)
    clock.backwards.extend(back_lines.head(max(room, 0)).to_list())
    clock.backwards_total += back_lines.len()

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
        .then(pl.col("rollover").cast(pl.Int64).cum_sum().over("fmt") + clock.day)
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
    records = conform(records, LOG_RECORDS_SCHEMA).collect()
    rich = records.filter(pl.col("format") == "rich")
    if rich.height:
        clock.tod = rich["time_of_day"][-1]
        clock.day = int(rich["day_offset"][-1])
    return records
