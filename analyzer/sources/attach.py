"""One job-to-run attacher for job events that name no run.

dstack's `event_targets.entity_run_id` is set for job targets from 0.20.x on; older events, API
event pages and log lines carry only the job's id or name. A job event then takes its run from
the job's row (same server, same job id) and, where the row was deleted (superseded no-capacity
submissions are removed from 0.20.29 on), from the one run of that name alive at that moment
(submitted at or before it, last processed at or after it). Used by the database and export
readers (analyzer.sources.dstack_tables), the API export (analyzer.sources.api) and across
sources after they are combined (analyzer.pipeline.reconcile). A log alone has no run rows: its
job lines are attached by the sequence of its own run lines instead
(analyzer.sources.logs.messages).
"""

from __future__ import annotations

import polars as pl

JOB_WITHOUT_RUN = pl.col("run_id").is_null() & (pl.col("entity_type") == "job")


def attach_job_runs(
    events: pl.DataFrame, *, jobs: pl.DataFrame | None = None, runs: pl.DataFrame | None = None
) -> pl.DataFrame:
    """`events` with the run of every job event that names none and can be told: by the job's
    row in `jobs`, then by name among `runs` alive at the event's time. Row order is kept."""
    if jobs is not None and jobs.height and events.filter(JOB_WITHOUT_RUN).height:
        events = _by_job_row(events, jobs)
    if runs is not None and events.filter(JOB_WITHOUT_RUN).height:
        events = _by_name_alive(events, runs)
    return events


def _by_job_row(events: pl.DataFrame, jobs: pl.DataFrame) -> pl.DataFrame:
    runs_of_jobs = jobs.select(
        "server", pl.col("job_id").alias("entity_id"), pl.col("run_id").alias("_job_run")
    ).unique(["server", "entity_id"])
    return (
        events.join(runs_of_jobs, on=["server", "entity_id"], how="left", maintain_order="left")
        .with_columns(
            pl.when(pl.col("entity_type") == "job")
            .then(pl.coalesce("run_id", "_job_run"))
            .otherwise(pl.col("run_id"))
            .alias("run_id")
        )
        .drop("_job_run")
    )


def _by_name_alive(events: pl.DataFrame, runs: pl.DataFrame) -> pl.DataFrame:
    """A job is named `<run>-<replica>-<job>`; of the runs of that name, the one alive when the
    event was recorded, when exactly one is."""
    indexed = events.with_row_index("_row")
    candidates = (
        indexed.filter(JOB_WITHOUT_RUN)
        .with_columns(pl.col("entity_name").str.replace(r"-\d+-\d+$", "").alias("run_name"))
        .join(
            runs.select("run_id", "run_name", "submitted_at", "last_processed_at").rename(
                {"run_id": "_cand"}
            ),
            on="run_name",
        )
        .filter(
            (pl.col("time") >= pl.col("submitted_at"))
            & (pl.col("time") <= pl.col("last_processed_at"))
        )
        .group_by("_row")
        .agg(pl.col("_cand").unique())
        .filter(pl.col("_cand").list.len() == 1)
        .select("_row", pl.col("_cand").list.first())
    )
    return (
        indexed.join(candidates, on="_row", how="left", maintain_order="left")
        .with_columns(pl.coalesce("run_id", "_cand").alias("run_id"))
        .drop("_row", "_cand")
    )
