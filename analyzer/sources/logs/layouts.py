"""dstack's three log layouts (rich, standard, json) recognised line by line and folded into
records, in columns: what a line is (a record's start, a continuation, the logo, unparsed) and
the record it belongs to.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import time

import polars as pl

from analyzer.magic import LEVEL_NAMES, RICH_LEVEL_COLUMNS
from analyzer.model import LOG_RECORDS_SCHEMA, conform

LEVELS = "|".join(LEVEL_NAMES)


# standard: %(levelname)s %(asctime)s.%(msecs)03d %(name)s %(message)s (reference 9.2); the
# message is sliced off after the match.
_STD_RE = (
    rf"^(?P<std_level>{LEVELS}) "
    r"(?P<std_ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}) (?P<std_logger>\S+)(?: |$)"
)


# The same start without captures (matched whole: the fast path of the regex engine), for the
# pre-filter that looks at every line of a chunk.
_STD_HEAD_RE = re.sub(r"\(\?P<\w+>", "(?:", _STD_RE)

# The same start with a time that parses (years 0001-9999, the month's days, no leap second;
# ASCII digits, where ``\d`` would take any script's): the lines the pre-filter may set aside
# without parsing their time. A 29 February or a second 60 is not matched here (such a line is
# classified like any other).
_VALID_DATE = (
    r"(?:000[1-9]|00[1-9][0-9]|0[1-9][0-9]{2}|[1-9][0-9]{3})-"
    r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)"
    r"|(?:0[13578]|1[02])-31)"
)
_VALID_CLOCK = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
_STD_VALID_HEAD_RE = rf"^(?:{LEVELS}) {_VALID_DATE}T{_VALID_CLOCK}\.[0-9]{{3}} \S+(?: |$)"

# The UTF-8 of every whitespace character but the space and the line break (Unicode's
# White_Space, regex's ``[^\S ]``: U+0009 to U+000D, U+0085, U+00A0, U+1680, U+2000 to U+200A,
# U+2028, U+2029, U+202F, U+205F, U+3000) begins with one of these bytes, each found in a
# chunk's bytes at memory speed. (So do others, "—" among them, "é" not: a chunk holding one
# is proven the longer way.)
OTHER_SPACES = (b"\t", b"\x0b", b"\x0c", b"\r", b"\xc2", b"\xe1", b"\xe2", b"\xe3")
_ASCII_SPACES = OTHER_SPACES[:4]


def other_spaces_in(data: bytes) -> bool:
    """Whether ``data`` may hold whitespace but the space and the line break (one of
    OTHER_SPACES). ASCII bytes (one quick pass tells) can hold only the first four: the
    searches for the others' lead bytes are skipped."""
    spaces = _ASCII_SPACES if data.isascii() else OTHER_SPACES
    return any(space in data for space in spaces)


# A standard record's time as its head matched it: always a dot and three digits, which
# `.%3f` reads as `%.3f` does, at a quarter of the cost (a fixed-width field)
_STD_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%3f"

# rich: 10-char time column (or 10 spaces when the time repeats), space, 8-char level, space.
_RICH_LEVELS = "|".join(RICH_LEVEL_COLUMNS)  # each as wide as the column
_RICH_RE = rf"^(?:\[(?P<r_time>\d\d:\d\d:\d\d)\]| {{10}}) (?P<r_level>{_RICH_LEVELS})(?: |$)"


# ``logger:lineno`` and the one whitespace after it (or the end): the message is what follows,
# sliced off. Taken as the whole match (group 0): a capture group, let alone one over the rest,
# runs the regex's slow capture engine.
_RICH_LOGGER_RE = r"^[A-Za-z_][\w.]*:\d+(?:\s|$)"


_RICH_INDENT = 20  # time (10) + space + level (8) + space

# A rich record whose first line opens with ``logger:lineno``, a space and more (its record's
# logger is read off its message), with a real time of day or none, then the lines that go on
# with it (indented to the message column, not blank): each line of it is a recognised line of
# a record, whatever the console's width (``certainly_log`` counts them without a parse).
CERTAIN_RICH_RE = (
    rf"^(?:\[{_VALID_CLOCK}\]| {{10}}) (?:{_RICH_LEVELS}) "
    r"[A-Za-z_][A-Za-z0-9_.]*:[0-9]+ [^\n]*[^\s][^\n]*\n"
    rf"(?: {{{_RICH_INDENT}}}[^\n]*[^\s][^\n]*\n)*"
)


ANSI_RE = r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]"


# A line that cannot be a traceback or message continuation: control bytes (NUL, binary
# junk) or the beginning of a record that did not parse (a line cut while being written).
_SUSPECT_RE = (
    r"[\x00-\x08\x0b-\x1f\x7f]"
    rf"|^(?:(?:{LEVELS}) -?\d|\{{\s*\"|\[\d\d:\d\d| {{10}} (?:{LEVELS}) )"
)


# Lines that open a part of a Python traceback (used to restore newlines in folded rich text).
_TRACEBACK_PART_RE = (
    r"^(?:Traceback \(most recent call last\):|During handling of the above exception|"
    r"The above exception was the direct cause|"
    r"[A-Za-z_][\w.]*(?:Error|Exception|Warning|Exit|Interrupt|Group)\b(?::|$))"
)


# python-json-logger as dstack configures it (server/utils/logging.py configure_logging:
# "%(asctime)s %(name)s %(levelname)s %(message)s", renamed timestamp, logger, level).
_JSON_TIMESTAMP = '{"timestamp": "'
_JSON_LOGGER = '", "logger": "'
_JSON_LEVEL = '", "level": "'
_JSON_VALUE = r"[ !#-\[\]-~]*"  # printable ASCII without a quote or backslash
_JSON_HEAD_RE = (
    "^"
    + re.escape(_JSON_TIMESTAMP)
    + _JSON_VALUE
    + re.escape(_JSON_LOGGER)
    + _JSON_VALUE
    + re.escape(_JSON_LEVEL)
    + _JSON_VALUE
    + re.escape('", ')
)
# What follows the head on a line of dstack's own that holds nothing JSON would escape (no
# quote, backslash or control character in the message): its message is then the text
# between these, as a JSON parser would read it, so it is sliced without one.
_JSON_MESSAGE = '"message": "'
_JSON_PLAIN_TEXT = r'[^"\\\x00-\x1f]*'  # a message's text JSON escapes nothing in
_JSON_PLAIN_REST_RE = "^" + re.escape(_JSON_MESSAGE) + _JSON_PLAIN_TEXT + r'"\}$'
# Such a line whole, and where its level's value ends: before its message's key.
_JSON_PLAIN_LINE_RE = _JSON_HEAD_RE + _JSON_PLAIN_REST_RE.removeprefix("^")
_JSON_LEVEL_END = '", ' + _JSON_MESSAGE


def _json_valid_line(logger: str, message: str) -> str:
    """A whole line of dstack's own json layout with a real time, a logger's name as `logger`
    matches it and a message's text (JSON, no quotes) as `message` does."""
    return (
        "^"
        + re.escape(_JSON_TIMESTAMP)
        + rf"{_VALID_DATE} {_VALID_CLOCK},[0-9]{{3}}"
        + re.escape(_JSON_LOGGER)
        + logger
        + re.escape(_JSON_LEVEL)
        + _JSON_VALUE
        + re.escape('", ' + _JSON_MESSAGE)
        + message
        + re.escape('"}')
        + "$"
    )


# ``_json_fields`` reads such a line with a plain message as a json record (its head, its
# message, its time).
_JSON_VALID_LINE_RE = _json_valid_line(_JSON_VALUE, _JSON_PLAIN_TEXT)


# A line that is a record of its own by its first characters alone (``classify_lines`` makes
# it a record's start, whatever its neighbours): a standard record start with a real time
# (``_STD_VALID_HEAD_RE``) or a whole plain json record (``_JSON_VALID_LINE_RE``).
CERTAIN_RECORD_RE = f"(?:{_STD_VALID_HEAD_RE})|(?:{_JSON_VALID_LINE_RE})"


_LONE_SURROGATE_RE = r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}"


STARTUP_RE = (
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


def in_range(time: pl.Expr) -> pl.Expr:
    """A parsed time, or null when its year is outside 1-9999 (``0000-...``, ``-001-...``):
    such a line is no record (it is quarantined), since no report could show its time. Give
    it a column already parsed: the expression is evaluated twice."""
    return pl.when(time.dt.year().is_between(1, 9999)).then(time)


# ---------------------------------------------------------------------------------------------
# classification and records


@dataclass
class RichClock:
    """What a rich log's time carries from one chunk to the next."""

    tod: time | None = None  # the last printed time of day
    day: int = 0  # day roll-overs so far
    backwards: list[int] = field(default_factory=list)  # first lines where the clock went back
    backwards_total: int = 0


def classify_lines(frame: pl.DataFrame) -> pl.DataFrame:
    """Per line: which format starts a record here, and whether the line belongs to one.

    Sequence rules use global running sums instead of per-record windows: a record's lines are
    contiguous, so "a bad line since this record started" is the running count of bad lines
    minus its value at the record start.
    """
    content = pl.col("content")
    if frame.height and bool(frame["content"].str.contains("\x1b", literal=True).any()):
        frame = frame.with_columns(content.str.replace_all(ANSI_RE, ""))
    # a layout no line of the chunk can start (by its first characters) is not matched
    may_start = frame.select(
        content.str.contains(rf"^(?:{LEVELS}) ").any().alias("standard"),
        content.str.contains(r"^(?:\[| {10} )").any().alias("rich"),
    ).row(0, named=True)
    # a line is blank when nothing is left of it stripped at its end alone: one strip for both
    # (a rich log's lines are padded to its width)
    stripped = frame["content"].str.strip_chars_end()
    frame = frame.with_columns(
        _standard_head(may_start["standard"]).alias("std_head"),
        _groups(_RICH_RE, ("r_time", "r_level"), may_start["rich"]).alias("r"),
        blank=(stripped == "").fill_null(False),
        logo=stripped.is_in(LOGO_LINES).fill_null(False),
    ).unnest("r")
    frame = _json_fields(frame)
    # the standard fields sliced off the matched start ("LEVEL yyyy-mm-ddTHH:MM:SS.fff logger"
    # and the space after it): level and time are ASCII, so the first space's byte offset is a
    # character offset too
    head = pl.col("std_head")
    level_end = head.str.find(" ", literal=True)
    frame = frame.with_columns(
        std_level=head.str.slice(0, level_end),
        std_ts=head.str.slice(level_end + 1, 23),
        std_logger=head.str.slice(level_end + 25).str.strip_suffix(" "),
        # the message is what follows the start (sliced, cheaper than a capture)
        std_msg=content.str.slice(head.str.len_chars()),
    )
    frame = frame.with_columns(
        std_time=pl.col("std_ts").str.to_datetime(_STD_TIME_FORMAT, time_unit="ms", strict=False),
        json_time=_json_time(frame["j_ts"]),
        rich_tod=pl.col("r_time").str.to_time("%H:%M:%S", strict=False),
    ).with_columns(in_range(pl.col("std_time")), in_range(pl.col("json_time")))
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
        rec_id=start.cast(pl.Int64).cum_sum().set_sorted(),
        rec_fmt=pl.col("fmt").forward_fill(),
    )
    # only a line inside a standard record that does not start one is asked whether it looks
    # damaged (a rich or json log holds none: not a line is matched)
    suspect = _where((frame["rec_fmt"] == "standard") & ~frame["start"], frame["content"], _suspect)
    accept = (
        pl.when(pl.col("rec_fmt") == "rich")
        .then(content.str.starts_with(" " * _RICH_INDENT) & ~pl.col("blank"))
        .when(pl.col("rec_fmt") == "standard")
        .then(~pl.col("blank") & ~pl.col("logo") & ~suspect)
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


# python logging's asctime (``%Y-%m-%d %H:%M:%S,mmm``), as python-json-logger writes it;
# other writers' times may put a dot for the comma
_JSON_TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%3f"
_JSON_TIME_DOT_FORMAT = "%Y-%m-%d %H:%M:%S%.3f"


def _json_time(stamps: pl.Series) -> pl.Series:
    """A json record's time: as python logging writes it, and the stamps that does not read
    with a dot for the comma (what both read, they read alike; a replacement over every
    stamp costs several times the parse)."""
    times = stamps.str.to_datetime(_JSON_TIME_FORMAT, time_unit="ms", strict=False)
    rows = (times.is_null() & stamps.is_not_null()).arg_true()
    if rows.len() == 0:
        return times
    dotted = stamps.gather(rows).str.replace(",", ".", literal=True)
    return times.scatter(
        rows, dotted.str.to_datetime(_JSON_TIME_DOT_FORMAT, time_unit="ms", strict=False)
    )


def _standard_head(match: bool) -> pl.Expr:
    """A standard record's start as matched whole (no captures: the regex's fast path), or
    null when no line of the chunk can be one."""
    if match:
        return pl.col("content").str.extract(_STD_HEAD_RE, 0)
    return pl.lit(None, pl.String)


def _groups(pattern: str, names: tuple[str, ...], match: bool) -> pl.Expr:
    """The content's ``extract_groups`` of the pattern, or its fields (null) when no line
    can match it."""
    if match:
        return pl.col("content").str.extract_groups(pattern)
    return pl.struct([pl.lit(None, pl.String).alias(name) for name in names])


def _json_fields(frame: pl.DataFrame) -> pl.DataFrame:
    """python-json-logger fields of lines that start with ``{`` (others get nulls).

    The message of a line of dstack's own layout that holds nothing JSON escapes is sliced off
    (``_JSON_PLAIN_LINE_RE``: such a line is valid JSON); any other line's goes through a JSON
    parser (``json_path_match``, null when the line is not valid JSON, so it also validates the
    line); timestamp, level and logger never need escapes and come from a regex anchored at a
    key position; exc_info and stack_info are parsed only on
    the few lines that carry them.
    """
    names = ("j_ts", "j_level", "j_logger", "j_msg", "j_exc", "j_stack")
    candidates = frame.filter(pl.col("content").str.starts_with("{")).select("line", "content")
    if candidates.height == 0:
        return frame.with_columns([pl.lit(None, pl.String).alias(name) for name in names])
    content = pl.col("content")

    def plain(key: str) -> pl.Expr:
        return content.str.extract(rf'[{{,]\s*"{key}"\s*:\s*"([^"\\]*)"', 1)

    # dstack's own layout first: the head matched whole and its fields cut at the literal
    # separators (ASCII values: byte offsets are character offsets); what each plain() regex
    # finds there, since no earlier position can hold a quote. Other lines get the regexes.
    # A whole line of that layout whose message JSON escapes nothing (one match: most lines)
    # is cut at its separators alone, its own head: no quote but theirs is in it, so each is
    # found first where the head's match puts it. Only the other lines' heads are matched.
    whole = pl.col("j_plain")
    head = pl.col("j_head")
    logger_at = head.str.find(_JSON_LOGGER, literal=True)
    level_at = head.str.find(_JSON_LEVEL, literal=True)
    message_at = head.str.find(_JSON_LEVEL_END, literal=True)
    level_end = pl.when(whole).then(message_at).otherwise(head.str.len_bytes() - 3)
    candidates = (
        candidates.with_columns(j_plain=content.str.contains(_JSON_PLAIN_LINE_RE))
        .with_columns(
            j_head=pl.when(whole).then(content).otherwise(content.str.extract(_JSON_HEAD_RE, 0))
        )
        .select(
            "line",
            "content",
            j_ts=head.str.slice(len(_JSON_TIMESTAMP), logger_at - len(_JSON_TIMESTAMP)),
            j_level=head.str.slice(
                level_at + len(_JSON_LEVEL), level_end - level_at - len(_JSON_LEVEL)
            ),
            j_logger=head.str.slice(
                logger_at + len(_JSON_LOGGER), level_at - logger_at - len(_JSON_LOGGER)
            ),
            j_msg=pl.when(whole).then(
                head.str.slice(message_at + len(_JSON_LEVEL_END)).str.strip_suffix('"}')
            ),
            j_other=head.is_null(),
        )
    )
    parsed = candidates["j_msg"].is_null().arg_true()  # the others: through a JSON parser
    if parsed.len():
        candidates = candidates.with_columns(
            candidates["j_msg"].scatter(
                parsed, candidates["content"].gather(parsed).str.json_path_match("$.message")
            )
        )
    if bool(candidates["j_other"].any()):
        others = candidates.filter(pl.col("j_other")).select(
            "line",
            plain("timestamp").alias("o_ts"),
            plain("level").alias("o_level"),
            plain("logger").alias("o_logger"),
        )
        candidates = candidates.join(others, on="line", how="left", maintain_order="left").select(
            "line",
            "content",
            pl.coalesce("j_ts", "o_ts").alias("j_ts"),
            pl.coalesce("j_level", "o_level").alias("j_level"),
            pl.coalesce("j_logger", "o_logger").alias("j_logger"),
            "j_msg",
        )
    else:
        candidates = candidates.drop("j_other")
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
    if candidates.height == frame.height:  # every line: the same rows, in the same order
        return frame.with_columns(candidates.drop("line", "content"))
    return frame.join(candidates.drop("content"), on="line", how="left", maintain_order="left")


def _rich_pieces(frame: pl.DataFrame, width: int) -> pl.DataFrame:
    """Message-column text of each rich line and the separator that re-joins it (line and
    piece).

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
    vis = pl.col("vis")
    rows = (
        frame.lazy()
        .select(
            "line",
            "start",
            pl.col("content").str.slice(_RICH_INDENT).str.strip_chars_end().alias("vis"),
        )
        .with_columns(
            vis_len=vis.str.len_chars().cast(pl.Int64),
            indented=vis.str.contains(r"^\s"),
            traceback_part=vis.str.contains(_TRACEBACK_PART_RE),
            first_word=_first_word(frame).cast(pl.Int64),
        )
        .collect()
    )
    # A full line's facts are read only where its successor asks for them (a record's first
    # line holding only ``logger:lineno``, whether the line holds a space, whether its
    # successor opens with a digit): a few lines of a folded log, each matched alone.
    full = rows["vis_len"] >= column
    decided = rows["start"] | (rows["vis_len"] == 0) | rows["indented"]
    path_only = _where(rows["start"] & full, rows["vis"], _path_only)
    rows = rows.with_columns(
        has_space=_where(full, rows["vis"], _has_space),
        path_only=path_only,
        digit_first=_where(
            ~decided & full.shift(1) & path_only.shift(1), rows["vis"], _digit_first
        ),
    )
    # rows are the record lines in file order; a start ignores its predecessor
    prev_len = pl.col("vis_len").shift(1)
    prev_space = pl.col("has_space").shift(1)
    prev_path_only = pl.col("path_only").shift(1)
    separator = (
        pl.when(pl.col("start"))
        .then(pl.lit(""))
        .when((pl.col("vis_len") == 0) | pl.col("indented"))
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
    return rows.select("line", (separator + vis).alias("piece"))


def _where(rows: pl.Series, texts: pl.Series, fact: Callable[[pl.Series], pl.Series]) -> pl.Series:
    """``fact`` (true or false) of the ``texts`` at ``rows`` (a mask, null as false); false
    elsewhere, where nothing reads it."""
    at = rows.fill_null(False).arg_true()
    blank = pl.repeat(False, texts.len(), dtype=pl.Boolean, eager=True)
    if at.len() == 0:
        return blank
    return blank.scatter(at, fact(texts.gather(at)))


def _suspect(lines: pl.Series) -> pl.Series:
    return lines.str.contains(_SUSPECT_RE)


def _path_only(vis: pl.Series) -> pl.Series:
    return vis.str.contains(r"^[A-Za-z_][\w.]*:\d+$")


def _digit_first(vis: pl.Series) -> pl.Series:
    return vis.str.contains(r"^\d")


def _has_space(vis: pl.Series) -> pl.Series:
    return vis.str.strip_chars_start().str.contains(" ", literal=True)


def _first_word(frame: pl.DataFrame) -> pl.Expr:
    """The length of the message column's first word, where it opens with one (an indented
    line's is never read). On ASCII text the byte offset of the first whitespace is it (a
    search, several times cheaper than extracting the word), and where the only whitespace is
    the space, that of the first space (a search for a literal, cheaper again); otherwise
    counted in characters."""
    vis = pl.col("vis")
    content = pl.col("content")
    sizes = frame.select(
        content.str.len_bytes().sum(),
        content.str.len_chars().sum().alias("chars"),
        content.str.contains(r"[\t\x0b\x0c\r]").any().alias("other_spaces"),
    ).row(0)
    if sizes[0] != sizes[1]:
        return vis.str.extract(r"^\S*", 0).str.len_chars()
    first_space = vis.str.find(r"\s") if sizes[2] else vis.str.find(" ", literal=True)
    return first_space.fill_null(vis.str.len_bytes())


def fold_records(
    frame: pl.DataFrame,
    display_path: str,
    wrapper: str | None,
    clock: RichClock,
    rich_width: int | None,
) -> pl.DataFrame:
    """One row per record: the start line's fields, the stitched message, the line count and,
    for rich, the time carried forward (from ``clock`` across chunks) and the day roll-overs."""
    rows = frame.filter(pl.col("kind") == "record")
    if rows.height == 0:
        return pl.DataFrame(schema=LOG_RECORDS_SCHEMA)

    rich_rows = rows.filter(pl.col("rec_fmt") == "rich")
    if rich_rows.height:
        rich_rows = _rich_pieces(rich_rows, rich_width or 0)

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
    if rich_rows.height == rows.height:  # a rich chunk: its pieces are every row's, in order
        rows = rows.with_columns(piece=rich_rows["piece"])
    elif rich_rows.height:
        rows = (
            rows.with_columns(piece=piece)
            .join(
                rich_rows.rename({"piece": "rich_piece"}),
                on="line",
                how="left",
                maintain_order="left",
            )
            .with_columns(
                piece=pl.when(pl.col("rec_fmt") == "rich")
                .then(pl.col("rich_piece"))
                .otherwise(pl.col("piece"))
            )
        )
    else:
        rows = rows.with_columns(piece=piece)

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
        .agg(pl.len().cast(pl.Int64).alias("n_lines"), pl.col("piece").alias("joined"))
        .with_columns(pl.col("joined").list.join("", ignore_nulls=True))  # faster than str.join
    )
    if stitched.height:
        grouped = grouped.join(
            stitched, on="rec_id", how="left", maintain_order="left"
        ).with_columns(
            message=pl.coalesce("joined", "message"),
            line_count=pl.coalesce("n_lines", "line_count"),
        )
    is_rich = pl.col("fmt") == "rich"
    logger_head = pl.col("logger_head")
    grouped = grouped.with_columns(
        logger_head=pl.when(is_rich).then(pl.col("message").str.extract(_RICH_LOGGER_RE, 0))
    ).with_columns(
        # what comes before the first ":" (a head always holds one), without a regex
        rl_logger=logger_head.str.split_exact(":", 1).struct.field("field_0"),
        rl_msg=pl.col("message").str.slice(logger_head.str.len_chars()),
    )

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
