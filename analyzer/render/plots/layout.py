"""What a run's swimlane shows, from its story: the lanes (a header per deployment, one lane
per submission, older retries collapsed), each submission's status path, the numbered markers,
the outages and the window drawn. No drawing here: plots/run.py draws this layout."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from analyzer.contract import Finding
from analyzer.errors import AuditInputError
from analyzer.pipeline.story import Healthy, RunStory, as_utc
from analyzer.redact import without_controls
from analyzer.render.format import (
    Clock,
    actor_name,
    describe_failure,
    field_names,
    floor_duration,
    fmt_seconds,
    outage_text,
    resolve_zone,
)
from analyzer.render.plots.style import FINAL, KEEP_PER_SLOT, MARKER_STYLE, STATUS_COLORS

# ---------------------------------------------------------------------------------------------
# What a run's picture is made of


@dataclass
class Marker:
    time: datetime
    kind: str
    text: str
    lanes: list[int] = field(default_factory=list)
    number: int = 0
    offscreen: bool = False  # beyond the plotted window: in the key only


@dataclass
class Lane:
    label: str
    kind: str  # header | job | collapsed
    deployment: int | None
    role: str | None = None  # victim | culprit
    jobs: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None  # header text drawn inside the band


@dataclass
class RunView:
    run: dict[str, Any]
    verdict: str | None
    findings: list[Finding]
    lanes: list[Lane]
    status_events: dict[str, list[dict[str, Any]]]
    capacity: list[tuple[datetime, int]]
    markers: list[Marker]
    outages: list[tuple[datetime, datetime, str]]
    left: datetime
    right: datetime
    end_of_evidence: datetime | None
    clock: Clock
    collapsed: int
    dropped_dateless: int
    healthy: dict[str, Healthy]


def first_time(row: dict[str, Any], *names: str) -> datetime | None:
    for name in names:
        value = row.get(name)
        if value is not None:
            return as_utc(value)
    return None


def job_final(job: dict[str, Any], events: list[dict[str, Any]]) -> datetime | None:
    finals = [e["time"] for e in events if e["new_status"] in FINAL]
    if finals:
        return finals[-1]
    if job.get("status") in FINAL:
        return first_time(job, "finished_at", "last_processed_at", "stopped_at")
    return None


def status_path(
    job: dict[str, Any], events: list[dict[str, Any]], end: datetime
) -> tuple[list[tuple[datetime, datetime, str]], tuple[datetime, str] | None]:
    """A submission's status path: (start, stop, status) bars and its final status, from its
    job_status events, or from the table times when no event was recorded."""
    start = first_time(job, "created_at", "submitted_at")
    segments: list[tuple[datetime, datetime, str]] = []
    if events:
        current = events[0]["old_status"] or "submitted"
        at = start or events[0]["time"]
        for event in events:
            if event["time"] > at:
                segments.append((at, event["time"], current))
            at = max(at, event["time"])
            current = event["new_status"] or current
        if current in FINAL:
            return segments, (at, current)
        segments.append((at, max(end, at), current))
        return segments, None
    if start is None:
        return [], None
    running = first_time(job, "running_at")
    stopped = first_time(job, "stopped_at")
    status = job.get("status")
    final_at = first_time(job, "finished_at", "last_processed_at") if status in FINAL else None
    stop = stopped or final_at or end
    if running is not None:
        segments.append((start, running, "submitted"))
        segments.append((running, max(stop, running), "running"))
    else:
        segments.append((start, max(stop, start), "unknown"))
    if stopped is not None and status in FINAL and final_at and final_at > stopped:
        segments.append((stopped, final_at, "terminating"))
    if status in FINAL:
        return segments, (final_at or stop, status)
    if status in STATUS_COLORS and segments and stop == end and status != "running":
        segments[-1] = (segments[-1][0], segments[-1][1], status)
    return segments, None


def run_view(
    audit: Any, run_id: str, clock_tz: str | None, story: RunStory | None = None
) -> RunView:
    """The layout of a run's picture (lanes, markers, window) from its story (told here
    unless the caller told it already)."""
    redact: Callable[[str], str] = str  # the texts are redacted together below
    story = story if story is not None else audit.story(run_id)
    run, findings, usable = story.run, story.findings, story.usable_events
    dateless, end_of_evidence = story.dateless, story.end_of_evidence
    subs = story.submissions.sort(
        ["deployment_num", "replica_num", "job_num", "submission_num"], nulls_last=True
    )
    deployments = story.deployments
    clock = Clock(resolve_zone(clock_tz), dateless)
    starts = [as_utc(run.get("submitted_at"))] + [
        first_time(j, "created_at", "submitted_at") for j in subs.iter_rows(named=True)
    ]

    # What the evidence spans, for this run
    times: list[datetime] = [t for t in starts if t is not None]
    times += [t for t in usable["time"].to_list() if t is not None]
    for job in subs.iter_rows(named=True):
        times += [
            t
            for t in (
                first_time(job, "running_at"),
                first_time(job, "stopped_at"),
                first_time(job, "finished_at"),
                first_time(job, "last_processed_at"),
            )
            if t is not None
        ]
    if run.get("last_processed_at") is not None:
        times.append(as_utc(run["last_processed_at"]))
    if not times:
        raise AuditInputError(run["run_id"], "the run has no recorded times to draw")
    left, right = min(times), max(times)
    active = (
        any((j["status"] not in FINAL) for j in subs.iter_rows(named=True))
        or run.get("status") not in FINAL
    )
    if active and end_of_evidence is not None and end_of_evidence > right:
        right = end_of_evidence

    # Lanes: per deployment a header, then its submissions (older retries of a slot collapsed)
    victims = {v.job_id for f in findings for v in f.victims}
    culprits = {c.job_id for f in findings for c in f.culprits}
    lanes: list[Lane] = []
    dep_rows = {d["deployment_num"]: d for d in deployments.iter_rows(named=True)}
    dep_nums = sorted(
        set(dep_rows) | set(subs["deployment_num"].to_list()), key=lambda d: (d is None, d or 0)
    )
    collapsed_total = 0
    for dep in dep_nums:
        info = dep_rows.get(dep, {})
        lanes.append(
            Lane(
                label=redact(f"deployment {dep}" if dep is not None else "deployment unknown"),
                kind="header",
                deployment=dep,
                note=redact(_deployment_note(info, dep, run, clock)),
            )
        )
        dep_subs = subs.filter(
            pl.col("deployment_num").is_null() if dep is None else pl.col("deployment_num") == dep
        )
        for _, slot in dep_subs.group_by(["replica_num", "job_num"], maintain_order=True):
            rows = slot.sort("submission_num", nulls_last=False).to_dicts()
            keep_ids = {r["job_id"] for r in rows[-KEEP_PER_SLOT:]} | {
                r["job_id"] for r in rows if r["job_id"] in victims | culprits
            }
            older = [r for r in rows if r["job_id"] not in keep_ids]
            if older:
                collapsed_total += len(older)
                nums = [r["submission_num"] for r in older if r["submission_num"] is not None]
                span = f" (sub {min(nums)}-{max(nums)})" if len(nums) > 1 else ""
                lanes.append(
                    Lane(
                        label=redact(
                            f"{older[-1]['job_name']}: {len(older)} earlier submission"
                            f"{'s' if len(older) != 1 else ''} collapsed{span}"
                        ),
                        kind="collapsed",
                        deployment=dep,
                        jobs=older,
                    )
                )
            for row in rows:
                if row["job_id"] not in keep_ids:
                    continue
                role = (
                    "victim"
                    if row["job_id"] in victims
                    else "culprit"
                    if row["job_id"] in culprits
                    else None
                )
                sub = row["submission_num"] if row["submission_num"] is not None else "?"
                label = f"{row['job_name']} · sub {sub}"
                lanes.append(
                    Lane(
                        label=redact(label + (f" · {role}" if role else "")),
                        kind="job",
                        deployment=dep,
                        role=role,
                        jobs=[row],
                    )
                )
    lane_of = {
        job["job_id"]: i for i, lane in enumerate(lanes) if lane.kind == "job" for job in lane.jobs
    }
    markers = _markers(story, lane_of, clock, redact)
    _redact_texts(audit, lanes, markers)
    reach = timedelta(seconds=0.25 * ((right - left).total_seconds() or 1.0))
    for marker in markers:
        if marker.time > right + reach:
            marker.offscreen = True  # a recovery days later: said in the key, not drawn
            continue
        right = max(right, marker.time)
        left = min(left, marker.time)

    outages: list[tuple[datetime, datetime, str]] = []
    for finding in findings:
        outage = _outage(story, finding, clock)
        if outage is None:
            continue
        same = [
            i
            for i, o in enumerate(outages)
            if o[1] == outage[1] and abs((o[0] - outage[0]).total_seconds()) <= 1.0
        ]
        if not same:
            outages.append(outage)
        elif outage[0] < outages[same[0]][0]:
            outages[same[0]] = outage
    span = (right - left).total_seconds() or 1.0
    for start, stop, _ in outages:
        left = min(left, start)
        if (stop - right).total_seconds() <= 0.25 * span:
            right = max(right, stop)
    if end_of_evidence is not None and 0 < (end_of_evidence - right).total_seconds() <= 0.1 * span:
        right = end_of_evidence
    if end_of_evidence is not None and left <= end_of_evidence <= right:
        markers.append(
            Marker(
                end_of_evidence,
                "end_of_evidence",
                f"end of the evidence ({clock.near(end_of_evidence, left)})",
            )
        )
    markers.sort(key=lambda m: (m.time, list(MARKER_STYLE).index(m.kind)))
    numbered = (m for m in markers if m.kind != "end_of_evidence" and not m.offscreen)
    for number, marker in enumerate(numbered, 1):
        marker.number = number
    return RunView(
        run=run,
        verdict=story.verdict,
        findings=findings,
        lanes=lanes,
        status_events=story.status_events,
        capacity=story.capacity,
        markers=markers,
        outages=outages,
        left=left,
        right=right,
        end_of_evidence=end_of_evidence,
        clock=clock,
        collapsed=collapsed_total,
        dropped_dateless=story.dropped_dateless,
        healthy=story.healthy,
    )


def _redact_texts(audit: Any, lanes: list[Lane], markers: list[Marker]) -> None:
    """Every lane's label and note and every marker's text as `audit.redact` gives it (its
    control characters removed, then masked), in one pass: a pass costs about as much for
    one text as for hundreds."""
    texts = [lane.label for lane in lanes] + [lane.note or "" for lane in lanes]
    texts += [marker.text for marker in markers]
    clean = pl.Series([without_controls(text) for text in texts], dtype=pl.String)
    masked = audit.evidence.redactor.apply_series(clean).to_list()
    count = len(lanes)
    labels, notes, said = masked[:count], masked[count : 2 * count], masked[2 * count :]
    for lane, label, note in zip(lanes, labels, notes, strict=True):
        lane.label = label
        lane.note = note if lane.note is not None else None
    for marker, text in zip(markers, said, strict=True):
        marker.text = text


def _deployment_note(
    info: dict[str, Any], dep: int | None, run: dict[str, Any], clock: Clock
) -> str:
    began = as_utc(info.get("began_at"))
    actor = actor_name(info.get("actor")) or (run.get("user") if dep == 0 else None)
    if dep == 0:
        return f"run submitted {clock.tod(began or as_utc(run.get('submitted_at')))}" + (
            f" by {actor}" if actor else ""
        )
    fields = field_names(info.get("changed_fields"))
    if began is not None:
        return (
            f"update {clock.tod(began)}"
            + (f" by {actor}" if actor else "")
            + (f": changed {fields}" if fields else "")
        )
    first = as_utc(info.get("first_job_at"))
    if first is not None:
        return f"update at or before {clock.tod(first)} (no event records it)"
    return "update time not recorded (in-place bump)"


def _markers(
    story: RunStory, lane_of: dict[str, int], clock: Clock, redact: Callable[[str], str]
) -> list[Marker]:
    """The story's moments as numbered markers: updates, the run going TERMINATING, the
    culprits' failures, the recoveries and the victims' stops (one marker per moment)."""
    markers: list[Marker] = []
    events, findings = story.usable_events, story.findings
    for dep in story.deployments.iter_rows(named=True):
        if not dep["deployment_num"]:
            continue
        began = story.on_clock(dep["began_at"])
        if began is None:
            continue
        actor = actor_name(dep["actor"])
        fields = field_names(dep["changed_fields"])
        markers.append(
            Marker(
                began,
                "update",
                redact(
                    f"update → deployment {dep['deployment_num']}"
                    + (f" by {actor}" if actor else "")
                    + (f": changed {fields}" if fields else "")
                ),
            )
        )
    if not markers:
        # no deployments frame entry: the run_updated events themselves
        for event in events.filter(pl.col("kind") == "run_updated").iter_rows(named=True):
            markers.append(Marker(event["time"], "update", redact(event["message"] or "update")))
    for event in events.filter(
        (pl.col("kind") == "run_status") & (pl.col("new_status") == "terminating")
    ).iter_rows(named=True):
        reason = (event["termination_reason"] or "").upper()
        markers.append(
            Marker(
                event["time"],
                "run_terminating",
                redact("run TERMINATING" + (f" ({reason})" if reason else "")),
            )
        )
    for finding in findings:
        for culprit in finding.culprits:
            at = story.stop_of(culprit.job_id, culprit.failed_at)
            if at is None:
                continue
            markers.append(
                Marker(
                    at,
                    "culprit_failure",
                    redact(
                        f"{culprit.job_name} (deployment {culprit.deployment_num}) "
                        f"{describe_failure(culprit)}"
                    ),
                    [lane_of[culprit.job_id]] if culprit.job_id in lane_of else [],
                )
            )
        impact = finding.impact
        if impact and impact.recovered and impact.recovered_at:
            same = impact.recovered_by_run_id == finding.run_id
            markers.append(
                Marker(
                    as_utc(impact.recovered_at),
                    "recovered",
                    redact(
                        "the service served again"
                        + ("" if same else f" (run {(impact.recovered_by_run_id or '?')[:8]})")
                    ),
                )
            )
    # victims' stops, across the run's findings: one marker per moment (within a second)
    victims = {v.job_id: v for finding in findings for v in finding.victims}
    reasons = dict(story.submissions.select("job_id", "termination_reason").iter_rows())
    statuses = dict(story.submissions.select("job_id", "status").iter_rows())
    # a copy taken mid-cascade: a victim the cascade has not reached is drawn running to the
    # end of the evidence, its stop only expected (pipeline_tasks/runs/terminating.py)
    pending = [v for v in victims.values() if not v.stopped]
    end_of_evidence = story.end_of_evidence
    if pending and end_of_evidence is not None:
        expected = sorted({(v.expected_termination_reason or "?").upper() for v in pending})
        still = sorted({(statuses.get(v.job_id) or "?").upper() for v in pending})
        markers.append(
            Marker(
                as_utc(end_of_evidence),
                "victim_pending",
                redact(
                    f"healthy replica(s) {', '.join(sorted(v.job_name for v in pending))} still "
                    f"{'/'.join(still)} when the evidence ends: not yet stopped, dstack's "
                    f"terminating pass will stop them with {' / '.join(expected)} (expected)"
                ),
                [lane_of[v.job_id] for v in pending if v.job_id in lane_of],
            )
        )
    timed = sorted(
        (
            (at, victim)
            for victim in victims.values()
            if (at := story.stop_of(victim.job_id, victim.terminated_at)) is not None
        ),
        key=lambda pair: (pair[0], pair[1].job_name),
    )
    groups: list[list[tuple[datetime, Any]]] = []
    for at, victim in timed:
        if groups and (at - groups[-1][0][0]).total_seconds() <= 1.0:
            groups[-1].append((at, victim))
        else:
            groups.append([(at, victim)])
    for group in groups:
        names = [v.job_name for _, v in group]
        deps = sorted({v.deployment_num for _, v in group if v.deployment_num is not None})
        dep_text = (
            f"deployment {deps[0]}"
            if len(deps) == 1
            else f"deployments {', '.join(str(d) for d in deps)}"
            if deps
            else "deployment ?"
        )
        # the reason each one was stopped with (the cascade's, or a user's stop that reached
        # it after the failure), as its row says
        reason = " / ".join(sorted({(reasons.get(v.job_id) or "?").upper() for _, v in group}))
        if len(names) == 1:
            text = f"healthy replica {names[0]} ({dep_text}) stopped: {reason}"
        else:
            shown = ", ".join(names[:5]) + (f", … (+{len(names) - 5})" if len(names) > 5 else "")
            text = f"{len(names)} healthy replicas of {dep_text} stopped: {reason} ({shown})"
        markers.append(
            Marker(
                group[0][0],
                "victim_stop",
                redact(text),
                [lane_of[v.job_id] for _, v in group if v.job_id in lane_of],
            )
        )
    # one marker per kind and moment (a run's TERMINATING seen twice, say)
    unique: dict[tuple[str, datetime, str], Marker] = {}
    for marker in markers:
        unique.setdefault((marker.kind, marker.time, marker.text), marker)
    return list(unique.values())


def _outage(
    story: RunStory, finding: Finding, clock: Clock
) -> tuple[datetime, datetime, str] | None:
    outage = story.outage(finding)
    if outage is None:
        return None
    impact = finding.impact
    if impact is not None and impact.outage_seconds is not None:
        seconds = outage_text(impact)  # the finding's figure, as exactly as it is known
    else:
        measured = (outage.stop - outage.start).total_seconds()
        seconds = (
            fmt_seconds(measured)
            if outage.recovered
            else "≥ " + fmt_seconds(floor_duration(measured))
        )
    if outage.recovered:
        return outage.start, outage.stop, f"outage {seconds}, until served again"
    return (
        outage.start,
        outage.stop,
        f"outage {seconds}: not recovered as of the end of the evidence "
        f"({clock.near(outage.stop, outage.start)})",
    )


def zoom_window(view: RunView) -> tuple[datetime, datetime] | None:
    """The incident's window when it is a small part of the run (else None: no zoom panel)."""
    moments = [m.time for m in view.markers if m.kind != "end_of_evidence" and not m.offscreen]
    if not view.findings or not moments:
        return None
    start, stop = min(moments), max(moments)
    for lane in view.lanes:
        if lane.role:
            for job in lane.jobs:
                final = job_final(job, view.status_events.get(job["job_id"], []))
                if final is not None and final > stop:
                    stop = final
    for outage_start, outage_stop, _ in view.outages:
        stop = max(stop, min(outage_stop, view.right))
        start = min(start, outage_start)
    failures = [m.time for m in view.markers if m.kind == "culprit_failure"]
    if failures:
        # a long wait between the update and the failure: zoom on the cascade, the update
        # stays in the whole-run panel (and is pointed at from the zoom's left edge)
        cascade = (stop - min(failures)).total_seconds()
        if (min(failures) - start).total_seconds() > 2 * max(cascade, 1.0):
            start = (
                min(min(failures), *(o[0] for o in view.outages)) if view.outages else min(failures)
            )
    total = (view.right - view.left).total_seconds()
    window = (stop - start).total_seconds()
    if total <= 0 or window > 0.3 * total:
        return None
    pad = timedelta(seconds=max(0.08 * window, 1.0))
    return max(start - pad, view.left - pad), stop + pad


def callout_levels(xs: Sequence[float], gap: float) -> list[int]:
    """Callouts over the lanes, stacked greedily: each goes to the lowest level where it
    touches no other."""
    placed: dict[int, list[float]] = {}
    levels = []
    for x in xs:
        level = 0
        while any(abs(x - other) < gap for other in placed.get(level, [])):
            level += 1
        placed.setdefault(level, []).append(x)
        levels.append(level)
    return levels


def title_lines(view: RunView) -> tuple[str, str]:
    """The picture's title and subtitle (not yet redacted)."""
    run = view.run
    label = f"{run['project']}/{run['run_name']}" if run.get("project") else run["run_name"]
    server = f"{run['server']}:" if run.get("server") not in (None, "default") else ""
    title = f"{server}{label} · run {run['run_id'][:8]} · {run.get('run_type') or 'type ?'}"
    parts = []
    if view.verdict:
        parts.append(f"verdict: {view.verdict}")
    categories = sorted({f.category for f in view.findings} - {view.verdict})
    if categories:  # a finding of another category than the run's verdict names its own
        parts.append(f"also: {', '.join(categories)}")
    victims = sum(len(f.victims) for f in view.findings)
    if victims:
        parts.append(f"{victims} healthy replica{'s' if victims != 1 else ''} killed")
    parts.append(f"times: {view.clock.name}")
    if view.clock.dateless:
        parts.append("rich log: times of day only")
    if view.collapsed:
        parts.append(f"{view.collapsed} superseded submission(s) collapsed")
    if view.dropped_dateless:
        parts.append(f"{view.dropped_dateless} undated log event(s) not drawn")
    return title, "  ·  ".join(parts)


def wrap(text: str, width: int) -> list[str]:
    """`text` in lines of at most `width` characters, broken between words."""
    words = text.split(" ")
    lines, line = [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def legend_entries(view: RunView) -> list[tuple[str, str, str]]:
    """(look, what, label) of the key of colours and shapes under the lanes: a status bar, the
    status not recorded, a final status, the healthy hatch (its start estimated), the outage, a
    point marker; only what the picture shows beyond the statuses."""
    entries = [("status", s, s) for s in STATUS_COLORS if s != "unknown"]
    jobs = [j for lane in view.lanes for j in lane.jobs]
    if any(not view.status_events.get(j["job_id"]) and j.get("running_at") is None for j in jobs):
        entries.append(("unknown", "unknown", "status not recorded (tables)"))
    entries += [("final", s, s) for s in ("terminated", "failed")]
    entries.append(("healthy", "healthy", "healthy (serving)"))
    if any(j["job_id"] in view.healthy and view.healthy[j["job_id"]].since is None for j in jobs):
        entries.append(("healthy-estimated", "healthy", "healthy, start not recorded"))
    if view.outages:
        entries.append(("outage", "outage", "outage"))
    for kind, label in (("culprit_failure", "culprit failed"), ("victim_stop", "victim stopped")):
        if any(m.kind == kind for m in view.markers):
            entries.append(("point", kind, label))
    return entries


def key_lines(view: RunView, *, zoom: bool) -> list[tuple[Marker | None, str, bool]]:
    """(marker, line, first line of its marker) of the numbered key under the picture, and a
    line per outage."""
    precise = any(m.time.microsecond for m in view.markers)
    lines: list[tuple[Marker | None, str, bool]] = []
    for marker in view.markers:
        prefix = f"{marker.number}  " if marker.number else "·  "
        text = f"{prefix}{view.clock.near(marker.time, view.left, ms=precise)}  {marker.text}"
        if marker.offscreen:
            text += " (after the plotted window)"
        for j, line in enumerate(wrap(text, 150 if zoom else 120)):
            lines.append((marker, ("      " if j else "") + line, j == 0))
    for _, _, text in view.outages:
        lines.append((None, f"▮  {text}", True))
    return lines
