"""The canonical model: every source maps into these frames, declared once here.

Normalised values: ids are lowercase dashed UUIDs (or the 6-hex prefix a log shows), times are
UTC, enum values are dstack's lowercase *values* (``terminated_by_server``), never NAMEs.
Every row keeps where it came from in ``provenance`` (``table:primary key`` or ``file:line``).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

import polars as pl

from analyzer.vocabulary import (
    DEPLOYMENT_BASES,
    ENTITY_TYPES,
    EVENT_KINDS,
    EVENT_ORIGINS,
    TIME_BASES,
)

UTC_TIME = pl.Datetime("us", "UTC")
_EPOCH = datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))  # the tz polars gives a UTC_TIME value

ENGINE = "in-memory"
"""The polars engine a lazy query of the mapping or the pipeline is collected on, whatever the
input's size: the one a frame's own (eager) ops run on. Polars' own choice (`auto`, the
streaming one on inputs of 4 MB or more) costs more on these joins that keep the left order:
at 16k runs the jobs' mapping took 0.45 s of CPU against 0.35 s, and on a 2k-run log
timeline.deployments and _creation_deployments about 1.5 times their eager ops' cost."""


def utc_times(values: Iterable[datetime | None]) -> pl.Series:
    """Aware datetimes (or None) as a UTC_TIME column, from their microseconds since the
    epoch: polars turns each datetime object into its value six times slower."""
    return pl.Series(
        [None if v is None else (v - _EPOCH) // timedelta(microseconds=1) for v in values],
        dtype=pl.Int64,
    ).cast(UTC_TIME)


def python_values(column: pl.Series) -> list[Any]:
    """The column's values as Python objects (`to_list`); a UTC_TIME's from its microseconds
    (polars calls a Python function per time, to turn UTC into UTC: twice as slow), the same
    datetimes."""
    if column.dtype != UTC_TIME:
        return column.to_list()
    return [
        None if us is None else _EPOCH + timedelta(microseconds=us)
        for us in column.to_physical().to_list()
    ]


# A rich log writes `[%X]`, a time of day without a date (dstack-data.md 9.2); the log reader
# stores it on the 1970-01-01 pseudo date (sources/logs/messages.py), older than any dstack record.
PSEUDO_DATE_LIMIT = datetime(1971, 1, 1, tzinfo=UTC)

RUNS_SCHEMA: dict[str, pl.DataType] = {
    "server": pl.String(),
    "run_id": pl.String(),
    "project": pl.String(),
    "run_name": pl.String(),
    "run_type": pl.String(),  # service | task | dev-environment | None when unknown
    "status": pl.String(),
    "termination_reason": pl.String(),
    "deployment_num": pl.Int64(),
    "submitted_at": UTC_TIME,
    "last_processed_at": UTC_TIME,
    "deleted": pl.Boolean(),
    "user": pl.String(),
    "fleet_id": pl.String(),  # runs.fleet_id: the fleet the run is placed in (NULL while pending)
    "desired_replica_count": pl.Int64(),
    # The run spec's parts that decide how many replicas a service wants and where one can go,
    # as JSON text: {"replicas", "groups", "priority", "resources", "retry", "fleets",
    # "creation_policy"}.
    "placement_spec": pl.String(),
    "provenance": pl.String(),
}

JOBS_SCHEMA: dict[str, pl.DataType] = {
    "server": pl.String(),
    "run_id": pl.String(),
    "job_id": pl.String(),
    "job_name": pl.String(),
    "replica_num": pl.Int64(),
    "job_num": pl.Int64(),
    "submission_num": pl.Int64(),
    "deployment_num": pl.Int64(),
    "status": pl.String(),
    "termination_reason": pl.String(),
    "termination_reason_message": pl.String(),
    "exit_status": pl.Int64(),
    "submitted_at": UTC_TIME,
    "last_processed_at": UTC_TIME,
    "has_provisioning_data": pl.Boolean(),
    "price": pl.Float64(),  # $/hour of the instance the job ran on (job_provisioning_data)
    "instance_id": pl.String(),  # jobs.used_instance_id: kept after the job released it
    "instance_name": pl.String(),
    "blocks": pl.Int64(),  # instance blocks the job holds (job_runtime_data.offer.blocks)
    "fleet_id": pl.String(),
    "fleet_name": pl.String(),
    "replica_group": pl.String(),
    "ready": pl.Boolean(),  # jobs.ready (0.21.1+); null when the source has no such column
    "graceful_termination_attempts": pl.Int64(),
    "remove_at": UTC_TIME,
    "running_at": UTC_TIME,
    "probe_count": pl.Int64(),  # probes declared in job_spec_data
    "probe_rows": pl.Int64(),  # probes rows found (null: the source has no probes table)
    "probes_below_ready_after": pl.Int64(),
    "min_probe_streak": pl.Int64(),
    "probe_ready_after": pl.Int64(),  # the highest ready_after of its probes (null: unknown)
    "spec_fingerprint": pl.String(),  # hash of the JobSpec fields a rolling deployment changes
    # job_spec_data.requirements.resources as JSON text: the resources of the spec the job runs,
    # which is its deployment's (the run spec holds only the final one)
    "resources": pl.String(),
    "deployment_basis": pl.String(),  # see DEPLOYMENT_BASES
    "provenance": pl.String(),
}

# One row per fleet (reference 3.6): the spec as last recorded (an edit of `nodes` is not dated).
FLEETS_SCHEMA: dict[str, pl.DataType] = {
    "server": pl.String(),
    "fleet_id": pl.String(),
    "project": pl.String(),
    "fleet_name": pl.String(),
    "status": pl.String(),
    "created_at": UTC_TIME,
    "deleted_at": UTC_TIME,  # null while the fleet is not deleted
    "nodes_min": pl.Int64(),
    "nodes_max": pl.Int64(),  # null: no maximum
    "ssh": pl.Boolean(),  # an SSH fleet: its hosts are all it has, it never provisions
    "placement": pl.String(),
    "provenance": pl.String(),
}

# One row per instance (reference 3.5); resources are the instance's whole offer.
INSTANCES_SCHEMA: dict[str, pl.DataType] = {
    "server": pl.String(),
    "instance_id": pl.String(),
    "instance_name": pl.String(),
    "fleet_id": pl.String(),
    "project": pl.String(),
    "status": pl.String(),
    "backend": pl.String(),
    "created_at": UTC_TIME,
    "started_at": UTC_TIME,
    "ended_at": UTC_TIME,  # finished_at, else deleted_at, else (when finished) last_processed_at
    "termination_reason": pl.String(),
    "total_blocks": pl.Int64(),
    "cpus": pl.Int64(),
    "memory_mib": pl.Int64(),
    "gpus": pl.Int64(),
    "gpu_name": pl.String(),
    "gpu_memory_mib": pl.Int64(),
    "disk_mib": pl.Int64(),
    "price": pl.Float64(),
    "provenance": pl.String(),
}

# One row per state change or fact about a run or job, from the events table, a log line, or
# (for servers without events) derived from table rows.
EVENTS_SCHEMA: dict[str, pl.DataType] = {
    "server": pl.String(),
    "source": pl.String(),  # the input path the row came from
    "seq": pl.Int64(),  # order inside its source (ties of equal time keep this order)
    "time": UTC_TIME,  # null when only a time of day is known
    "time_text": pl.String(),  # the time as the source wrote it
    "time_basis": pl.String(),  # how `time` was obtained (see TIME_BASES)
    "kind": pl.String(),  # see EVENT_KINDS
    "origin": pl.String(),  # see EVENT_ORIGINS: a status line is no event
    "entity_type": pl.String(),  # see ENTITY_TYPES
    "entity_id": pl.String(),
    "entity_name": pl.String(),
    "run_id": pl.String(),
    "old_status": pl.String(),
    "new_status": pl.String(),
    "termination_reason": pl.String(),
    "termination_message": pl.String(),
    "deployment_num": pl.Int64(),
    "changed_fields": pl.String(),
    "actor": pl.String(),
    "message": pl.String(),
    "probe": pl.String(),  # a probe result's probe, `<job_name>-<probe_num>` (probes.name)
    "provenance": pl.List(pl.String()),
}

# Columns whose values are vocabulary (analyzer/vocabulary.py): `conform` fails on any other
# value, so a source's typo stops the read instead of silently matching nothing downstream.
# The names are unique to the events and jobs frames among the canonical schemas.
VOCABULARY_COLUMNS: dict[str, tuple[str, ...]] = {
    "kind": EVENT_KINDS,
    "time_basis": TIME_BASES,
    "origin": EVENT_ORIGINS,
    "entity_type": ENTITY_TYPES,
    "deployment_basis": DEPLOYMENT_BASES,
}

# Where a secret can sit (docs/threat-model.md): every text column of the evidence's frames is
# decided here, once (tests/test_text_columns.py fails on a column left out). A FREE_TEXT
# column holds what a user or a program wrote (names, messages, specs, a log's path) and is
# masked whole (pipeline/evidence.py). A CLOSED_TEXT column holds text the sources and dstack
# write themselves in a fixed shape: an id dstack generated (`uuid.uuid4()`, or the hex prefix
# a log shows), a time as a clock printed it, a table row's key after the table's name. A
# value of its column's shape is no secret and no secret shape fits it, so it is left as it
# is; any other value in such a column is masked as free text.
ID_TEXT = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{6,32}"
TIME_TEXT = r"[0-9][0-9:., TZ+-]{0,39}"
ROW_KEY_TEXT = rf"(?:runs|jobs|events|fleets|instances):(?:{ID_TEXT})"
CLOSED_TEXT: dict[str, str] = {
    "run_id": ID_TEXT,
    "job_id": ID_TEXT,
    "fleet_id": ID_TEXT,
    "instance_id": ID_TEXT,
    "entity_id": ID_TEXT,
    "time_text": TIME_TEXT,
    "provenance": ROW_KEY_TEXT,
}
FREE_TEXT: frozenset[str] = frozenset(
    {
        "server",
        "source",
        "project",
        "run_name",
        "run_type",
        "status",
        "termination_reason",
        "user",
        "placement_spec",
        "job_name",
        "termination_reason_message",
        "instance_name",
        "fleet_name",
        "replica_group",
        "spec_fingerprint",
        "resources",
        "deployment_basis",
        "placement",
        "backend",
        "gpu_name",
        "time_basis",
        "kind",
        "origin",
        "entity_type",
        "entity_name",
        "old_status",
        "new_status",
        "termination_message",
        "changed_fields",
        "actor",
        "message",
        "probe",
        "file",  # the evidence's unparsed log lines: file, text
        "text",
    }
)

# Log records as the log readers hand them to the message catalogue.
LOG_RECORDS_SCHEMA: dict[str, pl.DataType] = {
    "file": pl.String(),
    "line": pl.Int64(),  # first physical line of the record, 1-based
    "line_count": pl.Int64(),  # physical lines the record spans
    "format": pl.String(),  # rich | standard | json
    "wrapper": pl.String(),  # docker | journald | None
    "local_time": pl.Datetime("ms"),  # naive local time (standard/json); null for rich
    "time_of_day": pl.Time(),  # always set when the record has any time
    "day_offset": pl.Int64(),  # rich: days rolled over since the file's first record
    "wrapper_time": UTC_TIME,  # time written by docker/kubectl/journald, UTC
    "level": pl.String(),
    "logger": pl.String(),
    "message": pl.String(),
}


def empty_frame(schema: dict[str, pl.DataType]) -> pl.DataFrame:
    return pl.DataFrame(schema=schema)


def conform(frame: pl.DataFrame | pl.LazyFrame, schema: dict[str, pl.DataType]) -> pl.LazyFrame:
    """Select exactly the schema's columns, in order, with its types (missing ones as nulls);
    a vocabulary column's value outside its vocabulary fails the collect."""
    present = frame.columns if isinstance(frame, pl.DataFrame) else frame.collect_schema().names()
    if not present:  # a frame without columns has no rows; literals would make one
        return pl.LazyFrame(schema=schema)
    return frame.lazy().select(_conforming(tuple(schema.items()), frozenset(present)))


def conforms(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> bool:
    """Whether `frame` is what `conform` would give already: the schema's columns, in order,
    with its types, none of them a vocabulary column (whose values conform checks). A frame
    every partition of an audit shares (a database's fleets and instances) then stays the
    same frame in each of them."""
    in_order = tuple(frame.schema.items()) == tuple(schema.items())  # a dict's == ignores order
    return in_order and not VOCABULARY_COLUMNS.keys() & schema.keys()


@lru_cache(maxsize=512)
def _conforming(
    schema: tuple[tuple[str, pl.DataType], ...], present: frozenset[str]
) -> tuple[pl.Expr, ...]:
    """The select that conforms a frame with these columns (built once per shape: a stage
    conforms many small frames, and building the expressions cost more than running them)."""
    return tuple(
        _checked(name, (pl.col(name) if name in present else pl.lit(None)).cast(dtype))
        for name, dtype in schema
    )


def _checked(name: str, column: pl.Expr) -> pl.Expr:
    values = VOCABULARY_COLUMNS.get(name)
    if values is None:
        return column.alias(name)
    return column.cast(pl.Enum(values)).cast(pl.String).alias(name)


def normalise_id(expr: pl.Expr) -> pl.Expr:
    """32-hex or dashed UUID text -> lowercase dashed form; other text (a log prefix) kept."""
    return id_from_hex(id_hex(expr))


def id_hex(expr: pl.Expr) -> pl.Expr:
    """An id's text trimmed, lowercased and without dashes: the first half of `normalise_id`."""
    text = expr.cast(pl.String).str.strip_chars().str.to_lowercase()
    return text.str.replace_all("-", "", literal=True)


def id_from_hex(hexed: pl.Expr) -> pl.Expr:
    """The second half of `normalise_id`, of `id_hex`'s text. One expression computes `hexed`
    again at each of its eight uses; over a column `id_hex` wrote (two steps of a lazy
    frame), a large table pays for it once."""
    dashed = pl.concat_str(
        [
            hexed.str.slice(0, 8),
            hexed.str.slice(8, 4),
            hexed.str.slice(12, 4),
            hexed.str.slice(16, 4),
            hexed.str.slice(20, 12),
        ],
        separator="-",
    )
    return (
        pl.when(hexed == "")
        .then(pl.lit(None, pl.String))
        .when(hexed.str.contains(r"^[0-9a-f]{32}$"))
        .then(dashed)
        .otherwise(hexed)
    )


def normalise_enum(expr: pl.Expr) -> pl.Expr:
    """Enum NAME (DB) or value (API) -> the lowercase value with underscores, as in reports."""
    text = expr.cast(pl.String).str.strip_chars()
    return pl.when(text == "").then(pl.lit(None, pl.String)).otherwise(text.str.to_lowercase())


def parse_db_time(expr: pl.Expr) -> pl.Expr:
    """SQLite/PostgreSQL/CSV/API time text (naive UTC, or with Z/+00:00) -> UTC datetime.

    Literal clean-ups and one parse: `%.f` takes 0 to 9 fraction digits, so SQLite's
    `.300000`, PostgreSQL's `.3` and the API's `.123Z` all read the same way."""
    text = (
        expr.cast(pl.String)
        .str.strip_chars()
        .str.replace("T", " ", literal=True)
        .str.strip_suffix("Z")
        .str.strip_suffix("+00:00")
        .str.strip_suffix("+00")
    )
    return text.str.to_datetime(
        "%Y-%m-%d %H:%M:%S%.f", time_unit="us", strict=False
    ).dt.replace_time_zone("UTC")


def own_buffers(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` in buffers of its own. A frame selected, filtered or gathered from a larger
    one shares the larger one's buffers (a polars string or binary column is views into
    them): a few rows kept from each of many large frames keep all of those frames' texts
    alive. (A partition's piece for the merge, 16k runs in 16 partitions: +23 MB of RSS a
    partition; the buckets of 100k runs' events from their targets, read 250k at a time:
    the split's peak 926-961 MB, 858 MB with each batch's own.)"""
    buffer = io.BytesIO()
    frame.write_ipc(buffer)
    buffer.seek(0)
    return pl.read_ipc(buffer)
