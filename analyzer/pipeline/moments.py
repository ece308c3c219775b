"""A run's failure: the moment its cascade began, whatever a later user stop wrote over it
(and what that stop wrote), the own failures of submissions whose rows dstack deleted, and
the run applied after it. The detector judges each job at that moment (what held then:
pipeline/states.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import polars as pl

from analyzer.dstack import (
    RUN_FAILURE_REASONS,
    USER_STOP_JOB_REASONS,
    USER_STOP_RUN_REASONS,
    own_failure,
)
from analyzer.model import ENGINE, UTC_TIME

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
    after the failure; `stop_at` / `stop_actor` where the stop's own event exists. One query."""
    first = (
        events.lazy()
        .filter(
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
    per_run = (
        subs.lazy()
        .group_by(["server", "run_id"])
        .agg(
            OWN_FAILURE_AT.filter(pl.col("own_failure")).min().alias("_own_at"),
            pl.col("cascade_stop").any().alias("_labelled"),
        )
    )
    joined = (
        runs.lazy()
        .select("server", "run_id", "status", "termination_reason")
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
    ).collect(engine=ENGINE)


def next_runs(runs: pl.DataFrame) -> pl.DataFrame:
    """Per run, the next run of the same name in its project (`dstack apply` after a run
    failed submits a new run: services/runs/__init__.py, apply_plan)."""
    name = ["server", "project", "run_name"]
    return (
        runs.select(*name, "run_id", "submitted_at")
        .sort([*name, "submitted_at"], nulls_last=True)
        .with_columns(
            pl.col("run_id").shift(-1).over(name).alias("next_run_id"),
            pl.col("submitted_at").shift(-1).over(name).alias("next_submitted_at"),
        )
        .select("server", "run_id", "next_run_id", "next_submitted_at")
    )


def deleted_failures(events: pl.DataFrame, subs: pl.DataFrame) -> pl.DataFrame:
    """The own failures of submissions whose rows dstack deleted but whose events it kept (it
    deletes superseded no-capacity submissions: background/scheduled_tasks,
    delete_superseded_no_capacity_job_submissions, 0.20.29+): one row each, named and timed by
    its events, judged by the reason its TERMINATING event carries (`own_failure`)."""
    kind, new = pl.col("kind"), pl.col("new_status")
    terminating = (kind == "job_status") & (new == "terminating")
    # the columns read, picked before the filter: it copies only those of the jobs' events
    orphans = (
        events.select(
            "server",
            "run_id",
            "entity_type",
            "entity_id",
            "entity_name",
            "kind",
            "new_status",
            "time",
            "termination_reason",
            "termination_message",
            "provenance",
        )
        .filter((pl.col("entity_type") == "job") & kind.is_in(["job_created", "job_status"]))
        .join(
            subs.select("server", pl.col("job_id").alias("entity_id")),
            on=["server", "entity_id"],
            how="anti",
        )
    )
    return (
        orphans.group_by(["server", "run_id", "entity_id"])
        .agg(
            pl.col("entity_name").drop_nulls().first().alias("job_name"),
            pl.col("time").filter(kind == "job_created").min().alias("created_at"),
            pl.col("time").filter(terminating).min().alias("terminating_at"),
            pl.col("termination_reason").filter(terminating).first(),
            pl.col("termination_message")
            .filter(terminating)
            .first()
            .alias("termination_reason_message"),
            pl.col("provenance").first().list.first().alias("provenance"),
        )
        .filter(pl.col("terminating_at").is_not_null())
        .with_columns(pl.lit("failed").alias("status"))
        .filter(own_failure())
        .select(
            "server",
            "run_id",
            pl.col("entity_id").alias("job_id"),
            "job_name",
            "created_at",
            "terminating_at",
            "termination_reason",
            "termination_reason_message",
            "provenance",
            pl.lit(None, pl.Int64).alias("submission_num"),
            pl.lit(None, pl.Int64).alias("exit_status"),
            pl.lit(None, pl.String).alias("event_reason"),
            pl.lit(None, pl.String).alias("event_message"),
            pl.lit(None, UTC_TIME).alias("finished_at"),
            pl.lit(None, UTC_TIME).alias("last_processed_at"),
        )
        .sort("created_at")
    )


def stopped_during_cascade(
    run: dict[str, Any],
    victims: list[dict[str, Any]],
    finished: dict[str, Any] | None,
    at: Callable[[datetime | None], str],
) -> tuple[str, str]:
    """The limitation that says a user stopped the run after its failure: what dstack wrote
    over the failure, and when the stop came as far as the evidence dates it (`finished`: the
    run's TERMINATING -> finished event; `at` words a moment)."""
    final = (run["stop_reason"] or "").upper() or (
        "status TERMINATED, which dstack gives a run only for a user's stop or abort "
        "(RunTerminationReason.to_status)"
    )
    by_user = [v for v in victims if v["termination_reason"] in USER_STOP_JOB_REASONS]
    by_server = [v for v in victims if v["termination_reason"] not in USER_STOP_JOB_REASONS]
    basis = run["failure_basis"]
    if basis == "culprit_before_stop":
        actor = (run["stop_actor"] or "an unknown actor").removeprefix("user ")
        failed = (
            f"a replica had already failed by itself at {at(run['failed_at'])} when "
            f"{actor} stopped the run at {at(run['stop_at'])} (the stop's event), before "
            "dstack's run pass failed it (pipeline_tasks/runs/active.py): whether the run would "
            "have failed depends on the replica's retry policy"
        )
    elif basis == "cascade_label":
        failed = (
            f"no event dates the run's failure, but its final reason {final} is a user's and "
            + ", ".join(v["job_name"] for v in by_server)
            + " carries the cascade's TERMINATED_BY_SERVER without a message, which dstack "
            "gives only for a server reason (RunTerminationReason.to_job_termination_reason): "
            "the run had failed before the user's stop, with a reason the evidence does not name"
        )
    else:
        lower = max(
            [run["failed_at"], *(v["terminating_at"] for v in by_server if v["terminating_at"])]
        )
        upper = min(
            [
                t
                for t in (
                    *(v["terminating_at"] for v in by_user),
                    finished["time"] if finished else None,
                )
                if t is not None
            ],
            default=None,
        )
        window = f"at or after {at(lower)}" + (f" and before {at(upper)}" if upper else "")
        failed = (
            f"the run went TERMINATING with {run['failure_reason'].upper()} at "
            f"{at(run['failed_at'])} (its status-change event) and ends with {final}: "
            "dstack's stop_runs() (services/runs/__init__.py) writes the user's reason over "
            "the failure and emits no event when the run is already TERMINATING "
            f"(switch_run_status), so the stop's time is known only as {window} and its actor "
            "is not in the evidence"
        )
    labels = []
    if by_server:
        labels.append(
            ", ".join(v["job_name"] for v in by_server) + " kept TERMINATED_BY_SERVER "
            "(already TERMINATING at the stop)"
        )
    if by_user:
        labels.append(
            ", ".join(v["job_name"] for v in by_user)
            + f" got {by_user[0]['termination_reason'].upper()} (the terminating pass reached "
            "it after the stop)"
        )
    return "run_stopped_during_cascade", (
        f"run {run['run_name']}: the user stopped the run during the cascade: {failed}; "
        + "; ".join(labels)
        + " (pipeline_tasks/runs/terminating.py, process_terminating_run): the failure had "
        "already doomed them, so they are its victims whichever label the stop gave them"
    )
