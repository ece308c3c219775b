"""Lines that cannot matter, set aside before they are classified: a busy server's one-line
records (its access lines, heartbeats) that hold none of the words a line that matters holds,
counted with their levels and latest times (``SetAside``), never folded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from analyzer.model import UTC_TIME
from analyzer.sources.logs.layouts import (
    _JSON_LEVEL,
    _JSON_LEVEL_END,
    _JSON_TIME_FORMAT,
    _JSON_TIMESTAMP,
    _JSON_VALUE,
    _RICH_LEVELS,
    _STD_TIME_FORMAT,
    _STD_VALID_HEAD_RE,
    _VALID_CLOCK,
    _json_valid_line,
)

# Where no line holds whitespace other than the space, the logger's first character is proof
# enough: its ``\S+`` then ends at a space or at the line's end, and the rest of it is not
# scanned (a third of the match).
_STD_VALID_HEAD_SHORT_RE = _STD_VALID_HEAD_RE.removesuffix(r"\S+(?: |$)") + r"\S"

_STAMP = "0001-01-01 00:00:00,000"  # the width of a time _JSON_TIME_FORMAT reads

# A line ``quiet_records`` may set aside: one of a named logger (``EventCollector`` counts a
# record of none as dstack's own, unrecognised, whatever words it holds) whose message escapes
# only a quote, a backslash or a slash (an access line's quoted request): valid JSON, and
# the words a decoded message holds are those its text holds (none holds one of these three),
# so they are found in the line as written.
_JSON_QUIET_LINE_RE = _json_valid_line(
    _JSON_VALUE.removesuffix("*") + "+", r'(?:[^"\\\x00-\x1f]|\\["\\/])*'
)

# A rich record's start with a real time of day or none (``classify_lines`` makes it one,
# whatever its neighbours), and such a start of no time (the last printed one goes on: taking
# it out changes no other line's time) whose message opens with ``logger:lineno`` (a record
# without one has no logger, which ``EventCollector`` counts as dstack's own): a line
# ``quiet_records`` may set aside.
_RICH_START_RE = rf"^(?:\[{_VALID_CLOCK}\]| {{10}}) (?:{_RICH_LEVELS})(?: |$)"
_RICH_QUIET_LINE_RE = rf"^ {{10}} (?:{_RICH_LEVELS}) [A-Za-z_][A-Za-z0-9_.]*:[0-9]+(?: |$)"


def quiet_records(
    frame: pl.DataFrame,
    words: tuple[str, ...],
    *,
    escapes: bool = True,
    spaces: bool = True,
    width_lines: int = 0,
) -> tuple[pl.DataFrame, SetAside, str | None]:
    """Split off the lines of unwrapped lines (``unwrap``'s columns) that are each a whole
    one-line record of one of dstack's layouts holding none of ``words``, followed by another
    record's start: a standard record start, a whole plain json record of a named logger, or a
    rich record of no printed time opening with its logger (past the first ``width_lines``
    lines, on which the reader measures the console's width). Taking such a line out changes how
    no other line is classified (a start ends the record before it, and the line after it starts
    its own) nor, a rich line of no printed time, any line's time, so these are the only lines a
    pre-filter may set aside unfolded. Lines with wrapper damage or escape sequences are left in
    (their notes and cleaning are made in ``classify_lines``), and so are the lines before one;
    the last line never goes (its record may go on in the next chunk).

    A sample of the lines (``SAMPLE_LINES``, spread over the chunk) is matched first, against
    each layout: the one of more starts there is looked for (a chunk of a log whose format
    changed at a restart: its lines of that layout), and a chunk of few starts of any, or of few
    lines holding none of the words (dstack's own lines, nearly all kept), is not looked at
    further. Then the words are looked for, in the whole line (one search for literals, no field
    parsed): only when a good share of the chunk holds none of them (a busy server's access log)
    are the record starts matched, and only when a good share of those are starts is anything
    more done. (Which chunks are looked at changes no result, only its cost.) A start is proven
    by one match (``_STD_VALID_HEAD_RE``, ``_JSON_QUIET_LINE_RE``, ``_RICH_QUIET_LINE_RE``: its
    time a real one or none, so no line's time is parsed); a start it leaves to
    ``classify_lines`` (a 29 February, a leap second) only keeps its neighbours.
    ``escapes=False`` says no line holds an escape byte (the caller saw none in the bytes),
    ``spaces=False`` that none holds whitespace but the space (none of ``OTHER_SPACES``): a
    standard start is then proven by ``_STD_VALID_HEAD_SHORT_RE``. Returns the lines kept, in
    order, what was set aside, and the layout of its records (None: nothing)."""
    content = frame["content"]
    sample = content.gather_every(max(1, frame.height // SAMPLE_LINES))
    standard = _STD_VALID_HEAD_RE if spaces else _STD_VALID_HEAD_SHORT_RE
    layouts = (
        ("standard", standard, standard),
        ("json", _JSON_QUIET_LINE_RE, _JSON_QUIET_LINE_RE),
        ("rich", _RICH_QUIET_LINE_RE, _RICH_START_RE),
    )
    counted = [
        (int(sample.str.contains(head).sum()), layout, head, after)
        for layout, head, after in layouts
    ]
    starts, layout, head, after = max(counted, key=lambda count: count[0])  # a tie: the first
    if starts * QUIET_SHARE < sample.len():
        return frame, SetAside.none(), None
    matter = "|".join(map(re.escape, words))
    if (~sample.str.contains(matter)).sum() * QUIET_SHARE < sample.len():
        return frame, SetAside.none(), None
    quiet = ~content.str.contains(matter)
    if escapes:
        plain = ~content.str.contains("\x1b", literal=True)
        quiet &= plain
    if quiet.sum() * QUIET_SHARE < frame.height:
        return frame, SetAside.none(), None
    start = content.str.contains(head)
    if escapes:
        start &= plain
    if (start & quiet).sum() * QUIET_SHARE < frame.height:  # few lines to set aside
        return frame, SetAside.none(), None
    following = start if after == head else content.str.contains(after)
    lone = start & following.shift(-1, fill_value=False) & quiet & frame["flag"].is_null()
    times = frame["wrapper_time"]
    if layout == "rich":
        # past the lines the console's width is measured on; in a wrapped log, timed by the
        # wrapper (a line it did not time would be timed by the rich clock alone)
        lone &= frame["line"] > width_lines
        if times.null_count() != times.len():
            lone &= times.is_not_null()
        levels = _rich_levels(frame.select("content", "wrapper_time").filter(lone))
    elif layout == "json":
        levels = _json_levels(frame.select("content", "wrapper_time").filter(lone))
    elif times.null_count() == times.len():  # no wrapper time: the text alone times a line
        levels = _unwrapped_levels(content.filter(lone))
    else:
        levels = _levels(frame.select("content", "wrapper_time").filter(lone))
    return frame.filter(~lone), SetAside(frame["line"].filter(lone), levels), layout


def _unwrapped_levels(texts: pl.Series) -> pl.DataFrame:
    """``_levels`` of lines without a wrapper's time. The lines that open with one ``LEVEL ``
    are one interval of text order, so when the least and the greatest line open with the
    same one every line does (a busy log's access lines): its count and latest time are then
    the lines' and the greatest line's, with no pass over them but the two bounds."""
    if texts.len():
        low, high = texts.min(), texts.max()
        first = low.split(" ", 1)[0] + " "
        if high.startswith(first):
            return _level_rows(
                pl.DataFrame(
                    {"_first": [low], "lines": [texts.len()], "_last": [high], "_wrapper": [None]},
                    schema_overrides={"_wrapper": UTC_TIME},
                )
            )
    frame = pl.DataFrame({"content": texts}).with_columns(wrapper_time=pl.lit(None, UTC_TIME))
    return _levels(frame)


def _levels(aside: pl.DataFrame) -> pl.DataFrame:
    """Per level of set-aside standard lines: how many, and the latest time (the wrapper's
    where it wrote one, else the local time as UTC, as ``EventCollector`` times a record).
    Within a level every line opens with the same ``LEVEL `` and then its time, in a fixed
    width whose text order is its time order (``_STD_VALID_HEAD_RE``): the greatest line holds
    the latest time, parsed alone. The levels' first letters differ, so they group them
    (unless every line is of the first line's level, a busy log's access lines: no grouping)."""
    content = pl.col("content")
    columns = [
        content.first().alias("_first"),
        pl.len().cast(pl.Int64).alias("lines"),
        content.filter(pl.col("wrapper_time").is_null()).max().alias("_last"),
        pl.col("wrapper_time").max().alias("_wrapper"),
    ]
    first = aside["content"][0].split(" ", 1)[0] + " " if aside.height else ""
    if aside.height and aside.select(content.str.starts_with(first).all()).item():
        per_level = aside.select(columns)
    else:
        per_level = aside.group_by(content.str.head(1), maintain_order=True).agg(columns)
    return _level_rows(per_level)


def _rich_levels(aside: pl.DataFrame) -> pl.DataFrame:
    """``_levels`` of set-aside rich records (``_RICH_QUIET_LINE_RE``): the level is the
    column's text; the latest time is the wrapper's, where it wrote one. A record of no printed
    time (and none of a wrapper) has the time of the last rich record printed before it, a
    record kept and counted: set aside, it changes no latest time."""
    return aside.group_by(
        pl.col("content").str.slice(11, 8).str.strip_chars_end().alias("level"),
        maintain_order=True,
    ).agg(pl.len().cast(pl.Int64).alias("lines"), pl.col("wrapper_time").max().alias("latest"))


def _json_levels(aside: pl.DataFrame) -> pl.DataFrame:
    """``_levels`` of set-aside json records (``_JSON_QUIET_LINE_RE``): the level is cut at the
    literal separators around it (no quote before it but theirs, and none in the message but
    an escaped one), the time is the fixed-width text after ``_JSON_TIMESTAMP``, whose text
    order is its time order: the greatest per level is the latest, parsed alone (as
    ``_json_time`` parses every record's). When every line is of the first line's level (a busy
    log's access lines: its level and message keys, found once in each line), the greatest
    line holds the latest time: no line is cut and nothing grouped."""
    content = pl.col("content")
    stamp = content.str.slice(len(_JSON_TIMESTAMP), len(_STAMP))
    columns = [
        pl.len().cast(pl.Int64).alias("lines"),
        stamp.filter(pl.col("wrapper_time").is_null()).max().alias("_last"),
        pl.col("wrapper_time").max().alias("_wrapper"),
    ]
    texts = aside["content"]
    first = texts[0] if aside.height else ""
    at = first.find(_JSON_LEVEL) + len(_JSON_LEVEL)
    level = first[at : first.find(_JSON_LEVEL_END, at)]
    one_level = bool(aside.height) and bool(
        texts.str.contains(_JSON_LEVEL + level + _JSON_LEVEL_END, literal=True).all()
    )
    if one_level and aside["wrapper_time"].null_count() == aside.height:
        last = texts.max()[len(_JSON_TIMESTAMP) : len(_JSON_TIMESTAMP) + len(_STAMP)]
        per_level = pl.DataFrame(
            {"level": [level], "lines": [aside.height], "_last": [last], "_wrapper": [None]},
            schema_overrides={"lines": pl.Int64, "_wrapper": UTC_TIME},
        )
    elif one_level:
        per_level = aside.select(pl.lit(level).alias("level"), *columns)
    else:
        level_at = content.str.find(_JSON_LEVEL, literal=True) + len(_JSON_LEVEL)
        level_end = content.str.find(_JSON_LEVEL_END, literal=True)
        per_level = aside.group_by(
            content.str.slice(level_at, level_end - level_at).alias("level"), maintain_order=True
        ).agg(columns)
    return per_level.select("level", "lines", _latest(pl.col("_last"), _JSON_TIME_FORMAT))


def _level_rows(per_level: pl.DataFrame) -> pl.DataFrame:
    """Each level's name, count and latest time from its first line (``_first``), count,
    greatest line without a wrapper's time (``_last``) and latest wrapper time."""
    level_end = pl.col("_first").str.find(" ", literal=True)
    return per_level.select(
        pl.col("_first").str.slice(0, level_end).alias("level"),
        "lines",
        _latest(pl.col("_last").str.slice(level_end + 1, 23), _STD_TIME_FORMAT),
    )


def _latest(stamp: pl.Expr, time_format: str) -> pl.Expr:
    """A level's latest time: its latest wrapper time (``_wrapper``) or its greatest line's
    time text `stamp` read by `time_format` as a local time taken for UTC (as
    ``EventCollector`` times a record), whichever is later."""
    local = (
        stamp.str.to_datetime(time_format, time_unit="ms", strict=False)
        .cast(pl.Datetime("us"))
        .dt.replace_time_zone("UTC")
    )
    return pl.max_horizontal(pl.col("_wrapper"), local).alias("latest")


# Lines are set aside in a chunk only when at least one in QUIET_SHARE of about SAMPLE_LINES of
# its lines is a start of the layout looked for (a chunk of others costs a few thousand
# matches, not a search and a match of each line), and one in QUIET_SHARE holds none of the
# words (a chunk of dstack's own lines, nearly all kept, would only be looked at twice).
QUIET_SHARE = 4
SAMPLE_LINES = 1024


SET_ASIDE_LEVELS = {"level": pl.String(), "lines": pl.Int64(), "latest": UTC_TIME}


@dataclass
class SetAside:
    """The one-line records set aside from some lines, as their account needs them:
    their line numbers (their places in the sequence of records) and, per level, how many
    and the latest time (``SET_ASIDE_LEVELS``)."""

    lines: pl.Series
    levels: pl.DataFrame

    @property
    def height(self) -> int:
        return self.lines.len()

    @classmethod
    def none(cls) -> SetAside:
        return cls(pl.Series("line", [], pl.Int64), pl.DataFrame(schema=SET_ASIDE_LEVELS))

    @classmethod
    def joined(cls, parts: list[SetAside]) -> SetAside:
        """Several in order as one (their levels summed, the latest of each kept)."""
        if len(parts) == 1:
            return parts[0]
        levels = (
            pl.concat([part.levels for part in parts])
            .group_by("level", maintain_order=True)
            .agg(pl.col("lines").sum(), pl.col("latest").max())
        )
        return cls(pl.concat([part.lines for part in parts], rechunk=True), levels)
