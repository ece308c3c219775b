"""The library's public surface and the JSON report contract change only on purpose: these
snapshots must be updated in the same commit as the change (and the schema version bumped when
a field changes meaning)."""

from __future__ import annotations

import json
from pathlib import Path

import analyzer
from analyzer import Audit
from analyzer.contract import SCHEMA_VERSION, Report

SNAPSHOT = Path(__file__).parent / "data" / "report_schema.json"

PUBLIC = [
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
AUDIT_MEMBERS = {
    "capacity",
    "deployments",
    "end_of_evidence",
    "events",
    "evidence",
    "findings",
    "healthy_intervals",
    "project",
    "redact",
    "report",
    "run",
    "runs",
    "since",
    "story",
    "sql",
    "submissions",
    "tables",
    "until",
    "verdicts",
}


def test_public_names():
    assert sorted(analyzer.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(analyzer, name) is not None


def test_audit_members_and_docstrings():
    members = {name for name in dir(Audit) if not name.startswith("_")} | {
        name for name in Audit.__dataclass_fields__ if not name.startswith("_")
    }
    assert members == AUDIT_MEMBERS
    for name in ("tables", "sql", "report", "capacity", "healthy_intervals", "redact"):
        assert getattr(Audit, name).__doc__, name
    assert analyzer.open_sources.__doc__ and ">>>" in analyzer.open_sources.__doc__


def test_report_json_schema_is_unchanged():
    assert SCHEMA_VERSION == 4
    assert json.loads(SNAPSHOT.read_text()) == Report.model_json_schema()
