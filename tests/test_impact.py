"""Impact, counterfactuals, root cause and fleet summaries, against hand computations made
straight from the capture tables with sqlite3 (independently of the analyzer)."""

from __future__ import annotations

import functools
import json
import operator
import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
from conftest import CAPTURES, execute
from test_own_cases import merge

from analyzer import open_sources
from analyzer.contract import Summary, VictimImpact
from analyzer.pipeline.impact import summarise


def _t(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def _hand(db_path) -> dict:
    """End of evidence, each victim's stop (its RUNNING -> TERMINATING event) and price."""
    with sqlite3.connect(db_path) as db:
        # the latest moment any table shows the server alive (instances and fleets go on
        # being processed after the run ended)
        end = max(
            _t(value)
            for table, column in (
                ("runs", "last_processed_at"),
                ("jobs", "last_processed_at"),
                ("events", "recorded_at"),
                ("instances", "last_processed_at"),
                ("instances", "finished_at"),
                ("instances", "deleted_at"),
                ("fleets", "last_processed_at"),
                ("fleets", "deleted_at"),
            )
            if (value := db.execute(f"SELECT max({column}) FROM {table}").fetchone()[0])
        )
        stops = {}
        for job_id, recorded_at, price in db.execute(
            """SELECT j.id, e.recorded_at, json_extract(j.job_provisioning_data, '$.price')
               FROM jobs j JOIN event_targets t ON t.entity_id = j.id
               JOIN events e ON e.id = t.event_id
               WHERE j.termination_reason = 'TERMINATED_BY_SERVER'
                 AND e.message LIKE 'Job status changed RUNNING -> TERMINATING%'"""
        ):
            stops[job_id] = (_t(recorded_at), price)
        culprit_failure = _t(
            db.execute(
                """SELECT min(e.recorded_at) FROM events e JOIN event_targets t ON t.event_id = e.id
                   JOIN jobs j ON j.id = t.entity_id
                   WHERE j.status = 'FAILED'
                     AND e.message LIKE 'Job status changed % -> TERMINATING%'"""
            ).fetchone()[0]
        )
        update = _t(
            db.execute(
                "SELECT recorded_at FROM events WHERE message LIKE 'Run updated%'"
            ).fetchone()[0]
        )
    return {"end": end, "stops": stops, "culprit_failure": culprit_failure, "update": update}


@pytest.mark.parametrize("capture", ["v0.22.5/seed", "v0.22.5/multi-replica-crash", "v0.20/seed"])
def test_outage_lost_seconds_and_cost_match_hand_computation(capture):
    db = CAPTURES / capture / "server.db"
    hand = _hand(db)
    (finding,) = open_sources([db]).report.findings
    impact = finding.impact
    start = max(stop for stop, _ in hand["stops"].values())
    assert impact.outage_start == start
    assert impact.recovered is False and impact.recovered_at is None
    assert impact.end_of_evidence == hand["end"]
    assert impact.outage_seconds == pytest.approx((hand["end"] - start).total_seconds())
    lost = sum((hand["end"] - stop).total_seconds() for stop, _ in hand["stops"].values())
    assert impact.healthy_replica_seconds_lost == pytest.approx(lost)
    cost = sum(
        price * (hand["end"] - stop).total_seconds() / 3600
        for stop, price in hand["stops"].values()
    )
    assert impact.lost_cost == pytest.approx(cost)
    assert impact.replicas_lost == len(hand["stops"]) == impact.cost_known_for


def test_seed_counterfactual():
    """The rollout would have failed at the culprit's failure (breaker) or after the progress
    deadline (Kubernetes); either way the deployment-0 replica keeps serving to the end."""
    db = CAPTURES / "v0.22.5" / "seed" / "server.db"
    hand = _hand(db)
    (finding,) = open_sources([db]).report.findings
    models = {c.model: c for c in finding.counterfactuals}
    breaker = models["ecs-circuit-breaker-rollback"]
    assert breaker.declared_failed_at == hand["culprit_failure"]
    assert breaker.rolled_back is True
    kubernetes = models["kubernetes-rolling-update"]
    assert kubernetes.declared_failed_at == hand["update"] + timedelta(seconds=600)
    ((stop, _),) = hand["stops"].values()
    for model in models.values():
        assert model.old_replicas_kept == 1
        assert model.serving_seconds_kept == pytest.approx((hand["end"] - stop).total_seconds())


def test_models_are_named_with_parameters_in_the_report():
    report = open_sources([CAPTURES / "v0.22.5" / "seed" / "server.db"]).report
    names = {m.name: m.parameters for m in report.counterfactual_models}
    assert names["kubernetes-rolling-update"]["progressDeadlineSeconds"] == 600
    assert names["ecs-circuit-breaker-rollback"]["failure_threshold"] == 1


@pytest.mark.parametrize(
    ("capture", "failure_class", "detail"),
    [
        ("v0.22.5/seed", "fleet_at_capacity", "Fleet is at capacity"),
        ("v0.22.5/multi-replica-crash", "container_exit", "code 2"),
        ("v0.19/seed", "no_capacity", "failed_to_start_due_to_no_capacity"),
    ],
)
def test_root_cause_signature(capture, failure_class, detail):
    (finding,) = open_sources([CAPTURES / capture / "server.db"]).report.findings
    assert finding.root_cause.failure_class == failure_class
    assert detail in finding.root_cause.detail
    assert finding.root_cause.fleets == ["cpu-fleet"]


def test_unknown_price_is_unknown_not_zero(copy_db):
    db = copy_db("v0.22.5/seed")
    execute(
        db,
        "UPDATE jobs SET job_provisioning_data = json_set(job_provisioning_data, '$.price', NULL)",
    )
    (finding,) = open_sources([db]).report.findings
    assert finding.impact.lost_cost is None
    assert finding.impact.cost_known_for == 0
    assert finding.impact.per_victim[0].price_per_hour is None


def test_recovery_by_a_later_run_of_the_same_service(copy_db):
    """The user re-submits `web`: the outage ends when its replica is running again."""
    db = copy_db("v0.22.5/seed")
    new_run, new_job = "0f" * 16, "1e" * 16
    execute(
        db,
        f"""INSERT INTO runs SELECT '{new_run}', project_id, repo_id, user_id,
            '2026-11-02 09:20:00.000000', run_name, 'RUNNING', run_spec, 0,
            '2026-11-02 09:30:00.000000', gateway_id, NULL, service_spec, fleet_id,
            resubmission_attempt, priority, 0, desired_replica_count, next_triggered_at,
            desired_replica_counts, lock_expires_at, lock_token, lock_owner,
            skip_min_processing_interval FROM runs""",
        f"""INSERT INTO jobs SELECT '{new_job}', project_id, '{new_run}', run_name, job_num,
            job_name, 0, '2026-11-02 09:20:00.000000', '2026-11-02 09:30:00.000000', 'RUNNING',
            NULL, job_spec_data, job_provisioning_data, runner_timestamp, NULL, used_instance_id,
            replica_num, NULL, instance_assigned, job_runtime_data, volumes_detached_at,
            instance_id, inactivity_secs, NULL, disconnected_at, 0, 1, fleet_id,
            waiting_master_job, lock_expires_at, lock_token, lock_owner, NULL,
            image_pull_progress, skip_min_processing_interval, 1, '2026-11-02 09:21:30.000000'
            FROM jobs WHERE job_name = 'web-0-0'""",
    )
    report = open_sources([db]).report
    (finding,) = report.findings
    impact = finding.impact
    assert impact.recovered is True
    assert impact.recovered_at == _t("2026-11-02 09:21:30")
    assert impact.recovered_by_run_id == "0f0f0f0f-0f0f-0f0f-0f0f-0f0f0f0f0f0f"
    assert impact.outage_seconds == pytest.approx(
        (_t("2026-11-02 09:21:30") - _t("2026-11-02 09:09:20.483600")).total_seconds()
    )
    verdicts = {v.run_id[:2]: v for v in report.runs}
    assert verdicts["0f"].in_progress is True
    assert report.summary.runs_in_progress == 1


def test_fleet_wide_ranking_and_summaries(copy_db):
    db = copy_db("v0.22.5/seed")
    merge(db, "v0.22.5/multi-replica-crash", "v0.22.5/scale-up-fails", "v0.22.5/rolling-ok")
    report = open_sources([db]).report
    lost = [f.impact.healthy_replica_seconds_lost for f in report.findings]
    assert lost == sorted(lost, reverse=True)
    projects = {g.key: g for g in report.summary.by_project}
    assert set(projects) == {"acme", "initech", "tyrell"}
    assert projects["initech"].victims == 3
    assert sum(g.findings for g in report.summary.by_day) == 3
    assert {g.key for g in report.summary.by_user} == {"alice", "carol", "judy"}
    assert report.summary.lost_cost == pytest.approx(
        sum(v.lost_cost for f in report.findings for v in f.impact.per_victim)
    )
    classes = {g.key: g.findings for g in report.summary.by_failure_class}
    assert classes == {"fleet_at_capacity": 2, "container_exit": 1}


def test_since_until_filters():
    dbs = [CAPTURES / "v0.22.5" / s / "server.db" for s in ("seed", "multi-replica-crash")]
    everything = open_sources(dbs).report
    assert everything.summary.findings == 2
    later = open_sources(dbs, since=_t("2026-11-03 00:00:00")).report
    assert [f.run_name for f in later.findings] == ["svc"]
    earlier = open_sources(dbs, until=_t("2026-11-03 00:00:00")).report
    assert [f.run_name for f in earlier.findings] == ["web"]


def test_impact_in_json_table_and_markdown():
    from click.testing import CliRunner

    from analyzer.cli import main

    seed = str(CAPTURES / "v0.22.5" / "seed" / "server.db")
    data = json.loads(CliRunner().invoke(main, ["audit", seed, "--format", "json"]).output)
    assert data["findings"][0]["impact"]["replicas_lost"] == 1
    assert data["findings"][0]["root_cause"]["failure_class"] == "fleet_at_capacity"
    table = CliRunner().invoke(main, ["audit", seed]).output
    assert "IMPACT: 1 healthy replica(s) killed" in table and "not recovered" in table
    markdown = CliRunner().invoke(main, ["audit", seed, "--format", "markdown"]).output
    assert (
        "ecs-circuit-breaker-rollback" in markdown and "root cause: `fleet_at_capacity`" in markdown
    )


def test_an_outage_not_recovered_prints_as_a_lower_bound_in_every_format():
    """The seed's service never served again before the end of the evidence: the table and the
    markdown say "≥" before its outage, replica-time and cost, never a bare number."""
    from analyzer.render.format import fmt_bound, fmt_cost
    from analyzer.render.markdown import render_markdown
    from analyzer.render.screen import render_table

    report = open_sources(["samples/v0.22.5/seed/server.db"]).report
    impact = report.findings[0].impact
    assert impact.outage_is_lower_bound and not impact.recovered
    outage = fmt_bound(impact.outage_seconds, True)
    # 177.99 s: a lower bound is printed rounded down, never above what the evidence proves
    assert impact.outage_seconds == pytest.approx(177.986425) and outage == "≥ 2m57s"
    assert fmt_bound(None, False) == "unknown" and fmt_cost(None) == "unknown"
    table, markdown = render_table(report, width=120), render_markdown(report)
    assert f"outage {outage}" in table and f"for {outage}" in markdown
    assert f"cost {fmt_cost(impact.lost_cost, lower_bound=True)}" in table
    assert "cost ≥ $" in markdown


def test_summary_adds_losses_in_the_reports_order_and_counts_each_outage_once():
    """The summary's sums add their known parts one after another, findings first first (as
    every report before it did, bit for bit); a run's outage is counted once, from the first of
    its findings that knows it; an unknown part is counted, never summed."""
    finding = open_sources([CAPTURES / "v0.22.5" / "seed" / "server.db"]).report.findings[0]
    losses = [1e16, 1.0, 1.0, -1e16, None]  # exactly 2.0; added in order: 0.0
    outages = [None, 30.0, 40.0, None, 50.0]
    findings = [
        finding.model_copy(
            update={
                "run_id": "run-b" if i == 4 else "run-a",
                "impact": finding.impact.model_copy(
                    update={
                        "outage_seconds": outage,
                        "per_victim": [
                            VictimImpact(
                                job_id=f"job-{i}",
                                price_per_hour=None,
                                lost_seconds=lost,
                                lost_cost=None,
                                lost_is_lower_bound=i == 4,
                            )
                        ],
                    }
                ),
            }
        )
        for i, (lost, outage) in enumerate(zip(losses, outages, strict=True))
    ]
    base = Summary(runs=2, findings=5, victims=5, by_verdict={})
    summary = summarise(findings, [], base)
    in_order = functools.reduce(operator.add, [x for x in losses if x is not None])
    assert summary.healthy_replica_seconds_lost == in_order == 0.0
    assert summary.replica_time_unknown_victims == 1
    assert not summary.healthy_replica_seconds_lost_is_lower_bound  # the bound part is unknown
    assert summary.lost_cost is None and summary.cost_unknown_victims == 5
    assert (summary.incidents, summary.outage_seconds, summary.outage_unknown_runs) == (2, 80.0, 0)
    [group] = summary.by_server
    assert (group.key, group.findings, group.healthy_replica_seconds_lost) == (
        finding.server,
        5,
        0.0,
    )
    assert summarise([], [], base).outage_seconds == 0.0


def test_summary_groups_each_finding_under_every_name_it_has():
    """Each grouping counts a finding under each name it gives it: every fleet of its root
    cause, "(unknown)" where it has none (no root cause, no fleet, no project, no user); its
    day is its outage's start, else its earliest dated culprit failure or victim stop, and
    "(date unknown)" when it has only times on the pseudo date of a rich log."""
    finding = open_sources([CAPTURES / "v0.22.5" / "seed" / "server.db"]).report.findings[0]
    cause = finding.root_cause
    pseudo = datetime(1970, 1, 1, 9, 30, tzinfo=UTC)
    findings = [
        finding.model_copy(
            update={
                "run_id": "two-fleets",
                "root_cause": cause.model_copy(update={"fleets": ["a", "b"]}),
            }
        ),
        finding.model_copy(
            update={"run_id": "nameless", "root_cause": None, "project": None, "updated_by": None}
        ),
        finding.model_copy(
            update={
                "run_id": "no-impact",
                "impact": None,
                "root_cause": cause.model_copy(update={"fleets": []}),
            }
        ),
        finding.model_copy(
            update={
                "run_id": "dateless",
                "impact": finding.impact.model_copy(update={"outage_start": pseudo}),
                "culprits": [c.model_copy(update={"failed_at": pseudo}) for c in finding.culprits],
                "victims": [
                    v.model_copy(update={"terminated_at": pseudo}) for v in finding.victims
                ],
            }
        ),
    ]
    base = Summary(runs=4, findings=4, victims=4, by_verdict={})
    summary = summarise(findings, [], base)

    def counted(groups: list) -> dict[str, int]:
        return {g.key: g.findings for g in groups}

    assert counted(summary.by_fleet) == {
        "a": 1,
        "b": 1,
        "(unknown)": 2,
        **{name: 1 for name in cause.fleets},
    }
    assert counted(summary.by_project) == {finding.project: 3, "(unknown)": 1}
    assert counted(summary.by_user) == {finding.updated_by: 3, "(unknown)": 1}
    assert counted(summary.by_failure_class) == {cause.failure_class: 3, "(unknown)": 1}
    earliest = min(
        *(c.failed_at for c in finding.culprits if c.failed_at),
        *(v.terminated_at for v in finding.victims if v.terminated_at),
    )
    start = finding.impact.outage_start
    days = [start.date().isoformat()] * 2 + [earliest.date().isoformat(), "(date unknown)"]
    assert counted(summary.by_day) == {day: days.count(day) for day in days}
    assert [g.key for g in summary.by_day] == sorted(set(days))
