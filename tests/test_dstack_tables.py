"""analyzer.sources.table_events: the events' order (time first, then the event and its
target), whatever order the join of events and targets gave, and a mapping done once per
distinct value."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.model import normalise_enum, normalise_id
from analyzer.sources.table_events import in_order, per_value

KEYS = ["time", "event_id", "entity_type", "entity_id"]
_ROWS = st.lists(
    st.tuples(
        st.none() | st.integers(0, 6),
        st.none() | st.sampled_from(["e1", "e2", "e3"]),
        st.none() | st.sampled_from(["job", "run"]),
        st.sampled_from(["a", "b"]),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_ROWS)
def test_events_come_in_the_order_of_their_keys_and_ties_as_read(rows):
    frame = pl.DataFrame(
        rows,
        schema={
            "time": pl.Int64,
            "event_id": pl.String,
            "entity_type": pl.String,
            "entity_id": pl.String,
        },
        orient="row",
    ).with_row_index("read")  # full-key ties stay in the order read
    expected = frame.sort(KEYS, nulls_last=True, maintain_order=True)
    assert frame[in_order(frame, KEYS)].equals(expected)


def test_rows_that_share_a_time_out_of_order_are_put_in_order():
    frame = pl.DataFrame(
        {
            "time": [5, 1, 5, 5],
            "event_id": ["z", "a", "b", "b"],
            "entity_type": ["run"] * 4,
            "entity_id": ["1", "1", "2", "1"],
        }
    )
    ordered = frame[in_order(frame, KEYS)]
    assert ordered["entity_id"].to_list() == ["1", "1", "2", "1"]
    assert ordered["event_id"].to_list() == ["a", "b", "b", "z"]


_TEXTS = st.lists(
    st.none()
    | st.sampled_from(["", " RUN ", "job", "JOB", "A-B", "0123456789ABCDEF0123456789abcdef"]),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_TEXTS)
def test_a_mapping_per_distinct_value_is_the_mapping_of_every_row(values):
    column = pl.Series("c", values, dtype=pl.String)

    def system(text: pl.Expr) -> pl.Expr:
        return pl.when(text.is_null()).then(pl.lit("system")).otherwise(text.str.to_uppercase())

    for mapped in (normalise_enum, normalise_id, system):
        expected = column.to_frame().select(mapped(pl.col("c")).alias("c")).to_series()
        assert per_value(column, mapped).equals(expected)
