"""Serving capacity over time, and what each incident cost: outage window, replica-seconds
and dollars lost, the root-cause signature, and the fleet-wide summaries.

Measured from the evidence only: an unknown price stays unknown (never zero), a service that
never served again is "not recovered as of the end of the evidence".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime

import polars as pl

from analyzer.contract import (
    Culprit,
    EarlierFailure,
    Finding,
    GroupSummary,
    Impact,
    RootCause,
    RunVerdict,
    Summary,
    VictimImpact,
)
from analyzer.model import UTC_TIME
from analyzer.pipeline.counterfactual import RolloutFacts, evaluate_all

# A replica with unknown start of health (table-only evidence) counts from its submission.
CAPACITY_COLUMNS = ["server", "run_id", "time", "healthy_replicas"]


def serving_capacity(subs: pl.DataFrame, end_of_evidence: datetime | None) -> pl.DataFrame:
    """Per run: the number of healthy replicas (RUNNING and ready) as a step function; one row
    per change, `healthy_replicas` holding from `time` until the next row."""
    healthy = subs.filter(pl.col("health") == "healthy").select(
        "server",
        "run_id",
        "deployment_num",
        pl.coalesce("healthy_since", "running_at", "submitted_at").alias("start"),
        pl.coalesce("stopped_at", pl.lit(end_of_evidence)).alias("stop"),
    )
    steps = pl.concat(
        [
            healthy.select(
                "server",
                "run_id",
                "deployment_num",
                pl.col("start").alias("time"),
                pl.lit(1).alias("delta"),
            ),
            healthy.drop_nulls("stop").select(
                "server",
                "run_id",
                "deployment_num",
                pl.col("stop").alias("time"),
                pl.lit(-1).alias("delta"),
            ),
        ]
    ).drop_nulls("time")
    return (
        steps.group_by(["server", "run_id", "time"])
        .agg(pl.col("delta").sum())
        .sort(["server", "run_id", "time"])
        .with_columns(
            pl.col("delta").cum_sum().over(["server", "run_id"]).alias("healthy_replicas")
        )
        .select(CAPACITY_COLUMNS)
    )


def _classify(failure: Culprit | EarlierFailure) -> tuple[str, str]:
    """A failure's class and its words, from its own reason (dstack JobTerminationReason)."""
    reason = failure.termination_reason or "unknown"
    message = failure.termination_reason_message or ""
    suffix = f" ({message})" if message else ""
    if reason == "failed_to_start_due_to_no_capacity":
        at_capacity = "at capacity" in message.lower()
        return ("fleet_at_capacity" if at_capacity else "no_capacity"), reason + suffix
    if reason == "container_exited_with_error":
        code = failure.exit_status
        return "container_exit", f"container exited with code {code if code is not None else '?'}"
    if reason == "waiting_runner_limit_exceeded" or "probe" in message.lower():
        return "probe_never_ready", reason + suffix
    return "other", reason + suffix


def _root_cause(finding: Finding) -> RootCause:
    """The first failure of the culprit's replica slot in its deployment is the root cause, the
    last (the culprit's own) the trigger: a crashed replica re-submitted by `retry.on_events`
    whose re-submission found no room failed the run because it crashed (issue 22)."""
    culprit = finding.culprits[0]
    first = culprit.earlier_failures[0] if culprit.earlier_failures else culprit
    failure_class, detail = _classify(first)
    trigger_class, trigger = _classify(culprit) if first is not culprit else (None, None)
    if first is not culprit:
        detail = (
            f"{detail}: {culprit.job_name} submission {first.submission_num}, re-submitted by "
            f"dstack (retry); submission {culprit.submission_num} then failed: {trigger}"
        )
    if (finding.run_failure_reason or finding.run_termination_reason) == "retry_limit_exceeded":
        failure_class = "retry_limit"
        detail = f"retry duration exceeded; last failure {culprit.termination_reason or 'unknown'}"
        if first is not culprit:
            detail += f"; first failure {first.termination_reason or 'unknown'}"
    return RootCause(
        failure_class=failure_class,
        detail=detail,
        changed_fields=finding.changed_fields,
        fleets=[],
        trigger_class=trigger_class,
        trigger=trigger,
    )


def _run_outage_starts(findings: list[Finding]) -> dict[tuple[str, str], datetime | None]:
    """Per run: its outage began when the last of its victims stopped, whatever the category
    of the finding that holds the victim (one incident per run); unknown if any stop is."""
    stops: dict[tuple[str, str], list[datetime | None]] = defaultdict(list)
    for finding in findings:
        stops[(finding.server, finding.run_id)].extend(v.terminated_at for v in finding.victims)
    return {
        key: max(values) if values and all(v is not None for v in values) else None  # type: ignore[type-var]
        for key, values in stops.items()
    }


def _lookups(
    findings: list[Finding],
    subs: pl.DataFrame,
    runs: pl.DataFrame,
    events: pl.DataFrame,
    starts: dict[tuple[str, str], datetime | None],
) -> tuple[dict, dict, dict]:
    """One join each, for all findings at once: recovery, update time, fleets."""
    keys = pl.DataFrame(
        [
            {
                "i": i,
                "server": f.server,
                "run_id": f.run_id,
                "run_name": f.run_name,
                "project": f.project,
                "start": starts[(f.server, f.run_id)],
                "dep": f.update_deployment_num,
                "jobs": [v.job_id for v in f.victims] + [c.job_id for c in f.culprits],
            }
            for i, f in enumerate(findings)
        ],
        schema={
            "i": pl.Int64,
            "server": pl.String,
            "run_id": pl.String,
            "run_name": pl.String,
            "project": pl.String,
            "start": UTC_TIME,
            "dep": pl.Int64,
            "jobs": pl.List(pl.String),
        },
    )
    healthy = (
        subs.filter(pl.col("health") == "healthy")
        .select("server", "run_id", pl.coalesce("healthy_since", "running_at").alias("since"))
        .drop_nulls("since")
        .join(runs.select("server", "run_id", "run_name", "project"), on=["server", "run_id"])
        .rename({"run_id": "by_run"})
    )
    recovered = (
        keys.drop_nulls("start")
        .join(healthy, on=["server", "run_name", "project"], nulls_equal=True)
        .filter(pl.col("since") > pl.col("start"))
        .sort("since")
        .group_by("i")
        .first()
    )
    updates = (
        events.filter(
            (pl.col("kind") == "run_updated") & (pl.col("time_basis") != "time_of_day_only")
        )
        .group_by("server", "run_id", "deployment_num")
        .agg(pl.col("time").min().alias("update_at"))
    )
    update_at = keys.join(
        updates,
        left_on=["server", "run_id", "dep"],
        right_on=["server", "run_id", "deployment_num"],
    )
    fleets = (
        keys.select("i", "server", pl.col("jobs").alias("job_id"))
        .explode("job_id")
        .join(subs.select("server", "job_id", "fleet_name"), on=["server", "job_id"])
        .drop_nulls("fleet_name")
        .group_by("i")
        .agg(pl.col("fleet_name").unique().sort())
    )
    return (
        {row["i"]: (row["since"], row["by_run"]) for row in recovered.iter_rows(named=True)},
        dict(update_at.select("i", "update_at").iter_rows()),
        dict(fleets.iter_rows()),
    )


def assess(
    findings: list[Finding],
    subs: pl.DataFrame,
    runs: pl.DataFrame,
    events: pl.DataFrame,
    ends: dict[str, datetime],
) -> list[Finding]:
    """Each finding with its impact, counterfactuals and root-cause signature filled in."""
    if not findings:
        return []
    prices = dict(subs.select("job_id", "price").filter(pl.col("price").is_not_null()).iter_rows())
    starts = _run_outage_starts(findings)
    recoveries, update_times, fleets = _lookups(findings, subs, runs, events, starts)
    assessed = []
    for i, finding in enumerate(findings):
        end_of_evidence = ends.get(finding.server)
        start = starts[(finding.server, finding.run_id)]
        recovered_at, by_run = recoveries.get(i, (None, None))
        window_end = recovered_at or end_of_evidence
        per_victim = []
        for victim in finding.victims:
            price = prices.get(victim.job_id)
            lost = (
                max((window_end - victim.terminated_at).total_seconds(), 0.0)
                if window_end and victim.terminated_at
                else None
            )
            per_victim.append(
                VictimImpact(
                    job_id=victim.job_id,
                    price_per_hour=price,
                    lost_seconds=lost,
                    lost_cost=price * lost / 3600
                    if price is not None and lost is not None
                    else None,
                )
            )
        lost_values = [v.lost_seconds for v in per_victim]
        lost_total = sum(lost_values) if all(v is not None for v in lost_values) else None
        costs = [v.lost_cost for v in per_victim]
        impact = Impact(
            outage_start=start,
            recovered_at=recovered_at,
            recovered_by_run_id=by_run,
            recovered=recovered_at is not None,
            outage_seconds=(window_end - start).total_seconds() if start and window_end else None,
            outage_is_lower_bound=recovered_at is None and start is not None,
            replicas_lost=len(finding.victims),
            healthy_replica_seconds_lost=lost_total,
            lost_cost=sum(costs) if costs and all(c is not None for c in costs) else None,
            cost_known_for=sum(c is not None for c in costs),
            per_victim=per_victim,
            end_of_evidence=end_of_evidence,
        )
        facts = RolloutFacts(
            update_at=update_times.get(i),
            culprit_failures=sorted(c.failed_at for c in finding.culprits if c.failed_at),
            victims=len(finding.victims),
            lost_replica_seconds=lost_total,
        )
        root_cause = _root_cause(finding).model_copy(update={"fleets": fleets.get(i, [])})
        assessed.append(
            finding.model_copy(
                update={
                    "impact": impact,
                    "counterfactuals": evaluate_all(facts),
                    "root_cause": root_cause,
                }
            )
        )
    return sorted(assessed, key=impact_rank)


def impact_rank(finding: Finding) -> tuple:
    impact = finding.impact
    lost = (
        impact.healthy_replica_seconds_lost
        if impact and impact.healthy_replica_seconds_lost
        else 0.0
    )
    cost = impact.lost_cost if impact and impact.lost_cost else 0.0
    return (
        -lost,
        -cost,
        -len(finding.victims),
        finding.server,
        finding.project or "",
        finding.run_name,
        finding.run_id,  # runs of one name (recreated) are told apart, always in one order
    )


def _run_outages(findings: Iterable[Finding]) -> dict[tuple[str, str], float | None]:
    """Each run's outage once, however many findings (categories) the run has."""
    outages: dict[tuple[str, str], float | None] = {}
    for finding in findings:
        seconds = finding.impact.outage_seconds if finding.impact else None
        key = (finding.server, finding.run_id)
        outages[key] = seconds if outages.get(key) is None else outages[key]
    return outages


def _known_sum(values: Iterable[float | None]) -> float:
    return sum(v for v in values if v is not None)


def _group(findings: Iterable[Finding], key: Callable[[Finding], list[str]]) -> list[GroupSummary]:
    groups: dict[str, list[Finding]] = defaultdict(list)
    for finding in findings:
        for name in key(finding) or ["(unknown)"]:
            groups[name].append(finding)
    summaries = [
        GroupSummary(
            key=name,
            findings=len(members),
            victims=sum(len(f.victims) for f in members),
            outage_seconds=_known_sum(_run_outages(members).values()),
            healthy_replica_seconds_lost=sum(
                f.impact.healthy_replica_seconds_lost or 0.0 for f in members if f.impact
            ),
            lost_cost=sum(
                v.lost_cost or 0.0 for f in members if f.impact for v in f.impact.per_victim
            ),
            cost_unknown_victims=sum(
                1 for f in members if f.impact for v in f.impact.per_victim if v.lost_cost is None
            ),
        )
        for name, members in groups.items()
    ]
    return sorted(summaries, key=lambda g: (-g.healthy_replica_seconds_lost, -g.findings, g.key))


def _day(finding: Finding) -> list[str]:
    start = finding.impact.outage_start if finding.impact else None
    return [start.strftime("%Y-%m-%d")] if start else ["(date unknown)"]


def summarise(findings: list[Finding], verdicts: list[RunVerdict], base: Summary) -> Summary:
    outages = _run_outages(findings)
    known = [v for v in outages.values() if v is not None]
    lost = [
        f.impact.healthy_replica_seconds_lost
        for f in findings
        if f.impact and f.impact.healthy_replica_seconds_lost is not None
    ]
    return base.model_copy(
        update={
            "runs_in_progress": sum(v.in_progress for v in verdicts),
            # An outage that is not known is not zero: null when no run's outage is known.
            "outage_seconds": sum(known) if known or not outages else None,
            "outage_unknown_runs": len(outages) - len(known),
            "healthy_replica_seconds_lost": sum(lost) if lost or not findings else None,
            "lost_cost": sum(
                v.lost_cost or 0.0 for f in findings if f.impact for v in f.impact.per_victim
            ),
            "cost_unknown_victims": sum(
                1 for f in findings if f.impact for v in f.impact.per_victim if v.lost_cost is None
            ),
            "by_server": _group(findings, lambda f: [f.server]),
            "by_project": _group(findings, lambda f: [f.project or "(unknown)"]),
            "by_fleet": _group(findings, lambda f: f.root_cause.fleets if f.root_cause else []),
            "by_user": _group(findings, lambda f: [f.updated_by or "(unknown)"]),
            "by_day": sorted(_group(findings, _day), key=lambda g: g.key),
            "by_failure_class": _group(
                findings, lambda f: [f.root_cause.failure_class] if f.root_cause else []
            ),
        }
    )
