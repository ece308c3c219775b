"""The health ladder (pipeline/timeline.py) on hand-built canonical frames: one test per proof
of HEALTH_PROOFS and UNHEALTHY_PROOFS, and the cases it leaves undecided."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from analyzer.model import EVENTS_SCHEMA, JOBS_SCHEMA, RUNS_SCHEMA
from analyzer.pipeline.evidence import Evidence
from analyzer.pipeline.timeline import HEALTH_PROOFS, UNHEALTHY_PROOFS, submissions

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
RUN_ID = "11111111-1111-1111-1111-111111111111"
JOB_ID = "00000000-0000-0000-0000-00000000000a"


def job(**fields) -> dict:
    """A replica that reached RUNNING (running_at) and was stopped by the cascade."""
    return {
        "server": "s",
        "run_id": RUN_ID,
        "job_id": JOB_ID,
        "job_name": "svc-0-0",
        "replica_num": 0,
        "job_num": 0,
        "submission_num": 0,
        "deployment_num": 0,
        "status": "terminated",
        "termination_reason": "terminated_by_server",
        "submitted_at": T0,
        "last_processed_at": T0 + timedelta(minutes=20),
        "running_at": T0 + timedelta(minutes=2),
        "has_provisioning_data": True,
        "provenance": "jobs:a",
        **fields,
    }


def event(kind: str) -> dict:
    return {
        "server": "s",
        "seq": 1,
        "time": T0 + timedelta(minutes=3),
        "time_basis": "db_utc",
        "kind": kind,
        "origin": "events_table",
        "entity_type": "job",
        "entity_id": JOB_ID,
        "entity_name": "svc-0-0",
        "run_id": RUN_ID,
        "message": "Service replica ready to receive requests",
        "provenance": ["events:1"],
        # a DEBUG probe line (log sources): its probe, named as probes.name
        "probe": "svc-0-0-0" if kind.startswith("probe_") else None,
    }


def health(jobs: list[dict], events: list[dict] = ()) -> tuple[str | None, str]:
    evidence = Evidence(
        runs=pl.DataFrame([{"server": "s", "run_id": RUN_ID}], schema=RUNS_SCHEMA),
        jobs=pl.DataFrame(jobs, schema=JOBS_SCHEMA),
        events=pl.DataFrame(list(events), schema=EVENTS_SCHEMA),
    )
    row = submissions(evidence).row(0, named=True)
    return row["health_proof"], row["health"]


PROBES_OK = {"probe_count": 1, "probe_rows": 1, "probes_below_ready_after": 0}

# proof -> (job fields, job event kinds)
CASES: dict[str, tuple[dict, list[str]]] = {
    "ready_flag": ({"ready": True}, []),
    "ready_flag_and_probes": ({"ready": True, **PROBES_OK}, []),
    "ready_event": ({}, ["job_ready"]),
    "ready_event_and_probes": (PROBES_OK, ["job_ready"]),
    "registered_event": ({}, ["job_registered"]),
    "registered_event_and_probes": (PROBES_OK, ["job_registered"]),
    "probe_streaks": (PROBES_OK, []),
    # two passes logged before the stop reach ready_after 2 (no ready column: a log)
    "probe_lines": ({"probe_count": 1, "probe_ready_after": 2}, ["probe_passed", "probe_passed"]),
    "running_no_probes": ({"graceful_termination_attempts": 1, "probe_count": 0}, []),
    "still_running_no_probes": (
        {"status": "running", "termination_reason": None, "probe_count": 0},
        [],
    ),
    "probe_failing": ({**PROBES_OK, "probes_below_ready_after": 1}, []),
    "probe_failed_logged": ({"probe_count": 1}, ["job_ready", "probe_failed"]),
    "never_running": ({"has_provisioning_data": False}, []),
    "not_ready": ({"ready": False}, []),
    "probes_never_ran": ({"probe_count": 2, "probe_rows": 0}, []),
}


def test_every_proof_has_its_case():
    assert set(CASES) == set(HEALTH_PROOFS) | set(UNHEALTHY_PROOFS)
    assert not set(HEALTH_PROOFS) & set(UNHEALTHY_PROOFS)


@pytest.mark.parametrize("proof", list(CASES))
def test_proof(proof):
    fields, kinds = CASES[proof]
    expected = "healthy" if proof in HEALTH_PROOFS else "not_healthy"
    assert health([job(**fields)], [event(k) for k in kinds]) == (proof, expected)


def test_one_logged_pass_below_ready_after_proves_nothing_by_itself():
    """A pass after no failure, below ready_after: the log may have begun mid-streak."""
    assert health([job(probe_count=1, probe_ready_after=2)], [event("probe_passed")]) == (
        None,
        "unknown",
    )


def test_ready_flag_contradicting_a_running_marker_is_undecided():
    assert health([job(ready=False, graceful_termination_attempts=0)]) == (
        "ready_flag_contradicts_running",
        "unknown",
    )


def test_running_without_any_readiness_fact_is_undecided():
    """Probes unknown (no job spec), no ready column, no stop marker: nothing proves either."""
    assert health([job()]) == (None, "unknown")


def test_a_failing_probe_outranks_the_sticky_ready_flag():
    """jobs.ready is never reset (reference 6.4): a probe below ready_after at the stop wins."""
    proof, verdict = health(
        [job(ready=True, probe_count=1, probe_rows=1, probes_below_ready_after=1)]
    )
    assert (proof, verdict) == ("probe_failing", "not_healthy")
