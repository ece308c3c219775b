"""Per run: its deployments, replica slots and every job submission with its status intervals
and its healthy interval (RUNNING and ready), keyed on job ids (slots and names are reused).

Inputs: the canonical frames only. Outputs: polars frames the detector and the reports read.
"""

from __future__ import annotations

import polars as pl

from analyzer.dstack import FINISHED_JOB_STATUSES
from analyzer.model import ENGINE, UTC_TIME
from analyzer.pipeline.evidence import Evidence
from analyzer.pipeline.states import final_health, healthy_since, probe_results

# Each proof of vocabulary.HEALTHY_PROOFS / UNHEALTHY_PROOFS in words (tests/test_health.py).
HEALTH_PROOFS = {
    "ready_flag": "jobs.ready = 1",
    "ready_flag_and_probes": "jobs.ready = 1 and every probe's last success_streak >= ready_after",
    "ready_event": "event 'Service replica ready to receive requests'",
    "ready_event_and_probes": (
        "event 'Service replica ready to receive requests' and every probe's last "
        "success_streak >= ready_after"
    ),
    "registered_event": "event 'Service replica registered to receive requests'",
    "registered_event_and_probes": (
        "event 'Service replica registered to receive requests' and every probe's last "
        "success_streak >= ready_after"
    ),
    "probe_streaks": "every probe's last success_streak >= its ready_after",
    "probe_lines": (
        "every probe's last result logged before the stop passed, its passes since the last "
        "failure reaching ready_after or unbroken since the readiness (DEBUG probe lines)"
    ),
    "running_no_probes": (
        "RUNNING when the run was terminated (graceful stop requested: "
        "graceful_termination_attempts / remove_at set, or RUNNING -> TERMINATING) and the "
        "service has no probes, so dstack counted it ready on its first RUNNING pass"
    ),
    "still_running_no_probes": (
        "still RUNNING when the evidence ends and the service has no probes, so dstack counted "
        "it ready on its first RUNNING pass"
    ),
}
UNHEALTHY_PROOFS = {
    "probe_failing": "a probe's last success_streak is below its ready_after (failing at the stop)",
    "probe_failed_logged": (
        "a probe's last result logged before the stop failed (DEBUG probe lines)"
    ),
    "never_running": "never reached RUNNING (no provisioning data or no RUNNING transition)",
    "not_ready": "jobs.ready = 0 and no other proof of serving",
    "probes_never_ran": "probes declared but no probe ever ran",
}


def _job_event_facts(events: pl.DataFrame) -> pl.DataFrame:
    # the columns read, picked before the filter: it copies only those of the jobs' events
    jobs = events.select(
        "server",
        "entity_type",
        "entity_id",
        "kind",
        "time",
        "seq",
        "old_status",
        "new_status",
        "termination_reason",
        "termination_message",
        "deployment_num",
    ).filter(pl.col("entity_type") == "job")
    t = pl.col("time")
    new = pl.col("new_status")
    terminating = new == "terminating"
    return jobs.group_by(["server", "entity_id"]).agg(
        t.filter(pl.col("kind") == "job_created").min().alias("created_event_at"),
        pl.col("seq").filter(pl.col("kind") == "job_created").min().alias("created_seq"),
        t.filter(new == "running").min().alias("running_event_at"),
        # the job left the queue (placed, or failed to be): `jobs_submitted.py` only moves a
        # SUBMITTED job on
        t.filter(pl.col("old_status") == "submitted").min().alias("left_queue_at"),
        t.filter(pl.col("kind").is_in(["job_ready", "job_registered"])).min().alias("ready_at"),
        pl.col("kind")
        .filter(pl.col("kind").is_in(["job_ready", "job_registered"]))
        .first()
        .alias("ready_kind"),
        t.filter(terminating).min().alias("terminating_at"),
        pl.col("old_status").filter(terminating).first().alias("terminating_from"),
        pl.col("termination_reason").filter(terminating).first().alias("event_reason"),
        pl.col("termination_message").filter(terminating).first().alias("event_message"),
        t.filter(new.is_in(list(FINISHED_JOB_STATUSES))).min().alias("finished_event_at"),
        pl.col("deployment_num").filter(pl.col("kind") == "job_updated").max().alias("bumped_to"),
        (pl.col("kind") == "graceful_stop").any().alias("graceful_stop_event"),
    )


def _creation_deployments(subs: pl.DataFrame, events: pl.DataFrame) -> pl.DataFrame:
    """The run's deployment when each job was created: the last 'Run updated' before it (one
    query)."""
    updates = (
        events.lazy()
        .filter(pl.col("kind") == "run_updated")
        .select("server", "run_id", pl.col("time").alias("update_at"), "deployment_num")
        .drop_nulls(["update_at", "run_id"])
        .sort("update_at")
    )
    created = subs.lazy().select(
        "server", "run_id", "job_id", pl.coalesce("created_event_at", "submitted_at").alias("_c")
    )
    has_events = (
        events.lazy()
        .select("server", "run_id", "kind")
        .filter(pl.col("kind").is_in(["run_submitted", "run_updated", "job_created"]))
        .select("server", "run_id")
        .unique()
        .with_columns(pl.lit(True).alias("_seen"))
    )
    joined = (
        created.filter(pl.col("_c").is_not_null())
        .sort("_c")
        .join_asof(
            updates.rename({"deployment_num": "created_deployment"}),
            left_on="_c",
            right_on="update_at",
            by=["server", "run_id"],
            strategy="backward",
            check_sortedness=False,
        )
        .join(has_events, on=["server", "run_id"], how="left", maintain_order="left")
        .select(
            "job_id",
            "server",
            pl.when(pl.col("created_deployment").is_not_null())
            .then(pl.col("created_deployment"))
            .when(pl.col("_seen").fill_null(False))
            .then(pl.lit(0, pl.Int64))
            .alias("created_deployment"),
        )
    )
    return (
        subs.lazy()
        .join(joined, on=["server", "job_id"], how="left", maintain_order="left")
        .collect(engine=ENGINE)
    )


def submissions(evidence: Evidence) -> pl.DataFrame:
    """One row per job submission with its derived times and its health verdict."""
    facts = _job_event_facts(evidence.events)
    subs = evidence.jobs.join(
        facts,
        left_on=["server", "job_id"],
        right_on=["server", "entity_id"],
        how="left",
        maintain_order="left",
    )
    subs = _creation_deployments(subs, evidence.events)
    subs = subs.join(
        probe_results(evidence.events), on=["server", "job_id"], how="left", maintain_order="left"
    )
    subs = final_health(subs)
    finished = pl.col("status").is_in(list(FINISHED_JOB_STATUSES))
    stopped_at = pl.coalesce(
        "terminating_at", pl.when(finished).then(pl.col("last_processed_at"))
    ).cast(UTC_TIME)
    return subs.with_columns(
        pl.coalesce("created_event_at", "submitted_at").alias("created_at"),
        stopped_at.alias("stopped_at"),
        pl.coalesce("finished_event_at", pl.when(finished).then(pl.col("last_processed_at")))
        .cast(UTC_TIME)
        .alias("finished_at"),
        healthy_since().alias("healthy_since"),
    ).sort(["server", "run_id", "replica_num", "job_num", "submission_num"])


def deployments(evidence: Evidence, subs: pl.DataFrame) -> pl.DataFrame:
    """One row per (run, deployment): when it began, what changed, who applied it (one
    query)."""
    runs = evidence.runs.lazy()
    updates = (
        evidence.events.lazy()
        .filter(pl.col("kind") == "run_updated")
        .select(
            "server",
            "run_id",
            "deployment_num",
            pl.col("time").alias("began_at"),
            "changed_fields",
            "actor",
            pl.col("provenance").list.join("; ").alias("provenance"),
        )
    )
    from_jobs = (
        subs.lazy()
        .group_by(["server", "run_id", "deployment_num"])
        .agg(
            pl.col("submitted_at").min().alias("first_job_at"),
            pl.len().alias("jobs"),
        )
        .drop_nulls("deployment_num")
    )
    base = runs.select(
        "server",
        "run_id",
        pl.lit(0, pl.Int64).alias("deployment_num"),
        pl.col("submitted_at").alias("run_submitted_at"),
        pl.col("deployment_num").alias("run_deployment_num"),
    )
    numbers = pl.concat(
        [
            base.select("server", "run_id", "deployment_num"),
            updates.select("server", "run_id", "deployment_num"),
            from_jobs.select("server", "run_id", "deployment_num"),
            runs.select("server", "run_id", "deployment_num"),
        ],
        how="vertical_relaxed",
    ).unique()
    return (
        numbers.drop_nulls(["run_id", "deployment_num"])
        .join(updates, on=["server", "run_id", "deployment_num"], how="left", maintain_order="left")
        .join(
            from_jobs, on=["server", "run_id", "deployment_num"], how="left", maintain_order="left"
        )
        .join(
            base.select("server", "run_id", "run_submitted_at"),
            on=["server", "run_id"],
            how="left",
            maintain_order="left",
        )
        .with_columns(
            pl.when(pl.col("deployment_num") == 0)
            .then(pl.coalesce("began_at", "run_submitted_at"))
            .otherwise(pl.col("began_at"))
            .alias("began_at"),
            pl.col("jobs").fill_null(0),
        )
        .drop("run_submitted_at")
        .sort(["server", "run_id", "deployment_num"])
        .collect(engine=ENGINE)
    )


def evidence_gaps(
    runs: pl.DataFrame, jobs: pl.DataFrame, events: pl.DataFrame, events_table_servers: set[str]
) -> dict[tuple[str, str], list[str]]:
    """Per run, what the evidence is missing, said out loud (never silently assumed). The
    frames of each gap are collected together (the late starts after, when any run is known
    from a log alone)."""
    gaps: dict[tuple[str, str], list[str]] = {}

    def add(frame: pl.DataFrame, text) -> None:
        for row in frame.iter_rows(named=True):
            gaps.setdefault((row["server"], row["run_id"]), []).append(text(row))

    from_db = runs.lazy().filter(pl.col("provenance").str.starts_with("runs:"))
    table_servers = pl.LazyFrame(
        {"server": sorted(events_table_servers)}, schema={"server": pl.String}
    )
    eventless = from_db.join(table_servers, on="server").join(
        events.lazy().select("server", "run_id"), on=["server", "run_id"], how="anti"
    )
    orphans = (
        events.lazy()
        .select("server", "run_id", "entity_type", "entity_id")
        .filter((pl.col("entity_type") == "job") & pl.col("entity_id").is_not_null())
        .drop("entity_type")
        .join(
            jobs.lazy().select("server", pl.col("job_id").alias("entity_id")),
            on=["server", "entity_id"],
            how="anti",
        )
        .unique()  # of the few left: most events are of jobs whose rows are there
        .join(from_db.select("server", "run_id"), on=["server", "run_id"])
        .group_by(["server", "run_id"])
        .agg(pl.len().alias("n"), pl.col("entity_id").sort().alias("ids"))
    )
    log_only = runs.lazy().filter(pl.col("provenance").str.contains(r"^[^#]*:\d+$"))
    terminating = runs.lazy().filter(pl.col("status") == "terminating")
    eventless, orphans, log_only, terminating = pl.collect_all(
        [eventless, orphans, log_only, terminating], engine=ENGINE
    )
    add(
        eventless,
        lambda _: (
            "no events for this run in the events table (past the events TTL, 30 days by "
            "default, or before dstack 0.20.0): order and times come from table columns only"
        ),
    )
    add(
        orphans,
        lambda row: (
            f"{row['n']} job submission(s) appear only in events, their rows deleted by "
            "dstack (superseded no-capacity submissions, 0.20.29+): " + ", ".join(row["ids"][:5])
        ),
    )
    if log_only.height:  # no run known from a log alone (a database): none started late
        started_late = (
            events.lazy()
            .filter(pl.col("origin") == "event_line")
            .group_by(["server", "run_id"])
            .agg((pl.col("kind") == "run_submitted").any().alias("submitted"))
            .filter(~pl.col("submitted"))
            .join(log_only.lazy().select("server", "run_id"), on=["server", "run_id"])
            .collect(engine=ENGINE)
        )
        add(
            started_late,
            lambda _: (
                "the log starts after this run was submitted: its earlier history (and the "
                "health of replicas started before the log) is not in the evidence"
            ),
        )
    add(terminating, lambda _: "snapshot taken mid-cascade: the run is still TERMINATING")
    return gaps
