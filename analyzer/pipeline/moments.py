"""What was true at a moment: a run's failure (the moment its cascade began, whatever a later
user stop wrote over it) and a replica's health at a moment T, from what the evidence dates at
or before T. The detector asks them at the run's failure, `exposure --as-of` at its T.
"""

from __future__ import annotations

from datetime import datetime

import polars as pl

from analyzer.dstack import RUN_FAILURE_REASONS, USER_STOP_RUN_REASONS
from analyzer.model import UTC_TIME

# The bases on which a user's stop may have come after the failure, during the cascade.
CASCADE_BASES = ("run_event", "culprit_before_stop", "cascade_label")
# A job's own failure happened at its TERMINATING event, its finish, or (tables only) at or
# before its last processing.
OWN_FAILURE_AT = pl.coalesce("terminating_at", "finished_at", "last_processed_at")


def run_failures(runs: pl.DataFrame, subs: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """Per run: did a job failure doom it, when, and did a user stop it during the cascade.

    dstack's `stop_runs()` (services/runs/__init__.py) overwrites `runs.termination_reason` with
    STOPPED_BY_USER (ABORTED_BY_USER) even when the run is already TERMINATING with JOB_FAILED,
    and `switch_run_status` emits no event then (the status does not change); the terminating
    pass (pipeline_tasks/runs/terminating.py, process_terminating_run) labels the jobs it has
    not reached yet with `to_job_termination_reason()` of the new reason, TERMINATED_BY_USER.
    So the failure is read at its moment, never from the final row (`failure_basis`):

    - `run_event`: the run's first transition to TERMINATING carried JOB_FAILED or
      RETRY_LIMIT_EXCEEDED (its event or log line);
    - `culprit_before_stop`: the first transition was the user's stop, and a job of the run had
      already failed by itself (the run pass had not yet failed the run);
    - `cascade_label`: nothing dates the first transition, the final reason is a user's stop,
      and a job carries the cascade's TERMINATED_BY_SERVER without a message, which dstack
      gives for a server reason only (RunTerminationReason.to_job_termination_reason);
    - `run_row`: the run's row says JOB_FAILED / RETRY_LIMIT_EXCEEDED, no event says when.

    `stopped_during_cascade`: the run's final TERMINATED (given only for STOPPED_BY_USER and
    ABORTED_BY_USER, RunTerminationReason.to_status) or its final reason says a user stopped it
    after the failure; `stop_at` / `stop_actor` where the stop's own event exists."""
    first = (
        events.filter(
            (pl.col("entity_type") == "run")
            & (pl.col("kind") == "run_status")
            & (pl.col("new_status") == "terminating")
        )
        .sort(["server", "run_id", "time", "seq"], nulls_last=True)
        .group_by(["server", "run_id"], maintain_order=True)
        .first()
        .select(
            "server",
            "run_id",
            pl.col("termination_reason").alias("_first_reason"),
            pl.col("time").alias("_first_at"),
            pl.col("actor").alias("_first_actor"),
        )
    )
    per_run = subs.group_by(["server", "run_id"]).agg(
        OWN_FAILURE_AT.filter(pl.col("own_failure")).min().alias("_own_at"),
        pl.col("cascade_stop").any().alias("_labelled"),
    )
    joined = (
        runs.select("server", "run_id", "status", "termination_reason")
        .join(first, on=["server", "run_id"], how="left", maintain_order="left")
        .join(per_run, on=["server", "run_id"], how="left", maintain_order="left")
    )
    first_reason, final, status = (
        pl.col("_first_reason"),
        pl.col("termination_reason"),
        pl.col("status"),
    )
    ended = status.is_in(["failed", "terminated", "terminating"])
    user_first = first_reason.is_in(USER_STOP_RUN_REASONS)
    # only stop_runs() writes another reason over a TERMINATING run's (active.py and
    # pending.py set GATEWAY_ERROR on runs not yet TERMINATING): any other final reason is a
    # row that disagrees with the event, and the row is not overruled
    overwritable = final.is_null() | final.is_in([*RUN_FAILURE_REASONS, *USER_STOP_RUN_REASONS])
    basis = (
        pl.when(first_reason.is_in(RUN_FAILURE_REASONS) & ended & overwritable)
        .then(pl.lit("run_event"))
        .when(user_first & (pl.col("_own_at") <= pl.col("_first_at")).fill_null(False))
        .then(pl.lit("culprit_before_stop"))
        .when(
            first_reason.is_null()
            & final.is_in(USER_STOP_RUN_REASONS)
            & ended
            & pl.col("_labelled").fill_null(False)
        )
        .then(pl.lit("cascade_label"))
        .when(final.is_in(RUN_FAILURE_REASONS) & status.is_in(["failed", "terminating"]))
        .then(pl.lit("run_row"))
    )
    stopped = basis.is_in(CASCADE_BASES) & (
        final.is_in(USER_STOP_RUN_REASONS) | (status == "terminated")
    )
    return joined.select(
        "server",
        "run_id",
        pl.when(basis == "run_event")
        .then(first_reason)
        .when(basis == "run_row")
        .then(final)
        .alias("failure_reason"),
        pl.when(basis == "run_event")
        .then(pl.col("_first_at"))
        .when(basis == "culprit_before_stop")
        .then(pl.col("_own_at"))
        .cast(UTC_TIME)
        .alias("failed_at"),
        basis.alias("failure_basis"),
        stopped.fill_null(False).alias("stopped_during_cascade"),
        pl.when(stopped & final.is_in(USER_STOP_RUN_REASONS)).then(final).alias("stop_reason"),
        pl.when(user_first).then(pl.col("_first_at")).cast(UTC_TIME).alias("stop_at"),
        pl.when(user_first).then(pl.col("_first_actor")).alias("stop_actor"),
    )


def healthy_at(evidence_ends: dict[str, datetime]) -> pl.Expr:
    """Whether a submission alive at `as_of` was healthy then, from what the evidence dates at
    or before `as_of` only (never the final rows' verdict about a later moment).

    dstack marks a replica ready once (`jobs_running.py::_maybe_register_replica`: every probe
    `success_streak >= ready_after`, `services/probes.py::is_probe_ready`; without probes on its
    first RUNNING pass) and never resets `jobs.ready`. So: a ready/registered event dated at or
    before T proves it; a probe-less job RUNNING by T (and `ready` not 0) is ready; the final
    probe streaks and `ready` flag are undated, they speak of T only when T is at or after the
    end of the server's evidence (a streak left by a later crash says nothing of T). Dated
    probe results (DEBUG probe lines; `probe_state_at` adds them first) prove it either way:
    passing at T proves health, a probe failing at T its absence, whatever a readiness said."""
    as_of = pl.col("as_of")
    end = pl.col("server").replace_strict(
        evidence_ends, default=None, return_dtype=pl.Datetime("us", "UTC")
    )
    final_speaks = end.is_not_null() & (as_of >= end)
    running_by = pl.coalesce("running_event_at", "running_at") <= as_of
    dated_ready = (pl.col("ready_at") <= as_of).fill_null(False)
    probe_less = (
        (pl.col("probe_count") == 0)
        & pl.col("ready").is_null().or_(pl.col("ready"))
        & running_by
        & (pl.col("health") == "healthy")
    ).fill_null(False)
    failing = (pl.col("probes_below_ready_after").fill_null(0) > 0) & final_speaks
    final = (final_speaks & (pl.col("health") == "healthy") & running_by).fill_null(False)
    return (
        ~failing
        & ~pl.col("probe_failing_at")
        & (dated_ready | probe_less | final | pl.col("probe_passing_at"))
    )


def dated_after(as_of: pl.Expr) -> pl.Expr:
    """The evidence dates this job's readiness (or, without probes, its RUNNING) after T: it
    had not served by T."""
    ready_later = (pl.col("ready_at") > as_of).fill_null(False)
    running_later = (
        (pl.col("probe_count") == 0)
        & (pl.coalesce("running_event_at", "running_at") > as_of)
        & pl.col("ready_at").is_null()
    ).fill_null(False)
    return ready_later | running_later


PROBE_RESULT_KINDS = ("probe_passed", "probe_failed")
PROBE_RESULT = pl.Struct(
    {
        "probe": pl.String(),
        "time": UTC_TIME,
        "passed": pl.Boolean(),
        "streak": pl.Int64(),
        "failed_before": pl.Boolean(),
        "last_failed_at": UTC_TIME,
        "place": pl.String(),
    }
)


def probe_results(events: pl.DataFrame) -> pl.DataFrame:
    """Per job, its dated probe results (DEBUG probe lines), in time order, each with the
    streak it leaves: `_process_probe_async` (scheduled_tasks/probes.py) adds one to
    `success_streak` on a pass and resets it to 0 on a failure. A streak counted from a log
    that starts mid-streak is a lower bound (`failed_before` false)."""
    rows = events.filter(
        pl.col("kind").is_in(PROBE_RESULT_KINDS)
        & (pl.col("entity_type") == "job")
        & pl.col("time").is_not_null()
    )
    schema = {"server": pl.String(), "job_id": pl.String(), "probe_results": pl.List(PROBE_RESULT)}
    if rows.is_empty():
        return pl.DataFrame(schema=schema)
    passed = pl.col("kind") == "probe_passed"
    key = ["server", "entity_id", "probe"]
    failures = (~passed).cast(pl.Int64).cum_sum().over(key)
    return (
        rows.sort([*key, "time", "seq"])
        .with_columns(
            passed.alias("passed"),
            pl.when(passed)
            .then(pl.int_range(1, pl.len() + 1).over([*key, failures]))
            .otherwise(0)
            .alias("streak"),
            (failures > 0).alias("failed_before"),
            pl.when(~passed).then(pl.col("time")).forward_fill().over(key).alias("last_failed_at"),
            pl.col("provenance").list.first().alias("place"),
        )
        .group_by(["server", "entity_id"], maintain_order=True)
        .agg(pl.struct(list(PROBE_RESULT.to_schema())).sort_by("time").alias("probe_results"))
        .rename({"entity_id": "job_id"})
        .cast(schema)
    )


def probe_state_at(frame: pl.DataFrame) -> pl.DataFrame:
    """Each row's probes at its `as_of` (null: at the end), from its dated probe results
    (`probe_results`): the last result of each probe at or before T.

    dstack counts a replica ready while every probe's streak >= its `ready_after`
    (services/probes.py, is_probe_ready). So a probe failed at T if its last result failed
    (streak 0), or if `ready_after` is known and fewer passes than it followed a failure; it
    passed at T if its last result passed and the passes since the last failure reach
    `ready_after`, or none failed since a readiness dated at or before T (the streak was >=
    `ready_after` then and only grew). `probe_failing_at`: some probe failed at T;
    `probe_passing_at`: every probe seen passed and every declared probe was seen (or a
    dated readiness covers the unseen); `probe_line_at` / `probe_line`: the deciding line."""
    out = ("probe_passing_at", "probe_failing_at", "probe_line_at", "probe_line")
    indexed = frame.drop(out, strict=False).with_row_index("_row")
    as_of = pl.col("as_of")
    ready_after = pl.col("probe_ready_after")
    ready_at = pl.col("ready_at")
    last = (
        indexed.select("_row", "as_of", "ready_at", "probe_ready_after", "probe_results")
        .explode("probe_results")
        .drop_nulls("probe_results")
        .unnest("probe_results")
        .filter(as_of.is_null() | (pl.col("time") <= as_of))
        .sort("time")
        .group_by("_row", "probe")
        .last()
    )
    passed, streak = pl.col("passed"), pl.col("streak")
    reaches = (ready_after.is_not_null() & (streak >= ready_after)).fill_null(False)
    unbroken = (
        (as_of.is_null() | (ready_at <= as_of))
        & (pl.col("last_failed_at").is_null() | (pl.col("last_failed_at") < ready_at))
    ).fill_null(False)
    below = ~passed | (
        ready_after.is_not_null() & pl.col("failed_before") & (streak < ready_after)
    ).fill_null(False)
    per_row = (
        last.with_columns(below.alias("_below"), (passed & (reaches | unbroken)).alias("_passing"))
        .sort("time")
        .group_by("_row")
        .agg(
            pl.col("_below").any().alias("probe_failing_at"),
            pl.col("_passing").all().alias("_all_passing"),
            pl.len().alias("_seen"),
            pl.when(pl.col("_below").any())
            .then(pl.col("time").filter(pl.col("_below")).last())
            .otherwise(pl.col("time").last())
            .alias("probe_line_at"),
            pl.when(pl.col("_below").any())
            .then(pl.col("place").filter(pl.col("_below")).last())
            .otherwise(pl.col("place").last())
            .alias("probe_line"),
        )
    )
    covered = (
        pl.col("probe_count").is_null()
        | (pl.col("_seen") >= pl.col("probe_count"))
        | (ready_at <= as_of).fill_null(False)
    )
    return (
        indexed.join(per_row, on="_row", how="left", maintain_order="left")
        .with_columns(
            pl.col("probe_failing_at").fill_null(False),
            (~pl.col("probe_failing_at").fill_null(False) & pl.col("_all_passing") & covered)
            .fill_null(False)
            .alias("probe_passing_at"),
        )
        .drop("_row", "_all_passing", "_seen")
    )
