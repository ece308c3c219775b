"""From bytes to lines: blocks read, gzip and encodings undone, whole lines in bounded chunks.

A line longer than MAX_LINE_BYTES is never held: it becomes a stand-in that opens with OVERLONG,
counted and quarantined by its place.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import polars as pl

from analyzer.magic import GZIP_MAGIC

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


OVERLONG = "\x01"  # opens the stand-in of a line over MAX_LINE_BYTES (no record starts so)


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


def decoded(blocks: Iterable[bytes], problems: list[str]) -> Iterator[bytes]:
    """The log's bytes in bounded pieces: gzip (multi-member too) recognised by its magic
    bytes and decompressed as far as it goes (what broke goes to ``problems``), else as is."""
    blocks = iter(blocks)
    first = b""
    for block in blocks:
        first += block
        if len(first) >= 2:
            break
    if not first.startswith(GZIP_MAGIC):
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
            if junk or (between and len(data) >= 2 and not data.startswith(GZIP_MAGIC)):
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


def line_chunks(blocks: Iterable[bytes], ends: list[bool]) -> Iterator[bytes]:
    """Chunks of about CHUNK_BYTES ending at a line break (the last one maybe not). A line over
    MAX_LINE_BYTES is skipped as it streams by and replaced by a stand-in line that says its
    size (``OVERLONG``...). Python touches blocks, never lines: a block's inner lines are
    shorter than the limit since BLOCK_BYTES is. A chunk is joined once from views into its
    blocks (the one copy of its bytes here). ``ends`` gets whether the last byte was a line
    break."""
    whole: list[bytes | memoryview] = []  # the chunk's whole lines so far, as pieces
    size = 0
    held: list[bytes | memoryview] = []  # the open (unfinished) line's pieces
    held_bytes = 0
    skipped: int | None = None  # bytes of an over-long line being skipped
    last = b""
    for block in blocks:
        if not block:
            continue
        last = block[-1:]
        view = memoryview(block)
        at, end = 0, len(block)
        while at < end:
            newline = block.find(b"\n", at)
            if skipped is not None:
                if newline < 0:
                    skipped += end - at
                    break
                stand_in = _overlong(skipped + newline - at) + b"\n"
                whole.append(stand_in)
                size += len(stand_in)
                skipped, at = None, newline + 1
                continue
            if newline < 0:
                if held_bytes + end - at > MAX_LINE_BYTES:
                    skipped = held_bytes + end - at
                    held, held_bytes = [], 0
                else:
                    held.append(view[at:])
                    held_bytes += end - at
                break
            if held_bytes + newline - at > MAX_LINE_BYTES:
                stand_in = _overlong(held_bytes + newline - at) + b"\n"
                whole.append(stand_in)
                size += len(stand_in)
                held, held_bytes = [], 0
                at = newline + 1
                continue
            lines_end = block.rfind(b"\n") + 1
            whole += held
            whole.append(view[at:lines_end])
            size += held_bytes + lines_end - at
            held, held_bytes = ([view[lines_end:]], end - lines_end) if lines_end < end else ([], 0)
            break
        if size >= CHUNK_BYTES:
            yield b"".join(whole)
            whole, size = [], 0
    if skipped is not None:
        held = [_overlong(skipped)]
    ends.append(last == b"\n")
    if size or held_bytes or skipped is not None:
        yield b"".join(whole + held)


def _overlong(size: int) -> bytes:
    return (
        f"{OVERLONG}[a line of {size} bytes, over the {MAX_LINE_BYTES} byte limit: counted, "
        "not read]"
    ).encode()


def gunzip_prefix(head: bytes) -> bytes:
    """Decompress the start of a gzip file for sniffing (the stream is cut by design)."""
    decoder = zlib.decompressobj(wbits=31)
    try:
        return decoder.decompress(head, SNIFF_BYTES)
    except zlib.error:
        return b""


def split_lines(data: bytes, first: bool) -> tuple[pl.Series, bool]:
    """Physical lines (``\\n``-separated, one trailing ``\\r`` removed, a BOM dropped from
    the first chunk) and whether the UTF-8 was bad (bad bytes become U+FFFD)."""
    if not data:
        return pl.Series("raw", [], dtype=pl.String), False
    body = data.removeprefix(b"\xef\xbb\xbf") if first else data
    # read as strict UTF-8 first (faster, and what it reads replaced nothing); bad bytes make
    # it fail, and the lines are read again with replacement
    raw = split_with_csv_reader(body, "utf8")
    if raw is not None:
        return raw, False
    raw = split_with_csv_reader(body)
    if raw is None:
        raw = split_text(body)
    # decoding with replacement leaves no U+FFFD in valid UTF-8 that held none: only when
    # one is there are the bytes decoded again to tell a bad byte from a written U+FFFD
    return raw, bool(raw.str.contains("\ufffd", literal=True).any()) and not _utf8(data)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def split_with_csv_reader(body: bytes, encoding: str = "utf8-lossy") -> pl.Series | None:
    """Fast path: polars' CSV reader, with a separator absent from the data and no quoting,
    splits lines in parallel, several times faster than ``str.split``. None when it cannot be
    used, its row count disagrees with the newline count, or (``encoding="utf8"``) the bytes
    are not UTF-8."""
    # It would drop a BOM, and it decompresses data that opens like zlib, zstd or gzip.
    if not body or b"\x1f" in body or body.startswith((b"\xef\xbb\xbf", b"x", b"(\xb5/\xfd")):
        return None
    try:
        raw = pl.read_csv(
            body,
            has_header=False,
            separator="\x1f",
            quote_char=None,
            new_columns=["raw"],
            encoding=encoding,
            infer_schema=False,
            raise_if_empty=False,
        )["raw"].fill_null("")
    except (pl.exceptions.PolarsError, ValueError, OSError):
        return None
    return raw if _all_lines(body, raw, encoding) else None


def _all_lines(body: bytes, raw: pl.Series, encoding: str) -> bool:
    """Whether the reader's rows are the body's lines, one per line break. Where the rows
    hold every byte but the breaks (no ``\r``, which the reader drops before a break, and
    strict UTF-8, which replaces nothing), they are the lines exactly when their bytes and a
    break after each make up the body (a line dropped, merged or cut short changes the sum);
    summing their lengths is a fraction of the cost of counting the breaks."""
    ends_open = 0 if body.endswith(b"\n") else 1
    if encoding == "utf8" and b"\r" not in body:
        size = int(raw.str.len_bytes().sum() or 0)
        return size + raw.len() - ends_open == len(body)
    return raw.len() == body.count(b"\n") + ends_open


def split_text(body: bytes) -> pl.Series:
    """Fallback: decode (bad bytes replaced) and split the text in polars."""
    text = body.decode("utf-8", errors="replace")
    if text.endswith("\n"):
        text = text[:-1]
    return pl.Series("raw", [text]).str.split("\n").explode().str.strip_suffix("\r")
