"""analyzer.sources.table_events: the events' order (time first, then the event and its
target), whatever order the join of events and targets gave, and a mapping done once per
distinct value; analyzer.sources.dstack_tables: the time columns it parses once."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.model import normalise_enum, normalise_id
from analyzer.sources.dstack_tables import ALIVE_COLUMNS, TIME_COLUMNS
from analyzer.sources.table_events import ID_STEPS, in_order, map_events, per_value

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
    # in steps: normalise_id's two, then one of their result
    expected = column.to_frame().select(system(normalise_id(pl.col("c"))).alias("c")).to_series()
    assert per_value(column, *ID_STEPS, system).equals(expected)


def _events_of(events: dict, targets: dict, users: dict | None = None):
    users = users or {"id": ["aaaaaaaa-0000-0000-0000-000000000001"], "user": ["alice"]}
    return map_events(
        pl.DataFrame(events, schema=dict.fromkeys(events, pl.String)),
        pl.DataFrame(targets, schema=dict.fromkeys(targets, pl.String)),
        server="s",
        label="db",
        users=pl.DataFrame(users, schema=dict.fromkeys(users, pl.String)),
        jobs=pl.DataFrame(),
        runs=None,
    )


E1, E2 = "e1e1e1e1000000000000000000000001", "e2e2e2e2000000000000000000000002"
RUN = "bbbbbbbb000000000000000000000002"
JOB = "cccccccc000000000000000000000003"


def test_an_event_pairs_with_each_run_or_job_target_whatever_the_case_and_dashes_of_its_id():
    events = {
        "id": ["E1E1E1E1-0000-0000-0000-000000000001", E2],
        "message": ["Run status changed SUBMITTED -> RUNNING", "Job status changed X -> Y"],
        "recorded_at": ["2026-01-01 00:00:02.000000", "2026-01-01 00:00:01"],
        "actor_user_id": ["AAAAAAAA000000000000000000000001", None],
    }
    targets = {
        "event_id": [E1, "E2E2E2E2-0000-0000-0000-000000000002", E2, E1],
        "entity_type": ["RUN", " job ", "RUN", "INSTANCE"],
        "entity_id": [RUN, JOB.upper(), RUN, "dddddddd000000000000000000000004"],
        "entity_name": ["web", "web-0-0", "web", "i-1"],
        "entity_run_id": [RUN, RUN, RUN, None],
    }
    frame, latest = _events_of(events, targets)
    dashed = "bbbbbbbb-0000-0000-0000-000000000002"
    assert frame.select("entity_type", "entity_id", "run_id", "actor", "seq").rows() == [
        ("job", "cccccccc-0000-0000-0000-000000000003", dashed, "system", 0),
        ("run", dashed, dashed, "system", 1),
        ("run", dashed, dashed, "user alice", 2),
    ]
    assert frame["provenance"].to_list()[2] == ["events:E1E1E1E1-0000-0000-0000-000000000001"]
    assert frame["time_text"].to_list() == ["2026-01-01 00:00:01"] * 2 + [events["recorded_at"][0]]
    assert latest.isoformat() == "2026-01-01T00:00:02+00:00"


def test_an_unknown_actor_is_named_by_its_id_and_no_run_or_job_event_gives_no_latest_time():
    events = {
        "id": ["e1", "e2"],
        "message": ["a", "b"],
        "recorded_at": ["2026-01-01 00:00:01", "2026-01-01 00:00:05"],
        "actor_user_id": ["ffffffff000000000000000000000009", None],
    }
    targets = {
        "event_id": ["e1", "e2"],
        "entity_type": ["JOB", "FLEET"],
        "entity_id": [JOB, "x"],
        "entity_name": ["web-0-0", "f"],
        "entity_run_id": [None, None],
    }
    frame, latest = _events_of(events, targets)
    assert frame["actor"].to_list() == ["user ffffffff-0000-0000-0000-000000000009"]
    assert frame["run_id"].to_list() == [None]  # no run told: attached later, or never
    assert latest.isoformat() == "2026-01-01T00:00:05+00:00"
    _, latest = _events_of(events, {**targets, "entity_type": ["FLEET", "USER"]})
    assert latest is None


def test_every_column_alive_in_reads_is_a_time_column_timed_parses():
    """`_alive_in` takes the instances' and fleets' ALIVE_COLUMNS as `_timed` parsed them: a
    column added to one list and not the other would compare text with times."""
    for table in ("instances", "fleets"):
        assert set(ALIVE_COLUMNS[table]) <= set(TIME_COLUMNS[table]), table
