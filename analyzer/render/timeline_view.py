"""A run's events as one list across sources, and its exports for forensic tools.

The same event is often seen twice: in the database (microseconds) and in a rich log, which
writes whole seconds. Such a pair is one line, at the precise time, with both provenances; an
event seen only in whole seconds keeps its own line. Victims and culprits are marked.
Exports: JSON, JSON lines, CSV (spreadsheets, lnav) and Timesketch's JSONL (`message`,
`datetime`, `timestamp_desc` and the event's fields).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

import polars as pl

from analyzer.contract import Finding
from analyzer.pipeline.story import job_roles
from analyzer.render.rows import csv_text, jsonl_text

EXPORT_FIELDS = [
    "time",
    "time_text",
    "time_basis",
    "kind",
    "entity_type",
    "entity_name",
    "entity_id",
    "role",
    "old_status",
    "new_status",
    "termination_reason",
    "termination_message",
    "deployment_num",
    "actor",
    "message",
    "provenance",
]


def roles(findings: Iterable[Finding]) -> dict[str, str]:
    """Job id -> 'victim' / 'culprit' for the findings of one run (the story's roles)."""
    return {job: role.role for job, role in job_roles(findings).items()}


def _role(entity_id: str | None, marked: dict[str, str]) -> str | None:
    if not entity_id:
        return None
    if entity_id in marked:
        return marked[entity_id]
    short = entity_id.replace("-", "")
    if len(short) < 32:  # a log alone gives 6-hex prefixes
        for job_id, role in marked.items():
            if job_id.replace("-", "").startswith(short):
                return role
    return None


def merged_events(events: pl.DataFrame, marked: dict[str, str] | None = None) -> list[dict]:
    """One dict per event, in time order: a whole-second sighting of an event joins the one
    precise sighting of the same event (entity, kind, status) within that second."""
    marked = marked or {}
    rows = events.filter(pl.col("kind") != "other").sort("time", "seq", nulls_last=True)
    items = [dict(r, provenance=list(r["provenance"] or [])) for r in rows.iter_rows(named=True)]

    def key(item: dict) -> tuple:
        second = item["time"].replace(microsecond=0)
        subject = item["entity_id"] or item["entity_name"]
        return (item["entity_type"], subject, item["kind"], item["new_status"], second)

    precise: dict[tuple, list[dict]] = {}
    for item in items:
        if item["time"] is not None and item["time"].microsecond:
            precise.setdefault(key(item), []).append(item)
    out = []
    for item in items:
        time = item["time"]
        if time is not None and not time.microsecond:
            matches = precise.get(key(item), [])
            if len(matches) == 1:
                target = matches[0]
                target["provenance"] += [
                    p for p in item["provenance"] if p not in target["provenance"]
                ]
                target["message"] = target["message"] or item["message"]
                continue
        out.append(item)
    for item in out:
        item["role"] = _role(item["entity_id"], marked)
    return out


def _plain(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def export(run: dict, items: list[dict], fmt: str) -> str:
    """The events of `run` as json, jsonl, csv or timesketch."""
    records = [{name: _plain(item.get(name)) for name in EXPORT_FIELDS} for item in items]
    for item, record in zip(items, records, strict=True):
        if item["time_basis"] == "time_of_day_only":
            record["time"] = None  # a rich log alone: no date is known, none is invented
        record["run_id"], record["run_name"] = run["run_id"], run["run_name"]
        record["project"] = run["project"]
    if fmt == "json":
        head = {k: _plain(run.get(k)) for k in ("server", "project", "run_name", "run_id")}
        return json.dumps({"run": head, "events": records}, indent=2) + "\n"
    if fmt == "jsonl":
        return jsonl_text(records)
    if fmt == "timesketch":
        lines = []
        for item, record in zip(items, records, strict=True):
            dated = item["time"] is not None and item["time_basis"] != "time_of_day_only"
            subject = f"{item['entity_type']} {item['entity_name']}"
            role = f" [{item['role']}]" if item["role"] else ""
            sketch = {
                **record,
                "message": f"{subject}{role}: {item['message']}",
                "datetime": record["time"] if dated else None,
                "timestamp_desc": f"dstack {item['kind']}".replace("_", " "),
                "event_message": item["message"],
            }
            lines.append(json.dumps(sketch) + "\n")
        return "".join(lines)
    if fmt == "csv":
        return csv_text(records, [*EXPORT_FIELDS, "run_id", "run_name", "project"])
    raise ValueError(fmt)
