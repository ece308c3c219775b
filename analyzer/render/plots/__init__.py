"""Pictures of the evidence: a run's swimlane timeline and the fleet-wide charts.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas: nothing opens a display,
nothing touches pyplot's global state, and notebooks can show the returned figures. Every text
drawn comes from the audit and passes through `audit.redact` first (a picture cannot be redacted
after it is drawn). The HTML report writes the same pictures as SVG text without matplotlib
(plots/svg.py, plots/fleet_svg.py), so matplotlib is imported only when a figure is asked for.

Times are UTC unless a display zone (IANA name) is given. Evidence that carries times of day
only (a rich log alone: a 1970-01-01 pseudo date, zone unknown) is drawn on a time-of-day axis
that says so, and its pseudo date is never shown.
"""

from importlib import import_module

from analyzer.render.plots.style import KEEP_PER_SLOT

_FIGURES = {
    "figure_bytes": "analyzer.render.plots.figure",
    "plot_fleet": "analyzer.render.plots.fleet",
    "plot_run": "analyzer.render.plots.run",
}

__all__ = ["KEEP_PER_SLOT", "figure_bytes", "plot_fleet", "plot_run"]


def __getattr__(name: str):
    """matplotlib's drawings, imported when first asked for (matplotlib is slow to import)."""
    if name in _FIGURES:
        return getattr(import_module(_FIGURES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
