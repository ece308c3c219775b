"""Pictures of the evidence: a run's swimlane timeline and the fleet-wide charts.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas: nothing opens a display,
nothing touches pyplot's global state, and notebooks can show the returned figures. Every text
drawn comes from the audit and passes through `audit.redact` first (a picture cannot be redacted
after it is drawn).

Times are UTC unless a display zone (IANA name) is given. Evidence that carries times of day
only (a rich log alone: a 1970-01-01 pseudo date, zone unknown) is drawn on a time-of-day axis
that says so, and its pseudo date is never shown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import matplotlib.dates as mdates
import polars as pl
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from analyzer.contract import Finding, Report
from analyzer.errors import AuditInputError
from analyzer.pipeline.story import RunStory, as_utc
from analyzer.redact import without_controls
from analyzer.render.format import (
    Clock,
    actor_name,
    describe_failure,
    field_names,
    fmt_cost,
    fmt_duration,
    fmt_seconds,
    resolve_zone,
)

# Older submissions of one replica slot beyond this many are collapsed into one lane.
KEEP_PER_SLOT = 3

STATUS_COLORS = {
    "submitted": "#c6c6c6",
    "provisioning": "#9ecae1",
    "pulling": "#4a90c8",
    "running": "#41ab5d",
    "terminating": "#fd8d3c",
    "unknown": "#ececec",  # tables only: the status between submission and stop is not recorded
}
FINAL_COLORS = {
    "terminated": "#252525",
    "failed": "#d7301f",
    "aborted": "#7a7a7a",
    "done": "#2171b5",
}
FINAL = frozenset(FINAL_COLORS)
HEALTHY_EDGE = "#00441b"
MARKER_STYLE = {
    # kind: (colour, line style, legend text)
    "update": ("#3f51b5", (0, (5, 3)), "update (new deployment)"),
    "culprit_failure": ("#d7301f", "-", "culprit's failure"),
    "run_terminating": ("#e66101", (0, (6, 2, 1, 2)), "run TERMINATING"),
    "victim_stop": ("#7b3294", (0, (1, 1.5)), "healthy replica stopped"),
    "recovered": ("#1a9850", (0, (4, 2)), "served again"),
    "end_of_evidence": ("#7a7a7a", (0, (1, 3)), "end of the evidence"),
}
OUTAGE_COLOR = "#e31a1c"

# Markers drawn on the lanes of the jobs they concern: (matplotlib marker, size).
LANE_POINTS = {"culprit_failure": ("X", 11), "victim_stop": ("v", 10)}


# ---------------------------------------------------------------------------------------------
# What a run's picture is made of


@dataclass
class _Marker:
    time: datetime
    kind: str
    text: str
    lanes: list[int] = field(default_factory=list)
    number: int = 0
    offscreen: bool = False  # beyond the plotted window: in the key only


@dataclass
class _Lane:
    label: str
    kind: str  # header | job | collapsed
    deployment: int | None
    role: str | None = None  # victim | culprit
    jobs: list[dict[str, Any]] = field(default_factory=list)
    note: str | None = None  # header text drawn inside the band


@dataclass
class _RunView:
    run: dict[str, Any]
    verdict: str | None
    findings: list[Finding]
    lanes: list[_Lane]
    status_events: dict[str, list[dict[str, Any]]]
    capacity: list[tuple[datetime, int]]
    markers: list[_Marker]
    outages: list[tuple[datetime, datetime, str]]
    left: datetime
    right: datetime
    end_of_evidence: datetime | None
    clock: Clock
    collapsed: int
    dropped_dateless: int


def _fields(row: dict[str, Any], *names: str) -> datetime | None:
    for name in names:
        value = row.get(name)
        if value is not None:
            return as_utc(value)
    return None


def _job_final(job: dict[str, Any], events: list[dict[str, Any]]) -> datetime | None:
    finals = [e["time"] for e in events if e["new_status"] in FINAL]
    if finals:
        return finals[-1]
    if job.get("status") in FINAL:
        return _fields(job, "finished_at", "last_processed_at", "stopped_at")
    return None


def _segments(
    job: dict[str, Any], events: list[dict[str, Any]], end: datetime
) -> tuple[list[tuple[datetime, datetime, str]], tuple[datetime, str] | None]:
    """A submission's status path: (start, stop, status) bars and its final status, from its
    job_status events, or from the table times when no event was recorded."""
    start = _fields(job, "created_at", "submitted_at")
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
    running = _fields(job, "running_at")
    stopped = _fields(job, "stopped_at")
    status = job.get("status")
    final_at = _fields(job, "finished_at", "last_processed_at") if status in FINAL else None
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


def _run_view(audit: Any, run_id: str, clock_tz: str | None) -> _RunView:
    """The layout of a run's picture (lanes, markers, window) from its story."""
    redact: Callable[[str], str] = audit.redact
    story: RunStory = audit.story(run_id)
    run, findings, usable = story.run, story.findings, story.usable_events
    dateless, end_of_evidence = story.dateless, story.end_of_evidence
    subs = story.submissions.sort(
        ["deployment_num", "replica_num", "job_num", "submission_num"], nulls_last=True
    )
    deployments = story.deployments
    clock = Clock(resolve_zone(clock_tz), dateless)
    starts = [as_utc(run.get("submitted_at"))] + [
        _fields(j, "created_at", "submitted_at") for j in subs.iter_rows(named=True)
    ]

    # What the evidence spans, for this run
    times: list[datetime] = [t for t in starts if t is not None]
    times += [t for t in usable["time"].to_list() if t is not None]
    for job in subs.iter_rows(named=True):
        times += [
            t
            for t in (
                _fields(job, "running_at"),
                _fields(job, "stopped_at"),
                _fields(job, "finished_at"),
                _fields(job, "last_processed_at"),
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
    lanes: list[_Lane] = []
    dep_rows = {d["deployment_num"]: d for d in deployments.iter_rows(named=True)}
    dep_nums = sorted(
        set(dep_rows) | set(subs["deployment_num"].to_list()), key=lambda d: (d is None, d or 0)
    )
    collapsed_total = 0
    for dep in dep_nums:
        info = dep_rows.get(dep, {})
        lanes.append(
            _Lane(
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
                    _Lane(
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
                    _Lane(
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
            _Marker(
                end_of_evidence,
                "end_of_evidence",
                f"end of the evidence ({clock.near(end_of_evidence, left)})",
            )
        )
    markers.sort(key=lambda m: (m.time, list(MARKER_STYLE).index(m.kind)))
    numbered = (m for m in markers if m.kind != "end_of_evidence" and not m.offscreen)
    for number, marker in enumerate(numbered, 1):
        marker.number = number
    return _RunView(
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
    )


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
) -> list[_Marker]:
    """The story's moments as numbered markers: updates, the run going TERMINATING, the
    culprits' failures, the recoveries and the victims' stops (one marker per moment)."""
    markers: list[_Marker] = []
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
            _Marker(
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
            markers.append(_Marker(event["time"], "update", redact(event["message"] or "update")))
    for event in events.filter(
        (pl.col("kind") == "run_status") & (pl.col("new_status") == "terminating")
    ).iter_rows(named=True):
        reason = (event["termination_reason"] or "").upper()
        markers.append(
            _Marker(
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
                _Marker(
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
                _Marker(
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
        if len(names) == 1:
            text = f"healthy replica {names[0]} ({dep_text}) stopped: TERMINATED_BY_SERVER"
        else:
            shown = ", ".join(names[:5]) + (f", … (+{len(names) - 5})" if len(names) > 5 else "")
            text = (
                f"{len(names)} healthy replicas of {dep_text} stopped: TERMINATED_BY_SERVER "
                f"({shown})"
            )
        markers.append(
            _Marker(
                group[0][0],
                "victim_stop",
                redact(text),
                [lane_of[v.job_id] for _, v in group if v.job_id in lane_of],
            )
        )
    # one marker per kind and moment (a run's TERMINATING seen twice, say)
    unique: dict[tuple[str, datetime, str], _Marker] = {}
    for marker in markers:
        unique.setdefault((marker.kind, marker.time, marker.text), marker)
    return list(unique.values())


def _outage(
    story: RunStory, finding: Finding, clock: Clock
) -> tuple[datetime, datetime, str] | None:
    outage = story.outage(finding)
    if outage is None:
        return None
    seconds = fmt_seconds((outage.stop - outage.start).total_seconds())
    if outage.recovered:
        return outage.start, outage.stop, f"outage {seconds}, until served again"
    return (
        outage.start,
        outage.stop,
        f"outage ≥ {seconds}: not recovered as of the end of the evidence "
        f"({clock.near(outage.stop, outage.start)})",
    )


# ---------------------------------------------------------------------------------------------
# Drawing a run


def _num(clock: Clock, value: datetime) -> float:
    return float(mdates.date2num(clock.local(value)))


def _time_axis(ax: Any, clock: Clock, *, labels: bool) -> None:
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)
    locator.intervald[mdates.MINUTELY] = [1, 2, 5, 10, 15, 20, 30]
    locator.intervald[mdates.SECONDLY] = [1, 2, 5, 10, 15, 20, 30]
    ax.xaxis.set_major_locator(locator)
    if clock.dateless:

        def tod(value: float, _pos: int | None = None) -> str:
            moment = mdates.num2date(value).replace(tzinfo=None)
            days = (moment.date() - datetime(1970, 1, 1).date()).days
            return moment.strftime("%H:%M:%S") + (f"\n+{days} d" if days else "")

        ax.xaxis.set_major_formatter(FuncFormatter(tod))
    else:
        formatter = mdates.ConciseDateFormatter(
            locator,
            formats=["%Y", "%b", "%d %b", "%H:%M", "%H:%M", "%H:%M:%S"],
            zero_formats=["", "%Y", "%d %b", "%d %b", "%H:%M", "%H:%M:%S"],
            show_offset=False,
        )
        ax.xaxis.set_major_formatter(formatter)
    if not labels:
        ax.tick_params(axis="x", labelbottom=False)


def _callout_levels(xs: Sequence[float], gap: float) -> list[int]:
    """Greedy stacking: a callout goes to the lowest level where it does not touch another."""
    placed: dict[int, list[float]] = {}
    levels = []
    for x in xs:
        level = 0
        while any(abs(x - other) < gap for other in placed.get(level, [])):
            level += 1
        placed.setdefault(level, []).append(x)
        levels.append(level)
    return levels


def _draw_lanes(
    ax: Any,
    view: _RunView,
    *,
    first_panel: bool,
    xlim: tuple[float, float],
) -> None:
    clock = view.clock
    n = len(view.lanes)
    end = view.right
    for i, lane in enumerate(view.lanes):
        if lane.kind == "header":
            ax.axhspan(i - 0.5, i + 0.5, color="#eef1f6", zorder=0, lw=0)
            if first_panel and lane.note:
                ax.text(
                    0.004,
                    i,
                    lane.note,
                    transform=ax.get_yaxis_transform(),
                    va="center",
                    ha="left",
                    fontsize=7.5,
                    style="italic",
                    color="#333333",
                    clip_on=True,
                    gid="deployment-note",
                )
            continue
        if lane.role:
            ax.axhspan(
                i - 0.5,
                i + 0.5,
                color="#f6eefa" if lane.role == "victim" else "#fdeeee",
                zorder=0,
                lw=0,
            )
        height = 0.26 if lane.kind == "collapsed" else 0.52
        for job in lane.jobs:
            events = view.status_events.get(job["job_id"], [])
            segments, final = _segments(job, events, end)
            for start, stop, status in segments:
                x0, x1 = _num(clock, start), _num(clock, stop)
                ax.add_patch(
                    Rectangle(
                        (x0, i - height / 2),
                        max(x1 - x0, 0.0),
                        height,
                        facecolor=STATUS_COLORS.get(status, STATUS_COLORS["unknown"]),
                        edgecolor="#9a9a9a" if status == "unknown" else "none",
                        linestyle=":" if status == "unknown" else "-",
                        lw=0.6,
                        alpha=0.55 if lane.kind == "collapsed" else 1.0,
                        zorder=2,
                        gid=f"status-{status}",
                    )
                )
            if final is not None:
                at, status = final
                ax.plot(
                    [_num(clock, at)],
                    [i],
                    marker="|",
                    markersize=13 if lane.kind == "job" else 7,
                    markeredgewidth=2.2,
                    color=FINAL_COLORS[status],
                    zorder=4,
                    gid=f"final-{status}",
                    linestyle="none",
                )
            if lane.kind == "job" and job.get("health") == "healthy":
                since = _fields(job, "healthy_since")
                estimated = since is None
                since = since or _fields(job, "running_at", "created_at", "submitted_at")
                until = _fields(job, "stopped_at") or end
                if since is not None and until >= since:
                    x0, x1 = _num(clock, since), _num(clock, until)
                    ax.add_patch(
                        Rectangle(
                            (x0, i - 0.38),
                            x1 - x0,
                            0.76,
                            facecolor="none",
                            edgecolor=HEALTHY_EDGE,
                            hatch="////",
                            lw=1.1,
                            linestyle="--" if estimated else "-",
                            zorder=3,
                            gid="healthy-estimated" if estimated else "healthy",
                        )
                    )
    # vertical marker lines, through every lane
    for marker in (m for m in view.markers if not m.offscreen):
        color, style, _ = MARKER_STYLE[marker.kind]
        x = _num(clock, marker.time)
        ax.axvline(x, color=color, linestyle=style, lw=1.3, zorder=5, gid=f"line-{marker.kind}")
        point = LANE_POINTS.get(marker.kind)
        for lane in marker.lanes if point else ():
            shape, size = point
            ax.plot(
                [x],
                [lane],
                marker=shape,
                markersize=size,
                color=color,
                mec="white",
                mew=1.0,
                zorder=6,
                linestyle="none",
                gid=f"point-{marker.kind}",
            )
    for start, stop, _ in view.outages:
        ax.axvspan(
            _num(clock, start), _num(clock, stop), color=OUTAGE_COLOR, alpha=0.07, lw=0, zorder=1
        )
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_xlim(*xlim)
    ax.set_yticks(range(n))
    ax.grid(axis="x", color="#dddddd", lw=0.6, zorder=0)
    ax.tick_params(axis="y", length=0)
    if first_panel:
        ax.set_yticklabels([lane.label for lane in view.lanes], fontsize=8.5)
        for tick, lane in zip(ax.get_yticklabels(), view.lanes, strict=True):
            if lane.kind == "header":
                tick.set_fontweight("bold")
            elif lane.kind == "collapsed":
                tick.set_style("italic")
                tick.set_color("#555555")
            elif lane.role == "victim":
                tick.set_color(MARKER_STYLE["victim_stop"][0])
            elif lane.role == "culprit":
                tick.set_color(MARKER_STYLE["culprit_failure"][0])
    else:
        ax.tick_params(axis="y", labelleft=False)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)


def _draw_callouts(ax: Any, view: _RunView, xlim: tuple[float, float]) -> int:
    """Numbered circles above the lanes, one per marker, stacked where they would touch; a
    marker left of a zoomed panel is pointed at from its left edge."""
    numbered = [m for m in view.markers if m.number]
    span = (xlim[1] - xlim[0]) or 1.0
    xs = [(_num(view.clock, m.time) - xlim[0]) / span for m in numbered]
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    gap = 0.26 / max(width_in, 1.0)  # a callout is about 0.2 in wide
    shown = [(m, min(max(x, 0.0), 1.0), x < 0) for m, x in zip(numbered, xs, strict=True)]
    shown = [(m, x, before) for m, x, before in shown if x <= 1.0 and not (x >= 1.0 and not before)]
    levels = _callout_levels([x + (0.02 if before else 0.0) for _, x, before in shown], gap)
    for (marker, x, before), level in zip(shown, levels, strict=True):
        color = MARKER_STYLE[marker.kind][0]
        ax.annotate(
            f"◀ {marker.number}" if before else str(marker.number),
            xy=(x, 1.0),
            xycoords="axes fraction",
            xytext=(14 if before else 0, 7 + 15 * level),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=7.5,
            fontweight="bold",
            color="white",
            bbox={
                "boxstyle": "round,pad=0.25" if before else "circle,pad=0.25",
                "fc": color,
                "ec": "white",
                "lw": 0.8,
            },
            arrowprops=None if before else {"arrowstyle": "-", "color": color, "lw": 0.8},
            annotation_clip=False,
            gid=f"callout-{marker.kind}",
        )
    return max(levels, default=-1) + 1


def _draw_capacity(
    ax: Any, view: _RunView, xlim: tuple[float, float], *, first_panel: bool
) -> None:
    clock = view.clock
    end = _num(clock, view.end_of_evidence) if view.end_of_evidence is not None else xlim[1]
    xs = [xlim[0]]
    ys = [0]
    for at, count in view.capacity:
        x = _num(clock, at)
        if x >= end:
            break  # the evidence ends: what follows is unknown, not zero
        xs.append(x)
        ys.append(count)
    xs.append(min(end, xlim[1]) if end > xlim[0] else xlim[1])
    ys.append(ys[-1])
    top = max([*ys, 1])
    ax.step(xs, ys, where="post", color="#1b7837", lw=1.8, zorder=3, gid="capacity")
    ax.fill_between(xs, ys, step="post", color="#1b7837", alpha=0.12, lw=0, zorder=2)
    for start, stop, text in view.outages:
        ax.axvspan(
            _num(clock, start),
            _num(clock, stop),
            color=OUTAGE_COLOR,
            alpha=0.28,
            lw=0,
            zorder=1,
            gid="outage",
            label=text,
        )
        x0 = max(_num(clock, start), xlim[0])
        x1 = min(_num(clock, stop), xlim[1])
        if (x1 - x0) / ((xlim[1] - xlim[0]) or 1.0) >= 0.12:
            ax.text(
                (x0 + x1) / 2,
                top + max(0.6, top * 0.15) * 0.55,
                "outage",
                ha="center",
                va="center",
                fontsize=8,
                color="#a50f15",
                fontweight="bold",
                zorder=5,
            )
    for marker in (m for m in view.markers if not m.offscreen):
        color, style, _ = MARKER_STYLE[marker.kind]
        ax.axvline(_num(clock, marker.time), color=color, linestyle=style, lw=1.1, zorder=4)
    ax.set_xlim(*xlim)
    ax.set_ylim(0, top + max(0.6, top * 0.15))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True, nbins=4))
    ax.grid(axis="both", color="#e5e5e5", lw=0.6, zorder=0)
    if first_panel:
        ax.set_ylabel("healthy\nreplicas", fontsize=8)
    else:
        ax.tick_params(axis="y", labelleft=False)
    ax.tick_params(labelsize=8)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)


def _zoom_window(view: _RunView) -> tuple[datetime, datetime] | None:
    """The incident's window when it is a small part of the run (else None: no zoom panel)."""
    moments = [m.time for m in view.markers if m.kind != "end_of_evidence" and not m.offscreen]
    if not view.findings or not moments:
        return None
    start, stop = min(moments), max(moments)
    for lane in view.lanes:
        if lane.role:
            for job in lane.jobs:
                final = _job_final(job, view.status_events.get(job["job_id"], []))
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


def _axis_label(clock: Clock, xlim: tuple[float, float]) -> str:
    if clock.dateless:
        return "time of day (local; date and zone unknown: rich log)"
    first, last = (mdates.num2date(x).replace(tzinfo=None) for x in xlim)
    days = (
        first.date().isoformat()
        if first.date() == last.date()
        else f"{first.date().isoformat()} to {last.date().isoformat()}"
    )
    middle = first + (last - first) / 2
    at = middle.replace(tzinfo=clock.zone or UTC) if clock.zone else middle.replace(tzinfo=UTC)
    return f"time ({clock.zone_label(at)}) on {days}"


def _title(view: _RunView) -> tuple[str, str]:
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


def _legend_handles(view: _RunView) -> list[Any]:
    statuses = [s for s in STATUS_COLORS if s != "unknown"]
    used_unknown = any(
        not view.status_events.get(j["job_id"]) and j.get("running_at") is None
        for lane in view.lanes
        for j in lane.jobs
    )
    handles: list[Any] = [Patch(facecolor=STATUS_COLORS[s], label=s) for s in statuses]
    if used_unknown:
        handles.append(
            Patch(
                facecolor=STATUS_COLORS["unknown"],
                edgecolor="#9a9a9a",
                linestyle=":",
                label="status not recorded (tables)",
            )
        )
    handles += [
        Line2D(
            [], [], marker="|", markersize=11, mew=2.2, color=FINAL_COLORS[s], ls="none", label=s
        )
        for s in ("terminated", "failed")
    ]
    handles.append(
        Patch(facecolor="none", edgecolor=HEALTHY_EDGE, hatch="////", label="healthy (serving)")
    )
    if any(
        j.get("health") == "healthy" and j.get("healthy_since") is None
        for lane in view.lanes
        for j in lane.jobs
    ):
        handles.append(
            Patch(
                facecolor="none",
                edgecolor=HEALTHY_EDGE,
                hatch="////",
                linestyle="--",
                label="healthy, start not recorded",
            )
        )
    if view.outages:
        handles.append(Patch(facecolor=OUTAGE_COLOR, alpha=0.28, label="outage"))
    if any(m.kind == "culprit_failure" for m in view.markers):
        handles.append(
            Line2D(
                [],
                [],
                marker="X",
                markersize=9,
                color=MARKER_STYLE["culprit_failure"][0],
                mec="white",
                ls="none",
                label="culprit failed",
            )
        )
    if any(m.kind == "victim_stop" for m in view.markers):
        handles.append(
            Line2D(
                [],
                [],
                marker="v",
                markersize=9,
                color=MARKER_STYLE["victim_stop"][0],
                mec="white",
                ls="none",
                label="victim stopped",
            )
        )
    return handles


def _wrap(text: str, width: int) -> list[str]:
    words = text.split(" ")
    lines, line = [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return [*lines, line] if line else lines


def plot_run(
    audit: Any,
    run_id: str,
    *,
    tz: str | None = None,
    ax: Any = None,
) -> Figure:
    """A run's swimlane: one lane per job submission grouped by deployment, bars coloured by
    status, the healthy interval hatched, markers for the update, the culprit's failure, the run
    going TERMINATING and each victim's stop, and the serving capacity with the outage shaded.

    When the incident is a small part of the run, a second panel zooms on it. Older retried
    submissions of a replica slot are collapsed into one lane that says how many.

    `run_id`: the run's id, an id prefix, its name or `project/name` (as the CLI takes).
    `tz`: an IANA zone to show times in (default UTC). `ax`: draw only the lanes into this
    axes (one panel, no capacity strip, no key) and return its figure.
    """
    view = _run_view(audit, run_id, tz)
    full = (_num(view.clock, view.left), _num(view.clock, view.right))
    pad = (full[1] - full[0]) * 0.02 or 1 / 86400
    full = (full[0] - pad, full[1] + pad)
    if ax is not None:
        _draw_lanes(ax, view, first_panel=True, xlim=full)
        _time_axis(ax, view.clock, labels=True)
        _draw_callouts(ax, view, full)
        return ax.figure

    zoom = _zoom_window(view)
    panels = [full]
    if zoom is not None:
        panels.append((_num(view.clock, zoom[0]), _num(view.clock, zoom[1])))
    n_lanes = len(view.lanes)
    precise = any(m.time.microsecond for m in view.markers)
    key_lines: list[tuple[_Marker | None, str, bool]] = []
    for marker in view.markers:
        prefix = f"{marker.number}  " if marker.number else "·  "
        text = f"{prefix}{view.clock.near(marker.time, view.left, ms=precise)}  {marker.text}"
        if marker.offscreen:
            text += " (after the plotted window)"
        for j, line in enumerate(_wrap(text, 150 if zoom else 120)):
            key_lines.append((marker, ("      " if j else "") + line, j == 0))
    for _, _, text in view.outages:
        key_lines.append((None, f"▮  {text}", True))

    lane_h = 0.3 if n_lanes <= 40 else max(0.16, 12.0 / n_lanes)
    heights = [0.5, n_lanes * lane_h + 0.35, 1.05, 0.55, 0.21 * len(key_lines) + 0.15]
    width = 14.0 if zoom else 11.5
    fig = Figure(figsize=(width, sum(heights) + 0.9), layout="constrained")
    FigureCanvasAgg(fig)
    fig.get_layout_engine().set(h_pad=0.04, hspace=0.02, w_pad=0.04, wspace=0.03)
    grid = fig.add_gridspec(
        len(heights), len(panels), height_ratios=heights, width_ratios=[1.0, 1.35][: len(panels)]
    )
    title, subtitle = _title(view)
    head = fig.add_subplot(grid[0, :])
    head.axis("off")
    head.set_gid("title")
    for y, text, style in ((0.95, title, "bold"), (0.2, subtitle, "normal")):
        label = head.text(
            0.0,
            y,
            audit.redact(text),
            transform=head.transAxes,
            fontsize=12 if style == "bold" else 8.5,
            fontweight=style,
            color="#111111" if style == "bold" else "#333333",
            va="top" if style == "bold" else "bottom",
            gid="run-title" if style == "bold" else "subtitle",
        )
        label.set_in_layout(False)
    lanes_axes, cap_axes = [], []
    for col, xlim in enumerate(panels):
        lanes_ax = fig.add_subplot(grid[1, col], sharey=lanes_axes[0] if lanes_axes else None)
        cap_ax = fig.add_subplot(grid[2, col], sharex=lanes_ax)
        lanes_ax.set_gid("lanes" if col == 0 else "lanes-zoom")
        cap_ax.set_gid("capacity-axes" if col == 0 else "capacity-axes-zoom")
        _draw_lanes(lanes_ax, view, first_panel=col == 0, xlim=xlim)
        _draw_capacity(cap_ax, view, xlim, first_panel=col == 0)
        _time_axis(lanes_ax, view.clock, labels=False)
        _time_axis(cap_ax, view.clock, labels=True)
        cap_ax.set_xlabel(_axis_label(view.clock, xlim), fontsize=8)
        lanes_axes.append(lanes_ax)
        cap_axes.append(cap_ax)
    if zoom is not None:
        for axis in (lanes_axes[0], cap_axes[0]):
            axis.axvspan(
                *panels[1],
                facecolor="none",
                edgecolor="#555555",
                lw=0.8,
                ls="--",
                zorder=7,
                gid="zoom-region",
            )
    # callouts where the markers can be told apart: the zoom panel when there is one
    levels = _draw_callouts(lanes_axes[-1], view, panels[-1])
    if zoom is not None:
        for axis, name in zip(lanes_axes, ("whole run", "the incident (zoom)"), strict=True):
            axis.set_title(name, fontsize=9, loc="left", color="#444444", pad=8 + 15 * levels)
    legend_ax = fig.add_subplot(grid[3, :])
    legend_ax.axis("off")
    handles = _legend_handles(view)
    legend_ax.legend(
        handles=handles,
        loc="center left",
        ncol=min(len(handles), 7 if zoom else 6),
        fontsize=8,
        frameon=False,
        handlelength=1.8,
        columnspacing=1.4,
    ).set_gid("status-legend")
    key_ax = fig.add_subplot(grid[4, :])
    key_ax.axis("off")
    key_ax.set_gid("marker-key")
    step = 1.0 / max(len(key_lines), 1)
    for row, (marker, line, first) in enumerate(key_lines):
        color = MARKER_STYLE[marker.kind][0] if marker is not None else "#333333"
        text = key_ax.text(
            0.0,
            1.0 - (row + 0.5) * step,
            line,
            transform=key_ax.transAxes,
            fontsize=9,
            va="center",
            ha="left",
            color=color,
            gid=f"key-{marker.kind}" if marker is not None and first else "key-more",
        )
        text.set_in_layout(False)
    return fig


# ---------------------------------------------------------------------------------------------
# Fleet-wide charts


def _seconds_unit(values: Iterable[float]) -> tuple[float, str]:
    top = max(values, default=0.0)
    if top >= 2 * 86400:
        return 86400.0, "days"
    if top >= 2 * 3600:
        return 3600.0, "hours"
    if top >= 120:
        return 60.0, "minutes"
    return 1.0, "seconds"


def _top(
    groups: Sequence[Any], limit: int, metric: Callable[[Any], float]
) -> list[tuple[str, float, Any]]:
    rows = sorted(((g.key, metric(g), g) for g in groups), key=lambda r: (-r[1], r[0]))
    if len(rows) <= limit:
        return rows
    rest = rows[limit - 1 :]
    other = (f"{len(rest)} others", sum(r[1] for r in rest), None)
    return [*rows[: limit - 1], other]


def _hbars(
    ax: Any,
    rows: list[tuple[str, float, Any]],
    *,
    color: str,
    label: Callable[[float, Any], str],
    title: str,
    xlabel: str,
    gid: str,
) -> None:
    ax.set_title(title, fontsize=10, loc="left")
    ax.set_gid(gid)
    if not rows:
        ax.text(
            0.5,
            0.5,
            "no findings",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="#777777",
        )
        ax.set_xticks([])
        ax.set_yticks([])
        return
    keys = [r[0] for r in rows]
    values = [r[1] for r in rows]
    ys = range(len(rows))
    ax.barh(ys, values, color=color, height=0.6, zorder=2)
    ax.set_yticks(list(ys), labels=keys, fontsize=8)
    ax.set_ylim(max(len(rows), 4) - 0.5, -0.5)  # a few bars stay bars, not blocks
    top = max(values) or 1.0
    ax.set_xlim(0, top * 1.35)
    for y, (_, value, group) in zip(ys, rows, strict=True):
        ax.text(
            value + top * 0.02, y, label(value, group), va="center", fontsize=7.5, color="#333333"
        )
    ax.set_xlabel(xlabel, fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#e5e5e5", lw=0.6, zorder=0)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)


def plot_fleet(report: Report, *, limit: int = 12) -> Figure:
    """Fleet-wide charts from a report: incidents per day, outage time and lost cost by project
    and by fleet, and the culprits' failure classes."""
    s = report.summary
    fig = Figure(figsize=(12.5, 13.0), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(4, 2, height_ratios=[1.0, 1.15, 1.15, 1.0])
    fig.suptitle(
        f"Healthy replicas killed by a failed rollout: {s.findings} incident(s), "
        f"{s.victims} replica(s), {s.runs} run(s) audited",
        fontsize=12,
        fontweight="bold",
        x=0.01,
        ha="left",
    )

    day_ax = fig.add_subplot(grid[0, :])
    day_ax.set_gid("incidents-per-day")
    day_ax.set_title("Incidents per day (UTC day the outage began)", fontsize=10, loc="left")
    dated = []
    undated = 0
    for group in s.by_day:
        try:
            dated.append((datetime.strptime(group.key, "%Y-%m-%d"), group.findings, group))
        except ValueError:
            undated += group.findings
    if dated:
        days = [d for d, _, _ in dated]
        counts = [c for _, c, _ in dated]
        nums = mdates.date2num(days)
        day_ax.bar(nums, counts, width=0.8, color="#b2182b", zorder=2)
        locator = mdates.AutoDateLocator(minticks=3, maxticks=10)
        day_ax.xaxis.set_major_locator(locator)
        day_ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        span = (max(days) - min(days)).days
        pad = max(1.0, span * 0.03)
        day_ax.set_xlim(min(nums) - pad, max(nums) + pad)
        day_ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        day_ax.set_ylim(0, max(counts) * 1.25)
        if len(dated) <= 31:
            for x, c in zip(nums, counts, strict=True):
                day_ax.text(x, c, str(c), ha="center", va="bottom", fontsize=7.5)
        day_ax.set_ylabel("incidents", fontsize=8)
        day_ax.grid(axis="y", color="#e5e5e5", lw=0.6, zorder=0)
    else:
        day_ax.set_xticks([])
        day_ax.set_yticks([])
        day_ax.text(
            0.5,
            0.5,
            "no dated incidents",
            ha="center",
            va="center",
            transform=day_ax.transAxes,
            color="#777777",
        )
    if undated:
        day_ax.text(
            0.99,
            0.95,
            f"+ {undated} incident(s) with date unknown (rich log only)",
            ha="right",
            va="top",
            transform=day_ax.transAxes,
            fontsize=8,
            color="#555555",
        )
    for spine in ("top", "right"):
        day_ax.spines[spine].set_visible(False)

    def outage_rows(groups: Sequence[Any]) -> tuple[list[tuple[str, float, Any]], str]:
        factor, unit = _seconds_unit(g.outage_seconds for g in groups)
        rows = [(k, v / factor, g) for k, v, g in _top(groups, limit, lambda g: g.outage_seconds)]
        return rows, unit

    def outage_label(value: float, group: Any, factor: float = 1.0) -> str:
        if group is None:
            return ""
        return f"{fmt_duration(group.outage_seconds)} · {group.findings} incident(s)"

    def cost_label(value: float, group: Any) -> str:
        if group is None:
            return fmt_cost(value)
        return fmt_cost(group.lost_cost, group.cost_unknown_victims)

    for row, (name, groups) in enumerate((("project", s.by_project), ("fleet", s.by_fleet)), 1):
        rows, unit = outage_rows(groups)
        _hbars(
            fig.add_subplot(grid[row, 0]),
            rows,
            color="#ef6548",
            label=outage_label,
            title=f"Outage time by {name}",
            xlabel=f"outage ({unit}; until recovery or the end of the evidence)",
            gid=f"outage-by-{name}",
        )
        _hbars(
            fig.add_subplot(grid[row, 1]),
            _top(groups, limit, lambda g: g.lost_cost),
            color="#807dba",
            label=cost_label,
            title=f"Lost cost by {name} (healthy replica-time killed × price)",
            xlabel="lost cost ($)",
            gid=f"cost-by-{name}",
        )

    classes = [(g.key, float(g.findings), g) for g in s.by_failure_class]
    classes.sort(key=lambda r: (-r[1], r[0]))
    _hbars(
        fig.add_subplot(grid[3, 0]),
        classes,
        color="#4a90c8",
        label=lambda v, g: f"{int(v)} incident(s), {g.victims} victim(s)" if g else "",
        title="Culprit failure classes",
        xlabel="incidents",
        gid="failure-classes",
    )
    totals = fig.add_subplot(grid[3, 1])
    totals.axis("off")
    totals.set_gid("totals")
    lines = [
        f"runs audited: {s.runs} ({s.runs_in_progress} still active)",
        f"incidents: {s.findings}",
        f"healthy replicas killed: {s.victims}",
        f"outage, summed: {fmt_duration(s.outage_seconds)}",
        f"healthy replica-time lost: {fmt_duration(s.healthy_replica_seconds_lost)}",
        f"lost cost: {fmt_cost(s.lost_cost, s.cost_unknown_victims)}",
        f"end of the evidence: {Clock().full(report.end_of_evidence)}"
        if report.end_of_evidence
        else "end of the evidence: unknown",
    ]
    for name, count in sorted(s.by_verdict.items()):
        lines.append(f"verdict {name}: {count}")
    totals.set_title("Totals", fontsize=10, loc="left")
    for i, line in enumerate(lines):
        totals.text(
            0.0,
            0.95 - i * 0.09,
            line,
            fontsize=9,
            transform=totals.transAxes,
            va="top",
            gid="total",
        )
    return fig


def figure_bytes(fig: Figure, fmt: str = "png", *, dpi: int = 110) -> bytes:
    """The figure as PNG, SVG or PDF bytes (Agg canvas; deterministic metadata). Every text of
    the figure loses its control characters first: an SVG keeps each text in a comment, and XML
    forbids them there."""
    import io

    from matplotlib.text import Text

    for text in fig.findobj(Text):
        text.set_text(without_controls(text.get_text()))
    buffer = io.BytesIO()
    metadata: dict[str, Any] = {}
    if fmt == "png":
        metadata = {"Software": None}
    elif fmt == "svg":
        metadata = {"Date": None, "Creator": None}
    elif fmt == "pdf":
        metadata = {"CreationDate": None, "Creator": None, "Producer": None}
    fig.savefig(buffer, format=fmt, dpi=dpi, metadata=metadata, facecolor="white")
    return buffer.getvalue()


__all__ = ["figure_bytes", "plot_fleet", "plot_run"]
