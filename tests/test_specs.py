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
from analyzer.pipeline.placement import holders_at
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
    assert service.desired_replicas is None
    # T's resources are not lost: web-0-0, of the deployment in force at T, runs them
    assert (
        "'Run updated' changed replicas, resources after T: the run's final spec is not T's; "
        "T's resources are those in the job_spec_data of web-0-0 (deployment 0)"
    ) in service.reasons
    assert service.surge_capacity == "none"  # its one-node fleet is full, as recorded
    # after the update no update came later: the final spec speaks
    assert _service(seed, datetime(2026, 11, 2, 9, 8, 55, tzinfo=UTC)).desired_replicas == 1


CPU_2 = '"cpu":{"arch":null,"count":{"min":2'
CPU_4 = '"cpu":{"arch":null,"count":{"min":4'


def _resources_raised_later(db) -> None:
    """The seed's update changed resources to `cpu 4..` (the final run spec and the new
    replica's job spec say so), and the fleet holds a second, idle 2-CPU instance."""
    _sql(
        db,
        "UPDATE events SET message = replace(message, 'configuration.commands', "
        "'configuration.resources') WHERE message LIKE 'Run updated%'",
    )
    _sql(db, f"UPDATE runs SET run_spec = replace(run_spec, '{CPU_2}', '{CPU_4}')")
    _sql(
        db,
        f"UPDATE jobs SET job_spec_data = replace(job_spec_data, '{CPU_2}', '{CPU_4}') "
        "WHERE job_name = 'web-0-1'",
    )
    with sqlite3.connect(db) as connection:
        connection.execute("CREATE TEMP TABLE copied AS SELECT * FROM instances")
        connection.execute(
            "UPDATE copied SET id = 'a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2', name = 'cpu-fleet-1', "
            "created_at = '2026-11-02 09:01:00.000000', started_at = '2026-11-02 09:01:05.000000'"
        )
        connection.execute("INSERT INTO instances SELECT * FROM copied")


def test_resources_changed_after_t_are_read_from_the_jobs_of_ts_deployment(seed):
    # before the update the service ran `cpu 2..` (web-0-0's job spec): the idle 2-CPU
    # instance fits T's replica, though not the final spec's `cpu 4..`
    _resources_raised_later(seed)
    service = _service(seed, BEFORE_UPDATE)
    assert service.resources == ["0: cpu 2.., memory 8GB.., disk 100GB.."]
    assert service.surge_capacity == "available"
    assert any(
        "instance cpu-fleet-1 of fleet cpu-fleet has idle blocks" in r for r in service.reasons
    )
    # after the update the final spec is T's
    after = _service(seed, datetime(2026, 11, 2, 9, 8, 55, tzinfo=UTC))
    assert after.resources == ["0: cpu 4.., memory 8GB.., disk 100GB.."]
    assert after.surge_capacity == "none"


def test_the_findings_foresight_asks_the_spec_the_update_put_in_force(seed):
    # the same evidence: just before the update the service ran `cpu 2..`, but the surge
    # replica runs the update's `cpu 4..` (web-0-1's job spec), which the idle 2-CPU instance
    # does not fit, and the fleet is at its maximum: no room, foreseeable
    _resources_raised_later(seed)
    (finding,) = open_sources([seed]).report.findings
    foresight = finding.capacity_foresight
    assert foresight.surge_capacity == "none"
    assert foresight.foreseeable is True
    assert not any("after T" in r for r in foresight.reasons)


def test_where_a_replica_goes_is_unknown_at_t_when_no_job_proves_it(seed):
    # the same change, but no job of T's deployment is left to read T's resources from
    _resources_raised_later(seed)
    _sql(seed, f"UPDATE jobs SET job_spec_data = replace(job_spec_data, '{CPU_2}', '{CPU_4}')")
    _sql(seed, "UPDATE jobs SET job_spec_data = replace(job_spec_data, 'requirements', 'x')")
    service = _service(seed, BEFORE_UPDATE)
    assert service.surge_capacity == "unknown"
    assert "'Run updated' changed resources after T: the run's final spec is not T's" in (
        service.reasons
    )


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
    held = holders_at(failures, subs, runs)
    assert held.select("run_name", "job_name", "health").rows() == [
        ("neighbour", "chat-0-0", "unknown")
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


def test_the_findings_foresight_reads_the_fleets_nodes_at_t_not_the_final_spec(seed):
    # the fleet edited to 0..2 after the incident (no event): before the update, the refusal
    # at 09:09:01 with 1 active instance proves the final nodes are not T's, so the finding's
    # foresight cannot say the surge had room (the final spec read back would say it had)
    _sql(seed, "UPDATE fleets SET spec = replace(spec, '\"max\":1', '\"max\":2')")
    (finding,) = open_sources([seed]).report.findings
    foresight = finding.capacity_foresight
    assert foresight.surge_capacity == "unknown"
    assert foresight.foreseeable is None
    assert any(
        "fleet cpu-fleet's nodes unknown at T: dstack refused a placement 'Fleet is at "
        "capacity' at 2026-11-02 09:09:01 with 1 active instance(s)" in r
        for r in foresight.reasons
    )
    # the capture as recorded: the final 0..1 agrees with the refusal, no room foreseen
    (plain,) = open_sources([SEED]).report.findings
    assert plain.capacity_foresight.surge_capacity == "none"
    assert plain.capacity_foresight.foreseeable is True


def test_the_findings_foresight_reads_the_run_spec_at_t_not_a_later_update(seed):
    # a second update after the failing one changed replicas: the final desired count is not
    # the count before the first update, and the foresight says so
    with sqlite3.connect(seed) as connection:
        connection.execute(
            "INSERT INTO events SELECT 'e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2', "
            "replace(replace(message, 'configuration.commands', 'configuration.replicas'), "
            "'Deployment: 1', 'Deployment: 2'), '2026-11-02 09:09:05.000000', actor_user_id "
            "FROM events WHERE message LIKE 'Run updated%'"
        )
        connection.execute(
            "INSERT INTO event_targets SELECT 'f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2f2', "
            "'e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2e2', entity_project_id, entity_type, entity_id, "
            "entity_name, entity_run_id, entity_fleet_id, entity_gateway_id FROM event_targets "
            "WHERE entity_type = 'RUN' AND event_id IN "
            "(SELECT id FROM events WHERE message LIKE 'Run updated. Deployment: 1%')"
        )
    (finding,) = open_sources([seed]).report.findings
    assert any(
        "'Run updated' changed replicas after T" in r for r in finding.capacity_foresight.reasons
    )
