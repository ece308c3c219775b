"""Plain-text renderings: the terminal table of an audit and a run's timeline."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import polars as pl

from analyzer.report.schema import Finding, Report


def fmt_time(value: datetime | None, *, date: bool = True) -> str:
    if value is None:
        return "?"
    text = value.strftime("%Y-%m-%d %H:%M:%S.%f" if date else "%H:%M:%S.%f")[:-3]
    return text + ("Z" if date else "")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = float(seconds)
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    if days:
        return f"{days}d{hours:02d}h{minutes:02d}m"
    return f"{hours}h{minutes:02d}m{sec:02d}s" if hours else f"{minutes}m{sec:02d}s"


def fmt_cost(value: float | None, unknown: int = 0) -> str:
    if value is None:
        return "unknown"
    text = f"${value:,.4f}" if value < 1 else f"${value:,.2f}"
    return text + (f" (+{unknown} unpriced)" if unknown else "")


def _outage(finding: Finding) -> str:
    impact = finding.impact
    if impact is None or impact.outage_seconds is None:
        return "?"
    text = fmt_duration(impact.outage_seconds)
    return text + ("" if impact.recovered else " (not recovered)")


GROUP_HEADERS = ["key", "findings", "victims", "outage", "replica-time lost", "cost lost"]


def group_rows(groups) -> list[list[object]]:
    """The rows of a fleet summary table (same figures in every output format)."""
    return [
        [
            g.key,
            g.findings,
            g.victims,
            fmt_duration(g.outage_seconds),
            fmt_duration(g.healthy_replica_seconds_lost),
            fmt_cost(g.lost_cost, g.cost_unknown_victims),
        ]
        for g in groups
    ]


def _groups(title: str, groups) -> list[str]:
    if not groups:
        return []
    return ["", title, table(GROUP_HEADERS, group_rows(groups))]


def table(headers: Sequence[str], rows: Sequence[Sequence[object]], *, max_width: int = 60) -> str:
    """A left-aligned text table; cells longer than max_width are cut with an ellipsis."""

    def cell(value: object) -> str:
        text = "-" if value is None else str(value)
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    body = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in body]
    return "\n".join(lines)


def _run_label(item) -> str:
    label = f"{item.project}/{item.run_name}" if item.project else item.run_name
    return f"{item.server}:{label}" if item.server != "default" else label


def _victims(finding: Finding) -> str:
    return ", ".join(f"{v.job_name} (dep {v.deployment_num})" for v in finding.victims)


def _culprits(finding: Finding) -> str:
    return ", ".join(
        f"{c.job_name} (dep {c.deployment_num}): {c.termination_reason}"
        + (f" '{c.termination_reason_message}'" if c.termination_reason_message else "")
        for c in finding.culprits
    )


def render_table(report: Report) -> str:
    summary = report.summary
    out = [
        f"{report.generated_by}: {len(report.inputs)} input(s), {summary.runs} run(s), "
        f"{summary.findings} finding(s), {summary.victims} healthy replica(s) killed",
        "",
    ]
    if report.findings:
        out.append(
            "FINDINGS, worst first: healthy replicas terminated because another replica's "
            "failure failed the run"
        )
        out.append(
            table(
                [
                    "#",
                    "category",
                    "confidence",
                    "run",
                    "victims",
                    "culprit",
                    "update",
                    "killed at",
                    "outage",
                    "lost",
                    "cost",
                ],
                [
                    (
                        i,
                        f.category,
                        f.confidence,
                        _run_label(f),
                        _victims(f),
                        _culprits(f),
                        (f"{f.updated_by}: {f.changed_fields}" if f.changed_fields else "-"),
                        fmt_time(
                            max(
                                (v.terminated_at for v in f.victims if v.terminated_at),
                                default=None,
                            )
                        ),
                        _outage(f),
                        fmt_duration(f.impact.healthy_replica_seconds_lost if f.impact else None),
                        fmt_cost(f.impact.lost_cost if f.impact else None),
                    )
                    for i, f in enumerate(report.findings, 1)
                ],
            )
        )
        out += [
            "",
            f"IMPACT: {summary.victims} healthy replica(s) killed, outage "
            f"{fmt_duration(summary.outage_seconds)}, replica-time lost "
            f"{fmt_duration(summary.healthy_replica_seconds_lost)}, cost "
            f"{fmt_cost(summary.lost_cost, summary.cost_unknown_victims)} "
            "(until recovery, or until the end of the evidence "
            f"{fmt_time(report.end_of_evidence)})",
        ]
        if len(report.findings) > 1 or len(summary.by_server) > 1:
            if len(summary.by_server) > 1:
                out += _groups("BY SERVER", summary.by_server)
            out += _groups("BY PROJECT", summary.by_project)
            out += _groups("BY FLEET", summary.by_fleet)
            out += _groups("BY USER WHO APPLIED THE UPDATE", summary.by_user)
            out += _groups("BY DAY", summary.by_day)
            out += _groups("BY FAILURE CLASS", summary.by_failure_class)
    else:
        out.append("FINDINGS: none")
    out += ["", "RUNS"]
    out.append(
        table(
            ["verdict", "run", "run id", "type", "status", "deployment", "why"],
            [
                (
                    v.verdict,
                    _run_label(v),
                    v.run_id[:8],
                    v.run_type,
                    f"{v.status}"
                    + (f" ({v.termination_reason})" if v.termination_reason else "")
                    + (" [in progress]" if v.in_progress else ""),
                    v.deployment_num,
                    v.why,
                )
                for v in report.runs
            ],
            max_width=90,
        )
    )
    if report.limitations:
        out += ["", "LIMITATIONS (what the evidence cannot show)"]
        out += [f"- [{lim.code}] {lim.message} ({lim.source})" for lim in report.limitations]
    out += ["", "INPUTS"]
    out.append(
        table(
            ["path", "kind", "version", "records", "unparsed", "sha256"],
            [
                (i.path, i.kind, i.server_version, i.records, i.unparsed, (i.sha256 or "")[:16])
                for i in report.inputs
            ],
            max_width=70,
        )
    )
    if report.findings:
        out += [
            "",
            "Details: --format markdown or json; a run's story: "
            "dstack-audit timeline RUN SOURCE...",
        ]
    return "\n".join(out) + "\n"


def _time_of_day(value: datetime | None, *, date: bool = True) -> str:
    """A time from a log without a date: the time of day and the days rolled over."""
    if value is None:
        return "?"
    days = (value - datetime(1970, 1, 1, tzinfo=UTC)).days
    text = value.strftime("%H:%M:%S") + (f" (+{days}d)" if days else "")
    return text + (" (date unknown)" if date else "")


def _roles(findings: Sequence[Finding]) -> dict[str, str]:
    """job id -> what the findings say it was: a victim (of which category) or a culprit."""
    roles: dict[str, str] = {}
    for finding in findings:
        for culprit in finding.culprits:
            roles[culprit.job_id] = f"CULPRIT ({finding.category})"
        for victim in finding.victims:
            roles[victim.job_id] = f"VICTIM ({finding.category})" + (
                ""
                if victim.stopped
                else f", not yet stopped: expected {victim.expected_termination_reason}"
            )
    return roles


def render_timeline(
    run: dict,
    verdict: str | None,
    deployments: pl.DataFrame,
    subs: pl.DataFrame,
    events: pl.DataFrame,
    findings: Sequence[Finding] = (),
) -> str:
    """A run's story: deployments, replica slots with each submission's path (bumps in place,
    replica groups, victims and culprits marked), then every event."""
    when = fmt_time
    if events.height and (events["time_basis"] == "time_of_day_only").any():
        when = _time_of_day  # a rich log alone: no date is shown, because none is known
    out = [
        f"run {run['project'] or '(project unknown)'}/{run['run_name']}  id {run['run_id']}  "
        f"{run['run_type'] or 'type unknown'}"
        f"  {run['status']}"
        + (f" ({run['termination_reason']})" if run["termination_reason"] else "")
        + f"  deployment {run['deployment_num']}"
        + (f"  verdict: {verdict}" if verdict else ""),
        f"submitted {when(run['submitted_at'])} by {run['user'] or '?'}  [{run['provenance']}]",
    ]
    deleted_events = events.filter(pl.col("message") == "Run deleted")
    if run.get("deleted") or deleted_events.height:
        by = deleted_events.row(0, named=True) if deleted_events.height else None
        out.append(
            "deleted: the run row is marked deleted (a later run of the same name replaced it)"
            + (
                f"; event 'Run deleted' {when(by['time']) if by['time'] else by['time_text']}"
                f" by {by['actor']}"
                if by
                else ""
            )
        )
    out += ["", "DEPLOYMENTS"]
    for dep in deployments.iter_rows(named=True):
        if dep["deployment_num"] == 0:
            began = f"began {when(dep['began_at'])} (run submitted)"
        elif dep["began_at"] is not None:
            began = (
                f"began {when(dep['began_at'])} by {dep['actor']}, changed {dep['changed_fields']}"
            )
        else:
            began = (
                f"began at or before {when(dep['first_job_at'])} (no event records the update)"
                if dep["first_job_at"]
                else "began at an unrecorded time (no event, no job created at this deployment)"
            )
        out.append(
            f"  #{dep['deployment_num']}  {began}; jobs now at this deployment: {dep['jobs']}"
        )
    out += ["", "REPLICA SLOTS (every submission, keyed on job id)"]
    roles = _roles(findings)
    status_events = events.filter(pl.col("kind") == "job_status")
    for slot, rows in subs.group_by(["replica_num", "job_num"], maintain_order=True):
        out.append(f"  replica {slot[0]} job {slot[1]}")
        for job in rows.iter_rows(named=True):
            created = job.get("created_deployment")
            deployment = (
                f"created in deployment {created}, bumped in place to {job['deployment_num']}"
                if created is not None
                and job["deployment_num"] is not None
                and created < job["deployment_num"]
                else f"deployment {job['deployment_num']}"
            )
            out.append(
                f"    {job['job_name']}  job {job['job_id']}  {deployment}"
                f"  submission {job['submission_num']}"
                + (f"  group {job['replica_group']}" if job.get("replica_group") else "")
                + (f"  ** {roles[job['job_id']]} **" if job["job_id"] in roles else "")
                + f"  [{job['provenance']}]"
            )
            steps = [f"submitted {when(job['created_at'], date=False)}"]
            changes = status_events.filter(pl.col("entity_id") == job["job_id"])
            if changes.height:
                for change in changes.iter_rows(named=True):
                    reason = change["termination_reason"]
                    message = change["termination_message"]
                    steps.append(
                        f"{change['new_status']} {when(change['time'], date=False)}"
                        + (
                            f" ({reason}" + (f": {message}" if message else "") + ")"
                            if reason
                            else ""
                        )
                    )
            else:
                if job["running_at"] is not None:
                    steps.append(f"running {when(job['running_at'], date=False)}")
                reason = job["termination_reason"]
                steps.append(
                    f"{job['status']} by {when(job['last_processed_at'], date=False)}"
                    + (f" ({reason})" if reason else "")
                    + " (table times)"
                )
            out.append("      " + " -> ".join(steps))
            if job["health"] == "healthy":
                since = job["healthy_since"]
                until = job["stopped_at"]
                out.append(
                    f"      healthy {when(since, date=False) if since else '(since unknown)'}"
                    f" -> {when(until, date=False) if until else 'end of evidence'}"
                    f" (proof: {job['health_proof']})"
                )
            else:
                proof = job["health_proof"] or "no proof either way"
                out.append(f"      health: {job['health']} ({proof})")
    out += ["", "EVENTS"]
    if events.height == 0:
        out.append("  none recorded (dstack < 0.20.0, events past their TTL, or no log given)")
    for event in events.filter(pl.col("kind") != "other").iter_rows(named=True):
        out.append(
            f"  {when(event['time']) if event['time'] else event['time_text']}  "
            f"{event['entity_type']} {event['entity_name']}: {event['message']}"
            + (f"  (by {event['actor']})" if event["actor"] not in (None, "system") else "")
            + f"  [{'; '.join(event['provenance'] or [])}]"
        )
    return "\n".join(out) + "\n"
