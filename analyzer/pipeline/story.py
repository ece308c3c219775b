"""A run's story, told once: what every renderer (the text timeline, the swimlane, the HTML
narrative) draws from, so none of them rebuilds a run's facts from the frames.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl

from analyzer.contract import Finding, RunVerdict
from analyzer.dstack import FINISHED_JOB_STATUSES
from analyzer.model import PSEUDO_DATE_LIMIT
from analyzer.pipeline.states import serving_spans


def as_utc(value: datetime | None) -> datetime | None:
    """A naive time is UTC, like every database time of dstack's."""
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def is_pseudo_date(value: datetime | None) -> bool:
    """A time of day on the 1970-01-01 pseudo date a rich log alone gives (date unknown)."""
    if value is None:
        return False
    return as_utc(value) < PSEUDO_DATE_LIMIT


FINAL = frozenset({"terminated", "failed", "aborted", "done"})


@dataclass(frozen=True)
class JobRole:
    """What the findings say a job was: a victim or a culprit, of which category."""

    role: str  # victim | culprit
    category: str
    detail: str  # 'VICTIM (collateral_termination)', 'CULPRIT (...)'


def job_roles(findings: Iterable[Finding]) -> dict[str, JobRole]:
    """Job id -> its role in `findings`; a job both culprit and victim is told as the victim."""
    marked: dict[str, JobRole] = {}
    for finding in findings:
        for culprit in finding.culprits:
            marked[culprit.job_id] = JobRole(
                "culprit", finding.category, f"CULPRIT ({finding.category})"
            )
        for victim in finding.victims:
            marked[victim.job_id] = JobRole(
                "victim",
                finding.category,
                f"VICTIM ({finding.category})"
                + (
                    ""
                    if victim.stopped
                    else f", not yet stopped: expected {victim.expected_termination_reason}"
                ),
            )
    return marked


@dataclass(frozen=True)
class Outage:
    """When a finding's service had no healthy replica: until it served again, or (not
    recovered) until the end of the evidence."""

    start: datetime
    stop: datetime
    recovered: bool


@dataclass(frozen=True)
class Healthy:
    """When a submission served (health 'healthy', proven by `proof`): from `since` (None: not
    recorded; `start` is then the earliest it can have been) until it stopped (None: still
    serving at the end of the evidence)."""

    since: datetime | None
    start: datetime | None
    until: datetime | None
    proof: str | None


@dataclass
class RunStory:
    """One run as every renderer tells it: its rows, the jobs' roles, the status path of each
    submission, the moments of its incidents and what the evidence cannot say (gaps)."""

    run: dict[str, Any]
    verdict: str | None
    gaps: list[str]
    findings: list[Finding]
    deployments: pl.DataFrame  # by deployment number
    submissions: pl.DataFrame  # in the frame's order
    events: pl.DataFrame  # every event of the run, as recorded
    roles: dict[str, JobRole]
    dateless: bool  # a rich log alone: times of day on the pseudo date
    usable_events: pl.DataFrame  # events on the run's own clock, in time order
    dropped_dateless: int  # undated log events of a dated run (not on its clock)
    status_events: dict[str, list[dict[str, Any]]]  # job id -> its job_status events
    capacity: list[tuple[datetime, int]]  # healthy replicas over time, on the run's clock
    end_of_evidence: datetime | None
    stops: dict[str, datetime | None] = field(default_factory=dict)  # job id -> when it stopped
    healthy: dict[str, Healthy] = field(default_factory=dict)  # job id -> its healthy interval

    def role_of(self, job_id: str) -> str:
        """'victim', 'culprit' or 'other' (a job the findings do not name)."""
        role = self.roles.get(job_id)
        return role.role if role else "other"

    @property
    def marks(self) -> dict[str, str]:
        """Job id -> 'victim' / 'culprit'."""
        return {job: role.role for job, role in self.roles.items()}

    def on_clock(self, value: datetime | None) -> datetime | None:
        """`value` when it is on the run's clock (dated, or times of day), else None."""
        value = as_utc(value)
        return value if value is not None and is_pseudo_date(value) == self.dateless else None

    def stop_of(self, job_id: str, recorded: datetime | None = None) -> datetime | None:
        """When a job stopped: the finding's time, else its table times (on the run's clock)."""
        return self.on_clock(recorded) or self.on_clock(self.stops.get(job_id))

    def terminating_at(self) -> list[datetime]:
        """When the run went TERMINATING (every sighting on the run's clock)."""
        terminating = self.usable_events.filter(
            (pl.col("kind") == "run_status") & (pl.col("new_status") == "terminating")
        )
        return [t for t in (self.on_clock(t) for t in terminating["time"]) if t is not None]

    def outage(self, finding: Finding) -> Outage | None:
        """The finding's outage: from its impact, or (no impact figure) from the victims' stops
        when the capacity then is zero; None when the evidence does not bound it."""
        impact = finding.impact
        start = as_utc(impact.outage_start) if impact else None
        if start is None:
            victim_stops = [self.stop_of(v.job_id, v.terminated_at) for v in finding.victims]
            if not victim_stops or any(s is None for s in victim_stops):
                return None
            start = max(s for s in victim_stops if s is not None)
            level = next((n for t, n in reversed(self.capacity) if t <= start), 0)
            if level > 0:
                return None
        if impact and impact.recovered and impact.recovered_at:
            return Outage(start, as_utc(impact.recovered_at), True)
        stop = self.end_of_evidence
        if stop is None or stop <= start:
            return None
        return Outage(start, stop, False)


def _first_time(row: dict[str, Any], *names: str) -> datetime | None:
    for name in names:
        value = row.get(name)
        if value is not None:
            return as_utc(value)
    return None


def _served_then_failed(
    submissions: pl.DataFrame,
    events: pl.DataFrame,
    ends_by_server: Callable[..., dict[str, datetime]] | None,
) -> dict[str, Healthy]:
    """The jobs whose final verdict is not healthy but whose states date a time they served
    (states.serving_spans: a replica that served, then failed a probe): their band, from the
    first time they served until the last."""
    unhealthy = submissions.filter(pl.col("health") != "healthy")
    if unhealthy.is_empty():
        return {}
    spans = serving_spans(unhealthy, events, ends_by_server() if ends_by_server else None)
    bands = spans.group_by("job_id").agg(
        pl.col("start").min(),
        pl.when(pl.col("until").is_null().any())
        .then(None)
        .otherwise(pl.col("until").max())
        .alias("until"),
    )
    proofs = dict(unhealthy.select("job_id", "health_proof").iter_rows())
    return {
        job_id: Healthy(
            since=as_utc(start),
            start=as_utc(start),
            until=as_utc(until),
            proof=f"served by its dated states, then {proofs.get(job_id) or 'not healthy'}",
        )
        for job_id, start, until in bands.iter_rows()
    }


def tell(
    run: dict[str, Any],
    *,
    submissions: pl.DataFrame,
    events: pl.DataFrame,
    deployments: pl.DataFrame,
    capacity: pl.DataFrame,
    findings: Sequence[Finding],
    verdicts: Sequence[RunVerdict],
    end_of_evidence: datetime | None,
    ends_by_server: Callable[..., dict[str, datetime]] | None = None,
) -> RunStory:
    """The story of `run` from its own rows (each frame already the run's) and the report's
    findings and verdicts (any run's: the run's are picked). `ends_by_server`: the evidence's
    (Evidence.ends_by_server), for the end of the evidence of the run's server."""
    key = (run["server"], run["run_id"])
    mine = [f for f in findings if (f.server, f.run_id) == key]
    verdict = next((v for v in verdicts if (v.server, v.run_id) == key), None)
    starts = [as_utc(run.get("submitted_at"))] + [
        _first_time(j, "created_at", "submitted_at") for j in submissions.iter_rows(named=True)
    ]
    first = min((s for s in starts if s is not None), default=None)
    dateless = is_pseudo_date(first) or (
        events.height > 0
        and events.filter(pl.col("time_basis") != "time_of_day_only").height == 0
        and first is None
    )
    if dateless:
        usable = events.filter(pl.col("time").is_not_null())
    else:
        usable = events.filter(
            pl.col("time").is_not_null() & (pl.col("time_basis") != "time_of_day_only")
        )
    dropped = 0 if dateless else events.height - usable.height
    usable = usable.sort(["time", "seq"], nulls_last=True)
    status_events: dict[str, list[dict[str, Any]]] = {}
    for event in usable.filter(pl.col("kind") == "job_status").iter_rows(named=True):
        status_events.setdefault(event["entity_id"], []).append(event)

    end = None
    for finding in mine:
        if finding.impact and finding.impact.end_of_evidence:
            end = as_utc(finding.impact.end_of_evidence)
    if end is None:
        by_server = ends_by_server(dated_only=not dateless) if ends_by_server else {}
        end = as_utc(by_server.get(run["server"]) or end_of_evidence)
    if end is not None and is_pseudo_date(end) != dateless:
        end = None  # a dated audit with an undated log, or the reverse: no bound on this clock
    steps = [
        (as_utc(t), int(n))
        for t, n in capacity.sort("time").select("time", "healthy_replicas").rows()
        if t is not None and is_pseudo_date(as_utc(t)) == dateless
    ]
    # a job still active when the evidence ends has not stopped: its last processing is no stop
    stops = {
        job["job_id"]: _first_time(job, "stopped_at", "finished_at")
        or (
            as_utc(job.get("last_processed_at"))
            if job.get("status") in FINISHED_JOB_STATUSES
            else None
        )
        for job in submissions.iter_rows(named=True)
    }
    healthy = {
        job["job_id"]: Healthy(
            since=as_utc(job.get("healthy_since")),
            start=_first_time(job, "healthy_since", "running_at", "created_at", "submitted_at"),
            until=as_utc(job.get("stopped_at")),
            proof=job.get("health_proof"),
        )
        for job in submissions.iter_rows(named=True)
        if job.get("health") == "healthy"
    }
    healthy |= _served_then_failed(submissions, events, ends_by_server)
    return RunStory(
        run=run,
        verdict=verdict.verdict if verdict else None,
        gaps=list(verdict.gaps) if verdict else [],
        findings=mine,
        deployments=deployments.sort("deployment_num"),
        submissions=submissions,
        events=events,
        roles=job_roles(mine),
        dateless=dateless,
        usable_events=usable,
        dropped_dateless=dropped,
        status_events=status_events,
        capacity=steps,
        end_of_evidence=end,
        stops=stops,
        healthy=healthy,
    )
