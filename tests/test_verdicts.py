"""Verdicts on incidents the captures do not show (issue 13), each built from a capture's real
rows or lines with only what the class needs changed, and audited from every source kind
where it applies: database, table exports, each log format, database + log."""

from __future__ import annotations

import csv
import json
import re
import sqlite3
from pathlib import Path

import pytest
from conftest import CAPTURES, execute
from test_own_cases import _snapshot_before

from analyzer import open_sources
from analyzer.synth import rich_fold

FORMATS = ("standard", "json", "rich")
SEED = CAPTURES / "v0.22.5" / "seed"
CRASH = CAPTURES / "v0.22.5" / "multi-replica-crash"
SEED_VICTIM = "699fe818-acc2-4e08-b121-d16ed8fd32f1"
SEED_CULPRIT = "3c73cf"


def export_tables(db: Path, folder: Path) -> Path:
    """The database's tables as `sqlite3 -csv -header` writes them (NULL as an empty field)."""
    folder.mkdir()
    with sqlite3.connect(db) as connection:
        names = [
            n for (n,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")
        ]
        for name in names:
            cursor = connection.execute(f'SELECT * FROM "{name}"')
            with (folder / f"{name}.csv").open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow([c[0] for c in cursor.description])
                writer.writerows(["" if v is None else v for v in row] for row in cursor)
    return folder


def cut_log(source: Path, target: Path, marker: str) -> Path:
    """The log as it was when the line holding `marker` was about to be written (a rich
    record may span several physical lines: the cut is at the record's first line)."""
    lines = source.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if marker in line)
    while source.name.endswith(".rich.log") and not (
        lines[at].startswith("[") or (lines[at][:11].strip() == "" and lines[at][11:15] == "INFO")
    ):
        at -= 1
    target.write_text("".join(lines[:at]))
    return target


def _limitation_codes(finding) -> set[str]:
    return {lim.code for lim in finding.limitations}


# 1. A cascade caught in flight -------------------------------------------------------------


def _seed_mid_cascade(copy_db) -> Path:
    """The seed a few seconds after the run went TERMINATING: the culprit has failed, the
    healthy deployment-0 replica is still RUNNING and ready with no termination reason."""
    db = copy_db("v0.22.5/seed")
    _snapshot_before(db, "2026-11-02 09:09:20")
    execute(
        db,
        "UPDATE runs SET status = 'TERMINATING'",
        """UPDATE jobs SET status = 'RUNNING', termination_reason = NULL,
           graceful_termination_attempts = NULL, remove_at = NULL WHERE job_name = 'web-0-0'""",
    )
    return db


def _check_in_flight(report, *, victim_prefix: str = SEED_VICTIM) -> None:
    (verdict,) = report.runs
    assert verdict.verdict == "collateral_termination"
    assert verdict.in_progress is True
    assert "not yet stopped" in verdict.why and "killed" not in verdict.why
    (finding,) = report.findings
    assert finding.category == "collateral_termination"
    assert finding.confidence == "suspected"
    (victim,) = finding.victims
    assert victim.job_id.startswith(victim_prefix)
    assert victim.stopped is False
    assert victim.expected_termination_reason == "terminated_by_server"
    assert victim.terminated_at is None
    (culprit,) = finding.culprits
    assert culprit.job_id.startswith(SEED_CULPRIT)
    assert culprit.termination_reason == "failed_to_start_due_to_no_capacity"
    assert "copy_taken_mid_cascade" in _limitation_codes(finding)
    (mid,) = [lim for lim in finding.limitations if lim.code == "copy_taken_mid_cascade"]
    assert "mid-cascade" in mid.message and "process_terminating_run" in mid.message
    assert any(lim.code == "copy_taken_mid_cascade" for lim in report.limitations)
    # the outage has not begun in the evidence: unknown, never 0
    assert finding.impact.outage_start is None
    assert finding.impact.outage_seconds is None
    assert report.summary.outage_seconds is None
    assert report.summary.outage_unknown_runs == 1


def test_in_flight_cascade_from_the_database(copy_db):
    _check_in_flight(open_sources([_seed_mid_cascade(copy_db)]).report)


def test_in_flight_cascade_from_table_exports(copy_db, tmp_path):
    tables = export_tables(_seed_mid_cascade(copy_db), tmp_path / "tables")
    _check_in_flight(open_sources([tables]).report)


@pytest.mark.parametrize("fmt", FORMATS)
def test_in_flight_cascade_from_a_log_cut_at_the_same_moment(tmp_path, fmt):
    log = cut_log(
        SEED / "logs" / f"server-info.{fmt}.log",
        tmp_path / f"server.{fmt}.log",
        "TERMINATED_BY_SERVER",
    )
    _check_in_flight(open_sources([log]).report, victim_prefix=SEED_VICTIM[:6])


def test_in_flight_cascade_from_database_and_log(copy_db, tmp_path):
    log = cut_log(
        SEED / "logs" / "server-info.standard.log", tmp_path / "server.log", "TERMINATED_BY_SERVER"
    )
    report = open_sources([_seed_mid_cascade(copy_db), log]).report
    _check_in_flight(report)
    (finding,) = report.findings
    culprit_items = [e for e in finding.evidence if "Fleet is at capacity" in e.text]
    assert culprit_items and all(
        "events:" in e.source and ".log:" in e.source for e in culprit_items
    )


def test_in_flight_replica_still_pulling_is_not_a_victim(copy_db):
    db = _seed_mid_cascade(copy_db)
    execute(db, "UPDATE jobs SET status = 'PULLING', ready = 0 WHERE job_name = 'web-0-0'")
    report = open_sources([db]).report
    assert report.findings == []
    (verdict,) = report.runs
    assert verdict.verdict == "no_healthy_victim"
    assert "still pulling" in verdict.why


# 2. Newer-deployment collateral ------------------------------------------------------------

CRASH_OLD = "3b210678bed34948ad993e49c8bb9b7b"  # svc-0-0, deployment 0
CRASH_NEW = "ca8425e60d1b453f861e7430adf44908"  # svc-0-3, deployment 1


def _old_replica_crashes_during_rollout(copy_db, *, siblings_scaled_down: bool) -> Path:
    """multi-replica-crash with the roles swapped: during the rollout the deployment-0 replica
    svc-0-0 exits 2 on its own; the run fails; the healthy deployment-1 replica svc-0-3 (ready,
    probe passing) is stopped by the cascade. Events are re-targeted alike."""
    db = copy_db("v0.22.5/multi-replica-crash")
    old_events = (
        "SELECT e.id FROM events e JOIN event_targets t ON t.event_id = e.id "
        f"WHERE t.entity_id = '{CRASH_OLD}' AND e.recorded_at >= '2026-11-04 10:39:24'"
    )
    new_events = (
        "SELECT e.id FROM events e JOIN event_targets t ON t.event_id = e.id "
        f"WHERE t.entity_id = '{CRASH_NEW}' AND e.recorded_at >= '2026-11-04 10:39:14'"
    )
    with sqlite3.connect(db) as connection:
        connection.execute(f"CREATE TEMP TABLE to_new AS {old_events}")
        connection.execute(f"CREATE TEMP TABLE to_old AS {new_events}")
        connection.execute(
            "UPDATE event_targets SET entity_id = ?, entity_name = 'svc-0-3' "
            "WHERE event_id IN (SELECT id FROM to_new) AND entity_type = 'JOB'",
            (CRASH_NEW,),
        )
        connection.execute(
            "UPDATE event_targets SET entity_id = ?, entity_name = 'svc-0-0' "
            "WHERE event_id IN (SELECT id FROM to_old) AND entity_type = 'JOB'",
            (CRASH_OLD,),
        )
        connection.execute(
            "UPDATE jobs SET status = 'FAILED', termination_reason = "
            "'CONTAINER_EXITED_WITH_ERROR', exit_status = 2, graceful_termination_attempts = NULL "
            "WHERE id = ?",
            (CRASH_OLD,),
        )
        connection.execute(
            "UPDATE jobs SET status = 'TERMINATED', termination_reason = 'TERMINATED_BY_SERVER', "
            "exit_status = NULL, ready = 1, graceful_termination_attempts = 1 WHERE id = ?",
            (CRASH_NEW,),
        )
        connection.execute("UPDATE probes SET success_streak = 38 WHERE job_id = ?", (CRASH_NEW,))
        if siblings_scaled_down:
            connection.execute(
                "UPDATE jobs SET termination_reason = 'SCALED_DOWN', graceful_termination_attempts "
                "= NULL WHERE job_name IN ('svc-0-1', 'svc-0-2')"
            )
            connection.execute(
                "UPDATE events SET message = replace(message, 'TERMINATED_BY_SERVER', "
                "'SCALED_DOWN') WHERE id IN (SELECT event_id FROM event_targets "
                "WHERE entity_name IN ('svc-0-1', 'svc-0-2'))"
            )
    return db


def _check_newer(report) -> None:
    (verdict,) = report.runs
    assert verdict.verdict == "newer_deployment_collateral"
    assert "no healthy replica" not in verdict.why
    (finding,) = report.findings
    assert finding.category == "newer_deployment_collateral"
    assert finding.confidence == "confirmed"
    assert [(v.job_id.replace("-", ""), v.deployment_num) for v in finding.victims] == [
        (CRASH_NEW, 1)
    ]
    assert [(c.job_id.replace("-", ""), c.deployment_num) for c in finding.culprits] == [
        (CRASH_OLD, 0)
    ]
    assert finding.culprits[0].termination_reason == "container_exited_with_error"
    assert finding.update_deployment_num == 1
    assert finding.changed_fields == "configuration.commands"
    assert finding.impact.replicas_lost == 1
    assert finding.impact.outage_seconds > 0


def test_newer_deployment_victim_from_the_database(copy_db):
    _check_newer(
        open_sources(
            [_old_replica_crashes_during_rollout(copy_db, siblings_scaled_down=True)]
        ).report
    )


def test_newer_deployment_victim_from_table_exports(copy_db, tmp_path):
    db = _old_replica_crashes_during_rollout(copy_db, siblings_scaled_down=True)
    _check_newer(open_sources([export_tables(db, tmp_path / "tables")]).report)


def test_newer_and_same_deployment_victims_are_never_mixed(copy_db):
    """The old replica's crash also kills its healthy siblings (#2660): two findings, one per
    category, and the run's outage counted once in the totals."""
    db = _old_replica_crashes_during_rollout(copy_db, siblings_scaled_down=False)
    report = open_sources([db]).report
    (verdict,) = report.runs
    assert verdict.verdict == "same_deployment_collateral"
    by_category = {f.category: f for f in report.findings}
    assert set(by_category) == {"same_deployment_collateral", "newer_deployment_collateral"}
    same = by_category["same_deployment_collateral"]
    newer = by_category["newer_deployment_collateral"]
    assert sorted(v.job_name for v in same.victims) == ["svc-0-1", "svc-0-2"]
    assert [v.job_name for v in newer.victims] == ["svc-0-3"]
    assert (
        {c.job_name for c in same.culprits} == {c.job_name for c in newer.culprits} == {"svc-0-0"}
    )
    for finding, other in ((same, newer), (newer, same)):
        for job in finding.also_stopped:
            if job.job_name in {v.job_name for v in other.victims}:
                assert other.category in job.why_not_victim
    # one outage per run: both findings carry the run's outage, the totals count it once
    assert same.impact.outage_seconds == newer.impact.outage_seconds
    assert report.summary.outage_seconds == pytest.approx(same.impact.outage_seconds)
    lost = same.impact.healthy_replica_seconds_lost + newer.impact.healthy_replica_seconds_lost
    assert report.summary.healthy_replica_seconds_lost == pytest.approx(lost)
    (server,) = report.summary.by_server
    assert server.outage_seconds == pytest.approx(same.impact.outage_seconds)


# 3. Confidence from logs alone ---------------------------------------------------------------

STANDARD = re.compile(r"^(\w+) (\S+)T(\S+)\.(\d{3}) (\S+) (.*)$")


def from_standard(text: str, fmt: str) -> str:
    """Standard-format lines rewritten in the json or rich layout (rich at 120 columns)."""
    if fmt == "standard":
        return text
    out: list[str] = []
    last = None
    for line in text.splitlines():
        match = STANDARD.match(line)
        if match is None:
            continue
        level, day, clock, millis, logger, message = match.groups()
        if fmt == "json":
            record = {
                "timestamp": f"{day} {clock},{millis}",
                "logger": logger,
                "level": level,
                "message": message,
            }
            out.append(json.dumps(record))
            continue
        stamp = f"[{clock}]"
        shown = " " * 10 if stamp == last else stamp
        last = stamp
        for i, piece in enumerate(rich_fold(f"{logger}:1 {message}", 100)):
            head = f"{shown} {level:<8} " if i == 0 else " " * 20
            out.append((head + piece).ljust(120))
    return "\n".join(out) + "\n"


def _reused_slot_log(fmt: str, tmp_path: Path) -> Path:
    """The 0.19 seed log where replica slot 1 ran earlier (scaled up, then down) and the
    rollout re-runs it: the failing surge replica reuses the job name web-0-1 (new id)."""
    text = (CAPTURES / "v0.19" / "seed" / "logs" / "server-info.standard.log").read_text()
    logger = "dstack._internal.server"
    earlier = "".join(
        f"INFO 2026-11-02T{clock} {logger}.{line}\n"
        for clock, line in (
            ("09:04:04.143", "services.runs run(686b0f)web: scaling UP 1 replica(s)"),
            (
                "09:04:40.000",
                "background.tasks.process_running_jobs job(7a7a7a)web-0-1: now is PULLING",
            ),
            (
                "09:05:01.000",
                "services.services job(7a7a7a)web-0-1: service replica registered to receive "
                "requests, gateway=False",
            ),
            ("09:06:04.143", "services.runs run(686b0f)web: scaling DOWN 1 replica(s)"),
            (
                "09:06:10.000",
                "services.jobs job(7a7a7a)web-0-1: job status is TERMINATED, reason: SCALED_DOWN",
            ),
        )
    )
    at = text.index("INFO 2026-11-02T09:09:02.820")
    log = tmp_path / f"server.{fmt}.log"
    log.write_text(from_standard(text[:at] + earlier + text[at:], fmt))
    return log


@pytest.mark.parametrize("fmt", FORMATS)
def test_019_log_reused_job_name_still_finds_the_new_submission_as_culprit(tmp_path, fmt):
    report = open_sources([_reused_slot_log(fmt, tmp_path)]).report
    (verdict,) = report.runs
    assert verdict.verdict == "collateral_termination", verdict.why
    (finding,) = report.findings
    assert finding.confidence == "suspected"
    (culprit,) = finding.culprits
    assert (culprit.job_id, culprit.job_name, culprit.submission_num) == ("1ded4f", "web-0-1", 1)
    assert culprit.termination_reason == "failed_to_start_due_to_no_capacity"
    assert [(v.job_id, v.job_name) for v in finding.victims] == [("4da89b", "web-0-0")]


def _groups_update_log(fmt: str, tmp_path: Path) -> Path:
    text = (SEED / "logs" / "server-info.standard.log").read_text()
    log = tmp_path / f"server.{fmt}.log"
    log.write_text(
        from_standard(text.replace("configuration.commands", "configuration.groups"), fmt)
    )
    return log


@pytest.mark.parametrize("fmt", FORMATS)
def test_groups_only_update_from_a_log_alone_is_suspected(tmp_path, fmt):
    report = open_sources([_groups_update_log(fmt, tmp_path)]).report
    (finding,) = report.findings
    assert finding.confidence == "suspected"
    assert [v.job_id for v in finding.victims] == [SEED_VICTIM[:6]]
    assert [c.job_id for c in finding.culprits] == [SEED_CULPRIT]
    (limitation,) = finding.limitations
    assert limitation.code == "deployment_not_provable_from_logs"
    assert "configuration.groups" in limitation.message and "web-0-0" in limitation.message
    assert limitation in report.limitations


def test_groups_only_update_with_the_database_is_decided(copy_db, tmp_path):
    db = copy_db("v0.22.5/seed")
    execute(
        db,
        "UPDATE events SET message = replace(message, 'configuration.commands', "
        "'configuration.groups')",
    )
    report = open_sources([db, _groups_update_log("standard", tmp_path)]).report
    (finding,) = report.findings
    assert finding.category == "collateral_termination"
    assert finding.confidence == "confirmed"
    assert finding.limitations == []
    assert [v.job_id for v in finding.victims] == [SEED_VICTIM]


@pytest.mark.parametrize("fmt", FORMATS)
def test_readiness_line_of_a_service_with_probes_proves_no_health_at_the_kill(fmt):
    report = open_sources([CRASH / "logs" / f"server-info.{fmt}.log"]).report
    (finding,) = report.findings
    assert finding.category == "collateral_termination"
    assert finding.confidence == "suspected"
    assert len(finding.victims) == 3
    (limitation,) = finding.limitations
    assert limitation.code == "health_not_provable_from_logs"
    assert "probe" in limitation.message
    assert finding.impact.replicas_lost == 3


@pytest.mark.parametrize("fmt", FORMATS)
def test_readiness_at_running_proves_a_probeless_replica_healthy(fmt):
    """The seed's service has no probes: the log shows it ready in the pass that made it
    RUNNING, which is proof enough."""
    (finding,) = open_sources([SEED / "logs" / f"server-info.{fmt}.log"]).report.findings
    assert finding.confidence == "confirmed"
    assert finding.limitations == []
