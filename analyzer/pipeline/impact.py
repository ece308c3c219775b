"""Serving capacity over time, and what each incident cost: outage window, replica-seconds
and dollars lost, the root-cause signature, and the fleet-wide summaries.

Measured from the evidence only: an unknown price stays unknown (never zero), a service that
never served again is "not recovered as of the end of the evidence".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

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
from analyzer.model import ENGINE, PSEUDO_DATE_LIMIT, UTC_TIME, utc_times
from analyzer.pipeline.counterfactual import FailedReplica, RolloutFacts, evaluate_all
from analyzer.pipeline.states import served_by, serving_spans, stopped_by

# A replica with unknown start of health (table-only evidence) counts from its submission.
CAPACITY_COLUMNS = ["server", "run_id", "time", "healthy_replicas"]


def serving_capacity(
    subs: pl.DataFrame,
    events: pl.DataFrame,
    end_of_evidence: datetime | None,
    ends: dict[str, datetime] | None = None,
) -> pl.DataFrame:
    """Per run: the number of healthy replicas (RUNNING and ready) as a step function; one row
    per change, `healthy_replicas` holding from `time` until the next row. Each job counts
    while its states say it served (states.serving_spans: one that served and then failed a
    probe served until then); a job whose serving no state dates counts by its final verdict,
    from when it was healthy until it stopped."""
    spans = serving_spans(subs, events, ends)
    dated = subs.join(spans, on=["server", "job_id"], how="semi").select(
        "server", "run_id", "job_id", "deployment_num"
    )
    undated = subs.join(spans, on=["server", "job_id"], how="anti").filter(
        pl.col("health") == "healthy"
    )
    healthy = pl.concat(
        [
            dated.join(spans.drop("run_id"), on=["server", "job_id"]).select(
                "server",
                "run_id",
                "deployment_num",
                "start",
                pl.coalesce("until", pl.lit(end_of_evidence)).alias("stop"),
            ),
            undated.select(
                "server",
                "run_id",
                "deployment_num",
                pl.coalesce("healthy_since", "running_at", "submitted_at").alias("start"),
                pl.coalesce("stopped_at", pl.lit(end_of_evidence)).alias("stop"),
            ),
        ],
        how="vertical_relaxed",
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


def _root_cause(finding: Finding, fleets: list[str]) -> RootCause:
    """The first failure of the culprit's replica slot in its deployment is the root cause, the
    last (the culprit's own) the trigger: a crashed replica re-submitted by `retry.on_events`
    whose re-submission found no room failed the run because it crashed (issue 22); `fleets`,
    its jobs' fleets."""
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
        fleets=fleets,
        trigger_class=trigger_class,
        trigger=trigger,
    )


# A time's precision: a database time is exact as stored; a log line or a `dstack event` line
# writes whole seconds or milliseconds (the rest dropped), so the moment lies within that unit.
_CLOCK_TEXT = r"\d{2}:\d{2}:\d{2}(?:[.,](\d+))?"


def _precision_us() -> pl.Expr:
    """Microseconds a recorded time may be early by: 0 for a database time (or a text with
    microseconds), else one unit of its last written digit (1 s, 1 ms)."""
    digits = pl.col("time_text").str.extract(_CLOCK_TEXT, 1).str.len_chars().fill_null(0)
    written = pl.col("time_text").str.contains(_CLOCK_TEXT).fill_null(False)
    return (
        pl.when((pl.col("time_basis") == "db_utc") | ~written | (digits >= 6))
        .then(pl.lit(0, pl.Int64))
        .otherwise(pl.lit(10, pl.Int64).pow(6 - digits).cast(pl.Int64))
    )


def _stop_precisions(findings: list[Finding], events: pl.DataFrame) -> dict[tuple[int, str], int]:
    """(finding index, victim job id) -> the precision of its recorded stop, from the most
    precise sighting of that moment among the job's events (none: a table time, exact; a
    precision of 0 is left out, as every reader takes a missing one for 0)."""
    if "time_text" not in events.columns or _all_exact(events):
        return {}
    stops = _frame(
        [
            (i, f.server, v.job_id, v.terminated_at)
            for i, f in enumerate(findings)
            for v in f.victims
            if v.terminated_at is not None
        ],
        {"i": pl.Int64, "server": pl.String, "job_id": pl.String, "stop": UTC_TIME},
    )
    if stops.height == 0:
        return {}
    # only the victims' own events, in the columns read, are copied out of the events table
    # (the join keeps no other)
    victims = stops["job_id"].unique().implode()
    sightings = events.select(
        "server",
        "entity_type",
        pl.col("entity_id").alias("job_id"),
        pl.col("time").alias("stop"),
        "time_text",
        "time_basis",
    ).filter((pl.col("entity_type") == "job") & pl.col("job_id").is_in(victims))
    # the precision read only of the sightings of a stop, not of every job event
    found = (
        stops.join(sightings, on=["server", "job_id", "stop"])
        .group_by("i", "job_id")
        .agg(_precision_us().min().alias("precision"))
    )
    return {(i, job): p for i, job, p in found.iter_rows()}


def _all_exact(events: pl.DataFrame) -> bool:
    """Whether every event's time is a database time: exact, every stop's precision 0 (a lone
    database: no sighting need be looked up)."""
    return bool((events["time_basis"] == "db_utc").fill_null(False).all())


@dataclass(frozen=True)
class _Start:
    """When a run's outage began: its last victim's recorded stop (`at`), and the moment the
    outage is counted from (`counted_from`, that stop rounded up by its precision)."""

    at: datetime | None = None
    counted_from: datetime | None = None
    precision_us: int = 0


def _run_outage_starts(
    findings: list[Finding], precisions: dict[tuple[int, str], int]
) -> dict[tuple[str, str], _Start]:
    """Per run: its outage began when the last of its victims stopped, whatever the category
    of the finding that holds the victim (one incident per run); unknown if any stop is."""
    stops: dict[tuple[str, str], list[tuple[datetime | None, int]]] = defaultdict(list)
    for i, finding in enumerate(findings):
        listed = stops[(finding.server, finding.run_id)]
        listed += [(v.terminated_at, precisions.get((i, v.job_id), 0)) for v in finding.victims]
    starts = {}
    for key, values in stops.items():
        dated = [(t, p) for t, p in values if t is not None]
        if not values or len(dated) < len(values):
            starts[key] = _Start()
            continue
        counted, precision = max((t + timedelta(microseconds=p), p) for t, p in dated)
        starts[key] = _Start(max(t for t, _ in dated), counted, precision)
    return starts


@dataclass
class _Lookups:
    recoveries: dict[int, tuple[datetime, str]]
    update_times: dict[int, datetime]
    fleets: dict[int, list[str]]
    in_place: set[int]  # the update reached the running replicas in place (bumped)
    older_running: set[int]  # older-deployment replicas still running at the first failure
    new_available: dict[int, list[datetime]]  # new-deployment replicas healthy before the failure


def _lookups(
    findings: list[Finding],
    subs: pl.DataFrame,
    runs: pl.DataFrame,
    events: pl.DataFrame,
    starts: dict[tuple[str, str], _Start],
) -> _Lookups:
    """One join each, for all findings at once: recovery, update time, fleets, and what the
    update's deployment did (bumped in place; replicas available before the first failure).
    The lookups' frames are collected together, one query."""
    keys = _frame(
        [
            (
                i,
                f.server,
                f.run_id,
                f.run_name,
                f.project,
                starts[(f.server, f.run_id)].at,
                f.update_deployment_num,
                min((c.failed_at for c in f.culprits if c.failed_at), default=None),
            )
            for i, f in enumerate(findings)
        ],
        {
            "i": pl.Int64,
            "server": pl.String,
            "run_id": pl.String,
            "run_name": pl.String,
            "project": pl.String,
            "start": UTC_TIME,
            "dep": pl.Int64,
            "failed": UTC_TIME,
        },
    )
    # each finding's victims and culprits, one row each (a list per finding costs a Series each)
    jobs = _frame(
        [
            (i, f.server, job.job_id)
            for i, f in enumerate(findings)
            for job in (*f.victims, *f.culprits)
        ],
        {"i": pl.Int64, "server": pl.String, "job_id": pl.String},
    )
    healthy = (
        subs.lazy()
        .select(
            "server",
            "run_id",
            "health",
            pl.coalesce("healthy_since", "running_at").alias("since"),
        )
        .filter(pl.col("health") == "healthy")
        .drop("health")
        .drop_nulls("since")
        .join(
            runs.lazy().select("server", "run_id", "run_name", "project"), on=["server", "run_id"]
        )
        .rename({"run_id": "by_run"})
    )
    recovered = (
        keys.lazy()
        .drop_nulls("start")
        .join(healthy, on=["server", "run_name", "project"], nulls_equal=True)
        .filter(pl.col("since") > pl.col("start"))
        .sort("since")
        .group_by("i")
        .first()
    )
    updates = (
        events.lazy()
        .filter((pl.col("kind") == "run_updated") & (pl.col("time_basis") != "time_of_day_only"))
        .group_by("server", "run_id", "deployment_num")
        .agg(pl.col("time").min().alias("update_at"))
    )
    update_at = (
        keys.lazy()
        .join(
            updates,
            left_on=["server", "run_id", "dep"],
            right_on=["server", "run_id", "deployment_num"],
        )
        .select("i", "update_at")
    )
    fleets = (
        jobs.lazy()
        .join(subs.lazy().select("server", "job_id", "fleet_name"), on=["server", "job_id"])
        .drop_nulls("fleet_name")
        .group_by("i")
        .agg(pl.col("fleet_name").unique().sort())
    )
    of_update = (
        keys.lazy()
        .drop_nulls("dep")
        .join(
            subs.lazy().select(
                "server",
                "run_id",
                "deployment_num",
                "created_deployment",
                "health",
                "healthy_since",
                "stopped_at",
            ),
            on=["server", "run_id"],
        )
    )
    older = of_update.filter(
        (pl.col("deployment_num") < pl.col("dep")) & ~stopped_by(pl.col("failed"))
    ).select("i")
    bumped = of_update.filter(
        (pl.col("deployment_num") == pl.col("dep")) & (pl.col("created_deployment") < pl.col("dep"))
    ).select("i")
    available = (
        of_update.filter(
            (pl.col("deployment_num") == pl.col("dep"))
            & (pl.col("created_deployment").fill_null(pl.col("dep")) >= pl.col("dep"))
            & served_by(pl.col("failed"))
        )
        .group_by("i")
        .agg(pl.col("healthy_since").sort())
    )
    recovered, update_at, fleets, bumped, older, available = pl.collect_all(
        [recovered, update_at, fleets, bumped, older, available], engine=ENGINE
    )
    return _Lookups(
        recoveries={
            row["i"]: (row["since"], row["by_run"]) for row in recovered.iter_rows(named=True)
        },
        update_times=dict(update_at.iter_rows()),
        fleets=dict(fleets.iter_rows()),
        in_place=set(bumped["i"].to_list()),
        older_running=set(older["i"].to_list()),
        new_available=dict(available.iter_rows()),
    )


def _precision_words(precision_us: int) -> str:
    if precision_us >= 1_000_000:
        return "the second"
    return "the millisecond" if precision_us >= 1000 else f"{precision_us} µs"


def _facts(
    i: int, finding: Finding, found: _Lookups, impact: Impact, lost_is_lower_bound: bool
) -> RolloutFacts:
    return RolloutFacts(
        update_deployment=finding.update_deployment_num,
        update_at=found.update_times.get(i),
        older_running=i in found.older_running,
        in_place=i in found.in_place,
        # the culprits first, then the earlier failures of their slots (re-submitted by the
        # retry policy; dstack may have deleted their rows and kept their events): each is a
        # failed launch of its deployment
        culprits=[
            *(
                FailedReplica(c.deployment_num, c.failed_at, c.termination_reason, c.exit_status)
                for c in finding.culprits
            ),
            *(
                FailedReplica(c.deployment_num, e.failed_at, e.termination_reason, e.exit_status)
                for c in finding.culprits
                for e in c.earlier_failures
            ),
        ],
        new_available=found.new_available.get(i, []),
        victims=len(finding.victims),
        lost_replica_seconds=impact.healthy_replica_seconds_lost,
        lost_is_lower_bound=lost_is_lower_bound,
    )


def _known_total(values: list[float | None]) -> float | None:
    """The sum of the known parts; None when there are parts and none is known."""
    known = [v for v in values if v is not None]
    return sum(known) if known or not values else None


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
    # the victims' prices only (a dict of every job's would be built row by row)
    victims = pl.Series([v.job_id for f in findings for v in f.victims], dtype=pl.String)
    prices = dict(
        subs.select("job_id", "price")
        .filter(pl.col("price").is_not_null() & pl.col("job_id").is_in(victims.implode()))
        .iter_rows()
    )
    precisions = _stop_precisions(findings, events)
    starts = _run_outage_starts(findings, precisions)
    found = _lookups(findings, subs, runs, events, starts)
    assessed = []
    for i, finding in enumerate(findings):
        end_of_evidence = ends.get(finding.server)
        start = starts[(finding.server, finding.run_id)]
        recovered_at, by_run = found.recoveries.get(i, (None, None))
        window_end = recovered_at or end_of_evidence
        to_the_end = recovered_at is None
        per_victim = []
        for victim in finding.victims:
            price = prices.get(victim.job_id)
            precision = precisions.get((i, victim.job_id), 0)
            lost = (
                max(
                    (
                        window_end - victim.terminated_at - timedelta(microseconds=precision)
                    ).total_seconds(),
                    0.0,
                )
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
                    lost_is_lower_bound=lost is not None and (to_the_end or precision > 0),
                )
            )
        outage = (
            max((window_end - start.counted_from).total_seconds(), 0.0)
            if start.counted_from and window_end
            else None
        )
        reasons = []
        if outage is not None and to_the_end and end_of_evidence:
            reasons.append(
                f"not recovered as of the end of the evidence, {end_of_evidence.isoformat()}: "
                "the service may have stayed down longer"
            )
        if outage is not None and start.precision_us and start.counted_from:
            reasons.append(
                f"the last victim's stop is recorded to {_precision_words(start.precision_us)} "
                f"only: the outage is counted from {start.counted_from.isoformat()}, the latest "
                "moment that record allows"
            )
        lost_values = [v.lost_seconds for v in per_victim]
        costs = [v.lost_cost for v in per_victim]
        lost_bound = any(v.lost_is_lower_bound for v in per_victim if v.lost_seconds is not None)
        impact = Impact(
            outage_start=start.at,
            recovered_at=recovered_at,
            recovered_by_run_id=by_run,
            recovered=recovered_at is not None,
            outage_seconds=outage,
            outage_is_lower_bound=bool(reasons),
            lower_bound_reasons=reasons,
            replicas_lost=len(finding.victims),
            healthy_replica_seconds_lost=_known_total(lost_values),
            healthy_replica_seconds_lost_is_lower_bound=lost_bound,
            replica_time_unknown_victims=sum(v is None for v in lost_values),
            lost_cost=_known_total(costs),
            lost_cost_is_lower_bound=any(
                v.lost_is_lower_bound for v in per_victim if v.lost_cost is not None
            ),
            cost_known_for=sum(c is not None for c in costs),
            per_victim=per_victim,
            end_of_evidence=end_of_evidence,
        )
        root_cause = _root_cause(finding, found.fleets.get(i, []))
        assessed.append(
            finding.model_copy(
                update={
                    "impact": impact,
                    "counterfactuals": evaluate_all(_facts(i, finding, found, impact, lost_bound)),
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


# The Totals fields summed over a group of findings, in columns: each run's outage once (the
# first of its findings that knows it), each victim's loss and cost; a sum adds its known parts
# one after another in the findings' order (cum_sum), as a Python sum would, to the last bit.
_TOTALS_SCHEMA = {
    "i": pl.Int64,
    "server": pl.String,
    "run_id": pl.String,
    "victims": pl.Int64,
    "outage": pl.Float64,
    "outage_bound": pl.Boolean,
}
_PARTS_SCHEMA = {"i": pl.Int64, "lost": pl.Float64, "cost": pl.Float64, "bound": pl.Boolean}
_UNKNOWN = "(unknown)"  # a finding's name where it has none (a project, a user, a fleet)
# the summary's groupings, in its order (`_named`), and what they read of a finding besides
_GROUPINGS = (
    "whole",
    "by_server",
    "by_project",
    "by_fleet",
    "by_user",
    "by_day",
    "by_failure_class",
)
_NAMES_SCHEMA = {
    "i": pl.Int64,
    "server": pl.String,
    "project": pl.String,
    "user": pl.String,
    "failure": pl.String,
    "start": UTC_TIME,
}


def _sequential_sum(column: str) -> pl.Expr:
    """The sum of a group's known values in order (a Python `sum`, bit for bit); null when
    none is known."""
    return pl.col(column).drop_nulls().cum_sum().last()


def _summary_frames(findings: list[Finding]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What the summary reads of the findings, in one pass over them: one row per victim's
    loss (a finding with no impact: each victim's loss unknown), and one per name each
    grouping gives a finding, beside what totals read of it (`_named`)."""
    server, run_id, victims, outage, outage_bound = [], [], [], [], []
    project, user, failure, start, fleet_i, fleet = [], [], [], [], [], []
    part_i, lost, cost, lost_bound = [], [], [], []
    moment_i, moment = [], []
    for i, f in enumerate(findings):
        impact, cause = f.impact, f.root_cause
        server.append(f.server)
        run_id.append(f.run_id)
        victims.append(len(f.victims))
        project.append(f.project or _UNKNOWN)
        user.append(f.updated_by or _UNKNOWN)
        for name in (cause.fleets if cause else None) or [_UNKNOWN]:
            fleet_i.append(i)
            fleet.append(name)
        failure.append(cause.failure_class if cause else _UNKNOWN)
        if impact is None:
            outage.append(None)
            outage_bound.append(False)
            start.append(None)
            for _ in f.victims:
                part_i.append(i)
                lost.append(None)
                cost.append(None)
                lost_bound.append(False)
        else:
            outage.append(impact.outage_seconds)
            outage_bound.append(bool(impact.outage_is_lower_bound))
            start.append(impact.outage_start)
            for v in impact.per_victim:
                part_i.append(i)
                lost.append(v.lost_seconds)
                cost.append(v.lost_cost)
                lost_bound.append(v.lost_is_lower_bound)
        # the dated moments it records, for its day (`_named`)
        for c in f.culprits:
            if c.failed_at is not None:
                moment_i.append(i)
                moment.append(c.failed_at)
        for v in f.victims:
            if v.terminated_at is not None:
                moment_i.append(i)
                moment.append(v.terminated_at)
    found = pl.DataFrame(
        {
            "i": range(len(findings)),
            "server": server,
            "run_id": run_id,
            "victims": victims,
            "outage": outage,
            "outage_bound": outage_bound,
        },
        schema=_TOTALS_SCHEMA,
    )
    parts = pl.DataFrame(
        {"i": part_i, "lost": lost, "cost": cost, "bound": lost_bound}, schema=_PARTS_SCHEMA
    )
    names = pl.DataFrame(
        {
            "i": range(len(findings)),
            "server": server,
            "project": project,
            "user": user,
            "failure": failure,
            "start": utc_times(start),
        },
        schema=_NAMES_SCHEMA,
    )
    moments = pl.DataFrame(
        {"i": moment_i, "moment": utc_times(moment)}, schema={"i": pl.Int64, "moment": UTC_TIME}
    )
    fleets = pl.DataFrame({"i": fleet_i, "key": fleet}, schema={"i": pl.Int64, "key": pl.String})
    return parts, _named(found, names, moments, fleets)


def _frame(rows: list[tuple], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Rows of Python values as a frame, built column by column (polars builds one from rows
    several times slower: 0.02 s of a fleet's summary of 4k findings), its times by
    `utc_times`."""
    columns = zip(*rows, strict=True) if rows else ([] for _ in schema)
    return pl.DataFrame(
        {
            name: utc_times(values) if schema[name] == UTC_TIME else values
            for name, values in zip(schema, columns, strict=True)
        },
        schema=schema,
    )


_GROUP = ["grouping", "key"]


def _totals_by(found: pl.DataFrame, parts: pl.DataFrame) -> pl.DataFrame:
    """The Totals fields per `grouping` and `key` of `found` (rows of findings, in order, one
    per key a finding is counted under), over each group's findings and their victims."""
    known = pl.col("outage").is_not_null()
    runs = (
        found.group_by(*_GROUP, "server", "run_id", maintain_order=True)
        .agg(
            pl.col("outage").drop_nulls().first(),
            pl.col("outage_bound").filter(known).first(),
        )
        .group_by(_GROUP, maintain_order=True)
        .agg(
            pl.len().alias("incidents"),
            _sequential_sum("outage").alias("outage_seconds"),
            pl.col("outage_bound").filter(known).any().alias("outage_is_lower_bound"),
            pl.col("outage").null_count().alias("outage_unknown_runs"),
        )
    )
    counts = found.group_by(_GROUP, maintain_order=True).agg(
        pl.len().alias("findings"), pl.col("victims").sum()
    )
    lost, cost = pl.col("lost").is_not_null(), pl.col("cost").is_not_null()
    losses = (
        found.select(*_GROUP, "i")
        .join(parts, on="i", maintain_order="left")
        .group_by(_GROUP, maintain_order=True)
        .agg(
            pl.len().alias("_parts"),
            _sequential_sum("lost").alias("healthy_replica_seconds_lost"),
            pl.col("bound").filter(lost).any().alias("healthy_replica_seconds_lost_is_lower_bound"),
            pl.col("lost").null_count().alias("replica_time_unknown_victims"),
            _sequential_sum("cost").alias("lost_cost"),
            pl.col("bound").filter(cost).any().alias("lost_cost_is_lower_bound"),
            pl.col("cost").null_count().alias("cost_unknown_victims"),
        )
    )
    # a group of no parts sums to 0.0, one of parts none of which is known to null
    none = pl.col("_parts").fill_null(0) == 0
    return (
        runs.join(counts, on=_GROUP, maintain_order="left")
        .join(losses, on=_GROUP, how="left", maintain_order="left")
        .with_columns(
            pl.when(none).then(0.0).otherwise(pl.col(name)).alias(name)
            for name in ("healthy_replica_seconds_lost", "lost_cost")
        )
        .with_columns(
            pl.col(name).fill_null(False)
            for name in ("healthy_replica_seconds_lost_is_lower_bound", "lost_cost_is_lower_bound")
        )
        .with_columns(
            pl.col(name).fill_null(0)
            for name in ("replica_time_unknown_victims", "cost_unknown_victims")
        )
        .drop("_parts")
    )


_NO_TOTALS = {
    "incidents": 0,
    "findings": 0,
    "victims": 0,
    "outage_seconds": 0.0,
    "outage_is_lower_bound": False,
    "outage_unknown_runs": 0,
    "healthy_replica_seconds_lost": 0.0,
    "healthy_replica_seconds_lost_is_lower_bound": False,
    "replica_time_unknown_victims": 0,
    "lost_cost": 0.0,
    "lost_cost_is_lower_bound": False,
    "cost_unknown_victims": 0,
}


def _named(
    found: pl.DataFrame, names: pl.DataFrame, moments: pl.DataFrame, fleets: pl.DataFrame
) -> pl.DataFrame:
    """Each finding once per name each grouping gives it (grouping, i, key), the groupings in
    the summary's order and the findings in theirs (a row of `fleets` for each of its fleets),
    beside what totals read of it. Its day (by_day) is the UTC day its incident began: its
    outage's start, else the earliest dated moment it records (a culprit's failure, a victim's
    stop); unknown only when none is dated (a rich log alone gives times of day, on a pseudo
    date)."""
    dated = [
        pl.when(pl.col(name) >= PSEUDO_DATE_LIMIT).then(pl.col(name))
        for name in ("start", "moment")
    ]
    day = pl.coalesce(dated).dt.strftime("%Y-%m-%d").fill_null("(date unknown)")
    earliest = moments.lazy().group_by("i").agg(pl.col("moment").min())
    keyed = names.lazy().join(earliest, on="i", how="left", maintain_order="left")
    keys = {
        "whole": pl.lit(""),
        "by_server": pl.col("server"),
        "by_project": pl.col("project"),
        "by_user": pl.col("user"),
        "by_day": day,
        "by_failure_class": pl.col("failure"),
    }
    rows = {
        name: keyed.select(pl.lit(name).alias("grouping"), "i", key.alias("key"))
        for name, key in keys.items()
    }
    rows["by_fleet"] = fleets.lazy().select(pl.lit("by_fleet").alias("grouping"), "i", "key")
    return (
        pl.concat([rows[name] for name in _GROUPINGS])
        .join(found.lazy(), on="i", maintain_order="left")
        .collect()
    )


def _groups(named: pl.DataFrame, parts: pl.DataFrame) -> dict[str, list[GroupSummary]]:
    """Per grouping, the summary of each name it gives the findings (`_named`), worst first;
    all groupings in one pass."""
    summaries: dict[str, list[GroupSummary]] = {grouping: [] for grouping in _GROUPINGS}
    for row in _totals_by(named, parts).iter_rows(named=True):
        summaries[row.pop("grouping")].append(GroupSummary(**row))
    return {
        grouping: sorted(
            listed,
            key=lambda g: (
                -(g.healthy_replica_seconds_lost or 0.0),
                -g.incidents,
                -g.findings,
                g.key,
            ),
        )
        for grouping, listed in summaries.items()
    }


def summarise(findings: list[Finding], verdicts: list[RunVerdict], base: Summary) -> Summary:
    """The summary's totals and its groupings: one group_by of the findings' frames."""
    in_progress = sum(v.in_progress for v in verdicts)
    if not findings:
        return base.model_copy(update={"runs_in_progress": in_progress, **_NO_TOTALS})
    parts, named = _summary_frames(findings)
    groups = _groups(named, parts)
    [whole] = groups.pop("whole")
    groups["by_day"].sort(key=lambda g: g.key)
    return base.model_copy(
        update={"runs_in_progress": in_progress, **whole.model_dump(exclude={"key"}), **groups}
    )
