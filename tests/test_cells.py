"""analyzer.sources.cells: the typed checks' shortcut (values a regex vouches for are not parsed)
says of every value what the full check says."""

from __future__ import annotations

import polars as pl
from hypothesis import example, given, settings
from hypothesis import strategies as st

from analyzer.model import id_hex, parse_db_time
from analyzer.sources import cells

# near what a server writes: every part a few characters either side of its range, other
# scripts' digits, spaces, a T, a zone, a leap second, long fractions
_DIGIT = st.sampled_from("0123456789٣") | st.just("0")
_TIME_PARTS = st.tuples(
    st.sampled_from(["2026", "0000", "0001", "9999", "10000", "-001", "٢٠٢٦", " 2026", "99"]),
    st.sampled_from(["01", "02", "03", "04", "07", "08", "09", "11", "12", "13", "00", "1"]),
    st.sampled_from(["01", "28", "29", "30", "31", "32", "00", "9"]),
    st.sampled_from([" ", "T", "  "]),
    st.sampled_from(["00", "23", "24", "9"]),
    st.sampled_from(["00", "59", "60"]),
    st.sampled_from(["00", "59", "60", "61"]),
    st.sampled_from(["", ".", ".3", ".123456", ".1234567", ".123456789", ".1234567890"]),
    st.sampled_from(["", "Z", "+00:00", "+00", " ", "\n", "+01:00"]),
)
_NEAR_TIME = _TIME_PARTS.map(lambda p: "{}-{}-{}{}{}:{}:{}{}{}".format(*p))
_NEAR_INTEGER = st.builds(
    lambda sign, digits, tail: sign + digits + tail,
    st.sampled_from(["", "-", "+", " "]),
    st.text(_DIGIT, min_size=0, max_size=21),
    st.sampled_from(["", ".0", "e3", " ", ".5"]),
)
_VALUES = st.lists(st.none() | st.text(max_size=30) | _NEAR_TIME | _NEAR_INTEGER, max_size=40)


def _full(frame: pl.DataFrame, name: str, check: cells._Check) -> list[bool]:
    """The check over every value, without the shortcut."""
    bad = cells._present(name) & ~check.ok.fill_null(False)
    return frame.select(bad).to_series().to_list()


@settings(max_examples=300, deadline=None)
@given(_VALUES)
@example(["2026-02-28 09:09:20.483000", "2026-02-30 09:09:20", "0000-01-01 00:00:00"])
@example(["٢٠٢٦-01-01 00:00:00", "2026-01-01 00:00:60", "12", "-9223372036854775808", "1e3"])
def test_the_shortcut_says_of_every_value_what_the_full_check_says(values):
    """Every typed column of a table checked at once (the times and integers through their
    shortcut, the booleans and numbers without one), each as its own full check says."""
    columns = cells.Columns(
        key=None, times=("t",), integers=("i",), booleans=("b",), numbers=("n",)
    )
    frame = pl.DataFrame({name: values for name in "tibn"}, schema=dict.fromkeys("tibn", pl.String))
    frame = frame.with_columns(pl.col("t").shift(1), pl.col("b").reverse())  # others' rows
    checks = cells._checks(columns, frozenset(frame.columns))
    assert [name for name, check in checks.items() if check.certain] == ["t", "i"]
    bad = cells._bad(frame, checks)
    assert bad.columns == ["t", "i", "b", "n"]
    for name, check in checks.items():
        assert bad[name].to_list() == _full(frame, name, check), name


def test_a_value_the_shortcut_does_not_vouch_for_is_still_named():
    frame = pl.DataFrame(
        {"id": ["a", "b", "c"], "t": ["2026-11-02 09:09:20.483000", "2026-02-30 10:00:00", None]}
    )
    ledger = cells.Ledger()
    kept = cells.checked(frame, "runs", "db", cells.Columns(times=("t",)), ledger)
    assert kept["t"].to_list() == ["2026-11-02 09:09:20.483000", None, None]
    (rows,) = [part for parts in ledger.found.values() for part in parts]
    assert rows["place"].to_list() == ["row 2 (id b)"]
    assert "'2026-02-30 10:00:00' is not a time between years 1 and 9999" in rows["problem"][0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.none() | st.text(max_size=30) | _NEAR_TIME, max_size=40))
@example(
    [
        "2026-11-02 09:09:20.483",
        "2026-11-02 09:09:20",
        "2026-11-02 09:09:20.",
        "0001-01-01 00:00:00",
    ]
)
@example(
    ["2024-02-29 00:00:00", "2026-02-29 00:00:00", " 2026-11-02 09:09:20", "2026-11-02T09:09:20Z"]
)
def test_times_parses_every_value_as_parse_db_time_does(values):
    """`cells.times` (fixed-width fields for the values CERTAIN_TIME vouches for) gives what
    `parse_db_time` gives of every value, the others' too, of several columns at once (another
    column, not parsed, kept as it is)."""
    frame = pl.DataFrame({"t": values, "u": values[::-1], "v": values}, schema=dict.fromkeys("tuv"))
    frame = frame.cast(pl.String)
    parsed = cells.times(frame, ("t", "u"))
    assert parsed.columns == ["t", "u", "v"] and parsed["v"].equals(frame["v"])
    for name in ("t", "u"):
        full = frame.select(parse_db_time(pl.col(name))).to_series()
        assert parsed[name].dtype == full.dtype
        assert parsed[name].to_physical().to_list() == full.to_physical().to_list()  # year 0


_NEAR_ID = st.text(st.sampled_from("-a0 \t\u00a0\u2003\n_"), max_size=6)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.none() | st.text(max_size=12) | _NEAR_ID, max_size=40))
@example([" - ", "- -", "-\u00a0-", "\u2003", "", "-", "--a", " A ", "\u00a0-\u00a0"])
def test_has_id_says_what_normalise_id_makes_something_of(values):
    """`cells.has_id` (one regex) is true exactly where `id_hex` leaves some text."""
    frame = pl.DataFrame({"id": values}, schema={"id": pl.String})
    expected = frame.select(id_hex(pl.col("id")).fill_null("") != "").to_series().to_list()
    assert frame.select(cells.has_id(pl.col("id"))).to_series().to_list() == expected
