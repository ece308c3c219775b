"""A run's swimlane written as SVG text straight from its layout (plots/layout.py), for the HTML
report: the picture plots/run.py draws (the same lanes, bands, status bars, hatched healthy
interval, markers, callouts, capacity strip, outage, key and colours), without matplotlib.

matplotlib's constrained layout measures every text twice and its PNG encoding compresses a
raster: three quarters of a report's time went there (issue 38). Here a text's width is
estimated from its length, the margins follow from it, and the SVG is vector text: a browser
lays it out. Every text is stripped of control characters and XML-escaped; the texts of the
evidence were redacted by the layout (the title here), as for the matplotlib figure.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from math import ceil, floor, log10

from analyzer.pipeline.story import RunStory
from analyzer.redact import without_controls
from analyzer.render.plots.layout import (
    RunView,
    callout_levels,
    key_lines,
    legend_entries,
    run_view,
    status_path,
    title_lines,
    zoom_window,
)
from analyzer.render.plots.style import (
    FINAL_COLORS,
    HEALTHY_EDGE,
    LANE_POINTS,
    MARKER_STYLE,
    OUTAGE_COLOR,
    STATUS_COLORS,
)

PX = 100.0  # pixels per inch, the report's IMAGE_DPI: the PNG's size
PT = PX / 72  # pixels per point
FONT = "DejaVu Sans, Verdana, Arial, sans-serif"  # matplotlib's default, then its look-alikes
EPOCH = datetime(1970, 1, 1)
DOTTED = f"{PT:.2f},{1.65 * PT:.2f}"  # matplotlib's ":" at 1 pt
DASHED = (0, (3.7, 1.6))  # matplotlib's "--", in line widths
# AutoDateLocator's frequencies and intervals as plots/run.py sets them (minticks 4, maxticks 10)
TICK_UNITS = (
    (86400, (1, 2, 4, 7, 14)),
    (3600, (1, 2, 3, 4, 6, 12)),
    (60, (1, 2, 5, 10, 15, 20, 30)),
    (1, (1, 2, 5, 10, 15, 20, 30)),
)
MIN_TICKS, MAX_TICKS = 4, 10
MAX_N_STEPS = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)  # MaxNLocator's default steps
AUTO_STEPS = (1, 2, 2.5, 5, 10)  # AutoLocator's, the default axis's (at most 9 intervals)


def _e(text: object) -> str:
    """Text as SVG character data: controls removed, escaped, and a run of spaces kept (the
    key's columns) as no-break spaces after the first, which every viewer keeps."""
    escaped = html.escape(without_controls(str(text)), quote=True)
    return re.sub(" {2,}", lambda m: " " + "\u00a0" * (len(m.group(0)) - 1), escaped)


def text_width(text: str, size: float, *, bold: bool = False) -> float:
    """About how wide `text` is at `size` points, in pixels (DejaVu Sans averages 0.6 em)."""
    return len(text) * size * PT * (0.66 if bold else 0.6)


def _dash(style: object, lw: float) -> str:
    """matplotlib's dash pattern (scaled by the line width, as it does) as stroke-dasharray."""
    if not isinstance(style, tuple):
        return ""
    return ",".join(f"{v * lw * PT:.2f}" for v in style[1])


@dataclass
class _Axes:
    """A panel's box in pixels and its time window (seconds of the display clock)."""

    left: float
    top: float
    width: float
    height: float
    lo: float
    hi: float

    def x(self, seconds: float) -> float:
        return self.left + (seconds - self.lo) / ((self.hi - self.lo) or 1.0) * self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height


class Canvas:
    """SVG elements in drawing order, sizes in points as matplotlib's (PT pixels each)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.clips = 0

    def add(self, text: str) -> None:
        self.parts.append(text)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, **attrs: object) -> None:
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
        self.add(
            f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(w, 0.0):.2f}" height="{h:.2f}" '
            f'fill="{fill}"{extra}/>'
        )

    def line(self, x0: float, y0: float, x1: float, y1: float, color: str, lw: float, dash=""):
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(
            f'<line x1="{x0:.2f}" y1="{y0:.2f}" x2="{x1:.2f}" y2="{y1:.2f}" stroke="{color}" '
            f'stroke-width="{lw * PT:.2f}"{extra}/>'
        )

    def text(self, x: float, y: float, text: str, size: float, **attrs: object) -> None:
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
        self.add(
            f'<text x="{x:.2f}" y="{y:.2f}" font-size="{size * PT:.2f}"{extra}>{_e(text)}</text>'
        )

    def clip(self, box: _Axes) -> str:
        self.clips += 1
        name = f"clip{self.clips}"
        self.add(
            f'<clipPath id="{name}"><rect x="{box.left:.2f}" y="{box.top:.2f}" '
            f'width="{box.width:.2f}" height="{box.height:.2f}"/></clipPath>'
        )
        return name


def _point(svg: Canvas, shape: str, x: float, y: float, size: float, color: str, name: str) -> None:
    """matplotlib's 'X' (a filled cross), 'v' (a triangle down) and '|' markers."""
    r = size * PT / 2
    if shape == "v":
        path = f"M{x - r:.2f},{y - r:.2f}L{x + r:.2f},{y - r:.2f}L{x:.2f},{y + r:.2f}Z"
    else:
        t = r * 0.45
        path = "M" + "L".join(
            f"{x + dx:.2f},{y + dy:.2f}"
            for dx, dy in (
                (-r, -r + t), (-r + t, -r), (0, -t), (r - t, -r), (r, -r + t), (t, 0),
                (r, r - t), (r - t, r), (0, t), (-r + t, r), (-r, r - t), (-t, 0),
            )
        ) + "Z"  # fmt: skip
    svg.add(
        f'<path class="{name}" d="{path}" fill="{color}" stroke="white" stroke-width="{PT:.2f}"/>'
    )


def _final_tick(svg: Canvas, x: float, y: float, size: float, status: str) -> None:
    half = size * PT / 2
    svg.add(
        f'<line class="final-{status}" x1="{x:.2f}" y1="{y - half:.2f}" x2="{x:.2f}" '
        f'y2="{y + half:.2f}" stroke="{FINAL_COLORS[status]}" stroke-width="{2.2 * PT:.2f}"/>'
    )


def time_ticks(lo: float, hi: float, least: int = MIN_TICKS) -> tuple[int, list[float]]:
    """AutoDateLocator's choice: the coarsest unit with at least `least` steps in the window,
    at the smallest interval of it that makes at most 10 ticks."""
    span = hi - lo
    unit, step = 1, 1
    for unit, intervals in TICK_UNITS:
        count = floor(span / unit)  # whole units, as AutoDateLocator counts them
        if count >= least:
            step = next((i for i in intervals if count <= i * (MAX_TICKS - 1)), intervals[-1])
            break
    if unit == 86400:  # days of the month as its rrule's bymonthday picks them
        monthdays = {7: (1, 8, 15, 22), 14: (1, 15)}.get(step, range(1, 32, step))
        days = range(ceil(lo / unit), floor(hi / unit) + 1)
        picked = [d * unit for d in days if (EPOCH + timedelta(days=d)).day in monthdays]
        return unit, [float(d) for d in picked]
    size = unit * step
    first = ceil(lo / size) * size
    return unit, [first + k * size for k in range(floor((hi - first) / size) + 1)]


def _tick_label(seconds: float, unit: int, dateless: bool) -> str:
    """ConciseDateFormatter's labels with plots/run.py's formats (a day at midnight)."""
    moment = EPOCH + timedelta(seconds=seconds)
    if dateless:
        days = (moment.date() - EPOCH.date()).days
        return moment.strftime("%H:%M:%S") + (f" +{days} d" if days else "")
    if unit == 86400 or (unit == 3600 and moment.hour == 0 and moment.minute == 0):
        return moment.strftime("%d %b")
    return moment.strftime("%H:%M:%S" if unit == 1 else "%H:%M")


def _time_axis(svg: Canvas, box: _Axes, dateless: bool, *, labels: bool, grid: str) -> None:
    unit, ticks = time_ticks(box.lo, box.hi)
    for t in ticks:
        x = box.x(t)
        svg.line(x, box.top, x, box.bottom, grid, 0.6)
        svg.line(x, box.bottom, x, box.bottom + 3.5 * PT, "#000000", 0.8)
        if labels:
            label = _tick_label(t, unit, dateless)
            svg.text(
                x, box.bottom + 14 * PT, label, 8, text_anchor="middle", **{"class": "tick-label"}
            )


def _spines(svg: Canvas, box: _Axes) -> None:
    svg.line(box.left, box.top, box.left, box.bottom, "#000000", 0.8)
    svg.line(box.left, box.bottom, box.left + box.width, box.bottom, "#000000", 0.8)


def _draw_lanes(svg: Canvas, view: RunView, box: _Axes, *, first_panel: bool, lane: float) -> None:
    clip = svg.clip(box)
    svg.add(f'<g class="lanes" clip-path="url(#{clip})">')
    end = view.right
    for i, row in enumerate(view.lanes):
        top = box.top + i * lane
        middle = top + lane / 2
        if row.kind == "header":
            svg.rect(box.left, top, box.width, lane, "#eef1f6")
            if first_panel and row.note:
                svg.text(
                    box.left + 0.004 * box.width,
                    middle + 2.6 * PT,
                    row.note,
                    7.5,
                    font_style="italic",
                    fill="#333333",
                    **{"class": "deployment-note"},
                )
            continue
        if row.role:
            svg.rect(
                box.left, top, box.width, lane, "#f6eefa" if row.role == "victim" else "#fdeeee"
            )
        height = (0.26 if row.kind == "collapsed" else 0.52) * lane
        for job in row.jobs:
            events = view.status_events.get(job["job_id"], [])
            segments, final = status_path(job, events, end)
            for start, stop, status in segments:
                x0, x1 = box.x(_seconds(view, start)), box.x(_seconds(view, stop))
                unknown = status == "unknown"
                svg.rect(
                    x0,
                    middle - height / 2,
                    x1 - x0,
                    height,
                    STATUS_COLORS.get(status, STATUS_COLORS["unknown"]),
                    stroke="#9a9a9a" if unknown else "none",
                    stroke_dasharray=DOTTED if unknown else "none",
                    stroke_width=f"{0.6 * PT:.2f}",
                    opacity="0.55" if row.kind == "collapsed" else "1",
                    **{"class": f"status-{status}"},
                )
            if final is not None:
                at, status = final
                _final_tick(
                    svg, box.x(_seconds(view, at)), middle, 13 if row.kind == "job" else 7, status
                )
            healthy = view.healthy.get(job["job_id"]) if row.kind == "job" else None
            if healthy is not None:
                estimated = healthy.since is None
                since, until = healthy.start, healthy.until or end
                if since is not None and until >= since:
                    x0, x1 = box.x(_seconds(view, since)), box.x(_seconds(view, until))
                    svg.rect(
                        x0,
                        middle - 0.38 * lane,
                        x1 - x0,
                        0.76 * lane,
                        "url(#hatch)",
                        stroke=HEALTHY_EDGE,
                        stroke_width=f"{1.1 * PT:.2f}",
                        stroke_dasharray=_dash(DASHED, 1.1) if estimated else "none",
                        **{"class": "healthy-estimated" if estimated else "healthy"},
                    )
    for marker in (m for m in view.markers if not m.offscreen):
        color, style, _ = MARKER_STYLE[marker.kind]
        x = box.x(_seconds(view, marker.time))
        svg.add(f'<g class="line-{marker.kind}">')
        svg.line(x, box.top, x, box.bottom, color, 1.3, _dash(style, 1.3))
        svg.add("</g>")
        point = LANE_POINTS.get(marker.kind)
        for index in marker.lanes if point else ():
            shape, size = point
            _point(
                svg, shape, x, box.top + (index + 0.5) * lane, size, color, f"point-{marker.kind}"
            )
    for start, stop, _ in view.outages:
        x0, x1 = box.x(_seconds(view, start)), box.x(_seconds(view, stop))
        svg.rect(x0, box.top, x1 - x0, box.height, OUTAGE_COLOR, opacity="0.07")
    svg.add("</g>")
    _time_axis(svg, box, view.clock.dateless, labels=False, grid="#dddddd")
    _spines(svg, box)
    if not first_panel:
        return
    for i, row in enumerate(view.lanes):
        style: dict[str, object] = {"text_anchor": "end", "class": "lane-label"}
        if row.kind == "header":
            style["font_weight"] = "bold"
        elif row.kind == "collapsed":
            style.update(font_style="italic", fill="#555555")
        elif row.role == "victim":
            style["fill"] = MARKER_STYLE["victim_stop"][0]
        elif row.role == "culprit":
            style["fill"] = MARKER_STYLE["culprit_failure"][0]
        svg.text(box.left - 4 * PT, box.top + (i + 0.5) * lane + 3 * PT, row.label, 8.5, **style)


def _seconds(view: RunView, value: datetime) -> float:
    return (view.clock.local(value) - EPOCH).total_seconds()


def _callouts(view: RunView, box: _Axes) -> list[tuple[object, float, bool, int]]:
    """(marker, axes fraction, pointed at from the left edge, level) of the numbered markers."""
    numbered = [m for m in view.markers if m.number]
    xs = [(_seconds(view, m.time) - box.lo) / ((box.hi - box.lo) or 1.0) for m in numbered]
    gap = 0.26 / max(box.width / PX, 1.0)
    shown = [(m, min(max(x, 0.0), 1.0), x < 0) for m, x in zip(numbered, xs, strict=True)]
    shown = [(m, x, before) for m, x, before in shown if x <= 1.0 and not (x >= 1.0 and not before)]
    levels = callout_levels([x + (0.02 if before else 0.0) for _, x, before in shown], gap)
    return [(m, x, b, level) for (m, x, b), level in zip(shown, levels, strict=True)]


def _draw_callouts(svg: Canvas, box: _Axes, callouts: list) -> None:
    for marker, fraction, before, level in callouts:
        color = MARKER_STYLE[marker.kind][0]
        x = box.left + fraction * box.width + (14 * PT if before else 0.0)
        radius = 7.2 * PT
        centre = box.top - (7 + 15 * level) * PT - radius
        svg.add(f'<g class="callout-{marker.kind}">')
        if before:
            label = f"◀ {marker.number}"
            width = text_width(label, 7.5, bold=True) + 6 * PT
            svg.rect(
                x - width / 2, centre - radius, width, 2 * radius, color, rx=f"{radius / 2:.2f}"
            )
        else:
            svg.line(x, box.top, x, centre + radius, color, 0.8)
            svg.add(
                f'<circle cx="{x:.2f}" cy="{centre:.2f}" r="{radius:.2f}" fill="{color}" '
                f'stroke="white" stroke-width="{0.8 * PT:.2f}"/>'
            )
            label = str(marker.number)
        svg.text(
            x, centre + 2.7 * PT, label, 7.5, fill="white", font_weight="bold", text_anchor="middle"
        )
        svg.add("</g>")


def nice_ticks(
    top: float, bins: int, *, integer: bool = False, steps: tuple[float, ...] = MAX_N_STEPS
) -> list[float]:
    """MaxNLocator's ticks over 0..top: the smallest of its `steps` times a power of ten
    (whole ones only when `integer`) that makes at most `bins` intervals."""
    if top <= 0:
        return [0.0]
    raw = top / bins
    scale = 10 ** floor(log10(raw))
    steps = tuple(m * scale for m in steps) + tuple(m * scale * 10 for m in steps)
    if integer:
        steps = tuple(s for s in steps if s >= 1 and abs(s - round(s)) < 1e-9) or (1.0,)
    step = next(s for s in steps if s >= raw * (1 - 1e-9))
    return [k * step for k in range(int(top / step + 1e-9) + 1)]


def _draw_capacity(svg: Canvas, view: RunView, box: _Axes, *, first_panel: bool) -> None:
    end = _seconds(view, view.end_of_evidence) if view.end_of_evidence is not None else box.hi
    xs, ys = [box.lo], [0]
    for at, count in view.capacity:
        x = _seconds(view, at)
        if x >= end:
            break  # the evidence ends: what follows is unknown, not zero
        xs.append(x)
        ys.append(count)
    xs.append(min(end, box.hi) if end > box.lo else box.hi)
    ys.append(ys[-1])
    top = max([*ys, 1])
    ymax = top + max(0.6, top * 0.15)

    def y(value: float) -> float:
        return box.bottom - value / ymax * box.height

    for tick in nice_ticks(ymax, 4, integer=True):
        svg.line(box.left, y(tick), box.left + box.width, y(tick), "#e5e5e5", 0.6)
        svg.line(box.left - 3.5 * PT, y(tick), box.left, y(tick), "#000000", 0.8)
        if first_panel:
            label = f"{tick:.0f}"
            svg.text(
                box.left - 5 * PT,
                y(tick) + 3 * PT,
                label,
                8,
                text_anchor="end",
                **{"class": "count-label"},
            )
    clip = svg.clip(box)
    svg.add(f'<g clip-path="url(#{clip})">')
    for start, stop, _ in view.outages:
        x0, x1 = box.x(_seconds(view, start)), box.x(_seconds(view, stop))
        svg.rect(
            x0, box.top, x1 - x0, box.height, OUTAGE_COLOR, opacity="0.28", **{"class": "outage"}
        )
    steps = []
    for i, (x, value) in enumerate(zip(xs, ys, strict=True)):
        if i:
            steps.append(f"{box.x(x):.2f},{y(ys[i - 1]):.2f}")
        steps.append(f"{box.x(x):.2f},{y(value):.2f}")
    area = f"{box.x(xs[0]):.2f},{y(0):.2f} " + " ".join(steps) + f" {box.x(xs[-1]):.2f},{y(0):.2f}"
    svg.add(f'<polygon points="{area}" fill="#1b7837" fill-opacity="0.12"/>')
    for marker in (m for m in view.markers if not m.offscreen):
        color, style, _ = MARKER_STYLE[marker.kind]
        x = box.x(_seconds(view, marker.time))
        svg.line(x, box.top, x, box.bottom, color, 1.1, _dash(style, 1.1))
    svg.add(
        f'<polyline class="capacity" points="{" ".join(steps)}" fill="none" stroke="#1b7837" '
        f'stroke-width="{1.8 * PT:.2f}"/>'
    )
    for start, stop, _ in view.outages:
        x0 = max(_seconds(view, start), box.lo)
        x1 = min(_seconds(view, stop), box.hi)
        if (x1 - x0) / ((box.hi - box.lo) or 1.0) >= 0.12:
            svg.text(
                box.x((x0 + x1) / 2),
                y(top + max(0.6, top * 0.15) * 0.55) + 3 * PT,
                "outage",
                8,
                fill="#a50f15",
                font_weight="bold",
                text_anchor="middle",
            )
    svg.add("</g>")
    _time_axis(svg, box, view.clock.dateless, labels=True, grid="#e5e5e5")
    _spines(svg, box)
    svg.text(
        box.left + box.width / 2, box.bottom + 28 * PT, _axis_label(view, box), 8,
        text_anchor="middle",
    )  # fmt: skip
    if first_panel:
        for j, word in enumerate(("healthy", "replicas")):
            x, y0 = box.left - (28 - 9 * j) * PT, box.top + box.height / 2
            svg.text(
                x, y0, word, 8, text_anchor="middle", transform=f"rotate(-90 {x:.2f} {y0:.2f})"
            )


def _axis_label(view: RunView, box: _Axes) -> str:
    clock = view.clock
    if clock.dateless:
        return "time of day (local; date and zone unknown: rich log)"
    first, last = (EPOCH + timedelta(seconds=s) for s in (box.lo, box.hi))
    days = (
        first.date().isoformat()
        if first.date() == last.date()
        else f"{first.date().isoformat()} to {last.date().isoformat()}"
    )
    middle = first + (last - first) / 2
    return f"time ({clock.zone_label(middle.replace(tzinfo=clock.zone or UTC))}) on {days}"


def _legend_handle(svg: Canvas, look: str, value: str, x: float, y: float, width: float) -> None:
    """A legend entry's handle (layout.legend_entries' looks), `width` wide, centred on y."""
    box = (x, y - 3.5 * PT, width, 7 * PT)
    if look == "status":
        svg.rect(*box, STATUS_COLORS[value])
    elif look == "unknown":
        svg.rect(*box, STATUS_COLORS["unknown"], stroke="#9a9a9a", stroke_dasharray=DOTTED)
    elif look == "final":
        svg.line(x + width / 2, y - 5.5 * PT, x + width / 2, y + 5.5 * PT, FINAL_COLORS[value], 2.2)
    elif look in ("healthy", "healthy-estimated"):
        dash = _dash(DASHED, 1.0) if look == "healthy-estimated" else "none"
        svg.rect(*box, "url(#hatch)", stroke=HEALTHY_EDGE, stroke_dasharray=dash)
    elif look == "outage":
        svg.rect(*box, OUTAGE_COLOR, opacity="0.28")
    else:
        shape, _ = LANE_POINTS[value]
        _point(svg, shape, x + width / 2, y, 9, MARKER_STYLE[value][0], "legend-point")


def _draw_legend(svg: Canvas, view: RunView, left: float, top: float, columns: int) -> float:
    """The key of colours and shapes in `columns` columns filled top to bottom, as
    matplotlib's legend spreads its entries; returns its height."""
    entries = legend_entries(view)
    ncol = min(len(entries), columns)
    rows = ceil(len(entries) / ncol)
    sizes = [len(entries) // ncol + (1 if c < len(entries) % ncol else 0) for c in range(ncol)]
    row_h = 14 * PT
    handle = 1.8 * 8 * PT
    x = left + 4 * PT
    index = 0
    svg.add('<g class="status-legend">')
    for size in sizes:
        column = entries[index : index + size]
        index += size
        for r, (look, value, label) in enumerate(column):
            y = top + (r + 0.5) * row_h
            _legend_handle(svg, look, value, x, y, handle)
            svg.text(x + handle + 6.4 * PT, y + 3 * PT, label, 8)
        width = max(text_width(label, 8) for _, _, label in column)
        x += handle + 6.4 * PT + width + 1.4 * 8 * PT
    svg.add("</g>")
    return rows * row_h


def run_svg(
    audit: object, run_id: str, *, tz: str | None = None, story: RunStory | None = None
) -> str:
    """A run's swimlane as the text of an SVG file (see the module doc): the picture
    plots.plot_run draws, laid out here (from the run's `story` when the caller told it)."""
    view = run_view(audit, run_id, tz, story)
    redact = audit.redact  # type: ignore[attr-defined]
    lo, hi = _seconds(view, view.left), _seconds(view, view.right)
    pad = (hi - lo) * 0.02 or 1.0
    windows = [(lo - pad, hi + pad)]
    zoom = zoom_window(view)
    if zoom is not None:
        windows.append((_seconds(view, zoom[0]), _seconds(view, zoom[1])))
    n = len(view.lanes)
    lane = (0.3 if n <= 40 else max(0.16, 12.0 / n)) * PX
    keys = key_lines(view, zoom=zoom is not None)
    width = (14.0 if zoom else 11.5) * PX
    label_w = max(
        (text_width(row.label, 8.5, bold=row.kind == "header") for row in view.lanes), default=0
    )
    left = max(label_w + 8 * PT, 36 * PT) + 6 * PT
    right_pad, gap = 10.0, 22.0
    usable = width - left - right_pad - gap * (len(windows) - 1)
    ratios = [1.0, 1.35][: len(windows)]
    widths = [usable * r / sum(ratios) for r in ratios]
    lefts = [left + sum(widths[:i]) + gap * i for i in range(len(windows))]

    title, subtitle = title_lines(view)
    boxes = [_Axes(lefts[i], 0, widths[i], n * lane, *windows[i]) for i in range(len(windows))]
    callouts = _callouts(view, boxes[-1])
    levels = max((c[3] for c in callouts), default=-1) + 1
    lanes_top = 50 + (7 + 15 * levels + 16) * PT + (14 * PT if zoom else 0)
    cap_top = lanes_top + n * lane + 10 * PT
    cap_h = 0.9 * PX
    legend_top = cap_top + cap_h + 40 * PT
    svg = Canvas()
    svg.add(
        '<defs><pattern id="hatch" patternUnits="userSpaceOnUse" width="6" height="6">'
        f'<path d="M-1,1 l2,-2 M0,6 l6,-6 M5,7 l2,-2" stroke="{HEALTHY_EDGE}" stroke-width="1"/>'
        "</pattern></defs>"
    )
    svg.text(left, 22, redact(title), 12, font_weight="bold", fill="#111111", id="run-title")
    svg.text(left, 44, redact(subtitle), 8.5, fill="#333333", id="subtitle")
    for col, box in enumerate(boxes):
        box.top = lanes_top
        if zoom is not None:
            name = ("whole run", "the incident (zoom)")[col]
            y = lanes_top - (8 + 15 * levels) * PT - 4 * PT
            svg.text(box.left, y, name, 9, fill="#444444")
        _draw_lanes(svg, view, box, first_panel=col == 0, lane=lane)
        cap = _Axes(box.left, cap_top, box.width, cap_h, box.lo, box.hi)
        _draw_capacity(svg, view, cap, first_panel=col == 0)
        if zoom is not None and col == 0:
            z0, z1 = box.x(windows[1][0]), box.x(windows[1][1])
            for panel in (box, cap):
                svg.rect(
                    z0,
                    panel.top,
                    z1 - z0,
                    panel.height,
                    "none",
                    stroke="#555555",
                    stroke_width=f"{0.8 * PT:.2f}",
                    stroke_dasharray=_dash(DASHED, 0.8),
                    **{"class": "zoom-region"},
                )
    _draw_callouts(svg, boxes[-1], callouts)
    legend_h = _draw_legend(svg, view, left, legend_top, 7 if zoom else 6)
    key_top = legend_top + legend_h + 14 * PT
    step = 21.0
    svg.add('<g class="marker-key">')
    for row, (marker, line, first) in enumerate(keys):
        color = MARKER_STYLE[marker.kind][0] if marker is not None else "#333333"
        name = f"key-{marker.kind}" if marker is not None and first else "key-more"
        svg.text(
            left, key_top + (row + 0.5) * step + 4 * PT, line, 9, fill=color, **{"class": name}
        )
    svg.add("</g>")
    return document(svg, width, key_top + len(keys) * step + 12)


def document(svg: Canvas, width: float, height: float) -> str:
    """The SVG file of what `svg` drew, on white, `width` x `height` pixels."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="{FONT}">'
        f'<rect x="0" y="0" width="{width:.0f}" height="{height:.0f}" fill="white"/>'
        + "".join(svg.parts)
        + "</svg>"
    )
