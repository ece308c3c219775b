"""All inputs of one audit combined into one canonical model.

The same run, job or event may arrive from several inputs (a database and its exports, the
events table and the log): it becomes one row that keeps every provenance, never two rows.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from analyzer.model import (
    CLOSED_TEXT,
    EVENTS_SCHEMA,
    FLEETS_SCHEMA,
    INSTANCES_SCHEMA,
    JOBS_SCHEMA,
    RUNS_SCHEMA,
    conform,
)
from analyzer.redact import Redactor
from analyzer.sources.base import InputInfo, Limitation, SourceData

API_ONLY_PREFIXES = ("api_", "ps_json_")
# What the verdict reads of a run or job row (detect.py, timeline.py): two rows of one key that
# differ here could each give another verdict; rows that differ elsewhere only are one row.
VERDICT_COLUMNS: dict[str, tuple[str, ...]] = {
    "runs": ("run_type", "status", "termination_reason", "deployment_num", "submitted_at"),
    "jobs": (
        "run_id",
        "job_name",
        "replica_num",
        "job_num",
        "submission_num",
        "deployment_num",
        "status",
        "termination_reason",
        "termination_reason_message",
        "exit_status",
        "submitted_at",
        "last_processed_at",
        "has_provisioning_data",
        "graceful_termination_attempts",
        "spec_fingerprint",
        "ready",
        "remove_at",
        "running_at",
        "probe_count",
        "probe_rows",
        "probes_below_ready_after",
        "min_probe_streak",
    ),
}
_MAX_DISPUTES_NAMED = 5


@dataclass
class Evidence:
    runs: pl.DataFrame
    jobs: pl.DataFrame
    events: pl.DataFrame
    inputs: list[InputInfo] = field(default_factory=list)
    limitations: list[Limitation] = field(default_factory=list)
    has_tables: bool = False
    redactor: Redactor = field(default_factory=Redactor)
    events_table_servers: set[str] = field(default_factory=set)
    fleets: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FLEETS_SCHEMA))
    instances: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=INSTANCES_SCHEMA))
    fleet_table_servers: set[str] = field(default_factory=set)  # inputs held fleets + instances
    server_versions: dict[str, str] = field(default_factory=dict)  # dstack release per server
    narrowed: bool = False  # read for some runs only: other runs' jobs on instances unseen
    latest_by_server: dict[str, datetime] = field(default_factory=dict)  # beyond a partition
    # Per log: seconds its last line (any line) comes after its last run/job line, so that the
    # end of the evidence reaches the last line once the log's clock is aligned.
    log_trailing_seconds: dict[str, float] = field(default_factory=dict)
    unparsed: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={"file": pl.String, "line": pl.Int64, "text": pl.String}
        )
    )
    # (server, run_id) -> why its rows cannot be trusted (duplicate keys that disagree)
    disputed_runs: dict[tuple[str, str], str] = field(default_factory=dict)

    def ends_by_server(self, *, dated_only: bool = True) -> dict[str, datetime]:
        """Per server: the latest moment any of its inputs shows it alive (every table's times,
        every log line): a lower bound of when the evidence was captured. Runs and jobs known
        only from a log without a date add nothing (their times are times of day), unless
        `dated_only` is false (a drawing on the log's own clock, its pseudo day)."""
        events = self.events.lazy()
        dated = events.filter(pl.col("time_basis") != "time_of_day_only") if dated_only else events
        dateless = (
            events.filter((pl.col("time_basis") == "time_of_day_only") & dated_only)
            .select("server", "run_id")
            .unique()
        )
        from_log = pl.col("provenance").str.contains(r"^[^#;]*:\d+$")
        frames = [
            _undated_removed(self.runs.lazy(), dateless, from_log).select(
                "server", pl.col("last_processed_at").alias("t")
            ),
            _undated_removed(self.jobs.lazy(), dateless, from_log).select(
                "server", pl.col("last_processed_at").alias("t")
            ),
            dated.select("server", pl.col("time").alias("t")),
            dated.filter(pl.col("source").is_in(list(self.log_trailing_seconds)))
            .group_by("server", "source")
            .agg(pl.col("time").max())
            .select(
                "server",
                (
                    pl.col("time")
                    + pl.duration(
                        microseconds=pl.col("source").replace_strict(
                            {k: round(v * 1e6) for k, v in self.log_trailing_seconds.items()},
                            return_dtype=pl.Int64,
                        )
                    )
                ).alias("t"),
            ),
        ]
        ends = dict(
            pl.concat(frames)
            .drop_nulls()
            .group_by("server")
            .agg(pl.col("t").max())
            .collect()
            .iter_rows()
        )
        for server, latest in self.latest_by_server.items():
            ends[server] = max(latest, ends.get(server, latest))
        return ends

    @property
    def end_of_evidence(self) -> datetime | None:
        """The latest moment any input speaks of, over every server."""
        return max(self.ends_by_server().values(), default=None)


def _undated_removed(
    frame: pl.LazyFrame, dateless: pl.LazyFrame, from_log: pl.Expr
) -> pl.LazyFrame:
    """Rows derived from a log that gives times of day only carry no real date (one plan: a
    join with no dateless run keeps every row)."""
    flagged = frame.join(
        dateless.with_columns(pl.lit(True).alias("_dateless")),
        on=["server", "run_id"],
        how="left",
        maintain_order="left",
    )
    return flagged.filter(~(pl.col("_dateless").fill_null(False) & from_log)).drop("_dateless")


def _log_trailing_seconds(part: SourceData) -> dict[str, float]:
    """How long after its last lifecycle line each log of this input still wrote lines."""
    trailing = {}
    for _, facts in part.log_reads:
        if facts.last_time is None or not part.events.height:
            continue
        source = part.inputs[0].path
        last_line = facts.last_time
        last_event = part.events.filter(pl.col("source") == source)["time"].max()
        if last_line is not None and last_event is not None and last_line > last_event:
            trailing[source] = (last_line - last_event).total_seconds()
    return trailing


def _stacked(frames: list[pl.DataFrame], schema: dict) -> pl.LazyFrame:
    return pl.concat([conform(f, schema) for f in frames], how="vertical")


def _first_per_key(frames: list[pl.DataFrame], schema: dict, key: list[str]) -> pl.LazyFrame:
    if not frames:
        return pl.LazyFrame(schema=schema)
    if len(frames) == 1 and _once_per_key(frames[0], key):
        # what the grouping gives a key of one row: the row itself (one database's fleets
        # and instances, which every partition of an audit holds whole, are grouped no more)
        return conform(frames[0], schema)
    with_prov = (
        _stacked(frames, schema)
        .group_by(key, maintain_order=True)
        .agg(
            pl.all().exclude("provenance").drop_nulls().first(),
            pl.col("provenance").unique(maintain_order=True).str.join("; "),
        )
    )
    return conform(with_prov, schema)


def _once_per_key(frame: pl.DataFrame, key: list[str]) -> bool:
    """Whether each key is on one row, none of them null, and every row has a provenance.
    Told once per frame and key (`_ONCE_PER_KEY`): the fleets and instances a database's
    partitions share are the same frame in each of them."""
    if not frame.height:
        return True
    found = _keys_found(frame)
    if found is not None and tuple(key) in found:
        return True
    if not {*key, "provenance"} <= set(frame.columns):
        return False
    checked = frame.select(
        pl.struct(key).n_unique().alias("keys"),
        pl.any_horizontal(pl.col(key).is_null()).any().alias("null_key"),
        pl.col("provenance").null_count().alias("no_provenance"),
    ).row(0)
    once = checked == (frame.height, False, 0)
    if once:
        if found is None:  # the dict is held by the callback: it may run at shutdown
            ident, known, found = id(frame), _ONCE_PER_KEY, set()
            known[ident] = (weakref.ref(frame, lambda _: known.pop(ident, None)), found)
        found.add(tuple(key))
    return once


_ONCE_PER_KEY: dict[int, tuple[weakref.ref, set[tuple[str, ...]]]] = {}
"""The frames `_once_per_key` found once per key, by identity, while they live: a frame is
never changed in place here, and each partition of a 100k-run audit looked again at the same
250k instances (33 ms a partition under the profiler, about 2 s in 64)."""


def _keys_found(frame: pl.DataFrame) -> set[tuple[str, ...]] | None:
    """The keys `frame` itself (not a dead frame whose id it took) was found once per."""
    known = _ONCE_PER_KEY.get(id(frame))
    return known[1] if known is not None and known[0]() is frame else None


def _disputed_keys(
    frames: list[pl.DataFrame], schema: dict, key: list[str], table: str, merged: pl.DataFrame
) -> pl.DataFrame:
    """The keys (of ``merged``, the one-row-per-key frame) whose rows disagree on a column the
    verdict reads (``VERDICT_COLUMNS``), with the runs they belong to and why (the columns
    and the values the rows gave)."""
    if sum(f.height for f in frames) == merged.height:
        return pl.DataFrame()
    stacked = _stacked(frames, schema)
    compared = VERDICT_COLUMNS[table]
    counts = stacked.group_by(key).agg(
        pl.len().alias("_rows"),
        pl.col("run_id").drop_nulls().unique().sort().alias("_runs"),
        pl.col("provenance").unique(maintain_order=True).str.join(", ").alias("_where"),
        *[pl.col(c).drop_nulls().n_unique().alias(c) for c in compared],
        *[
            pl.col(c).drop_nulls().unique().cast(pl.String).sort().str.join(" vs ").alias(f"_{c}")
            for c in compared
        ],
    )
    disputed = counts.filter(pl.any_horizontal([pl.col(c) > 1 for c in compared])).collect()
    if disputed.height == 0:
        return pl.DataFrame()
    differences = pl.concat_str(
        [pl.when(pl.col(c) > 1).then(pl.format(f"{c} ({{}})", pl.col(f"_{c}"))) for c in compared],
        separator=", ",
        ignore_nulls=True,
    )
    return disputed.select(
        pl.col("server"),
        pl.col(key[-1]).alias("key"),
        pl.col("_runs").alias("runs"),
        pl.format(
            "{} rows of {} {} ({}) disagree on {}",
            pl.col("_rows"),
            pl.lit(table),
            pl.col(key[-1]),
            pl.col("_where"),
            differences,
        ).alias("why"),
    )


def _all_unique(frame: pl.DataFrame, key: list[str]) -> bool:
    """Whether no two rows share `key`: told by the keys' hashes when they all differ (one
    pass over integers), by the keys themselves only when two hashes meet."""
    if frame.select(pl.struct(key).hash().n_unique()).item() == frame.height:
        return True
    return frame.select(pl.struct(key).is_unique().all()).item()


def _merge_events(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """One row per real event: equal (server, entity, message, time) rows from several inputs
    are the same event seen twice; their provenances are kept together."""
    if not frames:
        return pl.DataFrame(schema=EVENTS_SCHEMA)
    stacked = _stacked(frames, EVENTS_SCHEMA).collect()
    key = ["server", "entity_type", "entity_id", "message", "time"]
    if _all_unique(stacked, key):
        # every event seen once (one input, as a lone database): what the grouping below
        # would give, without grouping every column of every row
        # (conformed already: only the provenance lists change)
        return stacked.with_columns(
            pl.col("provenance")
            .list.unique(maintain_order=True)
            .fill_null(pl.lit([], dtype=pl.List(pl.String)))
        )
    merged = (
        stacked.with_columns(pl.col("time").fill_null(pl.lit(None)))
        .group_by(key, maintain_order=True)
        .agg(
            pl.all().exclude("provenance").drop_nulls().first(),
            pl.col("provenance")
            .list.explode(keep_nulls=False, empty_as_null=False)
            .unique(maintain_order=True),
        )
    )
    return conform(merged, EVENTS_SCHEMA).collect()


def _dispute(evidence: Evidence, table: str, disputed: pl.DataFrame) -> None:
    """Say which keys of a table came with rows that disagree (from two inputs, or twice in
    one export), and mark their runs: which row is true is not in the evidence, so a verdict
    built on either would claim more than it proves."""
    named = disputed.head(_MAX_DISPUTES_NAMED)["why"].to_list()
    more = disputed.height - len(named)
    evidence.limitations.append(
        Limitation(
            "conflicting_duplicate_rows",
            f"{disputed.height} {table} key(s) with rows that disagree on what the verdict "
            "reads; their runs are inconclusive: "
            + "; ".join(named)
            + (f"; and {more} more" if more > 0 else ""),
            table,
        )
    )
    for server, runs, why in disputed.select("server", "runs", "why").iter_rows():
        for run_id in runs:
            known = evidence.disputed_runs.get((server, run_id))
            evidence.disputed_runs[(server, run_id)] = f"{known}; {why}" if known else why


def combine(parts: list[SourceData]) -> Evidence:
    # Databases first: where inputs disagree on a value, the database row is the reference.
    parts = sorted(parts, key=lambda part: not part.has_tables)
    loaded = [p for p in parts if p.runs.height or p.jobs.height or p.events.height or p.has_tables]
    runs, jobs, fleets, instances = pl.collect_all(
        [
            _first_per_key([p.runs for p in loaded], RUNS_SCHEMA, ["server", "run_id"]),
            _first_per_key([p.jobs for p in loaded], JOBS_SCHEMA, ["server", "job_id"]),
            _first_per_key([p.fleets for p in loaded], FLEETS_SCHEMA, ["server", "fleet_id"]),
            _first_per_key(
                [p.instances for p in loaded], INSTANCES_SCHEMA, ["server", "instance_id"]
            ),
        ]
    )
    evidence = Evidence(
        runs=runs,
        jobs=jobs,
        events=_merge_events([p.events for p in loaded]),
        has_tables=any(p.has_tables for p in parts),
        fleets=fleets,
        instances=instances,
    )
    for table, schema, key, merged in (
        ("runs", RUNS_SCHEMA, ["server", "run_id"], evidence.runs),
        ("jobs", JOBS_SCHEMA, ["server", "job_id"], evidence.jobs),
    ):
        frames = [getattr(p, table) for p in loaded]
        disputed = _disputed_keys(frames, schema, key, table, merged) if frames else None
        if disputed is not None and disputed.height:
            _dispute(evidence, table, disputed)
    unparsed = [
        read.unparsed for part in parts for read, _ in part.log_reads if read.unparsed.height
    ]
    if unparsed:
        evidence.unparsed = pl.concat([evidence.unparsed, *unparsed], how="vertical_relaxed")
    for part in parts:
        evidence.log_trailing_seconds.update(_log_trailing_seconds(part))
        evidence.redactor.add(part.secrets)
        evidence.events_table_servers |= part.events_table_of
        servers = set(part.runs["server"]) | set(part.fleets["server"])
        if part.has_fleet_tables:
            evidence.fleet_table_servers |= servers
        if part.server_version is not None:
            for server in servers:
                evidence.server_versions.setdefault(server, part.server_version)
        for server, latest in part.latest_time.items():
            evidence.latest_by_server[server] = max(
                latest, evidence.latest_by_server.get(server, latest)
            )
        evidence.inputs.extend(part.inputs)
        for limitation in part.limitations:
            if all(
                (limitation.code, limitation.message, limitation.source)
                != (known.code, known.message, known.source)
                for known in evidence.limitations
            ):
                evidence.limitations.append(limitation)
    if evidence.has_tables:
        # What an API-only audit cannot prove, a database in the same audit does.
        evidence.limitations = [
            lim for lim in evidence.limitations if not lim.code.startswith(API_ONLY_PREFIXES)
        ]
    evidence.events = _in_order(evidence.events, ["server", "time", "seq"])
    _redact(evidence, masked=_fleet_tables_masked(loaded, evidence.redactor.values))
    return evidence


def _fleet_tables_masked(parts: list[SourceData], values: set[str]) -> bool:
    """Whether every input's fleets and instances are masked with every secret value the
    audit knows already (SourceData.masked_with: once per audit in partitions)."""
    holding = [part for part in parts if part.fleets.height or part.instances.height]
    return bool(holding) and all(
        part.masked_with is not None and values <= part.masked_with for part in holding
    )


def _in_order(frame: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """`frame` sorted by `keys` (nulls last), left as it is when it is in that order already
    (one database's events come so): the order is found, and the rows moved only if needed."""
    order = frame.select(pl.arg_sort_by(keys, nulls_last=True)).to_series()
    if (order == pl.int_range(frame.height, dtype=order.dtype, eager=True)).all():
        return frame
    return frame[order]


def _redact(evidence: Evidence, *, masked: bool) -> None:
    """Every text of the evidence masked once, raw, before any stage templates, cuts or hashes
    it: the report, the notebook tables, the dataset and every picture start from here
    (`masked`: the fleets and instances are already)."""
    redactor = evidence.redactor
    tables = ("runs", "jobs", "events", "unparsed") + (() if masked else ("fleets", "instances"))
    redacted = redactor.apply_frames([getattr(evidence, table) for table in tables], CLOSED_TEXT)
    for table, frame in zip(tables, redacted, strict=True):
        setattr(evidence, table, frame)
    texts = [[i.path, *i.notes] for i in evidence.inputs]
    texts += [[lim.message, lim.source] for lim in evidence.limitations]
    redacted = iter(redactor.apply_data(texts))
    for info in evidence.inputs:
        info.path, *info.notes = next(redacted)
    for limitation in evidence.limitations:
        limitation.message, limitation.source = next(redacted)
