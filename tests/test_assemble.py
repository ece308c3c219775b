"""The one report assembly (analyzer.pipeline.assemble) and the report's redaction without a
JSON round trip (Redactor.apply_model)."""

from __future__ import annotations

import hashlib
import json
import tracemalloc

import polars as pl
import pytest
from conftest import CAPTURES, plant_env_secret, plant_failure_message

from analyzer.api import audit_in_partitions, audit_partition, open_sources, whole_input_facts
from analyzer.contract import Report
from analyzer.pipeline.assemble import END_BOUND, assemble, merge_reports, run_order
from analyzer.pipeline.partitions import slim_verdict
from analyzer.redact import MASK, Redactor

SECRET = "planted-secret-value-4242"
GITHUB_TOKEN = "ghp_" + "Pl4nt3dT0k3nW1thD1g1ts0123456789abcd"


def _round_trip(redactor: Redactor, report: Report) -> Report:
    """The redaction as it was: dump to JSON, redact every string, validate back."""
    data = redactor.apply_data(json.loads(report.model_dump_json()), controls=True)
    return Report.model_validate_json(json.dumps(data))


@pytest.fixture(scope="module")
def seed_report() -> Report:
    return open_sources([CAPTURES / "v0.22.5" / "multi-replica-crash" / "server.db"]).report


def _planted(report: Report) -> Report:
    """The report with a known secret, a secret shape and control characters in its texts, a
    model list and a dict key."""
    finding = report.findings[0]
    victim = finding.victims[0].model_copy(update={"job_name": f"web {SECRET}\x1b[2J"})
    planted = finding.model_copy(
        update={"victims": [victim, *finding.victims[1:]], "run_name": f"token {GITHUB_TOKEN}"}
    )
    models = [
        m.model_copy(update={"parameters": {**m.parameters, f"k-{SECRET}": SECRET}})
        for m in report.counterfactual_models
    ]
    return report.model_copy(
        update={"findings": [planted, *report.findings[1:]], "counterfactual_models": models}
    )


def test_model_redaction_equals_the_json_round_trip(seed_report):
    redactor = Redactor()
    redactor.add([SECRET])
    report = _planted(seed_report)
    redacted = redactor.apply_model(report, controls=True)
    assert redacted == _round_trip(redactor, report)
    assert redacted.model_dump_json() == _round_trip(redactor, report).model_dump_json()
    text = redacted.model_dump_json()
    assert SECRET not in text and GITHUB_TOKEN not in text and "\\u001b" not in text
    assert MASK in redacted.findings[0].victims[0].job_name
    assert report.findings[0].victims[0].job_name.startswith("web planted")  # not in place


def test_model_redaction_keeps_untouched_parts_as_they_were(seed_report):
    redactor = Redactor()
    redactor.add([SECRET])
    report = _planted(seed_report)
    redacted = redactor.apply_model(report, controls=True)
    assert redacted.runs is report.runs  # nothing to mask there: not copied
    assert redacted.findings[1:] == report.findings[1:]
    assert redactor.apply_model(seed_report, controls=True) is seed_report


def test_merging_one_report_gives_it_back(seed_report):
    assert merge_reports([seed_report]).model_dump_json() == seed_report.model_dump_json()


def test_partitions_merge_into_the_whole_report_byte_for_byte():
    sources = [CAPTURES / "v0.22.5" / s / "server.db" for s in ("seed", "multi-replica-crash")]
    whole = open_sources(sources).report.model_dump(exclude={"inputs"})
    merged = audit_in_partitions(sources, 2).model_dump(exclude={"inputs"})
    assert json.dumps(merged, default=str) == json.dumps(whole, default=str)


def test_a_secret_one_partition_knows_is_masked_in_every_partition(tmp_path):
    """A token in one server's job spec, repeated in another server's termination message that
    another partition reads: one process masks it in both, and so does the merge."""
    secret = "hf_PlantedAcrossPartitions_4242"
    seed, crash = tmp_path / "seed" / "server.db", tmp_path / "crash" / "server.db"
    for db, capture in ((seed, "seed"), (crash, "multi-replica-crash")):
        db.parent.mkdir()
        db.write_bytes((CAPTURES / "v0.22.5" / capture / "server.db").read_bytes())
    plant_env_secret(seed, secret)
    plant_failure_message(crash, f"exited: token {secret} rejected")
    whole = open_sources([seed, crash]).report.model_dump_json()
    assert secret not in whole and "token *** rejected" in whole
    assert audit_in_partitions([seed, crash], 2).model_dump_json() == whole
    merged = audit_in_partitions([seed, crash], 4).model_dump_json()  # the token read apart
    assert secret not in merged and "token *** rejected" in merged


def test_limitations_once_and_the_end_bounds_last(seed_report):
    bound = next(lim for lim in seed_report.limitations if lim.code == END_BOUND)
    others = [lim for lim in seed_report.limitations if lim.code != END_BOUND]
    report = assemble(
        inputs=seed_report.inputs,
        limitations=[bound, *others, *others],
        verdicts=reversed(seed_report.runs),
        findings=reversed(seed_report.findings),
        end_of_evidence=seed_report.end_of_evidence,
    )
    assert report.limitations == seed_report.limitations
    assert report.runs == seed_report.runs and report.findings == seed_report.findings
    assert report.summary == seed_report.summary


def test_partitions_give_the_capacity_foresight_of_one_process(tmp_path):
    """A fleet's instances are held by runs of every partition: a partition alone would call an
    idle-looking instance `unknown` ("others may hold it"); merged, each finding's foresight
    is the one-process answer, byte for byte."""
    from analyzer.synth import synthesize

    synthesize(tmp_path / "fleet", 200, seed=3)
    db = tmp_path / "fleet" / "server.db"
    whole = open_sources([db]).report
    merged = audit_in_partitions([db], 3)
    foresights = [f.capacity_foresight for f in whole.findings if f.capacity_foresight]
    assert {f.surge_capacity for f in foresights} >= {"none", "available"}
    assert merged.model_dump_json() == whole.model_dump_json()


def test_partitions_read_the_whole_database_once_and_a_changed_one_again(tmp_path):
    """What every partition reads of a whole database (its hash, its runs' services, its
    latest times, the tables read whole) is learnt once; a partition given those facts reads
    none of it again, and a database changed since is read again, not trusted."""
    import shutil
    import sqlite3

    db = tmp_path / "server.db"
    shutil.copyfile(CAPTURES / "v0.22.5" / "multi-replica-crash" / "server.db", db)
    shared = whole_input_facts([db])
    learnt = len(shared._facts)
    assert learnt >= 4  # hash, runs by service, latest, the whole tables
    # the hash, taken on a thread beside the tables' read, is in once the learning returns
    assert shared.known("sha256", db) == hashlib.sha256(db.read_bytes()).hexdigest()
    first = audit_partition([db], 0, 2, {}, shared)
    assert len(shared._facts) == learnt
    assert first.report.inputs[0].sha256 == shared.known("sha256", db)
    with sqlite3.connect(db) as connection:
        connection.execute("UPDATE projects SET name = name || '-renamed'")
    again = audit_partition([db], 0, 2, {}, shared)
    assert len(shared._facts) > learnt
    assert first.report.inputs[0].sha256 != again.report.inputs[0].sha256
    assert audit_partition([db], 0, 2, {}).report.model_dump_json() == (
        again.report.model_dump_json()
    )


def test_the_guard_walks_a_report_holding_a_known_value_or_a_hidden_character(seed_report):
    """Audit.report's guard (Redactor.guard_model): a known value in a text built from several
    masked ones, or a control character a frame kept, and the report is walked as before."""
    redactor = Redactor()
    redactor.add([SECRET])
    finding = seed_report.findings[0]
    for job_name in (
        f"web-{SECRET[:9]}" + SECRET[9:],
        "web\x1b[2J",
        "web\u202e0",
        "web\r",
        "web\x7f",
    ):
        victim = finding.victims[0].model_copy(update={"job_name": job_name})
        report = seed_report.model_copy(
            update={"findings": [finding.model_copy(update={"victims": [victim]})]}
        )
        guarded = redactor.guard_model(report)
        assert guarded == redactor.apply_model(report, controls=True), job_name
        assert guarded.findings[0].victims[0].job_name != job_name


def test_the_guard_leaves_a_report_masked_at_the_source_as_it_is(seed_report):
    redactor = Redactor()
    redactor.add([SECRET, "debug"])
    assert redactor.guard_model(seed_report) is seed_report


def test_each_chunk_of_the_merges_foresight_reads_only_its_projects_facts(tmp_path, monkeypatch):
    """The merge works the foresight out a chunk of findings at a time, each over the facts
    that can change its answer (foresight.facts_of): a project's findings read fewer jobs,
    instances and fleets than the whole and get the same answers; with chunks of one
    finding the merged report is still the one process's, byte for byte."""
    from analyzer.pipeline import partitions
    from analyzer.pipeline.exposure import frames_of
    from analyzer.pipeline.foresight import facts_of, foresight, wanted_findings
    from analyzer.synth import synthesize

    synthesize(tmp_path / "fleet", 200, seed=3)
    db = tmp_path / "fleet" / "server.db"
    audit = open_sources([db])
    whole = audit.report
    frames = frames_of(audit)
    projects: dict[str | None, list] = {}
    for finding in wanted_findings(whole.findings):
        projects.setdefault(finding.project, []).append(finding)
    assert len(projects) > 1
    for findings in projects.values():
        facts = facts_of(frames, findings)
        assert facts.submissions.height < frames.submissions.height
        assert facts.instances.height < frames.instances.height
        assert facts.fleets.height < frames.fleets.height
        alone = foresight(facts, findings, audit.deployments)
        assert alone == foresight(frames, findings, audit.deployments)
        assert any(f.capacity_foresight for f in alone)
    monkeypatch.setattr(partitions, "FORESIGHT_CHUNK", 1)
    merged = audit_in_partitions([db], 3)
    assert merged.model_dump_json() == whole.model_dump_json()


def test_a_run_of_no_project_is_in_every_chunks_facts(tmp_path):
    """A run the tables give no project is kept in the facts of every chunk of the merge's
    foresight (foresight.facts_of), whether its rows are picked by texts or by the integer
    keys a merge finds once (foresight.row_keys): its refusal is one of no known project."""
    from dataclasses import replace

    from analyzer.pipeline.exposure import frames_of
    from analyzer.pipeline.foresight import facts_of, row_keys, wanted_findings
    from analyzer.synth import synthesize

    synthesize(tmp_path / "fleet", 200, seed=3)
    audit = open_sources([tmp_path / "fleet" / "server.db"])
    frames = frames_of(audit)
    projects: dict[str | None, list] = {}
    for finding in wanted_findings(audit.report.findings):
        projects.setdefault(finding.project, []).append(finding)
    asked = {f.run_id for f in projects[next(iter(projects))]}
    loose = frames.runs.filter(~pl.col("run_id").is_in(sorted(asked)))["run_id"][0]
    no_project = pl.when(pl.col("run_id") == loose).then(None).otherwise(pl.col("project"))
    frames = replace(frames, runs=frames.runs.with_columns(no_project.alias("project")))
    keys = row_keys(frames)
    for findings in projects.values():
        for given in (None, keys):
            assert loose in facts_of(frames, findings, given).runs["run_id"].to_list()


def test_the_merge_holds_a_run_verdict_slim_and_merges_as_with_whole_ones(seed_report):
    """What the merge keeps of each run verdict (partitions.slim_verdict) until it writes the
    report: the report's order, counts and summary as with the whole verdicts, in less than half
    the memory of their copies (100k runs: the merge held 1.5 KB a run)."""
    verdicts = [
        v.model_copy(update={"run_id": f"{v.run_id}-{n}", "in_progress": n % 3 == 0})
        for n in range(300)
        for v in seed_report.runs
    ]
    whole = seed_report.model_copy(update={"runs": verdicts, "findings": []})
    tracemalloc.start()
    try:
        slim = [slim_verdict(v) for v in verdicts]
        held = tracemalloc.get_traced_memory()[0]
        copies = [v.model_copy() for v in verdicts]
        copied = tracemalloc.get_traced_memory()[0] - held
    finally:
        tracemalloc.stop()
    assert len(copies) == len(slim) and held * 2 < copied
    merged = merge_reports([whole.model_copy(update={"runs": slim})])
    assert merged.summary == merge_reports([whole]).summary
    assert [run_order(v) for v in merged.runs] == [
        run_order(v) for v in merge_reports([whole]).runs
    ]
    assert merged.summary.runs_in_progress == 100 * len(seed_report.runs)


def test_a_partition_reports_its_summary_counts_alone():
    """A partition's summary carries its counts alone: the merge works the figures out once,
    over every partition's findings (merge_reports), so a partition's own would be thrown
    away."""
    db = CAPTURES / "v0.22.5" / "seed" / "server.db"
    parts = [audit_partition([db], index, 2, {}).report for index in range(2)]
    with_findings = [part for part in parts if part.findings]
    assert with_findings  # the seed's incident is in one of them
    for part in with_findings:
        assert part.summary.findings == len(part.findings)
        assert part.summary.by_server == []
        assert part.summary.healthy_replica_seconds_lost == 0.0
    whole = open_sources([db]).report.summary
    assert whole.by_server and whole.healthy_replica_seconds_lost > 0
