"""A run's failure: the moment its cascade began, whatever a later user stop wrote over it.
The detector judges each job at that moment (what held then: pipeline/states.py).
"""

from __future__ import annotations

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
