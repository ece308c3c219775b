"""analyzer.sources.dstack_tables: the events' order (time first, then the event and its
target), whatever order the join of events and targets gave."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.sources.dstack_tables import _in_order

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
    assert _in_order(frame, KEYS).equals(expected)


def test_rows_that_share_a_time_out_of_order_are_put_in_order():
    frame = pl.DataFrame(
        {
            "time": [5, 1, 5, 5],
            "event_id": ["z", "a", "b", "b"],
            "entity_type": ["run"] * 4,
            "entity_id": ["1", "1", "2", "1"],
        }
    )
    assert _in_order(frame, KEYS)["entity_id"].to_list() == ["1", "1", "2", "1"]
    assert _in_order(frame, KEYS)["event_id"].to_list() == ["a", "b", "b", "z"]
