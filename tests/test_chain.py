"""The evidence chain's events in columns (analyzer.pipeline.chain): which events a finding
quotes and the item each becomes, on small hand-built events frames."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl

from analyzer.model import EVENTS_SCHEMA
from analyzer.pipeline.chain import from_event, quoted_columns, quoted_events

AT = datetime(2026, 11, 2, 9, 30, 1, 250000, tzinfo=UTC)


def _events(*rows: dict) -> pl.DataFrame:
    base = {name: None for name in EVENTS_SCHEMA}
    return pl.DataFrame(
        [{**base, "server": "s", "run_id": "r", "time": AT, **row} for row in rows],
        schema=EVENTS_SCHEMA,
    )


def _items(events: pl.DataFrame) -> list:
    return [from_event(row) for row in events.select(quoted_columns()).iter_rows(named=True)]


def test_a_database_event_is_quoted_with_its_entity_actor_and_sources():
    [item] = _items(
        _events(
            {
                "time_basis": "db_utc",
                "entity_type": "job",
                "entity_name": "web-0-0",
                "message": "Job status changed RUNNING -> TERMINATING",
                "actor": "user alice",
                "provenance": ["events:0a1b2c", "server.log:12"],
            }
        )
    )
    assert item.time == AT
    assert item.source == "events:0a1b2c; server.log:12"
    assert item.text == "job web-0-0: Job status changed RUNNING -> TERMINATING (actor: user alice)"


def test_the_system_actor_and_a_missing_name_say_nothing():
    [item] = _items(
        _events(
            {
                "time_basis": "db_utc",
                "entity_type": "run",
                "entity_name": "",
                "message": "Run status changed RUNNING -> TERMINATING",
                "actor": "system",
                "provenance": [],
            }
        )
    )
    assert (item.source, item.text) == ("", "Run status changed RUNNING -> TERMINATING")


def test_a_time_of_day_only_line_keeps_no_datetime_and_says_its_time():
    [item] = _items(
        _events(
            {
                "time": None,
                "time_text": "09:30:01.250",
                "time_basis": "time_of_day_only",
                "entity_type": "job",
                "entity_name": "web-0-0",
                "message": "terminating",
                "provenance": ["server.log:7"],
            }
        )
    )
    assert item.time is None
    assert item.text == "[09:30:01.250 local, date unknown] job web-0-0: terminating"


def test_only_the_events_a_finding_quotes_are_picked():
    job = {"entity_type": "job"}
    frame = _events(
        {"kind": "run_updated", "entity_type": "run", "entity_id": "r", "message": "update"},
        {"kind": "run_status", "entity_type": "run", "new_status": "terminating", "message": "a"},
        {"kind": "run_status", "entity_type": "run", "old_status": "terminating", "message": "b"},
        {"kind": "run_status", "entity_type": "run", "new_status": "running", "message": "no"},
        {**job, "kind": "job_created", "entity_id": "failed", "message": "created"},
        {**job, "kind": "job_created", "entity_id": "victim", "message": "no"},
        {**job, "kind": "job_ready", "entity_id": "victim", "message": "ready"},
        {**job, "kind": "job_ready", "entity_id": "failed", "message": "no"},
        {**job, "kind": "job_status", "entity_id": "failed", "new_status": "terminating",
         "message": "failed"},
        {**job, "kind": "job_status", "entity_id": "failed", "new_status": "terminated",
         "message": "no"},
        {**job, "kind": "job_status", "entity_id": "victim", "new_status": "terminated",
         "message": "stopped"},
        {**job, "kind": "job_status", "entity_id": "other", "new_status": "terminating",
         "message": "no"},
    )  # fmt: skip
    picked = frame.filter(
        quoted_events(pl.col("entity_id") == "failed", pl.col("entity_id") == "victim")
    )
    assert picked["message"].to_list() == [
        "update",
        "a",
        "b",
        "created",
        "ready",
        "failed",
        "stopped",
    ]
