"""State in time: one interval table of what each job was at every moment, built once per
audit, and `at(states, moments)`, the one answer to "what was true at T".

Each row is one aspect of one job (its `status`, whether dstack counted it `ready`, one
probe's result where a line dates it, its `deployment`, its `termination`) holding a value
from `since` until `until`, with the basis the row comes from (`database`: a database or its
table export; `api`; `log`), its provenance, and how well each end is known:

- `known`: the evidence dates it;
- `bounded`: the real moment is at or before it (a finished job's `last_processed_at`);
- `unknown`: nothing dates it (a final row's flag: dstack's `jobs.ready`, the probes' final
  `success_streak`); such a state speaks of T only at the end of the evidence;
- `open` (`until` only): nothing later replaced it; it holds at the end of the evidence.

Where two bases date the same transition, a known time outranks a bound and a bound an undated
flag; among equals the database's time outranks a log's (a log line is written after the
commit, on the server's clock, to the millisecond). The final verdict about a job is its state
at the end of the evidence.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, get_args

import polars as pl

from analyzer.dstack import FINISHED_JOB_STATUSES
from analyzer.model import UTC_TIME
from analyzer.pipeline.placement import spans_at

Aspect = Literal["status", "ready", "probe", "deployment", "termination"]
ASPECTS: tuple[str, ...] = get_args(Aspect)
Basis = Literal["database", "api", "log"]
BASES: tuple[str, ...] = get_args(Basis)  # in rank order: the first outranks the rest
EndIs = Literal["known", "bounded", "unknown", "open"]
END_KINDS: tuple[str, ...] = get_args(EndIs)

KEY = ("server", "run_id", "job_id")
STATES_SCHEMA: dict[str, pl.DataType] = {
    "server": pl.String(),
    "run_id": pl.String(),
    "job_id": pl.String(),
    "aspect": pl.Enum(ASPECTS),
    "probe": pl.String(),  # the probe (`probe` aspect only): a job's probes hold apart
    "value": pl.String(),
    "since": UTC_TIME,
    "since_is": pl.Enum(END_KINDS),
    "until": UTC_TIME,
    "until_is": pl.Enum(END_KINDS),
    "basis": pl.Enum(BASES),
    "provenance": pl.String(),
}
_TRANSITION = ("server", "run_id", "job_id", "aspect", "probe", "value", "at", "at_is", "basis")
_LOG_PLACE = r"^[^#;]*:\d+$"
_TABLE_PLACE = r"^(runs|jobs|events|probes|instances|fleets):[^#/]*$"


def basis_of(provenance: pl.Expr) -> pl.Expr:
    """The basis of a row from its provenance: `file:line` is a log's, `path#pointer` an API
    export's, `table:primary key` a database's (or its table export's)."""
    return (
        pl.when(provenance.str.contains(_TABLE_PLACE))
        .then(pl.lit("database"))
        .when(provenance.str.contains(_LOG_PLACE))
        .then(pl.lit("log"))
        .when(provenance.str.contains("#", literal=True))
        .then(pl.lit("api"))
        .otherwise(pl.lit("database"))
    )


def _transition(
    frame: pl.DataFrame,
    aspect: Aspect,
    value: pl.Expr,
    at: pl.Expr,
    at_is: pl.Expr | str,
    provenance: pl.Expr,
    probe: pl.Expr | None = None,
) -> pl.DataFrame:
    return frame.select(
        "server",
        "run_id",
        "job_id",
        pl.lit(aspect).alias("aspect"),
        (probe if probe is not None else pl.lit(None, pl.String)).alias("probe"),
        value.cast(pl.String).alias("value"),
        at.cast(UTC_TIME).alias("at"),
        (pl.lit(at_is) if isinstance(at_is, str) else at_is).alias("at_is"),
        basis_of(provenance).alias("basis"),
        provenance.alias("provenance"),
    ).filter(pl.col("value").is_not_null())


def _from_events(events: pl.DataFrame) -> list[pl.DataFrame]:
    """The dated transitions the events (the events table, API exports, log lines) hold."""
    jobs = events.filter(
        (pl.col("entity_type") == "job") & pl.col("time").is_not_null()
    ).with_columns(
        pl.col("entity_id").alias("job_id"),
        pl.col("provenance").list.first().fill_null("").alias("_place"),
    )
    kind, place = pl.col("kind"), pl.col("_place")
    status = jobs.filter(kind.is_in(["job_created", "job_status"]))
    terminating = jobs.filter((kind == "job_status") & (pl.col("new_status") == "terminating"))
    passed = kind == "probe_passed"
    return [
        _transition(
            status,
            "status",
            pl.coalesce("new_status", pl.when(kind == "job_created").then(pl.lit("submitted"))),
            pl.col("time"),
            "known",
            place,
        ),
        # dstack marks a replica ready once and never resets `jobs.ready`
        # (jobs_running.py, _maybe_register_replica)
        _transition(
            jobs.filter(kind.is_in(["job_ready", "job_registered"])),
            "ready",
            pl.lit("true"),
            pl.col("time"),
            "known",
            place,
        ),
        _transition(
            jobs.filter(kind == "job_updated"),
            "deployment",
            pl.col("deployment_num"),
            pl.col("time"),
            "known",
            place,
        ),
        _transition(
            terminating, "termination", pl.col("termination_reason"), pl.col("time"), "known", place
        ),
        # each result leaves the probe passing or failing: `_process_probe_async`
        # (scheduled_tasks/probes.py) resets the streak to 0 on a failure
        _transition(
            jobs.filter(kind.is_in(["probe_passed", "probe_failed"])),
            "probe",
            pl.when(passed).then(pl.lit("passing")).otherwise(pl.lit("failing")),
            pl.col("time"),
            "known",
            place,
            pl.col("probe"),
        ),
    ]


def _from_rows(subs: pl.DataFrame) -> list[pl.DataFrame]:
    """The transitions the job rows hold: their own times, and their final flags (undated)."""
    finished = pl.col("status").is_in(list(FINISHED_JOB_STATUSES))
    place = pl.col("provenance").str.split("; ").list.first().fill_null("")
    final_probes = pl.col("probe_rows").fill_null(0) > 0
    created = (
        pl.coalesce("created_deployment", "deployment_num")
        if "created_deployment" in subs.columns
        else pl.col("deployment_num")
    )
    return [
        _transition(subs, "status", pl.lit("submitted"), pl.col("submitted_at"), "known", place),
        _transition(subs, "status", pl.lit("running"), pl.col("running_at"), "known", place),
        _transition(
            subs.filter(finished),
            "status",
            pl.col("status"),
            pl.col("last_processed_at"),
            "bounded",
            place,
        ),
        _transition(
            subs.filter(pl.col("ready").is_not_null()),
            "ready",
            pl.col("ready").cast(pl.String).str.to_lowercase(),
            pl.when(~pl.col("ready")).then(pl.col("submitted_at")),
            pl.when(pl.col("ready")).then(pl.lit("unknown")).otherwise(pl.lit("known")),
            place,
        ),
        # a job is created in the run's deployment then (`created_deployment`, the last update
        # before it); its row's number is the final one, bumped in place since at a time only
        # a bump event dates (services/runs/replicas.py, the in-place update)
        _transition(subs, "deployment", created, pl.col("submitted_at"), "known", place),
        _transition(
            subs.filter(created != pl.col("deployment_num")),
            "deployment",
            pl.col("deployment_num"),
            pl.lit(None, UTC_TIME),
            "unknown",
            place,
        ),
        _transition(
            subs.filter(finished & pl.col("termination_reason").is_not_null()),
            "termination",
            pl.col("termination_reason"),
            pl.col("last_processed_at"),
            "bounded",
            place,
        ),
        # the final streaks: a probe's `success_streak` below its `ready_after` is failing
        # (services/probes.py, is_probe_ready); the rows do not say since when
        _transition(
            subs.filter(final_probes),
            "probe",
            pl.when(pl.col("probes_below_ready_after").fill_null(0) > 0)
            .then(pl.lit("failing"))
            .otherwise(pl.lit("passing")),
            pl.lit(None, UTC_TIME),
            "unknown",
            place,
            pl.lit("final streaks"),
        ),
    ]


def job_states(subs: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """The interval table (STATES_SCHEMA) of every job of `subs` (the jobs frame or
    timeline.submissions) from the rows and the events about them."""
    rows = [
        t.select(*_TRANSITION, "provenance")
        for t in (*_from_events(events), *_from_rows(subs))
        if not t.is_empty()
    ]
    empty = pl.DataFrame(schema={k: STATES_SCHEMA[k] for k in STATES_SCHEMA})
    if not rows:
        return empty
    transitions = (
        pl.concat(rows, how="vertical_relaxed")
        .join(subs.select(KEY), on=list(KEY), how="semi")
        .with_columns(
            pl.col("basis").cast(pl.Enum(BASES)),
            pl.col("at_is").cast(pl.Enum(END_KINDS)),
        )
    )
    # a dated readiness says the job was not ready before it: dstack marks it once
    # (jobs_running.py, _maybe_register_replica) and emits the event then
    readied = transitions.filter(
        (pl.col("aspect") == "ready") & (pl.col("value") == "true") & (pl.col("at_is") == "known")
    )
    not_yet = readied.join(
        subs.select(*KEY, pl.col("submitted_at").alias("_submitted")), on=list(KEY)
    ).select(
        *KEY,
        "aspect",
        "probe",
        pl.lit("false").alias("value"),
        pl.col("_submitted").alias("at"),
        "at_is",
        "basis",
        "provenance",
    )
    transitions = pl.concat([transitions, not_yet.filter(pl.col("at").is_not_null())])
    # one transition per (job, aspect, probe, value) across bases: a known time first, then
    # a bound, then none; among equals the database's before an API export's before a log's
    # (probe results repeat their values: each dated one stands)
    repeated = pl.col("aspect") == "probe"
    ranked = transitions.with_columns(
        pl.when(repeated).then(pl.col("at")).alias("_same"),
    ).sort([pl.col("at").is_null(), pl.col("at_is") != "known", "basis", "at"])
    chosen = ranked.unique(
        ["server", "job_id", "aspect", "probe", "value", "_same"], keep="first", maintain_order=True
    ).drop("_same")
    by = ["server", "job_id", "aspect", "probe"]
    return (
        # an undated transition comes last: what held before it ends at an unknown time
        chosen.sort([*by, "at"], nulls_last=True)
        .with_columns(
            pl.col("at").shift(-1).over(by).alias("until"),
            pl.col("at_is").shift(-1).over(by).alias("until_is"),
        )
        .select(
            "server",
            "run_id",
            "job_id",
            pl.col("aspect").cast(pl.Enum(ASPECTS)),
            "probe",
            "value",
            pl.col("at").alias("since"),
            pl.col("at_is").alias("since_is"),
            "until",
            pl.col("until_is").fill_null("open").cast(pl.Enum(END_KINDS)),
            "basis",
            "provenance",
        )
        .cast(STATES_SCHEMA)
    )


def at(
    states: pl.DataFrame, moments: pl.DataFrame, ends: dict[str, datetime] | None = None
) -> pl.DataFrame:
    """What was true at each moment: per row of `moments` (server, job_id, as_of, anything
    else) the states that held then, one row per (moment, aspect, probe); a moment no state
    of an aspect covers has no row for it (unknown then). A state whose start nothing dates
    (a final flag) holds only from the end of its server's evidence (`ends`), never earlier;
    one whose end nothing dates holds at no moment past its start; a bounded end is taken at
    its bound (`until_is` says so to a reader that needs the exact moment)."""
    end = pl.col("server").replace_strict(ends or {}, default=None, return_dtype=UTC_TIME)
    spans = states.drop("run_id" if "run_id" in moments.columns else []).with_columns(
        pl.when(pl.col("since_is") == "unknown")
        .then(end)
        .otherwise(pl.col("since"))
        .alias("since"),
        # an end nothing dates proves the state at no moment past its start
        pl.when(pl.col("until_is") == "unknown")
        .then(pl.col("since"))
        .otherwise(pl.col("until"))
        .alias("until"),
    )
    indexed = moments.with_row_index("_moment")
    held = spans_at(indexed, spans, ("server", "job_id"), "since", "until")
    return indexed.join(held, on="_moment").drop("_moment")


def final(states: pl.DataFrame) -> pl.DataFrame:
    """The state at the end of the evidence: each aspect's (and probe's) open interval."""
    return states.filter(pl.col("until_is") == "open")


def serving_at(held: pl.DataFrame, probe_counts: pl.DataFrame) -> pl.DataFrame:
    """Per moment of `at(...)` (its columns but the states'), whether the job served then:
    RUNNING and ready, no probe failing (a replica serves only while every probe's
    success_streak >= ready_after: services/probes.py, is_probe_ready; without probes dstack
    counts it ready on its first RUNNING pass, jobs_running.py, _maybe_register_replica).
    `serving` is null where the evidence cannot say (no status or no readiness then)."""
    moment = [c for c in held.columns if c not in STATES_SCHEMA or c in ("server", "job_id")]
    aspect, value = pl.col("aspect"), pl.col("value")
    per_moment = (
        held.group_by(moment)
        .agg(
            value.filter(aspect == "status").first().alias("status_then"),
            value.filter(aspect == "ready").first().alias("ready_then"),
            ((aspect == "probe") & (value == "failing")).any().alias("probe_failing_then"),
        )
        .join(probe_counts, on=["server", "job_id"], how="left")
    )
    running = pl.col("status_then") == "running"
    ready = (pl.col("ready_then") == "true") | (
        (pl.col("probe_count") == 0) & pl.col("ready_then").is_null()
    )
    return per_moment.with_columns(
        pl.when(pl.col("status_then").is_null())
        .then(None)
        .when(~running | pl.col("probe_failing_then") | (pl.col("ready_then") == "false"))
        .then(False)
        .when(ready)
        .then(True)
        .alias("serving")
    ).drop("probe_count")
