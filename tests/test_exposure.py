"""Exposure and surge capacity at T, rebuilt from the tables (never from a verdict).

On the captures: just before each update whose replica later failed with "Fleet is at
capacity" the surge capacity is `none`; just before the update that rolled out fine on a fleet
with room, `available`. Own cases are copies of real capture databases with a few rows changed.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from analyzer import open_sources
from analyzer.cli import main
from analyzer.pipeline.exposure import BEFORE_UPDATE, exposure_report, judge_release
from tests.conftest import CAPTURES, execute, load_truth, truth_files
from tests.test_postgres import loaded, pg  # noqa: F401  (the throwaway PostgreSQL server)

PLANTED = "echo planted-group-command-1f9a"
PROVIDER_REFUSAL = (
    "Failed to provision in fleet 'cpu-fleet': tried 1 of 1 offers, all failed.\n"
    "See https://dstack.ai/docs/guides/troubleshooting/#provisioning"
)


def _copy_row(db: Path, table: str, where: str, changes: str, params: tuple = ()) -> None:
    """Insert a copy of a real row of `table` with `changes` (an SQL SET list) applied."""
    with sqlite3.connect(db) as connection:
        connection.execute(f"CREATE TEMP TABLE copied AS SELECT * FROM {table} WHERE {where}")
        connection.execute(f"UPDATE copied SET {changes}", params)
        connection.execute(f"INSERT INTO {table} SELECT * FROM copied")


def _update_time(audit, run_id: str, deployment_num: int) -> datetime:
    """When the deployment that holds the culprit began (the user's apply), from the timeline."""
    row = audit.deployments.filter(
        (pl.col("run_id") == run_id) & (pl.col("deployment_num") == deployment_num)
    ).row(0, named=True)
    return row["began_at"] or row["first_job_at"]


def _service(report, run_id: str):
    (service,) = [s for s in report.services if s.run_id == run_id]
    return service


def _before_update(source, run_id: str, deployment_num: int):
    audit = open_sources([source])
    moment = _update_time(audit, run_id, deployment_num) - BEFORE_UPDATE
    return _service(exposure_report(audit, moment), run_id)


def _fleet_capacity_culprits():
    cases = []
    for path in truth_files():
        truth = load_truth(path)
        for run in truth["runs"]:
            for culprit in run.get("culprit") or []:
                # a re-submission refused because its crashed predecessor still held the node
                # (retry-on-error): the fleet had room before the update
                resubmitted = any(
                    (j["job_name"], j["deployment_num"])
                    == (culprit["job_name"], culprit["deployment_num"])
                    and j["submission_num"] < culprit["submission_num"]
                    for j in run["all_jobs_final"]
                )
                if (
                    culprit["termination_reason"] == "failed_to_start_due_to_no_capacity"
                    and culprit["termination_reason_message"] in (None, "Fleet is at capacity")
                    and not resubmitted
                ):
                    cases.append(
                        pytest.param(
                            path.parent / "server.db",
                            run["run_id"],
                            culprit["deployment_num"],
                            id=f"{path.parent.parent.name}/{path.parent.name}",
                        )
                    )
    return cases


@pytest.mark.parametrize(("db", "run_id", "deployment_num"), _fleet_capacity_culprits())
def test_surge_is_none_before_each_update_that_failed_at_fleet_capacity(db, run_id, deployment_num):
    service = _before_update(db, run_id, deployment_num)
    assert service.surge_capacity == "none"
    (fleet,) = service.fleets
    assert fleet.can_add_node is False
    assert fleet.active_instances == int(fleet.nodes.split("..")[1])
    assert any("Fleet is at capacity" in reason for reason in service.reasons)
    assert service.healthy_replicas >= 0 and service.recommendation


def test_the_captures_hold_fleet_capacity_culprits():
    names = {case.id for case in _fleet_capacity_culprits()}
    assert {"v0.22.5/seed", "v0.22.5/scale-up-fails", "v0.20/seed", "v0.19/seed"} <= names


@pytest.mark.parametrize(
    ("source", "provable"),
    [
        (CAPTURES / "v0.22.5/rolling-ok/server.db", True),
        (CAPTURES / "v0.22.5/rolling-ok/tables", True),
        (CAPTURES / "v0.20/rolling-ok/server.db", True),
        # 0.19 tables alone cannot prove the old replica healthy: none is counted at stake.
        (CAPTURES / "v0.19/rolling-ok/server.db", False),
        (CAPTURES / "postgres/rolling-ok/tables", True),
        # A crash, not a capacity failure: the 0..4 fleet had room for the surge replica.
        (CAPTURES / "v0.22.5/multi-replica-crash/server.db", True),
    ],
    ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name}" if isinstance(p, Path) else "",
)
def test_surge_is_available_before_an_update_on_a_fleet_with_room(source, provable):
    folder = source.parent if source.suffix == ".db" or source.name == "tables" else source
    run = load_truth(folder / "truth.json")["runs"][0]
    service = _before_update(source, run["run_id"], 1)
    assert service.surge_capacity == "available"
    (fleet,) = service.fleets
    assert fleet.can_add_node is True
    healthy = len(run["healthy_replicas_before_failure"])
    assert service.healthy_replicas == (healthy if provable else 0)


def test_a_cloud_capacity_failure_is_never_a_confident_none(copy_db):
    """The provider refused (the fleet had room): `available` or `unknown`, never `none`; the
    audit finding then says the failure was not foreseeable from the fleet."""
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE fleets SET spec = json_set(spec, '$.configuration.nodes.max', 2)")
    execute(
        db,
        "UPDATE jobs SET termination_reason_message = ? WHERE job_name = 'web-0-1'",
        params=(PROVIDER_REFUSAL,),
    )
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    service = _before_update(db, truth["run_id"], 1)
    assert service.surge_capacity in ("available", "unknown")
    (finding,) = open_sources([db]).report.findings
    assert finding.capacity_foresight is not None
    assert finding.capacity_foresight.surge_capacity != "none"
    assert finding.capacity_foresight.foreseeable is not True


def test_an_earlier_provider_refusal_makes_room_unknown(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE fleets SET spec = json_set(spec, '$.configuration.nodes.max', 2)")
    # with room for 2, dstack asks the provider: the culprit's refusal is the provider's too
    # (a 'Fleet is at capacity' with 1 instance would say the fleet was 0..1 then: specs.py)
    execute(
        db,
        "UPDATE jobs SET termination_reason_message = ? WHERE job_name = 'web-0-1'",
        params=(PROVIDER_REFUSAL,),
    )
    # A refused submission two minutes before the update: the real culprit row, earlier.
    _copy_row(
        db,
        "jobs",
        "job_name = 'web-0-1'",
        "id = 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', termination_reason_message = ?, "
        "submitted_at = '2026-11-02 09:06:00.000000', "
        "last_processed_at = '2026-11-02 09:06:08.000000'",
        (PROVIDER_REFUSAL,),
    )
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    audit = open_sources([db])
    service = _service(
        exposure_report(audit, datetime.fromisoformat("2026-11-02T09:08:50+00:00")),
        truth["run_id"],
    )
    assert service.surge_capacity == "unknown"
    assert any("the provider had no capacity" in reason for reason in service.reasons)


def _add_idle_instance(db, name: str = "cpu-fleet-1", cpus: int = 2) -> None:
    """A second instance of the real one, IDLE since before the update (offer as recorded,
    with `cpus` changed)."""
    _copy_row(
        db,
        "instances",
        "name = 'cpu-fleet-0'",
        "id = 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb', name = ?, instance_num = 1, status = 'IDLE', "
        "busy_blocks = 0, created_at = '2026-11-02 09:05:00.000000', "
        "started_at = '2026-11-02 09:05:10.000000'",
        (name,),
    )
    execute(
        db,
        "UPDATE instances SET offer = json_set(offer, '$.instance.resources.cpus', ?) "
        "WHERE id = 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb'",
        params=(cpus,),
    )


def test_an_idle_instance_that_fits_is_room(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE fleets SET spec = json_set(spec, '$.configuration.nodes.max', 2)")
    _add_idle_instance(db)
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    service = _before_update(db, truth["run_id"], 1)
    assert service.surge_capacity == "available"
    (fleet,) = service.fleets
    assert fleet.can_add_node is False  # 2 of 0..2: only the idle instance gives room
    states = {i.instance_name: (i.state, i.fits) for i in fleet.instances}
    assert states == {"cpu-fleet-0": ("busy", False), "cpu-fleet-1": ("idle", True)}
    assert any("cpu-fleet-1" in reason and "idle" in reason for reason in service.reasons)


def test_an_idle_instance_too_small_is_no_room(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE fleets SET spec = json_set(spec, '$.configuration.nodes.max', 2)")
    _add_idle_instance(db, cpus=1)  # the service asks for cpu 2..
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    service = _before_update(db, truth["run_id"], 1)
    assert service.surge_capacity == "none"
    assert "raise fleet cpu-fleet's nodes maximum to 3" in service.recommendation


def test_an_instance_created_after_t_does_not_count(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE fleets SET spec = json_set(spec, '$.configuration.nodes.max', 2)")
    _add_idle_instance(db)
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    audit = open_sources([db])
    early = _service(
        exposure_report(audit, datetime.fromisoformat("2026-11-02T09:04:00+00:00")),
        truth["run_id"],
    )
    assert [i.instance_name for i in early.fleets[0].instances] == ["cpu-fleet-0"]
    assert early.fleets[0].can_add_node is True


def _second_fleet(db, *, idle_instance: bool) -> None:
    """A second fleet of the project (a copy of the real one, nodes 0..1), optionally with an
    idle instance of its own."""
    _copy_row(
        db,
        "fleets",
        "name = 'cpu-fleet'",
        "id = 'cccccccccccccccccccccccccccccccc', name = 'spare', "
        "spec = json_set(spec, '$.configuration.name', 'spare')",
    )
    if idle_instance:
        _add_idle_instance(db, name="spare-0")
        execute(
            db,
            "UPDATE instances SET fleet_id = 'cccccccccccccccccccccccccccccccc', instance_num = 0 "
            "WHERE id = 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb'",
        )


def test_several_fleets_the_run_not_yet_placed_can_use_another(copy_db):
    db = copy_db("v0.22.5/seed")
    _second_fleet(db, idle_instance=True)
    execute(db, "UPDATE runs SET fleet_id = NULL")
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    service = _before_update(db, truth["run_id"], 1)
    assert sorted(f.fleet_name for f in service.fleets) == ["cpu-fleet", "spare"]
    assert service.surge_capacity == "available"
    assert any("spare-0 of fleet spare" in reason for reason in service.reasons)


def test_several_fleets_a_placed_run_uses_only_its_own(copy_db):
    """dstack narrows candidate fleets to runs.fleet_id once the run has one
    (services/runs/plan.py::get_run_candidate_fleet_models_filters)."""
    db = copy_db("v0.22.5/seed")
    _second_fleet(db, idle_instance=True)
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    service = _before_update(db, truth["run_id"], 1)
    assert [f.fleet_name for f in service.fleets] == ["cpu-fleet"]
    assert service.surge_capacity == "none"


def test_several_fleets_narrowed_by_the_run_specs_fleets(copy_db):
    db = copy_db("v0.22.5/seed")
    _second_fleet(db, idle_instance=True)
    execute(
        db,
        "UPDATE runs SET fleet_id = NULL, "
        "run_spec = json_set(run_spec, '$.configuration.fleets', json_array('cpu-fleet'))",
    )
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    service = _before_update(db, truth["run_id"], 1)
    assert [f.fleet_name for f in service.fleets] == ["cpu-fleet"]
    assert service.surge_capacity == "none"


def test_a_groups_resources_decide_the_fit(copy_db):
    """Two replica groups: the idle CPU instance fits the `web` group, not the `gpu` group
    (configuration.groups, reference 6.6): a rollout of the gpu group has no room."""
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE fleets SET spec = json_set(spec, '$.configuration.nodes.max', 2)")
    _add_idle_instance(db)
    groups = [
        {"name": "web", "replicas": {"min": 1, "max": 1}, "resources": None, "commands": [PLANTED]},
        {
            "name": "gpu",
            "replicas": {"min": 1, "max": 1},
            "resources": {"gpu": {"count": {"min": 1, "max": None}, "name": ["A100"]}},
        },
    ]
    execute(
        db,
        "UPDATE runs SET run_spec = json_set(run_spec, '$.configuration.groups', json(?))",
        params=(json.dumps(groups),),
    )
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    service = _before_update(db, truth["run_id"], 1)
    assert service.surge_capacity == "none"
    assert any(r.startswith("group web:") and "cpu-fleet-1" in r for r in service.reasons)
    assert any(r.startswith("group gpu:") and "no idle instance fits" in r for r in service.reasons)
    assert service.resources[1] == "gpu: gpu a100 1.."  # names compared lowercased
    # A group's commands are never carried into the canonical model or any output.
    audit = open_sources([db])
    assert PLANTED not in audit.evidence.runs.write_csv()
    assert PLANTED not in exposure_report(audit).model_dump_json()


def test_retry_on_no_capacity_measured_from_the_runs_submission(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(
        db,
        "UPDATE runs SET run_spec = json_set(run_spec, '$.configuration.retry', "
        'json(\'{"on_events": ["no-capacity"], "duration": 60}\'))',
    )
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    service = _before_update(db, truth["run_id"], 1)
    assert "for 60 s from the run's submission, already past" in service.retry


def test_releases_judged_from_dstack_4186():
    assert judge_release("0.22.5")[0] == "yes"
    assert judge_release("0.19.40")[0] == "yes"
    assert judge_release("0.20.7-0.20.9")[0] == "yes"
    assert judge_release("0.21.2+ (HEAD 2026-08)")[0] == "yes"
    assert judge_release("0.19.13")[0] == "unknown"
    assert judge_release("0.23.0")[0] == "unknown"
    assert judge_release("unknown (alembic 0123abcd)")[0] == "unknown"
    assert judge_release(None)[0] == "unknown"


def test_without_fleet_tables_surge_is_unknown():
    """An API export holds runs and jobs but no fleets or instances."""
    audit = open_sources([CAPTURES / "v0.22.5/rolling-ok/api"])
    report = exposure_report(audit)
    (service,) = report.services
    assert service.surge_capacity == "unknown"
    assert service.fleets == []
    assert any(lim.code == "no_fleet_tables" for lim in report.limitations)


def test_the_same_answer_from_a_dataset(tmp_path):
    runner = CliRunner()
    db = CAPTURES / "v0.22.5/rolling-ok/server.db"
    result = runner.invoke(main, ["ingest", str(db), "--to", str(tmp_path / "ds")])
    assert result.exit_code == 0, result.output
    direct = exposure_report(open_sources([db]))
    from_dataset = exposure_report(open_sources([tmp_path / "ds"]))
    assert [s.model_dump() for s in from_dataset.services] == [
        s.model_dump() for s in direct.services
    ]


def test_json_shape_and_exit_codes():
    runner = CliRunner()
    db = str(CAPTURES / "v0.22.5/rolling-ok/server.db")
    result = runner.invoke(main, ["exposure", db, "--format", "json", "--fail-on-exposed"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert {"as_of", "services", "limitations"} <= set(report)
    (service,) = report["services"]
    required = {
        "run_id",
        "project",
        "run_name",
        "exposed",
        "surge_capacity",
        "healthy_replicas",
        "fleets",
        "reasons",
        "past_incidents",
    }
    assert required <= set(service)
    assert (service["run_name"], service["exposed"], service["surge_capacity"]) == (
        "api",
        "yes",
        "available",
    )
    assert isinstance(service["past_incidents"], int) and service["reasons"]
    assert service["fleets"][0]["fleet_name"] == "cpu-fleet"

    plain = runner.invoke(main, ["exposure", db])
    assert plain.exit_code == 0 and "surge capacity available" in plain.output
    before = runner.invoke(
        main, ["exposure", db, "--as-of", "2026-11-03T13:00:00", "--fail-on-exposed"]
    )
    assert before.exit_code == 0 and "0 running service(s)" in before.output
    markdown = runner.invoke(main, ["exposure", db, "--format", "markdown"])
    assert markdown.exit_code == 0 and "| globex/api | yes | available |" in markdown.output


def test_unknown_release_does_not_fail_the_gate(copy_db):
    db = copy_db("v0.22.5/rolling-ok")
    execute(db, "DELETE FROM alembic_version")
    result = CliRunner().invoke(main, ["exposure", str(db), "--fail-on-exposed"])
    assert result.exit_code == 0, result.output
    assert "exposed unknown" in result.output


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["exposure", str(tmp_path / "missing.db")])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "missing.db" in result.output


def test_past_incidents_of_the_same_service(copy_db):
    """A new run of the seed service, submitted after the incident and still running (copies of
    the real run and job rows): the earlier collateral incident counts against it."""
    db = copy_db("v0.22.5/seed")
    later = "'2026-11-02 09:20:00.000000'"
    _copy_row(
        db,
        "runs",
        "run_name = 'web'",
        "id = 'dddddddddddddddddddddddddddddddd', status = 'RUNNING', termination_reason = NULL, "
        f"deployment_num = 0, submitted_at = {later}, last_processed_at = {later}",
    )
    _copy_row(
        db,
        "jobs",
        "job_name = 'web-0-0'",
        "id = 'eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee', run_id = 'dddddddddddddddddddddddddddddddd', "
        f"status = 'RUNNING', termination_reason = NULL, deployment_num = 0, "
        f"submitted_at = {later}, last_processed_at = {later}",
    )
    audit = open_sources([db])
    (finding,) = [f for f in audit.findings if f.category == "collateral_termination"]
    report = exposure_report(audit)
    (service,) = report.services
    assert service.run_id == "dddddddd-dddd-dddd-dddd-dddddddddddd" != finding.run_id
    assert service.past_incidents == 1
    before = finding.culprits[0].failed_at - timedelta(seconds=1)
    (earlier,) = exposure_report(audit, before).services
    assert (earlier.run_id, earlier.past_incidents) == (finding.run_id, 0)


def test_the_audit_finding_says_a_fleet_capacity_failure_was_foreseeable():
    (finding,) = open_sources([CAPTURES / "v0.22.5/seed/server.db"]).report.findings
    foresight = finding.capacity_foresight
    assert foresight is not None
    assert (foresight.surge_capacity, foresight.foreseeable) == ("none", True)
    assert foresight.as_of < finding.culprits[0].failed_at
    crash = open_sources([CAPTURES / "v0.22.5/multi-replica-crash/server.db"]).report.findings
    assert all(f.capacity_foresight is None for f in crash)  # the culprit crashed: no field


@pytest.mark.parametrize(("scenario", "expected"), [("seed", "none"), ("rolling-ok", "available")])
def test_postgresql_and_its_exports_agree(loaded, scenario, expected):  # noqa: F811
    """The same fleets and instances through the PostgreSQL reader and its psql CSV export (the
    export has no alembic_version, so only the database knows the release)."""
    run = load_truth(CAPTURES / "postgres" / scenario / "truth.json")["runs"][0]
    from_db = _before_update(loaded[scenario], run["run_id"], 1)
    from_csv = _before_update(CAPTURES / "postgres" / scenario / "tables", run["run_id"], 1)
    assert from_db.surge_capacity == expected
    assert (from_db.exposed, from_csv.exposed) == ("yes", "unknown")
    release = {"exposed", "dstack_release", "recommendation", "reasons"}
    assert from_db.model_dump(exclude=release) == from_csv.model_dump(exclude=release)
    assert from_db.reasons[1:] == from_csv.reasons[1:]


def test_a_narrowed_read_cannot_call_an_idle_instance_free(copy_db):
    """With --project (or a partition), jobs of other runs are not read: an instance that looks
    idle may be held by one of them, so the room is `unknown`, not `available`."""
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE fleets SET spec = json_set(spec, '$.configuration.nodes.max', 2)")
    _add_idle_instance(db)
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    audit = open_sources([db], project="acme")
    moment = _update_time(audit, truth["run_id"], 1) - BEFORE_UPDATE
    service = _service(exposure_report(audit, moment), truth["run_id"])
    assert service.surge_capacity == "unknown"
    assert any("read the jobs of some runs only" in reason for reason in service.reasons)


def test_a_dataset_written_before_fleets_were_ingested_reads_as_unknown(tmp_path):
    """A dataset without fleets/instances (its manifest has no fleet_table_servers) still
    reads; its services' surge capacity is unknown, said as a limitation."""
    import shutil

    db = CAPTURES / "v0.22.5/rolling-ok/server.db"
    folder = tmp_path / "ds"
    assert CliRunner().invoke(main, ["ingest", str(db), "--to", str(folder)]).exit_code == 0
    manifest = json.loads(pl.read_parquet(folder / "dataset.parquet")["manifest"][0])
    del manifest["fleet_table_servers"]
    pl.DataFrame({"manifest": [json.dumps(manifest)]}).write_parquet(folder / "dataset.parquet")
    shutil.rmtree(folder / "fleets")
    shutil.rmtree(folder / "instances")
    report = exposure_report(open_sources([folder]))
    (service,) = report.services
    assert service.surge_capacity == "unknown" and service.exposed == "yes"
    assert any(lim.code == "no_fleet_tables" for lim in report.limitations)


@pytest.mark.parametrize("cpus", [None, 1])
def test_probes_without_instance_lists_say_the_same(copy_db, cpus):
    """The foresight asks per finding without listing instances; its verdict and reasons
    are those of the full probe (a busy and an idle instance, fitting or too small)."""
    from analyzer.pipeline.exposure import assess_probes, frames_of

    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE fleets SET spec = json_set(spec, '$.configuration.nodes.max', 2)")
    _add_idle_instance(db, **({} if cpus is None else {"cpus": cpus}))
    truth = load_truth(CAPTURES / "v0.22.5/seed/truth.json")["runs"][0]
    audit = open_sources([db])
    moment = _update_time(audit, truth["run_id"], 1) - BEFORE_UPDATE
    (server,) = audit.runs.filter(pl.col("run_id") == truth["run_id"])["server"]
    probes = pl.DataFrame(
        {"server": [server], "run_id": [truth["run_id"]], "as_of": [moment]},
        schema={"server": pl.String, "run_id": pl.String, "as_of": pl.Datetime("us", "UTC")},
    )
    (full,) = assess_probes(frames_of(audit), probes, [])
    (brief,) = assess_probes(frames_of(audit), probes, [], detail=False)
    assert [len(f.instances) for f in full.fleets] == [2]
    assert [f.instances for f in brief.fleets] == [[]]
    unlisted = [f.model_copy(update={"instances": []}) for f in full.fleets]
    assert brief == full.model_copy(update={"fleets": unlisted})


def test_healthy_at_t_is_read_from_what_is_dated_then(copy_db):
    """Issue 22: the old replica svc-0-2's probe recorded a failure while it was being stopped
    in the cascade (its streak left at 0, as dstack writes it: `probes` rows keep their last
    streak). At 10:37:00, before the update, all three replicas were RUNNING and ready (their
    ready events at 10:32:39): the later streak says nothing of that moment."""
    db = copy_db("v0.22.5/multi-replica-crash")
    execute(db, "UPDATE probes SET success_streak = 0 WHERE name = 'svc-0-2-0'")
    run_id = load_truth(CAPTURES / "v0.22.5/multi-replica-crash/truth.json")["runs"][0]["run_id"]
    audit = open_sources([db])
    at = _service(
        exposure_report(audit, datetime.fromisoformat("2026-11-04T10:37:00+00:00")), run_id
    )
    assert (at.healthy_replicas, at.active_replicas) == (3, 3)
    # RUNNING since 10:31:50-10:32:02 but not ready until 10:32:39: none served at 10:32:10.
    early = exposure_report(audit, datetime.fromisoformat("2026-11-04T10:32:10+00:00"))
    assert (_service(early, run_id).healthy_replicas, _service(early, run_id).active_replicas) == (
        0,
        3,
    )
    # Never marked ready (jobs.ready = 0, no ready event): never healthy, whatever its streak.
    execute(
        db,
        "DELETE FROM event_targets WHERE entity_name = 'svc-0-1' AND event_id IN "
        "(SELECT id FROM events WHERE message LIKE 'Service replica ready%')",
        "UPDATE jobs SET ready = 0 WHERE job_name = 'svc-0-1'",
    )
    later = exposure_report(open_sources([db]), datetime.fromisoformat("2026-11-04T10:37:00+00:00"))
    assert _service(later, run_id).healthy_replicas == 2


ROLLING_API = "945358baa15048c894810567cd70e5dc"  # rolling-ok's service `api`, as stored
API_RUN = "945358ba-a150-48c8-9481-0567cd70e5dc"
WEB2_RUN, WEB2_JOB = "0b0b0b0b00004000800000000000000a", "0b0b0b0b00004000800000000000000b"


def _queued_run(
    db: Path,
    spec_changes: tuple[tuple[str, str], ...] = (),
    queued_at: str = "2026-11-03 14:07:40.000000",
) -> None:
    """A second service `web2` of the same project, copied from `api`'s real rows, whose one
    job is queued in dstack's way (`jobs_submitted.py`: SUBMITTED, no instance, no
    provisioning data; its run has no fleet yet), submitted seconds before `api`'s update."""
    spec = 'replace(run_spec, \'"run_name":"api"\', \'"run_name":"web2"\')'
    for old, new in spec_changes:
        spec = f"replace({spec}, '{old}', '{new}')"
    _copy_row(
        db,
        "runs",
        f"id = '{ROLLING_API}'",
        f"id = '{WEB2_RUN}', run_name = 'web2', status = 'SUBMITTED', fleet_id = NULL, "
        f"submitted_at = '{queued_at}', last_processed_at = '{queued_at}', deployment_num = 0, "
        f"termination_reason = NULL, run_spec = {spec}",
    )
    _copy_row(
        db,
        "jobs",
        "job_name = 'api-0-0'",
        f"id = '{WEB2_JOB}', run_id = '{WEB2_RUN}', run_name = 'web2', job_name = 'web2-0-0', "
        f"status = 'SUBMITTED', submitted_at = '{queued_at}', last_processed_at = '{queued_at}', "
        "termination_reason = NULL, termination_reason_message = NULL, exit_status = NULL, "
        "job_provisioning_data = NULL, job_runtime_data = NULL, used_instance_id = NULL, "
        "instance_id = NULL, instance_assigned = 0, fleet_id = NULL, remove_at = NULL, "
        "running_at = NULL, ready = 0, registered = 0, graceful_termination_attempts = NULL, "
        'job_spec_data = replace(job_spec_data, \'"job_name":"api-0-0"\', '
        '\'"job_name":"web2-0-0"\')',
    )


def test_another_runs_queued_job_takes_the_last_node_first(copy_db):
    """Issue 22 §1: rolling-ok's fleet (nodes 0..2, one busy instance) has one node left
    before `api`'s update; `web2`'s job, queued before it with the same priority, is placed
    first (`JobSubmittedFetcher.fetch`: priority, then oldest) and takes it."""
    db = copy_db("v0.22.5/rolling-ok")
    assert _before_update(db, API_RUN, 1).surge_capacity == "available"
    _queued_run(db)
    service = _before_update(db, API_RUN, 1)
    assert service.surge_capacity == "none"
    (reason,) = [r for r in service.reasons if r.startswith("group 0:")]
    assert (
        "run web2's queued web2-0-0 (SUBMITTED since 2026-11-03 14:07:40) takes a new node "
        "of fleet cpu-fleet first" in reason
    )
    assert "'Fleet is at capacity'" in reason
    assert service.recommendation.startswith("raise fleet cpu-fleet's nodes maximum to 3")
    # a run's own queued job is its replica, not a rival
    web2 = next(s for s in exposure_report(open_sources([db])).services if s.run_name == "web2")
    assert not any("queued" in r for r in web2.reasons)


def test_a_queued_job_that_may_use_another_fleet_only_is_not_counted(copy_db):
    db = copy_db("v0.22.5/rolling-ok")
    _queued_run(db, (('"fleets":null,"instances"', '"fleets":["gpu-fleet"],"instances"'),))
    assert _before_update(db, API_RUN, 1).surge_capacity == "available"


def test_a_lower_priority_queued_job_waits(copy_db):
    """`api` outranks `web2`: a replica of `api` is placed first (`RunModel.priority.desc()`)."""
    db = copy_db("v0.22.5/rolling-ok")
    _queued_run(db)
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE runs SET priority = 50, run_spec = replace(run_spec, '\"priority\":0', "
            f"'\"priority\":50') WHERE id = '{ROLLING_API}'"
        )
    service = _before_update(db, API_RUN, 1)
    assert service.surge_capacity == "available"
    assert not any("web2" in r for r in service.reasons)


def test_a_job_that_left_the_queue_before_t_is_not_queued(copy_db):
    """Its 'SUBMITTED -> ...' event dates when it left the queue: after it, it holds an
    instance (counted as busy) or failed; it is no longer waiting."""
    db = copy_db("v0.22.5/rolling-ok")
    _queued_run(db)
    _copy_row(
        db,
        "events",
        "message = 'Job status changed SUBMITTED -> PROVISIONING' AND recorded_at < "
        "'2026-11-03 14:01:00'",
        "id = '0b0b0b0b00004000800000000000000c', recorded_at = '2026-11-03 14:07:45.000000', "
        "message = 'Job status changed SUBMITTED -> TERMINATING. Termination reason: "
        "FAILED_TO_START_DUE_TO_NO_CAPACITY (Fleet is at capacity)'",
    )
    with sqlite3.connect(db) as connection:
        (event,) = connection.execute(
            "SELECT id FROM events WHERE id = '0b0b0b0b00004000800000000000000c'"
        ).fetchone()
        target = connection.execute(
            "SELECT id FROM event_targets WHERE entity_type = 'JOB' LIMIT 1"
        ).fetchone()[0]
    _copy_row(
        db,
        "event_targets",
        f"id = '{target}'",
        f"id = '0b0b0b0b00004000800000000000000d', event_id = '{event}', "
        f"entity_id = '{WEB2_JOB}', entity_name = 'web2-0-0', entity_run_id = '{WEB2_RUN}'",
    )
    assert _before_update(db, API_RUN, 1).surge_capacity == "available"


def test_creation_policy_reuse_is_read_from_the_database(copy_db):
    """`creation_policy` is a bare string in the run spec: read as such, `reuse` forbids a new
    node (`jobs_submitted.py`: "Could not reuse any instance"), so the fleet's room is gone."""
    db = copy_db("v0.22.5/rolling-ok")
    with sqlite3.connect(db) as connection:
        connection.execute(
            "UPDATE runs SET run_spec = replace(run_spec, '\"creation_policy\":null', "
            f"'\"creation_policy\":\"reuse\"') WHERE id = '{ROLLING_API}'"
        )
    service = _before_update(db, API_RUN, 1)
    assert service.retry.startswith("no retry on no-capacity")  # the spec was parsed
    (fleet,) = service.fleets
    assert fleet.can_add_node is False
    assert service.surge_capacity == "none"


def test_another_runs_queued_job_takes_the_idle_instance_first(copy_db):
    """At 14:12 rolling-ok's old instance cpu-fleet-0 is IDLE (until its idle timeout) and
    the fleet is at its 2 nodes: `api` could use it, unless `web2`, queued at 14:11, takes it."""
    moment = datetime.fromisoformat("2026-11-03T14:12:00+00:00")
    db = copy_db("v0.22.5/rolling-ok")
    alone = _service(exposure_report(open_sources([db]), moment), API_RUN)
    assert alone.surge_capacity == "available"
    assert any("instance cpu-fleet-0" in r for r in alone.reasons)
    _queued_run(db, queued_at="2026-11-03 14:11:00.000000")
    service = _service(exposure_report(open_sources([db]), moment), API_RUN)
    assert service.surge_capacity == "none"
    assert any(
        "run web2's queued web2-0-0 (SUBMITTED since 2026-11-03 14:11:00) takes instance "
        "cpu-fleet-0 first" in r
        for r in service.reasons
    )


SEED_RUN = "6e42c9183c60472ebb0c51610650d517"


def test_a_findings_root_cause_names_the_run_whose_queued_replica_took_the_room(copy_db):
    """Issue 22 §1: seed's fleet given room for one more node (nodes 0..2), and `web2`, a copy
    of `web` queued in dstack's way ten seconds before `web`'s update: dstack places it first
    (priority, then age), so `web`'s surge replica fails 'Fleet is at capacity' as in the
    capture. The root cause says which run took the room."""
    db = copy_db("v0.22.5/seed")
    queued_at = "2026-11-02 09:08:40.000000"
    execute(db, "UPDATE fleets SET spec = replace(spec, '\"max\":1', '\"max\":2')")
    _copy_row(
        db,
        "runs",
        f"id = '{SEED_RUN}'",
        f"id = '{WEB2_RUN}', run_name = 'web2', status = 'SUBMITTED', fleet_id = NULL, "
        f"submitted_at = '{queued_at}', last_processed_at = '{queued_at}', deployment_num = 0, "
        "termination_reason = NULL, "
        'run_spec = replace(run_spec, \'"run_name":"web"\', \'"run_name":"web2"\')',
    )
    _copy_row(
        db,
        "jobs",
        "job_name = 'web-0-0'",
        f"id = '{WEB2_JOB}', run_id = '{WEB2_RUN}', run_name = 'web2', job_name = 'web2-0-0', "
        f"status = 'SUBMITTED', submitted_at = '{queued_at}', last_processed_at = '{queued_at}', "
        "termination_reason = NULL, termination_reason_message = NULL, exit_status = NULL, "
        "job_provisioning_data = NULL, job_runtime_data = NULL, used_instance_id = NULL, "
        "instance_id = NULL, instance_assigned = 0, fleet_id = NULL, remove_at = NULL, "
        "running_at = NULL, ready = 0, registered = 0, graceful_termination_attempts = NULL, "
        'job_spec_data = replace(job_spec_data, \'"job_name":"web-0-0"\', '
        '\'"job_name":"web2-0-0"\')',
    )
    # the node dstack created for web2's replica, the fleet's second, before it refused
    # web-0-1 'Fleet is at capacity' (else the refusal contradicts nodes 0..2: specs.py)
    _copy_row(
        db,
        "instances",
        "name = 'cpu-fleet-0'",
        "id = 'b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2', name = 'cpu-fleet-1', status = 'PROVISIONING', "
        "created_at = '2026-11-02 09:08:55.000000', started_at = NULL",
    )
    report = open_sources([db]).report
    (finding,) = [f for f in report.findings if f.run_name == "web"]
    assert finding.capacity_foresight.surge_capacity == "none"
    assert any("run web2's queued web2-0-0" in r for r in finding.capacity_foresight.reasons)
    root = finding.root_cause
    assert root.failure_class == "fleet_at_capacity"
    assert root.detail.endswith(
        "; the room the surge replica needed went first to the queued replica of run web2 "
        "(web2-0-0), which dstack places before it (priority, then age: jobs_submitted.py)"
    )
    # without the rival the root cause names none (the capture's own fleet, at its maximum)
    plain = open_sources([copy_db("v0.22.5/seed", "plain.db")]).report.findings[0].root_cause
    assert "queued" not in plain.detail


@pytest.mark.parametrize("pairs", [0, 100_000], ids=["ranked", "joined"])
def test_spans_at_keeps_what_holds_at_each_moment_of_its_group(pairs, monkeypatch):
    """The interval join the fleet state at T is built with gives, for every moment, the
    spans of its group begun by then and not ended (an open end still holds, a missing start
    never does), as comparing each span with each moment would, ties at the bounds included,
    and nothing of another group: by ranking the times (many pairs) and by a plain join (few
    pairs, SMALL_JOIN) alike, in the same columns."""
    from analyzer.pipeline import placement
    from analyzer.pipeline.placement import spans_at

    monkeypatch.setattr(placement, "SMALL_JOIN", pairs)

    at = datetime(2026, 1, 1, tzinfo=UTC)
    times = [at + timedelta(seconds=s) for s in range(6)]
    schema = {"group": pl.String, "begins": pl.Datetime("us", "UTC")}
    spans = pl.DataFrame(
        [
            (g, s, e, n)
            for n, (g, s, e) in enumerate(
                (g, s, e) for g in ("a", "b", None) for s in [None, *times] for e in [None, *times]
            )
        ],
        schema={**schema, "ends": pl.Datetime("us", "UTC"), "span": pl.Int64},
        orient="row",
    )
    moments = pl.DataFrame(
        [(g, t) for g in ("a", "b", "c", None) for t in times],
        schema={"group": pl.String, "as_of": pl.Datetime("us", "UTC")},
        orient="row",
    )
    found = spans_at(moments, spans, ("group",), start="begins", end="ends")
    found = found.join(moments.with_row_index("_moment"), on="_moment").drop("_moment")
    expected = moments.join(spans, on="group").filter(
        (pl.col("begins") <= pl.col("as_of"))
        & (pl.col("ends").is_null() | (pl.col("ends") > pl.col("as_of")))
    )
    order = ["group", "as_of", "span"]
    assert found.height > 0
    assert found.columns == ["begins", "ends", "span", "group", "as_of"]
    assert found.select(expected.columns).sort(order).equals(expected.sort(order))


def test_count_at_counts_what_spans_at_keeps():
    """The holders counted at each moment (placement.count_at, two sorted searches) are the
    spans the interval join keeps, on every order of starts and ends (a span ended before it
    began, ties at the bounds, open ends, missing starts), a moment of no group or no time
    holding none."""
    from analyzer.pipeline.placement import count_at, spans_at

    at = datetime(2026, 1, 1, tzinfo=UTC)
    times = [at + timedelta(seconds=s) for s in range(5)]
    when = pl.Datetime("us", "UTC")
    spans = pl.DataFrame(
        [(g, s, e) for g in ("a", "b", None) for s in [None, *times] for e in [None, *times]],
        schema={"group": pl.String, "begins": when, "ends": when},
        orient="row",
    )
    moments = pl.DataFrame(
        [(g, t) for g in ("a", "c", None) for t in [*times, None]],
        schema={"group": pl.String, "as_of": when},
        orient="row",
    )
    counted = count_at(moments, spans, ("group",), start="begins", end="ends")
    held = spans_at(moments, spans, ("group",), start="begins", end="ends")
    expected = [held.filter(pl.col("_moment") == m).height for m in range(moments.height)]
    assert sum(expected) > 0
    assert counted.to_list() == expected
