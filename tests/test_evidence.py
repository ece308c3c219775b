"""The evidence stage's shortcuts for one database (pipeline/evidence.py, api.Audit): each gives
what the general path gives, on small hand-built frames."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl

from analyzer.api import Audit
from analyzer.pipeline.evidence import (
    _ONCE_PER_KEY,
    Evidence,
    _all_unique,
    _in_order,
    _merge_events,
    _once_per_key,
)


def _at(second: int | None) -> datetime | None:
    return None if second is None else datetime(2026, 11, 2, 9, 0, second, tzinfo=UTC)


def _events(servers, seconds, seqs) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "server": servers,
            "time": [_at(s) for s in seconds],
            "seq": seqs,
            "message": [f"m{i}" for i in range(len(seqs))],
        },
        schema_overrides={"time": pl.Datetime("us", "UTC")},
    )


def test_events_in_order_are_left_as_they_are_and_others_sorted():
    keys = ["server", "time", "seq"]
    ordered = _events(["a", "a", "a", "b"], [1, 2, None, 0], [0, 1, 2, 0])
    assert _in_order(ordered, keys) is ordered
    shuffled = ordered[[3, 2, 0, 1]]
    assert _in_order(shuffled, keys).equals(shuffled.sort(keys, nulls_last=True))
    assert _in_order(shuffled, keys).equals(ordered)
    empty = ordered.clear()
    assert _in_order(empty, keys).is_empty()


def test_keys_are_unique_only_when_no_two_rows_share_one():
    frame = _events(["a", "a", "b"], [1, 1, 1], [0, 1, 0])
    assert _all_unique(frame, ["server", "time", "seq"])
    assert not _all_unique(frame, ["server", "time"])
    assert _all_unique(frame.clear(), ["server", "time"])


def _instances(ids: list[str]) -> pl.DataFrame:
    return pl.DataFrame(
        {"server": ["s"] * len(ids), "instance_id": ids, "provenance": ["db"] * len(ids)}
    )


def test_a_frame_found_once_per_key_is_trusted_while_it_lives_and_only_it():
    key = ["server", "instance_id"]
    shared = _instances(["a", "b"])
    assert _once_per_key(shared, key)
    assert id(shared) in _ONCE_PER_KEY  # the next partition's look is a lookup
    assert _once_per_key(shared, key)
    assert not _once_per_key(shared, ["server"])  # another key is looked at
    ident = id(shared)
    del shared
    assert ident not in _ONCE_PER_KEY  # forgotten with the frame
    duplicated = _instances(["a", "a"])
    assert not _once_per_key(duplicated, key)
    assert id(duplicated) not in _ONCE_PER_KEY


def test_an_event_seen_twice_is_one_event_with_both_provenances():
    from analyzer.model import EVENTS_SCHEMA, conform

    row = {
        "server": "s",
        "entity_type": "run",
        "entity_id": "r",
        "run_id": "r",
        "message": "Run status changed SUBMITTED -> PROVISIONING",
        "time": _at(1),
        "kind": "run_status",
    }
    first = conform(pl.DataFrame([{**row, "provenance": ["events:1"]}]), EVENTS_SCHEMA).collect()
    again = conform(pl.DataFrame([{**row, "provenance": ["log:7"]}]), EVENTS_SCHEMA).collect()
    (merged,) = _merge_events([first, again]).iter_rows(named=True)
    assert merged["provenance"] == ["events:1", "log:7"]
    (alone,) = _merge_events([first]).iter_rows(named=True)
    assert alone["provenance"] == ["events:1"]
    assert _merge_events([first]).schema == first.schema


def test_a_runs_rows_are_those_a_semi_join_keeps():
    runs = pl.DataFrame(
        {"server": ["s", "s", "t"], "run_id": ["r1", "r2", "r1"], "project": ["p", "q", "p"]}
    )
    rows = pl.DataFrame(
        {
            "server": ["s", "s", "t", "t", "s"],
            "run_id": ["r1", "r2", "r1", "r2", None],
            "n": [0, 1, 2, 3, 4],
        }
    )
    audit = Audit(Evidence(runs=runs, jobs=pl.DataFrame(), events=pl.DataFrame()), project="p")
    expected = rows.join(audit.runs.select("server", "run_id"), on=["server", "run_id"], how="semi")
    assert audit._of_runs(rows)["n"].to_list() == expected["n"].to_list() == [0, 2]


def test_a_database_alone_has_no_clock_to_jump():
    from analyzer.pipeline.reconcile import _clock_jumps

    def jumped(basis: str) -> pl.DataFrame:
        events = pl.DataFrame(
            {
                "source": ["x", "x", "x"],
                "seq": [0, 1, 2],
                "time": [_at(1), None, _at(3)],
                "time_basis": [basis] * 3,
            },
            schema_overrides={"time": pl.Datetime("us", "UTC")},
        )
        return _clock_jumps(Evidence(runs=pl.DataFrame(), jobs=pl.DataFrame(), events=events))

    database, log = jumped("db_utc"), jumped("log_local_unaligned")  # the log's clock goes on
    assert database.drop("time_basis").equals(log.drop("time_basis"))
    assert database["_after_jump"].to_list() == [False] * 3
    assert database["_raw_time"].equals(database["time"].alias("_raw_time"))
