"""dstack's `events` and `event_targets` tables -> canonical events (reference 3.3, 3.4): one row
per event and run or job it targets, in time order.

The two tables are the largest a server holds (at 16k runs 608k events with 718k targets), so
the mapping works on what it needs and touches each value once: the join pairs row positions
on the events' ids alone, the order is found on the sort keys alone, and every other column is
gathered once, in that order. A column with few distinct values (a target's type, an actor,
the ids a run's or a job's hundreds of events share) is mapped once per value (`per_value`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import polars as pl

import analyzer.catalogue as catalogue
from analyzer.model import ENGINE, id_from_hex, id_hex, normalise_enum
from analyzer.sources import cells
from analyzer.sources.adbc import release_freed
from analyzer.sources.attach import attach_job_runs
from analyzer.sources.cells import written_anew

# Kept of the targets: runs' and jobs' (the others, instances' and fleets', are a third of the
# rows); an event has a row per target it names.
RUN_OR_JOB = ["run", "job"]
# Ties in time are broken by the event and its target, so the order (and `seq`) is the
# content's, not whatever order the join gave.
ORDER_KEYS = ["time", "event_id", "entity_type", "entity_id"]
# `normalise_id` in its two steps, each once per distinct id (per_value)
ID_STEPS = (id_hex, id_from_hex)
# What the mapping gives, in this order (the catalogue adds what each message says).
EVENT_COLUMNS = [
    "message",
    "time",
    "time_text",
    "entity_type",
    "entity_id",
    "entity_name",
    "run_id",
    "actor",
    "server",
    "source",
    "time_basis",
    "origin",
    "provenance",
    "seq",
]


def map_events(
    events: pl.DataFrame,
    targets: pl.DataFrame,
    *,
    server: str,
    label: str,
    users: pl.DataFrame,
    jobs: pl.DataFrame,
    runs: pl.DataFrame,
) -> tuple[pl.DataFrame, datetime | None]:
    """The events of runs and jobs from the checked text of both tables (cells.checked), and
    the latest moment any event of the table speaks of (a project's, a fleet's or a user's too:
    the server was at work then). `users`: id -> user name."""
    times = cells.times(events.select("recorded_at"), ("recorded_at",)).to_series().alias("time")
    entity_type = per_value(targets["entity_type"], normalise_enum)
    kept = (
        targets.select("event_id")
        .with_row_index("target")
        .filter(entity_type.is_in(RUN_OR_JOB))  # before the ids are cleaned: a third less
        .select(_uuid(pl.col("event_id")), "target")
    )
    pairs = (
        events.select(_uuid(pl.col("id")))
        .with_row_index("event")
        .join(kept, on="event_uuid")
        .select("event", "target")
    )
    del kept
    latest = times.max() if pairs.height else None
    event, target = pairs["event"], pairs["target"]
    del pairs
    # every column the events take from each table, in the order of the pairs, the text
    # passed through as read written anew: each table goes (the caller holds neither), and
    # what its driver allocated it in goes back to the system, as soon as it has been taken
    from_targets = pl.select(
        pl.lit(target),
        pl.lit(entity_type.gather(target)),
        pl.lit(per_value(targets["entity_id"].gather(target), *ID_STEPS)),
        written_anew(pl.lit(targets["entity_name"].gather(target))),
        pl.lit(per_value(targets["entity_run_id"].gather(target), *ID_STEPS)),
    )
    del targets, entity_type, target
    release_freed()
    taken = pl.select(
        pl.lit(times.gather(event)),
        written_anew(pl.lit(events["id"].gather(event))).alias("event_id"),
        written_anew(pl.lit(events["message"].gather(event))),
        written_anew(pl.lit(events["recorded_at"].gather(event))).alias("time_text"),
        pl.lit(per_value(events["actor_user_id"].gather(event), *ID_STEPS, _actor(users))).alias(
            "actor"
        ),
    ).hstack(from_targets)
    del events, times, event, from_targets
    release_freed()
    order = in_order(taken, [*ORDER_KEYS, "target"])  # a duplicated target: in the table's order
    frame = (
        taken[order]
        .with_columns(
            pl.when(pl.col("entity_type") == "run")
            .then(pl.col("entity_id"))
            .otherwise(pl.col("entity_run_id"))
            .alias("run_id"),
            pl.lit(server).alias("server"),
            pl.lit(label).alias("source"),
            pl.lit("db_utc").alias("time_basis"),
            pl.lit("events_table").alias("origin"),
            pl.concat_list([pl.concat_str([pl.lit("events:"), pl.col("event_id")])]).alias(
                "provenance"
            ),
            pl.int_range(pl.len(), dtype=pl.Int64).alias("seq"),
        )
        .select(EVENT_COLUMNS)
    )
    del taken, order
    parsed = catalogue.parse_event_messages_of(frame)
    return attach_job_runs(parsed, jobs=jobs, runs=runs), latest


def _uuid(raw: pl.Expr) -> pl.Expr:
    """An event's id as the join of an event and its targets compares it (case and dashes
    aside: a dashed id in one table is the undashed one in the other)."""
    return raw.str.to_lowercase().str.replace_all("-", "", literal=True).alias("event_uuid")


def _actor(users: pl.DataFrame) -> Callable[[pl.Expr], pl.Expr]:
    """Who recorded an event, of its `actor_user_id` normalised (`ID_STEPS`): `user <name>`, the
    id where no user row names it, and `system` where no user did (dstack's background tasks).
    `users`: id -> user (a duplicated id: its first row)."""
    named = users.unique("id", keep="first", maintain_order=True)

    def actor(actor_id: pl.Expr) -> pl.Expr:
        name = actor_id.replace_strict(named["id"], named["user"], default=None)
        return (
            pl.when(actor_id.is_null())
            .then(pl.lit("system"))
            .otherwise(pl.concat_str([pl.lit("user "), pl.coalesce(name, actor_id)]))
        )

    return actor


def per_value(column: pl.Series, *steps: Callable[[pl.Expr], pl.Expr]) -> pl.Series:
    """`steps` (text to text, value by value, one after the other) of each value of `column`,
    computed once per distinct value: the column is made categorical (each value hashed once,
    a code per row), its distinct values and a null mapped and the results gathered by code.
    The steps are one query, each a select of its own over the one before, so that a step
    that reads its input several times (`id_from_hex`) reads it computed."""
    codes = column.cast(pl.Categorical(pl.Categories.random()))
    name = column.name
    distinct = codes.to_frame(name).select(pl.col(name).unique().drop_nulls()).to_series()
    mapped = (
        pl.concat([distinct.cast(pl.String), pl.Series([None], dtype=pl.String)])
        .to_frame(name)
        .lazy()
    )
    for step in steps:
        mapped = mapped.select(step(pl.col(name)).alias(name))
    values = mapped.collect(engine=ENGINE).to_series()
    of_null = values[-1]
    places = distinct.to_physical()
    table = pl.Series(name, [None], dtype=pl.String)
    if places.len():
        table = table.extend_constant(None, places.max()).scatter(places, values.head(-1))
    gathered = table.gather(codes.to_physical())
    if of_null is None:
        return gathered
    return pl.select(pl.when(codes.is_null()).then(pl.lit(of_null)).otherwise(gathered)).to_series()


def in_order(frame: pl.DataFrame, keys: list[str]) -> pl.Series:
    """The row positions of `frame.sort(keys, nulls_last=True, maintain_order=True)`: by the
    first key (a time) and, among the few rows that share one, by all the keys. Sorting every
    row by its text keys costs twice as much, by the time and a tie rank as much again: the
    rows sharing a time are rearranged among the places the sort by time gave them (their
    times are the same, in the same order), and most often are in order already."""
    first = keys[0]
    rows = frame.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"), *keys)
    ordered = rows.sort(first, nulls_last=True, maintain_order=True)
    shared = ordered.select(pl.col(first).is_duplicated()).to_series()
    if not shared.any():
        return ordered["_row"]
    places = shared.arg_true()
    tied = ordered.filter(shared).sort(keys, nulls_last=True, maintain_order=True)["_row"]
    return ordered["_row"].scatter(places, tied)
