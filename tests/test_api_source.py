"""API and CLI exports (`api/`, `cli/` of the v0.22.5 captures) as a source of their own.

What each export can decide in these captures (every job there has a single submission, so
`dstack ps --json` misses nothing a runs get holds; what it lacks are the events):

- `api/` (runs list/get + events list pages): every capture, exactly the truth's victims;
- `cli/` (`ps -a --json`, `run get --json`, `dstack event` text): every capture, exactly;
- `cli/<project>/ps-a.json` alone (no events): decides multi-replica-crash (the old replicas'
  probe streaks prove health) and every capture without victims; it cannot decide seed and
  scale-up-fails (no probes, no events: nothing shows the killed replica ever served), where
  the verdict is inconclusive, never a false finding, and limitations say why.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import polars as pl
import pytest
from conftest import (
    CAPTURES,
    DATA,
    capture_id,
    expected_victims,
    found_victims,
    load_truth,
    truth_files,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer import AuditInputError, open_sources
from analyzer.sources import load_path, of_kind
from analyzer.sources.api import EVENT_TEXT, KIND, classify
from analyzer.sources.api.recognise import DAMAGED, FLEETS_PAGE, INSTANCES_PAGE, _no_json_early
from analyzer.sources.base import LoadContext

SOURCE = of_kind(KIND)

EXPORT_CAPTURES = [
    p
    for p in truth_files("v0.22.5/*/truth.json")
    if (p.parent / "api").is_dir() and (p.parent / "cli").is_dir()
]
PS_UNDECIDABLE = {"seed", "scale-up-fails"}  # victims without probes: health needs events


def test_every_v0225_capture_has_api_and_cli_exports():
    assert len(EXPORT_CAPTURES) == 9


def _check_verdicts(report, truth) -> None:
    assert found_victims(report) == expected_victims(truth)
    verdicts = {v.run_id: v for v in report.runs}
    assert len(report.runs) == len(truth["runs"])
    for run in truth["runs"]:
        verdict = verdicts[run["run_id"]]
        if run["expected_flag"]:
            assert verdict.verdict == "collateral_termination", verdict.why
        elif run["expected_flag_broad"]:
            assert verdict.verdict == "same_deployment_collateral", verdict.why
        else:
            assert verdict.verdict in ("no_incident", "no_healthy_victim"), verdict.why
        flagged = [f for f in report.findings if f.run_id == run["run_id"]]
        if run["expected_flag_broad"]:
            assert {c.job_id for f in flagged for c in f.culprits} == {
                c["job_id"] for c in run["culprit"]
            }
            assert all(f.confidence == "confirmed" for f in flagged)
        else:
            assert flagged == []


def _ps_json(capture: Path) -> Path:
    (found,) = (capture / "cli").glob("*/ps-a.json")
    return found


def _evidence_counts(report) -> Counter:
    return Counter((e.time, e.text) for f in report.findings for e in f.evidence)


@pytest.mark.parametrize("truth_path", EXPORT_CAPTURES, ids=capture_id)
def test_api_folder_alone_gives_truth(truth_path):
    report = open_sources([truth_path.parent / "api"]).report
    _check_verdicts(report, load_truth(truth_path))
    assert {i.server_version for i in report.inputs} >= {"0.22.5"}


@pytest.mark.parametrize("truth_path", EXPORT_CAPTURES, ids=capture_id)
def test_cli_folder_alone_gives_truth(truth_path):
    """ps/run-get JSON for the rows, `dstack event` text (ids resolved by name) for the order."""
    audit = open_sources([truth_path.parent / "cli"])
    _check_verdicts(audit.report, load_truth(truth_path))
    codes = {lim.code for lim in audit.report.limitations}
    assert "cli_event_time_aligned" in codes  # the captures' CLI ran with TZ=UTC
    assert "cli_event_names_unresolved" not in codes
    # event.txt, event-since.txt and event-within-run/*.txt overlap: each event once
    events = audit.evidence.events
    assert events.height == events.select("entity_id", "message", "time").unique().height


@pytest.mark.parametrize("truth_path", EXPORT_CAPTURES, ids=capture_id)
def test_ps_json_alone(truth_path):
    truth = load_truth(truth_path)
    report = open_sources([_ps_json(truth_path.parent)]).report
    codes = {lim.code for lim in report.limitations}
    assert {"ps_json_latest_submission_only", "api_fields_not_exposed"} <= codes
    assert "api_runs_without_events" in codes
    if truth_path.parent.name not in PS_UNDECIDABLE:
        _check_verdicts(report, truth)
        return
    # cannot decide: no false finding, an honest verdict, and the limitation says why
    assert found_victims(report) <= expected_victims(truth)
    assert report.findings == []
    (verdict,) = report.runs
    assert verdict.verdict == "inconclusive", verdict.why
    assert "health cannot be decided" in verdict.why
    unexposed = next(lim for lim in report.limitations if lim.code == "api_fields_not_exposed")
    assert "without probes and without events" in unexposed.message


@pytest.mark.parametrize("truth_path", EXPORT_CAPTURES, ids=capture_id)
@pytest.mark.parametrize("order", ["api-first", "db-first"])
def test_api_with_database_sees_each_event_once(truth_path, order):
    capture = truth_path.parent
    paths = [capture / "api", capture / "server.db"]
    audit = open_sources(paths if order == "api-first" else paths[::-1])
    _check_verdicts(audit.report, load_truth(truth_path))
    db_only = open_sources([capture / "server.db"])
    assert audit.evidence.events.height == db_only.evidence.events.height
    assert audit.evidence.jobs.height == db_only.evidence.jobs.height
    assert audit.evidence.runs.height == db_only.evidence.runs.height
    counts = _evidence_counts(audit.report)
    assert all(count == 1 for count in counts.values()), counts
    assert bool(counts) == bool(expected_victims(load_truth(truth_path)))
    # each event keeps both provenances: the events table and the API listings
    for provenance in audit.evidence.events["provenance"].to_list():
        assert any(p.startswith("events:") for p in provenance)
        assert any("#/" in p for p in provenance)


@pytest.mark.parametrize("truth_path", EXPORT_CAPTURES, ids=capture_id)
def test_whole_capture_folder_gives_truth(truth_path):
    """server.db + tables/ + logs/ + api/ + cli/: the same runs, jobs and events many times."""
    truth = load_truth(truth_path)
    report = open_sources([truth_path.parent]).report
    _check_verdicts(report, truth)
    victims = [v.job_id for f in report.findings for v in f.victims]
    assert len(victims) == len(set(victims)) == len(expected_victims(truth))
    kinds = {i.kind.split(" (")[0] for i in report.inputs}
    assert {"sqlite", "table-export", "api-export"} <= kinds
    unrecognised = {Path(i.path).name for i in report.inputs if i.kind == "unrecognised"}
    assert {"manifest.json", "projects_list.json", "truth.json"} <= unrecognised


def test_api_json_adds_no_event_to_a_whole_capture():
    folder = CAPTURES / "v0.22.5" / "multi-replica-crash"
    rest = [folder / name for name in ("server.db", "tables", "cli")]
    with_api = open_sources([*rest, folder / "api"]).evidence.events.height
    assert with_api == open_sources(rest).evidence.events.height
    assert with_api == open_sources([folder / "server.db"]).evidence.events.height


@pytest.mark.parametrize("truth_path", EXPORT_CAPTURES, ids=capture_id)
def test_api_files_met_one_by_one_give_truth(truth_path):
    """The folder recursion meets files one by one when the folder is not an export folder:
    the overlap between pages is then collapsed by the combine step."""
    files = [
        p
        for p in sorted((truth_path.parent / "api").rglob("*.json"))
        if SOURCE.sniff(p) and classify(p) != "server info"
    ]
    report = open_sources(files).report
    assert found_victims(report) == expected_victims(load_truth(truth_path))


def test_api_rows_equal_database_rows():
    """Same ids, same values: what lets the combine step keep one row per run, job, event."""
    capture = CAPTURES / "v0.22.5" / "multi-replica-crash"
    (api,) = load_path(capture / "api", LoadContext("s"))
    (db,) = load_path(capture / "server.db", LoadContext("s"))
    job_columns = [
        "run_id",
        "job_id",
        "job_name",
        "replica_num",
        "job_num",
        "submission_num",
        "deployment_num",
        "status",
        "termination_reason",
        "termination_reason_message",
        "exit_status",
        "submitted_at",
        "last_processed_at",
        "has_provisioning_data",
        "price",
        "replica_group",
        "probe_count",
        "probe_rows",
        "probes_below_ready_after",
        "min_probe_streak",
        "spec_fingerprint",
    ]
    assert (
        api.jobs.select(job_columns)
        .sort("job_id")
        .equals(db.jobs.select(job_columns).sort("job_id"))
    )
    # The placement spec is the same JSON, not the same text (the database's is assembled
    # from JSON path matches)
    run_columns = [c for c in api.runs.columns if c not in ("provenance", "placement_spec")]
    assert api.runs.select(run_columns).equals(db.runs.select(run_columns))
    assert [json.loads(s) for s in api.runs["placement_spec"]] == [
        json.loads(s) for s in db.runs["placement_spec"]
    ]
    event_columns = ["entity_type", "entity_id", "run_id", "time", "message", "actor", "kind"]
    assert (
        api.events.select(event_columns)
        .sort(event_columns)
        .equals(db.events.select(event_columns).sort(event_columns))
    )
    assert api.jobs["ready"].is_null().all()  # not exposed: unknown, never false
    assert set(api.jobs["deployment_basis"]) == {"table"}


def test_unexposed_fields_limitation_for_api_only_audit():
    report = open_sources([CAPTURES / "v0.22.5" / "seed" / "api"]).report
    by_code = {lim.code: lim.message for lim in report.limitations}
    for field in ("ready", "registered", "graceful_termination_attempts", "remove_at"):
        assert field in by_code["api_fields_not_exposed"]
    assert "success_streak" in by_code["api_fields_not_exposed"]
    assert "in-place" in by_code["api_deployment_is_current"]
    assert "api_runs_without_events" not in by_code  # the events pages are there


def test_runs_without_events_say_what_only_events_show():
    run_get = next((CAPTURES / "v0.22.5" / "seed" / "api" / "runs_get").rglob("*.json"))
    report = open_sources([run_get]).report
    message = next(
        lim.message for lim in report.limitations if lim.code == "api_runs_without_events"
    )
    assert "culprit failure -> run TERMINATING -> victim stopped" in message


# --- recognition ---------------------------------------------------------------------------


def test_recognised_by_content_not_by_name(tmp_path):
    seed = CAPTURES / "v0.22.5" / "seed"
    page = tmp_path / "evidence-1.bin"
    shutil.copyfile(seed / "api" / "runs_list" / "acme" / "page-001.json", page)
    events = tmp_path / "evidence-2.bin"
    shutil.copyfile(seed / "api" / "events_list" / "all" / "page-001.json", events)
    text = tmp_path / "evidence-3.bin"
    shutil.copyfile(seed / "cli" / "acme" / "event-since.txt", text)
    report = open_sources([page, events, text]).report
    assert [i.kind for i in report.inputs] == [
        "api-export (runs list page)",
        "api-export (events list page)",
        f"api-export ({EVENT_TEXT})",
    ]
    assert found_victims(report) == expected_victims(load_truth(seed / "truth.json"))


@pytest.mark.parametrize("name", ["manifest.json", "projects_list.json"])
def test_other_api_json_is_not_claimed(name):
    path = CAPTURES / "v0.22.5" / "seed" / "api" / name
    assert not SOURCE.sniff(path)
    with pytest.raises(AuditInputError, match="not a recognised input"):
        open_sources([path])


def test_server_info_gives_the_version():
    path = CAPTURES / "v0.22.5" / "seed" / "api" / "server_get_info.json"
    report = open_sources([path]).report
    assert report.inputs[0].server_version == "0.22.5"
    assert report.runs == []


def test_logs_and_databases_are_not_claimed():
    seed = CAPTURES / "v0.22.5" / "seed"
    for path in [seed / "server.db", seed / "tables", seed / "logs", seed, *seed.glob("logs/*")]:
        assert not SOURCE.sniff(path), path
    assert SOURCE.sniff(seed / "api") and SOURCE.sniff(seed / "cli")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_JSON, st.sampled_from([None, 0, 2]), st.booleans(), st.data())
def test_a_json_document_is_never_taken_for_no_json_by_its_head(doc, indent, ascii_only, data):
    """The head of a file that is one JSON document never fails early (``_no_json_early``):
    it would be read whole and found an export otherwise."""
    text = json.dumps([doc], indent=indent, ensure_ascii=ascii_only).encode()
    cut = data.draw(st.integers(0, len(text)))
    assert not _no_json_early(text[:cut])


def test_a_large_file_that_fails_as_json_early_is_not_read_whole(tmp_path, monkeypatch):
    """A log whose lines open with ``[`` (rich) is not read whole to learn it is no JSON; a
    large export is, and what fails only later in it is damaged all the same."""
    rich = tmp_path / "server.log"
    rich.write_text("[00:00:00] INFO     dstack._internal.server.app:1 up\n" * 4_000)
    path, runs = _runs_page(tmp_path)
    path.write_text(json.dumps(runs * 40))
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps(runs * 40)[:-2])
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} read whole"))
    assert classify(rich) is None
    monkeypatch.undo()
    assert classify(path) is not None and classify(cut) == DAMAGED


def test_empty_list_is_not_claimed_alone(tmp_path):
    empty = tmp_path / "page.json"
    empty.write_text("[]")
    assert not SOURCE.sniff(empty)


# --- damaged exports -----------------------------------------------------------------------


def _runs_page(tmp_path: Path) -> tuple[Path, list]:
    source = CAPTURES / "v0.22.5" / "seed" / "api" / "runs_list" / "acme" / "page-001.json"
    return tmp_path / "runs.json", json.loads(source.read_text())


def test_malformed_json_names_the_file(tmp_path):
    path, doc = _runs_page(tmp_path)
    path.write_text(json.dumps(doc)[:5000])  # cut short, as an interrupted download
    with pytest.raises(AuditInputError) as error:
        open_sources([path])
    assert str(path) in str(error.value)
    assert "malformed JSON" in str(error.value)


def test_wrong_type_names_the_file_and_the_field(tmp_path):
    path, doc = _runs_page(tmp_path)
    doc[0]["jobs"][0]["job_submissions"][0]["submission_num"] = "two"
    path.write_text(json.dumps(doc))
    with pytest.raises(AuditInputError) as error:
        open_sources([path])
    text = str(error.value)
    assert str(path) in text
    assert "[0].jobs[0].job_submissions[0].submission_num" in text
    assert "two" not in text  # values are not echoed (they could be secrets)


def test_wrong_type_in_an_event_names_the_file(tmp_path):
    events = json.loads(
        (
            CAPTURES / "v0.22.5" / "seed" / "api" / "events_list" / "all" / "page-001.json"
        ).read_text()
    )
    events[3]["recorded_at"] = "yesterday"
    path = tmp_path / "events.json"
    path.write_text(json.dumps(events))
    with pytest.raises(AuditInputError, match=r"\[3\]\.recorded_at"):
        open_sources([path])


def test_damaged_file_inside_an_export_folder_is_listed_and_the_audit_goes_on(tmp_path):
    """Decision: inside an export folder a damaged file is listed (kind 'unreadable', its
    problem in the notes and a limitation) and the rest is audited; the overlapping pages
    usually still hold what it held."""
    seed = CAPTURES / "v0.22.5" / "seed"
    folder = tmp_path / "api"
    shutil.copytree(seed / "api", folder)
    damaged = next((folder / "runs_get").rglob("*.json"))
    damaged.write_text(damaged.read_text()[:3000])
    wrong = folder / "events_list" / "within_run"
    wrong_page = next(wrong.rglob("page-001.json"))
    doc = json.loads(wrong_page.read_text())
    doc[0]["targets"] = "run web"
    wrong_page.write_text(json.dumps(doc))

    report = open_sources([folder]).report
    assert found_victims(report) == expected_victims(load_truth(seed / "truth.json"))
    unreadable = {i.path: i for i in report.inputs if i.kind == "api-export (unreadable)"}
    assert set(unreadable) == {str(damaged), str(wrong_page)}
    assert "malformed JSON" in unreadable[str(damaged)].notes[0]
    assert "targets" in unreadable[str(wrong_page)].notes[0]
    assert {lim.source for lim in report.limitations if lim.code == "unreadable_export"} == {
        str(damaged),
        str(wrong_page),
    }


def test_damaged_file_met_one_by_one_stops_the_audit_with_its_name(tmp_path):
    """A folder mixing exports with a log is not an export folder: its files are met one by
    one, and a damaged export then stops the audit naming the file (as damaged table exports
    do), rather than silently auditing less."""
    seed = CAPTURES / "v0.22.5" / "seed"
    shutil.copyfile(seed / "logs" / "server-info.standard.log", tmp_path / "server.log")
    shutil.copyfile(seed / "api" / "events_list" / "all" / "page-001.json", tmp_path / "ev.json")
    damaged = tmp_path / "run.json"
    damaged.write_text(next((seed / "api" / "runs_get").rglob("*.json")).read_text()[:3000])
    assert not SOURCE.sniff(tmp_path)
    with pytest.raises(AuditInputError, match="malformed JSON") as error:
        open_sources([tmp_path])
    assert str(damaged) in str(error.value)
    damaged.unlink()
    report = open_sources([tmp_path]).report
    assert {i.kind.split(" (")[0] for i in report.inputs} == {"log", "api-export"}


# --- `dstack event` text -------------------------------------------------------------------


def _shift_text(text: str, hours: int) -> str:
    from datetime import datetime, timedelta

    def shift(line: str) -> str:
        if not line.startswith("[20"):
            return line
        when = datetime.strptime(line[1:20], "%Y-%m-%d %H:%M:%S") + timedelta(hours=hours)
        return f"[{when:%Y-%m-%d %H:%M:%S}]{line[21:]}"

    return "\n".join(shift(line) for line in text.splitlines()) + "\n"


def test_cli_in_another_time_zone_is_aligned(tmp_path):
    """A client in UTC+02:00 prints local times two hours ahead; the runs JSON (UTC) aligns
    them, so the order against the JSON's times stays right."""
    seed = CAPTURES / "v0.22.5" / "seed"
    folder = tmp_path / "cli"
    shutil.copytree(seed / "cli", folder)
    for text in folder.rglob("*.txt"):
        if classify(text) == EVENT_TEXT:
            text.write_text(_shift_text(text.read_text(), 2))
    audit = open_sources([folder])
    assert found_victims(audit.report) == expected_victims(load_truth(seed / "truth.json"))
    aligned = next(lim for lim in audit.report.limitations if lim.code == "cli_event_time_aligned")
    assert "UTC+02:00" in aligned.message
    assert set(audit.evidence.events["time_basis"]) == {"log_local_offset_inferred"}
    update = audit.evidence.events.filter(pl.col("kind") == "run_updated")
    assert update["time"].dt.strftime("%H:%M:%S").to_list() == ["09:08:50"]


def test_cli_text_alone_cannot_be_tied_to_runs():
    text = CAPTURES / "v0.22.5" / "seed" / "cli" / "acme" / "event-since.txt"
    report = open_sources([text]).report
    codes = {lim.code for lim in report.limitations}
    assert {"cli_event_names_unresolved", "cli_event_time_zone_unknown", "no_run_evidence"} <= codes
    assert report.runs == [] and report.findings == []


def test_text_is_superseded_by_the_events_json_in_one_folder(tmp_path):
    seed = CAPTURES / "v0.22.5" / "seed"
    shutil.copytree(seed / "api", tmp_path / "export" / "api")
    shutil.copytree(seed / "cli", tmp_path / "export" / "cli")
    audit = open_sources([tmp_path / "export"])
    assert audit.report.inputs and all(
        i.kind.startswith("api-export") or i.kind == "unrecognised" for i in audit.report.inputs
    )
    events = audit.evidence.events
    assert set(events["time_basis"]) == {"db_utc"}  # every text line matched a JSON event
    assert events.height == open_sources([seed / "server.db"]).evidence.events.height
    assert found_victims(audit.report) == expected_victims(load_truth(seed / "truth.json"))


def test_ps_json_says_when_earlier_submissions_are_missing(tmp_path):
    ps = json.loads(_ps_json(CAPTURES / "v0.22.5" / "seed").read_text())
    ps["runs"][0]["jobs"][1]["job_submissions"][0]["submission_num"] = 1
    path = tmp_path / "ps.json"
    path.write_text(json.dumps(ps))
    report = open_sources([path]).report
    message = next(
        lim.message for lim in report.limitations if lim.code == "ps_json_latest_submission_only"
    )
    assert "1 job(s) there have earlier submissions not exported" in message


# --- fleets and instances (issue 25) -------------------------------------------------------

FLEET_PAGES = DATA / "api_fleets" / "rolling-ok"


def _with_fleet_pages(tmp_path: Path, capture: str = "rolling-ok") -> Path:
    """The capture's API export and the real fleets/instances pages, as one set."""
    folder = tmp_path / "api"
    shutil.copytree(CAPTURES / "v0.22.5" / capture / "api", folder)
    shutil.copytree(FLEET_PAGES, folder, dirs_exist_ok=True)
    return folder


def _instances_page(folder: Path) -> Path:
    return folder / "instances_list" / "globex" / "page-001.json"


def test_fleet_and_instance_pages_are_recognised():
    assert classify(FLEET_PAGES / "fleets_list" / "globex" / "page-001.json") == FLEETS_PAGE
    assert classify(_instances_page(FLEET_PAGES)) == INSTANCES_PAGE


def test_fleets_instances_and_job_links_equal_database_rows(tmp_path):
    """The mapping of the real pages gives the rows the database gives: fleets, instances
    (started_at dated by the instance's events), each job's instance and blocks, each run's
    fleet and placement."""
    (api,) = load_path(_with_fleet_pages(tmp_path), LoadContext("s"))
    (db,) = load_path(CAPTURES / "v0.22.5" / "rolling-ok" / "server.db", LoadContext("s"))
    assert api.has_fleet_tables and db.has_fleet_tables
    for frame in ("fleets", "instances"):
        mine, theirs = (getattr(d, frame).drop("provenance") for d in (api, db))
        assert mine.height == theirs.height > 0
        assert mine.equals(theirs), frame
    linked = ["job_id", "instance_id", "instance_name", "blocks", "fleet_id", "fleet_name"]
    assert api.jobs.select(linked).sort("job_id").equals(db.jobs.select(linked).sort("job_id"))
    assert api.jobs["instance_id"].is_not_null().all()
    placement = ["run_id", "fleet_id", "desired_replica_count"]
    assert api.runs.select(placement).equals(db.runs.select(placement))
    assert [json.loads(s) for s in api.runs["placement_spec"]] == [
        json.loads(s) for s in db.runs["placement_spec"]
    ]
    codes = {lim.code for lim in api.limitations}
    assert not codes & {"api_instance_start_undated", "api_job_instance_unknown"}


def test_an_instance_without_events_starts_at_its_creation_with_a_limitation(tmp_path):
    folder = _with_fleet_pages(tmp_path)
    shutil.rmtree(folder / "events_list")
    (api,) = load_path(folder, LoadContext("s"))
    started = dict(api.instances.select("instance_name", "started_at").iter_rows())
    created = dict(api.instances.select("instance_name", "created_at").iter_rows())
    assert started == created
    message = next(m.message for m in api.limitations if m.code == "api_instance_start_undated")
    assert message.startswith("2 instance(s)")


def test_a_reused_hostname_ties_each_job_to_the_instance_alive_then(tmp_path):
    """The provider gives the terminated cpu-fleet-0's address to a new instance later: the
    job that ran on cpu-fleet-0 still ties to it (the new one was created after the job
    ended); one created while the job ran makes the tie ambiguous: none, and a limitation."""
    folder = _with_fleet_pages(tmp_path)
    page = _instances_page(folder)
    instances = json.loads(page.read_text())
    old = next(i for i in instances if i["name"] == "cpu-fleet-0")
    later = old | {
        "id": "0b0b0b0b-0000-4000-8000-000000000002",
        "name": "cpu-fleet-2",
        "instance_num": 2,
        "status": "idle",
        "created": "2026-11-03T14:16:00.000000Z",
        "finished_at": None,
        "termination_reason": None,
    }
    page.write_text(json.dumps([*instances, later]))
    (api,) = load_path(folder, LoadContext("s"))
    names = dict(api.jobs.select("job_name", "instance_name").iter_rows())
    assert names == {"api-0-0": "cpu-fleet-0", "api-0-1": "cpu-fleet-1"}

    during = later | {"created": "2026-11-03T14:05:00.000000Z"}
    page.write_text(json.dumps([*instances, during]))
    (api,) = load_path(folder, LoadContext("s"))
    names = dict(api.jobs.select("job_name", "instance_name").iter_rows())
    assert names == {"api-0-0": None, "api-0-1": "cpu-fleet-1"}
    message = next(m.message for m in api.limitations if m.code == "api_job_instance_unknown")
    assert message.startswith("1 provisioned job submission(s)")


def test_a_fleet_spec_secret_is_never_shown(tmp_path):
    folder = _with_fleet_pages(tmp_path)
    page = folder / "fleets_list" / "globex" / "page-001.json"
    fleets = json.loads(page.read_text())
    planted = "fleet-env-Zq8sWx31"
    fleets[0]["spec"]["configuration"]["env"] = {"HF_TOKEN": planted}
    page.write_text(json.dumps(fleets))
    audit = open_sources([folder])
    assert planted in audit.evidence.redactor.values
    assert planted not in audit.evidence.redactor.apply(f"env {planted}")


def test_wrong_type_in_an_instance_names_the_file_and_the_field(tmp_path):
    doc = json.loads(_instances_page(FLEET_PAGES).read_text())
    doc[1]["total_blocks"] = "many"
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(AuditInputError, match=r"\[1\]\.total_blocks") as error:
        open_sources([path])
    assert str(path) in str(error.value) and "many" not in str(error.value)


def test_api_export_without_fleet_pages_keeps_saying_so():
    from analyzer.pipeline.exposure import exposure_report

    report = exposure_report(open_sources([CAPTURES / "v0.22.5" / "rolling-ok" / "api"]))
    assert "no_fleet_tables" in {lim.code for lim in report.limitations}
