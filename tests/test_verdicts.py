"""Verdicts on incidents the captures do not show (issue 13), each built from a capture's real
rows or lines with only what the class needs changed, and audited from every source kind
where it applies: database, table exports, each log format, database + log."""

from __future__ import annotations

import csv
import json
import re
import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CAPTURES, execute
from test_own_cases import _snapshot_before

from analyzer import open_sources
from analyzer.cli import main
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
    assert verdict.why.startswith("the run is failing (job_failed: web-0-1")
    assert "hit but not victims: web-0-0: still pulling" in verdict.why


# 2. Newer-deployment collateral ------------------------------------------------------------

CRASH_OLD = "3b210678bed34948ad993e49c8bb9b7b"  # svc-0-0, deployment 0
CRASH_NEW = "ca8425e60d1b453f861e7430adf44908"  # svc-0-3, deployment 1


def _old_replica_crashes_during_rollout(copy_db, *, siblings_scaled_down: bool) -> Path:
    """multi-replica-crash with the roles swapped: during the rollout the deployment-0 replica
    svc-0-0 exits 2 on its own; the run fails; the healthy deployment-1 replica svc-0-3 (ready,
    probe passing) is stopped by the cascade. Events are re-targeted alike, and svc-0-3 gets
    the readiness event dstack writes when it sets jobs.ready (svc-0-0's, re-dated 10 s
    before the crash, as in the log case)."""
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
        ready = "(SELECT event_id FROM event_targets WHERE entity_name = 'svc-0-0') AND " + (
            "message LIKE 'Service replica ready%'"
        )
        connection.execute(
            "INSERT INTO events SELECT 'eeeeeeeeeeee4eee8eeeeeeeeeeeeeee', message, "
            f"'2026-11-04 10:39:04.000000', actor_user_id FROM events WHERE id IN {ready}"
        )
        connection.execute(
            "INSERT INTO event_targets SELECT 'ffffffffffff4fff8fffffffffffffff', "
            "'eeeeeeeeeeee4eee8eeeeeeeeeeeeeee', entity_project_id, entity_type, ?, 'svc-0-3', "
            "entity_run_id, entity_fleet_id, entity_gateway_id FROM event_targets "
            f"WHERE event_id IN (SELECT id FROM events WHERE id IN {ready})",
            (CRASH_NEW,),
        )
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


# 5. Outages that hold ------------------------------------------------------------------------


def _alive_until(db: Path) -> datetime:
    """By hand: the latest time any of the seed's tables records (instances and fleets are
    processed for minutes after the run ended)."""
    with sqlite3.connect(db) as connection:
        values = [
            connection.execute(f"SELECT max({column}) FROM {table}").fetchone()[0]
            for table, column in (
                ("runs", "last_processed_at"),
                ("jobs", "last_processed_at"),
                ("events", "recorded_at"),
                ("instances", "last_processed_at"),
                ("fleets", "last_processed_at"),
            )
        ]
    return max(datetime.fromisoformat(v).replace(tzinfo=UTC) for v in values if v)


@pytest.mark.parametrize("form", ["server.db", "tables", ""])
def test_end_of_evidence_is_the_last_moment_any_table_shows_the_server_alive(form):
    report = open_sources([SEED / form] if form else [SEED]).report
    end = _alive_until(SEED / "server.db")
    assert report.end_of_evidence == end
    (finding,) = report.findings
    impact = finding.impact
    assert impact.end_of_evidence == end
    # the server ran ~3 more minutes after the run's last event: the honest lower bound
    assert impact.outage_seconds == pytest.approx((end - impact.outage_start).total_seconds())
    assert impact.outage_seconds > 170
    assert impact.outage_is_lower_bound is True
    (bound,) = [lim for lim in report.limitations if lim.code == "end_of_evidence_lower_bound"]
    assert "lower bound" in bound.message and end.isoformat() in bound.message


def _with_trailing_line(tmp_path: Path, hours: int = 0) -> Path:
    """The seed's standard log with one later line of instance processing, as the server
    writes it minutes after the run ended; optionally in another local time zone."""
    text = (SEED / "logs" / "server-info.standard.log").read_text()
    text += (
        "INFO 2026-11-02T09:12:17.000 dstack._internal.server.background.pipeline_tasks.fleets "
        "Added 1 instances to fleet cpu-fleet\n"
    )

    def shift(match: re.Match) -> str:
        moment = datetime.fromisoformat(match.group(1)) + timedelta(hours=hours)
        return moment.isoformat(timespec="milliseconds")

    log = tmp_path / "server.log"
    log.write_text(re.sub(r"(?<=^INFO )(\S+)", shift, text, flags=re.M))
    return log


def test_end_of_evidence_reaches_the_last_log_line(tmp_path):
    report = open_sources([_with_trailing_line(tmp_path)]).report
    assert report.end_of_evidence == datetime(2026, 11, 2, 9, 12, 17, tzinfo=UTC)
    (finding,) = report.findings
    assert finding.impact.end_of_evidence == report.end_of_evidence
    # the log writes milliseconds: the outage is counted from the end of the stop's millisecond
    counted_from = finding.impact.outage_start + timedelta(milliseconds=1)
    assert finding.impact.outage_seconds == pytest.approx(
        (report.end_of_evidence - counted_from).total_seconds()
    )
    assert "recorded to the millisecond only" in finding.impact.lower_bound_reasons[1]


def test_last_log_line_is_aligned_like_the_rest_of_its_log(copy_db, tmp_path):
    """A log two hours ahead of UTC: its trailing line is shifted with the log's offset, so
    the end of the evidence is the database's (later) instance time, not a local time."""
    db = copy_db("v0.22.5/seed")
    report = open_sources([db, _with_trailing_line(tmp_path, hours=2)]).report
    assert report.end_of_evidence == _alive_until(db)


def test_rich_log_alone_has_no_date_and_no_invented_outage():
    report = open_sources([SEED / "logs" / "server-info.rich.log"]).report
    assert report.end_of_evidence is None
    (finding,) = report.findings
    assert finding.impact.end_of_evidence is None
    assert finding.impact.outage_seconds is None
    assert report.summary.outage_seconds is None
    assert report.summary.outage_unknown_runs == 1
    assert report.summary.healthy_replica_seconds_lost is None
    assert finding.impact.healthy_replica_seconds_lost is None
    assert "1970" not in report.model_dump_json()


# The timeline states the facts an operator needs --------------------------------------------


def _timeline(*args: str) -> str:
    result = CliRunner().invoke(main, ["timeline", *args])
    assert result.exit_code == 0, result.output
    return result.output


def _slot(out: str, job_name: str) -> str:
    """A submission's line of the timeline with its continuation lines (fitted to the width),
    unfolded into one."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{job_name} "))
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if len(line) - len(line.lstrip()) <= indent + 2:
            break
        block.append(line.strip())
    return " ".join(block)


def test_timeline_marks_bumps_groups_victims_and_culprits():
    out = _timeline("web", str(CAPTURES / "v0.22.5" / "scale-up-fails" / "server.db"))
    victim = _slot(out, "web-0-0")
    assert "created in deployment 0, bumped in place to 1" in victim
    assert "group 0" in victim
    assert "** VICTIM (same_deployment_collateral) **" in victim
    culprit = _slot(out, "web-0-1")
    assert "** CULPRIT (same_deployment_collateral) **" in culprit
    assert "deployment 1" in culprit and "bumped" not in culprit


def test_timeline_marks_a_victim_not_yet_stopped(copy_db):
    out = " ".join(_timeline("web", str(_seed_mid_cascade(copy_db))).split())  # lines unfolded
    assert "VICTIM (collateral_termination), not yet stopped: expected terminated_by_server" in out


def test_timeline_states_a_run_deleted_by_a_resubmission(copy_db):
    """dstack marks the replaced run's row deleted and records the user's 'Run deleted'
    event (a copy of the run's real 'Run updated' event, re-worded)."""
    db = copy_db("v0.22.5/seed")
    execute(
        db,
        "UPDATE runs SET deleted = 1",
        """INSERT INTO events (id, message, recorded_at, actor_user_id)
           SELECT 'aaaaaaaaaaaa4aaa8aaaaaaaaaaaaaaa', 'Run deleted', '2026-11-02 09:10:00.000000',
                  actor_user_id FROM events WHERE message LIKE 'Run updated%'""",
        """INSERT INTO event_targets (id, event_id, entity_project_id, entity_type, entity_id,
                                      entity_name)
           SELECT 'bbbbbbbbbbbb4bbb8bbbbbbbbbbbbbbb', 'aaaaaaaaaaaa4aaa8aaaaaaaaaaaaaaa',
                  entity_project_id, entity_type, entity_id, entity_name FROM event_targets
           WHERE event_id = (SELECT id FROM events WHERE message LIKE 'Run updated%')""",
    )
    out = _timeline("web", str(db))
    deleted = _slot(out, "deleted:")
    assert "marked deleted" in deleted
    assert "'Run deleted' 2026-11-02 09:10:00Z by user alice" in deleted


# 4. One server per database, one record per fact ----------------------------------------------


def _by_server(report) -> dict[str, object]:
    return {f.server: f for f in report.findings}


def _check_two_servers(report) -> None:
    seed_end = _alive_until(SEED / "server.db")
    crash_end = _alive_until(CRASH / "server.db")
    findings = _by_server(report)
    assert set(findings) == {"seed/server.db", "multi-replica-crash/server.db"}
    seed, crash = findings["seed/server.db"], findings["multi-replica-crash/server.db"]
    assert seed.impact.end_of_evidence == seed_end
    assert crash.impact.end_of_evidence == crash_end
    assert seed.impact.outage_seconds == pytest.approx(
        (seed_end - seed.impact.outage_start).total_seconds()
    )
    assert seed.impact.outage_seconds < 200  # never the other server's days
    assert crash.impact.outage_seconds < 200
    assert {g.key for g in report.summary.by_server} == set(findings)
    assert report.summary.outage_seconds == pytest.approx(
        seed.impact.outage_seconds + crash.impact.outage_seconds
    )
    assert {v.server for v in report.runs} == set(findings)
    assert report.end_of_evidence == max(seed_end, crash_end)


def test_a_folder_of_capture_folders_is_one_server_per_database(tmp_path):
    folder = tmp_path / "captures"
    folder.mkdir()
    for capture in (SEED, CRASH):
        (folder / capture.name).symlink_to(capture, target_is_directory=True)
    report = open_sources([folder]).report
    _check_two_servers(report)
    # the logs, table exports and API exports of each capture joined their own database
    assert not any(lim.code == "log_matches_no_database" for lim in report.limitations)
    assert all(f.confidence == "confirmed" for f in report.findings)


def test_two_databases_at_once_are_two_servers():
    _check_two_servers(open_sources([SEED / "server.db", CRASH / "server.db"]).report)


def test_database_and_its_own_log_are_one_server():
    report = open_sources([SEED / "server.db", SEED / "logs" / "server-info.json.log"]).report
    (finding,) = report.findings
    assert finding.server == "default"
    assert [g.key for g in report.summary.by_server] == ["default"]


def test_a_log_that_agrees_with_no_database_is_a_server_of_its_own():
    log = CRASH / "logs" / "server-info.standard.log"
    report = open_sources([SEED / "server.db", log]).report
    findings = _by_server(report)
    assert set(findings) == {"server.db", "server-info.standard.log"}
    seed = findings["server.db"]
    assert seed.impact.end_of_evidence == _alive_until(SEED / "server.db")
    (alone,) = [lim for lim in report.limitations if lim.code == "log_matches_no_database"]
    assert alone.source == str(log) and "server of its own" in alone.message
    # the other server's log says nothing about this database's events table
    assert not any(lim.code.startswith("log_events_") for lim in report.limitations)


def test_server_label_stays_the_override():
    log = CRASH / "logs" / "server-info.standard.log"
    report = open_sources(
        [SEED / "server.db", log], server_labels={str(SEED / "server.db"): "prod", str(log): "prod"}
    ).report
    assert {f.server for f in report.findings} == {"prod"}


def test_a_log_newer_than_its_database_is_another_server_state(copy_db):
    """The seed's own log (0.21.1+ lines) beside its database stamped with a 0.20.16 schema."""
    db = copy_db("v0.22.5/seed")
    execute(db, "UPDATE alembic_version SET version_num = 'ad8c50120507'")
    log = SEED / "logs" / "server-info.standard.log"
    report = open_sources([db, log]).report
    (finding,) = report.findings
    assert finding.server == "default"
    (state,) = [lim for lim in report.limitations if lim.code == "log_from_different_server_state"]
    assert state.source == str(log)
    assert ">=0.21.1" in state.message and "0.20.16" in state.message


def test_deleted_submission_in_events_table_and_log_is_counted_once(copy_db):
    """dstack deletes superseded no-capacity submissions from jobs and keeps their events:
    with the log of the same server, each of their events is one fact with both provenances."""
    db = copy_db("v0.22.5/seed")
    execute(db, "DELETE FROM jobs WHERE job_name = 'web-0-1'")
    alone = open_sources([db]).report
    both = open_sources([db, SEED / "logs" / "server-info.standard.log"]).report
    (gap_alone,) = [g for g in alone.runs[0].gaps if "appear only in events" in g]
    (gap_both,) = [g for g in both.runs[0].gaps if "appear only in events" in g]
    assert gap_alone.startswith("1 job submission(s)") and gap_both == gap_alone
    assert not any(lim.code.startswith("log_events_") for lim in both.limitations)
    audit = open_sources([db, SEED / "logs" / "server-info.standard.log"])
    deleted = audit.events.filter(audit.events["entity_name"] == "web-0-1")
    assert deleted.height == 3
    for provenance in deleted["provenance"].to_list():
        assert any(p.startswith("events:") for p in provenance)
        assert any(".log:" in p for p in provenance)


def test_ttl_claim_only_for_lines_older_than_the_events_table(copy_db):
    db = copy_db("v0.22.5/seed")
    _snapshot_before(db, "2026-11-02 09:20:00")  # nothing removed: the table holds every event
    execute(
        db,
        "DELETE FROM event_targets WHERE event_id IN "
        "(SELECT id FROM events WHERE recorded_at < '2026-11-02 09:01:00')",
        "DELETE FROM events WHERE recorded_at < '2026-11-02 09:01:00'",
    )
    report = open_sources([db, SEED / "logs" / "server-info.standard.log"]).report
    (ttl,) = [lim for lim in report.limitations if lim.code == "log_events_past_events_ttl"]
    assert "TTL" in ttl.message
    assert not any(lim.code == "log_events_missing_from_database" for lim in report.limitations)


def _old_replica_crashes_log(fmt: str, tmp_path: Path) -> Path:
    """multi-replica-crash's log with the roles swapped as in the database case: from the
    crash on, svc-0-0's and svc-0-3's lines trade targets; svc-0-3 is ready 10 s before."""
    lines = (CRASH / "logs" / "server-info.standard.log").read_text().splitlines(keepends=True)
    old, new = "job(3b2106)svc-0-0", "job(ca8425)svc-0-3"
    out = []
    for line in lines:
        moment = line[5:28]
        if moment >= "2026-11-04T10:39:14.469" and (old in line or new in line):
            line = line.replace(old, "\0").replace(new, old).replace("\0", new)
        if moment == "2026-11-04T10:39:14.469" and not any("10:39:04" in o for o in out):
            ready = next(x for x in lines if "ready to receive" in x and old in x)
            out.append(ready.replace("10:32:39.118", "10:39:04.000").replace(old, new))
        out.append(line)
    log = tmp_path / f"server.{fmt}.log"
    log.write_text(from_standard("".join(out), fmt))
    return log


@pytest.mark.parametrize("fmt", FORMATS)
def test_newer_and_same_deployment_victims_from_a_log_alone(tmp_path, fmt):
    report = open_sources([_old_replica_crashes_log(fmt, tmp_path)]).report
    (verdict,) = report.runs
    assert verdict.verdict == "same_deployment_collateral", verdict.why
    by_category = {f.category: f for f in report.findings}
    assert set(by_category) == {"same_deployment_collateral", "newer_deployment_collateral"}
    newer = by_category["newer_deployment_collateral"]
    assert [(v.job_id, v.deployment_num) for v in newer.victims] == [("ca8425", 1)]
    assert [(c.job_id, c.deployment_num) for c in newer.culprits] == [("3b2106", 0)]
    assert newer.culprits[0].termination_reason == "container_exited_with_error"
    same = by_category["same_deployment_collateral"]
    assert sorted(v.job_id for v in same.victims) == ["3a2bde", "dc2185"]
    # readiness lines of a service with probes: suspected from the log alone
    for finding in report.findings:
        assert finding.confidence == "suspected"
        assert {lim.code for lim in finding.limitations} == {"health_not_provable_from_logs"}
    assert report.summary.outage_seconds == pytest.approx(newer.impact.outage_seconds)


def test_a_copy_taken_mid_cascade_draws_no_stop_that_has_not_happened(copy_db, tmp_path_factory):
    """Issue 22 §1: the victim still RUNNING is drawn running to the end of the evidence, its
    stop only expected, in the swimlane, the narrative, the timeline and the HTML report."""
    from analyzer.render.narrative import narrative
    from analyzer.render.plots.layout import run_view

    db = _seed_mid_cascade(copy_db)
    audit = open_sources([db])
    (finding,) = audit.report.findings
    view = run_view(audit, finding.run_id, None)
    kinds = {m.kind: m for m in view.markers}
    assert "victim_stop" not in kinds
    pending = kinds["victim_pending"]
    assert pending.time == audit.end_of_evidence
    assert pending.text == (
        "healthy replica(s) web-0-0 still RUNNING when the evidence ends: not yet stopped, "
        "dstack's terminating pass will stop them with TERMINATED_BY_SERVER (expected)"
    )
    assert not any("stopped: TERMINATED" in m.text for m in view.markers)
    told = narrative(audit, finding)
    assert "stopped the healthy replica" not in told
    assert "doomed the healthy replica web-0-0, not yet stopped when the evidence ends" in told
    timeline = " ".join(_timeline("web", str(db)).split())
    assert "not yet stopped: expected terminated_by_server" in timeline
    html = tmp_path_factory.mktemp("out") / "report.html"
    result = CliRunner().invoke(main, ["report", str(db), "-o", str(html)])
    assert result.exit_code in (0, 1), result.output
    page = re.sub(r"<[^>]+>", " ", html.read_text())
    assert "stopped: TERMINATED_BY_SERVER" not in page
    assert "not yet stopped" in page


def test_a_stopped_victims_marker_says_the_reason_it_was_stopped_with():
    """stop-after-kill: the victim stopped by the cascade before the user's stop says
    TERMINATED_BY_SERVER, as its row does."""
    from analyzer.render.plots.layout import run_view

    audit = open_sources([CAPTURES / "v0.22.5" / "stop-after-kill" / "server.db"])
    (finding,) = audit.report.findings
    (marker,) = [
        m for m in run_view(audit, finding.run_id, None).markers if m.kind == "victim_stop"
    ]
    assert marker.text.endswith("stopped: TERMINATED_BY_SERVER")
