"""One cell of a dstack table, whatever it holds: every value a reader hands over passes here
before the mapping reads it, so a damaged or hostile cell costs one named limitation, never a
crash, a silent null or the whole audit.

- Bytes that are not UTF-8 (a reader hands text over as Binary where it can hold any bytes:
  SQLite, Parquet) never reach polars as a string: the value is read as unknown (null).
- A value its column cannot hold (a time that is no time between years 1 and 9999, `NaN` or
  `1e400` in an integer column, `maybe` in a boolean one) is read as unknown: one rule for
  every column, said in a `damaged_values` limitation naming the table, the column and the row.
- A row without an id cannot be told from any other: it is left out, and counted.
- A text value over `TEXT_LIMIT` bytes is kept as its first `HEAD_BYTES`, its length and its
  SHA-256; a JSON document over `JSON_LIMIT` is read as unknown (`huge_values`): one hostile
  cell can neither fill the memory nor slow every later stage that touches the text.

Damaged values count as unparsed records of their input, so `--strict` refuses them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import polars as pl

from analyzer.model import parse_db_time
from analyzer.sources.base import InputInfo, Limitation, ReadOptions, SourceData

TEXT_LIMIT = 16 * 1024
HEAD_BYTES = 1024
JSON_LIMIT = 32 * 1024 * 1024
# What a reader that measures JSON documents itself (SQLite, in SQL) puts in place of one over
# JSON_LIMIT, followed by its length in bytes: a JSON object never starts with \x01.
JSON_OVER_LIMIT = "\x01over the limit "
SHOWN_PLACES = 5  # damaged places named per table; the rest are counted
SHOWN_VALUE = 40  # characters of a damaged value quoted in a limitation

YEARS = r"^\s*(?:-\d+|\d{5,}|0000)-\d\d-\d\d"  # a year outside 1-9999, which %Y would misread
BOOLEAN_TEXTS = ["1", "0", "t", "f", "true", "false"]
INT64_BOUND = 9.223372036854775e18


@dataclass(frozen=True)
class Columns:
    """What the columns of one table hold, for the checks: its key and its typed columns."""

    key: str | None = "id"
    times: tuple[str, ...] = ()
    integers: tuple[str, ...] = ()
    booleans: tuple[str, ...] = ()
    numbers: tuple[str, ...] = ()
    json: tuple[str, ...] = ()


DAMAGE_SCHEMA = {"row": pl.Int64, "column": pl.String, "problem": pl.String, "kind": pl.String}
# kind: "damaged" (read as unknown), "no_id" (row left out), "huge" (kept cut), "json" (a JSON
# document over the limit, read as unknown)
UNPARSED_KINDS = ("damaged", "no_id", "json")


def damage(rows: pl.Series | list[int], column: str, problem: str | pl.Series, kind: str):
    """Damage found at `rows` (0-based positions in the frame as read) of `column`."""
    rows = pl.Series("row", rows, dtype=pl.Int64)
    problems = (
        problem if isinstance(problem, pl.Series) else pl.repeat(problem, rows.len(), eager=True)
    )
    return pl.DataFrame(
        {
            "row": rows,
            "column": pl.repeat(column, rows.len(), eager=True, dtype=pl.String),
            "problem": problems.cast(pl.String),
            "kind": pl.repeat(kind, rows.len(), eager=True, dtype=pl.String),
        }
    )


@dataclass
class Ledger:
    """The damage found in the cells of one input, by the file (or database) it was read from."""

    found: dict[tuple[str, str], list[pl.DataFrame]] = field(default_factory=dict)
    uncounted: set[tuple[str, str]] = field(default_factory=set)  # said, counted elsewhere
    # (where, table) -> the selection in SQL a table was read through (`selected_by`): its
    # damage is counted, and its rows numbered, among the rows it selected
    selections: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, where: str, table: str, rows: pl.DataFrame, counted: bool = True) -> None:
        if rows.height:
            self.found.setdefault((where, table), []).append(rows)
            if not counted:
                self.uncounted.add((where, table))

    def record(self, data: SourceData) -> None:
        """Limitations for `data`, one per table and kind of damage."""
        for (where, table), parts in self.found.items():
            rows = pl.concat(parts).sort("row", "column")
            damaged = rows.filter(pl.col("kind").is_in(["damaged", "no_id"]))
            huge = rows.filter(pl.col("kind").is_in(["huge", "json"]))
            selection = self.selections.get((where, table))
            named = f"table {table}" + (f" ({selection})" if selection else "")
            if damaged.height:
                data.limitations.append(
                    Limitation("damaged_values", f"{named}: {_said(damaged)}", where)
                )
            if huge.height:
                data.limitations.append(Limitation("huge_values", f"{named}: {_said(huge)}", where))
            unparsed = rows.filter(pl.col("kind").is_in(UNPARSED_KINDS))
            if unparsed.height and (where, table) not in self.uncounted:
                data.unparsed_values[where] = data.unparsed_values.get(where, 0) + unparsed.height
                data.damage_notes.setdefault(where, []).append(
                    f"{unparsed.height} damaged value(s) in {named}, first: "
                    + _said(unparsed.head(1))
                )


def selected_by(options: ReadOptions) -> str | None:
    """What a read of the run tables narrowed by a selection in SQL says of its damage: it is
    counted, and its rows numbered, among the rows that selection keeps (what --since and
    --project leave out is left out on purpose; a partition's other rows are its siblings'
    share, and an event of runs of several partitions is in each one's share). None: the read
    is not narrowed."""
    said = [f"partition {options.partition[0]}/{options.partition[1]}"] if options.partition else []
    said += ["--since"] if options.since else []
    said += ["--project"] if options.project else []
    return f"rows selected by {' and '.join(said)}, numbered among them" if said else None


def apply_to(info: InputInfo, data: SourceData) -> None:
    """Count the damaged values read from `info`'s input as its unparsed records."""
    info.unparsed += data.unparsed_values.get(info.path, 0)
    info.notes.extend(data.damage_notes.get(info.path, []))


def _said(rows: pl.DataFrame) -> str:
    shown = rows.head(SHOWN_PLACES)
    parts = []
    for row in shown.iter_rows(named=True):
        if row["kind"] == "no_id":
            why = "" if row["problem"] == "no id" else f" ({row['problem']})"
            parts.append(f"{row['place']} has no id{why} and is left out")
        else:
            parts.append(f"{row['place']}, {row['column']}: {row['problem']}")
    more = f"; and {rows.height - shown.height} more" if rows.height > shown.height else ""
    return "; ".join(parts) + more


def checked(
    frame: pl.DataFrame,
    table: str,
    where: str,
    columns: Columns,
    ledger: Ledger,
    found: pl.DataFrame | None = None,
    *,
    counted: bool = True,
    first_row: int = 0,
) -> pl.DataFrame:
    """`frame` (a table as read, text or bytes) as text the mapping can trust: damaged values
    null, huge ones cut, rows without an id left out; what was found goes to `ledger`. `found`:
    damage the reader itself found (at positions of `frame`); `counted`: whether it counts as
    unparsed here (a table each partition reads whole is counted once); `first_row`: how many
    rows of the table were read before `frame` (a table checked a batch at a time)."""
    parts = [found] if found is not None and found.height else []
    frame, decoded = decode(frame)
    parts += decoded
    frame, cut = _capped(frame, columns.json)
    parts += cut
    frame, typed = _typed(frame, columns)
    parts += typed
    keep = None
    if columns.key is not None and columns.key in frame.columns:
        # an id that `normalise_id` makes nothing of ("-", " - ") is no id either
        keep = frame.select(has_id(pl.col(columns.key))).to_series()
        if not keep.all():
            parts.append(damage((~keep).arg_true(), columns.key, "no id", "no_id"))
        else:
            keep = None
    if parts:
        rows = pl.concat([p.select(DAMAGE_SCHEMA.keys()).cast(DAMAGE_SCHEMA) for p in parts])
        placed = _placed(_one_per_key(rows, columns.key), frame, columns.key, first_row)
        ledger.add(where, table, placed, counted)
    return frame if keep is None else frame.filter(keep)


def has_id(key: pl.Expr) -> pl.Expr:
    """Whether `id_hex` leaves any text of `key` (text): a character neither whitespace nor a
    dash, or whitespace between two others (which no strip reaches). One regex, where
    `id_hex` writes each id anew three times."""
    return key.str.contains(r"[^\s-]|\S\s+\S").fill_null(False)


def checked_as_read(
    reader: object, frame: pl.DataFrame, table: str, columns: Columns, ledger: Ledger
) -> pl.DataFrame:
    """`checked`, its damage said as `reader` read `table` (each optional): the file it came
    from (`source_of`), damage it found itself (`found`), whether it counts it
    (`counts_damage`), the selection in SQL it read it through (`selection`), or the damage
    of the whole table, found once when the table was split by bucket (`whole_damage`: then
    this share's own is not said again)."""
    where = getattr(reader, "source_of", lambda _table: reader.label)(table)
    found = getattr(reader, "found", {}).pop(table, None)
    whole = getattr(reader, "whole_damage", lambda _table: None)(table)
    if whole is not None:
        for rows in whole:
            ledger.add(where, table, rows)
        return checked(frame, table, where, columns, Ledger(), found)
    if selection := getattr(reader, "selection", lambda _table: None)(table):
        ledger.selections[where, table] = selection
    counted = getattr(reader, "counts_damage", lambda _table: True)(table)
    return checked(frame, table, where, columns, ledger, found, counted=counted)


def _one_per_key(rows: pl.DataFrame, key: str | None) -> pl.DataFrame:
    """A damaged id is the row left out, said once: `row 3 has no id (invalid UTF-8)`."""
    if key is None:
        return rows
    on_key = pl.col("column") == key
    ids = rows.filter(on_key).unique("row", keep="first", maintain_order=True)
    return pl.concat([rows.filter(~on_key), ids.with_columns(pl.lit("no_id").alias("kind"))])


def _placed(
    rows: pl.DataFrame, frame: pl.DataFrame, key: str | None, first_row: int
) -> pl.DataFrame:
    """`rows` with each place named: `row N (id X)`, N counted from 1 in the order read (the
    table's, `first_row` rows before `frame`)."""
    number = pl.lit("row ") + (pl.col("row") + 1).cast(pl.String)
    shifted = rows.with_columns(pl.col("row") + first_row)
    if key is None or key not in frame.columns:
        return shifted.with_columns(number.alias("place"))
    ids = frame[key].cast(pl.String).gather(rows["row"].cast(pl.UInt32))
    return shifted.with_columns(
        pl.when(ids.is_null() | (ids.str.strip_chars() == ""))
        .then(number)
        .otherwise(number + pl.lit(" (id ") + ids.str.slice(0, 64) + pl.lit(")"))
        .alias("place")
    )


# --- bytes -> text ---------------------------------------------------------------------------


def decode(frame: pl.DataFrame) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """Binary columns as text; a value that is not UTF-8 becomes null (and is reported).
    Other columns (a reader's guess for an empty or all-null column) become text as well."""
    found = []
    replaced = []
    for name, dtype in frame.schema.items():
        if dtype != pl.Binary:
            if dtype != pl.String:
                replaced.append(frame[name].cast(pl.String))
            continue
        column = frame[name]
        try:
            replaced.append(column.cast(pl.String))
            continue
        except pl.exceptions.PolarsError:
            pass
        bad = _not_utf8(column)
        replaced.append(_text_without(column, bad))
        found.append(damage(bad, name, "invalid UTF-8", "damaged"))
    if replaced:
        frame = frame.with_columns(replaced)
    return frame, found


def _not_utf8(column: pl.Series, offset: int = 0) -> list[int]:
    """Positions of the values that are not UTF-8, found by halving: polars checks a whole
    slice at once, so k damaged values cost about k * log2(n) checks of shrinking slices."""
    if column.len() <= 64:
        return [
            offset + i
            for i, value in enumerate(column.to_list())
            if value is not None and not _is_utf8(value)
        ]
    try:
        column.cast(pl.String)
        return []
    except pl.exceptions.PolarsError:
        half = column.len() // 2
        return _not_utf8(column.slice(0, half), offset) + _not_utf8(
            column.slice(half), offset + half
        )


def _text_without(column: pl.Series, bad: list[int]) -> pl.Series:
    """`column` as text with the values at `bad` null. Nulling them in place is not enough:
    polars checks the bytes a null still points at, so the good runs are cast one by one."""
    if len(bad) > 1000:
        values = column.to_list()
        for row in bad:
            values[row] = None
        return pl.Series(column.name, values, dtype=pl.Binary).cast(pl.String)
    pieces, start = [], 0
    for row in bad:
        pieces += [
            column.slice(start, row - start).cast(pl.String),
            pl.Series([None], dtype=pl.String),
        ]
        start = row + 1
    pieces.append(column.slice(start).cast(pl.String))
    return pl.concat(pieces).alias(column.name)


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def lossy(frame: pl.DataFrame) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """A frame a reader could only decode with U+FFFD in place of bytes that are not UTF-8:
    each value holding one is read as unknown, like a value that is not UTF-8 elsewhere."""
    found = []
    replaced = []
    for name, dtype in frame.schema.items():
        if dtype != pl.String:
            continue
        hit = frame[name].str.contains("\ufffd", literal=True).fill_null(False)
        if hit.any():
            found.append(damage(hit.arg_true(), name, "invalid UTF-8", "damaged"))
            replaced.append(pl.when(~hit).then(frame[name]).alias(name))
    if replaced:
        frame = frame.with_columns(replaced)
    return frame, found


def owned(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with its text written anew (`written_anew`)."""
    text = [name for name, dtype in frame.schema.items() if dtype == pl.String]
    return frame.with_columns(written_anew(pl.col(name)) for name in text)


def written_anew(text: pl.Expr) -> pl.Expr:
    """`text` written anew, in polars' own memory. A value a mapping passes through as read (a
    job's name, an event's message) still points into the buffers a reader's driver handed
    over, and keeps them alive for as long as the canonical frame lives: through ADBC, every
    column of each batch of rows it was read in, as the driver over-allocated them (at 16k
    runs, three such columns of runs, jobs and instances held 115 MB through the whole
    audit). Concatenating each value with nothing writes it anew."""
    return pl.concat_str([text, pl.lit("")])


# --- huge values -----------------------------------------------------------------------------


def cut_text(raw: bytes) -> str:
    """A huge value as what is kept of it: its first HEAD_BYTES (whole characters), then its
    length and SHA-256, so it can still be matched with the original."""
    head = raw[:HEAD_BYTES].decode("utf-8", "ignore")
    digest = hashlib.sha256(raw).hexdigest()
    return f"{head}… [cut at {HEAD_BYTES} of {len(raw)} bytes; sha256 {digest}]"


def cut_long(frame: pl.DataFrame, columns: tuple[str, ...]) -> tuple[pl.DataFrame, pl.Series]:
    """`frame` with each text value of `columns` over TEXT_LIMIT kept as `cut_text` does, and
    the positions of the rows that had one (for sources that are not tables: a log's lines)."""
    frame, found = _capped(frame, (), columns)
    rows = (
        pl.concat([f["row"] for f in found]).unique().sort()
        if found
        else pl.Series([], dtype=pl.Int64)
    )
    return frame, rows


def _capped(
    frame: pl.DataFrame, json: tuple[str, ...], only: tuple[str, ...] | None = None
) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    found = []
    replaced = []
    strings = [n for n, t in frame.schema.items() if t == pl.String and (only is None or n in only)]
    if not strings:
        return frame, found
    # one query for every column: its longest value, and whether a JSON column has one over
    # the limit (most tables have none: their columns are not looked at again)
    documents = tuple(n for n in strings if n in json)
    sizes = frame.select(_sizes(tuple(strings), documents)).row(0)
    any_over = dict(zip(documents, sizes[len(strings) :], strict=True))
    for name, size in zip(strings, sizes[: len(strings)], strict=True):
        if size is None:
            continue
        column = frame[name]
        if name in json:
            if any_over[name]:
                over = frame.select(_json_over(pl.col(name))).to_series()
                lengths = column.filter(over).str.len_bytes()
                claimed = column.filter(over).str.strip_prefix(JSON_OVER_LIMIT)
                length = pl.select(
                    pl.when(claimed.str.contains(r"^\d+$"))
                    .then(claimed)
                    .otherwise(lengths.cast(pl.String))
                ).to_series()
                problem = pl.select(
                    pl.lit("a JSON document of ")
                    + length
                    + pl.lit(f" bytes, over the {JSON_LIMIT}-byte limit: read as unknown")
                ).to_series()
                found.append(damage(over.arg_true(), name, problem, "json"))
                replaced.append(pl.when(~over).then(column).alias(name))
        elif size > TEXT_LIMIT:
            big = (column.str.len_bytes() > TEXT_LIMIT).fill_null(False)
            rows = big.arg_true()
            values = [cut_text(value.encode()) for value in column.gather(rows).to_list()]
            problem = pl.Series([f"kept {value[value.rindex('[') :]}" for value in values])
            found.append(damage(rows, name, problem, "huge"))
            replaced.append(column.scatter(rows, values))
    if replaced:
        frame = frame.with_columns(replaced)
    return frame, found


@lru_cache(maxsize=256)
def _sizes(strings: tuple[str, ...], documents: tuple[str, ...]) -> tuple[pl.Expr, ...]:
    """`_capped`'s survey of a table's shape (built once, as `_checks` are). Read only."""
    return (
        *(pl.col(n).str.len_bytes().max() for n in strings),
        *(_json_over(pl.col(n)).any().alias(f"_over_{n}") for n in documents),
    )


def _json_over(column: pl.Expr) -> pl.Expr:
    """A JSON cell dstack's export marked as over its limit, or longer than the limit."""
    return (
        column.str.starts_with(JSON_OVER_LIMIT) | (column.str.len_bytes() > JSON_LIMIT)
    ).fill_null(False)


# --- typed columns ---------------------------------------------------------------------------


def integer(expr: pl.Expr) -> pl.Expr:
    """Integer text (`5`, ` 5 `, `5.0`, `1e3`) as Int64; anything else (NaN, 1e23, 1e400, 2.5,
    words) null, never an error."""
    text = expr.cast(pl.String).str.strip_chars()
    number = text.cast(pl.Float64, strict=False)
    whole = number.is_finite() & (number == number.floor()) & (number.abs() < INT64_BOUND)
    return pl.coalesce(
        text.cast(pl.Int64, strict=False),
        pl.when(whole).then(number).cast(pl.Int64, strict=False),
    )


def _present(name: str) -> pl.Expr:
    return pl.col(name).cast(pl.String).str.strip_chars().fill_null("") != ""


def _time_ok(name: str) -> pl.Expr:
    text = pl.col(name).cast(pl.String)
    return ~text.str.contains(YEARS) & parse_db_time(text).dt.year().is_between(1, 9999)


# Values these accept certainly (what a dstack server writes), found by one cheap match: the
# full check (a parse) runs over the others only. A time: year 0001-9999, a day
# its month has in every year (February 29th is parsed), no leap second, up to 6 fraction
# digits, nothing %Y would misread (YEARS) and nothing `parse_db_time` strips; an integer:
# digits the Int64 cast takes as they are. [0-9], not \d: the regex's \d takes every script's.
CERTAIN_TIME = (
    r"^(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])-"
    r"(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|"
    r"(?:0[13578]|1[02])-31) (?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?$"
)
CERTAIN_INTEGER = r"^-?[0-9]{1,18}$"


def times(frame: pl.DataFrame, names: tuple[str, ...]) -> pl.DataFrame:
    """`frame` with its text columns `names` parsed as `parse_db_time` parses them, at a third
    of its cost on what a dstack server writes: a value CERTAIN_TIME vouches for is its
    fixed-width date and time (polars parses a format without `%.f` by position, `%.f` through
    chrono: 0.04 s against 0.15 s at 608k events) and its fraction as microseconds; only the
    others go through `parse_db_time`. One query for every column's regex and parse; a value
    the regex vouches for is never null, so a column has others only when it has more nulls
    parsed than as text, and only then are they found and parsed (most tables have none)."""
    if not names:
        return frame

    def fixed(name: str) -> pl.Expr:
        text = pl.col(name)
        whole = text.str.slice(0, 19).str.to_datetime("%Y-%m-%d %H:%M:%S", time_unit="us")
        fraction = text.str.slice(20).str.pad_end(6, "0").cast(pl.Int64)
        certain = text.str.contains(CERTAIN_TIME).fill_null(False)
        return pl.when(certain).then(whole + pl.duration(microseconds=fraction))

    parsed = frame.with_columns(
        fixed(name).dt.replace_time_zone("UTC").alias(name) for name in names
    )
    for name in names:
        if parsed[name].null_count() == frame[name].null_count():
            continue
        others = (parsed[name].is_null() & frame[name].is_not_null()).arg_true()
        slow = frame.select(parse_db_time(pl.col(name).gather(others))).to_series()
        parsed = parsed.with_columns(parsed[name].scatter(others, slow))
    return parsed


@dataclass(frozen=True)
class _Check:
    name: str  # the column checked
    accepts: Callable[[str], pl.Expr]  # of a column: whether a present value is acceptable
    not_: str  # what it is not when it is not
    certain: str | None = None  # a regex of values certainly acceptable (not checked again)

    @property
    def ok(self) -> pl.Expr:
        """Whether a present value is acceptable: built when asked, since a column with a
        `certain` regex needs it only where a value is doubted (a time's is a parse, the
        costliest expression to build)."""
        return self.accepts(self.name)

    @property
    def bad(self) -> pl.Expr:
        """Whether a value is present and not acceptable."""
        return (_present(self.name) & ~self.ok.fill_null(False)).alias(self.name)

    @cached_property
    def first(self) -> pl.Expr:
        """`_bad`'s first look: whether `certain` does not vouch for a value, or else `bad`
        (built once: `_checks` keeps the check)."""
        if self.certain is None:
            return self.bad
        text = pl.col(self.name).cast(pl.String)
        return (~text.str.contains(self.certain).fill_null(True)).alias(self.name)


@lru_cache(maxsize=256)
def _checks(columns: Columns, present: frozenset[str]) -> dict[str, _Check]:
    """column -> its check (built once per table's shape: a database and its exports, and a
    table checked batch by batch, ask again; building the expressions costs more than
    running them on a small table). Read only."""
    checks = [
        *(
            _Check(n, _time_ok, "not a time between years 1 and 9999", CERTAIN_TIME)
            for n in columns.times
        ),
        *(_Check(n, _is_integer, "not an integer", CERTAIN_INTEGER) for n in columns.integers),
        *(_Check(n, _is_boolean, "not a boolean") for n in columns.booleans),
        *(_Check(n, _is_finite, "not a finite number") for n in columns.numbers),
    ]
    return {check.name: check for check in checks if check.name in present}


def _is_integer(name: str) -> pl.Expr:
    return integer(pl.col(name)).is_not_null()


def _is_boolean(name: str) -> pl.Expr:
    return pl.col(name).cast(pl.String).str.strip_chars().str.to_lowercase().is_in(BOOLEAN_TEXTS)


def _is_finite(name: str) -> pl.Expr:
    number = pl.col(name).cast(pl.String).str.strip_chars().cast(pl.Float64, strict=False)
    return number.is_finite()


def _bad(frame: pl.DataFrame, checks: dict[str, _Check]) -> pl.DataFrame:
    """Whether each value of each checked column is present and not acceptable (a null is never
    bad: not present). One query for the whole table finds the bad values of the columns
    without a `certain` regex, and the values each regex does not vouch for; the full checks
    of those columns run over those rows only, in one more query (most tables have none)."""
    first = frame.select(check.first for check in checks.values())
    bad = {name: first[name] for name in checks}
    doubted = [name for name, check in checks.items() if check.certain and bad[name].any()]
    if doubted:  # the full checks over those rows (a value a regex vouches for passes them)
        # of the columns found (each regex run once: an expression used twice runs twice)
        rows = first.select(pl.any_horizontal(doubted)).to_series().arg_true()
        judged = frame.select(pl.col(doubted).gather(rows)).select(
            checks[name].bad for name in doubted
        )
        nothing = pl.Series(dtype=pl.Boolean).extend_constant(False, frame.height)
        bad |= {name: nothing.clone().scatter(rows, judged[name]).alias(name) for name in doubted}
    return pl.DataFrame(list(bad.values()))


def _typed(frame: pl.DataFrame, columns: Columns) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """Typed columns: a present value the column cannot hold becomes null, and is reported."""
    checks = _checks(columns, frozenset(frame.columns))
    if not checks or frame.height == 0:
        return frame, []
    bad = _bad(frame, checks)
    damaged = [name for name in bad.columns if bad[name].any()]
    found = []
    for name in damaged:
        rows = bad[name].arg_true()
        values = frame[name].cast(pl.String).gather(rows)
        problem = pl.select(
            pl.lit("") + _quoted(values) + pl.lit(f" is {checks[name].not_}: read as unknown")
        ).to_series()
        found.append(damage(rows, name, problem, "damaged"))
    if damaged:
        frame = frame.with_columns(
            pl.when(~bad[name]).then(pl.col(name)).alias(name) for name in damaged
        )
    return frame, found


def _quoted(values: pl.Series) -> pl.Expr:
    """A damaged value as a limitation quotes it: short, one line."""
    short = pl.lit(values).str.replace_all(r"[\x00-\x1f\x7f]", "?").str.slice(0, SHOWN_VALUE)
    longer = pl.lit(values).str.len_chars() > SHOWN_VALUE
    return pl.lit("'") + short + pl.when(longer).then(pl.lit("…'")).otherwise(pl.lit("'"))
