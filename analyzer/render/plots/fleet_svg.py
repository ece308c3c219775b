"""The fleet-wide charts of plots/fleet.py written as SVG text for the HTML report, without
matplotlib (issue 38: its layout pass and PNG encoding were most of a report's time): the same
panels (incidents per day, outage time and lost cost by project and by fleet, the culprits'
failure classes, the totals), bars, labels and colours. Every text is the report's, escaped by
the canvas; the report's texts were redacted when it was made."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from analyzer.contract import Report
from analyzer.render.plots.fleet import (
    Bars,
    day_counts,
    fleet_title,
    panels,
    row_ratios,
    totals_lines,
)
from analyzer.render.plots.svg import (
    AUTO_STEPS,
    EPOCH,
    PT,
    Canvas,
    document,
    nice_ticks,
    text_width,
    time_ticks,
)

WIDTH, HEIGHT = 1250.0, 1300.0  # plots/fleet.py's 12.5 x 13 in at the report's 100 px/in
FULL_RATIOS = 4.3  # the height ratios of its grid with both breakdowns (HEIGHT is theirs)


def _numbers(ticks: list[float]) -> list[str]:
    """The ticks as ScalarFormatter writes them: every one with the decimals the finest
    needs ('0.000', '0.005', ... '0.025')."""
    decimals = max(len(f"{t:.10f}".rstrip("0").split(".")[1]) for t in ticks)
    return [f"{t:.{decimals}f}" for t in ticks]


def _title(svg: Canvas, x: float, y: float, text: str) -> None:
    svg.text(x, y, text, 10, **{"class": "panel-title"})


def _frame(svg: Canvas, left: float, top: float, width: float, height: float) -> None:
    svg.line(left, top, left, top + height, "#000000", 0.8)
    svg.line(left, top + height, left + width, top + height, "#000000", 0.8)


def _hbars(svg: Canvas, bars: Bars, box: tuple[float, float, float, float]) -> None:
    """A panel of horizontal bars, largest first, each with its figure as known."""
    col_left, top, col_width, height = box
    _title(svg, col_left + 8, top + 14, bars.title)
    axes_top, axes_h = top + 26, height - 26 - 52  # below: tick labels and the axis title
    svg.add(f'<g class="{bars.gid}">')
    if not bars.rows:
        left = col_left + 20
        _frame(svg, left, axes_top, col_width - 40, axes_h)
        svg.text(
            left + (col_width - 40) / 2,
            axes_top + axes_h / 2,
            "no findings",
            10,
            fill="#777777",
            text_anchor="middle",
        )
        svg.add("</g>")
        return
    label_w = max(text_width(key, 8) for key, _, _ in bars.rows)
    left = col_left + label_w + 14
    width = col_left + col_width - 24 - left
    top_value = max(value for _, value, _ in bars.rows) or 1.0
    xmax = top_value * 1.35
    slots = max(len(bars.rows), 4)
    slot = axes_h / slots

    def x(value: float) -> float:
        return left + value / xmax * width

    ticks = nice_ticks(xmax, 9, steps=AUTO_STEPS)
    for tick, label in zip(ticks, _numbers(ticks), strict=True):
        svg.line(x(tick), axes_top, x(tick), axes_top + axes_h, "#e5e5e5", 0.6)
        svg.line(x(tick), axes_top + axes_h, x(tick), axes_top + axes_h + 3.5 * PT, "#000000", 0.8)
        svg.text(
            x(tick),
            axes_top + axes_h + 14 * PT,
            label,
            8,
            text_anchor="middle",
            **{"class": "tick-label"},
        )
    for i, (key, value, group) in enumerate(bars.rows):
        middle = axes_top + (i + 0.5) * slot
        svg.rect(
            left, middle - 0.3 * slot, x(value) - left, 0.6 * slot, bars.color, **{"class": "bar"}
        )
        svg.text(left - 4 * PT, middle + 3 * PT, key, 8, text_anchor="end")
        svg.text(
            x(value + top_value * 0.02),
            middle + 2.6 * PT,
            bars.label(value, group),
            7.5,
            fill="#333333",
        )
    _frame(svg, left, axes_top, width, axes_h)
    svg.text(left + width / 2, axes_top + axes_h + 30 * PT, bars.xlabel, 8, text_anchor="middle")
    svg.add("</g>")


def _days(svg: Canvas, report: Report, top: float, height: float) -> None:
    """Incidents per day: a bar per UTC day, its count above it, days on a date axis."""
    _title(svg, 60, top + 14, "Incidents per day (UTC day the outage began)")
    dated, undated = day_counts(report)
    left, width = 60.0, WIDTH - 60 - 16
    axes_top, axes_h = top + 26, height - 26 - 45
    svg.add('<g class="incidents-per-day">')
    if not dated:
        _frame(svg, left, axes_top, width, axes_h)
        svg.text(
            left + width / 2,
            axes_top + axes_h / 2,
            "no dated incidents",
            10,
            fill="#777777",
            text_anchor="middle",
        )
    else:
        days = [(d - EPOCH).total_seconds() for d, _ in dated]
        counts = [c for _, c in dated]
        span = (max(days) - min(days)) / 86400
        pad = max(1.0, span * 0.03) * 86400
        lo, hi = min(days) - pad, max(days) + pad
        ymax = max(counts) * 1.25

        def x(seconds: float) -> float:
            return left + (seconds - lo) / (hi - lo) * width

        def y(value: float) -> float:
            return axes_top + axes_h - value / ymax * axes_h

        levels = nice_ticks(ymax, 10, integer=True)  # MaxNLocator(integer=True)
        for tick, label in zip(levels, _numbers(levels), strict=True):
            svg.line(left, y(tick), left + width, y(tick), "#e5e5e5", 0.6)
            svg.line(left - 3.5 * PT, y(tick), left, y(tick), "#000000", 0.8)
            svg.text(
                left - 5 * PT,
                y(tick) + 3 * PT,
                label,
                8,
                text_anchor="end",
                **{"class": "count-label"},
            )
        unit, ticks = time_ticks(lo, hi, 3)
        for tick in ticks:
            svg.line(
                x(tick), axes_top + axes_h, x(tick), axes_top + axes_h + 3.5 * PT, "#000000", 0.8
            )
            svg.text(
                x(tick),
                axes_top + axes_h + 14 * PT,
                _day_label(tick, unit),
                8,
                text_anchor="middle",
                **{"class": "tick-label"},
            )
        first = EPOCH + timedelta(seconds=ticks[0] if ticks else lo)
        offset = first.strftime("%Y-%b" if unit == 86400 else "%Y-%b-%d")
        svg.text(left + width, axes_top + axes_h + 28 * PT, offset, 8, text_anchor="end")
        bar = 0.8 * 86400 / (hi - lo) * width
        for seconds, count in zip(days, counts, strict=True):
            svg.rect(
                x(seconds) - bar / 2, y(count), bar, y(0) - y(count), "#b2182b", **{"class": "bar"}
            )
            if len(dated) <= 31:
                svg.text(x(seconds), y(count) - 2, str(count), 7.5, text_anchor="middle")
        _frame(svg, left, axes_top, width, axes_h)
        middle = axes_top + axes_h / 2
        svg.text(
            16,
            middle,
            "incidents",
            8,
            text_anchor="middle",
            transform=f"rotate(-90 16 {middle:.2f})",
        )
    if undated:
        svg.text(
            left + width * 0.99,
            axes_top + 16,
            f"+ {undated} incident(s) with date unknown (rich log only)",
            8,
            fill="#555555",
            text_anchor="end",
        )
    svg.add("</g>")


def _day_label(seconds: float, unit: int) -> str:
    """ConciseDateFormatter's default: a day's number, its month on the 1st; an hour, its
    month and day at midnight."""
    moment = EPOCH + timedelta(seconds=seconds)
    if unit == 86400:
        return moment.strftime("%b" if moment.day == 1 else "%d")
    if moment.hour == 0 and moment.minute == 0:
        return moment.strftime("%b-%d")
    return moment.strftime("%H:%M")


def _totals(svg: Canvas, lines: Sequence[str], box: tuple[float, float, float, float]) -> None:
    left, top, _, height = box
    _title(svg, left + 8, top + 14, "Totals")
    svg.add('<g class="totals">')
    axes_top, axes_h = top + 26, height - 26 - 52  # below: tick labels and the axis title
    for i, line in enumerate(lines):
        svg.text(
            left + 8, axes_top + (0.05 + i * 0.09) * axes_h + 9 * PT, line, 9, **{"class": "total"}
        )
    svg.add("</g>")


def fleet_svg(report: Report, *, limit: int = 12) -> str:
    """The fleet-wide charts of `report` as the text of an SVG file: what plots.plot_fleet
    draws, laid out here."""
    svg = Canvas()
    svg.text(WIDTH * 0.01, 24, fleet_title(report), 12, font_weight="bold", id="fleet-title")
    ratios = row_ratios(report)
    height = HEIGHT * sum(ratios) / FULL_RATIOS
    usable = height - 40 - 10
    heights = [usable * r / sum(ratios) for r in ratios]
    tops = [40 + sum(heights[:i]) for i in range(len(ratios))]
    _days(svg, report, tops[0], heights[0])
    half = WIDTH / 2
    charts: list[Any] = panels(report, limit)
    for index, bars in enumerate(charts):
        row, col = 1 + index // 2, index % 2
        _hbars(svg, bars, (col * half, tops[row], half, heights[row]))
    _totals(svg, totals_lines(report), (half, tops[-1], half, heights[-1]))
    return document(svg, WIDTH, height)
