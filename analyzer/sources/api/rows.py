"""One export file read and validated, and its runs, jobs and JSON events as canonical rows (the
same values the database sources give: full dashed ids, UTC times, dstack's enum names).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import polars as pl
from pydantic import ValidationError

from analyzer.dstack import spec_fingerprint
from analyzer.errors import AuditInputError
from analyzer.model import UTC_TIME
from analyzer.redact import Redactor, json_secret_values
from analyzer.sources.api.models import (
    EVENTS_LIST,
    FLEETS_LIST,
    INSTANCES_LIST,
    RUNS_LIST,
    EventModel,
    FleetModel,
    InstanceModel,
    PsModel,
    RunModel,
    ServerInfoModel,
)
from analyzer.sources.api.recognise import (
    ANSI,
    EVENT_LINE,
    EVENT_TEXT,
    EVENTS_PAGE,
    FLEETS_PAGE,
    INSTANCES_PAGE,
    KIND,
    PS_JSON,
    RUN,
    RUNS_PAGE,
    SERVER_INFO,
    classify,
    shape_of,
)
from analyzer.sources.base import (
    InputInfo,
    file_facts,
)
from analyzer.sources.dstack_tables import PLACEMENT_PARAMS

# Which copy of a run or job a set keeps when several files hold it at the same moment.
RUN_SOURCE_RANK = {RUN: 2, RUNS_PAGE: 1, PS_JSON: 0}


RUNS_LIST_SUBMISSIONS_LIMIT = 10  # /api/runs/list job_submissions_limit default and maximum


# ---------------------------------------------------------------------------------------------
# Reading one file


@dataclass
class ExportFile:
    path: Path
    shape: str | None
    info: InputInfo
    runs: list[tuple[RunModel, dict, str]] = field(default_factory=list)  # model, raw, pointer
    events: list[tuple[EventModel, dict, str]] = field(default_factory=list)
    lines: list[tuple[int, re.Match[str]]] = field(default_factory=list)  # line number, parts
    fleets: list[tuple[FleetModel, dict, str]] = field(default_factory=list)
    instances: list[tuple[InstanceModel, dict, str]] = field(default_factory=list)
    server_version: str | None = None


def _loc(loc: tuple[Any, ...]) -> str:
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
    return text.lstrip(".") or "(the document)"


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number" if isinstance(value, int | float) else "a value")


def _invalid(path: Path, shape: str, error: ValidationError) -> AuditInputError:
    first = error.errors()[0]
    more = error.error_count() - 1
    return AuditInputError(
        str(path),
        f"not a valid {shape}: {_loc(first['loc'])}: {first['msg']} "
        f"(got {_json_type(first.get('input'))})" + (f"; and {more} more" if more else ""),
        "the file looks like a dstack API/CLI export but a field has the wrong type; "
        "re-export it without editing",
    )


def read_export(path: Path) -> ExportFile:
    """Parse one export; AuditInputError (naming the file) when it is damaged."""
    shape = classify(path)
    info = file_facts(path, KIND if shape is None else f"{KIND} ({shape})")
    found = ExportFile(path=path, shape=shape, info=info)
    if shape == EVENT_TEXT:
        raw = path.read_bytes().decode("utf-8", "replace")
        for number, line in enumerate(raw.splitlines(), start=1):
            line = ANSI.sub("", line).rstrip()
            if not line.strip():
                continue
            match = EVENT_LINE.match(line)
            if match:
                found.lines.append((number, match))
            else:
                info.unparsed += 1
        info.records = len(found.lines)
        return found
    try:
        doc = json.loads(path.read_bytes())
    except UnicodeDecodeError as error:
        raise AuditInputError(str(path), f"malformed JSON: not UTF-8 ({error.reason})") from None
    except json.JSONDecodeError as error:
        raise AuditInputError(
            str(path),
            f"malformed JSON: {error.msg} at line {error.lineno} column {error.colno}",
            "the file looks like a dstack API export but does not parse (cut short?); re-export it",
        ) from None
    except RecursionError:
        raise AuditInputError(str(path), "malformed JSON: nested too deeply") from None
    actual = shape_of(doc)
    if actual is None:
        raise AuditInputError(str(path), "JSON that is not a dstack runs or events export")
    found.shape = actual
    info.kind = f"{KIND} ({actual})"
    try:
        if actual == RUNS_PAGE:
            models = RUNS_LIST.validate_python(doc)
            found.runs = [(m, r, f"/{i}") for i, (m, r) in enumerate(zip(models, doc, strict=True))]
        elif actual == RUN:
            found.runs = [(RunModel.model_validate(doc), doc, "")]
        elif actual == PS_JSON:
            ps = PsModel.model_validate(doc)
            found.runs = [
                (m, r, f"/runs/{i}")
                for i, (m, r) in enumerate(zip(ps.runs, doc["runs"], strict=True))
            ]
        elif actual == EVENTS_PAGE:
            models = EVENTS_LIST.validate_python(doc)
            found.events = [
                (m, r, f"/{i}") for i, (m, r) in enumerate(zip(models, doc, strict=True))
            ]
        elif actual == FLEETS_PAGE:
            models = FLEETS_LIST.validate_python(doc)
            found.fleets = [
                (m, r, f"/{i}") for i, (m, r) in enumerate(zip(models, doc, strict=True))
            ]
        elif actual == INSTANCES_PAGE:
            models = INSTANCES_LIST.validate_python(doc)
            found.instances = [
                (m, r, f"/{i}") for i, (m, r) in enumerate(zip(models, doc, strict=True))
            ]
        elif actual == SERVER_INFO:
            found.server_version = ServerInfoModel.model_validate(doc).server_version
            info.server_version = found.server_version
    except ValidationError as error:
        raise _invalid(path, actual, error) from None
    info.records = len(found.runs) or len(found.events) or len(found.fleets) or len(found.instances)
    return found


# ---------------------------------------------------------------------------------------------
# Runs and jobs


def _utc(value: datetime | None) -> datetime | None:
    """Aware -> naive UTC; naive API times are UTC already."""
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def _enum(value: str | None) -> str | None:
    text = (value or "").strip()
    return text.lower() or None


def placement_spec(run_spec: dict | None) -> str | None:
    """The run spec's placement parts as one JSON text, as `dstack_tables._placement_spec`
    reads them from `runs.run_spec`: the configuration's value over the profile's."""
    if not isinstance(run_spec, dict):
        return None
    configuration = run_spec.get("configuration") or {}
    profile = run_spec.get("profile") or {}
    groups = configuration.get("groups")
    slim = (
        [
            {k: g.get(k) for k in ("name", "replicas", "resources")}
            for g in groups
            if isinstance(g, dict)
        ]
        if isinstance(groups, list)
        else None
    )
    parts = {
        "replicas": configuration.get("replicas"),
        "groups": slim,
        "priority": configuration.get("priority"),
    }
    for name in PLACEMENT_PARAMS:
        value = configuration.get(name)
        parts[name] = value if value is not None else profile.get(name)
    return json.dumps(parts, separators=(",", ":"))


def _fixed(replicas: Any) -> int | None:
    """A replica count dstack never moves: a number, or a range whose min is its max
    (`ManualScaler.get_desired_count` clips the desired count into [min, max])."""
    if replicas is None:
        return 1  # ServiceConfiguration's default
    if isinstance(replicas, int):
        return replicas
    if isinstance(replicas, dict) and replicas.get("min") == replicas.get("max"):
        low = replicas.get("min")
        return low if isinstance(low, int) else None
    return None


def desired_replicas(configuration: dict) -> int | None:
    """`runs.desired_replica_count` where the spec fixes it (`compute_desired_replica_counts`:
    the sum over replica groups); None where an autoscaler or a range decides (not in the API)."""
    if configuration.get("type") != "service":
        return None
    groups = configuration.get("groups")
    if isinstance(groups, list) and groups:
        counts = [_fixed(g.get("replicas")) if isinstance(g, dict) else None for g in groups]
        return None if None in counts else sum(c for c in counts if c is not None)
    if configuration.get("scaling") is not None:
        return None
    return _fixed(configuration.get("replicas"))


def run_row(run: RunModel, raw: dict, server: str, provenance: str) -> dict[str, Any]:
    configuration = run.run_spec.configuration or {}
    run_type = configuration.get("type") if isinstance(configuration.get("type"), str) else None
    if run_type is None and run.service:
        run_type = "service"
    fleet = (run.fleet or {}).get("id")
    return {
        "server": server,
        "run_id": str(run.id),
        "project": run.project_name,
        "run_name": run.run_spec.run_name,
        "run_type": run_type,
        "status": _enum(run.status),
        "termination_reason": _enum(run.termination_reason),
        "deployment_num": run.deployment_num,
        "submitted_at": _utc(run.submitted_at),
        "last_processed_at": _utc(run.last_processed_at),
        "deleted": run.deleted,
        "user": run.user,
        "fleet_id": str(fleet).lower() if fleet else None,
        "desired_replica_count": desired_replicas(configuration),
        "placement_spec": placement_spec(raw.get("run_spec")),
        "provenance": provenance,
    }


def job_rows(
    run: RunModel, raw: dict, server: str, label: str, pointer: str
) -> list[tuple[dict[str, Any], str | None]]:
    """One row per submission, with the JSON text of the job spec (latest submission only)."""
    rows = []
    for j, (job, raw_job) in enumerate(zip(run.jobs, raw.get("jobs") or [], strict=False)):
        spec = job.job_spec
        ready_after = [p.ready_after if p.ready_after is not None else 1 for p in spec.probes or []]
        latest = max((s.submission_num for s in job.job_submissions), default=None)
        spec_text = json.dumps(raw_job.get("job_spec"), separators=(",", ":"))
        for s, sub in enumerate(job.job_submissions):
            streaks = [p.success_streak for p in sub.probes] if sub.probes is not None else None
            known = [x for x in streaks or [] if x is not None]
            provisioning = sub.job_provisioning_data or {}
            price = provisioning.get("price")
            offer = (sub.job_runtime_data or {}).get("offer") or {}
            blocks = offer.get("blocks")
            message = sub.termination_reason_message
            row = {
                "server": server,
                "run_id": str(run.id),
                "job_id": str(sub.id),
                "job_name": spec.job_name,
                "replica_num": spec.replica_num,
                "job_num": spec.job_num,
                "submission_num": sub.submission_num,
                "deployment_num": sub.deployment_num,
                "status": _enum(sub.status),
                "termination_reason": _enum(sub.termination_reason),
                "termination_reason_message": message if message else None,
                "exit_status": sub.exit_status,
                "submitted_at": _utc(sub.submitted_at),
                "last_processed_at": _utc(sub.last_processed_at or sub.finished_at),
                "has_provisioning_data": sub.job_provisioning_data is not None,
                "price": float(price) if isinstance(price, int | float) else None,
                "blocks": blocks if isinstance(blocks, int) else None,
                # what ties the job to its instance (the API has no jobs.used_instance_id)
                "_host": provisioning.get("hostname"),
                "_backend": _enum(provisioning.get("backend")),
                "_region": provisioning.get("region"),
                "_type": (provisioning.get("instance_type") or {}).get("name"),
                "replica_group": spec.replica_group,
                "probe_count": len(ready_after),
                "probe_rows": None if streaks is None else len(streaks),
                "probes_below_ready_after": None
                if streaks is None
                else sum(
                    1
                    for i, streak in enumerate(streaks)
                    if streak is not None
                    and streak < (ready_after[i] if i < len(ready_after) else 1)
                ),
                "min_probe_streak": min(known) if known else None,
                "probe_ready_after": max(ready_after, default=None),
                "deployment_basis": "table",
                "provenance": f"{label}#{pointer}/jobs/{j}/job_submissions/{s}",
            }
            rows.append((row, spec_text if sub.submission_num == latest else None))
    return rows


def spec_fingerprints(specs: list[str | None]) -> list[str | None]:
    """The same hash of the rolling JobSpec fields as dstack_tables computes from job_spec_data."""
    spec = pl.col("spec")
    return (
        pl.DataFrame({"spec": specs}, schema={"spec": pl.String})
        .select(pl.when(spec.is_not_null()).then(spec_fingerprint(spec)).alias("fingerprint"))[
            "fingerprint"
        ]
        .to_list()
    )


def secret_values(raws: list[dict]) -> set[str]:
    """Secret values inside run specs and job specs, only so that no output can show them."""
    run_specs, job_specs = [], []
    for raw in raws:
        run_specs.append(json.dumps(raw.get("run_spec")))
        job_specs.extend(json.dumps(job.get("job_spec")) for job in raw.get("jobs") or [])
    redactor = Redactor()
    for texts in (run_specs, job_specs):
        if texts:
            frame = pl.DataFrame({"spec": texts}, schema={"spec": pl.String})
            redactor.add_frame_values(frame.select(json_secret_values(pl.col("spec"))))
    return redactor.values


@dataclass
class Kept:
    row: dict[str, Any]
    rank: tuple[Any, ...]
    provenance: list[str]
    spec: str | None = None
    shapes: set[str] = field(default_factory=set)


def keep_best(store: dict[str, Kept], key: str, row: dict, rank: tuple, shape: str, spec=None):
    """One copy per id: the newest state (last_processed_at), then the fullest export."""
    kept = store.get(key)
    if kept is None:
        store[key] = Kept(row, rank, [row["provenance"]], spec, {shape})
        return
    kept.provenance.append(row["provenance"])
    kept.shapes.add(shape)
    if rank > kept.rank:
        kept.row, kept.rank = row, rank
        kept.spec = spec if spec is not None else kept.spec
    elif kept.spec is None:
        kept.spec = spec


def rank_of(row: dict, shape: str) -> tuple[Any, ...]:
    return (row["last_processed_at"] or datetime.min, RUN_SOURCE_RANK.get(shape, 0))


def rows_frame(rows: list[dict], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """The rows (keys outside the schema ignored, missing ones null) in one conversion: a
    frame built column by column costs a Series per column, most of an export's load."""
    naive = {
        name: (pl.Datetime("us") if dtype == UTC_TIME else dtype) for name, dtype in schema.items()
    }
    frame = pl.from_dicts(rows, schema=naive) if rows else pl.DataFrame(schema=naive)
    return frame.with_columns(
        pl.col(name).dt.replace_time_zone("UTC") for name, dt in schema.items() if dt == UTC_TIME
    )


# ---------------------------------------------------------------------------------------------
# Events (API JSON and `dstack event` text)


def _actor(user: str | None, user_id: UUID | None) -> str:
    if user is None and user_id is None:
        return "system"
    return f"user {user or user_id}"


def json_event_rows(
    files: list[ExportFile], server: str, job_runs: dict[str, str]
) -> list[dict[str, Any]]:
    """One row per run/job target of each distinct event, in the API's ascending order
    (recorded_at, then id descending), with every place the event was seen."""
    distinct: dict[UUID, tuple[EventModel, dict, list[str], str]] = {}
    for found in files:
        for event, raw, pointer in found.events:
            place = f"{found.info.path}#{pointer}"
            if event.id in distinct:
                distinct[event.id][2].append(place)
            else:
                distinct[event.id] = (event, raw, [place], found.info.path)
    ordered = sorted(distinct.values(), key=lambda e: e[0].id.hex, reverse=True)
    ordered.sort(key=lambda e: _utc(e[0].recorded_at))
    rows = []
    for event, raw, places, first_file in ordered:
        for target in event.targets:
            entity_type = _enum(target.type)
            if entity_type not in ("run", "job") or target.id is None:
                continue
            entity_id = str(target.id)
            rows.append(
                {
                    "server": server,
                    "source": first_file,
                    "seq": len(rows),
                    "time": _utc(event.recorded_at),
                    "time_text": raw.get("recorded_at"),
                    "time_basis": "db_utc",
                    "origin": "events_table",
                    "entity_type": entity_type,
                    "entity_id": entity_id,
                    "entity_name": target.name,
                    "run_id": entity_id if entity_type == "run" else job_runs.get(entity_id),
                    "actor": _actor(event.actor_user, event.actor_user_id),
                    "message": event.message,
                    "provenance": places,
                    "_project": target.project_name,
                }
            )
    return rows
