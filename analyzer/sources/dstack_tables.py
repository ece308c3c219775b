"""dstack's tables (from any backend) -> the canonical model.

Every backend (SQLite file, CSV/Parquet exports, later PostgreSQL) hands over the raw tables as
all-text columns; this module is the one place that knows dstack's schema and its encodings
(reference sections 2-4), so a database and its exports give the same canonical rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Protocol

import polars as pl

from analyzer.dstack import (
    ALEMBIC_RELEASES,
    ENDED_INSTANCE_STATUSES,
    ROLLING_JOB_SPEC_PATHS,
    spec_fingerprint,
)
from analyzer.errors import AuditInputError
from analyzer.model import (
    ENGINE,
    UTC_TIME,
    id_from_hex,
    id_hex,
    normalise_enum,
    normalise_id,
)
from analyzer.redact import Redactor, json_secret_values
from analyzer.sources import cells
from analyzer.sources.base import Limitation, SourceData
from analyzer.sources.cells import integer
from analyzer.sources.table_events import map_events

# Times at which the server was seen processing something (reference 3.5, 3.6: instances and
# fleets keep being processed minutes after a run ends). Future times (remove_at, due,
# lock_expires_at, termination_deadline) are left out: they say what was planned, not done.
ALIVE_INSTANCE_COLUMNS = [
    "created_at",
    "started_at",
    "finished_at",
    "deleted_at",
    "last_processed_at",
    "last_job_processed_at",
    "last_retry_at",
    "first_termination_retry_at",
    "last_termination_retry_at",
]
ALIVE_FLEET_COLUMNS = ["created_at", "last_processed_at", "deleted_at", "last_consolidated_at"]

# Only the columns the audit needs are read: secrets (tokens, keys, env) are never loaded,
# except job_spec_data, which is reduced to a fingerprint and a few plain fields in polars.
TABLE_COLUMNS: dict[str, list[str]] = {
    "runs": [
        "id",
        "project_id",
        "user_id",
        "submitted_at",
        "run_name",
        "status",
        "run_spec",
        "deleted",
        "last_processed_at",
        "termination_reason",
        "service_spec",
        "deployment_num",
        "fleet_id",
        "desired_replica_count",
    ],
    "jobs": [
        "id",
        "run_id",
        "run_name",
        "job_num",
        "job_name",
        "submission_num",
        "submitted_at",
        "last_processed_at",
        "status",
        "termination_reason",
        "termination_reason_message",
        "job_spec_data",
        "job_provisioning_data",
        "job_runtime_data",
        "remove_at",
        "used_instance_id",
        "replica_num",
        "exit_status",
        "deployment_num",
        "fleet_id",
        "graceful_termination_attempts",
        "ready",
        "running_at",
    ],
    "events": ["id", "message", "recorded_at", "actor_user_id"],
    "event_targets": [
        "id",
        "event_id",
        "entity_type",
        "entity_id",
        "entity_name",
        "entity_run_id",
    ],
    "probes": ["id", "job_id", "probe_num", "success_streak"],
    "instances": [
        "id",
        "name",
        "fleet_id",
        "project_id",
        "status",
        "backend",
        "deleted",
        "termination_reason",
        "total_blocks",
        "offer",
        "job_provisioning_data",
        "price",
        *ALIVE_INSTANCE_COLUMNS,
    ],
    "fleets": ["id", "name", "project_id", "status", "deleted", "spec", *ALIVE_FLEET_COLUMNS],
    "projects": ["id", "name", "original_name", "deleted"],
    "users": ["id", "name", "original_name", "deleted", "token"],
    "alembic_version": ["version_num"],
}
ALIVE_COLUMNS: dict[str, list[str]] = {
    "runs": ["submitted_at", "last_processed_at"],
    "jobs": ["submitted_at", "last_processed_at"],
    "events": ["recorded_at"],
    "instances": ALIVE_INSTANCE_COLUMNS,
    "fleets": ALIVE_FLEET_COLUMNS,
}
REQUIRED_TABLES = ("runs", "jobs")
# Without these, no run's story can be told: their absence means a schema we do not know.
REQUIRED_COLUMNS = {
    "runs": ("id", "run_name", "status", "submitted_at"),
    "jobs": ("id", "run_id", "job_name", "status", "submission_num", "replica_num"),
}

# Profile parameters of a run spec that decide where a replica can go (reference 4.1): the
# configuration's value overrides the profile's.
PLACEMENT_PARAMS = ("resources", "retry", "fleets", "creation_policy")

# The only parts of the big JSON documents the audit reads. A reader that can (`read_slim`)
# returns each document reduced to these paths, so a database with a million job specs
# never has to travel whole into memory.
JSON_PATHS: dict[str, dict[str, tuple[str, ...]]] = {
    "jobs": {
        "job_spec_data": (
            "$.replica_group",
            *ROLLING_JOB_SPEC_PATHS,
            "$.ssh_key.private",
        ),
        "job_provisioning_data": ("$.price",),
        "job_runtime_data": ("$.offer.blocks",),
    },
    "runs": {
        "run_spec": (
            "$.configuration.type",
            "$.configuration.env",
            "$.configuration.registry_auth",
            *(
                f"$.configuration.{name}"
                for name in ("replicas", "groups", "priority", *PLACEMENT_PARAMS)
            ),
            *(f"$.profile.{name}" for name in PLACEMENT_PARAMS),
        ),
    },
    "instances": {
        "offer": ("$.instance.resources",),
        "job_provisioning_data": ("$.instance_type.resources",),
    },
    # Never the SSH hosts or keys: whether the fleet is an SSH one is told by plain fields.
    "fleets": {
        "spec": (
            "$.configuration.nodes",
            "$.configuration.placement",
            "$.configuration.ssh_config.user",
            "$.configuration.ssh_config.port",
            "$.configuration.ssh_config.identity_file",
        ),
    },
}


class TableReader(Protocol):
    """A backend: which tables exist, and a table's columns as text (absent ones are null)."""

    label: str

    def tables(self) -> set[str]: ...

    def columns(self, table: str) -> set[str]: ...

    def read(self, table: str, columns: list[str]) -> pl.DataFrame: ...


def looks_like_dstack(tables: set[str]) -> bool:
    return all(name in tables for name in REQUIRED_TABLES)


def _bool(expr: pl.Expr) -> pl.Expr:
    text = expr.cast(pl.String).str.strip_chars().str.to_lowercase()
    return (
        pl.when(text.is_in(["1", "t", "true"]))
        .then(True)
        .when(text.is_in(["0", "f", "false"]))
        .then(False)
        .otherwise(None)
    )


def _finite(expr: pl.Expr) -> pl.Expr:
    """A number, or null (never NaN or infinity, which no price or total can carry)."""
    number = expr.cast(pl.String).str.strip_chars().cast(pl.Float64, strict=False)
    return pl.when(number.is_finite()).then(number)


# What each table's typed columns hold: a value one cannot hold is damage (analyzer.sources.cells).
TIME_COLUMNS: dict[str, tuple[str, ...]] = {
    "runs": ("submitted_at", "last_processed_at"),
    "jobs": ("submitted_at", "last_processed_at", "remove_at", "running_at"),
    "events": ("recorded_at",),
    "instances": tuple(ALIVE_INSTANCE_COLUMNS),
    "fleets": tuple(ALIVE_FLEET_COLUMNS),
}
INTEGER_COLUMNS: dict[str, tuple[str, ...]] = {
    "runs": ("deployment_num", "desired_replica_count"),
    "jobs": (
        "job_num",
        "submission_num",
        "replica_num",
        "exit_status",
        "deployment_num",
        "graceful_termination_attempts",
    ),
    "probes": ("probe_num", "success_streak"),
    "instances": ("total_blocks",),
}
BOOLEAN_COLUMNS: dict[str, tuple[str, ...]] = {
    table: ("deleted",) for table in ("runs", "instances", "fleets", "projects", "users")
} | {"jobs": ("ready",)}
CELLS: dict[str, cells.Columns] = {
    table: cells.Columns(
        key="id" if "id" in columns else None,
        times=TIME_COLUMNS.get(table, ()),
        integers=INTEGER_COLUMNS.get(table, ()),
        booleans=BOOLEAN_COLUMNS.get(table, ()),
        numbers=("price",) if table == "instances" else (),
        json=tuple(JSON_PATHS.get(table, {})),
    )
    for table, columns in TABLE_COLUMNS.items()
}


def _read(reader: TableReader, table: str, ledger: cells.Ledger) -> pl.DataFrame | None:
    """A table as text the mapping can trust (analyzer.sources.cells): what was damaged in it
    goes to `ledger`."""
    if table not in reader.tables():
        return None
    slim = getattr(reader, "read_slim", None)
    if slim is not None and table in JSON_PATHS:
        frame = slim(table, TABLE_COLUMNS[table], JSON_PATHS[table])
    else:
        frame = reader.read(table, TABLE_COLUMNS[table])
    return cells.checked_as_read(reader, frame, table, CELLS[table], ledger)


def _timed(frame: pl.DataFrame | None, table: str) -> pl.DataFrame | None:
    """`frame` (a table as `_read` gives it) with its time columns parsed, once: the fleets'
    and instances' are read by two mappings (the tables, and the latest moment alive)."""
    if frame is None:
        return None
    return cells.times(frame, TIME_COLUMNS.get(table, ()))


def _names(frame: pl.DataFrame | None, alias: str) -> pl.DataFrame:
    """id -> display name for projects/users (a deleted one shows its original name)."""
    if frame is None:
        return pl.DataFrame(schema={"id": pl.String, alias: pl.String})
    return frame.select(
        normalise_id(pl.col("id")).alias("id"),
        pl.coalesce(
            pl.when(_bool(pl.col("deleted"))).then(pl.col("original_name")), pl.col("name")
        ).alias(alias),
    )


def _per_distinct(frame: pl.LazyFrame, columns: list[str], *derived: pl.Expr) -> pl.LazyFrame:
    """`frame` with `derived` (expressions of `columns` only) computed once per distinct value
    of `columns` and joined back: a JSON path parses its whole document on every row it runs
    over, and the replicas and resubmissions of a deployment share one spec (and the targets of
    a job's hundreds of events one id)."""
    documents = frame.select(columns).unique().with_columns(derived)
    return frame.join(documents, on=columns, how="left", nulls_equal=True, maintain_order="left")


def _with_ids(frame: pl.LazyFrame, columns: dict[str, str]) -> pl.LazyFrame:
    """`frame` with the id columns `columns` names (output: input) normalised in two steps,
    so that each id's text is cleaned once (see `id_from_hex`)."""
    return frame.with_columns(
        id_hex(pl.col(raw)).alias(out) for out, raw in columns.items()
    ).with_columns(id_from_hex(pl.col(out)).alias(out) for out in columns)


def _with_project(frame: pl.LazyFrame, projects: pl.DataFrame) -> pl.LazyFrame:
    """`frame` with its `project_id` normalised and the project's name beside it."""
    return _with_ids(frame, {"project_id": "project_id"}).join(
        projects.lazy(), left_on="project_id", right_on="id", how="left", maintain_order="left"
    )


def load_tables(reader: TableReader, server: str) -> SourceData:
    """Map one dstack database (any backend) into canonical runs, jobs and events."""
    data = SourceData(has_tables=True)
    ledger = cells.Ledger()
    label = reader.label
    present = reader.tables()
    for table, required in REQUIRED_COLUMNS.items():
        missing = [c for c in required if c not in reader.columns(table)]
        if missing:
            raise AuditInputError(
                label,
                f"unknown database schema: table {table} lacks {', '.join(missing)}",
                "is this a dstack server database (0.19.14 or later)?",
            )

    version = None
    alembic = _read(reader, "alembic_version", ledger)
    if alembic is not None and alembic.height:
        head = alembic["version_num"][0]
        version = ALEMBIC_RELEASES.get(head, f"unknown (alembic {head})")
        if head not in ALEMBIC_RELEASES:
            data.limitations.append(
                Limitation(
                    "unknown_schema_release",
                    f"the database's alembic head {head} is no release this tool knows (newest "
                    "known: 0.22.5): its tables are read by their columns, and a rule that depends "
                    "on the release (e.g. whether #4186 applies) cannot be judged",
                    label,
                )
            )

    projects = learn_projects(reader, ledger)
    raw_users = _read(reader, "users", ledger)
    users = _names(raw_users, "user")

    raw_runs = _timed(_read(reader, "runs", ledger), "runs")
    raw_jobs = _timed(_read(reader, "jobs", ledger), "jobs")
    assert raw_runs is not None and raw_jobs is not None
    data.secrets = _secrets(raw_runs, raw_jobs, raw_users)  # each table read once
    runs = (
        _per_distinct(
            raw_runs.lazy(),
            ["run_spec"],
            pl.col("run_spec").str.json_path_match("$.configuration.type").alias("_config_type"),
            _placement_spec(pl.col("run_spec")).alias("placement_spec"),
        )
        .pipe(_with_ids, {"run_id": "id", "user_id": "user_id"})
        .pipe(_with_project, projects)
        .join(users.lazy(), left_on="user_id", right_on="id", how="left", maintain_order="left")
        .select(
            pl.lit(server).alias("server"),
            "run_id",
            pl.col("project"),
            pl.col("run_name"),
            pl.coalesce(
                pl.col("_config_type"),
                pl.when(pl.col("service_spec").fill_null("") != "").then(pl.lit("service")),
            ).alias("run_type"),
            normalise_enum(pl.col("status")).alias("status"),
            normalise_enum(pl.col("termination_reason")).alias("termination_reason"),
            integer(pl.col("deployment_num")).alias("deployment_num"),
            "submitted_at",
            "last_processed_at",
            _bool(pl.col("deleted")).alias("deleted"),
            pl.col("user"),
            normalise_id(pl.col("fleet_id")).alias("fleet_id"),
            integer(pl.col("desired_replica_count")).alias("desired_replica_count"),
            "placement_spec",
            pl.concat_str([pl.lit("runs:"), pl.col("id")]).alias("provenance"),
        )
        .collect(engine=ENGINE)
    )
    data.runs = cells.owned(_named(runs, raw_jobs))
    del raw_runs, raw_users  # read once, mapped: the raw rows are not held while events load
    fleet_tables = learn_fleet_tables(reader, projects)
    fleet_tables.add_to(ledger, reader)
    data.fleets, data.instances = fleet_tables.labelled(server)
    data.has_fleet_tables = {"fleets", "instances"} <= present

    data.jobs = cells.owned(_jobs(reader, ledger, raw_jobs, fleet_tables, server, runs))
    del raw_jobs
    data.events, events_latest = _events(reader, ledger, server, label, data.jobs, runs, users)

    missing_columns = [
        f"{table}.{column}"
        for table in ("runs", "jobs")
        for column in ("deployment_num",) + (("ready",) if table == "jobs" else ())
        if column not in reader.columns(table)
    ]
    if "events" not in present:
        data.limitations.append(
            Limitation(
                "no_events_table",
                "the database has no events table (dstack < 0.20.0): the order of the culprit's "
                "failure, the run's termination and each victim's stop comes from table times only",
                label,
            )
        )
    if "probes" not in present:
        data.limitations.append(
            Limitation(
                "no_probes_table",
                "no probes table (dstack < 0.19.22): health is proven from RUNNING markers only",
                label,
            )
        )
    if missing_columns:
        data.limitations.append(
            Limitation(
                "missing_columns",
                "columns absent in this database (older dstack): " + ", ".join(missing_columns),
                label,
            )
        )
    ledger.record(data)
    data.server_version = version
    data.events_table_of = {server} if "events" in present else set()
    latest = _latest_alive(data, fleet_tables.alive, events_latest)
    if latest is not None:
        data.latest_time = {server: latest}
    return data


UNKNOWN_NAME = "(unknown)"  # a name no row holds any more (damaged): said in damaged_values


def _named(runs: pl.DataFrame, raw_jobs: pl.DataFrame) -> pl.DataFrame:
    """Runs whose name is damaged take it from their jobs' `run_name` (dstack writes the run's
    name there: services/runs/__init__.py create_job_model_for_new_submission), else
    UNKNOWN_NAME."""
    if runs["run_name"].null_count() == 0:
        return runs
    names = (
        raw_jobs.select(
            normalise_id(pl.col("run_id")).alias("run_id"), pl.col("run_name").alias("_name")
        )
        .drop_nulls()
        .unique("run_id", keep="first", maintain_order=True)
    )
    return (
        runs.join(names, on="run_id", how="left", maintain_order="left")
        .with_columns(pl.coalesce("run_name", "_name", pl.lit(UNKNOWN_NAME)).alias("run_name"))
        .drop("_name")
    )


def _placement_spec(spec: pl.Expr) -> pl.Expr:
    """The placement parts of a run spec as one small JSON text (configuration over profile)."""

    def part(name: str, value: pl.Expr) -> pl.Expr:
        return pl.concat_str([pl.lit(f'"{name}":'), value.fill_null("null")])

    groups = spec.str.json_path_match("$.configuration.groups").map_elements(
        _slim_groups, return_dtype=pl.String, skip_nulls=True
    )
    parts = [
        part("replicas", spec.str.json_path_match("$.configuration.replicas")),
        part("groups", groups),
        part("priority", spec.str.json_path_match("$.configuration.priority")),
    ] + [
        part(
            name,
            pl.coalesce(
                spec.str.json_path_match(f"$.configuration.{name}"),
                spec.str.json_path_match(f"$.profile.{name}"),
            ).pipe(lambda value, name=name: _quoted(value) if name in BARE_STRINGS else value),
        )
        for name in PLACEMENT_PARAMS
    ]
    text = pl.concat_str([pl.lit("{"), pl.concat_str(parts, separator=","), pl.lit("}")])
    return pl.when(spec.is_null()).then(pl.lit(None, pl.String)).otherwise(text)


# Placement parameters whose value is a string: json_path_match gives it without its quotes.
BARE_STRINGS = ("creation_policy",)


def _quoted(value: pl.Expr) -> pl.Expr:
    """A JSON string again (dstack's enum values hold no quote or backslash)."""
    return pl.concat_str([pl.lit('"'), value, pl.lit('"')])


def _slim_groups(text: str) -> str | None:
    """Replica groups (0.20.7+) reduced to what placement needs: name, replicas, resources
    (a group also holds commands and an image, which the canonical model never carries).
    Called only for the runs that have groups."""
    try:
        groups = json.loads(text)
    except ValueError:
        return None
    if not isinstance(groups, list):
        return None
    kept = [
        {key: group.get(key) for key in ("name", "replicas", "resources")}
        for group in groups
        if isinstance(group, dict)
    ]
    return json.dumps(kept)


def _fleets(
    raw: dict[str, pl.DataFrame | None], server: str, projects: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Fleets (nodes range from the spec) and instances (times, blocks, offer resources), from
    the `raw` rows of both tables, their times parsed (`_timed`; None: no such table)."""
    fleets, instances = raw["fleets"], raw["instances"]
    fleet_frame = pl.DataFrame()
    instance_frame = pl.DataFrame()
    if fleets is not None:
        spec = pl.col("spec")
        nodes = spec.str.json_path_match("$.configuration.nodes")
        fixed = integer(nodes)  # `nodes: 2` stored as a number
        ssh_fields = [
            spec.str.json_path_match(f"$.configuration.ssh_config.{name}").is_not_null()
            for name in ("user", "port", "identity_file")
        ]
        fleet_frame = (
            fleets.lazy()
            .pipe(_with_project, projects)
            .select(
                pl.lit(server).alias("server"),
                normalise_id(pl.col("id")).alias("fleet_id"),
                "project",
                pl.col("name").alias("fleet_name"),
                normalise_enum(pl.col("status")).alias("status"),
                "created_at",
                pl.when(_bool(pl.col("deleted")))
                .then(
                    pl.coalesce(
                        pl.col("deleted_at"),
                        pl.col("last_processed_at"),
                    )
                )
                .alias("deleted_at"),
                pl.coalesce(fixed, integer(nodes.str.json_path_match("$.min"))).alias("nodes_min"),
                pl.coalesce(fixed, integer(nodes.str.json_path_match("$.max"))).alias("nodes_max"),
                pl.any_horizontal(ssh_fields).alias("ssh"),
                spec.str.json_path_match("$.configuration.placement").alias("placement"),
                pl.concat_str([pl.lit("fleets:"), pl.col("id")]).alias("provenance"),
            )
            .collect(engine=ENGINE)
        )
    if instances is not None:
        resources = pl.coalesce(
            pl.col("offer").str.json_path_match("$.instance.resources"),
            pl.col("job_provisioning_data").str.json_path_match("$.instance_type.resources"),
        )
        gpus = resources.str.json_path_match("$.gpus").str.json_decode(
            pl.List(pl.Struct({"name": pl.String, "memory_mib": pl.Int64}))
        )
        status = normalise_enum(pl.col("status"))
        finished = status.is_in(ENDED_INSTANCE_STATUSES) | _bool(pl.col("deleted"))
        instance_frame = (
            _per_distinct(
                instances.lazy(),
                ["offer", "job_provisioning_data"],
                integer(resources.str.json_path_match("$.cpus")).alias("cpus"),
                integer(resources.str.json_path_match("$.memory_mib")).alias("memory_mib"),
                gpus.list.len().cast(pl.Int64).alias("gpus"),
                gpus.list.first().struct.field("name").alias("gpu_name"),
                gpus.list.first().struct.field("memory_mib").alias("gpu_memory_mib"),
                integer(resources.str.json_path_match("$.disk.size_mib")).alias("disk_mib"),
            )
            .pipe(_with_project, projects)
            .pipe(_with_ids, {"instance_id": "id", "_fleet_id": "fleet_id"})
            .select(
                pl.lit(server).alias("server"),
                "instance_id",
                pl.col("name").alias("instance_name"),
                pl.col("_fleet_id").alias("fleet_id"),
                "project",
                status.alias("status"),
                normalise_enum(pl.col("backend")).alias("backend"),
                "created_at",
                "started_at",
                pl.coalesce(
                    pl.col("finished_at"),
                    pl.col("deleted_at"),
                    pl.when(finished).then(pl.col("last_processed_at")),
                ).alias("ended_at"),
                normalise_enum(pl.col("termination_reason")).alias("termination_reason"),
                integer(pl.col("total_blocks")).fill_null(1).alias("total_blocks"),
                "cpus",
                "memory_mib",
                "gpus",
                "gpu_name",
                "gpu_memory_mib",
                "disk_mib",
                _finite(pl.col("price")).alias("price"),
                pl.concat_str([pl.lit("instances:"), pl.col("id")]).alias("provenance"),
            )
            .collect(engine=ENGINE)
        )
    return fleet_frame, instance_frame


@dataclass(frozen=True)
class _FleetTables:
    """The fleets and instances tables as the audit uses them. Every partition reads them
    whole, so a reader that shares what it learns of the whole input (SqliteReader.remember)
    reads, checks and maps them once per audit; the damage found in them is said by every
    partition, as when each read them."""

    fleets: pl.DataFrame
    instances: pl.DataFrame
    fleet_names: pl.DataFrame  # fid -> fleet_name, for the jobs
    instance_names: pl.DataFrame | None  # iid -> instance_name, instance_fleet_id
    alive: pl.DataFrame | None  # the latest moment either table shows the server at work
    damage: cells.Ledger

    def add_to(self, ledger: cells.Ledger, reader: TableReader) -> None:
        """The damage in both tables, counted or not as `reader` counts a table it reads
        (a later partition's is said, counted by the first: SqliteReader.counts_damage)."""
        counts = getattr(reader, "counts_damage", lambda _table: True)
        for (where, table), parts in self.damage.found.items():
            for rows in parts:
                ledger.add(where, table, rows, counted=counts(table))

    def labelled(self, server: str) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The fleets and instances as read from `server` (mapped unlabelled: the label is the
        audit's, the tables the file's)."""
        return tuple(
            frame.with_columns(pl.lit(server).alias("server")) if frame.width else frame
            for frame in (self.fleets, self.instances)
        )

    def through_files(self, folder: Path, stem: str) -> _FleetTablesFiles:
        """These tables as another process on this machine is sent them: their frames
        written to `folder` (Arrow IPC files named from `stem`), read back where they are
        unpickled (`_FleetTablesFiles`), not pickled through the pipe between the two (16k
        runs: 20 MB, pickled in 0.06 s and unpickled in 0.03 s)."""
        paths = {}
        for name in _FLEET_FRAMES:
            if (frame := getattr(self, name)) is not None:
                paths[name] = str(folder / f"{stem}-{name}.arrow")
                frame.write_ipc(paths[name], compression="uncompressed")
        return _FleetTablesFiles(paths, self.damage)


_FLEET_FRAMES = tuple(f.name for f in fields(_FleetTables) if f.name != "damage")


@dataclass(frozen=True)
class _FleetTablesFiles:
    """`_FleetTables` written to files (`_FleetTables.through_files`), pickled as their
    paths: unpickled, the tables themselves, read from those files (in the audit's private
    folder, written once and removed with it)."""

    paths: dict[str, str]
    damage: cells.Ledger

    def __reduce__(self) -> tuple:
        return _fleet_tables_read, (self.paths, self.damage)


def _fleet_tables_read(paths: dict[str, str], damage: cells.Ledger) -> _FleetTables:
    frames = {name: pl.read_ipc(paths[name]) if name in paths else None for name in _FLEET_FRAMES}
    return _FleetTables(**frames, damage=damage)


def learn_fleet_tables(reader: TableReader, projects: pl.DataFrame) -> _FleetTables:
    """The fleets and instances of `reader`'s database as the audit uses them; `projects` as
    `_names` maps them. Remembered once per audit by a reader that shares what partitions
    learn of the whole input (SqliteReader.remember), else made here."""
    remember = getattr(reader, "remember", None)
    if remember is None:
        return _fleet_tables(reader, projects)
    return remember("fleets and instances", lambda: _fleet_tables(reader, projects))


def learn_projects(reader: TableReader, ledger: cells.Ledger | None = None) -> pl.DataFrame:
    """The projects' names, as the fleets and instances need them (`ledger`: where their
    damage goes; None when learning, as load_tables says it)."""
    return _names(_read(reader, "projects", ledger or cells.Ledger()), "project")


def _fleet_tables(reader: TableReader, projects: pl.DataFrame) -> _FleetTables:
    damage = cells.Ledger()
    raw = {table: _timed(_read(reader, table, damage), table) for table in ("fleets", "instances")}
    fleets, instances = _fleets(raw, "", projects)
    names = (
        raw["fleets"].select(
            normalise_id(pl.col("id")).alias("fid"), pl.col("name").alias("fleet_name")
        )
        if raw["fleets"] is not None
        else pl.DataFrame(schema={"fid": pl.String, "fleet_name": pl.String})
    )
    instance_names = None
    if raw["instances"] is not None:
        instance_names = (
            raw["instances"]
            .lazy()
            .pipe(_with_ids, {"iid": "id", "instance_fleet_id": "fleet_id"})
            .select("iid", pl.col("name").alias("instance_name"), "instance_fleet_id")
            .collect(engine=ENGINE)
        )
    fleets, instances, names = cells.owned(fleets), cells.owned(instances), cells.owned(names)
    instance_names = None if instance_names is None else cells.owned(instance_names)
    return _FleetTables(fleets, instances, names, instance_names, _alive_in(reader, raw), damage)


def _alive_in(reader: TableReader, raw: dict[str, pl.DataFrame | None]) -> pl.DataFrame | None:
    """The latest time the raw instances and fleets rows show (TABLE_COLUMNS holds their
    ALIVE_COLUMNS, TIME_COLUMNS all of them: `_timed` parsed them), as one row; None: neither
    table has such a column."""
    frames = []
    for table in ("instances", "fleets"):
        times = raw[table]
        if times is None:
            continue
        columns = [c for c in ALIVE_COLUMNS[table] if c in reader.columns(table)]
        if columns:
            frames.append(times.select(pl.max_horizontal(columns).alias("t")))
    return pl.concat(frames, how="vertical_relaxed").select(pl.max("t")) if frames else None


def _latest_alive(
    data: SourceData, fleet_tables_alive: pl.DataFrame | None, events_latest: datetime | None
):
    """The latest moment any table shows the server at work: a lower bound of when the copy
    was taken (runs and jobs as mapped; every event, whatever its target, a project deleted
    after the incident too; instances and fleets from their raw rows)."""
    frames = [
        data.runs.select(pl.max_horizontal("submitted_at", "last_processed_at").alias("t")),
        data.jobs.select(pl.max_horizontal("submitted_at", "last_processed_at").alias("t")),
        pl.DataFrame({"t": [events_latest]}, schema={"t": UTC_TIME}),
    ]
    if data.events.height:
        frames.append(data.events.select(pl.col("time").alias("t")))
    if fleet_tables_alive is not None:
        frames.append(fleet_tables_alive)
    return pl.concat(frames, how="vertical_relaxed")["t"].max()


def _secrets(
    runs: pl.DataFrame | None, jobs: pl.DataFrame | None, users: pl.DataFrame | None
) -> set[str]:
    """Secret values the database holds, collected only so that no output can show them."""
    redactor = Redactor()
    for frame, column in ((runs, "run_spec"), (jobs, "job_spec_data")):
        if frame is not None:
            specs = frame.select(pl.col(column).unique())  # replicas share one spec
            redactor.add_frame_values(specs.select(json_secret_values(pl.col(column))))
    if users is not None:
        redactor.add(users["token"].to_list())
    return redactor.values


def raw_secrets(table: str, raw: pl.DataFrame) -> set[str]:
    """The secret values in rows of runs, jobs or users as a reader reads them (bytes): as
    load_tables collects them, a batch at a time (a value that is not UTF-8 is none)."""
    text = cells.decode(raw)[0]
    frames = {name: text if name == table else None for name in ("runs", "jobs", "users")}
    return _secrets(frames["runs"], frames["jobs"], frames["users"])


def _jobs(
    reader: TableReader,
    ledger: cells.Ledger,
    raw: pl.DataFrame,
    fleet_tables: _FleetTables,
    server: str,
    runs: pl.DataFrame,
) -> pl.DataFrame:
    has_ready = "ready" in reader.columns("jobs")
    has_probes_table = "probes" in reader.tables()

    spec = pl.col("job_spec_data")
    jobs = _per_distinct(
        raw.lazy(),
        ["job_spec_data"],
        spec.str.json_path_match("$.replica_group").alias("replica_group"),
        spec.str.json_path_match("$.probes")
        .str.json_decode(pl.List(pl.Struct({"ready_after": pl.Int64})))
        .alias("_probe_specs"),
        spec_fingerprint(spec).alias("spec_fingerprint"),
        spec.str.json_path_match("$.requirements.resources").alias("resources"),
    )
    jobs = _per_distinct(
        jobs,
        ["job_provisioning_data"],
        _finite(pl.col("job_provisioning_data").str.json_path_match("$.price")).alias("price"),
    )
    jobs = _per_distinct(
        jobs,
        ["job_runtime_data"],
        integer(pl.col("job_runtime_data").str.json_path_match("$.offer.blocks")).alias("blocks"),
    ).pipe(
        _with_ids,
        {
            "job_id": "id",
            "run_id": "run_id",
            "used_instance_id": "used_instance_id",
            "fleet_id": "fleet_id",
        },
    )

    probes = _read(reader, "probes", ledger)
    if probes is not None and has_probes_table:
        specs = (
            jobs.select("job_id", "_probe_specs")
            .explode("_probe_specs")
            .with_columns(
                pl.int_range(pl.len()).over("job_id").alias("probe_num"),
                pl.col("_probe_specs")
                .struct.field("ready_after")
                .fill_null(1)
                .alias("ready_after"),
            )
            .filter(pl.col("_probe_specs").is_not_null())
            .select("job_id", "probe_num", "ready_after")
        )
        probe_summary = (
            probes.lazy()
            .select(
                normalise_id(pl.col("job_id")).alias("job_id"),
                integer(pl.col("probe_num")).alias("probe_num"),
                integer(pl.col("success_streak")).alias("streak"),
            )
            .join(specs, on=["job_id", "probe_num"], how="left", maintain_order="left")
            .group_by("job_id")
            .agg(
                pl.len().cast(pl.Int64).alias("probe_rows"),
                (pl.col("streak") < pl.col("ready_after").fill_null(1))
                .sum()
                .cast(pl.Int64)
                .alias("probes_below_ready_after"),
                pl.col("streak").min().alias("min_probe_streak"),
            )
        )
        jobs = jobs.join(
            probe_summary, on="job_id", how="left", maintain_order="left"
        ).with_columns(
            pl.col("probe_rows").fill_null(0),
            pl.col("probes_below_ready_after").fill_null(0),
        )
    else:
        jobs = jobs.with_columns(
            pl.lit(None, pl.Int64).alias("probe_rows"),
            pl.lit(None, pl.Int64).alias("probes_below_ready_after"),
            pl.lit(None, pl.Int64).alias("min_probe_streak"),
        )

    fleet_names = fleet_tables.fleet_names
    if fleet_tables.instance_names is not None:
        # the instances these jobs were placed on, picked out first: a partition's jobs are a
        # few thousand, the database's instances many more (100k runs: 250k, whose ids a join
        # hashed again in every partition: 12 ms against 3 ms a partition)
        placed = fleet_tables.instance_names.lazy().join(
            jobs.select("used_instance_id"), left_on="iid", right_on="used_instance_id", how="semi"
        )
        jobs = jobs.join(
            placed,
            left_on="used_instance_id",
            right_on="iid",
            how="left",
            maintain_order="left",
        )
    else:
        jobs = jobs.with_columns(
            pl.lit(None, pl.String).alias("instance_name"),
            pl.lit(None, pl.String).alias("instance_fleet_id"),
        )
    jobs = jobs.with_columns(
        pl.coalesce(pl.col("fleet_id"), pl.col("instance_fleet_id")).alias("fleet_id")
    ).join(
        fleet_names.lazy(), left_on="fleet_id", right_on="fid", how="left", maintain_order="left"
    )

    numbers = [integer(pl.col("job_num")), integer(pl.col("replica_num"))]
    return jobs.select(
        pl.lit(server).alias("server"),
        "run_id",
        "job_id",
        pl.coalesce(
            "job_name",
            # a damaged name: dstack's own (JobConfigurator._job_spec, configurators/base.py)
            pl.concat_str(["run_name", *numbers], separator="-"),
            pl.lit(UNKNOWN_NAME),
        ).alias("job_name"),
        integer(pl.col("replica_num")).alias("replica_num"),
        integer(pl.col("job_num")).alias("job_num"),
        integer(pl.col("submission_num")).alias("submission_num"),
        integer(pl.col("deployment_num")).alias("deployment_num"),
        normalise_enum(pl.col("status")).alias("status"),
        normalise_enum(pl.col("termination_reason")).alias("termination_reason"),
        pl.when(pl.col("termination_reason_message").fill_null("") == "")
        .then(pl.lit(None, pl.String))
        .otherwise(pl.col("termination_reason_message"))
        .alias("termination_reason_message"),
        integer(pl.col("exit_status")).alias("exit_status"),
        "submitted_at",
        "last_processed_at",
        (pl.col("job_provisioning_data").fill_null("").str.strip_chars().is_in(["", "null"]))
        .not_()
        .alias("has_provisioning_data"),
        "price",
        pl.col("used_instance_id").alias("instance_id"),
        "instance_name",
        "blocks",
        "fleet_id",
        "fleet_name",
        "replica_group",
        (_bool(pl.col("ready")) if has_ready else pl.lit(None, pl.Boolean)).alias("ready"),
        integer(pl.col("graceful_termination_attempts")).alias("graceful_termination_attempts"),
        "remove_at",
        "running_at",
        pl.col("_probe_specs").list.len().fill_null(0).cast(pl.Int64).alias("probe_count"),
        "probe_rows",
        "probes_below_ready_after",
        "min_probe_streak",
        pl.col("_probe_specs")
        .list.eval(pl.element().struct.field("ready_after").fill_null(1))
        .list.max()
        .alias("probe_ready_after"),
        "spec_fingerprint",
        "resources",
        pl.concat_str([pl.lit("jobs:"), pl.col("id")]).alias("provenance"),
    ).collect(engine=ENGINE)


def _events(
    reader: TableReader,
    ledger: cells.Ledger,
    server: str,
    label: str,
    jobs: pl.DataFrame,
    runs: pl.DataFrame,
    users: pl.DataFrame,
) -> tuple[pl.DataFrame, datetime | None]:
    """The events of runs and jobs, and the latest moment any event of the table speaks of
    (a project's, a fleet's or a user's too: the server was at work then)."""
    if not {"events", "event_targets"} <= reader.tables():
        for table in ("events", "event_targets"):
            _read(reader, table, ledger)  # what is damaged in it is said all the same
        return pl.DataFrame(), None
    # read straight into the mapping, which lets them go as soon as it has what it needs
    return map_events(
        _read(reader, "events", ledger),
        _read(reader, "event_targets", ledger),
        server=server,
        label=label,
        users=users,
        jobs=jobs,
        runs=runs,
    )
