"""Spec history (pipeline/specs.py): what the evidence proves of a run's and a fleet's spec at
T, on the seed capture's real rows (dstack 0.22.5): a 0..1 fleet whose one instance served
web-0-0, where web-0-1's placement was refused "Fleet is at capacity" (TERMINATING at 09:09:01)
after `commands` was updated at 09:08:50."""

from __future__ import annotations

import json
import shutil
import sqlite3
from datetime import UTC, datetime
from unittest import mock

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer import open_sources
from analyzer.dstack import FINISHED_RUN_STATUSES
from analyzer.pipeline import placement
from analyzer.pipeline.exposure import exposure_report
from analyzer.pipeline.placement import holders_at, parse_spec, placed_jobs
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


def _copy_row(db, table: str, **values) -> None:
    """Insert a copy of `table`'s first row with `values` in place of its own."""
    with sqlite3.connect(db) as connection:
        columns = [row[1] for row in connection.execute(f"PRAGMA table_info({table})")]
        picked = [f":{c}" if c in values else c for c in columns]
        connection.execute(
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"SELECT {', '.join(picked)} FROM {table} LIMIT 1",
            values,
        )


@pytest.mark.parametrize("same_project", [True, False])
def test_holders_are_those_of_the_failing_runs_fleet_not_a_namesake(seed, same_project):
    """Fleet names are unique only within a project (fleets.project_id): a job of another
    project's fleet named as the seed's cpu-fleet never held the seed's room; a neighbour
    on the seed's own fleet did, and is named first."""
    project, fleet, instance = (
        "acme",
        "bb43b393b7d4400491039ef082804cfb",
        "1fd19613277d4a7eb093e4ff994d9cc6",
    )
    project_id = "ddacf41b8eb34ac8849ebdf2f5c0c0a2"
    if not same_project:
        project, project_id = "other", "0f0f0f0f0f0f4f0f8f0f0f0f0f0f0f01"
        fleet, instance = "0f0f0f0f0f0f4f0f8f0f0f0f0f0f0f02", "0f0f0f0f0f0f4f0f8f0f0f0f0f0f0f03"
        _copy_row(seed, "projects", id=project_id, name=project)
        _copy_row(seed, "fleets", id=fleet, project_id=project_id)
        _copy_row(seed, "instances", id=instance, project_id=project_id, fleet_id=fleet)
    run = "0f0f0f0f0f0f4f0f8f0f0f0f0f0f0f04"
    _copy_row(seed, "runs", id=run, project_id=project_id, run_name="chat", fleet_id=fleet)
    _copy_row(
        seed,
        "jobs",
        id="0f0f0f0f0f0f4f0f8f0f0f0f0f0f0f05",
        project_id=project_id,
        run_id=run,
        run_name="chat",
        job_name="chat-0-0",
        fleet_id=fleet,
        used_instance_id=instance,
        instance_id=instance,
        submitted_at="2026-11-02 09:04:31.000000",
        status="running",
        termination_reason=None,
        remove_at=None,
    )
    audit = open_sources([seed])
    (finding,) = [f for f in audit.report.findings if f.run_name == "web"]
    held = [r for r in finding.capacity_foresight.reasons if r.startswith("at the failure")]
    named = [r for r in held if "run chat's chat-0-0 (deployment 0) held instance" in r]
    assert len(named) == (1 if same_project else 0), held
    assert any("this run's web-0-0 (deployment 0) held" in r for r in held)


def test_holders_are_the_jobs_on_the_fleet_not_stopped_at_the_failure():
    at = datetime(2026, 11, 2, 9, 9, 1, tzinfo=UTC)
    subs = pl.DataFrame(
        {
            "server": ["s"] * 3,
            "fleet_id": ["f", "f", "other"],
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
        {"i": [0], "server": ["s"], "fleet_id": ["f"], "as_of": [at], "own": ["web"]}
    )
    held = holders_at(failures, placed_jobs(subs, runs), 3)
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
            "fleet_id": ["f"] * 4,
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
    # two failures of one fleet; at 09:01 only web's own w0 and w1 held the room
    failures = pl.DataFrame(
        {
            "i": [0, 7],
            "server": ["s", "s"],
            "fleet_id": ["f", "f"],
            "as_of": [at(5), at(1)],
            "own": ["web", "web"],
        }
    )
    held = holders_at(failures, placed_jobs(subs, runs), 3)
    assert held.select("i", "job_id", "rank", "of").rows() == [
        (0, "a1", 0, 4),
        (0, "c1", 1, 4),
        (0, "w0", 2, 4),
        (7, "w0", 0, 2),
        (7, "w1", 1, 2),
    ]


def _holders_by_hand(failures: list[dict], jobs: list[dict], first: int) -> list[tuple]:
    """holders_at's answer by its definition, one failure and one job at a time."""
    placed = sorted(jobs, key=lambda j: (j["created_at"], j["job_id"]))
    rows = []
    for f in failures:
        alive = [
            j
            for j in placed
            if (j["server"], j["fleet_id"]) == (f["server"], f["fleet_id"])
            and j["created_at"] <= f["as_of"]
            and (j["stopped_at"] is None or j["stopped_at"] > f["as_of"])
        ]
        named = sorted(alive, key=lambda j: j["run_id"] == f["own"])[:first]
        rows += [(f["i"], j["job_id"], rank, len(alive)) for rank, j in enumerate(named)]
    return rows


# few pairs are joined (placement._ranked_joined), more are found by descent: both, whatever
# the size of the example
@pytest.mark.parametrize("small_join", [placement.SMALL_JOIN, -1], ids=["joined", "descent"])
@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(
        st.tuples(
            st.sampled_from(["f", "g"]),
            st.sampled_from(["web", "chat", "api"]),
            st.integers(0, 12),
            st.one_of(st.none(), st.integers(0, 14)),
        ),
        max_size=40,
    ),
    failures=st.lists(
        st.tuples(st.sampled_from(["f", "g", "h"]), st.integers(0, 14), st.sampled_from(["web"])),
        min_size=1,
        max_size=8,
    ),
)
def test_holders_are_those_of_their_definition(small_join, jobs, failures):
    """The holders counted and the first named, found by a join of few pairs or by descent
    (placement._first_alive), are those of the definition on any fleet: ties in time, jobs
    stopped before they were placed, a failing run's own jobs among the first placed, fleets
    with no job."""

    def at(minute):
        return datetime(2026, 11, 2, 9, minute, tzinfo=UTC)

    rows = [
        {
            "server": "s",
            "fleet_id": fleet,
            "run_id": run,
            "job_id": f"j{n:02}",
            "job_name": f"j{n:02}",
            "deployment_num": 0,
            "instance_id": f"{fleet}-0",
            "instance_name": f"{fleet}-0",
            "created_at": at(created),
            "stopped_at": None if stopped is None else at(stopped),
            "health": "healthy",
            "health_proof": None,
        }
        for n, (fleet, run, created, stopped) in enumerate(jobs)
    ]
    asked = [
        {"i": i, "server": "s", "fleet_id": fleet, "as_of": at(minute), "own": own}
        for i, (fleet, minute, own) in enumerate(failures)
    ]
    schema = {"created_at": pl.Datetime("us", "UTC"), "stopped_at": pl.Datetime("us", "UTC")}
    subs = pl.DataFrame(rows, schema_overrides=schema) if rows else None
    if subs is None:
        columns = (*placement.PLACED_COLUMNS, "instance_id")  # what placed_jobs reads
        subs = pl.DataFrame(schema={**dict.fromkeys(columns, pl.String), **schema})
    runs = pl.DataFrame({"server": ["s"] * 3, "run_id": ["web", "chat", "api"]})
    with mock.patch.object(placement, "SMALL_JOIN", small_join):
        held = holders_at(
            pl.DataFrame(asked), placed_jobs(subs, runs.with_columns(run_name=pl.col("run_id"))), 3
        )
    assert held.select("i", "job_id", "rank", "of").rows() == _holders_by_hand(asked, rows, 3)


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


def _t(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 2, 9, minute, second, tzinfo=UTC)


CPU2 = '{"cpu":{"count":{"min":2,"max":null}}}'
CPU4 = '{"cpu":{"count":{"min":4,"max":null}}}'
FINAL = '{"replicas":2,"groups":null,"resources":' + CPU4 + ',"retry":null}'


def _history(updates: list[tuple], jobs: list[tuple], moments: list[datetime], final=FINAL):
    """run_spec_at over hand-built frames: one run r, `updates` (time, deployment, changed
    fields) and `jobs` (deployment, replica group, name, resources text)."""
    from analyzer.pipeline.specs import run_spec_at

    runs = pl.DataFrame(
        {"server": ["s"], "run_id": ["r"], "placement_spec": [final], "desired_replica_count": [2]}
    )
    events = pl.DataFrame(
        [("s", "r", "run_updated", at, dep, fields) for at, dep, fields in updates],
        schema=["server", "run_id", "kind", "time", "deployment_num", "changed_fields"],
        orient="row",
    )
    subs = pl.DataFrame(
        [("s", "r", *job) for job in jobs],
        schema=["server", "run_id", "deployment_num", "replica_group", "job_name", "resources"],
        orient="row",
    )
    probes = pl.DataFrame({"server": "s", "run_id": "r", "as_of": moments})
    return {row["as_of"]: row for row in run_spec_at(runs, subs, events, probes).to_dicts()}


def test_the_spec_in_force_follows_the_deployments_and_their_jobs():
    # deployment 1 changed commands (rolling), deployment 2 changed resources to cpu 4..:
    # before deployment 2, every job from T's deployment up to 1 runs T's resources
    updates = [
        (_t(5), 1, "configuration.commands"),
        (_t(8), 2, "configuration.resources, configuration.replicas"),
    ]
    jobs = [(0, "0", "a-0-0", CPU2), (1, "0", "a-0-1", CPU2), (2, "0", "a-0-2", CPU4)]
    spec = _history(updates, jobs, [_t(4), _t(6), _t(9)])
    before = spec[_t(4)]
    assert before["where_known"]
    assert parse_spec(before["placement_spec"])["resources"] == json.loads(CPU2)
    assert before["resources_from"] == (
        "the job_spec_data of a-0-0 (deployment 0), a-0-1 (deployment 1)"
    )
    assert before["desired_replica_count"] is None  # replicas changed later
    assert before["changed_later"] == ["replicas", "resources"]
    assert spec[_t(6)]["resources_from"] == "the job_spec_data of a-0-1 (deployment 1)"
    # after the last update the final spec is T's
    assert spec[_t(9)]["placement_spec"] == FINAL
    assert spec[_t(9)]["desired_replica_count"] == 2
    assert spec[_t(9)]["resources_from"] is None and spec[_t(9)]["where_known"]


def test_the_spec_at_t_is_unknown_where_its_jobs_disagree_or_are_gone():
    updates = [(_t(8), 1, "configuration.resources")]
    # two resources texts in T's deployment: which one T's spec held is not proven
    torn = _history(updates, [(0, "0", "a-0-0", CPU2), (0, "0", "a-0-1", CPU4)], [_t(4)])
    assert not torn[_t(4)]["where_known"]
    assert torn[_t(4)]["placement_spec"] == FINAL  # read only with where_known
    # no job of T's deployment left (only the new one's)
    gone = _history(updates, [(1, "0", "a-0-2", CPU4)], [_t(4)])
    assert not gone[_t(4)]["where_known"]
    # groups changed later: where a replica goes is unknown, whatever the jobs say
    regrouped = _history(
        [(_t(8), 1, "configuration.groups, configuration.resources")],
        [(0, "0", "a-0-0", CPU2)],
        [_t(4)],
    )
    assert not regrouped[_t(4)]["where_known"]
    assert regrouped[_t(4)]["desired_replica_count"] is None


def test_each_replica_group_gets_the_resources_of_its_own_jobs():
    final = json.dumps(
        {
            "groups": [
                {"name": "gpu", "replicas": 1, "resources": json.loads(CPU4)},
                {"name": "cpu", "replicas": 1, "resources": json.loads(CPU4)},
            ]
        }
    )
    jobs = [(0, "gpu", "a-0-0", CPU2), (0, "cpu", "a-1-0", CPU4)]
    spec = _history([(_t(8), 1, "configuration.resources")], jobs, [_t(4)], final)
    groups = parse_spec(spec[_t(4)]["placement_spec"])["groups"]
    assert [g["resources"] for g in groups] == [json.loads(CPU2), json.loads(CPU4)]
    # a group no job of T's deployment ran: unknown, never the final group's
    lone = _history([(_t(8), 1, "configuration.resources")], jobs[:1], [_t(4)], final)
    assert not lone[_t(4)]["where_known"]


def test_a_fleets_nodes_are_unknown_until_its_last_contradicting_refusal():
    from analyzer.pipeline.specs import fleet_nodes_at

    refusal = {
        "server": ["s", "s"],
        "run_id": ["r", "r"],
        "fleet_id": ["f", "f"],
        "termination_reason": ["failed_to_start_due_to_no_capacity"] * 2,
        "termination_reason_message": ["Fleet is at capacity"] * 2,
        "stopped_at": [_t(5), _t(7)],
        "last_processed_at": [_t(5), _t(7)],
    }
    runs = pl.DataFrame({"server": ["s"], "run_id": ["r"], "fleet_id": ["f"]})
    fleets = pl.DataFrame({"server": ["s"], "fleet_id": ["f"], "ssh": [False], "nodes_max": [2]})
    # one instance alive through both refusals, a second only from 09:06
    instances = pl.DataFrame(
        {
            "server": ["s", "s"],
            "fleet_id": ["f", "f"],
            "instance_id": ["i1", "i2"],
            "created_at": [_t(1), _t(6)],
            "ended_at": [None, None],
        },
        schema_overrides={"ended_at": pl.Datetime("us", "UTC")},
    )
    moments = pl.DataFrame({"server": "s", "fleet_id": "f", "as_of": [_t(4), _t(5, 30), _t(8)]})
    at = fleet_nodes_at(moments, pl.DataFrame(refusal), runs, fleets, instances)
    # 09:05 with 1 active < 2 contradicts the final nodes; 09:07 with 2 active does not
    assert at["nodes_refused_at"].to_list() == [_t(5), None, None]
    assert at["nodes_refused_active"].to_list() == [1, None, None]
    assert at["nodes_known"].to_list() == [False, True, True]


def test_an_accepted_update_that_creates_no_surge_promises_no_room(seed):
    # chat's update changed only fields dstack applies in place (replicas, priority): no new
    # replica is rolled out for it, so the free node stays free (jobs bumped in place:
    # pipeline_tasks/runs/active.py)
    _room_for_two(seed)
    _neighbour_updated(seed, "2026-11-02 09:08:47.500000")
    _sql(
        seed,
        "UPDATE events SET message = replace(message, 'configuration.commands', "
        "'configuration.replicas, configuration.priority') "
        "WHERE id = 'e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1e1'",
    )
    web = _web(seed, BEFORE_UPDATE)
    assert web.surge_capacity == "available"
    assert not any(r.startswith("run chat's update") for r in web.reasons)


def _promised_by_hand(updates, submissions, runs, moment) -> list[str]:
    """promised_surges' answer at one moment by its definition: every other run of the
    moment's fleet, its latest rolling update by T, no job of it created since, not finished
    by T."""
    _, run_id, as_of = moment
    fleet = {r["run_id"]: r for r in runs}
    said = []
    for other, row in fleet.items():
        if other == run_id or row["fleet_id"] != fleet[run_id]["fleet_id"]:
            continue
        if row["status"] in FINISHED_RUN_STATUSES and row["last_processed_at"] <= as_of:
            continue
        taken = [
            u
            for u in updates
            if u["run_id"] == other
            and u["time"] <= as_of
            and u["changed_fields"] != "configuration.replicas"
        ]
        if not taken:
            continue
        update = max(taken, key=lambda u: u["time"])
        if any(
            s["run_id"] == other and update["time"] < s["created_at"] <= as_of for s in submissions
        ):
            continue
        said.append(
            (
                update["time"],
                f"run {other}'s update to deployment {update['deployment_num']} (accepted at "
                f"{update['time']:%Y-%m-%d %H:%M:%S}) has not created its surge replica yet",
            )
        )
    return [text for _, text in sorted(said)]


@settings(max_examples=60, deadline=None)
@given(
    updates=st.lists(
        st.tuples(
            st.sampled_from(["chat", "api", "web", "batch"]),
            st.integers(0, 12),
            st.sampled_from(["configuration.commands", "configuration.replicas"]),
        ),
        max_size=8,
        unique_by=lambda u: (u[0], u[1]),
    ),
    created=st.lists(st.tuples(st.sampled_from(["chat", "api"]), st.integers(0, 12)), max_size=6),
    finished=st.sampled_from([None, "chat", "api"]),
    minutes=st.lists(st.integers(0, 13), min_size=1, max_size=5, unique=True),
)
def test_room_promised_is_that_of_its_definition(updates, created, finished, minutes):
    """A run's update promises room from its acceptance until its next update, its next job
    or its end: the spans met by the moments are what each moment sees of every other run
    of its fleet (an update of the replica count promises none)."""
    from analyzer.pipeline import specs

    def at(minute):
        return datetime(2026, 11, 2, 9, minute, tzinfo=UTC)

    rows = [
        {"server": "s", "run_id": run, "time": at(m), "deployment_num": n, "changed_fields": f}
        for n, (run, m, f) in enumerate(updates)
    ]
    subs = [{"server": "s", "run_id": run, "created_at": at(m)} for run, m in created]
    runs = [
        {
            "server": "s",
            "run_id": run,
            "fleet_id": "g" if run == "batch" else "f",  # batch's room is another fleet's
            "run_name": run,
            "status": "terminated" if run == finished else "running",
            "last_processed_at": at(7),
        }
        for run in ("web", "chat", "api", "batch")
    ]
    when = pl.Datetime("us", "UTC")
    found = specs.promised_surges(
        pl.DataFrame(
            rows,
            schema={
                "server": pl.String,
                "run_id": pl.String,
                "time": when,
                "deployment_num": pl.Int64,
                "changed_fields": pl.String,
            },
        ),
        pl.DataFrame(subs, schema={"server": pl.String, "run_id": pl.String, "created_at": when}),
        pl.DataFrame(runs),
        pl.DataFrame({"server": "s", "run_id": "web", "as_of": [at(m) for m in minutes]}),
    )
    said = {row["as_of"]: row["promised"] for row in found.iter_rows(named=True)}
    for minute in minutes:
        expected = _promised_by_hand(rows, subs, runs, ("s", "web", at(minute)))
        assert said.get(at(minute), []) == expected, minute


@pytest.mark.parametrize("small_join", [placement.SMALL_JOIN, -1], ids=["joined", "descent"])
@settings(max_examples=60, deadline=None)
@given(
    spans=st.lists(
        st.tuples(
            st.sampled_from(["f", "g"]),
            st.one_of(st.none(), st.integers(0, 12)),
            st.one_of(st.none(), st.integers(0, 14)),
        ),
        max_size=30,
    ),
    moments=st.lists(
        st.tuples(st.sampled_from(["f", "g", "h"]), st.one_of(st.none(), st.integers(0, 14))),
        min_size=1,
        max_size=8,
    ),
)
def test_spans_counted_at_a_moment_are_those_of_their_definition(small_join, spans, moments):
    """count_at, by a join of few pairs or by sorted searches, counts the spans of the
    moment's fleet begun by then and not ended by then: an open start never holds, an open
    end always does, a span that ends before it begins never holds."""

    def at(minute):
        return None if minute is None else datetime(2026, 11, 2, 9, minute, tzinfo=UTC)

    time = pl.Datetime("us", "UTC")
    spans_frame = pl.DataFrame(
        [(fleet, at(begin), at(end)) for fleet, begin, end in spans],
        schema={"fleet_id": pl.String, "begin": time, "end": time},
        orient="row",
    )
    moments_frame = pl.DataFrame(
        [(fleet, at(minute)) for fleet, minute in moments],
        schema={"fleet_id": pl.String, "as_of": time},
        orient="row",
    )
    with mock.patch.object(placement, "SMALL_JOIN", small_join):
        counted = placement.count_at(moments_frame, spans_frame, ("fleet_id",), "begin", "end")
    expected = [
        sum(
            fleet == own
            and minute is not None
            and begin is not None
            and begin <= minute
            and (end is None or end > minute)
            for fleet, begin, end in spans
        )
        for own, minute in moments
    ]
    assert counted.to_list() == expected


def test_jobs_placed_at_once_are_in_timeline_order_when_the_merge_holds_them_unsorted():
    """The merge of partitions holds every partition's jobs unsorted (the runs that ask, then
    the others: partitions.foresight_frames): given the timeline's columns as `ties`, jobs
    placed at the same moment are numbered as the timeline-sorted jobs of one process would
    be."""
    at = datetime(2026, 11, 2, 9, 4, 31, tzinfo=UTC)
    subs = pl.DataFrame(
        {
            "server": ["b", "a", "a"],
            "fleet_id": ["f"] * 3,
            "run_id": ["r", "r", "r"],
            "job_id": ["j", "j", "k"],
            "job_name": ["web-1-0", "web-1-0", "web-0-0"],
            "deployment_num": [1, 1, 1],
            "instance_id": ["i1", "i1", "i2"],
            "instance_name": ["f-0", "f-0", "f-1"],
            "created_at": [at] * 3,
            "stopped_at": [None] * 3,
            "health": ["healthy"] * 3,
            "health_proof": ["ready_flag"] * 3,
            "replica_num": [1, 1, 0],
            "job_num": [0, 0, 0],
            "submission_num": [0, 0, 0],
        }
    )
    runs = pl.DataFrame({"server": ["a", "b"], "run_id": ["r", "r"], "run_name": ["web", "web"]})
    timeline = ["server", "run_id", "replica_num", "job_num", "submission_num"]
    unsorted = placed_jobs(subs, runs, ties=timeline)
    one_process = placed_jobs(subs.sort(timeline, maintain_order=True), runs)
    assert unsorted.columns == one_process.columns
    assert unsorted.rows() == one_process.rows()
    assert unsorted.select("server", "job_id").rows() == [("a", "j"), ("b", "j"), ("a", "k")]


def test_a_chunks_jobs_made_whole_again_are_the_rows_one_process_holds():
    """The merge holds the jobs of runs whose findings ask for the foresight whole and other
    runs' jobs in the few columns read of them (partitions.MergedFacts): a chunk's jobs made
    whole again are one process's rows, another run's job null in the columns never read of
    it, in timeline order, whichever rows the chunk picks."""
    from analyzer.pipeline import partitions

    at = datetime(2026, 11, 2, 9, 4, 31, tzinfo=UTC)
    columns = dict.fromkeys((*partitions._CROSS_RUN_COLUMNS, *placement.PLACED_COLUMNS))
    jobs = []
    for piece, run in ((0, "w1"), (0, "o1"), (1, "o2"), (1, "w2"), (1, "o3")):
        for replica in (1, 0):
            row = {name: None for name in columns}
            row.update(
                server="s",
                run_id=run,
                job_id=f"{run}-{replica}",
                job_name=f"web-{replica}-0",
                replica_num=replica,
                job_num=0,
                submission_num=0,
                deployment_num=1,
                instance_id=f"i-{run}-{replica}",
                created_at=at,
                fleet_id="f",
                blocks=1,
            )
            row["resources"] = f"{replica} GPU"  # a column never read of another run's job
            row["piece"] = piece
            jobs.append(row)
    one_process = pl.DataFrame(jobs).drop("piece")
    whole_runs = pl.col("run_id").str.starts_with("w")
    frame = pl.DataFrame(jobs)
    runs = one_process.select("server", "run_id", run_name="run_id").unique(maintain_order=True)
    pieces = []
    for piece in (0, 1):
        mine = frame.filter(pl.col("piece") == piece).drop("piece")
        pieces.append(
            partitions.ForesightPiece(
                runs=runs,
                submissions=mine.filter(whole_runs),
                others=mine.filter(~whole_runs).select(partitions._CROSS_RUN_COLUMNS),
                deployments=pl.DataFrame(),
                dateless=set(),
                updates=None,
                fleets=pl.DataFrame({"server": ["s"], "fleet_id": ["f"]}) if piece == 0 else None,
                instances=pl.DataFrame({"server": ["s"]}) if piece == 0 else None,
                fleet_table_servers=set(),
                server_versions={},
                evidence_ends={},
                narrowed=False,
                secrets=set(),
            )
        )
    facts = partitions.foresight_frames(pieces)
    held = facts.frames.submissions
    assert "resources" not in held.columns
    expected = one_process.with_columns(
        pl.when(whole_runs).then(pl.col(name)).otherwise(None).alias(name)
        for name in one_process.columns
        if name not in partitions._CROSS_RUN_COLUMNS
    )
    timeline = partitions._TIMELINE_ORDER
    for picked in (pl.lit(True), pl.col("run_id").is_in(["o3", "w2", "o1"])):
        chunk = partitions._whole_again(held.filter(picked), facts.whole_jobs)
        assert chunk.columns == one_process.columns
        assert chunk.sort(timeline, maintain_order=True).rows() == (
            expected.filter(picked).sort(timeline, maintain_order=True).rows()
        )
