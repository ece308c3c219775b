"""All inputs of one audit combined into one canonical model.

The same run, job or event may arrive from several inputs (a database and its exports, the
events table and the log): it becomes one row that keeps every provenance, never two rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import polars as pl

from analyzer.model import EVENTS_SCHEMA, JOBS_SCHEMA, RUNS_SCHEMA, conform
from analyzer.redact import Redactor
from analyzer.sources import InputInfo, Limitation, SourceData

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
    latest_by_server: dict[str, datetime] = field(default_factory=dict)  # beyond a partition
    unparsed: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(
            schema={"file": pl.String, "line": pl.Int64, "text": pl.String}
        )
    )
    # (server, run_id) -> why its rows cannot be trusted (duplicate keys that disagree)
    disputed_runs: dict[tuple[str, str], str] = field(default_factory=dict)

    def ends_by_server(self) -> dict[str, datetime]:
        """Per server: the latest moment its inputs speak of (a lower bound of the capture)."""
        dated = self.events.filter(pl.col("time_basis") != "time_of_day_only")
        frames = [
            self.runs.select("server", pl.col("last_processed_at").alias("t")),
            self.jobs.select("server", pl.col("last_processed_at").alias("t")),
            dated.select("server", pl.col("time").alias("t")),
        ]
        ends = dict(
            pl.concat(frames).drop_nulls().group_by("server").agg(pl.col("t").max()).iter_rows()
        )
        for server, latest in self.latest_by_server.items():
            ends[server] = max(latest, ends.get(server, latest))
        return ends

    @property
    def end_of_evidence(self) -> datetime | None:
        """The latest moment any input speaks of, over every server."""
        return max(self.ends_by_server().values(), default=None)


def _first_per_key(frames: list[pl.DataFrame], schema: dict, key: list[str]) -> pl.DataFrame:
    if not frames:
        return pl.DataFrame(schema=schema)
    stacked = pl.concat([conform(f, schema).collect() for f in frames], how="vertical")
    with_prov = stacked.group_by(key, maintain_order=True).agg(
        pl.all().exclude("provenance").drop_nulls().first(),
        pl.col("provenance").unique(maintain_order=True).str.join("; "),
    )
    return conform(with_prov, schema).collect()


def _disputed_keys(
    frames: list[pl.DataFrame], schema: dict, key: list[str], table: str, merged: pl.DataFrame
) -> pl.DataFrame:
    """The keys (of ``merged``, the one-row-per-key frame) whose rows disagree on a column the
    verdict reads (``VERDICT_COLUMNS``), with the runs they belong to and why (the columns
    and the values the rows gave)."""
    if sum(f.height for f in frames) == merged.height:
        return pl.DataFrame()
    stacked = pl.concat([conform(f, schema).collect() for f in frames], how="vertical")
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
    disputed = counts.filter(pl.any_horizontal([pl.col(c) > 1 for c in compared]))
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


def _merge_events(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """One row per real event: equal (server, entity, message, time) rows from several inputs
    are the same event seen twice; their provenances are kept together."""
    if not frames:
        return pl.DataFrame(schema=EVENTS_SCHEMA)
    stacked = pl.concat([conform(f, EVENTS_SCHEMA).collect() for f in frames], how="vertical")
    key = ["server", "entity_type", "entity_id", "message", "time"]
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
    evidence = Evidence(
        runs=_first_per_key([p.runs for p in loaded], RUNS_SCHEMA, ["server", "run_id"]),
        jobs=_first_per_key([p.jobs for p in loaded], JOBS_SCHEMA, ["server", "job_id"]),
        events=_merge_events([p.events for p in loaded]),
        has_tables=any(p.has_tables for p in parts),
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
        evidence.redactor.add(part.secrets)
        if part.events_table_of is not None:
            evidence.events_table_servers.add(part.events_table_of)
        if part.latest_time is not None:
            server, latest = part.latest_time
            evidence.latest_by_server[server] = max(
                latest, evidence.latest_by_server.get(server, latest)
            )
        evidence.inputs.extend(part.inputs)
        for limitation in part.limitations:
            if all(
                (limitation.code, limitation.message) != (known.code, known.message)
                for known in evidence.limitations
            ):
                evidence.limitations.append(limitation)
    if evidence.has_tables:
        # What an API-only audit cannot prove, a database in the same audit does.
        evidence.limitations = [
            lim for lim in evidence.limitations if not lim.code.startswith(API_ONLY_PREFIXES)
        ]
    evidence.events = evidence.events.sort(["server", "time", "seq"], nulls_last=True)
    return evidence
