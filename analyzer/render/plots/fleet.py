"""Fleet-wide charts from a report: incidents per day, outage time and lost cost by project and
by fleet, and the culprits' failure classes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from analyzer.contract import Report, Totals
from analyzer.render.format import Clock, cost_text, outage_text, replica_time_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure


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
    groups: Sequence[Any], limit: int, metric: Callable[[Any], float | None]
) -> list[tuple[str, float, Any]]:
    """The `limit` largest groups by `metric` (an unknown figure draws no bar), the rest as one
    row whose third item is the list of its groups."""
    rows = sorted(((g.key, metric(g) or 0.0, g) for g in groups), key=lambda r: (-r[1], r[0]))
    if len(rows) <= limit:
        return rows
    rest = rows[limit - 1 :]
    other = (f"{len(rest)} others", sum(r[1] for r in rest), [r[2] for r in rest])
    return [*rows[: limit - 1], other]


def _label(group: Any, figure: Callable[[Any], str], merged: Callable[[list], str]) -> str:
    """A bar's figure as known: one group's, or the merged figure of the 'others' row."""
    return merged(group) if isinstance(group, list) else figure(group)


@dataclass
class Bars:
    """One panel of horizontal bars: its rows (key, value, group or the merged groups), what
    a bar's figure says, its colour and titles."""

    title: str
    xlabel: str
    gid: str
    color: str
    rows: list[tuple[str, float, Any]]
    label: Callable[[float, Any], str]


def fleet_title(report: Report) -> str:
    s = report.summary
    return (
        f"Healthy replicas killed by a failed rollout: {s.incidents} incident(s), "
        f"{s.victims} replica(s), {s.runs} run(s) audited"
    )


def day_counts(report: Report) -> tuple[list[tuple[datetime, int]], int]:
    """(day, incidents) of every dated day, and the incidents whose day is unknown."""
    dated: list[tuple[datetime, int]] = []
    undated = 0
    for group in report.summary.by_day:
        try:
            dated.append((datetime.strptime(group.key, "%Y-%m-%d"), group.incidents))
        except ValueError:
            undated += group.incidents
    return dated, undated


def _merged_totals(groups: list) -> Totals:
    return Totals(
        incidents=sum(g.incidents for g in groups),
        findings=sum(g.findings for g in groups),
        victims=sum(g.victims for g in groups),
        outage_seconds=sum(g.outage_seconds or 0.0 for g in groups),
        outage_is_lower_bound=any(g.outage_is_lower_bound for g in groups),
        outage_unknown_runs=sum(g.outage_unknown_runs for g in groups),
        lost_cost=sum(g.lost_cost or 0.0 for g in groups),
        lost_cost_is_lower_bound=any(g.lost_cost_is_lower_bound for g in groups),
        cost_unknown_victims=sum(g.cost_unknown_victims for g in groups),
    )


def _outage_label(value: float, group: Any) -> str:
    def text(g: Any) -> str:
        return f"{outage_text(g)} · {g.incidents} incident(s)"

    return _label(group, text, lambda groups: text(_merged_totals(groups)))


def _cost_label(value: float, group: Any) -> str:
    return _label(group, cost_text, lambda groups: cost_text(_merged_totals(groups)))


def breakdowns(report: Report) -> list[tuple[str, Sequence[Any]]]:
    """The breakdowns worth a row of panels: by project and by fleet, where there are several
    (one project or one fleet is a line of the totals, not two panels)."""
    s = report.summary
    return [
        (name, groups)
        for name, groups in (("project", s.by_project), ("fleet", s.by_fleet))
        if len(groups) > 1
    ]


def row_ratios(report: Report) -> list[float]:
    """The grid's height ratios: incidents per day, a row per breakdown, the failure classes
    beside the totals."""
    return [1.0, *[1.15] * len(breakdowns(report)), 1.0]


def panels(report: Report, limit: int) -> list[Bars]:
    """The bar panels in reading order: outage time and lost cost by project, then by fleet
    (where there are several), then the culprits' failure classes."""
    s = report.summary
    out = []
    for name, groups in breakdowns(report):
        factor, unit = _seconds_unit(g.outage_seconds or 0.0 for g in groups)
        rows = [(k, v / factor, g) for k, v, g in _top(groups, limit, lambda g: g.outage_seconds)]
        out.append(
            Bars(
                f"Outage time by {name}",
                f"outage ({unit}; until recovery or the end of the evidence)",
                f"outage-by-{name}",
                "#ef6548",
                rows,
                _outage_label,
            )
        )
        out.append(
            Bars(
                f"Lost cost by {name} (healthy replica-time killed × price)",
                "lost cost ($)",
                f"cost-by-{name}",
                "#807dba",
                _top(groups, limit, lambda g: g.lost_cost),
                _cost_label,
            )
        )
    classes = [(g.key, float(g.incidents), g) for g in s.by_failure_class]
    classes.sort(key=lambda r: (-r[1], r[0]))
    out.append(
        Bars(
            "Culprit failure classes",
            "incidents",
            "failure-classes",
            "#4a90c8",
            classes,
            lambda v, g: f"{int(v)} incident(s), {g.victims} victim(s)" if g else "",
        )
    )
    return out


def totals_lines(report: Report) -> list[str]:
    s = report.summary
    lines = [
        f"runs audited: {s.runs} ({s.runs_in_progress} still active)",
        f"incidents: {s.incidents} ({s.findings} finding(s))",
        f"healthy replicas killed: {s.victims}",
        f"outage, summed: {outage_text(s)}",
        f"healthy replica-time lost: {replica_time_text(s)}",
        f"lost cost: {cost_text(s)}",
        *(
            f"{name}: {groups[0].key} (every incident)"
            for name, groups in (("project", s.by_project), ("fleet", s.by_fleet))
            if len(groups) == 1
        ),
        f"end of the evidence: {Clock().full(report.end_of_evidence)}"
        if report.end_of_evidence
        else "end of the evidence: unknown",
    ]
    for name, count in sorted(s.by_verdict.items()):
        lines.append(f"verdict {name}: {count}")
    return lines


def _hbars(ax: Any, bars: Bars) -> None:
    ax.set_title(bars.title, fontsize=10, loc="left")
    ax.set_gid(bars.gid)
    rows = bars.rows
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
    ax.barh(ys, values, color=bars.color, height=0.6, zorder=2)
    ax.set_yticks(list(ys), labels=keys, fontsize=8)
    ax.set_ylim(max(len(rows), 4) - 0.5, -0.5)  # a few bars stay bars, not blocks
    top = max(values) or 1.0
    ax.set_xlim(0, top * 1.35)
    for y, (_, value, group) in zip(ys, rows, strict=True):
        ax.text(
            value + top * 0.02,
            y,
            bars.label(value, group),
            va="center",
            fontsize=7.5,
            color="#333333",
        )
    ax.set_xlabel(bars.xlabel, fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    ax.grid(axis="x", color="#e5e5e5", lw=0.6, zorder=0)
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)


def plot_fleet(report: Report, *, limit: int = 12) -> Figure:
    """Fleet-wide charts from a report: incidents per day, outage time and lost cost by project
    and by fleet (where there are several), and the culprits' failure classes."""
    # matplotlib only here: the HTML report draws these panels as SVG (plots/fleet_svg.py)
    import matplotlib.dates as mdates
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    ratios = row_ratios(report)
    fig = Figure(figsize=(12.5, 13.0 * sum(ratios) / 4.3), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(len(ratios), 2, height_ratios=ratios)
    fig.suptitle(fleet_title(report), fontsize=12, fontweight="bold", x=0.01, ha="left")

    day_ax = fig.add_subplot(grid[0, :])
    day_ax.set_gid("incidents-per-day")
    day_ax.set_title("Incidents per day (UTC day the outage began)", fontsize=10, loc="left")
    dated, undated = day_counts(report)
    if dated:
        days = [d for d, _ in dated]
        counts = [c for _, c in dated]
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

    for index, bars in enumerate(panels(report, limit)):
        _hbars(fig.add_subplot(grid[1 + index // 2, index % 2]), bars)
    totals = fig.add_subplot(grid[len(ratios) - 1, 1])
    totals.axis("off")
    totals.set_gid("totals")
    totals.set_title("Totals", fontsize=10, loc="left")
    for i, line in enumerate(totals_lines(report)):
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
