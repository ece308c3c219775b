"""Cases the captures lack, built from copies of real capture databases (real rows, real
formats; only the combination or the moment of the snapshot is changed)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import CAPTURES, execute, without_update

from analyzer import open_sources

MERGED_TABLES = (
    "users",
    "projects",
    "repos",
    "fleets",
    "instances",
    "runs",
    "jobs",
    "probes",
    "events",
    "event_targets",
)


def merge(target: Path, *captures: str) -> None:
    """Copy every run of other v0.22.5 captures into target (INSERT OR IGNORE keeps the first
    of clashing unique names, e.g. the 'admin' user and 'main' project each capture has)."""
    with sqlite3.connect(target) as db:
        for number, capture in enumerate(captures):
            db.execute(f"ATTACH DATABASE ? AS c{number}", (str(CAPTURES / capture / "server.db"),))
            for table in MERGED_TABLES:
                db.execute(f"INSERT OR IGNORE INTO {table} SELECT * FROM c{number}.{table}")
            db.commit()
            db.execute(f"DETACH DATABASE c{number}")


def test_same_run_name_in_three_projects(copy_db, tmp_path):
    db = copy_db("v0.22.5/seed")
    merge(db, "v0.22.5/old-replica-fails", "v0.22.5/in-place-bump")
    audit = open_sources([db])
    verdicts = {(v.project, v.run_name): v.verdict for v in audit.report.runs}
    assert verdicts == {
        ("acme", "web"): "collateral_termination",
        ("hooli", "web"): "no_healthy_victim",
        ("cyberdyne", "web"): "no_incident",
    }
    (finding,) = audit.report.findings
    assert finding.project == "acme"
    assert [v.job_name for v in finding.victims] == ["web-0-0"]
    # the jobs of the three runs share names (web-0-0) but never mix
    assert audit.submissions.filter(audit.submissions["job_name"] == "web-0-0").height == 3
    hooli = open_sources([db], project="hooli").report
    assert hooli.summary.runs == 1
    # --project is pushed down into the SQLite reads: only hooli's rows are read
    assert hooli.inputs[0].records < audit.report.inputs[0].records


def test_run_resubmitted_under_the_same_name(copy_db):
    """A new run row with the same name in the same project (the old one marked deleted), as
    dstack writes it when a run is re-submitted: the incident stays with the old run id."""
    db = copy_db("v0.22.5/seed")
    new_run = "0f0f0f0f0f0f4f0f8f0f0f0f0f0f0f0f"
    new_job = "1e1e1e1e1e1e4e1e8e1e1e1e1e1e1e1e"
    execute(
        db,
        "UPDATE runs SET deleted = 1",
        f"""INSERT INTO runs SELECT '{new_run}', project_id, repo_id, user_id,
            '2026-11-02 10:00:00.000000', run_name, 'RUNNING', run_spec, 0,
            '2026-11-02 10:05:00.000000', gateway_id, NULL, service_spec, fleet_id,
            resubmission_attempt, priority, 0, desired_replica_count, next_triggered_at,
            desired_replica_counts, lock_expires_at, lock_token, lock_owner,
            skip_min_processing_interval FROM runs WHERE id != '{new_run}'""",
        f"""INSERT INTO jobs SELECT '{new_job}', project_id, '{new_run}', run_name, job_num,
            job_name,
            0, '2026-11-02 10:00:00.000000', '2026-11-02 10:05:00.000000', 'RUNNING', NULL,
            job_spec_data, job_provisioning_data, runner_timestamp, NULL, used_instance_id,
            replica_num, NULL, instance_assigned, job_runtime_data, volumes_detached_at,
            instance_id, inactivity_secs, NULL, disconnected_at, 0, 1, fleet_id,
            waiting_master_job, lock_expires_at, lock_token, lock_owner, NULL,
            image_pull_progress, skip_min_processing_interval, 1, NULL
            FROM jobs WHERE job_name = 'web-0-0'""",
    )
    report = open_sources([db]).report
    by_id = {v.run_id.replace("-", ""): v for v in report.runs}
    assert by_id[new_run].verdict == "no_incident"
    (finding,) = report.findings
    assert finding.run_id == "6e42c918-3c60-472e-bb0c-51610650d517"
    assert {v.job_id for v in finding.victims} == {"699fe818-acc2-4e08-b121-d16ed8fd32f1"}


def _snapshot_before(db: Path, moment: str) -> None:
    """Turn a copy of the seed into the database as it was just before `moment`: later events
    gone, the run and its old replica in the state the earlier events show."""
    execute(
        db,
        "DELETE FROM event_targets WHERE event_id IN "
        f"(SELECT id FROM events WHERE recorded_at >= '{moment}')",
        f"DELETE FROM events WHERE recorded_at >= '{moment}'",
    )


def test_snapshot_mid_cascade_victim_terminating(copy_db):
    db = copy_db("v0.22.5/seed")
    _snapshot_before(db, "2026-11-02 09:09:23")
    execute(
        db,
        "UPDATE runs SET status = 'TERMINATING'",
        "UPDATE jobs SET status = 'TERMINATING' WHERE job_name = 'web-0-0'",
    )
    report = open_sources([db]).report
    (finding,) = report.findings
    assert finding.category == "collateral_termination"
    assert any("mid-cascade" in note for note in finding.notes)
    assert report.runs[0].verdict == "collateral_termination"


def test_old_replica_failing_probe_is_not_a_victim(copy_db):
    """ready is sticky: a probe streak below ready_after at the stop is evidence against health."""
    db = copy_db("v0.22.5/multi-replica-crash")
    execute(
        db,
        "UPDATE probes SET success_streak = 0 WHERE job_id = "
        "(SELECT id FROM jobs WHERE job_name = 'svc-0-1')",
    )
    report = open_sources([db]).report
    (finding,) = report.findings
    assert sorted(v.job_name for v in finding.victims) == ["svc-0-0", "svc-0-2"]
    assert any(
        o.job_name == "svc-0-1" and "not healthy" in o.why_not_victim for o in finding.also_stopped
    )


def test_sibling_crash_without_update_is_same_deployment(copy_db):
    """No update: one replica crashes, the run fails, its healthy siblings are killed (#2660)."""
    db = without_update(copy_db("v0.22.5/multi-replica-crash"))
    report = open_sources([db]).report
    assert {f.category for f in report.findings} == {"same_deployment_collateral"}
    assert report.summary.victims == 3


@pytest.mark.parametrize("reason", ["SERVER_ERROR", "GATEWAY_ERROR"])
def test_other_run_failures_are_not_incidents(copy_db, reason):
    db = copy_db("v0.22.5/seed")
    execute(db, f"UPDATE runs SET termination_reason = '{reason}'")
    report = open_sources([db]).report
    assert report.findings == []
    assert report.runs[0].verdict == "no_incident"


def test_events_past_their_ttl_are_said_and_tables_still_decide(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(
        db,
        "DELETE FROM event_targets WHERE event_id IN (SELECT event_id FROM event_targets "
        "WHERE entity_name LIKE 'web%')",
        "DELETE FROM events WHERE id NOT IN (SELECT event_id FROM event_targets)",
    )
    report = open_sources([db]).report
    (verdict,) = report.runs
    assert verdict.verdict == "collateral_termination"
    assert any("past the events TTL" in gap for gap in verdict.gaps)


def test_culprit_row_deleted_while_its_events_remain(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(db, "DELETE FROM jobs WHERE job_name = 'web-0-1'")
    report = open_sources([db]).report
    (verdict,) = report.runs
    assert verdict.verdict == "inconclusive"
    assert report.findings == []
    assert any("appear only in events" in gap and "3c73cf0e" in gap for gap in verdict.gaps)


def test_log_that_starts_after_the_replicas_were_ready(tmp_path):
    lines = (CAPTURES / "v0.22.5" / "seed" / "logs" / "server-info.standard.log").read_text()
    tail = lines[lines.index("INFO 2026-11-02T09:08:50") :]
    log = tmp_path / "server.log"
    log.write_text(tail)
    report = open_sources([log]).report
    (verdict,) = report.runs
    assert verdict.verdict == "inconclusive"
    assert "health cannot be decided" in verdict.why
    assert any("log starts after this run was submitted" in gap for gap in verdict.gaps)
