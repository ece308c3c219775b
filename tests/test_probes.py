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
from conftest import CAPTURES, DATA

from analyzer import open_sources

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
    prefixes = {
        (row["entity_name"], row["entity_id"]) for row in results.iter_rows(named=True)
    }
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
