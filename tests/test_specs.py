"""Spec history (pipeline/specs.py): what the evidence proves of a run's and a fleet's spec at
T, on the seed capture's real rows (dstack 0.22.5): a 0..1 fleet whose one instance served
web-0-0, where web-0-1's placement was refused "Fleet is at capacity" (TERMINATING at 09:09:01)
after `commands` was updated at 09:08:50."""

from __future__ import annotations

import shutil
import sqlite3
from datetime import UTC, datetime

import polars as pl
import pytest

from analyzer import open_sources
from analyzer.pipeline.exposure import exposure_report
from analyzer.pipeline.placement import HOLDER_CHUNK, holders_at
from tests.conftest import CAPTURES

SEED = CAPTURES / "v0.22.5" / "seed" / "server.db"
BEFORE_UPDATE = datetime(2026, 11, 2, 9, 8, 50, tzinfo=UTC)


@pytest.fixture
def seed(tmp_path):
    db = tmp_path / "server.db"
    shutil.copyfile(SEED, db)
    return db


def _service(db, as_of):
    (service,) = exposure_report(open_sources([db]), as_of).services
    return service


def _sql(db, statement: str) -> None:
    with sqlite3.connect(db) as connection:
        connection.execute(statement)


def test_the_capture_as_recorded_has_no_room_before_the_update(seed):
    service = _service(seed, BEFORE_UPDATE)
    assert service.surge_capacity == "none"
    assert service.fleets[0].nodes == "0..1"


def test_a_fleet_edited_after_the_refusal_is_unknown_at_t_never_the_final_spec(seed):
    # the fleet edited to 0..2 after the incident: dstack records no event for it, but the
    # refusal at 09:09:01 with 1 active instance contradicts a final spec with room for 2
    _sql(seed, "UPDATE fleets SET spec = replace(spec, '\"max\":1', '\"max\":2')")
    service = _service(seed, BEFORE_UPDATE)
    assert service.surge_capacity == "unknown"
    (fleet,) = service.fleets
    assert fleet.nodes.startswith("unknown at T: dstack refused a placement 'Fleet is at capacity'")
    assert "2026-11-02 09:09:01 with 1 active instance(s)" in fleet.nodes
    assert not fleet.can_add_node
    # after the last contradicting refusal the final spec is not contradicted
    later = _service(seed, datetime(2026, 11, 2, 9, 9, 2, tzinfo=UTC))
    assert later.fleets[0].nodes == "0..2"


def test_a_run_spec_changed_after_t_is_not_read_back_into_t(seed):
    # an update that changed resources and replicas after T: the final spec's are not T's
    _sql(
        seed,
        "UPDATE events SET message = replace(message, 'configuration.commands', "
        "'configuration.replicas, configuration.resources') WHERE message LIKE 'Run updated%'",
    )
    service = _service(seed, BEFORE_UPDATE)
    assert service.surge_capacity == "unknown"
    assert service.desired_replicas is None
    assert any(
        "'Run updated' changed replicas, resources after T" in reason for reason in service.reasons
    )
    # after the update no update came later: the final spec speaks
    assert _service(seed, datetime(2026, 11, 2, 9, 8, 55, tzinfo=UTC)).desired_replicas == 1


def test_the_finding_names_who_held_the_room_at_the_failure():
    # the seed: web-0-1 refused 'Fleet is at capacity' at 09:09:01; the 0..1 fleet's one
    # instance was held by web-0-0, the run's own old replica, until the cascade stopped it
    (finding,) = open_sources([SEED]).report.findings
    (held,) = [r for r in finding.capacity_foresight.reasons if r.startswith("at the failure")]
    assert held == (
        "at the failure (2026-11-02 09:09:01) fleet cpu-fleet was at capacity: this run's "
        "web-0-0 (deployment 0) held instance cpu-fleet-0 since 2026-11-02 09:00:41, until "
        "2026-11-02 09:09:20 (health: healthy, ready_flag)"
    )


def test_holders_are_the_jobs_on_the_fleet_not_stopped_at_the_failure():
    at = datetime(2026, 11, 2, 9, 9, 1, tzinfo=UTC)
    subs = pl.DataFrame(
        {
            "server": ["s"] * 3,
            "fleet_name": ["f", "f", "other"],
            "run_id": ["neighbour", "gone", "elsewhere"],
            "job_id": ["a", "b", "c"],
            "job_name": ["chat-0-0", "old-0-0", "x-0-0"],
            "deployment_num": [1, 0, 0],
            "instance_id": ["i1", "i1", "i2"],
            "instance_name": ["f-0", "f-0", "o-0"],
            "created_at": [datetime(2026, 11, 2, 9, 4, 31, tzinfo=UTC)] * 3,
            "stopped_at": [None, datetime(2026, 11, 2, 9, 5, tzinfo=UTC), None],
            "health": ["unknown", "healthy", "healthy"],
            "health_proof": [None, "ready_flag", "ready_flag"],
        }
    )
    runs = pl.DataFrame({"server": ["s"] * 3, "run_id": ["neighbour", "gone", "elsewhere"]})
    runs = runs.with_columns(pl.col("run_id").alias("run_name"))
    failures = pl.DataFrame(
        {"i": [0], "server": ["s"], "fleet_name": ["f"], "as_of": [at], "own": ["web"]}
    )
    held = holders_at(failures, subs, runs, 3)
    assert held.select("run_name", "job_name", "health").rows() == [
        ("neighbour", "chat-0-0", "unknown")
    ]


def test_holders_named_are_the_neighbours_first_then_the_earliest_placed_and_counted():
    """Per failure only the first `first` holders (other runs' before the failing run's own,
    each in placement order), each with its rank and how many held the room."""

    def at(minute):
        return datetime(2026, 11, 2, 9, minute, tzinfo=UTC)

    jobs = [("web", "w1", 1), ("chat", "c1", 3), ("web", "w0", 0), ("api", "a1", 2)]
    subs = pl.DataFrame(
        {
            "server": ["s"] * 4,
            "fleet_name": ["f"] * 4,
            "run_id": [run for run, _, _ in jobs],
            "job_id": [job for _, job, _ in jobs],
            "job_name": [f"{job}-0" for _, job, _ in jobs],
            "deployment_num": [0] * 4,
            "instance_id": ["i1"] * 4,
            "instance_name": ["f-0"] * 4,
            "created_at": [at(minute) for _, _, minute in jobs],
            "stopped_at": [None] * 4,
            "health": ["healthy"] * 4,
            "health_proof": ["ready_flag"] * 4,
        }
    )
    runs = pl.DataFrame({"server": ["s"] * 3, "run_id": ["web", "chat", "api"]})
    runs = runs.with_columns(pl.col("run_id").alias("run_name"))
    # two failures ranked apart (holders_at ranks HOLDER_CHUNK failures at a time); at 09:01
    # only web's own w0 and w1 held the room
    failures = pl.DataFrame(
        {
            "i": [0, HOLDER_CHUNK],
            "server": ["s", "s"],
            "fleet_name": ["f", "f"],
            "as_of": [at(5), at(1)],
            "own": ["web", "web"],
        }
    )
    held = holders_at(failures, subs, runs, 3)
    assert held.select("i", "job_id", "rank", "of").rows() == [
        (0, "a1", 0, 4),
        (0, "c1", 1, 4),
        (0, "w0", 2, 4),
        (HOLDER_CHUNK, "w0", 0, 2),
        (HOLDER_CHUNK, "w1", 1, 2),
    ]


PROVIDER_REFUSAL = (
    "Failed to provision in fleet 'cpu-fleet': tried 1 of 1 offers, all failed.\n"
    "See https://dstack.ai/docs/guides/troubleshooting/#provisioning"
)
CHAT = "c4a7c4a7c4a7c4a7c4a7c4a7c4a7c4a7"


def _room_for_two(db) -> None:
    """The seed's fleet as 0..2; with room, dstack asks the provider, so web-0-1's refusal is
    the provider's (consistent with the spec: no contradiction)."""
    _sql(db, "UPDATE fleets SET spec = replace(spec, '\"max\":1', '\"max\":2')")
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE jobs SET termination_reason_message = ? WHERE job_name = 'web-0-1'",
            (PROVIDER_REFUSAL,),
        )


def _neighbour_updated(db, at: str) -> None:
    """A second service, chat, in the same fleet (the web run's row, renamed and RUNNING),
    whose `dstack apply` of a commands change dstack accepted at `at`, no job created since."""
    with sqlite3.connect(db) as connection:
        columns = [r[1] for r in connection.execute("PRAGMA table_info(runs)")]
        values = ", ".join(
            {"id": "?", "run_name": "'chat'", "status": "'RUNNING'"}.get(c, c) for c in columns
        )
        connection.execute(
            f"INSERT INTO runs ({', '.join(columns)}) SELECT {values} FROM runs "
            "WHERE run_name = 'web'",
            (CHAT,),
        )
        connection.execute(
            "INSERT INTO events SELECT 'e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1', message, ?, "
            "actor_user_id FROM events WHERE message LIKE 'Run updated%'",
            (at,),
        )
        connection.execute(
            "INSERT INTO event_targets SELECT 'f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1f1', "
            "'e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1', entity_project_id, 'RUN', ?, 'chat', ?, NULL, "
            "NULL FROM event_targets WHERE entity_type = 'RUN' LIMIT 1",
            (CHAT, CHAT),
        )


def _web(db, as_of):
    report = exposure_report(open_sources([db]), as_of)
    (web,) = [s for s in report.services if s.run_name == "web"]
    return web


def test_room_promised_to_a_neighbours_accepted_update_is_no_room(seed):
    _room_for_two(seed)
    assert _web(seed, BEFORE_UPDATE).surge_capacity == "available"
    # chat's update accepted 2.5 s before T: its surge replica is not created yet, and will
    # take the fleet's one free node
    _neighbour_updated(seed, "2026-11-02 09:08:47.500000")
    web = _web(seed, BEFORE_UPDATE)
    assert web.surge_capacity == "unknown"
    (promise,) = [r for r in web.reasons if r.startswith("run chat's update")]
    assert "deployment 1 (accepted at 2026-11-02 09:08:47) has not created its surge" in promise
