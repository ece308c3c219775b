"""Every real capture, from its database and from its table exports, gives exactly the victims
of its truth.json, in the right category, with the right culprits and run verdict."""

from __future__ import annotations

import pytest
from conftest import CAPTURES, capture_id, expected_victims, found_victims, load_truth, truth_files

from analyzer import open_sources

SQLITE_CAPTURES = truth_files()
# postgres/<scenario>/tables are psql CSV exports of real PostgreSQL databases.
PSQL_EXPORTS = [p for p in truth_files("postgres/*/truth.json") if (p.parent / "tables").is_dir()]


def test_all_capture_sets_present():
    versions = {p.parent.parent.name for p in SQLITE_CAPTURES}
    assert versions == {"v0.19", "v0.20", "v0.22.5"}
    assert len(SQLITE_CAPTURES) >= 17
    assert len(PSQL_EXPORTS) >= 2


def _check(report, truth):
    assert found_victims(report) == expected_victims(truth)
    verdicts = {v.run_id: v for v in report.runs}
    for run in truth["runs"]:
        verdict = verdicts[run["run_id"]]
        if run["expected_flag"]:
            assert verdict.verdict == "collateral_termination"
        elif run["expected_flag_broad"]:
            assert verdict.verdict == "same_deployment_collateral"
        else:
            assert verdict.verdict in ("no_incident", "no_healthy_victim"), verdict.why
        flagged = [f for f in report.findings if f.run_id == run["run_id"]]
        if run["expected_flag_broad"]:
            culprits = {c.job_id for f in flagged for c in f.culprits}
            assert culprits == {c["job_id"] for c in run["culprit"]}
            for finding in flagged:
                assert finding.run_termination_reason == run["run_termination_reason"]
                assert finding.confidence == "confirmed"
        else:
            assert flagged == []
    assert len(report.runs) == len(truth["runs"])


@pytest.mark.parametrize("truth_path", SQLITE_CAPTURES, ids=capture_id)
@pytest.mark.parametrize("form", ["server.db", "tables"])
def test_capture_gives_truth(truth_path, form):
    truth = load_truth(truth_path)
    report = open_sources([truth_path.parent / form]).report
    _check(report, truth)


@pytest.mark.parametrize("truth_path", PSQL_EXPORTS, ids=capture_id)
def test_psql_exports_give_truth(truth_path):
    truth = load_truth(truth_path)
    report = open_sources([truth_path.parent / "tables"]).report
    _check(report, truth)


@pytest.mark.parametrize("truth_path", SQLITE_CAPTURES, ids=capture_id)
def test_database_and_exports_agree(truth_path):
    """The same incident read from server.db and from its CSV exports is the same report."""
    from_db = open_sources([truth_path.parent / "server.db"]).report
    from_csv = open_sources([truth_path.parent / "tables"]).report
    assert from_db.model_dump(exclude={"inputs", "limitations"}) == from_csv.model_dump(
        exclude={"inputs", "limitations"}
    )


def test_whole_capture_folder_counts_each_record_once():
    """A capture folder holds server.db and tables/: the same rows twice, audited once."""
    folder = CAPTURES / "v0.22.5" / "multi-replica-crash"
    report = open_sources([folder]).report
    assert report.summary.runs == 1
    assert report.summary.victims == 3
    kinds = {i.kind for i in report.inputs}
    assert {"sqlite", "table-export"} <= kinds


def test_seed_finding_evidence_chain_in_time_order():
    report = open_sources([CAPTURES / "v0.22.5" / "seed" / "server.db"]).report
    (finding,) = report.findings
    texts = [e.text for e in finding.evidence]
    order = [
        "Run updated. Deployment: 1",
        "FAILED_TO_START_DUE_TO_NO_CAPACITY (Fleet is at capacity)",
        "Run status changed RUNNING -> TERMINATING. Termination reason: JOB_FAILED",
        "Job status changed RUNNING -> TERMINATING. Termination reason: TERMINATED_BY_SERVER",
        "Run status changed TERMINATING -> FAILED",
    ]
    positions = [next(i for i, t in enumerate(texts) if marker in t) for marker in order]
    assert positions == sorted(positions)
    timed = [e.time for e in finding.evidence if e.time is not None]
    assert timed == sorted(timed)
    assert all(e.source.startswith(("events:", "jobs:", "runs:")) for e in finding.evidence)
    assert finding.updated_by == "alice"
    assert finding.changed_fields == "configuration.commands"
    victim = finding.victims[0]
    assert victim.health_proof == "jobs.ready = 1"
    assert victim.healthy_since is not None and victim.terminated_at > victim.healthy_since


@pytest.mark.parametrize(
    ("capture", "proof"),
    [
        ("v0.19/seed", "RUNNING when the run was terminated"),
        ("v0.19/multi-replica-crash", "success_streak >= its ready_after"),
        ("v0.20/multi-replica-crash", "registered to receive requests' and every probe"),
        ("v0.22.5/multi-replica-crash", "jobs.ready = 1 and every probe"),
    ],
)
def test_health_proof_follows_what_each_version_records(capture, proof):
    report = open_sources([CAPTURES / capture / "server.db"]).report
    proofs = {v.health_proof for f in report.findings for v in f.victims}
    assert len(proofs) == 1
    assert proof in proofs.pop()


def test_unhealthy_old_replica_is_not_a_victim():
    report = open_sources([CAPTURES / "v0.22.5" / "unhealthy-old" / "server.db"]).report
    (verdict,) = report.runs
    assert verdict.verdict == "no_healthy_victim"
    assert report.findings == []


def test_tables_only_version_says_what_it_cannot_order():
    report = open_sources([CAPTURES / "v0.19" / "seed" / "server.db"]).report
    codes = {lim.code for lim in report.limitations}
    assert "no_events_table" in codes
    (finding,) = report.findings
    assert any("no event records when the update was applied" in e.text for e in finding.evidence)


def test_each_source_says_its_own_limitations():
    """A database and a table export of an old release both lack the events table and
    jobs.ready: each says so, or the report would imply the second source had them (and one
    process would say less than a --workers audit of the same inputs, which keys by source)."""
    folder = CAPTURES / "v0.19" / "seed"
    report = open_sources([folder / "server.db", folder / "tables"]).report
    said = {(lim.code, lim.source) for lim in report.limitations}
    for source in (folder / "server.db", folder / "tables"):
        assert ("no_events_table", str(source)) in said
        assert ("missing_columns", str(source)) in said
