"""The state-in-time table (pipeline/states.py) on hand-built canonical frames: one case per
aspect, per basis conflict, per kind of end, the served-then-probe-failed replica, and the
real rows of a capture read from its database and from its log."""

from __future__ import annotations

import ast
import shutil
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

import analyzer
from analyzer import open_sources
from analyzer.model import EVENTS_SCHEMA, JOBS_SCHEMA, RUNS_SCHEMA
from analyzer.pipeline import states
from analyzer.pipeline.evidence import Evidence
from analyzer.pipeline.impact import serving_capacity
from analyzer.pipeline.states import at, basis_of, final, job_states, serving_at
from analyzer.pipeline.timeline import submissions
from tests.conftest import CAPTURES, DATA

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
END = T0 + timedelta(hours=1)
RUN = "11111111-1111-1111-1111-111111111111"
JOB = "00000000-0000-0000-0000-00000000000a"
LOG = "server.log"


def minutes(n: float) -> datetime:
    return T0 + timedelta(minutes=n)


def jobs(**fields) -> pl.DataFrame:
    """One replica's row: submitted at T0, RUNNING from minute 2 (a database row)."""
    row = {
        "server": "s",
        "run_id": RUN,
        "job_id": JOB,
        "job_name": "svc-0-0",
        "status": "running",
        "deployment_num": 0,
        "submitted_at": T0,
        "last_processed_at": minutes(50),
        "running_at": minutes(2),
        "probe_count": 0,
        "provenance": f"jobs:{JOB}",
        **fields,
    }
    return pl.DataFrame([row], schema=JOBS_SCHEMA)


def event(kind: str, at: float, place: str = "events:1", **fields) -> dict:
    return {
        "server": "s",
        "seq": 1,
        "time": minutes(at),
        "time_basis": "db_utc",
        "kind": kind,
        "origin": "events_table" if place.startswith("events:") else "event_line",
        "entity_type": "job",
        "entity_id": JOB,
        "entity_name": "svc-0-0",
        "run_id": RUN,
        "provenance": [place],
        **fields,
    }


def events(*rows: dict) -> pl.DataFrame:
    return pl.DataFrame(list(rows), schema=EVENTS_SCHEMA)


def held(states: pl.DataFrame, *moments: float, ends=None) -> dict[float, dict[str, str]]:
    """Per moment (minutes after T0), aspect -> value of what held then."""
    asked = pl.DataFrame(
        {
            "server": "s",
            "job_id": JOB,
            "as_of": [minutes(m) for m in moments],
            "m": [float(m) for m in moments],
        }
    )
    found = at(states, asked, ends)
    out: dict[float, dict[str, str]] = {m: {} for m in moments}
    for row in found.iter_rows(named=True):
        key = row["aspect"] if row["probe"] is None else f"probe {row['probe']}"
        out[row["m"]][key] = row["value"]
    return out


def rows_of(states: pl.DataFrame, aspect: str) -> list[dict]:
    return states.filter(pl.col("aspect") == aspect).sort("since", nulls_last=True).to_dicts()


def test_status_intervals_from_events_each_until_the_next_and_the_last_open():
    states = job_states(
        jobs(status="terminated", running_at=None, last_processed_at=minutes(30)),
        events(
            event("job_created", 0, new_status="submitted"),
            event("job_status", 1, old_status="submitted", new_status="provisioning"),
            event("job_status", 2, old_status="provisioning", new_status="running"),
            event("job_status", 20, old_status="running", new_status="terminating"),
            event("job_status", 21, old_status="terminating", new_status="terminated"),
        ),
    )
    status = rows_of(states, "status")
    assert [(r["value"], r["since"], r["until"]) for r in status] == [
        ("submitted", T0, minutes(1)),
        ("provisioning", minutes(1), minutes(2)),
        ("running", minutes(2), minutes(20)),
        ("terminating", minutes(20), minutes(21)),
        ("terminated", minutes(21), None),
    ]
    assert status[-1]["until_is"] == "open"
    assert {r["since_is"] for r in status} == {"known"}
    assert held(states, 10, 20.5, 40) == {
        10: {"status": "running", "deployment": "0"},
        20.5: {"status": "terminating", "deployment": "0"},
        40: {"status": "terminated", "deployment": "0"},
    }


def test_a_database_time_outranks_a_logs_for_the_same_transition():
    # the log line of the same RUNNING is written later, to the millisecond
    states = job_states(
        jobs(),
        events(event("job_status", 2.5, place=f"{LOG}:7", new_status="running")),
    )
    running = [r for r in rows_of(states, "status") if r["value"] == "running"]
    assert len(running) == 1
    assert running[0]["since"] == minutes(2)
    assert running[0]["basis"] == "database"
    assert running[0]["provenance"] == f"jobs:{JOB}"


def test_a_logs_known_time_outranks_a_databases_bound():
    # a finished row dates its end only by last_processed_at (at or before it); the log's
    # line dates it exactly
    states = job_states(
        jobs(status="terminated", last_processed_at=minutes(40)),
        events(event("job_status", 30, place=f"{LOG}:9", new_status="terminated")),
    )
    terminated = [r for r in rows_of(states, "status") if r["value"] == "terminated"]
    assert [(r["since"], r["since_is"], r["basis"]) for r in terminated] == [
        (minutes(30), "known", "log")
    ]
    running = [r for r in rows_of(states, "status") if r["value"] == "running"]
    assert running[0]["until"] == minutes(30)


def test_a_bounded_end_says_so():
    states = job_states(jobs(status="terminated", last_processed_at=minutes(40)), events())
    running = next(r for r in rows_of(states, "status") if r["value"] == "running")
    assert (running["until"], running["until_is"]) == (minutes(40), "bounded")


def test_basis_of_each_provenance_shape():
    places = pl.Series(["jobs:abc", "/var/log/server.log:12", "runs.json#/0/jobs/1", "events:91"])
    assert pl.select(basis_of(pl.lit(places))).to_series().to_list() == [
        "database",
        "log",
        "api",
        "database",
    ]


def test_an_undated_ready_flag_holds_only_at_the_end_of_the_evidence():
    states = job_states(jobs(ready=True, probe_count=1), events())
    ready = rows_of(states, "ready")
    assert [(r["value"], r["since"], r["since_is"], r["until_is"]) for r in ready] == [
        ("true", None, "unknown", "open")
    ]
    got = held(states, 10, 60, ends={"s": END})
    assert "ready" not in got[10]
    assert got[60]["ready"] == "true"
    # without the end of the evidence it is at no moment
    assert "ready" not in held(states, 60)[60]


def test_a_dated_readiness_outranks_the_undated_flag():
    states = job_states(
        jobs(ready=True, probe_count=1),
        events(event("job_ready", 3, message="Service replica ready to receive requests")),
    )
    # not ready before it: dstack marks a replica ready once, and dates it with the event
    assert [(r["value"], r["since"], r["basis"]) for r in rows_of(states, "ready")] == [
        ("false", T0, "database"),
        ("true", minutes(3), "database"),
    ]
    assert held(states, 2, 4) == {
        2: {"status": "running", "deployment": "0", "ready": "false"},
        4: {"status": "running", "deployment": "0", "ready": "true"},
    }


def test_a_row_never_ready_was_not_ready_from_its_submission():
    states = job_states(jobs(ready=False, probe_count=1), events())
    assert held(states, 5)[5]["ready"] == "false"


def test_an_in_place_bump_changes_the_deployment_at_its_event():
    states = job_states(
        jobs(deployment_num=1).with_columns(pl.lit(0).alias("created_deployment")),
        events(event("job_updated", 10, deployment_num=1)),
    )
    assert [(r["value"], r["since"], r["until"]) for r in rows_of(states, "deployment")] == [
        ("0", T0, minutes(10)),
        ("1", minutes(10), None),
    ]
    got = held(states, 5, 15)
    assert (got[5]["deployment"], got[15]["deployment"]) == ("0", "1")


def test_a_bump_no_event_dates_leaves_the_deployment_unknown_between():
    # a pipeline build logs no bump: created in 0, the row says 1 at the end, nothing says when
    states = job_states(
        jobs(deployment_num=1).with_columns(pl.lit(0).alias("created_deployment")), events()
    )
    deployment = rows_of(states, "deployment")
    assert [(r["value"], r["since_is"], r["until_is"]) for r in deployment] == [
        ("0", "known", "unknown"),
        ("1", "unknown", "open"),
    ]
    got = held(states, 5, 60, ends={"s": END})
    assert "deployment" not in got[5]
    assert got[60]["deployment"] == "1"


def test_termination_from_the_event_and_from_the_row():
    states = job_states(
        jobs(
            status="terminated",
            termination_reason="terminated_by_user",
            last_processed_at=minutes(40),
        ),
        events(
            event(
                "job_status",
                30,
                new_status="terminating",
                termination_reason="terminated_by_server",
            )
        ),
    )
    # the cascade's reason at the TERMINATING transition, the user's stop written over it later
    assert [(r["value"], r["since"], r["since_is"]) for r in rows_of(states, "termination")] == [
        ("terminated_by_server", minutes(30), "known"),
        ("terminated_by_user", minutes(40), "bounded"),
    ]


def test_probe_results_hold_until_the_next_result_of_the_same_probe():
    probe = "svc-0-0-0"
    states = job_states(
        jobs(probe_count=1),
        events(
            event("probe_passed", 3, place=f"{LOG}:1", probe=probe),
            event("probe_passed", 4, place=f"{LOG}:2", probe=probe),
            event("probe_failed", 20, place=f"{LOG}:3", probe=probe),
        ),
    )
    assert [(r["value"], r["since"], r["until"]) for r in rows_of(states, "probe")] == [
        ("passing", minutes(3), minutes(4)),
        ("passing", minutes(4), minutes(20)),
        ("failing", minutes(20), None),
    ]
    got = held(states, 10, 25)
    assert (got[10][f"probe {probe}"], got[25][f"probe {probe}"]) == ("passing", "failing")


def test_the_final_probe_streaks_are_undated():
    states = job_states(jobs(probe_count=1, probe_rows=1, probes_below_ready_after=1), events())
    probe = rows_of(states, "probe")
    assert [(r["value"], r["since_is"]) for r in probe] == [("failing", "unknown")]


def test_the_final_verdict_is_the_state_at_the_end():
    states = job_states(
        jobs(status="terminated", last_processed_at=minutes(40)),
        events(event("job_status", 30, new_status="terminated")),
    )
    ended = final(states)
    assert set(ended["until_is"]) == {"open"}
    assert dict(zip(ended["aspect"].cast(pl.String), ended["value"], strict=True)) == {
        "status": "terminated",
        "deployment": "0",
    }


def test_a_replica_that_served_then_failed_a_probe_served_until_then():
    probe = "svc-0-0-0"
    states = job_states(
        jobs(probe_count=1),
        events(
            event("job_ready", 3),
            event("probe_passed", 3, place=f"{LOG}:1", probe=probe),
            event("probe_failed", 40, place=f"{LOG}:2", probe=probe),
        ),
    )
    asked = pl.DataFrame(
        {"server": "s", "job_id": JOB, "as_of": [minutes(1), minutes(2.5), minutes(30)]}
    )
    counts = jobs(probe_count=1).select("server", "job_id", "probe_count")
    serving = serving_at(at(states, asked), counts).sort("as_of")
    assert serving["serving"].to_list() == [False, False, True]
    later = pl.DataFrame({"server": "s", "job_id": JOB, "as_of": [minutes(45)]})
    assert serving_at(at(states, later), counts)["serving"].to_list() == [False]


def test_a_replica_without_probes_serves_while_running():
    states = job_states(jobs(probe_count=0), events())
    asked = pl.DataFrame({"server": "s", "job_id": JOB, "as_of": [minutes(1), minutes(5)]})
    counts = jobs().select("server", "job_id", "probe_count")
    assert serving_at(at(states, asked), counts).sort("as_of")["serving"].to_list() == [
        False,
        True,
    ]


def test_no_evidence_no_states():
    empty = pl.DataFrame(schema=JOBS_SCHEMA)
    assert job_states(empty, events()).is_empty()


@pytest.fixture(scope="module")
def mid_cascade():
    # dstack 0.22.5's own server: a fix applied during the cascade (copied from the captures)
    root = DATA / "states" / "fix-applied-mid-cascade"
    database = open_sources([root / "server.db"])
    log = open_sources([root / "server-info.standard.log"])
    both = open_sources([root / "server.db", root / "server-info.standard.log"])
    return database, log, both


def _status_story(audit) -> list[tuple]:
    states = job_states(audit.submissions, audit.events)
    names = audit.submissions.select("job_id", "job_name", "submission_num")
    return (
        states.filter(pl.col("aspect") == "status")
        .join(names, on="job_id")
        .sort("since")
        .select("job_name", "value", "basis")
        .rows()
    )


def test_a_capture_read_from_its_database_and_from_its_log_tells_one_story(mid_cascade):
    database, log, both = mid_cascade
    from_db, from_log = _status_story(database), _status_story(log)
    assert [r[:2] for r in from_db] == [r[:2] for r in from_log]
    assert {r[2] for r in from_db} == {"database"} and {r[2] for r in from_log} == {"log"}
    # read together, every transition both date is the database's
    assert _status_story(both) == from_db


def test_the_replica_the_cascade_killed_served_until_the_kill(mid_cascade):
    database, _, _ = mid_cascade
    subs = database.submissions
    states = job_states(subs, database.events)
    victim = subs.filter(pl.col("termination_reason") == "terminated_by_server").row(0, named=True)
    moments = pl.DataFrame(
        {
            "server": victim["server"],
            "job_id": victim["job_id"],
            "as_of": [victim["ready_at"] + timedelta(seconds=1), victim["stopped_at"]],
        }
    )
    counts = subs.select("server", "job_id", "probe_count")
    serving = serving_at(at(states, moments), counts).sort("as_of")
    assert serving["serving"].to_list() == [True, False]


def test_serving_capacity_counts_a_replica_that_served_then_failed_a_probe_until_it_failed():
    # ready at minute 3 (its probe passing), the probe fails at minute 40, the run's cascade
    # stops it at minute 45: the final verdict is not healthy, yet it served 37 minutes
    probe = "svc-0-0-0"
    rows = jobs(
        status="terminated",
        termination_reason="terminated_by_server",
        last_processed_at=minutes(46),
        probe_count=1,
        probe_ready_after=1,
    )
    logged = events(
        event("job_ready", 3),
        event("probe_passed", 3, place=f"{LOG}:1", probe=probe),
        event("probe_failed", 40, place=f"{LOG}:2", probe=probe),
        event("job_status", 45, old_status="running", new_status="terminating"),
    )
    evidence = Evidence(
        runs=pl.DataFrame([{"server": "s", "run_id": RUN}], schema=RUNS_SCHEMA),
        jobs=rows,
        events=logged,
    )
    subs = submissions(evidence)
    assert subs["health"].to_list() == ["not_healthy"]
    capacity = serving_capacity(subs, logged, END, {"s": END})
    assert capacity.select("time", "healthy_replicas").rows() == [(minutes(3), 1), (minutes(40), 0)]


# What health and liveness at a moment are decided from: only states.py reads these (the
# sources write them, the canonical model declares them).
HEALTH_FACTS = {
    "ready",
    "ready_at",
    "running_event_at",
    "probes_below_ready_after",
    "probe_rows",
    "min_probe_streak",
    "probe_results",
}
# A job's stop or serving start compared with a moment decides liveness or health then.
MOMENT_COLUMNS = {"stopped_at", "healthy_since"}
MOMENTS = {"as_of", "failed", "moment", "at", "start"}
READERS_OF_RAW_FACTS = ("sources", "synth")


def _strings(node: ast.AST) -> set[str]:
    return {
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def _decisions(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "pl"
            and node.func.attr in ("col", "coalesce")
        ):
            read = {a.value for a in node.args if isinstance(a, ast.Constant)} & HEALTH_FACTS
            found += [(node.lineno, f"pl.{node.func.attr}({name!r})") for name in read]
        if (
            isinstance(node, ast.Subscript)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value in HEALTH_FACTS
        ):
            found.append((node.lineno, f"[{node.slice.value!r}]"))
        if isinstance(node, ast.Compare) and not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            strings = _strings(node)
            if strings & MOMENT_COLUMNS and strings & MOMENTS:
                found.append((node.lineno, f"compares {sorted(strings & MOMENT_COLUMNS)}"))
    return found


def test_no_place_but_states_decides_health_or_liveness_at_a_moment():
    package = Path(analyzer.__file__).parent
    offending = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.parts[0] in READERS_OF_RAW_FACTS or path.name in ("states.py", "model.py"):
            continue
        offending += [
            f"{relative}:{line}: {what}" for line, what in _decisions(ast.parse(path.read_text()))
        ]
    assert offending == []


def test_the_decision_scan_finds_a_decision():
    # the scan is no test that can never fail: each kind of decision it looks for is found
    source = (
        "ok = pl.col('ready_at') <= pl.col('as_of')\n"
        "alive = pl.col('stopped_at') > pl.col('as_of')\n"
        "flag = job['probes_below_ready_after']\n"
    )
    assert sorted(_decisions(ast.parse(source))) == [
        (1, "pl.col('ready_at')"),
        (2, "compares ['stopped_at']"),
        (3, "['probes_below_ready_after']"),
    ]


# The wrong claims of issue 34, on the real rows of dstack 0.22.5's own server: a broken
# `commands` update (deployment 1), then a `replicas`-only change (deployment 2) while the
# surge replica was starting; the crashing replica is created in deployment 2, the healthy old
# replicas of deployment 0 are killed (copied from the captures).
SCALE_DOWN = DATA / "states" / "scale-down-mid-rollout"
OLD_REPLICAS = {"svc-0-0": 0, "svc-0-1": 0}


@pytest.mark.parametrize("source", ["server.db", "server-info.standard.log"])
def test_the_root_cause_is_the_update_whose_spec_the_crashing_replica_runs(source):
    (finding,) = open_sources([SCALE_DOWN / source]).report.findings
    assert finding.category == "collateral_termination"
    assert {v.job_name: v.deployment_num for v in finding.victims} == OLD_REPLICAS
    assert [(c.job_name, c.deployment_num) for c in finding.culprits] == [("svc-0-2", 2)]
    # not the renumbering (deployment 2: replicas only, applied in place)
    assert finding.changed_fields == "configuration.commands"
    assert finding.root_cause.changed_fields == "configuration.commands"
    assert any("runs the job spec of deployment 1" in note for note in finding.notes)


def test_a_log_proves_the_old_replicas_kept_their_deployment_through_a_replicas_change():
    # the commands update came after their creation: their spec is older than the run's, so
    # the replicas-only update bumped nothing of theirs (reference 6.2) and the log says so
    (finding,) = open_sources([SCALE_DOWN / "server-info.standard.log"]).report.findings
    codes = {limitation.code for limitation in finding.limitations}
    assert "deployment_not_provable_from_logs" not in codes
    assert [v.rule for v in finding.victims] == ["collateral_termination"] * 2


# dstack 0.22.5 accepted `dstack apply` of the fix 1.9 s after the run went TERMINATING, as an
# in-place update (deployment 2), then finished the cascade; a second apply made a new run.
MID_CASCADE = DATA / "states" / "fix-applied-mid-cascade"


@pytest.mark.parametrize("source", ["server.db", "server-info.standard.log"])
def test_a_fix_accepted_during_the_cascade_is_reported_as_never_run(source):
    report = open_sources([MID_CASCADE / source]).report
    (finding,) = report.findings
    (verdict,) = [v for v in report.runs if v.run_id == finding.run_id]
    assert "an update accepted during the cascade never ran (deployment 2" in verdict.why
    (note,) = [n for n in finding.notes if n.startswith("deployment 2 (")]
    assert "changed configuration.commands) was accepted at 2026-12-23T10:10:19" in note
    assert "after the run had failed at 2026-12-23T10:10:17" in note
    (again,) = [v for v in report.runs if v.run_id != finding.run_id]
    assert f"applied again as a new run of the same name ({again.run_id})" in note
    assert "submitted at 2026-12-23T10:12:36" in note
    assert any("Deployment: 2" in item.text for item in finding.evidence)
    # the root cause stays the update the failing replica ran
    assert finding.changed_fields == "configuration.commands"
    assert finding.update_deployment_num == 1


def test_the_end_of_the_evidence_counts_every_event_a_deleted_projects_too(tmp_path):
    # a "Project deleted" event 30 s after every row of the tables: the server was at work then,
    # so an outage not recovered by then lasted at least until it (its target is no run or job)
    db = tmp_path / "server.db"
    shutil.copyfile(MID_CASCADE / "server.db", db)
    before = open_sources([db]).end_of_evidence
    with sqlite3.connect(db) as connection:
        query = "SELECT id FROM projects WHERE name = 'hanso'"
        (project_id,) = connection.execute(query).fetchone()
        later = (before + timedelta(seconds=30)).strftime("%Y-%m-%d %H:%M:%S.%f")
        connection.execute(
            "INSERT INTO events VALUES ('e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0', 'Project deleted', ?, "
            "NULL)",
            (later,),
        )
        connection.execute(
            "INSERT INTO event_targets VALUES ('f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0', "
            "'e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0e0', ?, 'PROJECT', ?, 'hanso', NULL, NULL, NULL)",
            (project_id, project_id),
        )
    after = open_sources([db])
    assert after.end_of_evidence == before + timedelta(seconds=30)
    assert after.events.filter(pl.col("message") == "Project deleted").is_empty()


def test_an_earlier_failure_whose_row_dstack_deleted_is_read_from_its_events(tmp_path):
    # retry-on-error (dstack 0.22.5): the new replica crashed, was re-submitted and failed again;
    # dstack deletes superseded submissions' rows and keeps their events
    # (delete_superseded_no_capacity_job_submissions): the first failure is still the root cause
    db = tmp_path / "server.db"
    shutil.copyfile(CAPTURES / "v0.22.5" / "retry-on-error" / "server.db", db)
    (kept,) = open_sources([db]).report.findings[0].culprits
    (first,) = kept.earlier_failures
    with sqlite3.connect(db) as connection:
        for table, column in (("probes", "job_id"), ("jobs", "id")):
            connection.execute(
                f"DELETE FROM {table} WHERE {column} IN (SELECT id FROM jobs WHERE "
                "job_name = 'inference-0-1' AND submission_num = 0)"
            )
    report = open_sources([db]).report
    (finding,) = report.findings
    (culprit,) = finding.culprits
    (earlier,) = culprit.earlier_failures
    assert (earlier.job_id, earlier.termination_reason, earlier.failed_at) == (
        first.job_id,
        "container_exited_with_error",
        first.failed_at,
    )
    assert earlier.submission_num is None and earlier.exit_status is None  # not in its events
    assert finding.root_cause.failure_class == report.findings[0].root_cause.failure_class
    # the ECS circuit breaker trips at the first failed launch of the new deployment
    (ecs,) = [c for c in finding.counterfactuals if c.model == "ecs-circuit-breaker-rollback"]
    assert ecs.declared_failed_at == first.failed_at


def _api_run(*jobs: tuple[int, int, str, list[int], list[int]]) -> dict:
    """An API run of jobs (replica, job_num, status, ready_after per probe, streak per probe)."""
    return {
        "jobs": [
            {
                "job_spec": {
                    "replica_num": replica,
                    "job_num": job_num,
                    "probes": [{"ready_after": wanted} for wanted in ready_after],
                },
                "job_submissions": [
                    {"status": "terminated"},  # an earlier submission never speaks of now
                    {"status": status, "probes": [{"success_streak": s} for s in streaks]},
                ],
            }
            for replica, job_num, status, ready_after, streaks in jobs
        ]
    }


def test_a_live_runs_replicas_serve_by_the_same_ladder():
    """The guard's question about now, asked of states: RUNNING and every probe's streak at
    its ready_after serves; a streak below it, a missing probe result, a pulling job or a
    second job of a replica does not; active counts every replica not yet ending."""
    run = _api_run(
        (0, 0, "running", [2], [2]),  # ready
        (1, 0, "running", [3], [1]),  # below ready_after
        (2, 0, "running", [1, 1], [5]),  # one probe has no result yet
        (3, 0, "pulling", [], []),
        (4, 0, "running", [], []),  # no probes: RUNNING is ready
        (5, 1, "running", [], []),  # a replica's second job is not the replica
        (6, 0, "terminating", [], []),
    )
    assert states.replicas_serving_now(run) == 2
    assert states.replicas_active_now(run) == 6
    assert states.replicas_serving_now({"jobs": []}) == 0


def test_the_guard_asks_states_about_now():
    import analyzer.service.guard as guard

    source = Path(guard.__file__).read_text()
    assert "success_streak" not in source and "ready_after" not in source
    assert "replicas_serving_now" in source
