"""Server logs as evidence, audited alone and together with the database (issue 3)."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import sqlite3
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import (
    CAPTURES,
    capture_id,
    expected_victims,
    found_victims,
    load_truth,
    short_ids,
    truth_files,
)
from polars.testing import assert_frame_equal

import analyzer.catalogue as catalogue
from analyzer import open_sources
from analyzer.cli import main
from analyzer.sources.logs import source as log_source
from analyzer.sources.logs.reader import read_log

FORMATS = ("rich", "standard", "json")
EVENT_ERA = [p for p in truth_files() if p.parent.parent.name in ("v0.20", "v0.22.5")]
PRE_EVENTS = truth_files("v0.19/*/truth.json")
SEED = CAPTURES / "v0.22.5" / "seed"


def _log(capture, fmt):
    return capture / "logs" / f"server-info.{fmt}.log"


def _log_cannot_prove(db: Path) -> set[str]:
    """From the capture's own database: do its victims have probes, was its update of
    replica counts or groups only?"""
    with sqlite3.connect(db) as connection:
        (probes,) = connection.execute(
            "SELECT count(*) FROM probes p JOIN jobs j ON j.id = p.job_id "
            "WHERE j.termination_reason = 'TERMINATED_BY_SERVER'"
        ).fetchone()
        fields = [
            m.split("Changed fields: ")[1]
            for (m,) in connection.execute(
                "SELECT message FROM events WHERE message LIKE 'Run updated%'"
            )
        ]
    codes = set()
    if probes:
        codes.add("health_not_provable_from_logs")
    if fields and all(
        {f.strip() for f in f_.split(",")} <= {"configuration.replicas", "configuration.groups"}
        for f_ in fields
    ):
        codes.add("deployment_not_provable_from_logs")
    return codes


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("truth_path", EVENT_ERA, ids=capture_id)
def test_info_log_alone_gives_truth(truth_path, fmt):
    truth = load_truth(truth_path)
    log = _log(truth_path.parent, fmt)
    report = open_sources([log]).report
    assert found_victims(report) == short_ids(expected_victims(truth))
    for finding in report.findings:
        # What a log alone cannot prove (issue 13): health at the kill of a replica with
        # probes, the deployment of replicas active at a replicas/groups-only update.
        unprovable = _log_cannot_prove(truth_path.parent / "server.db")
        assert finding.confidence == ("suspected" if unprovable else "confirmed")
        codes = {lim.code for lim in finding.limitations}
        # a user stop after the failure is said, and proves nothing less (issue 22)
        stopped = any(
            r["run_termination_reason"] in ("stopped_by_user", "aborted_by_user")
            for r in truth["runs"]
            if r["run_id"].replace("-", "")[:6] == finding.run_id
        )
        assert codes == unprovable | ({"run_stopped_during_cascade"} if stopped else set())
        assert all(re.search(r"\.log:\d+$", item.source) for item in finding.evidence)
        expected_culprits = {
            c["job_id"].replace("-", "")[:6] for r in truth["runs"] for c in r["culprit"]
        }
        assert {c.job_id for c in finding.culprits} == expected_culprits
    assert report.inputs[0].unparsed == 0


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("truth_path", PRE_EVENTS, ids=capture_id)
def test_019_log_alone_gives_suspected_findings(truth_path, fmt):
    truth = load_truth(truth_path)
    report = open_sources([_log(truth_path.parent, fmt)]).report
    assert found_victims(report) == short_ids(expected_victims(truth))
    assert all(f.confidence == "suspected" for f in report.findings)
    for finding in report.findings:
        assert any("scaling UP" in note for note in finding.notes)
    assert report.inputs[0].server_version == "0.18.0-0.19.40"


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("truth_path", truth_files(), ids=capture_id)
def test_log_and_database_together(truth_path, fmt):
    truth = load_truth(truth_path)
    capture = truth_path.parent
    report = open_sources([capture / "server.db", _log(capture, fmt)]).report
    assert found_victims(report) == expected_victims(truth)
    assert all(f.confidence == "confirmed" for f in report.findings)
    aligned = [lim for lim in report.limitations if lim.code == "log_time_aligned"]
    assert len(aligned) == 1 and "UTC+00:00" in aligned[0].message
    for finding in report.findings:
        texts = [(item.time, item.text) for item in finding.evidence]
        assert len(texts) == len(set(texts)), "evidence duplicated"
        if capture.parent.name != "v0.19":
            event_items = [i for i in finding.evidence if "events:" in i.source]
            assert event_items and all(".log:" in i.source for i in event_items)


@pytest.mark.parametrize("truth_path", truth_files(), ids=capture_id)
def test_warning_log_alone_cannot_decide(truth_path):
    report = open_sources([truth_path.parent / "logs" / "server-warning.standard.log"]).report
    assert report.findings == []
    assert report.runs == []
    codes = {lim.code for lim in report.limitations}
    assert {"log_without_run_evidence", "no_run_evidence"} <= codes


def _shift_standard(text: str, hours: int) -> str:
    def shift(match):
        moment = datetime.fromisoformat(match.group(1)) + timedelta(hours=hours)
        return moment.isoformat(timespec="milliseconds")

    return re.sub(r"(?<=^INFO )(\S+)", shift, text, flags=re.M)


def test_log_in_a_non_utc_zone_is_aligned_with_the_database(tmp_path):
    local = tmp_path / "server.log"
    local.write_text(_shift_standard(_log(SEED, "standard").read_text(), 2))
    db_only = open_sources([SEED / "server.db"]).report
    report = open_sources([SEED / "server.db", local]).report
    (aligned,) = [lim for lim in report.limitations if lim.code == "log_time_aligned"]
    assert "UTC+02:00" in aligned.message
    assert found_victims(report) == found_victims(db_only)
    assert report.findings[0].evidence == [
        item.model_copy(update={"source": item.source + f"; {local}:{_line(local, item)}"})
        if item.source.startswith("events:")
        else item
        for item in db_only.findings[0].evidence
    ]


def _line(log, item) -> int:
    message = item.text.split(": ", 1)[1].split(" (actor:")[0]
    for number, line in enumerate(log.read_text().splitlines(), 1):
        if message in line and item.text.split(":")[0].split()[-1] in line:
            return number
    raise AssertionError(message)


def test_log_tz_option_without_database(tmp_path):
    local = tmp_path / "server.log"
    local.write_text(_shift_standard(_log(SEED, "standard").read_text(), -5))
    report = open_sources([local], log_tz="-05:00").report
    (finding,) = report.findings
    assert finding.victims[0].terminated_at == datetime.fromisoformat(
        "2026-11-02T09:09:20.483+00:00"
    )
    plain = open_sources([local]).report
    assert "log_time_zone_unknown" in {lim.code for lim in plain.limitations}


def _shift_rich(text: str, delta: timedelta) -> str:
    def shift(match):
        moment = datetime(2000, 1, 1) + timedelta(
            hours=int(match.group(1)), minutes=int(match.group(2)), seconds=int(match.group(3))
        )
        return (moment + delta).strftime("[%H:%M:%S]")

    return re.sub(r"^\[(\d\d):(\d\d):(\d\d)\]", shift, text, flags=re.M)


def test_rich_log_past_midnight(tmp_path):
    """09:05 local becomes 00:00: the update happens before midnight, the kill after it."""
    rich = tmp_path / "server.log"
    rich.write_text(_shift_rich(_log(SEED, "rich").read_text(), timedelta(hours=14, minutes=55)))
    report = open_sources([rich]).report
    (finding,) = report.findings
    assert finding.victims[0].job_id == "699fe8"
    assert finding.victims[0].terminated_at is None  # no date: no datetime is invented
    texts = [item.text for item in finding.evidence]
    assert any(t.startswith("[00:04:20 (+1 days) local, date unknown]") for t in texts)
    assert "log_time_of_day_only" in {lim.code for lim in report.limitations}
    dated = open_sources([rich], log_date=datetime(2026, 11, 2).date(), log_tz="+14:55").report
    assert dated.findings[0].victims[0].terminated_at == datetime.fromisoformat(
        "2026-11-02T09:09:20+00:00"
    )


def test_docker_timestamps_give_utc_directly(tmp_path):
    lines = _log(SEED, "standard").read_text().splitlines()
    wrapped = []
    for line in lines:
        stamp = datetime.fromisoformat(line.split()[1])
        wrapped.append(f"{stamp.isoformat(timespec='microseconds')}123Z {line}")
    log = tmp_path / "container.log"
    log.write_text(_shift_standard("\n".join(wrapped) + "\n", 3))
    report = open_sources([log]).report
    (finding,) = report.findings
    assert finding.victims[0].terminated_at.replace(microsecond=0) == datetime.fromisoformat(
        "2026-11-02T09:09:20+00:00"
    )
    assert not {lim.code for lim in report.limitations} & {"log_time_zone_unknown"}


def test_journald_export(tmp_path):
    entries = []
    for line in _log(SEED, "json").read_text().splitlines():
        record = json.loads(line)
        stamp = datetime.strptime(record["timestamp"], "%Y-%m-%d %H:%M:%S,%f")
        micros = int((stamp - datetime(1970, 1, 1)).total_seconds() * 1_000_000)
        entries.append(
            json.dumps({"__REALTIME_TIMESTAMP": str(micros), "MESSAGE": line, "_COMM": "dstack"})
        )
    log = tmp_path / "journal.json"
    log.write_text("\n".join(entries) + "\n")
    report = open_sources([log]).report
    assert "journald" in report.inputs[0].kind
    assert found_victims(report) == {("collateral_termination", "699fe8")}


def _rotated_seed_set(tmp_path: Path) -> Path:
    """The seed's standard log as a rotated set in a folder: `server.log.2.gz` (oldest),
    `server.log.1`, `server.log`."""
    lines = _log(SEED, "standard").read_text().splitlines(keepends=True)
    folder = tmp_path / "logs"
    folder.mkdir()
    with gzip.open(folder / "server.log.2.gz", "wt") as handle:
        handle.writelines(lines[:12])
    (folder / "server.log.1").write_text("".join(lines[12:22]))
    (folder / "server.log").write_text("".join(lines[22:]))
    return folder


def test_gzip_and_rotated_set(tmp_path):
    folder = _rotated_seed_set(tmp_path)
    report = open_sources([folder]).report
    assert found_victims(report) == {("collateral_termination", "699fe8")}
    assert len(report.inputs) == 3


def test_a_rotated_set_s_limitations_come_in_its_order_in_every_process(tmp_path):
    """Each file of a rotated set of local times says it cannot be aligned, oldest first, in
    every process: the files were once listed in a hash set's order, which changed from one
    run of the command to the next."""
    folder = _rotated_seed_set(tmp_path)
    command = [sys.executable, "-m", "analyzer", "audit", str(folder), "--format", "json", "-q"]
    for _ in range(6):
        report = json.loads(subprocess.run(command, capture_output=True, check=True).stdout)
        sources = [
            limitation["source"]
            for limitation in report["limitations"]
            if limitation["code"] == "log_time_zone_unknown"
        ]
        assert sources == [
            str(folder / name) for name in ("server.log.2.gz", "server.log.1", "server.log")
        ]


def test_damaged_lines_are_counted_quarantined_and_do_not_stop_the_audit(
    tmp_path, tmp_path_factory
):
    lines = _log(SEED, "standard").read_bytes().splitlines(keepends=True)
    damaged = [*lines[:10], b"\x00\xff\xfe garbage \x80\n", b"INFO 2026-11-02T09:0\n", *lines[10:]]
    log = tmp_path / "server.log"
    log.write_bytes(b"".join(damaged))
    quarantine = tmp_path_factory.mktemp("out") / "quarantine.txt"  # never beside the evidence
    result = CliRunner().invoke(
        main, ["audit", str(log), "--format", "json", "--quarantine", str(quarantine)]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["inputs"][0]["unparsed"] == 2
    assert report["summary"]["victims"] == 1
    quarantined = quarantine.read_text().splitlines()
    assert [q.split("\t")[0] for q in quarantined] == [f"{log}:11", f"{log}:12"]


def test_unknown_dstack_message_is_listed_by_shape(tmp_path):
    lines = _log(SEED, "standard").read_text().splitlines(keepends=True)
    novel = (
        "INFO 2026-11-02T09:08:55.000 dstack._internal.server.services.runs "
        "run(6e42c9)web: rollout paused after 3 attempts\n"
    )
    log = tmp_path / "server.log"
    log.write_text("".join([*lines[:20], novel, *lines[20:]]))
    report = open_sources([log]).report
    notes = report.inputs[0].notes
    assert any(
        "unrecognised dstack line x1: run(…): rollout paused after N attempts" in n for n in notes
    )
    assert report.summary.victims == 1


def test_same_run_name_twice_in_one_log_kept_apart_by_prefix(tmp_path):
    """Two runs named web (different ids) in one log: their jobs do not mix."""
    first = _log(CAPTURES / "v0.22.5" / "old-replica-fails", "standard").read_text()
    second = _log(SEED, "standard").read_text()
    log = tmp_path / "server.log"
    log.write_text(first + second)
    report = open_sources([log]).report
    verdicts = {v.run_id: v.verdict for v in report.runs}
    assert verdicts == {"a7c4dd": "no_healthy_victim", "6e42c9": "collateral_termination"}
    assert found_victims(report) == {("collateral_termination", "699fe8")}


def test_timeline_of_a_rich_log_alone_shows_no_invented_date():
    result = CliRunner().invoke(main, ["timeline", "web", str(_log(SEED, "rich"))])
    assert result.exit_code == 0, result.output
    assert "1970" not in result.output
    assert "began 09:08:50 (date unknown) by user alice" in result.output


@pytest.mark.parametrize("log", ["server-info.standard.log", "server-info.rich.log"])
def test_known_messages_classify_each_chunk_as_the_catalogue_does(log):
    """A log's event messages classified chunk after chunk with the memory of earlier chunks
    (each text once) give what classifying every chunk on its own gives, nulls included."""
    messages = read_log(SEED / "logs" / log).records.select(
        pl.col("message").str.extract(r"^Emitting ?event: ?(.*?)\. ?Event ?targets", 1),
        pl.col("line"),
    )
    assert messages["message"].null_count() and messages["message"].n_unique() > 10
    known = catalogue.KnownMessages(
        catalogue.EVENT_TEMPLATES, catalogue.KNOWN_IRRELEVANT, fold_tolerant=True
    )
    size = messages.height // 3 + 1
    for chunk in messages.iter_slices(size):
        alone = catalogue.parse_event_messages(chunk.lazy(), fold_tolerant=True).collect()
        assert_frame_equal(known.classify(chunk, "message"), alone)
        assert set(alone["kind"]) - {"unrecognised"}


# jobs_submitted's WARNING for a refused offer (0.22.5 `_provision_new_capacity`):
# "%s: %s launch in %s/%s failed: %s" % (fmt(job), instance, backend, region, repr(error)).
_REFUSED = (
    "dstack._internal.server.background.pipeline_tasks.jobs_submitted",
    "job(f93ce0)chat-api-0-1: chat-fleet-0 launch in aws/us-east-1 failed: "
    "NoCapacityError('Insufficient capacity')",
)


def _warning_log(tmp_path, fmt, lines):
    path = tmp_path / f"server-warning.{fmt}.log"
    if fmt == "json":
        path.write_text(
            "".join(
                json.dumps(
                    {
                        "timestamp": f"2026-11-08 15:0{i}:59,069",
                        "logger": logger,
                        "level": "WARNING",
                        "message": message,
                    }
                )
                + "\n"
                for i, (logger, message) in enumerate(lines)
            )
        )
    else:
        path.write_text(
            "".join(
                f"WARNING 2026-11-08T15:0{i}:59.069 {logger} {message}\n"
                for i, (logger, message) in enumerate(lines)
            )
        )
    return path


@pytest.mark.parametrize("fmt", ["standard", "json"])
def test_warning_log_names_runs_whose_launch_was_refused_as_a_hint_never_a_finding(tmp_path, fmt):
    real = (
        (CAPTURES / "v0.22.5" / "user-stop-mid-rollout" / "logs")
        .joinpath("server-warning.standard.log")
        .read_text()
    )
    _, _, logger, message = real.splitlines()[0].split(" ", 3)
    log = _warning_log(tmp_path, fmt, [(logger, message), _REFUSED, _REFUSED])
    report = open_sources([log]).report
    assert report.findings == [] and report.runs == []
    (hint,) = [lim for lim in report.limitations if lim.code == "log_capacity_hint"]
    assert "run chat-api (job chat-api-0-1: 2 launch(es) refused" in hint.message
    assert f"{log}:2" in hint.message and "not a finding" in hint.message
    assert "log_without_run_evidence" in {lim.code for lim in report.limitations}


# jobs_running (0.22.5, the disconnect handling of a running job): dstack's own line
_UNREACHABLE = (
    "dstack._internal.server.background.pipeline_tasks.jobs_running",
    "job(5c1e2a)chat-api-0-0: is unreachable, waiting for the instance to become reachable "
    "again, age=0:41:12.503194",
)


@pytest.mark.parametrize("fmt", ["standard", "json"])
def test_warning_log_names_runs_whose_instance_was_unreachable_as_a_hint(tmp_path, fmt):
    log = _warning_log(tmp_path, fmt, [_UNREACHABLE, _UNREACHABLE, _REFUSED])
    report = open_sources([log]).report
    assert report.findings == [] and report.runs == []
    hints = {lim.code: lim.message for lim in report.limitations if lim.code.endswith("_hint")}
    assert set(hints) == {"log_unreachable_hint", "log_capacity_hint"}
    unreachable = hints["log_unreachable_hint"]
    assert "run chat-api (job chat-api-0-0: 2 line(s) saying its instance was unreachable" in (
        unreachable
    )
    assert f"{log}:1" in unreachable and "not a finding" in unreachable
    (without,) = [lim for lim in report.limitations if lim.code == "log_without_run_evidence"]
    assert "nothing about these incidents is logged" not in without.message


def test_a_warning_log_without_refused_launches_gives_no_hint():
    log = CAPTURES / "v0.22.5" / "user-stop-mid-rollout" / "logs" / "server-warning.standard.log"
    codes = {lim.code for lim in open_sources([log]).report.limitations}
    assert "log_capacity_hint" not in codes and "log_without_run_evidence" in codes


def test_an_info_log_keeps_refused_launches_out_of_the_hints(tmp_path):
    seed = (SEED / "logs" / "server-info.standard.log").read_text()
    log = tmp_path / "server.log"
    log.write_text(seed + "WARNING 2026-11-02T09:20:00.000 " + " ".join(_REFUSED) + "\n")
    report = open_sources([log]).report
    assert "log_capacity_hint" not in {lim.code for lim in report.limitations}
    assert report.summary.victims == 1


def test_v019_log_a_slot_re_run_by_a_later_deployment_is_the_culprit(tmp_path):
    """0.19's rolling deployment re-runs an inactive replica slot first (scale_run_replicas:
    `retry_run_replica_jobs`), so the failing new submission has the job name of a replica the
    previous rollout stopped: the 6-hex id, not the name, tells them apart (reference 9.3)."""
    seed = (CAPTURES / "v0.19" / "seed" / "logs" / "server-info.standard.log").read_text()
    head = [line for line in seed.splitlines() if "09:09" not in line]
    old, surge = "job(4da89b)web-0-0", "job(1ded4f)web-0-1"
    prefix = "INFO 2026-11-02T09:0{} dstack._internal.server.services."
    rollout = [
        prefix.format("3:00.100") + "runs run(686b0f)web: scaling UP 1 replica(s)",
        "INFO 2026-11-02T09:03:05.100 dstack._internal.server.background.tasks."
        f"process_submitted_jobs {surge}: provisioned 1 new instance(s)",
        "INFO 2026-11-02T09:03:40.100 dstack._internal.server.background.tasks."
        f"process_running_jobs {surge}: now is PULLING",
        prefix.format("4:10.100")
        + f"services {surge}: service replica registered to receive requests, gateway=False",
        prefix.format("4:20.100") + "runs run(686b0f)web: scaling DOWN 1 replica(s)",
        prefix.format("4:25.100") + f"jobs {old}: job status is TERMINATED, reason: SCALED_DOWN",
    ]
    failure = [
        line.replace(surge, "job(77aa11)web-0-0").replace(old, surge)
        for line in seed.splitlines()
        if "09:09" in line
    ]
    log = tmp_path / "server-info.standard.log"
    log.write_text("\n".join(head + rollout + failure) + "\n")
    report = open_sources([log]).report
    (finding,) = report.findings
    assert finding.category == "collateral_termination"
    assert [v.job_name for v in finding.victims] == ["web-0-1"]
    assert [(c.job_name, c.job_id[:6]) for c in finding.culprits] == [("web-0-0", "77aa11")]


def test_log_alone_a_multi_node_task_is_a_task_not_an_undecided_service(tmp_path):
    """The real task-fails log with a second node (train-1-0) that fails while node 0 is
    stopped by the cascade: only a task has job_num > 0 (BaseJobConfigurator names jobs
    `{run}-{job_num}-{replica_num}`), so the run is no rolling deployment's."""
    source = CAPTURES / "v0.22.5" / "task-fails" / "logs" / "server-info.standard.log"
    node0, node1 = "job(b7e577)train-0-0", "job(c0ffee)train-1-0"
    lines = []
    for line in source.read_text().splitlines():
        if "07:50:55" in line or "07:51:03" in line:
            lines.append(line.replace(node0, node1))
            continue
        lines.append(line)
        if node0 in line and "Emitting event: Job" in line and "unassigned" not in line:
            lines.append(line.replace(node0, node1))
        if "07:50:58" in line:  # the run's TERMINATING: node 0 is stopped by the server
            stamp = "INFO 2026-11-11T07:51:0{} dstack._internal.server.services.events "
            lines.append(
                stamp.format("1.100") + "Emitting event: Job status changed RUNNING -> "
                f"TERMINATING. Termination reason: TERMINATED_BY_SERVER. Event targets: {node0}. "
                "Actor: system"
            )
            lines.append(
                stamp.format("5.100") + "Emitting event: Job status changed TERMINATING -> "
                f"TERMINATED. Event targets: {node0}. Actor: system"
            )
    log = tmp_path / "server-info.standard.log"
    log.write_text("\n".join(lines) + "\n")
    (run,) = open_sources([log]).report.runs
    assert run.verdict == "no_incident"
    assert "a task run" in run.why


def test_v019_log_service_registration_line_says_service(tmp_path):
    """0.19's services.register_service logs `{run}: service is registered as <url>` at
    submission, for every service: the log says the run is a service, where no other line
    (scaling, registration of a replica) does."""
    seed = (CAPTURES / "v0.19" / "seed" / "logs" / "server-info.standard.log").read_text()
    status = next(line for line in seed.splitlines() if "SUBMITTED -> PROVISIONING" in line)
    line = (
        "INFO 2026-11-02T09:00:41.299 dstack._internal.server.services.services run(686b0f)web: "
        "service is registered as http://127.0.0.1:3000/proxy/services/main/web/"
    )
    types = []
    for lines in ([status], [line, status]):
        log = tmp_path / f"server-{len(lines)}.log"
        log.write_text("\n".join(lines) + "\n")
        types.append(open_sources([log]).runs["run_type"].to_list())
    assert types == [[None], ["service"]]


def test_a_log_written_twice_keeps_each_event_once_with_both_places(tmp_path, monkeypatch):
    """The seed log concatenated with itself (as an overlapping rotated file would be): the
    same findings, each event once with both places, and a note saying so, whether the
    identical records are folded as they are read or at the end."""
    import analyzer.sources.logs.messages as messages

    seed = (SEED / "logs" / "server-info.standard.log").read_text()
    once, twice = tmp_path / "once.log", tmp_path / "twice.log"
    once.write_text(seed)
    twice.write_text(seed + seed)
    lines = len(seed.splitlines())
    reports = {"once": open_sources([once]).report}
    monkeypatch.setattr(messages, "_COMPACT_ROWS", 5)  # folded while reading, many times
    reports["twice"] = open_sources([twice]).report
    (one,), (two,) = reports["once"].findings, reports["twice"].findings
    assert [v.job_id for v in two.victims] == [v.job_id for v in one.victims]
    assert [c.job_id for c in two.culprits] == [c.job_id for c in one.culprits]
    assert len(two.evidence) == len(one.evidence)
    for a, b in zip(one.evidence, two.evidence, strict=True):
        if a.time is not None:  # an event line (the job summaries cite the job's first line)
            line = int(a.source.rsplit(":", 1)[1])
            assert b.source == f"{twice}:{line}; {twice}:{line + lines}"
    assert one.impact.outage_seconds == two.impact.outage_seconds
    notes = reports["twice"].inputs[0].notes
    assert any("repeat an identical earlier one" in note for note in notes)
    assert not any("repeat" in note for note in reports["once"].inputs[0].notes)


def test_records_alike_in_time_entity_and_message_are_not_folded_as_repeats(tmp_path):
    """One status change of one job in one millisecond said by two actors: the lines agree in
    time, job and message (the columns the fold tests first) and differ in their actor: both
    kept, none a repeat; the same line twice is one repeat."""
    from analyzer.sources.logs.messages import records_to_events

    line = (
        "INFO 2026-11-02T09:01:25.061 dstack._internal.server.services.events Emitting event: "
        "Job status changed PULLING -> RUNNING. Event targets: job(699fe8)web-0-0. Actor: "
    )
    lines = [line + "system", line + "user(4d6cc5)admin"]
    for written, repeats in ((lines, 0), ([*lines, lines[1]], 1)):
        log = tmp_path / f"server-{len(written)}.log"
        log.write_text("\n".join(written) + "\n")
        events, facts = records_to_events(read_log(log).records, str(log), "server")
        assert events["actor"].to_list() == ["system", "user admin"]
        assert facts.repeated_records == repeats


def test_a_logger_name_and_an_event_line_narrow_the_version_together(tmp_path):
    """The loggers are searched once per distinct name, the text line by line: a
    scheduled_tasks logger (0.20.10-0.20.16) and a 'Run updated' event (0.20.8+) say
    0.20.10-0.20.16; the logger alone says as much, a pipeline_tasks logger alone 0.20.13+."""
    from analyzer.sources.logs.messages import records_to_events

    def version(*lines: str) -> str | None:
        log = tmp_path / "server.log"
        log.write_text("\n".join(lines) + "\n")
        return records_to_events(read_log(log).records, str(log), "server")[1].server_version

    at = "INFO 2026-11-02T09:01:25.061 dstack._internal.server."
    scheduled = at + "background.scheduled_tasks.instances Processing instance"
    updated = (
        at + "services.events Emitting event: Run updated. Deployment: 2. Changed fields: "
        "image. Event targets: run(686b0f)web. Actor: user(4d6cc5)admin"
    )
    assert version(scheduled, updated, scheduled) == "0.20.10-0.20.16"
    assert version(scheduled) == "0.20.10-0.20.16"
    assert version(at + "background.pipeline_tasks.runs Processing run") == ">=0.20.13"
    assert version(updated) == ">=0.20.8"


def test_logs_read_one_after_another_share_the_known_messages(monkeypatch):
    """The logs one thread reads share the catalogue's answers (a text is classified once per
    audit, not once per log), and each log reads as it reads alone; a log of many texts does
    not leave them held after it."""
    from analyzer.sources.logs import messages
    from analyzer.sources.logs.source import _load_file

    logs = [SEED / "logs" / f"server-info.{fmt}.log" for fmt in FORMATS]
    alone = []
    for log in logs:
        monkeypatch.setattr(messages._shared, "known", None, raising=False)
        alone.append(_load_file(log, "default"))
    monkeypatch.setattr(messages._shared, "known", None, raising=False)
    first = _load_file(logs[0], "default")
    shared = messages._shared.known
    assert shared is not None and len(shared[0]) > 10
    together = [first] + [_load_file(log, "default") for log in logs[1:]]
    assert messages._shared.known is shared
    for one, other in zip(alone, together, strict=True):
        assert_frame_equal(one.events, other.events)
        assert one.inputs == other.inputs
    monkeypatch.setattr(messages, "_SHARED_KNOWN_TEXTS", 10)
    _load_file(logs[0], "default")
    assert messages._shared.known is None


def test_a_log_is_hashed_beside_its_parse_and_the_hasher_ends_with_it(tmp_path, monkeypatch):
    """The SHA-256 of a log is worked out on a thread while the log is parsed: it is the
    file's, whether the log is many hand-overs long or shorter than one, and the thread ends
    when the read does, also when the read fails."""
    log = tmp_path / "server.log"
    log.write_bytes(_log(SEED, "standard").read_bytes() * 3)
    for batch in (1 << 12, log_source._Digest._BATCH):  # a hand-over every 4 KB; one for all
        monkeypatch.setattr(log_source._Digest, "_BATCH", batch)
        data = log_source._load_file(log, "default")
        assert data.inputs[0].sha256 == hashlib.sha256(log.read_bytes()).hexdigest()
        assert data.inputs[0].size == log.stat().st_size

    def hashing() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "sha256 log"]

    def broken(*args, **kwargs):
        raise RuntimeError("the parse failed")

    monkeypatch.setattr(log_source, "_stream", broken)
    with pytest.raises(RuntimeError, match="the parse failed"):
        log_source._load_file(log, "default")
    assert hashing() == []


def test_a_hash_that_fails_is_raised_not_waited_for_nor_cut_short(monkeypatch):
    """The log's hasher (sources.logs.source._Digest) stops hashing at its first error and
    keeps taking blocks, so the reader never waits on a full queue, and its digest raises the
    error: no SHA-256 of part of the bytes is ever recorded."""

    class Failing:
        def __init__(self) -> None:
            self.calls = 0

        def update(self, block: bytes) -> None:
            self.calls += 1
            raise MemoryError("no room to hash")

    monkeypatch.setattr(log_source._Digest, "_BATCH", 1)  # every block a hand-over
    digest = log_source._Digest()
    failing = digest._digest = Failing()

    def read() -> None:
        for _ in range(10 * log_source._Digest._WAITING):  # more than the queue holds
            digest.update(b"x" * 64)

    reader = threading.Thread(target=read, daemon=True)  # a reader left waiting fails, not hangs
    reader.start()
    reader.join(10)
    assert not reader.is_alive()
    with pytest.raises(MemoryError, match="no room to hash"):
        digest.hexdigest()
    assert failing.calls == 1
    assert not digest._thread.is_alive()
