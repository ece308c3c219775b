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
``sum(records.line_count) + lines_irrelevant + unparsed.height == lines_total``."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from analyzer.magic import GZIP_MAGIC
from analyzer.model import LOG_RECORDS_SCHEMA
from analyzer.sources.logs import lines
from analyzer.sources.logs.layouts import (
    ANSI_RE,
    CERTAIN_RECORD_RE,
    CERTAIN_RICH_RE,
    LEVELS,
    LOGO_LINES,
    STARTUP_RE,
    RichClock,
    classify_lines,
    fold_records,
    other_spaces_in,
)
from analyzer.sources.logs.lines import (
    MAX_LINE_BYTES,
    OVERLONG,
    SNIFF_BYTES,
    decoded,
    file_blocks,
    gunzip_prefix,
    line_chunks,
    split_lines,
)
from analyzer.sources.logs.quiet import SetAside, quiet_records
from analyzer.sources.logs.wrappers import WRAPPER_DAMAGE, detect_wrapper, unwrap

UNPARSED_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.String(),
    "line": pl.Int64(),  # 1-based physical line
    "text": pl.String(),  # the line as read (for journald: the whole journal entry)
}


# The text of unparsed lines is kept for the quarantine file up to this much per log; past it,
# only their places are kept (the quarantine then points at the line in the file).
QUARANTINE_TEXT_BYTES = 64 * 1024 * 1024

# A rich log's console width (which decides how its wrapped lines are re-joined) is measured on
# the rich lines among its first this many lines; the lines read until then wait, accounted but
# not folded (a few MB at most), so every chunking of a file folds it the same way.
WIDTH_SAMPLE_LINES = 20_000

# The lines a busy chunk keeps once its irrelevant ones are set aside (a few hundred of a
# chunk's hundred thousand) are classified together with the next chunks' until there are
# this many: each classification and fold is some fifty small queries, whatever its size.
GATHERED_ROWS = 20_000


QUARANTINE_NOT_KEPT = (
    f"[text not kept: past the {QUARANTINE_TEXT_BYTES >> 20} MiB of unparsed text kept per log; "
    "the line is at this place in the file]"
)


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


# A line that could start a record once unwrapped, on the bytes: an optional BOM and docker/
# kubectl timestamp prefix (wrappers.py), then a standard record's ``LEVEL yyyy-``, a rich
# record's time column (``[HH:MM:SS]`` or 10 spaces) and level, a json record's ``{`` with a
# ``"timestamp"`` key on the same line (layouts.py) or a logo line; or anywhere a journald
# entry's ``__REALTIME_TIMESTAMP``. Every record or logo line ``sniff_log`` counts matches
# it (once ANSI escapes are removed, as classify_lines removes them), so a head without a match
# cannot be a log.
_MAYBE_RECORD = re.compile(
    (
        r"^(?:\xef\xbb\xbf)?(?:-?\d+-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d) ?)?"
        rf"(?:(?:{LEVELS}) \d{{4}}-|(?:\[\d\d:\d\d:\d\d\]| {{10}}) (?:{LEVELS})"
        r'|\{[^\n]*"timestamp"|' + "|".join(map(re.escape, LOGO_LINES)) + ")|__REALTIME_TIMESTAMP"
    ).encode(),
    re.MULTILINE,
)
# classify_lines removes these per line; on the whole head an escape must not reach past one.
_ANSI_BYTES = re.compile(ANSI_RE.replace(r"[^\x07\x1b]", r"[^\x07\x1b\n]").encode())


def _may_be_log(head: bytes) -> bool:
    """The cheap necessary condition of ``sniff_log``: documents, tables and databases fail it
    on their first bytes, without parsing the head into lines."""
    if b"\x1b" in head:
        head = _ANSI_BYTES.sub(b"", head)
    return _MAYBE_RECORD.search(head) is not None


# ---------------------------------------------------------------------------------------------
# public API


def sniff_log(head: bytes) -> bool:
    """True when these first bytes look like a dstack server log (any format or wrapper).

    Used to route unknown files: it needs a dstack-specific line (a standard or json record, a
    rich record with dstack's ``logger:lineno`` prefix, a start-up line or the logo) and at least
    half of the non-blank lines recognised, so a document quoting one log line is not a log.
    """
    return recognise_log(head) is not None


@dataclass
class RecognisedLog:
    """A head recognised as a log (``sniff_log``) with its parse: the bytes parsed (the head
    without a partial last line) and the ``LogStream`` that read them with its chunks, so a
    file that is all head is loaded from this parse instead of being parsed again."""

    head: bytes
    stream: LogStream
    chunks: list[tuple[pl.DataFrame, SetAside]]


def recognise_log(
    head: bytes, display_path: str = "-", matter_words: tuple[str, ...] = ()
) -> RecognisedLog | None:
    """``sniff_log``, parsed as a ``LogStream(display_path, matter_words=...)`` reads it: the
    records it sets aside are one-line standard records (dstack's own format), each a
    recognised line, so the answer is the same with or without ``matter_words``."""
    head = _whole_lines(head)
    if not head.strip() or not _may_be_log(head):
        return None
    stream = LogStream(display_path, matter_words=matter_words)
    chunks = list(stream.chunks([head]))
    aside = sum(part.height for _, part in chunks)
    rec = (
        pl.concat([records for records, _ in chunks])
        if chunks
        else pl.DataFrame(schema=LOG_RECORDS_SCHEMA)
    )
    if rec.height == 0 and not aside and not stream.logo_lines:
        return None
    recognised = int(rec["line_count"].sum() or 0) + aside + stream.logo_lines
    if recognised * 2 < stream.non_blank_lines:
        return None
    dstack_like = (
        rec["format"].is_in(["standard", "json"])
        | rec["logger"].is_not_null()
        | rec["message"].str.contains(STARTUP_RE)
    ).fill_null(False)
    if bool(dstack_like.any()) or aside or stream.logo_lines:
        return RecognisedLog(head, stream, chunks)
    return None


def _whole_lines(head: bytes) -> bytes:
    """The part of a file's first bytes that is sniffed: up to SNIFF_BYTES (of a gzip file,
    decompressed), without a partial last line."""
    head = head[:SNIFF_BYTES]
    if head.startswith(GZIP_MAGIC):
        head = gunzip_prefix(head)
    cut = head.rfind(b"\n")
    if 0 <= cut < len(head) - 1:
        head = head[: cut + 1]  # drop a partial last line
    return head


_CERTAIN_RECORD = re.compile(CERTAIN_RECORD_RE.encode(), re.MULTILINE)
_CERTAIN_RICH = re.compile(CERTAIN_RICH_RE.encode(), re.MULTILINE)


def certainly_log(head: bytes) -> bool:
    """``sniff_log``'s True without parsing the head, where it is certain: an ASCII head
    without escapes (its bytes are its lines' text, as classify_lines matches them) of whose
    non-blank lines at least half are records by their first characters alone
    (``CERTAIN_RECORD_RE``: standard and json, dstack's own formats) or lines of rich records
    with dstack's ``logger:lineno`` (``CERTAIN_RICH_RE``, looked for only in a head without the
    journal's key: a rich record's indented line may hold a journal entry). So no wrapper can
    carry a majority of its lines, each such line is a record's and at least half the lines
    are recognised. False says nothing: ``recognise_log`` decides then."""
    head = _whole_lines(head)
    if not head.isascii() or b"\x1b" in head:
        return False
    certain = len(_CERTAIN_RECORD.findall(head))
    non_blank = sum(1 for line in head.split(b"\n") if line.strip())
    if certain * 2 < non_blank and b"__REALTIME_TIMESTAMP" not in head:
        certain += sum(block.count(b"\n") for block in _CERTAIN_RICH.findall(head))
    return certain > 0 and certain * 2 >= non_blank


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
        [data[i : i + lines.BLOCK_BYTES] for i in range(0, len(data), lines.BLOCK_BYTES)],
        display_path,
    )


def _read_all(blocks: Iterable[bytes], display_path: str) -> LogRead:
    stream = LogStream(display_path)
    chunks = list(stream.records(blocks))
    records = pl.concat(chunks) if chunks else pl.DataFrame(schema=LOG_RECORDS_SCHEMA)
    return stream.result(records)


@dataclass
class _Gathered:
    """Kept lines of chunks that wait for more, with what was set aside of those chunks; their
    rows and bytes counted as they come."""

    parts: list[tuple[pl.DataFrame, SetAside]] = field(default_factory=list)
    rows: int = 0
    size: int = 0

    def add(self, kept: pl.DataFrame, aside: SetAside) -> None:
        if aside.height:  # the kept lines may wait: owning their text, measured
            kept = detached(kept)
            self.rows += kept.height
            self.size += int(kept["raw"].str.len_bytes().sum() or 0)
        self.parts.append((kept, aside))

    def few(self) -> bool:
        """Whether they may wait for more: under GATHERED_ROWS and a chunk's bytes."""
        return self.rows < GATHERED_ROWS and self.size < lines.CHUNK_BYTES

    def taken(self) -> tuple[pl.DataFrame, SetAside]:
        """Every part's lines as one, and what was set aside of them; none are left."""
        frame = pl.concat([part for part, _ in self.parts])
        aside = SetAside.joined([part for _, part in self.parts])
        self.parts, self.rows, self.size = [], 0, 0
        return frame, aside


def detached(frame: pl.DataFrame) -> pl.DataFrame:
    """A copy that owns its text. A filtered string column still points into the whole
    chunk's buffers (polars' string views), so the few rows kept of a chunk would keep all of
    it alive; each text (also inside lists) is written anew, so the rows hold their own. (A
    concatenation builds new strings; nothing else is copied.)"""
    return frame.with_columns(
        _own_text(pl.col(name), dtype)
        for name, dtype in frame.schema.items()
        if dtype == pl.String or dtype == pl.List(pl.String)
    )


def _own_text(column: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    if dtype == pl.String:
        return pl.concat_str([column, pl.lit("")])
    return column.list.eval(pl.concat_str([pl.element(), pl.lit("")]))


class LogStream:
    """One log read chunk by chunk (of about lines.CHUNK_BYTES): ``records`` yields each chunk's
    records, in order; the counts of every line, the damage, the unparsed lines' places (and
    text within QUARANTINE_TEXT_BYTES) and what crosses chunks (the record still open at a
    chunk's end, a rich log's clock and console width) are kept here. A record's lines are re-
    read with the next chunk when it is still open at the end of one, so chunking never changes
    a record; a record longer than a chunk is cut there (its further lines are then unparsed).

    With ``matter_words`` (literals one of which every line that can matter holds),
    ``chunks`` sets aside the one-line standard, json or rich records that hold none of them before
    they are classified (most of a busy server's lines: access logs, heartbeats): they are
    counted as records of their format and handed over beside the chunk's records as their
    line numbers and their levels' counts and latest times (``SetAside``)."""

    def __init__(self, display_path: str, *, matter_words: tuple[str, ...] = ()) -> None:
        self.display_path = display_path
        self.matter_words = matter_words
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
        self._clock = RichClock()
        self._widths: dict[int, int] = {}  # rich line length -> lines
        self._longest = 0
        self._fold_width: int | None = None
        self._width_fixed = False
        self._wrapper_known = False

    def records(self, blocks: Iterable[bytes]) -> Iterator[pl.DataFrame]:
        for records, _ in self.chunks(blocks):
            yield records

    def chunks(self, blocks: Iterable[bytes]) -> Iterator[tuple[pl.DataFrame, SetAside]]:
        """Each chunk's records and the records set aside from it (none without
        ``matter_words``), in order. The few lines a busy chunk keeps wait for the next
        chunk's (up to GATHERED_ROWS and a chunk's bytes) and are classified with them: as
        one chunk, since the lines set aside between them change how no line is classified.
        (Only where a record longer than a chunk is cut can then move: it is cut where the
        gathered lines end.)"""
        ends: list[bool] = []
        carry = pl.Series("raw", [], dtype=pl.String)
        next_line = 1
        chunks = line_chunks(decoded(blocks, self.problems), ends)
        chunk = next(chunks, None)
        first = True
        # accounted, not yet folded (width not yet known), with their set-aside records
        pending: list[tuple[pl.DataFrame, SetAside]] = []
        gathered = _Gathered()  # kept lines waiting for more
        while chunk is not None:
            following = next(chunks, None)
            raw, invalid = split_lines(chunk, first)
            first = False
            self._count_raw(raw, invalid, chunk)
            start_line = next_line - carry.len()
            next_line += raw.len()
            self.lines_total += raw.len()
            escapes = b"\x1b" in chunk or bool(carry.str.contains("\x1b", literal=True).any())
            carry_spaces = carry.str.contains(r"[^\S ]").any()
            raw = pl.concat([carry, raw]) if carry.len() else raw
            carry = pl.Series("raw", [], dtype=pl.String)
            if not self._wrapper_known and bool((raw.str.strip_chars() != "").any()):
                self.wrapper = detect_wrapper(raw)
                self._wrapper_known = True
            # a journal entry's message is JSON, where an escape is written as "\u001b"
            escapes = escapes or self.wrapper == "journald"
            spaces = self.wrapper == "journald" or other_spaces_in(chunk) or bool(carry_spaces)
            kept, aside = self._set_aside(unwrap(raw, self.wrapper, start_line), escapes, spaces)
            gathered.add(kept, aside)
            if following is not None and aside.height and gathered.few():
                chunk = following
                continue
            frame, aside = gathered.taken()
            frame = classify_lines(frame)
            if following is not None:
                frame, carry = self._hold_open_record(frame)
            pending.append((self._account(frame), aside))
            settled = next_line - 1 - carry.len()  # every line up to here is accounted
            if not self._width_fixed and (following is None or settled >= WIDTH_SAMPLE_LINES):
                self._fold_width, self._width_fixed = self._width(), True
            if self._width_fixed:
                for settled_frame, settled_aside in pending:
                    yield self._fold(settled_frame), settled_aside
                pending.clear()
            chunk = following
        self.ends_with_newline = not ends or ends[-1]

    def _set_aside(
        self, frame: pl.DataFrame, escapes: bool, spaces: bool
    ) -> tuple[pl.DataFrame, SetAside]:
        """Split off the lone standard, json or rich records that hold none of ``matter_words``
        (``escapes``, ``spaces``: whether any line may hold an escape byte, whitespace but
        the space)."""
        if not self.matter_words:
            return frame, SetAside.none()
        kept, aside, layout = quiet_records(
            frame,
            self.matter_words,
            escapes=escapes,
            spaces=spaces,
            width_lines=WIDTH_SAMPLE_LINES,
        )
        if layout is not None and aside.height:
            self.record_count += aside.height
            self.non_blank_lines += aside.height
            self.formats[layout] = self.formats.get(layout, 0) + aside.height
        return kept, aside

    def _count_raw(self, raw: pl.Series, invalid: bool, chunk: bytes) -> None:
        """Damage seen on the bytes of each new line (once per line); lines are searched only
        for a byte the chunk holds (a search of the bytes is a fraction of one of the lines)."""
        if invalid:
            self._count(
                "invalid UTF-8 on {} lines (decoded with replacement characters)",
                int(raw.str.contains("\ufffd", literal=True).sum()),
            )
        if b"\x00" in chunk:
            self._count("NUL bytes on {} lines", int(raw.str.contains("\x00", literal=True).sum()))
        if OVERLONG.encode() in chunk:
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
        starts = frame["start"].arg_true()  # rows: lines set aside leave gaps in the numbers
        if starts.len() == 0:
            return frame, pl.Series("raw", [], dtype=pl.String)
        at = int(starts[-1])
        held = frame.slice(at)
        if int(held["raw"].str.len_bytes().sum() or 0) > lines.CHUNK_BYTES:
            self.cut_records.append(int(held["line"][0]))
            return frame, pl.Series("raw", [], dtype=pl.String)
        return frame.slice(0, at), held["raw"]

    def _account(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Count a chunk's settled lines, keep its unparsed lines, measure its rich lines."""
        if frame.height == 0:
            return frame
        self.lines_irrelevant += int((frame["kind"] == "irrelevant").sum())
        self.logo_lines += int(frame["logo"].sum())
        self.non_blank_lines += int((~frame["blank"]).sum())
        flags = frame["flag"].drop_nulls()  # most lines have none (a log without wrapper: all)
        flagged = dict(flags.value_counts().iter_rows()) if flags.len() else {}
        for flag, template in WRAPPER_DAMAGE.items():  # in the declared order, every time
            if flag in flagged:
                self._count(template, flagged[flag])
        unparsed = frame.filter(pl.col("kind") == "unparsed")
        if unparsed.height:
            self._keep_unparsed(unparsed)
        rich = frame.filter((pl.col("kind") == "record") & (pl.col("rec_fmt") == "rich"))
        if rich.height and not self._width_fixed:
            self._measure_rich(
                rich.filter(~pl.col("blank") & (pl.col("line") <= WIDTH_SAMPLE_LINES))
            )
        return frame

    def _fold(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The records of accounted lines, folded with the console width of the sample."""
        if frame.height == 0:
            return pl.DataFrame(schema=LOG_RECORDS_SCHEMA)
        records = fold_records(
            frame, self.display_path, self.wrapper, self._clock, self._fold_width
        )
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
        trailing spaces were stripped and the longest line is the best estimate. Measured on
        the rich lines among the first WIDTH_SAMPLE_LINES lines, whatever the chunk size, so
        that how a file is chunked never changes how its records are folded."""
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
            f"record at {self.display_path}:{line} longer than {lines.CHUNK_BYTES} bytes: "
            "cut there, its further lines unparsed"
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
            rich_width=self._fold_width if self._width_fixed else self._width(),
            record_count=self.record_count,
        )
