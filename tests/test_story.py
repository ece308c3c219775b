"""The run's story (pipeline/story.py): told once from the pipeline's frames, and the one thing
the text timeline, the swimlane and the HTML narrative draw from. Real captures: the seed
capture whole, and its rich log alone (times of day, no date)."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import pytest
from conftest import CAPTURES

from analyzer import open_sources
from analyzer.contract import Culprit, Finding, Victim
from analyzer.pipeline import story as story_module
from analyzer.pipeline.story import is_pseudo_date, job_roles
from analyzer.render.text import render_timeline, timeline_text

SEED = CAPTURES / "v0.22.5" / "seed"


@pytest.fixture(scope="module")
def seed():
    return open_sources(SEED)


@pytest.fixture(scope="module")
def seed_story(seed):
    return seed.story("acme/web")


def test_seed_story_names_the_victim_and_the_culprit(seed_story):
    by_name = {
        row["job_name"]: seed_story.roles.get(row["job_id"])
        for row in seed_story.submissions.iter_rows(named=True)
    }
    assert by_name["web-0-0"].role == "victim"
    assert by_name["web-0-0"].detail == "VICTIM (collateral_termination)"
    assert by_name["web-0-1"].role == "culprit"
    assert set(seed_story.marks.values()) == {"victim", "culprit"}
    assert seed_story.verdict == "collateral_termination"
    assert len(seed_story.findings) == 1


def test_seed_story_is_on_the_dated_clock(seed_story):
    assert not seed_story.dateless
    finding = seed_story.findings[0]
    assert seed_story.end_of_evidence == finding.impact.end_of_evidence
    # the status path of each submission, in time order
    victim = next(j for j, r in seed_story.roles.items() if r.role == "victim")
    path = seed_story.status_events[victim]
    assert [e["new_status"] for e in path][-1] == "terminated"
    assert [e["time"] for e in path] == sorted(e["time"] for e in path)
    assert all(not is_pseudo_date(t) for t, _ in seed_story.capacity)
    assert seed_story.terminating_at()  # the run went TERMINATING, seen in the evidence


def test_seed_story_healthy_intervals_are_the_victims(seed_story):
    victim = seed_story.findings[0].victims[0]
    healthy = seed_story.healthy[victim.job_id]
    assert healthy.since == victim.healthy_since
    assert healthy.until == victim.terminated_at
    assert healthy.proof == "ready_flag"  # jobs.ready = 1 (dstack >= 0.21.1)
    culprit = seed_story.findings[0].culprits[0]
    assert culprit.job_id not in seed_story.healthy  # it never ran
    assert seed_story.role_of(culprit.job_id) == "culprit"
    assert seed_story.role_of("no-such-job") == "other"


def test_seed_story_outage_is_the_findings(seed_story):
    finding = seed_story.findings[0]
    outage = seed_story.outage(finding)
    assert outage is not None
    assert outage.start == finding.impact.outage_start
    assert outage.recovered == finding.impact.recovered


def test_rich_log_alone_is_a_story_of_times_of_day():
    audit = open_sources(SEED / "logs" / "server-info.rich.log")
    told = audit.story(audit.runs["run_id"][0])
    assert told.dateless
    assert told.dropped_dateless == 0
    assert told.usable_events.height > 0
    assert all(is_pseudo_date(t) for t in told.usable_events["time"])
    text = timeline_text(told)
    assert "1970" not in text
    assert "(date unknown)" in text


def test_the_cli_call_tells_the_same_story(seed, seed_story):
    """render_timeline (the frames of one run, as the CLI passes them) == the story told."""
    key = (pl.col("server") == seed_story.run["server"]) & (
        pl.col("run_id") == seed_story.run["run_id"]
    )
    from_frames = render_timeline(
        seed_story.run,
        seed_story.verdict,
        seed.deployments.filter(key),
        seed.submissions.filter(key),
        seed.events.filter(key),
        findings=seed_story.findings,
        width=5000,
    )
    assert from_frames == timeline_text(seed_story, width=5000)
    assert "** VICTIM (collateral_termination) **" in from_frames


def _finding(victims, culprits) -> Finding:
    return Finding.model_validate(
        {
            "server": "default",
            "run_id": "r",
            "run_name": "web",
            "project": "p",
            "category": "collateral_termination",
            "confidence": "confirmed",
            "victims": victims,
            "culprits": culprits,
            "run_termination_reason": "job_failed",
            "evidence": [],
        }
    )


def test_one_role_per_job_and_an_unstopped_victim_says_what_is_expected():
    at = datetime(2026, 11, 2, 9, 9, tzinfo=UTC)
    victim = Victim(
        rule="collateral_termination",
        job_id="a",
        job_name="web-0-0",
        replica_num=0,
        deployment_num=0,
        healthy_since=at,
        terminated_at=None,
        health_proof="ready_flag",
        stopped=False,
        expected_termination_reason="terminated_by_server",
    )
    culprit = Culprit(
        job_id="b",
        job_name="web-1-0",
        replica_num=1,
        deployment_num=1,
        termination_reason="container_exited_with_error",
        termination_reason_message=None,
        failed_at=at,
    )
    both = culprit.model_copy(update={"job_id": "a"})
    roles = job_roles([_finding([victim], [culprit, both])])
    assert roles["b"].role == "culprit"
    assert roles["a"].role == "victim"  # told as the victim it was
    assert roles["a"].detail == (
        "VICTIM (collateral_termination), not yet stopped: expected terminated_by_server"
    )


def test_the_story_imports_no_renderer():
    tree = ast.parse(Path(story_module.__file__).read_text())
    imported = {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    } | {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    assert not any(
        name.startswith(("analyzer.render", "matplotlib", "analyzer.api")) for name in imported
    )


def test_rich_log_alone_narrative_and_swimlane_share_the_end_of_the_evidence():
    """A log of times of day ends on its own clock: the narrative says what the swimlane
    draws (no healthy replica until the last line of the log), never 'not known'."""
    from analyzer.render.narrative import narrative
    from analyzer.render.plots.layout import run_view

    audit = open_sources(SEED / "logs" / "server-info.rich.log")
    finding = audit.findings[0]
    told = audit.story(finding.run_id)
    assert told.end_of_evidence is not None and is_pseudo_date(told.end_of_evidence)
    said = narrative(audit, finding)
    assert "did not serve again before the end of the evidence (09:09:29)" in said
    view = run_view(audit, finding.run_id, None)
    assert [o[1] for o in view.outages] == [told.end_of_evidence]


def test_the_story_names_the_reason_the_run_failed_with_not_the_stop_written_over_it():
    # stop-after-kill (dstack 0.22.5): the run went TERMINATING with JOB_FAILED, then the
    # user's stop overwrote runs.termination_reason with STOPPED_BY_USER (stop_runs)
    from analyzer.render.narrative import narrative

    audit = open_sources([CAPTURES / "v0.22.5" / "stop-after-kill" / "server.db"])
    (finding,) = audit.report.findings
    assert finding.run_termination_reason == "stopped_by_user"
    story = narrative(audit, finding)
    assert "dstack failed the whole run (JOB_FAILED)" in story
    assert "STOPPED_BY_USER" not in story
