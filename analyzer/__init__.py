"""dstack-audit: find healthy service replicas that dstack killed because a newer deployment failed.

The flow is one way: sources -> canonical model -> timeline -> findings -> reports.
"""

__version__ = "0.1.0"

from analyzer.api import Audit, audit, audit_in_partitions, merge_reports, open_sources
from analyzer.errors import AuditInputError
from analyzer.report.schema import Finding, Report, RunVerdict

__all__ = [
    "Audit",
    "AuditInputError",
    "Finding",
    "Report",
    "RunVerdict",
    "__version__",
    "audit",
    "audit_in_partitions",
    "merge_reports",
    "open_sources",
    "plot_fleet",
    "plot_run",
    "render_html",
]

# Plotting pulls in matplotlib: loaded on first use, not at import (the CLI starts faster).
_LAZY = {
    "plot_run": "analyzer.report.plots",
    "plot_fleet": "analyzer.report.plots",
    "render_html": "analyzer.report.html",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'analyzer' has no attribute {name!r}")
