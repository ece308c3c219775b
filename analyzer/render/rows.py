"""Records as CSV or JSON Lines: the findings or the victims of an audit (one row each, the
library's frames: analyzer.contract_frames) and a run's timeline events, written one way."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from analyzer.contract import Report
from analyzer.render.safe import csv_cell

ROWS = ("findings", "victims")


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def jsonl_text(records: Iterable[dict]) -> str:
    """One JSON object a line; times ISO 8601, lists kept as lists."""
    return "".join(json.dumps({k: _plain(v) for k, v in r.items()}) + "\n" for r in records)


def csv_text(records: Iterable[dict], fields: Sequence[str]) -> str:
    """A header and one row a record: times ISO 8601, a list as its items joined by '; ', no
    cell a spreadsheet could run (analyzer.render.safe)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(fields), lineterminator="\n")
    writer.writeheader()
    for record in records:
        row = {
            k: "; ".join(map(str, v)) if isinstance(v, list) else _plain(v)
            for k, v in record.items()
        }
        writer.writerow({k: csv_cell(v) for k, v in row.items()})
    return buffer.getvalue()


def report_rows(report: Report, rows: str, fmt: str) -> str:
    """The findings (one row a finding) or the victims (one row a healthy replica killed) of
    `report` as `fmt`, csv or jsonl: what a spreadsheet or a log pipeline opens."""
    import analyzer.contract_frames as frames

    frame = frames.findings(report) if rows == "findings" else frames.victims(report)
    if fmt == "csv":
        return csv_text(frame.iter_rows(named=True), frame.columns)
    return jsonl_text(frame.iter_rows(named=True))
