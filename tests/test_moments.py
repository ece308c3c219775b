"""Claims judged at their moment (issue 22 section 1): a user stop after the run failed keeps
the cascade, health is health at the failure, a re-submitted culprit's first failure is the
root cause. Each from the given captures and from cases built of their real rows and lines,
from every source where it applies: database, table exports, each log format, database + log,
API collection (tests/data/collected; tests/test_live_server.py makes it again live)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CAPTURES, DATA, execute
from test_verdicts import FORMATS, export_tables

from analyzer import open_sources

STOP = CAPTURES / "v0.22.5" / "stop-after-kill"
RETRY = CAPTURES / "v0.22.5" / "retry-on-error"
COLLECTED = DATA / "collected" / "v0.22.5"
STOP_VICTIM = "ebb9e8a8-cbd0-4aa7-b44c-46a4d7447134"
STOP_CULPRIT = "6dc66cf0-887c-41e4-a2dc-0465bbfb9b95"
RETRY_VICTIM = "799111c4-b2e8-4c54-90ba-d4d3e5c2dee6"
RETRY_CULPRIT = "10fcd863-191e-4792-ac5b-4f61ccc334fe"
RETRY_FIRST = "3581381e-702c-413f-82e7-1bea6e48bb85"


def _ids(jobs, short: bool) -> list[str]:
    return [j.job_id[:6] if short else j.job_id for j in jobs]


def _short(job_id: str, short: bool) -> str:
    return job_id.replace("-", "")[:6] if short else job_id


def _sources(capture: Path, tmp_path: Path, log_of=None) -> dict[str, list[Path]]:
    """Every source kind of a capture folder (or of a changed copy: `log_of(fmt)` gives the
    log of that format)."""
    logs = {
        fmt: log_of(fmt) if log_of else capture / "logs" / f"server-info.{fmt}.log"
        for fmt in FORMATS
    }
    return {
        "database": [capture / "server.db"],
        "tables": [capture / "tables"],
        **{f"log-{fmt}": [log] for fmt, log in logs.items()},
        "database+log": [capture / "server.db", logs["standard"]],
    }


# 1. A user stop after the run had failed ------------------------------------------------------


def _check_stopped_during_cascade(report, short: bool, *, victim_label: str, final: str | None):
    (verdict,) = report.runs
    assert verdict.verdict == "collateral_termination", verdict.why
    assert "then the user stopped the run during the cascade" in verdict.why
    (finding,) = report.findings
    assert finding.category == "collateral_termination"
    assert finding.confidence == "confirmed"
    assert _ids(finding.victims, short) == [_short(STOP_VICTIM, short)]
    assert _ids(finding.culprits, short) == [_short(STOP_CULPRIT, short)]
    assert finding.culprits[0].termination_reason == "failed_to_start_due_to_no_capacity"
    assert finding.culprits[0].earlier_failures == []
    assert finding.run_failure_reason == "job_failed"
    assert finding.run_termination_reason == (final or "job_failed")
    assert finding.root_cause.failure_class == "fleet_at_capacity"
    assert finding.root_cause.trigger_class is None
    (stop,) = finding.limitations
    assert stop.code == "run_stopped_during_cascade"
    assert "stop_runs()" in stop.message and "emits no event" in stop.message
    assert f"web-0-0 {victim_label}" in stop.message
    assert (
        f"ends with {(final or '').upper()}" in stop.message
        if final
        else (
            "ends with status TERMINATED, which dstack gives a run only for a user's stop or abort"
            in stop.message
        )
    )
    assert stop in report.limitations
    assert finding.impact.replicas_lost == 1


@pytest.mark.parametrize(
    "source", ["database", "tables", *[f"log-{f}" for f in FORMATS], "database+log"]
)
def test_stop_after_kill_capture_keeps_its_cascade(source, tmp_path):
    report = open_sources(_sources(STOP, tmp_path)[source]).report
    short = source.startswith("log-")
    _check_stopped_during_cascade(
        report,
        short,
        victim_label="kept TERMINATED_BY_SERVER",
        final=None if short else "stopped_by_user",
    )
    (stop,) = report.findings[0].limitations
    if source != "log-rich":  # dated: the stop is placed between the evidence's moments
        assert "at or after 2026-12-17T10:09:18.089" in stop.message
        assert "before 2026-12-17T10:09:25.410" in stop.message


def test_stop_after_kill_from_its_api_collection():
    report = open_sources([COLLECTED / "stop-after-kill"]).report
    _check_stopped_during_cascade(
        report, False, victim_label="kept TERMINATED_BY_SERVER", final="stopped_by_user"
    )


def _stop_reaches_victim_db(copy_db) -> Path:
    """stop-after-kill with the stop a moment earlier: it comes after the run went TERMINATING
    with JOB_FAILED but before the terminating pass reached the RUNNING replica, which the pass
    then labels with to_job_termination_reason(STOPPED_BY_USER) = TERMINATED_BY_USER (the
    delayed, graceful path of process_terminating_run: the same rows, another label)."""
    db = copy_db("v0.22.5/stop-after-kill")
    execute(
        db,
        "UPDATE jobs SET termination_reason = 'TERMINATED_BY_USER' WHERE job_name = 'web-0-0'",
        "UPDATE events SET message = replace(message, 'TERMINATED_BY_SERVER', "
        "'TERMINATED_BY_USER')",
    )
    return db


def _stop_reaches_victim_log(tmp_path: Path, fmt: str) -> Path:
    out = []
    for line in (STOP / "logs" / f"server-info.{fmt}.log").read_text().splitlines(keepends=True):
        if "TERMINATED_BY_SERVER" in line:
            line = line.replace("TERMINATED_BY_SERVER", "TERMINATED_BY_USER")
            if fmt == "rich":  # the console's 120 columns kept
                line = line.rstrip("\n") + "  \n"
        out.append(line)
    log = tmp_path / f"server-info.{fmt}.log"
    log.write_text("".join(out))
    return log


@pytest.mark.parametrize(
    "source", ["database", "tables", *[f"log-{f}" for f in FORMATS], "database+log"]
)
def test_stop_that_reaches_a_running_victim_keeps_it_a_victim(source, copy_db, tmp_path):
    db = _stop_reaches_victim_db(copy_db)
    capture = tmp_path / "capture"
    capture.mkdir()
    (capture / "server.db").symlink_to(db)
    export_tables(db, capture / "tables")
    sources = _sources(capture, tmp_path, lambda fmt: _stop_reaches_victim_log(tmp_path, fmt))
    report = open_sources(sources[source]).report
    short = source.startswith("log-")
    _check_stopped_during_cascade(
        report,
        short,
        victim_label="got TERMINATED_BY_USER",
        final=None if short else "stopped_by_user",
    )
    (finding,) = report.findings
    assert (
        any(
            "the user's stop reached it after the run had failed" in e.text
            for e in finding.evidence
        )
        or short
    )
    (stop,) = finding.limitations
    if source != "log-rich":
        assert "at or after 2026-12-17T10:09:09.082" in stop.message
        assert "before 2026-12-17T10:09:18.089" in stop.message


def test_a_stop_before_any_failure_stays_the_users():
    report = open_sources([CAPTURES / "v0.22.5" / "user-stop-mid-rollout" / "server.db"]).report
    (verdict,) = report.runs
    assert verdict.verdict == "no_incident"
    assert verdict.why == "run ended with stopped_by_user, not a job failure"
    assert report.findings == []


# 2. Healthy at the cascade means healthy then -------------------------------------------------


def test_a_replica_dstack_never_marked_ready_is_no_victim(copy_db, tmp_path):
    """multi-replica-crash with svc-0-1 never marked ready (jobs.ready = 0, no readiness event)
    while its final probe streak passes: dstack never routed traffic to it."""
    db = copy_db("v0.22.5/multi-replica-crash")
    execute(
        db,
        "UPDATE jobs SET ready = 0 WHERE job_name = 'svc-0-1'",
        "DELETE FROM event_targets WHERE entity_name = 'svc-0-1' AND event_id IN "
        "(SELECT id FROM events WHERE message LIKE 'Service replica ready%')",
    )
    for source in (db, export_tables(db, tmp_path / "tables")):
        report = open_sources([source]).report
        (finding,) = report.findings
        assert finding.confidence == "confirmed"
        assert sorted(v.job_name for v in finding.victims) == ["svc-0-0", "svc-0-2"]
        (other,) = [o for o in finding.also_stopped if o.job_name == "svc-0-1"]
        assert "jobs.ready = 0" in other.why_not_victim


# 3. The root cause of a re-submitted culprit ---------------------------------------------------


def _check_retry(report, short: bool) -> None:
    (verdict,) = report.runs
    assert verdict.verdict == "collateral_termination", verdict.why
    (finding,) = report.findings
    assert finding.category == "collateral_termination"
    assert _ids(finding.victims, short) == [_short(RETRY_VICTIM, short)]
    (culprit,) = finding.culprits
    assert (culprit.job_id, culprit.submission_num) == (_short(RETRY_CULPRIT, short), 1)
    assert culprit.termination_reason == "failed_to_start_due_to_no_capacity"
    (first,) = culprit.earlier_failures
    assert (first.job_id, first.submission_num) == (_short(RETRY_FIRST, short), 0)
    assert (first.termination_reason, first.exit_status) == ("container_exited_with_error", 2)
    root = finding.root_cause
    assert root.failure_class == "container_exit"
    assert root.detail.startswith("container exited with code 2: inference-0-1 submission 0")
    assert root.trigger_class == "fleet_at_capacity"
    assert root.trigger == "failed_to_start_due_to_no_capacity (Fleet is at capacity)"
    # the crash is in the evidence chain, before the re-submission's refusal
    texts = [e.text for e in finding.evidence]
    crash = next(i for i, t in enumerate(texts) if "CONTAINER_EXITED_WITH_ERROR" in t)
    refusal = next(i for i, t in enumerate(texts) if "Fleet is at capacity" in t)
    assert crash < refusal
    assert report.summary.by_failure_class[0].key == "container_exit"


@pytest.mark.parametrize(
    "source", ["database", "tables", *[f"log-{f}" for f in FORMATS], "database+log"]
)
def test_retry_on_error_root_cause_is_the_crash(source, tmp_path):
    report = open_sources(_sources(RETRY, tmp_path)[source]).report
    short = source.startswith("log-")
    _check_retry(report, short)
    (finding,) = report.findings
    if short:  # a log alone cannot date the probe streaks (the service has probes)
        assert finding.confidence == "suspected"
        assert {lim.code for lim in finding.limitations} == {"health_not_provable_from_logs"}
    else:
        assert finding.confidence == "confirmed"
        assert finding.limitations == []


def test_retry_on_error_from_its_api_collection():
    report = open_sources([COLLECTED / "retry-on-error"]).report
    _check_retry(report, False)
    assert report.findings[0].confidence == "confirmed"
