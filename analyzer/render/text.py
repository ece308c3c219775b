"""Plain-text renderings: the figures every format shares and a run's timeline (the terminal
table of an audit is report/screen.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, tzinfo

import polars as pl

from analyzer.contract import Finding
from analyzer.pipeline.story import RunStory, is_pseudo_date, tell
from analyzer.render.format import fmt_time, fmt_time_of_day


def _provenance(sources: Sequence[str] | str | None, show: bool) -> str:
    """Where a record came from: every source with --sources, else how many."""
    listed = [s for s in (sources.split("; ") if isinstance(sources, str) else sources or []) if s]
    if show:
        return f"[{'; '.join(listed)}]"
    return f"[sources:{len(listed)}]"


def _fit(lines: list[str], width: int) -> list[str]:
    """Each line wrapped at spaces to `width`, continuation lines indented under it."""
    import textwrap

    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()) + 4)
        out += textwrap.wrap(
            line,
            width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
    return out


def render_timeline(
    run: dict,
    verdict: str | None,
    deployments: pl.DataFrame,
    subs: pl.DataFrame,
    events: pl.DataFrame,
    *,
    width: int = 100,
    sources: bool = False,
    roles: dict[str, str] | None = None,
    tz: tzinfo | None = None,
    findings: Sequence[Finding] = (),
) -> str:
    """The timeline of one run given as its frames (the CLI's call): its story, told by
    `timeline_text`. `roles` are the findings' (the story takes them from `findings`)."""
    story = tell(
        run,
        submissions=subs,
        events=events,
        deployments=deployments,
        capacity=pl.DataFrame(
            schema={"time": pl.Datetime("us", "UTC"), "healthy_replicas": pl.Int64}
        ),
        findings=findings,
        verdicts=[],
        end_of_evidence=None,
    )
    story.verdict = verdict
    return timeline_text(story, width=width, sources=sources, tz=tz)


def timeline_text(
    story: RunStory, *, width: int = 100, sources: bool = False, tz: tzinfo | None = None
) -> str:
    """A run's story: deployments, replica slots with each submission's path (bumps in place,
    replica groups, victims and culprits with the findings' details), then every event (one line
    per event across sources, victims and culprits marked), fitted to `width`."""
    from analyzer.render.timeline_view import merged_events

    run, verdict, events = story.run, story.verdict, story.events
    deployments, subs = story.deployments, story.submissions

    def when(value: datetime | None, *, date: bool = True) -> str:
        if story.dateless or is_pseudo_date(value):
            return fmt_time_of_day(value, date=date)  # a rich log alone: no date is known
        return fmt_time(value, date=date, tz=tz)

    out = [
        f"run {run['project'] or '(project unknown)'}/{run['run_name']}  id {run['run_id']}  "
        f"{run['run_type'] or 'type unknown'}"
        f"  {run['status']}"
        + (f" ({run['termination_reason']})" if run["termination_reason"] else "")
        + f"  deployment {run['deployment_num']}"
        + (f"  verdict: {verdict}" if verdict else ""),
        f"submitted {when(run['submitted_at'])} by {run['user'] or '?'}  "
        + _provenance(run["provenance"], sources),
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
                f"began {when(dep['began_at'])} by {dep['actor']}, "
                f"changed {', '.join(dep['changed_fields'] or []) or '?'}"
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
    details = {job: role.detail for job, role in story.roles.items()}
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
                + (f"  ** {details[job['job_id']]} **" if job["job_id"] in details else "")
                + "  "
                + _provenance(job["provenance"], sources)
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
            healthy = story.healthy.get(job["job_id"])
            if healthy is not None:
                since, until = healthy.since, healthy.until
                out.append(
                    f"      healthy {when(since, date=False) if since else '(since unknown)'}"
                    f" -> {when(until, date=False) if until else 'end of evidence'}"
                    f" (proof: {healthy.proof})"
                )
            else:
                proof = job["health_proof"] or "no proof either way"
                out.append(f"      health: {job['health']} ({proof})")
    out += ["", "EVENTS"]
    if events.height == 0:
        out.append("  none recorded (dstack < 0.20.0, events past their TTL, or no log given)")
    for event in merged_events(events, story.marks):
        role = f" [{event['role']}]" if event["role"] else ""
        out.append(
            f"  {when(event['time']) if event['time'] else event['time_text']}  "
            f"{event['entity_type']} {event['entity_name']}{role}: {event['message']}"
            + (f"  (by {event['actor']})" if event["actor"] not in (None, "system") else "")
            + "  "
            + _provenance(event["provenance"], sources)
        )
    return "\n".join(_fit(out, width)) + "\n"
