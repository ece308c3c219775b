"""The swimlane's colours, line styles and marker shapes: one vocabulary for every panel and
the key."""

from __future__ import annotations

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
    "victim_pending": ("#7b3294", (0, (1, 4)), "healthy replica not yet stopped"),
    "recovered": ("#1a9850", (0, (4, 2)), "served again"),
    "end_of_evidence": ("#7a7a7a", (0, (1, 3)), "end of the evidence"),
}
OUTAGE_COLOR = "#e31a1c"

# Markers drawn on the lanes of the jobs they concern: (matplotlib marker, size).
LANE_POINTS = {"culprit_failure": ("X", 11), "victim_stop": ("v", 10)}
