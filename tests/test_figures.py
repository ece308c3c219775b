"""Every figure as exactly as the evidence knows it (issue 22 §2, §3): known, a lower bound or
unknown in the JSON and in every renderer; incidents counted per run; the same incident from
each source gives an outage that is the same or says why it is a lower bound; counterfactuals
told from the run's own sequence. Cases are the captures and copies of their real rows."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from click.testing import CliRunner
from conftest import CAPTURES, execute, without_update
from test_verdicts import _old_replica_crashes_during_rollout, _seed_mid_cascade

from analyzer import open_sources, plot_fleet, plot_run
from analyzer.cli import main
from analyzer.pipeline.counterfactual import FailedReplica, RolloutFacts, evaluate_all
from analyzer.render.format import cost_text, fmt_money, outage_text, replica_time_text
from analyzer.render.html import render_html
from analyzer.render.markdown import render_markdown
from analyzer.render.narrative import narrative
from analyzer.render.screen import render_table

SEED = CAPTURES / "v0.22.5" / "seed"
CRASH = CAPTURES / "v0.22.5" / "multi-replica-crash"
SOURCES = {
    "database": [SEED / "server.db"],
    "api": [SEED / "api"],
    "event text": [SEED / "cli"],
    "standard log": [SEED / "logs" / "server-info.standard.log"],
    "json log": [SEED / "logs" / "server-info.json.log"],
    "rich log": [SEED / "logs" / "server-info.rich.log"],
}


def _texts(fig) -> str:
    parts = []
    for ax in fig.axes:
        parts += [t.get_text() for t in ax.texts] + [ax.get_title(loc="left")]
    parts.append(fig.get_suptitle())
    return "\n".join(parts)


@pytest.fixture(scope="module")
def seed_from():
    return {name: open_sources(paths) for name, paths in SOURCES.items()}


# ---------------------------------------------------------------------------------------------
# The same incident from each source


def test_each_source_gives_the_outage_or_says_why_it_is_a_lower_bound(seed_from):
    """The seed never served again: every dated source's outage is a lower bound to its own
    end of the evidence; the event text's whole seconds and the logs' milliseconds count the
    outage from the end of the victim's recorded second (millisecond), so their outage is a
    lower bound of the API export's, which has the database's microseconds."""
    impacts = {name: audit.report.findings[0].impact for name, audit in seed_from.items()}
    api, text = impacts["api"], impacts["event text"]
    for name in ("database", "api", "event text", "standard log", "json log"):
        impact = impacts[name]
        assert impact.outage_is_lower_bound and not impact.recovered, name
        assert impact.lower_bound_reasons[0].startswith(
            f"not recovered as of the end of the evidence, {impact.end_of_evidence.isoformat()}"
        )
    # the database and the API export: the same stop, each to its own end of the evidence
    db = impacts["database"]
    assert db.outage_start == api.outage_start and db.lower_bound_reasons[1:] == []
    assert db.outage_seconds - api.outage_seconds == pytest.approx(
        (db.end_of_evidence - api.end_of_evidence).total_seconds()
    )
    # `dstack event` text: the stop in whole seconds, counted from the end of that second
    assert text.outage_start == api.outage_start.replace(microsecond=0)
    counted_from = text.outage_start + timedelta(seconds=1)
    assert text.outage_seconds == pytest.approx(
        (text.end_of_evidence - counted_from).total_seconds()
    )
    assert text.lower_bound_reasons[1] == (
        "the last victim's stop is recorded to the second only: the outage is counted from "
        f"{counted_from.isoformat()}, the latest moment that record allows"
    )
    assert text.end_of_evidence == api.end_of_evidence
    assert 0 <= api.outage_seconds - text.outage_seconds < 1
    assert text.per_victim[0].lost_is_lower_bound
    # the logs: milliseconds, the end of the evidence their last line (also milliseconds)
    for name in ("standard log", "json log"):
        log = impacts[name]
        assert "recorded to the millisecond only" in log.lower_bound_reasons[1]
        assert 0 <= api.outage_seconds - log.outage_seconds < 0.002
    # a rich log alone has times of day only: no outage is invented
    rich = impacts["rich log"]
    assert rich.outage_seconds is None and rich.outage_is_lower_bound is False


def test_each_source_prints_its_outage_as_a_lower_bound_everywhere(seed_from):
    for name, audit in seed_from.items():
        report = audit.report
        (finding,) = report.findings
        impact = finding.impact
        table, markdown = render_table(report, width=140), render_markdown(report)
        if impact.outage_seconds is None:
            assert "outage unknown" in table, name
            assert "for unknown" in markdown and "cost unknown" in table
            story = narrative(audit, finding)
            assert "did not serve again before the end of the evidence (09:09:29)" in story
            assert "outage of" not in story
            continue
        shown = outage_text(impact)
        assert shown.startswith("≥ ") and f"outage {shown} (not recovered)" in table, name
        assert f"IMPACT: 1 healthy replica(s) killed in 1 incident(s), outage {shown}," in table
        assert f"for {shown}, not recovered" in markdown
        assert f"| default | 1 | 1 | {shown} |" in markdown
        story = narrative(audit, finding)
        assert "the end of the evidence): an outage of at least " in story, name
        lane = _texts(plot_run(audit, finding.run_id))
        assert f"outage {shown}: not recovered as of the end of the evidence" in lane, name


def test_an_unknown_cost_is_null_and_unknown_never_zero():
    """A log holds no prices: the cost is unknown in the JSON (null, not 0.0) and in words."""
    log = str(SOURCES["standard log"][0])
    result = CliRunner().invoke(main, ["audit", log, "--format", "json"])
    data = json.loads(result.output)
    summary = data["summary"]
    assert summary["lost_cost"] is None and summary["cost_unknown_victims"] == 1
    assert summary["lost_cost_is_lower_bound"] is False
    assert summary["outage_is_lower_bound"] is True and summary["incidents"] == 1
    impact = data["findings"][0]["impact"]
    assert impact["lost_cost"] is None and impact["cost_known_for"] == 0
    assert [g["key"] for g in summary["by_day"]] == ["2026-11-02"]
    assert summary["by_day"][0]["lost_cost"] is None
    table = " ".join(CliRunner().invoke(main, ["audit", log]).output.split())
    assert "cost unknown (until recovery" in table and "$0.0000" not in table
    text = render_html(open_sources([log]))
    assert '<div class="kpi"><b>unknown</b>cost lost</div>' in text
    assert "(price unknown)" in text


def test_a_cost_with_an_unknown_part_sums_the_known_and_counts_the_rest(copy_db):
    """multi-replica-crash with one victim's price gone: the cost is the two known victims'
    (a lower bound: not recovered) plus "(+1 unknown)", in every renderer."""
    db = copy_db("v0.22.5/multi-replica-crash")
    execute(
        db,
        "UPDATE jobs SET job_provisioning_data = json_set(job_provisioning_data, '$.price', "
        "NULL) WHERE job_name = 'svc-0-1'",
    )
    audit = open_sources([db])
    report = audit.report
    (finding,) = report.findings
    impact = finding.impact
    known = [v.lost_cost for v in impact.per_victim if v.lost_cost is not None]
    assert len(known) == 2 and impact.cost_known_for == 2
    assert impact.lost_cost == pytest.approx(sum(known)) and impact.lost_cost_is_lower_bound
    assert report.summary.lost_cost == pytest.approx(sum(known))
    assert report.summary.cost_unknown_victims == 1
    shown = cost_text(impact)
    assert shown.startswith("≥ $") and shown.endswith(" (+1 unknown)")
    assert cost_text(report.summary) == shown
    assert f"cost {shown}" in render_table(report, width=140)
    markdown = render_markdown(report)
    assert f"cost {shown}" in markdown  # parentheses are no markdown: left unescaped
    assert f"cost {shown} (price known for 2 of 3)" in render_html(audit)
    assert "(+1 at a price not known)" in narrative(audit, finding)


def test_by_day_is_dated_whenever_a_time_is(copy_db):
    """A copy taken mid-cascade: the victim has not stopped, so the outage is unknown, but the
    culprit's failure is dated: the incident's day is known."""
    report = open_sources([_seed_mid_cascade(copy_db)]).report
    (finding,) = report.findings
    assert finding.impact.outage_start is None
    (day,) = report.summary.by_day
    assert day.key == finding.culprits[0].failed_at.strftime("%Y-%m-%d") == "2026-11-02"
    assert day.outage_seconds is None and day.outage_unknown_runs == 1
    assert outage_text(day) == "unknown" and outage_text(report.summary) == "unknown"
    table = render_table(report, width=140)
    assert "IMPACT: 1 healthy replica(s) killed in 1 incident(s), outage unknown," in table


# ---------------------------------------------------------------------------------------------
# Incidents per run


def test_a_run_with_findings_of_two_categories_is_one_incident(copy_db):
    db = _old_replica_crashes_during_rollout(copy_db, siblings_scaled_down=False)
    audit = open_sources([db])
    report = audit.report
    summary = report.summary
    assert summary.findings == 2 and summary.incidents == 1 and summary.victims == 3
    for groups in (summary.by_server, summary.by_day, summary.by_failure_class):
        ((group),) = groups
        assert (group.incidents, group.findings, group.victims) == (1, 2, 3)
        assert group.outage_seconds == pytest.approx(summary.outage_seconds)
    lost = sum(f.impact.healthy_replica_seconds_lost for f in report.findings)
    assert summary.healthy_replica_seconds_lost == pytest.approx(lost)
    assert summary.healthy_replica_seconds_lost_is_lower_bound
    table = render_table(report, width=200)
    impact = f"IMPACT: 3 healthy replica(s) killed in 1 incident(s), outage {outage_text(summary)}"
    assert impact in table
    assert f"replica-time lost {replica_time_text(summary)}" in table
    row = f"| default | 1 | 3 | {outage_text(summary)} | {replica_time_text(summary)} |"
    assert row in render_markdown(report)
    assert '<div class="kpi"><b>1</b>incidents</div>' in render_html(audit)
    fleet = plot_fleet(report)
    texts = _texts(fleet)
    assert "1 incident(s), 3 replica(s)" in texts and "incidents: 1 (2 finding(s))" in texts
    (day_axes,) = [ax for ax in fleet.axes if ax.get_gid() == "incidents-per-day"]
    assert [bar.get_height() for bar in day_axes.patches] == [1]


# ---------------------------------------------------------------------------------------------
# Counterfactuals from the run's facts


def test_seed_counterfactuals_follow_the_rollout(seed_from):
    (finding,) = seed_from["database"].report.findings
    kubernetes, breaker = finding.counterfactuals
    assert kubernetes.applies and breaker.applies
    assert kubernetes.declared_failed_at.strftime("%H:%M:%S") == "09:18:50"
    assert "the update at 2026-11-02 09:08:50 UTC surges 1 new pod of deployment 1" in (
        kubernetes.explanation
    )
    assert "stays Pending (unschedulable" in kubernetes.explanation
    assert "ProgressDeadlineExceeded" in kubernetes.explanation
    assert breaker.rolled_back and breaker.declared_failed_at == finding.culprits[0].failed_at
    assert "trips at the failure of deployment 1's task" in breaker.explanation
    for model in (kubernetes, breaker):
        assert model.serving_seconds_kept == finding.impact.healthy_replica_seconds_lost
        assert model.serving_seconds_kept_is_lower_bound


def test_no_update_no_rollout_models_do_not_apply(copy_db):
    """A sibling crash with no update (#2660): no rollout to stall or roll back; both platforms
    replace the crashed replica and keep its three siblings serving."""
    db = without_update(copy_db("v0.22.5/multi-replica-crash"))
    audit = open_sources([db])
    (finding,) = audit.report.findings
    assert finding.category == "same_deployment_collateral"
    assert finding.update_deployment_num == 0  # the run's first submission: no update
    for model in finding.counterfactuals:
        assert not model.applies and not model.rolled_back
        assert model.declared_failed_at is None and model.old_replicas_kept == 3
        assert model.explanation.startswith("no update")
        assert "never became available" not in model.explanation
    kubernetes, breaker = finding.counterfactuals
    assert "crash-loops (its container exits with code 2" in kubernetes.explanation
    assert "never stops healthy pods because another failed" in kubernetes.explanation
    assert "nothing to roll back to" in breaker.explanation
    markdown = render_markdown(audit.report)
    assert markdown.count("does not apply to this sequence") == 2
    assert "does not apply" in render_html(audit)


def test_an_update_applied_in_place_is_no_rollout():
    """scale-up-fails: `replicas: 1 -> 2` bumps the running replica in place; the added one
    cannot be placed: a scale, not a rollout, for either platform."""
    (finding,) = open_sources(
        [CAPTURES / "v0.22.5" / "scale-up-fails" / "server.db"]
    ).report.findings
    for model in finding.counterfactuals:
        assert not model.applies and not model.rolled_back and model.declared_failed_at is None
        assert "reached the running replicas in place" in model.explanation
    assert "stays Pending" in finding.counterfactuals[0].explanation


def test_an_old_replica_failing_trips_no_breaker(copy_db):
    """The culprit is a deployment-0 replica, the victim the ready deployment-1 replica: the
    rollout goes on; the breaker watches the new deployment's tasks only."""
    db = _old_replica_crashes_during_rollout(copy_db, siblings_scaled_down=True)
    (finding,) = open_sources([db]).report.findings
    assert finding.category == "newer_deployment_collateral"
    kubernetes, breaker = finding.counterfactuals
    for model in (kubernetes, breaker):
        assert model.applies and not model.rolled_back and model.declared_failed_at is None
        assert "old deployment 0" in model.explanation
    assert "the rollout goes on" in kubernetes.explanation
    assert "does not trip" in breaker.explanation


def test_new_replicas_available_before_the_failure_move_the_deadline(seed_from):
    """The seed's sequence with one new replica available 30 s before the culprit failed: the
    rollout made progress then, so its deadline runs from that moment; a rollback drains it."""
    (finding,) = seed_from["database"].report.findings
    culprit = finding.culprits[0]
    ready = culprit.failed_at - timedelta(seconds=30)
    facts = RolloutFacts(
        update_deployment=1,
        update_at=culprit.failed_at - timedelta(seconds=60),
        older_running=True,
        culprits=[FailedReplica(1, culprit.failed_at, culprit.termination_reason)],
        new_available=[ready],
        victims=1,
        lost_replica_seconds=10.0,
    )
    kubernetes, breaker = evaluate_all(facts)
    assert kubernetes.declared_failed_at == ready + timedelta(seconds=600)
    assert "1 new pod(s) became available" in kubernetes.explanation
    assert "drained in the rollback" in breaker.explanation
    assert not kubernetes.serving_seconds_kept_is_lower_bound


def test_a_failure_after_the_rollout_completed_is_no_rollout(seed_from):
    """The seed's culprit as if it had failed after every old replica was gone: the update's
    rollout was over, so neither model has a rollout to act on."""
    (finding,) = seed_from["database"].report.findings
    culprit = finding.culprits[0]
    facts = RolloutFacts(
        update_deployment=1,
        update_at=culprit.failed_at - timedelta(hours=1),
        culprits=[FailedReplica(1, culprit.failed_at, "container_exited_with_error", 1)],
        victims=2,
    )
    for model in evaluate_all(facts):
        assert not model.applies and model.declared_failed_at is None and not model.rolled_back
        assert model.explanation.startswith("the update to deployment 1 had completed")
        assert model.old_replicas_kept == 2


def test_a_lower_bound_is_printed_rounded_down():
    assert outage_text(open_sources([SEED / "server.db"]).report.summary) == "≥ 2m57s"
    assert fmt_money(0.00529) == "$0.0053"
    assert re.fullmatch(
        r"≥ \$0\.0052", cost_text(open_sources([SEED / "server.db"]).report.summary)
    )
