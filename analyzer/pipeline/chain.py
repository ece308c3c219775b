"""The evidence chain a finding quotes: the events that show the update, the failure, the
victims' health and the cascade, each as its evidence item, and the job rows' states where no
event records them. The quoted events are picked and their items' texts written in columns
(quoted_events, quoted_columns); only those events become rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import polars as pl

from analyzer.contract import EvidenceItem
from analyzer.dstack import RUN_FAILURE_REASONS, USER_STOP_JOB_REASONS
from analyzer.pipeline.timeline import HEALTH_PROOFS

Row = dict[str, Any]
# an event's evidence item in columns (quoted_columns)
EVIDENCE_COLUMNS = ("evidence_time", "evidence_source", "evidence_text")


def quoted_events(failed: pl.Expr, victim: pl.Expr) -> pl.Expr:
    """The events the evidence chain quotes (the rest only count, in columns): the run's
    updates and its status changes into or out of the termination; a failed submission's
    creation and termination (`failed`: a culprit's or its earlier failures', culprit_evidence);
    a victim's readiness and its stop (`victim`, victim_evidence)."""
    kind, new = pl.col("kind"), pl.col("new_status")
    terminating = (kind == "job_status") & (new == "terminating")
    return (
        (kind == "run_updated")
        | (
            (kind == "run_status")
            & ((new == "terminating") | (pl.col("old_status") == "terminating"))
        )
        | (failed & ((kind == "job_created") | terminating))
        | (
            victim
            & (
                kind.is_in(["job_ready", "job_registered"])
                | ((kind == "job_status") & new.is_in(["terminating", "terminated"]))
            )
        )
    )


def quoted_columns() -> list[pl.Expr]:
    """An event's evidence item in three columns: `evidence_text`, "entity name: message
    (actor: who)", a dateless log's time of day before it; `evidence_time`, none when the log
    gives a time of day only; `evidence_source`, its sources joined."""
    name, actor = pl.col("entity_name"), pl.col("actor")
    dateless = (pl.col("time_basis") == "time_of_day_only").fill_null(False)
    named = (
        pl.when(known(name))
        .then(pl.format("{} {}: ", _shown("entity_type"), name))
        .otherwise(pl.lit(""))
    )
    prefix = (
        pl.when(dateless)
        .then(pl.format("[{} local, date unknown] {}", _shown("time_text"), named))
        .otherwise(named)
    )
    by = (
        pl.when(known(actor) & (actor != "system"))
        .then(pl.format(" (actor: {})", actor))
        .otherwise(pl.lit(""))
    )
    return [
        pl.when(dateless).then(None).otherwise(pl.col("time")).alias("evidence_time"),
        pl.col("provenance").list.join("; ").fill_null("").alias("evidence_source"),
        pl.concat_str(prefix, _shown("message"), by).alias("evidence_text"),
    ]


def _shown(column: str) -> pl.Expr:
    """A text as an f-string shows it: a missing one as "None"."""
    return pl.col(column).fill_null("None")


def from_event(event: Row) -> EvidenceItem:
    """The event's item, from its columns (quoted_columns)."""
    return EvidenceItem(
        time=event["evidence_time"], source=event["evidence_source"], text=event["evidence_text"]
    )


def _from_job(job: Row, text: str, time: datetime | None) -> EvidenceItem:
    return EvidenceItem(time=time, source=job["provenance"], text=text)


def expected_stop_reason(run: Row) -> str:
    """RunTerminationReason.to_job_termination_reason (dstack core/models/runs.py): the run
    failure reasons map to TERMINATED_BY_SERVER, a user's stop to TERMINATED_BY_USER and an
    abort to ABORTED_BY_USER (the run's reason now, which a stop may have overwritten)."""
    reason = run["termination_reason"]
    if reason in RUN_FAILURE_REASONS:
        return "terminated_by_server"
    return {"stopped_by_user": "terminated_by_user", "aborted_by_user": "aborted_by_user"}.get(
        reason, "?"
    )


def culprit_evidence(events: list[Row], culprit: Row) -> list[EvidenceItem]:
    """A failed submission's creation and its TERMINATING (`events`: the job's quoted events),
    or its row when no event records the failure."""
    items = [
        from_event(e)
        for e in events
        if e["kind"] == "job_created"
        or (e["kind"] == "job_status" and e["new_status"] == "terminating")
    ]
    if not any(e["kind"] == "job_status" and e["new_status"] == "terminating" for e in events):
        message = culprit["termination_reason_message"]
        items.append(
            _from_job(
                culprit,
                f"job {culprit['job_name']} (deployment {culprit['deployment_num']}, submission "
                f"{culprit['submission_num']}): {culprit['status']}, "
                f"{culprit['termination_reason']}"
                + (f" ({message})" if message else "")
                + (
                    f", exit status {culprit['exit_status']}"
                    if culprit["exit_status"] is not None
                    else ""
                )
                + " (time: last processed; the failure happened at or before it)",
                culprit["last_processed_at"],
            )
        )
    return items


def victim_evidence(events: list[Row], victim: Row, run: Row) -> list[EvidenceItem]:
    """A victim's readiness and its stop (`events`: the job's quoted events), its probes'
    passing streak when logged, and its state and health proof from its row."""
    items = [
        from_event(e)
        for e in events
        if e["kind"] in ("job_ready", "job_registered")
        or (e["kind"] == "job_status" and e["new_status"] in ("terminating", "terminated"))
    ]
    if victim["probe_passed_then"] and victim["probe_line"]:
        items.append(
            EvidenceItem(
                time=victim["probe_line_at"],
                source=victim["probe_line"],
                text=f"job {victim['job_name']}: its probes' last results logged before the "
                "run's failure passed, the streak at or above ready_after (DEBUG probe lines)",
            )
        )
    proof = HEALTH_PROOFS.get(victim["health_proof"], victim["health_proof"])
    by_user = (
        " (the user's stop reached it after the run had failed)"
        if victim["termination_reason"] in USER_STOP_JOB_REASONS
        else ""
    )
    state = (
        f"{victim['status']}, {victim['termination_reason']} with no message{by_user}"
        if victim["cascade_stop"]
        else f"still {victim['status']} when the evidence ends, not yet stopped (the run's "
        f"terminating pass stops it with {expected_stop_reason(run)})"
    )
    items.append(
        _from_job(
            victim,
            f"job {victim['job_name']} (deployment {victim['deployment_num']}, submission "
            f"{victim['submission_num']}): {state}; healthy: {proof}",
            None if victim["has_status_event"] else victim["last_processed_at"],
        )
    )
    return items


def known(column: pl.Expr) -> pl.Expr:
    """A text that is neither missing nor empty (what an f-string condition takes as true)."""
    return column.is_not_null() & (column != "")
