"""The detection stage on small hand-built canonical frames: one test per verdict path and per
rule of `rules.VICTIM_RULES` (each reason a job of a candidate run is no victim)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from analyzer.model import EVENTS_SCHEMA, JOBS_SCHEMA, RUNS_SCHEMA
from analyzer.pipeline.detect import detect
from analyzer.pipeline.evidence import Evidence
from analyzer.pipeline.impact import impact_rank
from analyzer.pipeline.rules import CATEGORIES, CATEGORY_ORDER, RULES, VICTIM_RULES, is_culprit
from analyzer.pipeline.timeline import submissions

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
RUN_ID = "11111111-1111-1111-1111-111111111111"


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def run(**fields) -> dict:
    """A service that failed with JOB_FAILED after an update to deployment 1."""
    return {
        "server": "s",
        "run_id": RUN_ID,
        "project": "main",
        "run_name": "svc",
        "run_type": "service",
        "status": "failed",
        "termination_reason": "job_failed",
        "deployment_num": 1,
        "submitted_at": at(0),
        "last_processed_at": at(30),
        "provenance": "runs:1",
        **fields,
    }


def old_replica(**fields) -> dict:
    """A healthy replica of deployment 0 the cascade stopped (TERMINATED_BY_SERVER, no message)."""
    return {
        "server": "s",
        "run_id": RUN_ID,
        "job_id": "00000000-0000-0000-0000-00000000000a",
        "job_name": "svc-0-0",
        "replica_num": 0,
        "job_num": 0,
        "submission_num": 0,
        "deployment_num": 0,
        "status": "terminated",
        "termination_reason": "terminated_by_server",
        "submitted_at": at(1),
        "last_processed_at": at(25),
        "has_provisioning_data": True,
        "ready": True,
        "graceful_termination_attempts": 1,
        "probe_count": 0,
        "deployment_basis": "table",
        "provenance": "jobs:a",
        **fields,
    }


def culprit(**fields) -> dict:
    """A replica of deployment 1 that failed by itself."""
    return (
        old_replica(
            job_id="00000000-0000-0000-0000-00000000000c",
            job_name="svc-1-0",
            replica_num=1,
            deployment_num=1,
            status="failed",
            termination_reason="failed_to_start_due_to_no_capacity",
            submitted_at=at(10),
            last_processed_at=at(20),
            has_provisioning_data=False,
            ready=False,
            graceful_termination_attempts=None,
            provenance="jobs:c",
        )
        | fields
    )


def judge(runs: list[dict], jobs: list[dict], disputed=None, events=()):
    runs_frame = pl.DataFrame(runs, schema=RUNS_SCHEMA)
    evidence = Evidence(
        runs=runs_frame,
        jobs=pl.DataFrame(jobs, schema=JOBS_SCHEMA),
        events=pl.DataFrame(list(events), schema=EVENTS_SCHEMA),
    )
    verdicts, findings = detect(runs_frame, submissions(evidence), evidence.events, disputed)
    assert len(verdicts) == 1
    return verdicts[0], findings


def also_stopped(findings) -> dict[str, str]:
    return {o.job_name: o.why_not_victim for f in findings for o in f.also_stopped}


def test_rule_and_category_names_are_unique_and_cite_dstack():
    names = [r.id for r in RULES]
    assert len(names) == len(set(names))
    assert all(
        r.dstack and r.outcome in ("ignored", "not_victim", "undecided") for r in VICTIM_RULES
    )
    assert all("reference" in r.dstack or ".py" in r.dstack for r in VICTIM_RULES)
    assert all(c.outcome == "victim" and c.culprits for c in CATEGORIES)
    assert CATEGORY_ORDER[0] == "collateral_termination"


# Verdicts that need no look inside the run.


def test_a_task_run_is_no_incident():
    verdict, findings = judge([run(run_type="task")], [old_replica(), culprit()])
    assert (verdict.verdict, findings) == ("no_incident", [])
    assert "services only" in verdict.why


def test_a_running_run_is_no_incident_in_progress():
    verdict, _ = judge([run(status="running", termination_reason=None)], [old_replica()])
    assert verdict.verdict == "no_incident" and verdict.in_progress
    assert "still running" in verdict.why


def test_a_user_stop_is_no_incident():
    verdict, _ = judge([run(status="terminated", termination_reason="stopped_by_user")], [])
    assert verdict.verdict == "no_incident"
    assert "stopped_by_user, not a job failure" in verdict.why


def test_a_finished_run_without_reason_is_no_incident():
    verdict, _ = judge([run(status="done", termination_reason=None)], [])
    assert (verdict.verdict, verdict.why) == ("no_incident", "run done without a job failure")


# Candidate runs.


def test_no_job_that_failed_by_itself_is_inconclusive():
    verdict, _ = judge([run()], [old_replica()])
    assert verdict.verdict == "inconclusive"
    assert "no job that failed by itself" in verdict.why


def test_a_retry_step_message_is_no_own_failure():
    step = culprit(status="terminated", termination_reason="terminated_by_server")
    step["termination_reason_message"] = "Replica is to be retried"
    verdict, _ = judge([run()], [old_replica(), step])
    assert verdict.verdict == "inconclusive"


def test_newer_culprit_older_healthy_victim_is_collateral_termination():
    verdict, findings = judge([run()], [old_replica(), culprit()])
    assert verdict.verdict == "collateral_termination"
    (finding,) = findings
    assert [v.job_name for v in finding.victims] == ["svc-0-0"]
    assert [c.job_name for c in finding.culprits] == ["svc-1-0"]
    assert finding.victims[0].health_proof == "jobs.ready = 1"
    assert finding.victims[0].stopped


def test_culprit_and_victim_in_one_deployment_is_same_deployment_collateral():
    verdict, findings = judge([run()], [old_replica(deployment_num=1), culprit()])
    assert verdict.verdict == "same_deployment_collateral"
    assert findings[0].category == "same_deployment_collateral"


def test_older_culprit_newer_victim_is_newer_deployment_collateral():
    verdict, findings = judge([run()], [old_replica(deployment_num=1), culprit(deployment_num=0)])
    assert verdict.verdict == "newer_deployment_collateral"
    assert findings[0].update_deployment_num == 1


def test_nothing_healthy_lost_is_no_healthy_victim():
    verdict, findings = judge(
        [run()], [old_replica(ready=False, graceful_termination_attempts=None), culprit()]
    )
    assert (verdict.verdict, findings) == ("no_healthy_victim", [])
    assert "no healthy replica was stopped" in verdict.why
    assert "svc-0-0: not healthy when stopped: jobs.ready = 0" in verdict.why


def test_a_victim_not_yet_stopped_mid_cascade_is_suspected():
    verdict, findings = judge(
        [run(status="terminating")],
        [old_replica(status="running", termination_reason=None), culprit()],
    )
    assert verdict.verdict == "collateral_termination"
    (victim,) = findings[0].victims
    assert not victim.stopped
    assert victim.expected_termination_reason == "terminated_by_server"
    assert findings[0].confidence == "suspected"


def test_a_log_with_times_of_day_only_gives_no_datetimes():
    terminating = {
        "server": "s",
        "seq": 1,
        "time_text": "09:21:00",
        "time_basis": "time_of_day_only",
        "kind": "run_status",
        "origin": "event_line",
        "entity_type": "run",
        "entity_id": RUN_ID,
        "entity_name": "svc",
        "run_id": RUN_ID,
        "old_status": "running",
        "new_status": "terminating",
        "termination_reason": "job_failed",
        "message": "Run status changed RUNNING -> TERMINATING. Termination reason: JOB_FAILED",
        "provenance": ["server.log:7"],
    }
    verdict, findings = judge([run()], [old_replica(), culprit()], events=[terminating])
    assert verdict.verdict == "collateral_termination"
    (finding,) = findings
    assert finding.victims[0].terminated_at is None and finding.culprits[0].failed_at is None
    assert any("times of day only" in note for note in finding.notes)
    assert any(item.text.startswith("[09:21:00 local, date unknown]") for item in finding.evidence)


def test_disputed_rows_make_the_run_inconclusive():
    verdict, findings = judge(
        [run()], [old_replica(), culprit()], disputed={("s", RUN_ID): "two jobs rows"}
    )
    assert (verdict.verdict, findings) == ("inconclusive", [])
    assert "duplicate rows disagree: two jobs rows" in verdict.why


def event(kind: str, entity: dict | None, minutes: float, **fields) -> dict:
    """An events-table row about the run (entity None) or one of its jobs, dated."""
    return {
        "server": "s",
        "seq": int(minutes * 100),
        "time": at(minutes),
        "time_basis": "db_utc",
        "kind": kind,
        "origin": "events_table",
        "entity_type": "job" if entity else "run",
        "entity_id": entity["job_id"] if entity else RUN_ID,
        "entity_name": entity["job_name"] if entity else "svc",
        "run_id": RUN_ID,
        "actor": "system",
        "message": kind,
        "provenance": [f"events:{kind}{minutes}"],
        **fields,
    }


def run_failed(minutes: float, reason: str = "job_failed", **fields) -> dict:
    return event(
        "run_status",
        None,
        minutes,
        old_status="running",
        new_status="terminating",
        termination_reason=reason,
        **fields,
    )


WITH_PROBES = {"ready": None, "probe_count": 1, "probe_rows": 1, "probes_below_ready_after": 0}

# One test per rule of VICTIM_RULES: (jobs, run fields, expected verdict, expected text, and
# the events, if the case needs any).

RULE_CASES = {
    "snapshot_before_cascade": (
        [old_replica(status="running", termination_reason=None), culprit()],
        {},
        "inconclusive",
        "snapshot taken before the cascade reached it",
    ),
    "not_stopped_by_cascade": (
        [old_replica(termination_reason="scaled_down"), culprit()],
        {},
        "no_healthy_victim",
        None,
    ),
    "never_served_mid_cascade": (
        [old_replica(status="pulling", termination_reason=None), culprit()],
        {"status": "terminating"},
        "no_healthy_victim",
        "svc-0-0: still pulling when the evidence ends (never served)",
    ),
    "stopped_before_culprit": (
        [old_replica(last_processed_at=at(5), graceful_termination_attempts=None), culprit()],
        {},
        "no_healthy_victim",
        "svc-0-0: stopped before any culprit failed",
    ),
    "never_provisioned": (
        [old_replica(has_provisioning_data=False), culprit()],
        {},
        "no_healthy_victim",
        "svc-0-0: never got an instance (no provisioning data)",
    ),
    "not_healthy": (
        [
            old_replica(ready=None, probe_count=1, probe_rows=1, probes_below_ready_after=1),
            culprit(),
        ],
        {},
        "no_healthy_victim",
        "svc-0-0: not healthy when stopped: a probe's last success_streak is below its ready_after",
    ),
    "probe_failing_at_failure": (
        # ready at 3, its probe failed at 20.5 (a log line), the run failed at 21
        [old_replica(**WITH_PROBES | {"ready": True, "probe_ready_after": 1}), culprit()],
        {},
        "no_healthy_victim",
        "svc-0-0: its probe was failing when the run failed: the last result logged before the "
        "failure, at 2026-11-02T09:20:30+00:00 (server.log:7), left its streak below ready_after",
        [
            run_failed(21),
            event("job_ready", old_replica(), 3),
            event(
                "probe_failed",
                old_replica(),
                20.5,
                probe="svc-0-0-0",
                origin="status_line",
                time_basis="log_local_offset_inferred",
                provenance=["server.log:7"],
            ),
        ],
    ),
    "not_serving_at_failure": (
        [old_replica(**WITH_PROBES | {"ready": True}), culprit()],
        {},
        "no_healthy_victim",
        "svc-0-0: not yet serving when the run failed: the evidence dates its readiness after "
        "the failure",
        [run_failed(21), event("job_ready", old_replica(), 22)],
    ),
    "health_not_dated": (
        [old_replica(**WITH_PROBES), culprit()],
        {},
        "inconclusive",
        "its health proof (probe_streaks) is not dated at or before the run's failure",
        [run_failed(21)],
    ),
    "health_undecided": (
        [
            old_replica(
                ready=None, probe_count=None, graceful_termination_attempts=None, running_at=at(2)
            ),
            culprit(),
        ],
        {},
        "inconclusive",
        "was stopped by the cascade but its health cannot be decided",
    ),
    "deployment_unknown": (
        [old_replica(deployment_num=None), culprit()],
        {},
        "inconclusive",
        "svc-0-0 (job 00000000-0000-0000-0000-00000000000a, deployment None): deployment number "
        "unknown",
    ),
    "newer_and_older_culprits": (
        [
            old_replica(),
            culprit(),
            culprit(job_id="d", job_name="svc-2-0", replica_num=2, deployment_num=0),
        ],
        {},
        "inconclusive",
        "replicas of a newer and of its own or an older deployment failed before the cascade",
    ),
    "culprit_deployment_unknown": (
        [old_replica(), culprit(deployment_num=None)],
        {},
        "inconclusive",
        "the failing replica's deployment is unknown",
    ),
}


def test_every_rule_has_its_case():
    assert set(RULE_CASES) == {r.id for r in VICTIM_RULES}


@pytest.mark.parametrize("name", list(RULE_CASES))
def test_rule(name):
    jobs, run_fields, expected, text, *events = RULE_CASES[name]
    verdict, findings = judge([run(**run_fields)], jobs, events=events[0] if events else ())
    assert verdict.verdict == expected, verdict.why
    assert findings == []
    if text is None:  # ignored: the job is named nowhere
        assert "svc-0-0" not in verdict.why
    else:
        assert text in verdict.why


def test_a_not_victim_beside_a_victim_is_listed_in_the_finding():
    never = old_replica(
        job_id="00000000-0000-0000-0000-00000000000b",
        job_name="svc-2-0",
        replica_num=2,
        has_provisioning_data=False,
    )
    verdict, findings = judge([run()], [old_replica(), never, culprit()])
    assert verdict.verdict == "collateral_termination"
    assert also_stopped(findings) == {"svc-2-0": "never got an instance (no provisioning data)"}
    # each judged job names the rule that judged it (JSON contract, schema 4)
    assert [v.rule for v in findings[0].victims] == ["collateral_termination"]
    assert [o.rule for o in findings[0].also_stopped] == ["never_provisioned"]


def _slot(submission: int, created: datetime, own_failure: bool) -> dict:
    return {
        "server": "s",
        "run_id": "r",
        "job_id": f"j{submission}",
        "replica_num": 1,
        "job_num": 0,
        "submission_num": submission,
        "created_at": created,
        "own_failure": own_failure,
    }


def find_culprits(slots: list[dict], run_terminating_at: datetime | None) -> list[str]:
    frame = pl.DataFrame(slots).with_columns(
        pl.lit(run_terminating_at, pl.Datetime("us", "UTC")).alias("run_terminating_at"),
        pl.lit(None, pl.String).alias("failure_basis"),
        *(
            pl.lit(None, pl.Datetime("us", "UTC")).alias(c)
            for c in ("stop_at", "terminating_at", "finished_at", "last_processed_at")
        ),
    )
    return frame.with_row_index("_row").filter(is_culprit())["job_id"].to_list()


def test_only_the_latest_submission_of_a_slot_is_a_culprit():
    retried = [_slot(0, at(1), True), _slot(1, at(2), False)]
    assert find_culprits(retried, at(10)) == []
    failed_again = [_slot(0, at(1), False), _slot(1, at(2), True)]
    assert find_culprits(failed_again, at(10)) == ["j1"]


def test_a_submission_created_after_the_run_went_terminating_is_no_culprit():
    jobs = [_slot(0, at(1), True), _slot(1, at(12), False)]
    assert find_culprits(jobs, at(10)) == ["j0"]
    assert find_culprits(jobs, None) == []


def test_the_order_the_sources_give_runs_in_does_not_change_the_report():
    """Two runs of one name (a service deleted and applied again): whichever order the runs
    arrive in, they are judged, and their findings ranked, in one order."""
    other = "22222222-2222-2222-2222-222222222222"
    runs = [run(), run(run_id=other)]
    jobs = [old_replica(), culprit()]
    jobs += [
        job | {"run_id": other, "job_id": job["job_id"][:-1] + "f" + job["job_id"][-1]}
        for job in jobs
    ]
    evidence = Evidence(
        runs=pl.DataFrame(runs, schema=RUNS_SCHEMA),
        jobs=pl.DataFrame(jobs, schema=JOBS_SCHEMA),
        events=pl.DataFrame(schema=EVENTS_SCHEMA),
    )
    subs = submissions(evidence)
    told = [
        detect(frame, subs, evidence.events) for frame in (evidence.runs, evidence.runs.reverse())
    ]
    assert told[0] == told[1]
    assert [v.run_id for v in told[0][0]] == sorted([RUN_ID, other])
    ranked = [sorted(findings, key=impact_rank) for _, findings in told]
    assert [f.run_id for f in ranked[0]] == [f.run_id for f in ranked[1]] == sorted([RUN_ID, other])


# A user's stop during the cascade (moments.run_failures) ------------------------------------

STOPPED = {"status": "terminated", "termination_reason": "stopped_by_user"}


def _stopped_by_user(minutes: float) -> dict:
    return run_failed(minutes, "stopped_by_user", actor="user alice")


def test_a_failure_before_the_users_stop_keeps_the_cascade_suspected():
    """The replica failed at 20; alice stopped the run at 22, before dstack's run pass failed
    it; the stop reached the healthy old replica (TERMINATED_BY_USER) at 22.5."""
    victim = old_replica(termination_reason="terminated_by_user", running_at=at(2))
    events = [
        _stopped_by_user(22),
        event(
            "job_status",
            victim,
            22.5,
            old_status="running",
            new_status="terminating",
            termination_reason="terminated_by_user",
        ),
    ]
    verdict, findings = judge([run(**STOPPED)], [victim, culprit()], events=events)
    assert verdict.verdict == "collateral_termination", verdict.why
    (finding,) = findings
    assert finding.confidence == "suspected"
    assert [v.job_name for v in finding.victims] == ["svc-0-0"]
    (stop,) = finding.limitations
    assert stop.code == "run_stopped_during_cascade"
    assert "when alice stopped the run at 2026-11-02T09:22:00+00:00 (the stop's event)" in (
        stop.message
    )
    assert finding.run_failure_reason is None
    assert finding.run_termination_reason == "stopped_by_user"


def test_a_stop_before_the_failure_stays_the_users():
    victim = old_replica(termination_reason="terminated_by_user", running_at=at(2))
    late = culprit(last_processed_at=at(25))
    verdict, findings = judge([run(**STOPPED)], [victim, late], events=[_stopped_by_user(22)])
    assert (verdict.verdict, findings) == ("no_incident", [])
    assert verdict.why == "run ended with stopped_by_user, not a job failure"


def test_without_events_the_cascade_label_shows_a_failure_before_the_stop():
    """No event dates the run's TERMINATING (tables only, or past the TTL): the old replica's
    TERMINATED_BY_SERVER without a message is the cascade's label for a server reason."""
    verdict, findings = judge([run(**STOPPED)], [old_replica(), culprit()])
    assert verdict.verdict == "collateral_termination", verdict.why
    (finding,) = findings
    assert finding.confidence == "suspected"
    (stop,) = finding.limitations
    assert stop.code == "run_stopped_during_cascade"
    assert "svc-0-0 carries the cascade's TERMINATED_BY_SERVER" in stop.message
    # a user-labelled job cannot be ordered against a failure nothing dates: not a victim
    verdict, findings = judge(
        [run(**STOPPED)], [old_replica(termination_reason="terminated_by_user"), culprit()]
    )
    assert (verdict.verdict, findings) == ("no_incident", [])
