"""A run's swimlane, drawn from its layout (plots/layout.py).

Figures are built on `matplotlib.figure.Figure` with the Agg canvas: nothing opens a display,
nothing touches pyplot's global state, and notebooks can show the returned figures. Every text
drawn comes from the audit and passes through `audit.redact` first (a picture cannot be redacted
after it is drawn).

Times are UTC unless a display zone (IANA name) is given. Evidence that carries times of day
only (a rich log alone: a 1970-01-01 pseudo date, zone unknown) is drawn on a time-of-day axis
that says so, and its pseudo date is never shown.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import matplotlib.dates as mdates
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, MaxNLocator

from analyzer.render.format import Clock
from analyzer.render.plots.layout import (
    RunView,
    callout_levels,
    legend_entries,
    run_view,
    status_path,
    title_lines,
    zoom_window,
)
from analyzer.render.plots.layout import key_lines as layout_key_lines
from analyzer.render.plots.style import (
    FINAL_COLORS,
    HEALTHY_EDGE,
    LANE_POINTS,
    MARKER_STYLE,
    OUTAGE_COLOR,
    STATUS_COLORS,
)


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


def _draw_lanes(
    ax: Any,
    view: RunView,
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
            segments, final = status_path(job, events, end)
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
            healthy = view.healthy.get(job["job_id"]) if lane.kind == "job" else None
            if healthy is not None:
                estimated = healthy.since is None
                since, until = healthy.start, healthy.until or end
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


def _draw_callouts(ax: Any, view: RunView, xlim: tuple[float, float]) -> int:
    """Numbered circles above the lanes, one per marker, stacked where they would touch; a
    marker left of a zoomed panel is pointed at from its left edge."""
    numbered = [m for m in view.markers if m.number]
    span = (xlim[1] - xlim[0]) or 1.0
    xs = [(_num(view.clock, m.time) - xlim[0]) / span for m in numbered]
    width_in = ax.get_position().width * ax.figure.get_figwidth()
    gap = 0.26 / max(width_in, 1.0)  # a callout is about 0.2 in wide
    shown = [(m, min(max(x, 0.0), 1.0), x < 0) for m, x in zip(numbered, xs, strict=True)]
    shown = [(m, x, before) for m, x, before in shown if x <= 1.0 and not (x >= 1.0 and not before)]
    levels = callout_levels([x + (0.02 if before else 0.0) for _, x, before in shown], gap)
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


def _draw_capacity(ax: Any, view: RunView, xlim: tuple[float, float], *, first_panel: bool) -> None:
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


def _legend_handles(view: RunView) -> list[Any]:
    handles: list[Any] = []
    for look, value, label in legend_entries(view):
        if look == "status":
            handles.append(Patch(facecolor=STATUS_COLORS[value], label=label))
        elif look == "unknown":
            handles.append(
                Patch(
                    facecolor=STATUS_COLORS["unknown"],
                    edgecolor="#9a9a9a",
                    linestyle=":",
                    label=label,
                )
            )
        elif look == "final":
            handles.append(
                Line2D(
                    [],
                    [],
                    marker="|",
                    markersize=11,
                    mew=2.2,
                    color=FINAL_COLORS[value],
                    ls="none",
                    label=label,
                )
            )
        elif look in ("healthy", "healthy-estimated"):
            handles.append(
                Patch(
                    facecolor="none",
                    edgecolor=HEALTHY_EDGE,
                    hatch="////",
                    linestyle="--" if look == "healthy-estimated" else "-",
                    label=label,
                )
            )
        elif look == "outage":
            handles.append(Patch(facecolor=OUTAGE_COLOR, alpha=0.28, label=label))
        else:
            handles.append(
                Line2D(
                    [],
                    [],
                    marker=LANE_POINTS[value][0],
                    markersize=9,
                    color=MARKER_STYLE[value][0],
                    mec="white",
                    ls="none",
                    label=label,
                )
            )
    return handles


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
    view = run_view(audit, run_id, tz)
    full = (_num(view.clock, view.left), _num(view.clock, view.right))
    pad = (full[1] - full[0]) * 0.02 or 1 / 86400
    full = (full[0] - pad, full[1] + pad)
    if ax is not None:
        _draw_lanes(ax, view, first_panel=True, xlim=full)
        _time_axis(ax, view.clock, labels=True)
        _draw_callouts(ax, view, full)
        return ax.figure

    zoom = zoom_window(view)
    panels = [full]
    if zoom is not None:
        panels.append((_num(view.clock, zoom[0]), _num(view.clock, zoom[1])))
    n_lanes = len(view.lanes)
    key_lines = layout_key_lines(view, zoom=zoom is not None)

    lane_h = 0.3 if n_lanes <= 40 else max(0.16, 12.0 / n_lanes)
    heights = [0.5, n_lanes * lane_h + 0.35, 1.05, 0.55, 0.21 * len(key_lines) + 0.15]
    width = 14.0 if zoom else 11.5
    fig = Figure(figsize=(width, sum(heights) + 0.9), layout="constrained")
    FigureCanvasAgg(fig)
    fig.get_layout_engine().set(h_pad=0.04, hspace=0.02, w_pad=0.04, wspace=0.03)
    grid = fig.add_gridspec(
        len(heights), len(panels), height_ratios=heights, width_ratios=[1.0, 1.35][: len(panels)]
    )
    title, subtitle = title_lines(view)
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
