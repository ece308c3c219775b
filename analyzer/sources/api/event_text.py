"""`dstack event` text: lines in the client's local time that name runs and jobs but carry no ids,
given ids from the set's runs JSON and aligned with its UTC times.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from analyzer.sources.api.rows import ExportFile
from analyzer.sources.base import (
    Limitation,
    SourceData,
)
from analyzer.sources.clock import majority_shift

EVENT_DEFAULT_LINES = 100  # `dstack event` without --since shows the latest 100 events


# `dstack event` prints whole seconds (fractions dropped): a line is up to 1 s early beside the
# JSON's moment, on top of the 2 s the log alignment allows either way.
ALIGN_EARLY_US = 2_000_000
ALIGN_LATE_US = 3_000_000


@dataclass
class _TextEvent:
    local: datetime
    time_text: str
    actor: str | None
    targets: list[tuple[str, str | None, str]]  # type, project (if prefixed), name
    message: str
    places: list[str]
    source: str


def _targets(text: str) -> list[tuple[str, str | None, str]]:
    parsed = []
    for part in text.split(", ") if text else []:
        kind, _, name = part.partition(" ")
        project, slash, bare = name.rpartition("/")
        parsed.append((kind, project if slash else None, bare if slash else name))
    return parsed


def _merge_text(files: list[ExportFile]) -> list[_TextEvent]:
    """The text files' events, each once: a line repeated in several files (event.txt and
    event-since.txt) is one event; k equal lines in one file are k events."""
    per_file = []
    for found in files:
        keys = [
            (m["time"], m["actor"], m["targets"], m["message"].rstrip()) for _, m in found.lines
        ]
        per_file.append((found, keys))
    most = Counter()
    for _, keys in per_file:
        for key, count in Counter(keys).items():
            most[key] = max(most[key], count)
    events: dict[tuple[Any, int], _TextEvent] = {}
    order: list[tuple[Any, int]] = []
    for found, keys in sorted(per_file, key=lambda item: -len(item[1])):
        seen: Counter = Counter()
        for (number, _), key in zip(found.lines, keys, strict=True):
            index = seen[key]
            seen[key] += 1
            place = f"{found.info.path}:{number}"
            if (key, index) in events:
                events[(key, index)].places.append(place)
                continue
            time_text, actor, targets, message = key
            events[(key, index)] = _TextEvent(
                local=datetime.strptime(time_text, "%Y-%m-%d %H:%M:%S"),
                time_text=time_text,
                actor=actor,
                targets=_targets(targets),
                message=message,
                places=[place],
                source=found.info.path,
            )
            order.append((key, index))
    merged = [events[k] for k in order]
    merged.sort(key=lambda e: e.local)  # stable: equal seconds keep the file's order
    return merged


@dataclass
class _Entity:
    entity_id: str
    run_id: str
    project: str | None
    start: datetime | None
    end: datetime | None


def _text_anchors(
    runs: list[dict], jobs: list[dict], json_rows: list[dict]
) -> dict[tuple[str, str, str], list[datetime]]:
    """UTC moments the JSON records, keyed like a text line would say them."""
    anchors: dict[tuple[str, str, str], list[datetime]] = defaultdict(list)
    for row in json_rows:
        key = (row["entity_type"], row["entity_name"] or "", "msg:" + row["message"])
        anchors[key].append(row["time"])
    for run in runs:
        if run["submitted_at"]:
            anchors[("run", run["run_name"] or "", "submitted")].append(run["submitted_at"])
    for job in jobs:
        if job["submitted_at"]:
            anchors[("job", job["job_name"] or "", "created")].append(job["submitted_at"])
    return anchors


def _text_key(entity_type: str, name: str, message: str) -> list[tuple[str, str, str]]:
    keys = [(entity_type, name, "msg:" + message)]
    if entity_type == "run" and message.startswith("Run submitted"):
        keys.append(("run", name, "submitted"))
    if entity_type == "job" and message.startswith("Job created"):
        keys.append(("job", name, "created"))
    return keys


def _align(
    events: list[_TextEvent], anchors: dict[tuple[str, str, str], list[datetime]]
) -> tuple[int | None, int, int]:
    """The client's UTC offset (seconds, whole quarter hours) most unambiguous pairs agree on:
    (offset or None, lines paired, lines agreeing)."""
    by_key: dict[tuple[str, str, str], list[_TextEvent]] = defaultdict(list)
    for event in events:
        for kind, _, name in event.targets:
            if kind in ("run", "job"):
                for key in _text_key(kind, name, event.message):
                    by_key[key].append(event)
    diffs = [
        (moments[0] - lines[0].local) // timedelta(microseconds=1)
        for key, lines in by_key.items()
        if len(lines) == 1 and len(moments := anchors.get(key, [])) == 1
    ]
    pairs = pl.DataFrame(
        {"set": [0] * len(diffs), "voter": list(range(len(diffs))), "diff": diffs},
        schema={"set": pl.Int64, "voter": pl.Int64, "diff": pl.Int64},
    )
    found = majority_shift(pairs, "set", early_us=ALIGN_EARLY_US, late_us=ALIGN_LATE_US)
    if found.height == 0:
        return None, len(diffs), 0
    return found["shift"][0] // 1_000_000, len(diffs), found["agree"][0]


def _resolve(candidates: list[_Entity], project: str | None, when: datetime) -> _Entity | None:
    found = [c for c in candidates if project is None or c.project in (None, project)]
    ids = {c.entity_id for c in found}
    if len(ids) == 1:
        return found[0]
    slack = timedelta(seconds=1)
    inside = {
        c.entity_id: c
        for c in found
        if (c.start is None or when >= c.start.replace(microsecond=0) - slack)
        and (c.end is None or when <= c.end + slack)
    }
    return next(iter(inside.values())) if len(inside) == 1 else None


def text_event_rows(
    text_files: list[ExportFile],
    server: str,
    runs: list[dict],
    jobs: list[dict],
    json_rows: list[dict],
    data: SourceData,
    label: str,
) -> list[dict[str, Any]]:
    if not text_files:
        return []
    events = _merge_text(text_files)
    shift, paired, agree = _align(events, _text_anchors(runs, jobs, json_rows))
    sources = ", ".join(f.info.path for f in text_files)
    if shift is not None and agree * 2 > paired:
        offset = -shift
        sign = "+" if offset >= 0 else "-"
        zone = f"UTC{sign}{abs(offset) // 3600:02d}:{abs(offset) % 3600 // 60:02d}"
        basis = "log_local_offset_inferred"
        data.limitations.append(
            Limitation(
                "cli_event_time_aligned",
                "`dstack event` prints the client's local time without a zone (to the second); "
                f"aligned with the runs/events JSON of the same export: of {paired} lines "
                f"paired with a moment the JSON records, {agree} agree on local time = {zone}",
                label,
            )
        )
    else:
        shift, basis = 0, "log_local_assumed_utc"
        data.limitations.append(
            Limitation(
                "cli_event_time_zone_unknown",
                "`dstack event` prints the client's local time without a zone (to the second) "
                "and nothing in this export could align it: times are taken as written (as "
                "UTC); events from the events API (UTC) are preferred where both are present",
                sources,
            )
        )

    entities: dict[tuple[str, str], list[_Entity]] = defaultdict(list)
    for run in runs:
        entities[("run", run["run_name"] or "")].append(
            _Entity(
                run["run_id"],
                run["run_id"],
                run["project"],
                run["submitted_at"],
                run["last_processed_at"],
            )
        )
    run_projects = {run["run_id"]: run["project"] for run in runs}
    for job in jobs:
        entities[("job", job["job_name"] or "")].append(
            _Entity(
                job["job_id"],
                job["run_id"],
                run_projects.get(job["run_id"]),
                job["submitted_at"],
                job["last_processed_at"],
            )
        )
    for row in json_rows:  # submissions deleted from the runs JSON still have their events
        key = (row["entity_type"], row["entity_name"] or "")
        if row["run_id"] and all(e.entity_id != row["entity_id"] for e in entities[key]):
            entities[key].append(
                _Entity(row["entity_id"], row["run_id"], row["_project"], row["time"], row["time"])
            )
    json_keys = {
        (r["entity_type"], r["entity_id"], r["message"], r["time"].replace(microsecond=0))
        for r in json_rows
    }

    rows: list[dict[str, Any]] = []
    unresolved = duplicates = 0
    for event in events:
        time = event.local + timedelta(seconds=shift)
        for kind, project, name in event.targets:
            if kind not in ("run", "job"):
                continue
            entity = _resolve(entities.get((kind, name), []), project, time)
            if entity is None:
                unresolved += 1
                continue
            if (kind, entity.entity_id, event.message, time) in json_keys:
                duplicates += 1  # the same event from the events API: keep the JSON's
                continue
            rows.append(
                {
                    "server": server,
                    "source": event.source,
                    "time": time,
                    "time_text": event.time_text,
                    "time_basis": basis,
                    "origin": "events_table",
                    "entity_type": kind,
                    "entity_id": entity.entity_id,
                    "entity_name": name,
                    "run_id": entity.run_id,
                    "actor": "system" if event.actor is None else f"user {event.actor}",
                    "message": event.message,
                    "provenance": event.places,
                }
            )
    lines = sum(len(f.lines) for f in text_files)
    note = (
        f"{len(events)} distinct events in {lines} lines of {len(text_files)} file(s); "
        f"{len(rows)} run/job rows used"
        + (f", {duplicates} already in the events JSON" if duplicates else "")
        + (f", {unresolved} run/job targets not tied to one id" if unresolved else "")
    )
    text_files[0].info.notes.append(note)
    if unresolved:
        data.limitations.append(
            Limitation(
                "cli_event_names_unresolved",
                f"{unresolved} run/job targets of `dstack event` lines could not be tied to one "
                "run or job id: the text names runs and jobs but carries no ids, so it needs the "
                "runs JSON of the same export (`dstack ps --json`, `dstack run get --json` or the "
                "runs API) and a name that one submission alone had at that moment; those lines "
                "are not used",
                sources,
            )
        )
    for found in text_files:
        if len(found.lines) == EVENT_DEFAULT_LINES:
            data.limitations.append(
                Limitation(
                    "cli_event_latest_100",
                    "exactly 100 `dstack event` lines: without --since the command shows only "
                    "the latest 100 events, so earlier ones may be missing (export with --since)",
                    found.info.path,
                )
            )
    return rows
