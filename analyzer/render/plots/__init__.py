"""Pictures of the evidence: a run's swimlane timeline and the fleet-wide charts.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas: nothing opens a display,
nothing touches pyplot's global state, and notebooks can show the returned figures. Every text
drawn comes from the audit and passes through `audit.redact` first (a picture cannot be redacted
after it is drawn).

Times are UTC unless a display zone (IANA name) is given. Evidence that carries times of day
only (a rich log alone: a 1970-01-01 pseudo date, zone unknown) is drawn on a time-of-day axis
that says so, and its pseudo date is never shown.
"""

from analyzer.render.plots.figure import figure_bytes
from analyzer.render.plots.fleet import plot_fleet
from analyzer.render.plots.run import plot_run
from analyzer.render.plots.style import KEEP_PER_SLOT

__all__ = ["KEEP_PER_SLOT", "figure_bytes", "plot_fleet", "plot_run"]
