"""dstack-audit: find healthy service replicas that dstack killed because a newer deployment failed.

The flow is one way: sources -> canonical model -> timeline -> findings -> reports.
"""

__version__ = "0.1.0"

from analyzer.api import Audit, audit, open_sources
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
    "open_sources",
]
