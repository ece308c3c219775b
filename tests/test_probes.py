"""DEBUG probe lines date probe results (issue 22 §4): a streak reaching ready_after before T
proves health at T, a failure its absence, with the line as provenance.

No capture runs dstack at DEBUG, so the DEBUG log is built from multi-replica-crash's real
standard (and json) log plus the lines dstack 0.22.5 writes for each probe execution, in its
exact format: `_process_probe_async` logs "{fmt(probe)}: processing probe" and "...: probe
processing took Ns", `_execute_probe` "...: probe status code: N" or "...: probe failed:
{repr(e)}" (background/scheduled_tasks/probes.py), `fmt(probe)` = `probe(<6 hex>)<probes.name>`
(services/logging.py, fmt_entity), and the standard / json formatters of
server/utils/logging.py. The results follow the capture's own `probes` rows: each probe's
last execution `interval` seconds before its `due`, as many passes as its `success_streak`
(svc-0-3's 0: it failed to connect until its container exited)."""

from __future__ import annotations

import csv
import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from conftest import CAPTURES, DATA, execute

from analyzer import open_sources
from analyzer.pipeline.exposure import exposure_report
from analyzer.pipeline.timeline import HEALTH_PROOFS

CRASH = CAPTURES / "v0.22.5" / "multi-replica-crash"
DEBUG_LOG = DATA / "logs" / "v0.22.5-multi-replica-crash.debug.standard.log"
LOGGER = "dstack._internal.server.background.scheduled_tasks.probes"
SPACING = timedelta(seconds=11.1)  # interval 10 s plus the scheduler's pass and the request
REFUSED = "ConnectError('All connection attempts failed')"
OLD = ("svc-0-0", "svc-0-1", "svc-0-2")


def _running_at(job_name: str) -> datetime:
    lines = (CRASH / "logs" / "server-info.standard.log").read_text().splitlines()
    (line,) = [
        line
        for line in lines
        if "-> RUNNING" in line and f"){job_name}. Actor" in line and "job(" in line
    ]
    return datetime.fromisoformat(line.split()[1])


def probe_results(
    overrides: dict[tuple[str, int], str] | None = None,
) -> list[tuple[datetime, str, str]]:
    """(time, fmt(probe), result body) of every probe execution, from the capture's rows;
    `overrides` replaces the body of the n-th execution (0-based) of a job's probe."""
    with (CRASH / "tables" / "probes.csv").open() as handle:
        probes = list(csv.DictReader(handle))
    results = []
    for probe in probes:
        job = probe["name"].rsplit("-", 1)[0]
        last = datetime.fromisoformat(probe["due"]) - timedelta(seconds=10)
        streak = int(probe["success_streak"])
        entity = f"probe({probe['id'][:6]}){probe['name']}"
        if streak:
            times = [last - SPACING * k for k in range(streak - 1, -1, -1)]
            bodies = ["probe status code: 200"] * streak
        else:
            first = _running_at(job) + timedelta(seconds=0.761)
            times = [first, last]
            bodies = [f"probe failed: {REFUSED}"] * 2
        for n, (at, body) in enumerate(zip(times, bodies, strict=True)):
            results.append((at, entity, (overrides or {}).get((job, n), body)))
    return sorted(results)


def _debug_records(results) -> list[tuple[datetime, str]]:
    records = []
    for at, entity, body in results:
        records.append((at - timedelta(milliseconds=12), f"{entity}: processing probe"))
        records.append((at, f"{entity}: {body}"))
        records.append((at + timedelta(milliseconds=3), f"{entity}: probe processing took 0.015s"))
    return records


def debug_log(fmt: str, target: Path, overrides=None) -> Path:
    """The capture's `fmt` log with the DEBUG probe records inserted in time order."""
    source = (CRASH / "logs" / f"server-info.{fmt}.log").read_text().splitlines()

    def time_of(line: str) -> datetime:
        if fmt == "json":
            return datetime.strptime(json.loads(line)["timestamp"], "%Y-%m-%d %H:%M:%S,%f")
        return datetime.fromisoformat(line.split()[1])

    def written(at: datetime, message: str) -> str:
        if fmt == "json":
            stamp = at.strftime("%Y-%m-%d %H:%M:%S,") + f"{at.microsecond // 1000:03d}"
            record = {"timestamp": stamp, "logger": LOGGER, "level": "DEBUG", "message": message}
            return json.dumps(record)
        stamp = at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}"
        return f"DEBUG {stamp} {LOGGER} {message}"

    merged = [(time_of(line), 0, i, line) for i, line in enumerate(source) if line.strip()]
    debug = _debug_records(probe_results(overrides))
    merged += [(at, 1, i, written(at, message)) for i, (at, message) in enumerate(debug)]
    target.write_text("".join(line + "\n" for *_, line in sorted(merged)))
    return target


def test_the_debug_fixture_is_the_builders(tmp_path):
    """tests/data/logs holds the built standard log (for readers of the fixtures)."""
    built = debug_log("standard", tmp_path / "debug.log")
    assert built.read_text() == DEBUG_LOG.read_text()


@pytest.mark.parametrize("fmt", ["standard", "json"])
def test_probe_lines_are_dated_results_of_their_jobs(tmp_path, fmt):
    audit = open_sources([debug_log(fmt, tmp_path / f"debug.{fmt}.log")])
    events = audit.events
    results = events.filter(events["kind"].is_in(["probe_passed", "probe_failed"]))
    by_job = {
        (row["entity_name"], row["kind"]): row["len"]
        for row in results.group_by("entity_name", "kind").len().iter_rows(named=True)
    }
    assert by_job == {
        ("svc-0-0", "probe_passed"): 38,
        ("svc-0-1", "probe_passed"): 38,
        ("svc-0-2", "probe_passed"): 38,
        ("svc-0-3", "probe_failed"): 2,
    }
    # each job's results carry its job's prefix (from the job lines), and their line
    prefixes = {(row["entity_name"], row["entity_id"]) for row in results.iter_rows(named=True)}
    assert prefixes == {
        ("svc-0-0", "3b2106"),
        ("svc-0-1", "dc2185"),
        ("svc-0-2", "3a2bde"),
        ("svc-0-3", "ca8425"),
    }
    assert all(p[0].startswith(f"{tmp_path}/debug.{fmt}.log:") for p in results["provenance"])
    (info,) = audit.report.inputs
    notes = " ".join(info.notes)
    # processing lines known, irrelevant; nothing unrecognised, nothing left unattributed
    assert "415 lines: 415 records (" in notes and ", 0 unrecognised dstack lines)" in notes
    assert "unrecognised dstack line x" not in notes and "probe result line" not in notes


def _finding(report):
    (finding,) = report.findings
    return finding


@pytest.mark.parametrize("fmt", ["standard", "json"])
def test_probe_lines_prove_the_victims_healthy_at_the_failure_from_a_log_alone(tmp_path, fmt):
    """The INFO log alone leaves the victims suspected (readiness is never retracted:
    health_not_provable_from_logs); their probes' results logged up to the failure prove it."""
    report = open_sources([debug_log(fmt, tmp_path / f"debug.{fmt}.log")]).report
    finding = _finding(report)
    assert (finding.category, finding.confidence) == ("collateral_termination", "confirmed")
    assert sorted(v.job_name for v in finding.victims) == list(OLD)
    assert {v.health_proof for v in finding.victims} == {HEALTH_PROOFS["probe_lines"]}
    assert "health_not_provable_from_logs" not in {lim.code for lim in finding.limitations}
    (culprit,) = finding.culprits
    assert culprit.job_name == "svc-0-3"
    # each victim's last passing line before the run's failure (10:39:15.667) is cited
    lines = debug_log(fmt, tmp_path / "again.log").read_text().splitlines()
    for victim in finding.victims:
        (item,) = [
            e
            for e in finding.evidence
            if "DEBUG probe lines" in e.text and e.text.startswith(f"job {victim.job_name}:")
        ]
        number = int(item.source.rsplit(":", 1)[1])
        assert "probe status code: 200" in lines[number - 1]
        assert f"){victim.job_name}-0:" in lines[number - 1]
        assert item.time < datetime.fromisoformat("2026-11-04T10:39:15.667+00:00")


def test_info_log_alone_stays_suspected():
    """The same records without the DEBUG lines: what the probe lines add."""
    report = open_sources([CRASH / "logs" / "server-info.standard.log"]).report
    finding = _finding(report)
    assert finding.confidence == "suspected"
    assert "health_not_provable_from_logs" in {lim.code for lim in finding.limitations}


@pytest.mark.parametrize("fmt", ["standard", "json"])
def test_a_probe_failing_at_the_failure_proves_no_health(tmp_path, fmt):
    """svc-0-2's probe answered 503 on its last two executions before the run failed: its
    streak was 0 then (ready_after 2), so it was not serving: not a victim, the line named."""
    overrides = {
        ("svc-0-2", 36): "probe status code: 503",
        ("svc-0-2", 37): "probe status code: 503",
    }
    log = debug_log(fmt, tmp_path / f"debug.{fmt}.log", overrides)
    report = open_sources([log]).report
    finding = _finding(report)
    assert sorted(v.job_name for v in finding.victims) == ["svc-0-0", "svc-0-1"]
    lines = log.read_text().splitlines()
    failed = [i + 1 for i, line in enumerate(lines) if "svc-0-2-0: probe status code: 503" in line]
    (other,) = finding.also_stopped
    assert other.job_name == "svc-0-2"
    assert other.why_not_victim == (
        "its probe was failing when the run failed: the last result logged before the "
        f"failure, at 2026-11-04T10:39:11.591000+00:00 ({log}:{failed[-1]}), left its streak "
        "below ready_after"
    )


# svc-0-1's probe answered 503 on its 11th and 12th executions (10:34:11.8, 10:34:22.9), then
# passed 26 times: the copy's row keeps the streak dstack leaves, 26.
DIP = {("svc-0-1", 10): "probe status code: 503", ("svc-0-1", 11): "probe status code: 503"}
SVC_0_1 = "dc21856a-9459-4986-8bc7-d3a864a8965e"


def _dip(copy_db, tmp_path) -> tuple[Path, Path]:
    db = copy_db("v0.22.5/multi-replica-crash")
    execute(db, "UPDATE probes SET success_streak = 26 WHERE name = 'svc-0-1-0'")
    return db, debug_log("standard", tmp_path / "debug.log", DIP)


def _healthy(audit, at: str) -> tuple[int, int]:
    report = exposure_report(audit, datetime.fromisoformat(at))
    (service,) = [s for s in report.services if s.run_name == "svc"]
    return service.healthy_replicas, service.active_replicas


def test_exposure_at_t_reads_the_probe_lines_beside_the_database(copy_db, tmp_path):
    """At 10:34:30 svc-0-1's streak was 1 (ready_after 2): not serving, though ready since
    10:32:39 and its final streak 26; at 10:34:50 two passes had followed the failure. The
    database alone cannot date the dip and counts it healthy throughout."""
    db, log = _dip(copy_db, tmp_path)
    both = open_sources([db, log])
    assert _healthy(both, "2026-11-04T10:34:30+00:00") == (2, 3)
    assert _healthy(both, "2026-11-04T10:34:50+00:00") == (3, 3)
    assert _healthy(open_sources([db]), "2026-11-04T10:34:30+00:00") == (3, 3)
    # the log alone says the same of those moments
    alone = open_sources([log])
    assert _healthy(alone, "2026-11-04T10:34:30+00:00") == (2, 3)
    assert _healthy(alone, "2026-11-04T10:34:50+00:00") == (3, 3)


def test_a_streak_rebuilt_before_the_failure_proves_health_then(copy_db, tmp_path):
    """The dip was over 26 passes before the run failed: svc-0-1 is a victim from the
    database with the log, each probe line the database's job row and its own provenance."""
    db, log = _dip(copy_db, tmp_path)
    finding = _finding(open_sources([db, log]).report)
    assert (finding.category, finding.confidence) == ("collateral_termination", "confirmed")
    assert sorted(v.job_name for v in finding.victims) == list(OLD)
    (item,) = [e for e in finding.evidence if e.text.startswith("job svc-0-1: its probes'")]
    lines = log.read_text().splitlines()
    assert "svc-0-1-0: probe status code: 200" in lines[int(item.source.rsplit(":", 1)[1]) - 1]
    assert finding.also_stopped == []


def test_the_dip_at_the_failure_makes_it_no_victim_from_database_and_log(copy_db, tmp_path):
    """Moved to the failure (the last two executions before it 503, the row's streak 0 as
    dstack leaves it): the database and the log agree, and the log's line is named."""
    db = copy_db("v0.22.5/multi-replica-crash")
    execute(db, "UPDATE probes SET success_streak = 0 WHERE name = 'svc-0-1-0'")
    dip = {("svc-0-1", 36): "probe status code: 503", ("svc-0-1", 37): "probe status code: 503"}
    log = debug_log("standard", tmp_path / "debug.log", dip)
    finding = _finding(open_sources([db, log]).report)
    assert sorted(v.job_name for v in finding.victims) == ["svc-0-0", "svc-0-2"]
    (other,) = finding.also_stopped
    assert other.job_id == SVC_0_1
    assert other.why_not_victim.startswith("its probe was failing when the run failed")
    assert f"({log}:" in other.why_not_victim
