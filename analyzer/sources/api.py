"""dstack's REST API and CLI exports -> the canonical model (reference sections 8.3 and 10).

What a user without database access can hand over, recognised by content, never by name:

- a runs list page (`POST /api/runs/list`: a JSON array of Run objects),
- one run (`POST /api/project/<p>/runs/get`, or `dstack run get --json`: one Run object),
- `dstack ps --json` output (`{"project": ..., "runs": [Run, ...]}`, latest submissions only),
- an events list page (`POST /api/events/list`: a JSON array of events with `targets`),
- `dstack event` text output (`[2026-11-02 09:09:12] [run web] Run status changed ...`, the
  client's local time, names but no ids),
- `POST /api/server/get_info` (`{"server_version": ...}`), for the server version.

One file alone is loaded on its own. A folder whose every file is such an export (or a
companion that no other source claims, such as the exporter's manifest) is loaded as one set:
the same run, job or event seen in several files (runs list and runs get; the `all`,
`within_project` and `within_run` event listings; `event.txt` and `event-since.txt`) becomes
one row, job events get their run id from the runs of the set, and `dstack event` lines get
ids from the set's runs JSON (names are resolved, and their times aligned with the JSON's UTC
times when the lines and the JSON agree on an offset). Whatever the loading unit, the rows
use full dashed ids and the same values as the other sources, so the project's combine step
collapses the overlap between sets, files and the database.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import polars as pl
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

import analyzer.catalogue as catalogue
from analyzer.errors import AuditInputError
from analyzer.model import EVENTS_SCHEMA, JOBS_SCHEMA, RUNS_SCHEMA, UTC_TIME, conform
from analyzer.redact import Redactor, json_secret_values
from analyzer.sources.base import (
    InputInfo,
    InputKind,
    Limitation,
    LoadContext,
    SourceData,
    file_facts,
)
from analyzer.sources.dstack_tables import ROLLING_SPEC_PATHS, _attach_orphan_runs

KIND = "api-export"

# What one file holds (its content shape).
RUNS_PAGE = "runs list page"
RUN = "run"
PS_JSON = "dstack ps --json"
EVENTS_PAGE = "events list page"
EVENT_TEXT = "dstack event text"
SERVER_INFO = "server info"
EMPTY_LIST = "empty JSON list"
DAMAGED = "damaged export"
EXPORT_SHAPES = (RUNS_PAGE, RUN, PS_JSON, EVENTS_PAGE, EVENT_TEXT, SERVER_INFO, DAMAGED)
AUDITED_SHAPES = (RUNS_PAGE, RUN, PS_JSON, EVENTS_PAGE, EVENT_TEXT, DAMAGED)
# Which copy of a run or job a set keeps when several files hold it at the same moment.
RUN_SOURCE_RANK = {RUN: 2, RUNS_PAGE: 1, PS_JSON: 0}

SNIFF_BYTES = 64 * 1024
MAX_JSON_BYTES = 512 * 1024 * 1024
MAX_FOLDER_ENTRIES = 5000
RUNS_LIST_SUBMISSIONS_LIMIT = 10  # /api/runs/list job_submissions_limit default and maximum
EVENT_DEFAULT_LINES = 100  # `dstack event` without --since shows the latest 100 events
QUARTER_HOUR = 15 * 60
ALIGN_TOLERANCE_S = 2.0

# Keys as they start a JSON member (not inside an escaped string, as in a JSON log line).
_KEY = r'(?<!\\)"{}"\s*:'
_RUN_MARKERS = (re.compile(_KEY.format("run_spec")), re.compile(_KEY.format("project_name")))
_EVENT_MARKERS = (
    re.compile(_KEY.format("targets") + r"\s*\["),
    re.compile(_KEY.format("recorded_at")),
)
_INFO_MARKER = re.compile(r'^\{\s*"server_version"\s*:')

# `dstack event` (src/dstack/_internal/cli/services/events.py: print_event): local time, the
# actor only for user actions, targets "<type> <name>" joined by ", ", then the message.
TARGET_TYPES = "project|user|fleet|instance|run|job|volume|gateway|gateway-replica|secret|preset"
_TARGET = rf"(?:{TARGET_TYPES}) [^,\]]+"
EVENT_LINE = re.compile(
    r"^\[(?P<time>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] "
    r"(?:\[\N{BUST IN SILHOUETTE}(?P<actor>[^\]]*)\] )?"
    rf"\[(?P<targets>(?:{_TARGET}(?:, {_TARGET})*)?)\] (?P<message>.*)$"
)
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ProbeSpecModel(_Model):
    ready_after: int | None = None


class JobSpecModel(_Model):
    job_name: str
    replica_num: int = 0
    job_num: int = 0
    replica_group: str | None = None
    probes: list[ProbeSpecModel] | None = None


class ProbeModel(_Model):
    success_streak: int | None = None


class SubmissionModel(_Model):
    id: UUID
    submission_num: int = 0
    deployment_num: int = 0  # 0 from servers older than 0.19.14 (reference 10)
    submitted_at: datetime
    last_processed_at: datetime | None = None
    finished_at: datetime | None = None
    status: str
    termination_reason: str | None = None
    termination_reason_message: str | None = None
    exit_status: int | None = None
    job_provisioning_data: dict[str, Any] | None = None
    probes: list[ProbeModel] | None = None  # absent before 0.19.22


class JobModel(_Model):
    job_spec: JobSpecModel
    job_submissions: list[SubmissionModel] = []


class RunSpecModel(_Model):
    run_name: str | None = None
    configuration: dict[str, Any] | None = None


class RunModel(_Model):
    id: UUID
    project_name: str | None = None
    user: str | None = None
    submitted_at: datetime
    last_processed_at: datetime | None = None
    status: str
    termination_reason: str | None = None
    run_spec: RunSpecModel
    jobs: list[JobModel] = []
    deployment_num: int = 0
    deleted: bool | None = None
    service: dict[str, Any] | None = None


class PsModel(_Model):
    project: str | None = None
    runs: list[RunModel]


class TargetModel(_Model):
    type: str
    project_name: str | None = None
    id: UUID | None = None
    name: str | None = None


class EventModel(_Model):
    id: UUID
    message: str
    recorded_at: datetime
    actor_user_id: UUID | None = None
    actor_user: str | None = None
    targets: list[TargetModel]


class ServerInfoModel(_Model):
    server_version: str | None = None


_RUNS = TypeAdapter(list[RunModel])
_EVENTS = TypeAdapter(list[EventModel])


# ---------------------------------------------------------------------------------------------
# Recognition


_shape_cache: dict[tuple[str, int, int], str | None] = {}


def _is_run(item: Any) -> bool:
    return isinstance(item, dict) and {"id", "run_spec", "status"} <= item.keys()


def _is_event(item: Any) -> bool:
    return isinstance(item, dict) and {"id", "message", "recorded_at", "targets"} <= item.keys()


def shape_of(doc: Any) -> str | None:
    """The export a parsed JSON document is, or None."""
    if isinstance(doc, list):
        if not doc:
            return EMPTY_LIST
        if all(_is_event(item) for item in doc):
            return EVENTS_PAGE
        if all(_is_run(item) for item in doc):
            return RUNS_PAGE
        return None
    if isinstance(doc, dict):
        if _is_run(doc):
            return RUN
        runs = doc.get("runs")
        if "project" in doc and isinstance(runs, list) and all(_is_run(r) for r in runs):
            return PS_JSON
        if (
            isinstance(doc.get("server_version"), str)
            and len(doc) <= 8
            and all(not isinstance(v, dict | list) for v in doc.values())
        ):
            return SERVER_INFO
    return None


def _text_shape(head: bytes) -> str | None:
    text = _ANSI.sub("", head.decode("utf-8", "replace"))
    lines = [line.rstrip() for line in text.splitlines()[:-1] or text.splitlines()]
    lines = [line for line in lines if line.strip()][:20]
    if not lines or not EVENT_LINE.match(lines[0]):
        return None
    matched = sum(1 for line in lines if EVENT_LINE.match(line))
    return EVENT_TEXT if matched >= 0.8 * len(lines) else None


def classify(path: Path) -> str | None:
    """What export a file is (by content), DAMAGED for an export that does not parse, or None."""
    try:
        stat = path.stat()
    except OSError:
        return None
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _shape_cache:
        if len(_shape_cache) > 4096:
            _shape_cache.clear()
        _shape_cache[key] = _classify(path, stat.st_size)
    return _shape_cache[key]


def _classify(path: Path, size: int) -> str | None:
    try:
        with path.open("rb") as handle:
            head = handle.read(SNIFF_BYTES)
    except OSError:
        return None
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if start not in (b"[", b"{") or _text_shape(head):  # event lines start with "[" too
        return _text_shape(head)
    text_head = head.decode("utf-8", "replace")
    looks_like_export = (
        (start == b"[" and all(m.search(text_head) for m in _EVENT_MARKERS))
        or all(m.search(text_head) for m in _RUN_MARKERS)
        or bool(_INFO_MARKER.match(text_head.lstrip("\ufeff \t\r\n")))
    )
    if size > MAX_JSON_BYTES:
        return DAMAGED if looks_like_export else None
    if _json_lines(head):
        return None  # one JSON value per line (a json-format log): never an API export
    try:
        doc = json.loads(path.read_bytes())
    except (ValueError, OSError, RecursionError):
        return DAMAGED if looks_like_export else None
    return shape_of(doc)


def _json_lines(head: bytes) -> bool:
    """The first line is a complete JSON value and more follows: JSON Lines, not a document."""
    first, newline, rest = head.partition(b"\n")
    if not newline or not rest.strip():
        return False
    try:
        json.loads(first)
    except (ValueError, RecursionError):
        return False
    return True


def _folder_files(folder: Path, elsewhere: Callable[[Path], bool]) -> list[Path] | None:
    """Every non-hidden file below `folder`, or None when another source recognises something
    inside (`elsewhere`, the registry's other sniffers), or a linked folder is inside (then the
    registry meets the folder's entries one by one instead, as it does for any folder)."""
    files: list[Path] = []
    seen = 0
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(root)
        for entry in [here / d for d in dirs] + [here / n for n in sorted(names)]:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                return None
            if entry.name.startswith("."):
                continue
            if entry.is_dir() and entry.is_symlink():
                return None  # os.walk does not follow it: let the registry decide
            if entry.is_file() and classify(entry) in EXPORT_SHAPES:
                files.append(entry)
                continue
            if elsewhere(entry):
                return None
            if entry.is_file():
                files.append(entry)
    return files


def _sniff(path: Path, elsewhere: Callable[[Path], bool]) -> bool:
    if path.is_file():
        return classify(path) in EXPORT_SHAPES
    if path.is_dir():
        files = _folder_files(path, elsewhere)
        return files is not None and any(classify(f) in AUDITED_SHAPES for f in files)
    return False


def source(elsewhere: Callable[[Path], bool]) -> InputKind:
    """The API export source; `elsewhere` says whether another source recognises a path (a
    folder holding one is left to the registry, entry by entry)."""

    def load(given: str, ctx: LoadContext) -> SourceData:
        path = Path(given)
        if path.is_dir():
            files = _folder_files(path, elsewhere) or []
            return _load_set(files, ctx.server, given, tolerant=True)
        return _load_set([path], ctx.server, given, tolerant=False)

    return InputKind(kind=KIND, load=load, sniff=lambda path: _sniff(path, elsewhere))


def load_folder(folder: Path, server: str) -> SourceData:
    """Every file of a folder known to be API pages (a collection): none is left to another
    source."""
    files = _folder_files(folder, lambda path: False) or []
    return _load_set(files, server, str(folder), tolerant=True)


# ---------------------------------------------------------------------------------------------
# Reading one file


@dataclass
class _File:
    path: Path
    shape: str | None
    info: InputInfo
    runs: list[tuple[RunModel, dict, str]] = field(default_factory=list)  # model, raw, pointer
    events: list[tuple[EventModel, dict, str]] = field(default_factory=list)
    lines: list[tuple[int, re.Match[str]]] = field(default_factory=list)  # line number, parts
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


def _read_file(path: Path) -> _File:
    """Parse one export; AuditInputError (naming the file) when it is damaged."""
    shape = classify(path)
    info = file_facts(path, KIND if shape is None else f"{KIND} ({shape})")
    found = _File(path=path, shape=shape, info=info)
    if shape == EVENT_TEXT:
        raw = path.read_bytes().decode("utf-8", "replace")
        for number, line in enumerate(raw.splitlines(), start=1):
            line = _ANSI.sub("", line).rstrip()
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
            models = _RUNS.validate_python(doc)
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
            models = _EVENTS.validate_python(doc)
            found.events = [
                (m, r, f"/{i}") for i, (m, r) in enumerate(zip(models, doc, strict=True))
            ]
        elif actual == SERVER_INFO:
            found.server_version = ServerInfoModel.model_validate(doc).server_version
            info.server_version = found.server_version
    except ValidationError as error:
        raise _invalid(path, actual, error) from None
    info.records = len(found.runs) or len(found.events)
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


def _run_row(run: RunModel, server: str, provenance: str) -> dict[str, Any]:
    configuration = run.run_spec.configuration or {}
    run_type = configuration.get("type") if isinstance(configuration.get("type"), str) else None
    if run_type is None and run.service:
        run_type = "service"
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
        "provenance": provenance,
    }


def _job_rows(
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
            price = (sub.job_provisioning_data or {}).get("price")
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
                "deployment_basis": "table",
                "provenance": f"{label}#{pointer}/jobs/{j}/job_submissions/{s}",
            }
            rows.append((row, spec_text if sub.submission_num == latest else None))
    return rows


def _fingerprints(specs: list[str | None]) -> list[str | None]:
    """The same hash of the rolling JobSpec fields as dstack_tables computes from job_spec_data."""
    spec = pl.col("spec")
    return (
        pl.DataFrame({"spec": specs}, schema={"spec": pl.String})
        .select(
            pl.when(spec.is_not_null())
            .then(
                pl.concat_str(
                    [spec.str.json_path_match(path).fill_null("") for path in ROLLING_SPEC_PATHS],
                    separator="\x1f",
                )
                .hash()
                .cast(pl.String)
            )
            .alias("fingerprint")
        )["fingerprint"]
        .to_list()
    )


def _secrets(raws: list[dict]) -> set[str]:
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
class _Kept:
    row: dict[str, Any]
    rank: tuple[Any, ...]
    provenance: list[str]
    spec: str | None = None
    shapes: set[str] = field(default_factory=set)


def _keep(store: dict[str, _Kept], key: str, row: dict, rank: tuple, shape: str, spec=None):
    """One copy per id: the newest state (last_processed_at), then the fullest export."""
    kept = store.get(key)
    if kept is None:
        store[key] = _Kept(row, rank, [row["provenance"]], spec, {shape})
        return
    kept.provenance.append(row["provenance"])
    kept.shapes.add(shape)
    if rank > kept.rank:
        kept.row, kept.rank = row, rank
        kept.spec = spec if spec is not None else kept.spec
    elif kept.spec is None:
        kept.spec = spec


def _rank(row: dict, shape: str) -> tuple[Any, ...]:
    return (row["last_processed_at"] or datetime.min, RUN_SOURCE_RANK.get(shape, 0))


def _frame(rows: list[dict], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    naive = {
        name: (pl.Datetime("us") if dtype == UTC_TIME else dtype) for name, dtype in schema.items()
    }
    columns = {name: [row.get(name) for row in rows] for name in schema}
    frame = pl.DataFrame(columns, schema=naive)
    return frame.with_columns(
        pl.col(name).dt.replace_time_zone("UTC") for name, dt in schema.items() if dt == UTC_TIME
    )


# ---------------------------------------------------------------------------------------------
# Events (API JSON and `dstack event` text)


def _actor(user: str | None, user_id: UUID | None) -> str:
    if user is None and user_id is None:
        return "system"
    return f"user {user or user_id}"


def _json_event_rows(
    files: list[_File], server: str, job_runs: dict[str, str]
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


def _merge_text(files: list[_File]) -> list[_TextEvent]:
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
    votes: Counter = Counter()
    paired = 0
    for key, lines in by_key.items():
        moments = anchors.get(key, [])
        if len(lines) != 1 or len(moments) != 1:
            continue
        paired += 1
        diff = (moments[0] - lines[0].local).total_seconds()
        shift = round(diff / QUARTER_HOUR) * QUARTER_HOUR
        if -ALIGN_TOLERANCE_S <= diff - shift <= ALIGN_TOLERANCE_S + 1:  # text drops fractions
            votes[shift] += 1
    if not votes:
        return None, paired, 0
    shift, agree = votes.most_common(1)[0]
    return shift, paired, agree


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


# ---------------------------------------------------------------------------------------------
# Loading a set of files


def _load_set(paths: list[Path], server: str, label: str, *, tolerant: bool) -> SourceData:
    data = SourceData()
    files: list[_File] = []
    for path in paths:
        shape = classify(path)
        if shape is None or shape == EMPTY_LIST:
            info = file_facts(path, "unrecognised" if shape is None else f"{KIND} ({shape})")
            info.notes.append(
                "an empty JSON list (an empty runs or events page): nothing to audit"
                if shape == EMPTY_LIST
                else "not a dstack runs/events export, database, table export or server log "
                "(e.g. the exporter's manifest or the projects list); not audited"
            )
            data.inputs.append(info)
            continue
        try:
            found = _read_file(path)
        except AuditInputError as error:
            if not tolerant:
                raise
            info = file_facts(path, f"{KIND} (unreadable)")
            info.notes.append(f"{error.problem}; not audited")
            data.inputs.append(info)
            data.limitations.append(
                Limitation(
                    "unreadable_export",
                    f"{error.problem}: the audit went on without this file; runs or events "
                    "only it held are missing (re-export it)",
                    str(path),
                )
            )
            continue
        files.append(found)
        data.inputs.append(found.info)

    runs: dict[str, _Kept] = {}
    jobs: dict[str, _Kept] = {}
    raws: list[dict] = []
    for found in files:
        version = found.server_version
        if version:
            data.server_version = version
        for run, raw, pointer in found.runs:
            raws.append(raw)
            row = _run_row(run, server, f"{found.info.path}#{pointer}")
            _keep(runs, row["run_id"], row, _rank(row, found.shape), found.shape)
            for job_row, spec in _job_rows(run, raw, server, found.info.path, pointer):
                rank = _rank(job_row, found.shape)
                _keep(jobs, job_row["job_id"], job_row, rank, found.shape, spec)
    data.secrets = _secrets(raws)

    job_list = [
        k.row | {"provenance": "; ".join(dict.fromkeys(k.provenance))} for k in jobs.values()
    ]
    for row, fingerprint in zip(
        job_list, _fingerprints([k.spec for k in jobs.values()]), strict=True
    ):
        row["spec_fingerprint"] = fingerprint
    run_list = [
        k.row | {"provenance": "; ".join(dict.fromkeys(k.provenance))} for k in runs.values()
    ]
    data.runs = _frame(run_list, RUNS_SCHEMA)
    data.jobs = _frame(job_list, JOBS_SCHEMA)

    job_runs = {row["job_id"]: row["run_id"] for row in job_list}
    json_rows = _json_event_rows(files, server, job_runs)
    text_files = [f for f in files if f.shape == EVENT_TEXT]
    text_rows = _text_event_rows(text_files, server, run_list, job_list, json_rows, data, label)
    data.events = _events_frame(json_rows + text_rows, run_list)
    _limitations(data, files, runs, jobs, json_rows, text_files, label)
    return data


def _text_event_rows(
    text_files: list[_File],
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


EVENT_ROW_SCHEMA = {
    name: EVENTS_SCHEMA[name]
    for name in (
        "server",
        "source",
        "seq",
        "time",
        "time_text",
        "time_basis",
        "origin",
        "entity_type",
        "entity_id",
        "entity_name",
        "run_id",
        "actor",
        "message",
        "provenance",
    )
}


def _events_frame(rows: list[dict[str, Any]], runs: list[dict]) -> pl.DataFrame:
    if not rows:
        return pl.DataFrame(schema=EVENTS_SCHEMA)
    for seq, row in enumerate(rows):
        row["seq"] = seq
    frame = _frame(rows, EVENT_ROW_SCHEMA)
    parsed = catalogue.parse_event_messages(frame.lazy()).collect()
    attached = _attach_orphan_runs(parsed, _frame(runs, RUNS_SCHEMA))
    return conform(attached, EVENTS_SCHEMA).collect().sort(["time", "seq"])


def _limitations(
    data: SourceData,
    files: list[_File],
    runs: dict[str, _Kept],
    jobs: dict[str, _Kept],
    json_rows: list[dict],
    text_files: list[_File],
    label: str,
) -> None:
    run_files = [f for f in files if f.runs]
    if run_files:
        data.limitations.append(
            Limitation(
                "api_fields_not_exposed",
                "the runs API (and `dstack ps --json`, `dstack run get --json`) does not expose "
                "the job fields ready, registered, graceful_termination_attempts, remove_at, "
                "running_at, nor instance or fleet ids: a replica's health is proven instead "
                "from its probe streaks (probes[].success_streak against the spec's ready_after, "
                "default 1) or from the event 'Service replica ready to receive requests'; "
                "without probes and without events a healthy replica cannot be told from one "
                "that never served",
                label,
            )
        )
        data.limitations.append(
            Limitation(
                "api_deployment_is_current",
                "a job submission's deployment_num in the API is its current one: in-place "
                "bumps (e.g. an update of replicas only) are visible only through it, and the "
                "deployment a replica was created in comes only from the events ('Run updated. "
                "Deployment: N' before its 'Job created' event); only the latest submission's "
                "job_spec is exported per job, so earlier deployments' specs cannot be compared",
                label,
            )
        )
    if run_files and not json_rows and not text_files:
        data.limitations.append(
            Limitation(
                "api_runs_without_events",
                "the order culprit failure -> run TERMINATING -> victim stopped is recorded only "
                "in the events (events API, or `dstack event --since ...`) and this export holds "
                "none: unless events of the same runs are audited with it, victims are judged "
                "from final states, probe streaks and last_processed_at only",
                label,
            )
        )
    ps_only = [k for k in runs.values() if k.shapes == {PS_JSON}]
    if ps_only:
        ids = {k.row["run_id"] for k in ps_only}
        hidden = sum(
            1
            for k in jobs.values()
            if k.row["run_id"] in ids and (k.row["submission_num"] or 0) > 0
        )
        data.limitations.append(
            Limitation(
                "ps_json_latest_submission_only",
                "`dstack ps --json` lists only the latest submission of each job: older "
                "submissions of a re-used replica slot (replicas of earlier deployments, retried "
                "or re-run submissions) are missing, so a victim or culprit among them cannot be "
                f"seen ({len(ps_only)} run(s) known only from it"
                + (
                    f"; {hidden} job(s) there have earlier submissions not exported"
                    if hidden
                    else ""
                )
                + "); export `dstack run get --json` or the runs API for every submission",
                label,
            )
        )
    slots: Counter = Counter(
        (k.row["run_id"], k.row["replica_num"], k.row["job_num"]) for k in jobs.values()
    )
    capped = {
        run_id
        for (run_id, _, _), count in slots.items()
        if count >= RUNS_LIST_SUBMISSIONS_LIMIT
        and run_id in runs
        and runs[run_id].shapes == {RUNS_PAGE}
    }
    if capped:
        data.limitations.append(
            Limitation(
                "runs_list_submissions_capped",
                f"{len(capped)} run(s) known only from the runs list have a job with "
                f"{RUNS_LIST_SUBMISSIONS_LIMIT} submissions there; the list returns at most the "
                "latest 10 per job, so earlier ones may be missing (the runs get call returns all)",
                label,
            )
        )
